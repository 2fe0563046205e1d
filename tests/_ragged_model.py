"""A user's model whose activation shapes depend on the data, for the tests: the first layer trims each
micro-batch's padding columns (its length is the longest real sequence in it), so a receiving stage learns the
shape from a header. The result of a row does not depend on the trim: padding is masked out of the pooling."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import parcae

VOCAB, T, ROWS, HIDDEN = 16, 10, 12, 8


class Trim(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        length = int((ids != 0).any(dim=0).nonzero().max()) + 1  # data-dependent: no meta kernel for nonzero
        ids = ids[:, :length]
        return self.embed(ids), (ids != 0).long()


class Mix(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(self.lin(h)), mask


class Pool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(HIDDEN, 3)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.out((h * mask.unsqueeze(-1).to(h.dtype)).sum(dim=1))


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7 + step)
    lengths = torch.randint(1, T + 1, (ROWS,), generator=gen)
    ids = torch.randint(1, VOCAB, (ROWS, T), generator=gen) * (torch.arange(T)[None, :] < lengths[:, None])
    return ids, lengths % 3


def spec() -> parcae.TrainSpec:
    return parcae.TrainSpec(
        layers=[
            parcae.Layer("trim", lambda: Trim().double()),
            parcae.Layer("mix", lambda: Mix().double()),
            parcae.Layer("pool", lambda: Pool().double()),
        ],  # fmt: skip
        batch=data,
        loss=lambda logits, y: F.cross_entropy(logits, y, reduction="sum"),
        optimizer=lambda params: torch.optim.Adam(params, lr=0.02),
    )
