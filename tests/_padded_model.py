"""A user's token tagger over padded sequences, for the tests: the loss is a mean over the real (non-padding)
tokens of the global batch (normalizer "count"), whatever the split into replicas and micro-batches."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import parcae

VOCAB, T, ROWS, HIDDEN = 20, 8, 12, 16


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(1, VOCAB, (ROWS, T), generator=gen)
    lengths = torch.randint(1, T + 1, (ROWS,), generator=gen)  # 1..T real tokens per row, the rest padding
    pad = torch.arange(T)[None, :] >= lengths[:, None]
    y = torch.where(pad, torch.full_like(x, -100), (x * 3) % VOCAB)
    return x.masked_fill(pad, 0), y


def loss(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    total = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
    return total, (y != -100).sum()


def spec() -> parcae.TrainSpec:
    return parcae.TrainSpec(
        layers=[
            parcae.Layer("embed", lambda: nn.Embedding(VOCAB, HIDDEN).double()),
            parcae.Layer("mix", lambda: nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh()).double()),
            parcae.Layer("head", lambda: nn.Linear(HIDDEN, VOCAB).double()),
        ],  # fmt: skip
        batch=data,
        loss=loss,
        optimizer=lambda params: torch.optim.Adam(params, lr=0.01),
        normalizer="count",
    )
