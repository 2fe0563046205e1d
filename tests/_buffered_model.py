"""A user's model whose layers hold more than parameters, for the tests: BatchNorm's running statistics (persistent
buffers that every training forward changes), a constant buffer that is not part of the state (`persistent=False`)
and two sub-modules sharing one weight. Trained through ``--model _buffered_model:spec``."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import parcae

FEATURES, HIDDEN, CLASSES, ROWS = 6, 16, 3, 24


class Norm(nn.Module):
    """A linear map then BatchNorm: its running mean and variance move at every training forward."""

    def __init__(self, n_in: int = HIDDEN) -> None:
        super().__init__()
        self.lin = nn.Linear(n_in, HIDDEN)
        self.norm = nn.BatchNorm1d(HIDDEN)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.norm(self.lin(h)))


class Scaled(nn.Module):
    """A constant scale held as a non-persistent buffer: only the factory gives it its values."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(HIDDEN, HIDDEN)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, HIDDEN), persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.lin(h)) * self.scale


class Tied(nn.Module):
    """Two maps sharing one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(HIDDEN, HIDDEN)
        self.b = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.b.weight = self.a.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.b(torch.tanh(self.a(h))))


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(ROWS, FEATURES, generator=g), torch.randint(0, CLASSES, (ROWS,), generator=g)


def spec() -> parcae.TrainSpec:
    return parcae.TrainSpec(
        layers=[
            parcae.Layer("embed", lambda: Norm(FEATURES)),
            parcae.Layer("scaled", Scaled),
            parcae.Layer("tied", Tied),
            parcae.Layer("norm", Norm),
            parcae.Layer("head", lambda: nn.Linear(HIDDEN, CLASSES)),
        ],  # fmt: skip
        batch=data,
        loss=lambda out, y: F.cross_entropy(out, y, reduction="sum"),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
    )
