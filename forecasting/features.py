"""Features and targets for learnt availability forecasters, built from canonical per-interval tables.

This module owns the *look-ahead-free* description of a trace's history at a forecast origin. An
origin ``t`` is a positional row of a canonical table (``forecasting.traces``): the forecaster has
seen intervals ``0..t`` (their events and the count ``N_t = available[t]`` at the end of interval t)
and predicts ``N_{t+1}..N_{t+H}``. Every feature at origin ``t`` is a function of rows ``<= t`` only;
``tests/test_features.py`` checks this by recomputing on ``table.iloc[:t+1]``.

Features are **capacity-normalised** (counts and sizes divided by the cluster capacity c) so that one
model transfers between a 4-node and an 80-node cluster. Event *counts* (how many intervals had a
preemption) are not normalised: they measure how often the market moves, not by how much.

All functions are pure and vectorised: each feature is computed once for every row of the table with
cumulative sums or rolling windows, then the requested origins are selected. No Python loop runs over
history. This module must not import a model library; the forecasters import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import pandas as pd

__all__ = [
    "DIFF_LAGS",
    "EVENT_WINDOWS",
    "FEATURE_NAMES",
    "LEVEL_WINDOWS",
    "SINCE_CAP",
    "STEP_FEATURE_NAMES",
    "features_at",
    "stack_steps",
    "targets",
]

DIFF_LAGS: Final = (1, 2, 3, 6, 12, 24)
LEVEL_WINDOWS: Final = (6, 12, 24, 60)
EVENT_WINDOWS: Final = (6, 12, 24, 60)
#: "Intervals since the last event" saturates here (4 h of 60-s intervals): beyond it the market is calm
#: and the exact age carries no signal; capping also keeps the feature identical for a history with
#: no event at all and one whose last event is very old.
SINCE_CAP: Final = 240

_SECONDS_PER_DAY: Final = 86_400.0


def _names() -> tuple[str, ...]:
    names = ["level", "headroom"]
    names += [f"diff_{k}" for k in DIFF_LAGS]
    for w in LEVEL_WINDOWS:
        names += [f"mean_{w}", f"min_{w}", f"max_{w}", f"std_{w}"]
    for w in EVENT_WINDOWS:
        names += [f"out_count_{w}", f"out_size_{w}", f"in_count_{w}", f"in_size_{w}"]
    names += ["log_since_out", "log_since_in", "tod_sin", "tod_cos", "dow"]
    return tuple(names)


#: Column order of :func:`features_at` (a model's feature vector is this, in this order).
FEATURE_NAMES: Final[tuple[str, ...]] = _names()


#: Columns :func:`stack_steps` appends: the step h and the event ages as of the target interval t+h.
STEP_FEATURE_NAMES: Final[tuple[str, ...]] = ("horizon_step", "log_since_out_at_step", "log_since_in_at_step")


def _check_table(table: pd.DataFrame) -> None:
    missing = {"available", "n_in", "n_out", "capacity", "start_time"} - set(table.columns)
    if missing:
        raise ValueError(f"not a canonical availability table: missing columns {sorted(missing)}")
    if table.empty:
        raise ValueError("empty availability table")


def _capacity(table: pd.DataFrame) -> float:
    c = float(table["capacity"].iloc[-1]) if "capacity" in table else float(table.attrs["capacity"])
    if not c > 0:
        raise ValueError(f"capacity must be positive, got {c:g}")
    return c


def _origins(table: pd.DataFrame, origins: Sequence[int] | np.ndarray | None) -> np.ndarray:
    n = len(table)
    if origins is None:
        return np.arange(n, dtype=np.int64)
    idx = np.asarray(origins, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"origins must be row positions in [0, {n - 1}], got {idx.min()}..{idx.max()}")
    return idx


def _window_sum(csum: np.ndarray, w: int) -> np.ndarray:
    """Sum of the last ``w`` values up to each row (fewer at the start), from an exclusive cumsum."""
    n = len(csum) - 1
    hi = np.arange(1, n + 1)
    lo = np.maximum(hi - w, 0)
    return csum[hi] - csum[lo]


def _since_last(mask: np.ndarray) -> np.ndarray:
    """Intervals since the last row where ``mask`` holds (0 if it holds now), capped at SINCE_CAP."""
    pos = np.arange(len(mask), dtype=np.int64)
    last = np.maximum.accumulate(np.where(mask, pos, -1))
    since = np.where(last >= 0, pos - last, SINCE_CAP)
    return np.minimum(since, SINCE_CAP).astype(np.float64)


def _calendar(start_time: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time-of-day (sin, cos) and day of week; NaN where the trace has no absolute time."""
    st = pd.to_datetime(start_time, utc=True)
    known = st.notna().to_numpy()
    tod = np.full(len(st), np.nan)
    dow = np.full(len(st), np.nan)
    if known.any():
        t = st[known]
        secs = (t.dt.hour * 3600 + t.dt.minute * 60 + t.dt.second).to_numpy(dtype=np.float64)
        tod[known] = secs / _SECONDS_PER_DAY
        dow[known] = t.dt.day_of_week.to_numpy(dtype=np.float64)
    angle = 2.0 * np.pi * tod
    return np.sin(angle), np.cos(angle), dow


def _all_rows(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """Every feature for every row of ``table``: row t depends on rows <= t only."""
    c = _capacity(table)
    n_avail = table["available"].to_numpy(dtype=np.int64)
    n_in = table["n_in"].to_numpy(dtype=np.int64)
    n_out = table["n_out"].to_numpy(dtype=np.int64)
    rows = len(n_avail)
    out: dict[str, np.ndarray] = {}

    out["level"] = n_avail / c
    out["headroom"] = (c - n_avail) / c
    for k in DIFF_LAGS:
        d = np.full(rows, np.nan)
        if k < rows:
            d[k:] = (n_avail[k:] - n_avail[:-k]) / c
        out[f"diff_{k}"] = d

    # Integer cumulative sums keep window means/variances exact, so truncating the table cannot change
    # a value by float round-off (the leakage guard compares for exact equality).
    zero = np.zeros(1, dtype=np.int64)
    cs = np.concatenate([zero, np.cumsum(n_avail)])
    cs2 = np.concatenate([zero, np.cumsum(n_avail * n_avail)])
    series = pd.Series(n_avail, dtype=np.float64)
    for w in LEVEL_WINDOWS:
        count = np.minimum(np.arange(1, rows + 1), w)
        s = _window_sum(cs, w)
        s2 = _window_sum(cs2, w)
        out[f"mean_{w}"] = s / count / c
        out[f"min_{w}"] = series.rolling(w, min_periods=1).min().to_numpy() / c
        out[f"max_{w}"] = series.rolling(w, min_periods=1).max().to_numpy() / c
        var = (count * s2 - s * s) / (count * count)  # population variance, exact numerator
        out[f"std_{w}"] = np.sqrt(np.maximum(var, 0.0)) / c

    out_any = np.concatenate([zero, np.cumsum(n_out > 0)])
    out_sum = np.concatenate([zero, np.cumsum(n_out)])
    in_any = np.concatenate([zero, np.cumsum(n_in > 0)])
    in_sum = np.concatenate([zero, np.cumsum(n_in)])
    for w in EVENT_WINDOWS:
        out[f"out_count_{w}"] = _window_sum(out_any, w).astype(np.float64)
        out[f"out_size_{w}"] = _window_sum(out_sum, w) / c
        out[f"in_count_{w}"] = _window_sum(in_any, w).astype(np.float64)
        out[f"in_size_{w}"] = _window_sum(in_sum, w) / c

    out["log_since_out"] = np.log1p(_since_last(n_out > 0))
    out["log_since_in"] = np.log1p(_since_last(n_in > 0))
    out["tod_sin"], out["tod_cos"], out["dow"] = _calendar(table["start_time"])
    return out


def features_at(table: pd.DataFrame, origins: Sequence[int] | np.ndarray | None = None) -> pd.DataFrame:
    """The feature matrix at each origin (row position) of a canonical table; all rows when None.

    Columns are :data:`FEATURE_NAMES` (float64; NaN where undefined: a lag before the first row, or
    the calendar of a trace without absolute time). The index is the origins' row positions.
    """
    _check_table(table)
    idx = _origins(table, origins)
    every = _all_rows(table)
    return pd.DataFrame({name: every[name][idx] for name in FEATURE_NAMES}, index=pd.Index(idx, name="origin"))


def targets(
    table: pd.DataFrame, origins: Sequence[int] | np.ndarray | None, horizon: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What a forecaster at each origin should predict, for h = 1..horizon.

    Returns ``(delta, preempt)``, both indexed by origin with columns ``1..horizon``:
    ``delta[h] = (N_{t+h} - N_t) / c`` and ``preempt[h] = 1.0`` if interval t+h has ``n_out >= 1``
    else ``0.0``. Both are NaN where t+h lies past the end of the table.
    """
    _check_table(table)
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    idx = _origins(table, origins)
    c = _capacity(table)
    n_avail = table["available"].to_numpy(dtype=np.float64)
    out_flag = (table["n_out"].to_numpy() >= 1).astype(np.float64)
    n = len(n_avail)
    steps = np.arange(1, horizon + 1)
    future = idx[:, None] + steps[None, :]
    inside = future < n
    safe = np.where(inside, future, 0)
    delta = np.where(inside, (n_avail[safe] - n_avail[idx][:, None]) / c, np.nan)
    preempt = np.where(inside, out_flag[safe], np.nan)
    index = pd.Index(idx, name="origin")
    return (
        pd.DataFrame(delta, index=index, columns=steps),
        pd.DataFrame(preempt, index=index, columns=steps),
    )


def stack_steps(feats: pd.DataFrame, horizon: int) -> pd.DataFrame:
    """One row per (origin, step h = 1..horizon): the origin's features plus :data:`STEP_FEATURE_NAMES`.

    For a model that takes the step as a feature. The age of the last event *as of the target interval*
    (``since + h``, capped) is given explicitly: "is a preemption due at t+h" is an interaction of the
    origin's age and h that axis-aligned trees cannot find greedily (neither alone splits the data), but
    is a single threshold on the sum. Uses only the origin's features, so it adds no look-ahead.
    """
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    n = len(feats)
    steps = np.tile(np.arange(1, horizon + 1, dtype=np.float64), n)
    out = pd.DataFrame(np.repeat(feats.to_numpy(dtype=np.float64), horizon, axis=0), columns=feats.columns)
    out["horizon_step"] = steps
    for kind in ("out", "in"):
        since = np.rint(np.expm1(out[f"log_since_{kind}"].to_numpy()))
        out[f"log_since_{kind}_at_step"] = np.log1p(np.minimum(since + steps, SINCE_CAP))
    out.index = pd.MultiIndex.from_arrays(
        [np.repeat(feats.index.to_numpy(), horizon), steps.astype(np.int64)], names=["origin", "step"]
    )
    return out
