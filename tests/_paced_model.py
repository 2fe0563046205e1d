"""A user's model whose steps take a known minimum time, for the tests: each micro-batch's forward through the
`pace` layer sleeps `pace_s`, so that a job's steps are long enough for what a runtime does during one (a
preparation published a step ahead is seen before the next boundary) — the values it computes do not depend on it."""

from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import parcae

FEATURES, HIDDEN, CLASSES, ROWS = 6, 16, 3, 8


class Pace(nn.Module):
    def __init__(self, pace_s: float) -> None:
        super().__init__()
        self.lin = nn.Linear(HIDDEN, HIDDEN)
        self.pace_s = pace_s

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        time.sleep(self.pace_s)
        return torch.tanh(self.lin(h))


def spec(blocks: int = 4, pace_s: float = 0.03) -> parcae.TrainSpec:
    data = torch.Generator().manual_seed(3)
    X = torch.randn(80, FEATURES, generator=data, dtype=torch.float64)
    Y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(step * ROWS, (step + 1) * ROWS) % len(X)
        return X[rows], Y[rows]

    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh()).double()

    return parcae.TrainSpec(
        layers=[
            parcae.Layer("embed", lambda: nn.Linear(FEATURES, HIDDEN).double()),
            parcae.Layer("pace", lambda: Pace(pace_s).double()),
            *(parcae.Layer(f"block.{i}", block) for i in range(blocks)),
            parcae.Layer("head", lambda: nn.Linear(HIDDEN, CLASSES).double()),
        ],
        batch=batch,
        loss=lambda out, y: F.cross_entropy(out, y, reduction="sum"),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
    )
