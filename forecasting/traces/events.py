"""Availability events: the changes of the live-instance count over time, as read from one file (before binning).

Owns: `AvailabilityEvents` (what every format reader returns), `from_count_series` (events from a running count)
and `TraceFormatError` (a file that does not have its format's shape). Must not touch: files (`formats`),
the per-interval grid (`table`). Next: `forecasting.traces.formats` produces these, `forecasting.traces.table`
bins them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

import numpy as np
import pandas as pd

# --------------------------------------------------------------------------------------------- errors


class TraceFormatError(ValueError):
    """A trace file does not have the shape its format requires.

    The message always names the file, the 1-based line when one line is at fault, and the expected
    format, so that a user can fix their file without reading a pandas/json traceback, e.g.
    ``traces/x.csv line 17: expected 'ts_ms,add|remove,node', got 'abc'``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        expected: str,
        line: int | None = None,
        got: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.path = str(path)
        self.expected = expected
        self.line = line
        self.got = got
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        where = self.path if self.line is None else f"{self.path} line {self.line}"
        parts = [where + ":"]
        if self.reason:
            parts.append(f"{self.reason};")
        parts.append(f"expected '{self.expected}'")
        msg = " ".join(parts)
        if self.got is not None:
            got = self.got if len(self.got) <= 80 else self.got[:77] + "..."
            msg += f", got {got!r}"
        return msg

    def __reduce__(self) -> tuple[Any, ...]:  # keep it picklable (multiprocessing) despite the keyword-rich __init__
        return (type(self), (self.path, self.expected, self.line, self.got, self.reason))


# ------------------------------------------------------------------------------- intermediate form


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)  # eq=False: numpy fields make the generated __eq__ ambiguous
class AvailabilityEvents:
    """Changes of the live-instance count over time, as read from one file (before binning).

    Every loader produces this, so binning, padding and capacity rules live in one place
    (:func:`to_intervals`) instead of once per format. Entry ``i`` says: at ``times_s[i]``
    ``adds[i]`` instances came and ``removes[i]`` went (gross), leaving ``counts[i]``.
    ``initial`` is the count before the first change: 0 for event logs, the first observed value for
    count series. ``last_s`` is the last time the source observed the cluster (a trace can end with no
    change); ``hold_s`` is how long that last observation is valid (the tick length of tick series,
    0 for point observations).
    """

    times_s: np.ndarray
    adds: np.ndarray
    removes: np.ndarray
    counts: np.ndarray
    initial: int
    last_s: float
    hold_s: float = 0.0
    start_time: pd.Timestamp | None = None
    name: str = ""
    source: str = ""
    capacity: int | None = None
    fmt: str = ""

    def __post_init__(self) -> None:
        times = np.asarray(self.times_s, dtype=np.float64)
        adds = np.asarray(self.adds, dtype=np.int64)
        removes = np.asarray(self.removes, dtype=np.int64)
        counts = np.asarray(self.counts, dtype=np.int64)
        if not (len(times) == len(adds) == len(removes) == len(counts)):
            raise ValueError("times_s, adds, removes and counts must have the same length")
        if len(times) and (times[0] < 0 or np.any(np.diff(times) <= 0)):
            raise ValueError("times_s must be non-negative and strictly increasing")
        if np.any(adds < 0) or np.any(removes < 0) or self.initial < 0:
            raise ValueError("adds, removes and initial must be non-negative")
        if not np.array_equal(counts, self.initial + np.cumsum(adds - removes)):
            raise ValueError("counts must equal initial + cumsum(adds - removes)")
        if np.any(counts < 0):
            raise ValueError("counts must be non-negative")
        if len(times) and self.last_s < times[-1]:
            raise ValueError("last_s must not precede the last change")
        if self.hold_s < 0:
            raise ValueError("hold_s must be non-negative")
        if self.start_time is not None:
            ts = pd.Timestamp(self.start_time)
            ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
            object.__setattr__(self, "start_time", ts)
        object.__setattr__(self, "times_s", _frozen(times))
        object.__setattr__(self, "adds", _frozen(adds))
        object.__setattr__(self, "removes", _frozen(removes))
        object.__setattr__(self, "counts", _frozen(counts))
        object.__setattr__(self, "initial", int(self.initial))

    @property
    def max_count(self) -> int:
        """Largest count ever alive (the fallback capacity)."""
        return int(max(self.initial, self.counts.max(initial=0)))


class EventsMeta(TypedDict, total=False):
    """What a reader knows of its source besides the changes: the descriptive fields of `AvailabilityEvents`."""

    start_time: pd.Timestamp | None
    name: str
    source: str
    capacity: int | None
    fmt: str


def from_count_series(
    times_s: Sequence[float] | np.ndarray,
    counts: Sequence[int] | np.ndarray,
    *,
    hold_s: float = 0.0,
    **meta: Unpack[EventsMeta],
) -> AvailabilityEvents:
    """Events from successive count observations (already sorted, one value per row).

    The first observation is the initial state, so the first interval gets ``prev_available`` equal to
    it and no spurious "n_in = N" burst at t = 0 (a count series starts mid-life of the cluster). Each
    later row contributes the positive/negative part of its change to ``adds``/``removes``; rows at the
    same second are summed. Where every row is one event (Parcae's ``aws/traces/p3.csv``) that yields the
    true gross counts; where rows are samples (SkyPilot ticks) gross events between samples are
    invisible and only the net change per sample survives.
    """
    t = np.asarray(times_s, dtype=np.float64)
    c = np.asarray(counts, dtype=np.int64)
    delta = np.diff(c)
    change_t = t[1:]
    adds = np.maximum(delta, 0)
    removes = np.maximum(-delta, 0)
    keep = delta != 0
    change_t, adds, removes = change_t[keep], adds[keep], removes[keep]
    # Merge rows that fall on the same timestamp (already non-decreasing), summing gross parts.
    uniq, first = np.unique(change_t, return_index=True)
    sum_adds = np.add.reduceat(adds, first) if len(first) else adds
    sum_removes = np.add.reduceat(removes, first) if len(first) else removes
    initial = int(c[0])
    return AvailabilityEvents(
        times_s=uniq,
        adds=sum_adds,
        removes=sum_removes,
        counts=initial + np.cumsum(sum_adds - sum_removes),
        initial=initial,
        last_s=float(t[-1]),
        hold_s=hold_s,
        **meta,
    )
