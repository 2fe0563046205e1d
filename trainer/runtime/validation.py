"""Validation: the loss on held-out data, measured at step boundaries while the job trains and migrates.

Owns: `Validation` (what a spec's `validation` field holds: the held-out batches, how often to score them, the
spec's own metrics and when to stop early), `Monitor` (which score is better: early stopping's and the best
checkpoint's), `InOrder` (batches over a dataset in its own order, for
`Validation.over`), which boundaries are scored (`due`), what a metric may return (`metric_sum`) and the early-stopping
count (`Patience`).
Must not touch: the pass itself (`trainer.runtime.pipeline.validate`: forward only, through the job's stages and
replicas), process groups, the store.

Why at boundaries, and scored by the strategy in force: a boundary is where every rank holds the same committed
parameters, so the loss there is a function of the step alone — whatever D x P and whatever migrations came before
(the equivalence tests hold it to one process's). The score of boundary s (the parameters after s steps) travels
with step s's loss (`trainer.runtime.keys.StepLoss`), so a step abandoned by a failure is scored again with it and
nothing is half-reported; the final boundary's with the final layers.

Why early stopping is decided by the workers, not the driver: every member of the epoch in force gets the same
held-out loss from the validation's all-reduce at the same boundary, so each can tell, alone and at once, that the
job ends there (`Patience.after`) — the job then ends on the parameters that were scored, at a step that depends on
the data alone, never on when a driver happened to read a loss. The count travels in the store (one value, rewritten
at each scored boundary) for the workers that were not there to count: a joiner, a restarted process.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

#: What a metric's name may be (it becomes an MLflow metric ``val_<name>`` and a token of the step's loss value).
METRIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class Monitor:
    """Which held-out score tells a better boundary from a worse one: `name` ("loss", or one of the validation's
    metrics) and `mode` ("min": lower is better; "max": higher). The one definition of "better" that early stopping
    (`Patience`) and the best checkpoint (`trainer.runtime.checkpoint.best_scored`) both rank by."""

    name: str = "loss"
    mode: str = "min"

    def rank(self, value: float) -> float:
        """A value of the monitored score as a rank, lower being better either way: negated under `mode` "max" (its
        own inverse: it also turns a rank back into the value, `value`)."""
        return value if self.mode == "min" else -value

    def score(self, scores: Mapping[str, float]) -> float:
        """The rank of the monitored one of a boundary's held-out `scores` ("loss", each metric)."""
        return self.rank(float(scores[self.name]))

    def value(self, score: float) -> float:
        """The monitored value a `score` stands for (its inverse)."""
        return self.rank(score)


def score_text(monitor: str, value: float, loss: float) -> str:
    """A checkpoint's held-out score as the CLI and the train flow's summary say it: the monitored one (`Monitor`),
    and the loss beside any other."""
    return f"validation loss {loss:.4f}" if monitor == "loss" else f"validation {monitor} {value:.4f}, loss {loss:.4f}"


@dataclass(frozen=True)
class Validation:
    """The held-out data of a `TrainSpec`: `batch(i)` is validation batch i (i < `batches`) as (inputs, targets), like
    the training batch (a tensor or a tuple of tensors; batches may differ in rows); it is scored every `every` steps
    (at boundaries 0, every, 2 every, ...) and at the job's end. The score is the spec's loss summed over every row
    of every batch, divided by the rows (normalizer "rows") or by the count the loss returns ("count"): the mean loss
    on the held-out data. Layers are in `eval()` mode meanwhile (dropout off, BatchNorm on its running statistics).

    `metrics`: more scores by name, each a function of the last layer's outputs and the targets (as the loss takes
    them) returning a SUM over the rows — e.g. ``{"accuracy": lambda out, y: (out.argmax(1) == y).sum()}`` — divided
    as the loss is: the mean over the held-out rows (or per counted item).

    `patience`: stop the job early, at the scored boundary where the monitored score has not improved on the best so
    far by more than `min_delta` for `patience` scorings in a row (None: train every step). `monitor`: that score,
    the held-out loss ("loss") or one of `metrics`; `mode`: "min" (lower is better, as a loss) or "max" (higher, as
    an accuracy). The job's final layers are then that boundary's. The same score, in the same direction, picks the
    best checkpoint, which `--keep-checkpoints` keeps and `parcae export --best` writes (with or without a
    patience)."""

    batch: Callable[[int], tuple[Any, Any]]
    batches: int = 1
    every: int = 100
    metrics: Mapping[str, Callable[[Any, Any], Any]] = field(default_factory=dict)
    patience: int | None = None
    min_delta: float = 0.0
    monitor: str = "loss"
    mode: str = "min"

    @classmethod
    def over(
        cls, dataset: Any, batch_size: int, every: int = 100, metrics: Mapping[str, Callable[[Any, Any], Any]] | None
        = None, patience: int | None = None, min_delta: float = 0.0, monitor: str = "loss", mode: str = "min",
    ) -> Validation:  # fmt: skip
        """Every item of a map-style `dataset`, in order, `batch_size` rows a batch (the last may hold fewer)."""
        batches = InOrder(dataset, batch_size)
        return cls(batch=batches, batches=len(batches), every=every, metrics=dict(metrics or {}), patience=patience,
                   min_delta=min_delta, monitor=monitor, mode=mode)  # fmt: skip

    @property
    def watched(self) -> Monitor:
        """The score this validation ranks boundaries by (`monitor`, `mode`)."""
        return Monitor(self.monitor, self.mode)

    def score(self, scores: Mapping[str, float]) -> float:
        """The early-stopping score of a boundary's held-out `scores` (`Monitor.score`: lower is better; `Patience`
        counts on it)."""
        return self.watched.score(scores)

    def value(self, score: float) -> float:
        """The monitored value a `score` stands for (its inverse)."""
        return self.watched.value(score)

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
        p = self.patience
        if p is not None and not (isinstance(p, int) and not isinstance(p, bool) and p >= 1):
            out.append(f"patience {p!r} must be an integer >= 1 (the scorings without improvement before the job "
                       "stops), or None to train every step")  # fmt: skip
        d = self.min_delta
        if not (isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d) and d >= 0):
            out.append(f"min_delta {d!r} must be a finite number >= 0 (how much lower than the best a held-out loss "
                       "must be to count as an improvement)")  # fmt: skip
        if self.mode not in ("min", "max"):
            out.append(f"mode {self.mode!r} must be 'min' (the monitored score improves as it falls, as a loss) or "
                       "'max' (as it rises, as an accuracy)")  # fmt: skip
        if not isinstance(self.metrics, Mapping):
            return [*out, f"metrics is a {type(self.metrics).__name__}; give a dict of name -> function"]
        if not isinstance(self.monitor, str) or (self.monitor != "loss" and self.monitor not in self.metrics):
            out.append(f"monitor {self.monitor!r} is neither 'loss' nor one of the metrics {sorted(self.metrics)}; "
                       "name the score that early stopping and the best checkpoint go by")  # fmt: skip
        for name, fn in self.metrics.items():
            if not (isinstance(name, str) and METRIC_NAME.fullmatch(name)) or name == "loss":
                out.append(f"metric name {name!r} must be letters, digits and '_' (not 'loss', the loss's own)")
            elif not callable(fn):
                out.append(f"metric {name!r} is a {type(fn).__name__}, not callable; give a function of (outputs, "
                           "targets) returning a sum over the rows")  # fmt: skip
        return out


@dataclass(frozen=True)
class Patience:
    """The early-stopping count after the scored boundary `at` (-1: none yet): the lowest score so far (`best`, at
    boundary `best_step`; `Validation.score`: the monitored held-out score, lower is better), the scorings since that
    did not improve on it by more than `min_delta` (`waited`), and the boundary where the job stops (`stop_at`, once
    `waited` reaches the patience)."""

    at: int = -1
    best: float = math.inf
    best_step: int | None = None
    waited: int = 0
    stop_at: int | None = None

    def after(self, step: int, score: float, patience: int, min_delta: float = 0.0) -> Patience:
        """The count once boundary `step` scored `score`. A boundary already counted (`step <= at`: scored again after
        a failure, the same parameters) leaves it as it is, so a step redone is never counted twice. A score that is
        not a number is no improvement."""
        if step <= self.at:
            return self
        if score < self.best - min_delta:
            return Patience(at=step, best=score, best_step=step)
        waited = self.waited + 1
        return replace(self, at=step, waited=waited, stop_at=step if waited >= patience else None)

    @classmethod
    def since(cls, scored: Mapping[int, float], before: int) -> Patience:
        """A resumed job's count: the best of the scores kept beside its checkpoints (`scored`, by step) before its
        resume point `before`, counting from there (the scorings between were not kept)."""
        kept = {s: v for s, v in scored.items() if s < before and math.isfinite(v)}
        if not kept:
            return cls(at=before - 1)
        best = min(kept, key=lambda s: (kept[s], s))
        return cls(at=before - 1, best=kept[best], best_step=best)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "best": None if math.isinf(self.best) else self.best})

    @classmethod
    def from_json(cls, raw: str | bytes) -> Patience:
        d = json.loads(raw)
        return cls(at=int(d["at"]), best=math.inf if d["best"] is None else float(d["best"]),
                   best_step=d["best_step"], waited=int(d["waited"]), stop_at=d["stop_at"])  # fmt: skip


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
