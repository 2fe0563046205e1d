"""The split of a step's global batch into replicas and micro-batches.

Owns: `replica_rows`, `batch_rows` (the rows of a step's batch one replica trains on, loaded alone where the
batch function can: `RowBatch`), `Prefetcher` (the next step's rows, loaded while this one trains) and `shard`;
`StepSampler` and `TokenWindows`, the data helpers a spec's `batch` is built from. Must not touch: models,
processes, torch.distributed. The batch itself is the spec's (`TrainSpec.batch(step)`: a pure function of the
step).

The invariant the elastic trainer rests on: **the global batch of a step depends only on the step**, never on D or
P, and `shard` partitions it exactly (every row lands in exactly one micro-batch of one replica). Hence any D x P
strategy — and any sequence of strategies across migrations — sees the same data.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Protocol, runtime_checkable

import torch

from trainer.runtime.trainspec import SpecError, leaves, rebuild, stable_seed
from trainer.runtime.trainspec import rows as rows_of


class DataError(SpecError):
    """A spec's data function raised while the job trained: the message names the function, its argument, the error
    and where in the user's code it was raised (the error itself is the `__cause__`)."""


def _data_error(what: str, arg: int, exc: Exception) -> DataError:
    """`what(arg)` raised `exc`: a one-line `DataError` with the deepest frame outside the trainer, torch and Python's
    own library (the user's code, as far as the traceback shows it)."""
    import traceback
    from pathlib import Path

    trainer = Path(__file__).resolve().parents[1]
    torch_dir, stdlib = Path(torch.__file__).resolve().parent, Path(traceback.__file__).resolve().parent

    def ours(filename: str) -> bool:
        f = Path(filename).resolve()
        if f.is_relative_to(trainer) or f.is_relative_to(torch_dir):
            return True
        return f.is_relative_to(stdlib) and "site-packages" not in f.parts and "dist-packages" not in f.parts

    theirs = [f for f in traceback.extract_tb(exc.__traceback__) if not ours(f.filename)]
    at = f" at {theirs[-1].filename}:{theirs[-1].lineno} in {theirs[-1].name}" if theirs else ""
    return DataError(f"{what}({arg}) raised {type(exc).__name__}: {exc}{at}; fix the {what} function")


def replica_rows(global_batch_size: int, replica: int, n_replicas: int) -> range:
    """Rows of the global batch that `replica` trains on.

    Uneven splits are supported (D need not divide the global batch): replica r gets rows
    [r*B//D, (r+1)*B//D), i.e. floor or ceil of B/D each. The loss is normalised by the global batch
    (`trainer.runtime.pipeline.micro_loss`), not per replica, so uneven shards still sum to the exact global gradient.
    """
    if not 0 <= replica < n_replicas:
        raise ValueError(f"replica {replica} out of range for {n_replicas} replicas")
    if n_replicas > global_batch_size:
        raise ValueError(
            f"D={n_replicas} replicas exceed global_batch={global_batch_size}: some replica would get no sequence"
        )
    return range(replica * global_batch_size // n_replicas, (replica + 1) * global_batch_size // n_replicas)


@runtime_checkable
class RowBatch(Protocol):
    """A batch function that can also load a slice of a step's global batch alone: `rows(step, start, stop)` is
    `batch(step)`'s rows [start, stop), exactly. A replica then loads only the rows it trains on, not the whole
    global batch (with a dataset whose items cost something to load — images to decode — each of D replicas
    otherwise loads D times what it uses). `StepSampler` is one."""

    def __call__(self, step: int) -> tuple[Any, Any]: ...

    def rows(self, step: int, start: int, stop: int) -> tuple[Any, Any]: ...


def batch_rows(batch: Callable[[int], tuple[Any, Any]], step: int, rows: range, what: str = "batch") -> tuple[Any, Any]:
    """Rows `rows` of `batch(step)`: loaded alone where `batch` is a `RowBatch`, else cut from the whole batch. The
    function's error is a `DataError` naming `what` (the spec's field: "batch", "validation.batch")."""
    try:
        if isinstance(batch, RowBatch):
            x, y = batch.rows(step, rows.start, rows.stop)
        else:
            x, y = batch(step)
            x, y = _cut(x, rows), _cut(y, rows)
    except Exception as exc:  # noqa: BLE001 — a user's function: one line naming it, whatever it raised
        raise _data_error(what, step, exc) from exc
    # a step whose batch is short would cut fewer micro-batches here than a middle stage, which loads nothing, counts
    got = {int(t.shape[0]) if t.dim() else 0 for t in leaves((x, y))}
    if got != {len(rows)}:
        rule = ("every step's batch holds the global batch's rows (train.global_batch)" if what == "batch" else
                "a batch holds the rows its size() gives")  # fmt: skip
        raise DataError(f"{what}({step}) gave {' and '.join(map(str, sorted(got)))} rows where rows "
                        f"[{rows.start}, {rows.stop}) of its batch were wanted: {rule}, inputs and targets "
                        "alike")  # fmt: skip
    return x, y


def _cut(tree: Any, rows: range) -> Any:
    return rebuild(tree, [t[rows.start : rows.stop] for t in leaves(tree)])


def _part(V: int, replica: int, replicas: int) -> range:
    return range(replica * V // replicas, (replica + 1) * V // replicas)


def replica_share(batch: Callable[[int], tuple[Any, Any]], i: int, replica: int, replicas: int) -> range | None:
    """`replica`'s rows of validation batch `i` (see `replica_part`) without loading them, where the batch function
    gives a batch's size (`size(i)`) and loads rows alone (a `RowBatch`: `Validation.over`'s), so that a stage that
    loads them gets what the size says (`batch_rows` checks); None where only loading the batch tells."""
    size = getattr(batch, "size", None)
    return _part(int(size(i)), replica, replicas) if callable(size) and isinstance(batch, RowBatch) else None


def replica_part(
    batch: Callable[[int], tuple[Any, Any]], i: int, replica: int, replicas: int
) -> tuple[Any, Any] | None:
    """`replica`'s rows of validation batch `i` (`trainer.runtime.validation`; rows [r*V//D, (r+1)*V//D) of its V, as
    in training's split), or None where a batch of V < D rows leaves it none. Only those rows are loaded where the
    batch function knows a batch's size and loads rows alone (`size(i)` and a `RowBatch`: `Validation.over`'s);
    otherwise the batch is loaded whole and cut."""

    what = "validation.batch"
    mine = replica_share(batch, i, replica, replicas)
    if mine is not None:
        return batch_rows(batch, i, mine, what) if len(mine) else None
    try:
        x, y = batch(i)
        mine = _part(rows_of(x), replica, replicas)
        return (_cut(x, mine), _cut(y, mine)) if len(mine) else None
    except Exception as exc:  # noqa: BLE001 — a user's function: one line naming it, whatever it raised
        raise _data_error(what, i, exc) from exc


class Prefetcher:
    """A replica's rows of the next step, loaded by one helper thread while this step trains (`TrainSpec.prefetch`):
    with a batch function that costs something (images to decode), the load overlaps the step instead of preceding
    it. `load(step, rows)` returns `batch_rows(batch, step, rows)` — what came ahead when it is that step and those
    rows (the next step of the same replica), else loaded now — and starts loading the step after it (none past
    `steps`). The batch function is never called twice at once (a load ahead that is not wanted is waited for
    first), and its error is raised by the `load` that wanted its rows, as if called there."""

    def __init__(self, batch: Callable[[int], tuple[Any, Any]], steps: int) -> None:
        self.batch, self.steps = batch, steps
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parcae-prefetch")
        self._ahead: tuple[tuple[int, int, int], Future[tuple[Any, Any]]] | None = None
        self.hits = 0  # loads that came ahead (for the tests)

    def load(self, step: int, rows: range) -> tuple[Any, Any]:
        key = (step, rows.start, rows.stop)
        got: tuple[Any, Any] | None = None
        if self._ahead is not None:
            (came, future), self._ahead = self._ahead, None
            if came == key:
                got = future.result()  # (its error, as the batch function raised it)
                self.hits += 1
            else:  # another step or other rows (a migration, a restart): not wanted, but never two calls at once
                wait([future])
        if got is None:
            got = batch_rows(self.batch, step, rows)
        if step + 1 < self.steps:
            self._ahead = ((step + 1, rows.start, rows.stop), self._pool.submit(batch_rows, self.batch, step + 1, rows))
        return got

    def close(self) -> None:
        """Stop: a load under way finishes (its result is dropped)."""
        self._ahead = None
        self._pool.shutdown(wait=True, cancel_futures=True)


def shard(x: Any, y: Any, replica: int, n_replicas: int, micro_batch: int) -> list[tuple[Any, Any]]:
    """The micro-batches (x, y) of `replica` out of the global batch (x, y) — each a tensor or a tuple of tensors
    sharing their leading (row) dimension; see `replica_rows`."""
    n = leaves(x)[0].shape[0]
    rows = replica_rows(n, replica, n_replicas)

    def cut(tree: Any) -> list[Any]:
        parts = [torch.split(t[rows.start : rows.stop], micro_batch) for t in leaves(tree)]
        return [rebuild(tree, list(ts)) for ts in zip(*parts, strict=True)]

    return list(zip(cut(x), cut(y), strict=True))


def unloaded(rows: range, micro_batch: int) -> list[tuple[Any, Any]]:
    """The micro-batches of `rows` for a stage that loads no data (a middle stage: its inputs come from the stage
    before): as many as `shard` cuts those rows into, each without its data."""
    return [(None, None)] * -(-len(rows) // micro_batch)


# ------------------------------------------------------------------------------------------------ helpers for specs


class StepSampler:
    """The global batch of a step over a map-style dataset, for `TrainSpec.batch`: step s takes rows
    [s*B, (s+1)*B) of a sequence of seeded per-epoch permutations, so every item is used once per epoch whatever
    D x P and whatever preemptions (the batch is a pure function of the step). Items are collated with
    `torch.utils.data.default_collate`; an item (x, y) gives the batch (X, Y)."""

    def __init__(self, dataset: Any, batch_size: int, seed: int = 0) -> None:
        self.n = len(dataset)
        if self.n < 1:
            raise ValueError("StepSampler: the dataset is empty; give it at least one item")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"StepSampler: batch_size must be an integer >= 1, got {batch_size!r}")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self._perm: tuple[int, torch.Tensor] | None = None

    def permutation(self, epoch: int) -> torch.Tensor:
        """The item order of `epoch` (cached: consecutive steps mostly share one)."""
        if self._perm is None or self._perm[0] != epoch:
            gen = torch.Generator().manual_seed(stable_seed("epoch", self.seed, epoch))
            self._perm = (epoch, torch.randperm(self.n, generator=gen))
        return self._perm[1]

    def indices(self, step: int) -> list[int]:
        """The dataset indices of `step`'s rows."""
        if step < 0:
            raise ValueError(f"StepSampler: step must be >= 0, got {step}")
        out = []
        for r in range(step * self.batch_size, (step + 1) * self.batch_size):
            out.append(int(self.permutation(r // self.n)[r % self.n]))
        return out

    def __call__(self, step: int) -> Any:
        return self.rows(step, 0, self.batch_size)

    def rows(self, step: int, start: int, stop: int) -> Any:
        """Rows [start, stop) of step `step`'s batch, loading only their items (`RowBatch`)."""
        from torch.utils.data import default_collate

        if not 0 <= start < stop <= self.batch_size:
            raise ValueError(f"StepSampler: rows [{start}, {stop}) are not within a batch of {self.batch_size}")
        batch = default_collate([self.dataset[i] for i in self.indices(step)[start:stop]])
        return tuple(batch) if isinstance(batch, list) else batch


class TokenWindows:
    """A map-style dataset of next-token windows over a token file (a flat array of token ids, memory-mapped, so
    a file larger than memory is fine): item i is (tokens[i*T : i*T+T], tokens[i*T+1 : i*T+T+1]) as int64."""

    def __init__(self, path: str, block_size: int, dtype: str = "uint16") -> None:
        import numpy as np

        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        self.block_size = block_size
        if block_size < 1 or len(self.tokens) < block_size + 1:
            raise ValueError(f"{path}: {len(self.tokens)} tokens cannot make a window of {block_size} + 1; give a "
                             "longer file or a smaller block_size")  # fmt: skip

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.block_size
        window = torch.from_numpy(self.tokens[start : start + self.block_size + 1].astype("int64"))
        return window[:-1], window[1:]
