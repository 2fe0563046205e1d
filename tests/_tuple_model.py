"""A user's model whose activations between stages are a tuple (hidden state, integer mask), for the tests: not
a GPT, defined outside the package, trained through ``--model _tuple_model:spec``."""

from __future__ import annotations

import torch
import torch.nn as nn

import parcae

FEATURES, HIDDEN, CLASSES, ROWS = 6, 16, 3, 24


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(FEATURES, HIDDEN)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (x[:, : HIDDEN // 4].sum(dim=1, keepdim=True) > 0).long().expand(-1, HIDDEN)  # int: no gradient
        return torch.tanh(self.proj(x)), mask


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return h + torch.tanh(self.lin(h)) * mask.to(h.dtype), mask


class Routed(Block):
    """A block with a second expert that only rows whose hidden state's first feature exceeds 0.6 reach (as a
    mixture of experts routes them): one replica's rows may reach it and another's not."""

    def __init__(self) -> None:
        super().__init__()
        self.expert = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, mask = super().forward(h, mask)
        rows = h[:, :1] > 0.6
        if bool(rows.any()):  # no row routed: the expert is not used, and gets no gradient
            out = out + torch.where(rows, torch.tanh(self.expert(h)), torch.zeros_like(h))
        return out, mask


class HalfBlock(Block):
    """A block whose parameters are bfloat16 among float64 ones (a stage then holds both dtypes)."""

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, mask = super().forward(h.to(torch.bfloat16), mask)
        return out.to(h.dtype), mask


class Head(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.out = nn.Linear(HIDDEN, CLASSES)
        if unused:  # a parameter no step gives a gradient (a spare head): its optimiser never makes state for it
            self.spare = nn.Linear(HIDDEN, CLASSES)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.out(h * (1 + mask.to(h.dtype)))


class Gate(nn.Module):
    """A layer without parameters (as an activation or a pooling is): nothing for an optimiser to hold."""

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(h) * (1 + mask.to(h.dtype)), mask


def spec(blocks: int = 3, costs: list[float] | None = None, frozen_steps: int | None = None, gate: bool = False,
         unused: bool = False, routed: bool = False, half: bool = False, held_out: int = 0,
         held_out_fails: bool = False) -> parcae.TrainSpec:  # fmt: skip
    """`gate`: a parameter-free `Gate` layer after the first block; `unused`: a parameter in the head that the
    forward never uses; `routed`: the first block is a `Routed` one; `half`: the second a bfloat16 `HalfBlock`;
    `held_out`: validated every 2 steps on two batches of other rows, of `held_out` and 5 rows (a plain function:
    every replica loads a batch whole); `held_out_fails`: a third batch between them, whose loading raises (the check
    before the job loads the first and the last)."""

    def block(i: int) -> nn.Module:
        if half and i == 1:
            return HalfBlock().to(torch.bfloat16)
        return (Routed() if routed and i == 0 else Block()).double()

    data = torch.Generator().manual_seed(5)
    X = torch.randn(240, FEATURES, generator=data, dtype=torch.float64)
    Y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(step * ROWS, (step + 1) * ROWS) % len(X)
        return X[rows], Y[rows]

    layers = [
        parcae.Layer("embed", lambda: Embed().double()),
        *(parcae.Layer(f"block.{i}", lambda i=i: block(i)) for i in range(blocks)),
        parcae.Layer("head", lambda: Head(unused).double()),
    ]
    if gate:
        layers.insert(2, parcae.Layer("gate", Gate))
    if costs is not None:  # per-layer cost hints: the stage cut balances them instead of parameter counts
        layers = [parcae.Layer(layer.name, layer.build, cost) for layer, cost in zip(layers, costs, strict=True)]
    return parcae.TrainSpec(
        layers=layers,
        batch=batch,
        loss=lambda logits, y: nn.functional.cross_entropy(logits, y, reduction="sum"),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        clip_grad_norm=1.0,
        # a schedule of the step: lr 0 for the first `frozen_steps` steps (none by default), then the optimiser's
        lr=None if frozen_steps is None else (lambda step: 0.0 if step < frozen_steps else 0.05),
        validation=parcae.Validation(
            lambda i: held_out_batch(i, held_out, held_out_fails), batches=2 + held_out_fails, every=2
        )
        if held_out
        else None,
    )


def held_out_batch(i: int, rows: int, fails: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    if fails and i == 1:
        raise FileNotFoundError("held-out shard 1")
    g = torch.Generator().manual_seed(77 + i)
    X = torch.randn(rows if i == 0 else 5, FEATURES, generator=g, dtype=torch.float64)
    return X, (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
