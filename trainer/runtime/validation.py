"""Validation: the loss on held-out data, measured at step boundaries while the job trains and migrates.

Owns: `Validation` (what a spec's `validation` field holds: the held-out batches, how often to score them and the
spec's own metrics), `InOrder` (batches over a dataset in its own order, for `Validation.over`), which boundaries are
scored (`due`) and what a metric may return (`metric_sum`).
Must not touch: the pass itself (`trainer.runtime.pipeline.validate`: forward only, through the job's stages and
replicas), process groups, the store.

Why at boundaries, and scored by the strategy in force: a boundary is where every rank holds the same committed
parameters, so the loss there is a function of the step alone — whatever D x P and whatever migrations came before
(the equivalence tests hold it to one process's). The score of boundary s (the parameters after s steps) travels
with step s's loss (`trainer.runtime.keys.StepLoss`), so a step abandoned by a failure is scored again with it and
nothing is half-reported; the final boundary's with the final layers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: What a metric's name may be (it becomes an MLflow metric ``val_<name>`` and a token of the step's loss value).
METRIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class Validation:
    """The held-out data of a `TrainSpec`: `batch(i)` is validation batch i (i < `batches`) as (inputs, targets), like
    the training batch (a tensor or a tuple of tensors; batches may differ in rows); it is scored every `every` steps
    (at boundaries 0, every, 2 every, ...) and at the job's end. The score is the spec's loss summed over every row
    of every batch, divided by the rows (normalizer "rows") or by the count the loss returns ("count"): the mean loss
    on the held-out data. Layers are in `eval()` mode meanwhile (dropout off, BatchNorm on its running statistics).

    `metrics`: more scores by name, each a function of the last layer's outputs and the targets (as the loss takes
    them) returning a SUM over the rows — e.g. ``{"accuracy": lambda out, y: (out.argmax(1) == y).sum()}`` — divided
    as the loss is: the mean over the held-out rows (or per counted item)."""

    batch: Callable[[int], tuple[Any, Any]]
    batches: int = 1
    every: int = 100
    metrics: Mapping[str, Callable[[Any, Any], Any]] = field(default_factory=dict)

    @classmethod
    def over(
        cls, dataset: Any, batch_size: int, every: int = 100, metrics: Mapping[str, Callable[[Any, Any], Any]] | None
        = None,
    ) -> Validation:  # fmt: skip
        """Every item of a map-style `dataset`, in order, `batch_size` rows a batch (the last may hold fewer)."""
        batches = InOrder(dataset, batch_size)
        return cls(batch=batches, batches=len(batches), every=every, metrics=dict(metrics or {}))

    def due(self, boundary: int, steps: int) -> bool:
        """Whether the boundary before step `boundary` (after `boundary` steps) is scored in a job of `steps` steps."""
        return boundary % self.every == 0 or boundary == steps

    def problems(self) -> list[str]:
        """What is wrong with the fields, each with its fix (empty: nothing)."""
        out = []
        if not callable(self.batch):
            out.append(f"batch is a {type(self.batch).__name__}, not callable; give a function of the batch index")
        for name in ("batches", "every"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                out.append(f"{name} {value!r} must be an integer >= 1")
        if not isinstance(self.metrics, Mapping):
            return [*out, f"metrics is a {type(self.metrics).__name__}; give a dict of name -> function"]
        for name, fn in self.metrics.items():
            if not (isinstance(name, str) and METRIC_NAME.fullmatch(name)) or name == "loss":
                out.append(f"metric name {name!r} must be letters, digits and '_' (not 'loss', the loss's own)")
            elif not callable(fn):
                out.append(f"metric {name!r} is a {type(fn).__name__}, not callable; give a function of (outputs, "
                           "targets) returning a sum over the rows")  # fmt: skip
        return out


def metrics_of(scores: Mapping[str, float]) -> dict[str, float]:
    """A validation's own metrics among its held-out scores (`trainer.runtime.pipeline.validate`: all but "loss")."""
    return {k: v for k, v in scores.items() if k != "loss"}


def metric_sum(value: Any, name: str) -> float:
    """A validation metric's value for one micro-batch (a number, or a tensor of one element) as a float; anything
    else is the metric's mistake, named."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().to("cpu", torch.float64))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    shape = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    raise ValueError(f"validation metric {name!r} returned {shape}; return one number: its sum over the rows")


class InOrder:
    """Batches over a map-style dataset in its order: batch i is items [i*B, min((i+1)*B, n)), collated with
    `torch.utils.data.default_collate` (an item (x, y) gives (X, Y)). A `trainer.runtime.data.RowBatch`: a replica
    loads only its rows."""

    def __init__(self, dataset: Any, batch_size: int) -> None:
        self.n = len(dataset)
        if self.n < 1:
            raise ValueError("Validation.over: the dataset is empty; give it at least one item")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"Validation.over: batch_size must be an integer >= 1, got {batch_size!r}")
        self.dataset, self.batch_size = dataset, batch_size

    def __len__(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def size(self, i: int) -> int:
        """The rows of batch `i`."""
        if not 0 <= i < len(self):
            raise ValueError(f"Validation.over: batch {i} is not one of the {len(self)} batches")
        return min(self.batch_size, self.n - i * self.batch_size)

    def __call__(self, i: int) -> Any:
        return self.rows(i, 0, self.size(i))

    def rows(self, i: int, start: int, stop: int) -> Any:
        """Rows [start, stop) of batch `i`, loading only their items."""
        from torch.utils.data import default_collate

        if not 0 <= start < stop <= self.size(i):
            raise ValueError(f"Validation.over: rows [{start}, {stop}) are not within batch {i} of {self.size(i)}")
        first = i * self.batch_size
        batch = default_collate([self.dataset[j] for j in range(first + start, first + stop)])
        return tuple(batch) if isinstance(batch, list) else batch
