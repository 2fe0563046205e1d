"""The canonical per-interval table: the one shape of availability the rest of the system consumes.

Owns: `COLUMNS` (one row per interval; ``df.attrs = {"name", "source", "interval_s", "capacity", "format"}``),
binning events onto the grid exactly like the Parcae reference (`to_intervals`: a change at second ``t`` lands in
interval ``floor(t / interval_s)``, gross adds and removes summed, empty intervals padded), and the operations on
a table (`resample`, `slice_hours`, `scale_trace`), and the table of a count observed once per interval
(`counts_table`: a live fleet's own history). Must not touch: files (`forecasting.traces.formats`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np
import pandas as pd

from forecasting.traces.events import AvailabilityEvents, TraceFormatError
from forecasting.traces.formats import FORMATS
from liveput import DEFAULT_INTERVAL_S  # the planning grid is liveput's

COLUMNS: Final = (
    "interval",
    "start_s",
    "start_time",
    "prev_available",
    "n_in",
    "n_out",
    "available",
    "capacity",
)


#: Rows of the canonical table (640 MB in its eight columns): 19 years of 60 s intervals, 115 days of 1 s ones.
MAX_INTERVALS: Final = 10_000_000


# ------------------------------------------------------------------------------ canonical table


def _check_interval(interval_s: float) -> float:
    interval_s = float(interval_s)
    if not math.isfinite(interval_s) or interval_s <= 0:
        raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
    return interval_s


def _start_times(origin: pd.Timestamp | None, start_s: np.ndarray) -> pd.Series:
    if origin is None or pd.isna(origin):
        return pd.Series(pd.NaT, index=range(len(start_s)), dtype="datetime64[ns, UTC]")
    return pd.Series(origin + pd.to_timedelta(start_s, unit="s"), index=range(len(start_s))).astype(
        "datetime64[ns, UTC]"
    )


def _table(
    interval: np.ndarray,
    interval_s: float,
    origin: pd.Timestamp | None,
    prev: np.ndarray,
    n_in: np.ndarray,
    n_out: np.ndarray,
    available: np.ndarray,
    capacity: int,
    attrs: dict[str, object],
) -> pd.DataFrame:
    start_s = interval.astype(np.float64) * interval_s
    df = pd.DataFrame(
        {
            "interval": interval.astype(np.int64),
            "start_s": start_s,
            "start_time": _start_times(origin, start_s),
            "prev_available": prev.astype(np.int64),
            "n_in": n_in.astype(np.int64),
            "n_out": n_out.astype(np.int64),
            "available": available.astype(np.int64),
            "capacity": np.full(len(interval), capacity, dtype=np.int64),
        },
        columns=list(COLUMNS),
    )
    df.attrs = dict(attrs)
    return df


def counts_table(
    counts: Sequence[int], capacity: int, interval_s: float = DEFAULT_INTERVAL_S, name: str = "counts"
) -> pd.DataFrame:
    """The canonical table of a count observed once per interval (a live fleet's alive instances): interval i has
    ``available = counts[i]`` and ``prev_available = counts[i - 1]`` (the first: its own count, no burst at t = 0),
    net changes as ``n_in`` / ``n_out``. What a forecaster predicts from when the history is a job's own."""
    c = np.asarray(counts, dtype=np.int64)
    if c.ndim != 1 or not len(c):
        raise ValueError("counts_table needs at least one count")
    if (c < 0).any() or (c > capacity).any():
        raise ValueError(f"counts must be in 0..capacity ({capacity}), got {counts!r}")
    prev = np.concatenate([c[:1], c[:-1]])
    delta = c - prev
    attrs = {
        "name": name,
        "source": name,
        "interval_s": _check_interval(interval_s),
        "capacity": int(capacity),
        "format": "counts",
    }
    return _table(np.arange(len(c)), interval_s, None, prev, np.maximum(delta, 0), np.maximum(-delta, 0), c,
                  int(capacity), attrs)  # fmt: skip


def _interval_count(events: AvailabilityEvents, interval_s: float) -> int:
    """Rows of the table of ``events`` at ``interval_s``; a TraceFormatError (before any allocation) past
    MAX_INTERVALS."""
    end_s = events.last_s + events.hold_s
    ratio = end_s / interval_s  # inf for a tiny interval: compare before any int() or ceil() of it
    # round first: float noise such as 16235.0000001 must not add an interval
    n = max(int(events.last_s // interval_s) + 1, math.ceil(round(ratio, 9))) if ratio <= MAX_INTERVALS else None
    if n is None or n > MAX_INTERVALS:
        raise TraceFormatError(
            events.source or events.name or "<trace>",
            FORMATS.get(events.fmt, "a trace"),
            reason=(
                f"the trace spans {end_s:,.0f} s, which is {ratio:,.0f} intervals of {interval_s:g} s, more than "
                f"the {MAX_INTERVALS:,} a trace may have; choose a longer interval, or write the times relative "
                "to the trace's start"
            ),
        )
    return n


def to_intervals(events: AvailabilityEvents, interval_s: float = DEFAULT_INTERVAL_S) -> pd.DataFrame:
    """Bin events onto a grid of ``interval_s`` seconds: the canonical per-interval table.

    Reproduces the reference parser: a change at ``t`` s lands in interval ``floor(t / interval_s)``;
    gross adds/removes in one interval are summed; empty intervals are padded; the table runs from
    interval 0 through the interval of the last observation (or to the end of the last tick for tick
    series). Capacity: ``events.capacity`` if set, else the largest count (at least 1).
    """
    interval_s = _check_interval(interval_s)
    n = _interval_count(events, interval_s)
    idx = np.floor(events.times_s / interval_s).astype(np.int64)
    n_in = np.zeros(n, dtype=np.int64)
    n_out = np.zeros(n, dtype=np.int64)
    np.add.at(n_in, idx, events.adds)
    np.add.at(n_out, idx, events.removes)
    available = events.initial + np.cumsum(n_in - n_out)
    prev = np.concatenate(([events.initial], available[:-1]))
    observed_max = events.max_count
    capacity = events.capacity if events.capacity is not None else max(observed_max, 1)
    if capacity < observed_max:
        raise ValueError(
            f"capacity {capacity} is below the {observed_max} instances trace {events.name!r} has alive at once"
        )
    attrs = {
        "name": events.name,
        "source": events.source,
        "interval_s": interval_s,
        "capacity": int(capacity),
        "format": events.fmt,
    }
    return _table(np.arange(n), interval_s, events.start_time, prev, n_in, n_out, available, capacity, attrs)


def _origin(df: pd.DataFrame) -> pd.Timestamp | None:
    """Absolute time of interval 0 (None when the trace has no absolute time)."""
    first = df["start_time"].iloc[0]
    if pd.isna(first):
        return None
    return first - pd.to_timedelta(float(df["start_s"].iloc[0]), unit="s")


def _check_contiguous(df: pd.DataFrame) -> None:
    if df.empty:
        raise ValueError("empty availability table")
    if np.any(np.diff(df["interval"].to_numpy()) != 1):
        raise ValueError("availability table must hold consecutive intervals")


def resample(df: pd.DataFrame, interval_s: float) -> pd.DataFrame:
    """Re-bin a canonical table onto a coarser grid whose interval is an integer multiple.

    Sums ``n_in``/``n_out``, keeps the first ``prev_available`` and the last ``available`` of each
    group. Bins stay aligned to interval 0 even for sliced tables, so interval numbers remain
    comparable. For finer or non-multiple grids re-bin from the events: ``load_trace(..., interval_s=X)``.
    """
    interval_s = _check_interval(interval_s)
    old = float(df.attrs["interval_s"])
    ratio = interval_s / old
    k = round(ratio)
    if k < 1 or not math.isclose(ratio, k, rel_tol=1e-9):
        raise ValueError(
            f"cannot resample {old:g} s intervals to {interval_s:g} s: the new interval must be an integer "
            f"multiple; use load_trace(..., interval_s={interval_s:g}) to re-bin from the events"
        )
    _check_contiguous(df)
    groups = df["interval"].to_numpy() // k
    g = df.groupby(groups, sort=True)
    new_interval = np.asarray(g.size().index, dtype=np.int64)
    attrs = {**df.attrs, "interval_s": interval_s}
    capacity = int(df.attrs["capacity"])
    return _table(
        new_interval,
        interval_s,
        _origin(df),
        g["prev_available"].first().to_numpy(),
        g["n_in"].sum().to_numpy(),
        g["n_out"].sum().to_numpy(),
        g["available"].last().to_numpy(),
        capacity,
        attrs,
    )


def slice_hours(df: pd.DataFrame, start_h: float, end_h: float) -> pd.DataFrame:
    """Intervals whose start lies in ``[start_h, end_h)`` hours, keeping their ``interval`` numbers.

    The numbers are kept (the simulator and the replay segments refer to minutes of the whole trace);
    only the DataFrame index is reset. The window must lie inside the trace: silently returning a
    shorter segment would skew any per-hour comparison.
    """
    _check_contiguous(df)
    iv = float(df.attrs["interval_s"])
    lo_s, hi_s = float(df["start_s"].iloc[0]), float(df["start_s"].iloc[-1]) + iv
    span = (
        f"trace {df.attrs.get('name', '')!r} covers hours {lo_s / 3600:.3f}-{hi_s / 3600:.3f} "
        f"({len(df)} intervals of {iv:g} s)"
    )
    if not end_h > start_h:
        raise ValueError(f"empty window [{start_h}, {end_h}) h; {span}")
    lo, hi = start_h * 3600.0, end_h * 3600.0
    if lo < lo_s - 1e-9 or hi > hi_s + 1e-9:
        raise ValueError(f"window [{start_h}, {end_h}) h lies outside the trace; {span}")
    mask = (df["start_s"] >= lo) & (df["start_s"] < hi)
    if not mask.any():
        raise ValueError(f"window [{start_h}, {end_h}) h holds no interval start; {span}")
    out = df.loc[mask].reset_index(drop=True)
    out.attrs = dict(df.attrs)
    return out


def scale_trace(df: pd.DataFrame, capacity: int) -> pd.DataFrame:
    """Rescale a trace to a cluster of ``capacity`` instances: ``N' = floor(N * c'/c + 0.5)``.

    Applied to ``prev_available`` and ``available``; ``n_in``/``n_out`` become the positive/negative
    part of the scaled change, so gross counts collapse to net per interval (an interval with 2 in and
    1 out becomes 1 in, 0 out, or whatever the rounding leaves). Integer arithmetic keeps exact halves
    rounding up.
    """
    if isinstance(capacity, bool) or int(capacity) != capacity or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    new = int(capacity)
    old = int(df.attrs["capacity"])

    def scaled(column: str) -> np.ndarray:
        n = df[column].to_numpy(dtype=np.int64)
        out: np.ndarray = (2 * n * new + old) // (2 * old)  # == floor(n * new / old + 1/2), exactly
        return out

    prev = scaled("prev_available")
    available = scaled("available")
    delta = available - prev
    out = df.copy()
    out["prev_available"] = prev
    out["available"] = available
    out["n_in"] = np.maximum(delta, 0)
    out["n_out"] = np.maximum(-delta, 0)
    out["capacity"] = new
    out.attrs = {**df.attrs, "capacity": new}
    return out
