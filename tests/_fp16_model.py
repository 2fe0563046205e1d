"""A user's float32 model trained under float16 autocast, for the loss-scaling tests: defined outside the package,
trained through ``--model _fp16_model:spec``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

import parcae

FEATURES, HIDDEN, CLASSES, ROWS = 8, 32, 4, 16


class Block(nn.Module):
    def __init__(self, nan_grads: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(HIDDEN, HIDDEN)
        self.nan_grads = nan_grads

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        z = self.lin(h)
        if self.nan_grads:  # sqrt(0) in the forward is finite; its backward divides by it: NaN gradients, finite loss
            z = z + 0.0 * torch.sqrt(z.float() - z.float())
        return h + torch.tanh(z)


def spec(weight: float = 1.0, autocast: str | None = "float16", scaling: dict[str, Any] | str | None = "auto",
         nan_grads: bool = False, blocks: int = 3) -> parcae.TrainSpec:  # fmt: skip
    """`weight` multiplies the loss (a tiny one makes gradients that float16 rounds to zero); `scaling`: "auto", None,
    or the keyword arguments of a `parcae.LossScaling`; `nan_grads`: the last block's backward gives NaN."""
    data = torch.Generator().manual_seed(7)
    X = torch.randn(256, FEATURES, generator=data)
    Y = (X[:, 0] > 0).long() + 2 * (X[:, 1] > 0).long()

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(step * ROWS, (step + 1) * ROWS) % len(X)
        return X[rows], Y[rows]

    return parcae.TrainSpec(
        layers=[
            parcae.Layer("embed", lambda: nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh())),
            *(parcae.Layer(f"block.{i}", lambda i=i: Block(nan_grads and i == blocks - 1)) for i in range(blocks)),
            parcae.Layer("head", lambda: nn.Linear(HIDDEN, CLASSES)),
        ],
        batch=batch,
        loss=lambda logits, y: weight * nn.functional.cross_entropy(logits.float(), y, reduction="sum"),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        autocast=autocast,
        loss_scaling=parcae.LossScaling(**scaling) if isinstance(scaling, dict) else scaling,
    )
