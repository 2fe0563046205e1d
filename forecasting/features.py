"""Features and targets for learnt availability forecasters, built from canonical per-interval tables.

This module owns the *look-ahead-free* description of a trace's history at a forecast origin. An
origin ``t`` is a positional row of a canonical table (``forecasting.traces``): the forecaster has
seen intervals ``0..t`` (their events and the count ``N_t = available[t]`` at the end of interval t)
and predicts ``N_{t+1}..N_{t+H}``. Every feature at origin ``t`` is a function of rows ``<= t`` only;
``tests/test_features.py`` checks this by recomputing on ``table.iloc[:t+1]``.

Features are **capacity-normalised** (counts and sizes divided by the cluster capacity c) so that one
model transfers between a 4-node and an 80-node cluster. Event *counts* (how many intervals had a
preemption) are not normalised: they measure how often the market moves, not by how much.

It also owns the **anchor** (`anchor_levels`): a regime-adaptive reference forecast that learnt models
predict *around*. Traces differ in how a dip ends: on some (gcp-v100) the cluster climbs back to its
recent level within minutes, on others (the SkyPilot fleets, aws2020) a lost instance stays lost for
hours. Which regime a trace is in cannot be read off one window of counts, but it can be measured on the
trace's own past: at every origin the anchor scores persistence and "back to the maximum of the last w
intervals" (w in ``ANCHOR_MAX_WINDOWS``) on the forecasts whose truth is already known (origins
``t - ANCHOR_SKILL_HORIZON - ANCHOR_WINDOW + 1 .. t - ANCHOR_SKILL_HORIZON``, mean |error| over
``ANCHOR_SKILL_HORIZON`` steps) and follows a reverting expert only if it beat persistence by more than
``ANCHOR_MARGIN``. Window, margin and the expert set were chosen by leave-one-trace-out on the corpus
*without* p3 (p3 is the test trace): on the 11 other traces the anchor alone has a mean MAE ratio to
persistence of 0.994 (0.90 on gcp-v100, at most 1.022 elsewhere); a margin of 0.05 or 0.1 switched too
often (up to +7% on the SkyPilot traces), and a window of 60 or 120 origins was noisier.

All functions are pure and vectorised: each feature is computed once for every row of the table with
cumulative sums or rolling windows, then the requested origins are selected. No Python loop runs over
history. Every feature looks back at most ``SINCE_CAP`` rows, so ``SINCE_CAP + 1`` rows of history give
exactly the features of the whole past (``forecasting.registry.history_window`` relies on it). This
module must not import a model library; the forecasters import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import pandas as pd

__all__ = [
    "ANCHOR_MARGIN",
    "ANCHOR_MAX_WINDOWS",
    "ANCHOR_SKILL_HORIZON",
    "ANCHOR_WINDOW",
    "DIFF_LAGS",
    "EVENT_WINDOWS",
    "FEATURE_NAMES",
    "LEVEL_WINDOWS",
    "SINCE_CAP",
    "STEP_FEATURE_NAMES",
    "anchor_levels",
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

#: Anchor (see the module docstring): past origins scored, the steps each is scored over, the windows of
#: the "back to the recent maximum" experts, and the relative margin a reverting expert must win by.
#: Look-back: ANCHOR_WINDOW + ANCHOR_SKILL_HORIZON + max(ANCHOR_MAX_WINDOWS) - 1 = 223 <= SINCE_CAP rows.
ANCHOR_WINDOW: Final = 200
ANCHOR_SKILL_HORIZON: Final = 12
ANCHOR_MAX_WINDOWS: Final = (3, 6, 12)
ANCHOR_MARGIN: Final = 0.3

_SECONDS_PER_DAY: Final = 86_400.0


def _names() -> tuple[str, ...]:
    names = ["level", "headroom"]
    names += [f"diff_{k}" for k in DIFF_LAGS]
    for w in LEVEL_WINDOWS:
        names += [f"mean_{w}", f"min_{w}", f"max_{w}", f"std_{w}"]
    for w in EVENT_WINDOWS:
        names += [f"out_count_{w}", f"out_size_{w}", f"in_count_{w}", f"in_size_{w}"]
    names += ["log_since_out", "log_since_in", "tod_sin", "tod_cos", "dow"]
    names += ["anchor_gap", "anchor_window", "revert_skill"]
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


def _rolling_max(n_avail: np.ndarray, w: int) -> np.ndarray:
    """Max of the last ``w`` values up to each row (fewer at the start)."""
    return pd.Series(n_avail).rolling(w, min_periods=1).max().to_numpy().astype(np.int64)


def _anchor(n_avail: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(anchor level, window of the chosen expert (0 = persistence), relative skill) for every row.

    Errors are integer sums, so a truncated history gives bit-identical choices (no float round-off).
    """
    n = len(n_avail)
    H0, W = ANCHOR_SKILL_HORIZON, ANCHOR_WINDOW
    experts = [n_avail] + [_rolling_max(n_avail, w) for w in ANCHOR_MAX_WINDOWS]
    scored = max(n - H0, 0)  # origins whose H0 future steps are inside the table
    pos = np.arange(n)
    hi = np.maximum(pos - H0 + 1, 0)  # origins s <= t - H0 are fully known at t
    lo = np.maximum(pos - H0 - W + 1, 0)
    errors = []
    for pred in experts:
        err = np.zeros(n, dtype=np.int64)  # sum over h of |N_{s+h} - pred_s|
        for h in range(1, H0 + 1):
            err[:scored] += np.abs(n_avail[h : h + scored] - pred[:scored])
        csum = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(err)])
        errors.append(csum[hi] - csum[lo])
    errors = np.stack(errors)  # (experts, rows) of integer error sums over the window
    # a reverting expert must beat persistence by the margin: err_k < (1 - margin) * err_0
    scaled = errors.astype(np.float64)
    scaled[1:] /= 1.0 - ANCHOR_MARGIN
    best = np.argmin(scaled, axis=0)  # ties: the first, persistence
    level = np.stack(experts)[best, pos]
    window = np.array((0, *ANCHOR_MAX_WINDOWS), dtype=np.float64)[best]
    base = errors[0].astype(np.float64)
    skill = np.where(base > 0, (base - errors[1:].min(axis=0)) / np.maximum(base, 1.0), 0.0)
    return level, window, skill


def anchor_levels(table: pd.DataFrame, origins: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """The anchor forecast (whole instances) at each origin: N_t, or the recent maximum if that has worked."""
    _check_table(table)
    idx = _origins(table, origins)
    level, _, _ = _anchor(table["available"].to_numpy(dtype=np.int64))
    return level[idx].astype(np.float64)


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
    level, window, skill = _anchor(n_avail)
    out["anchor_gap"] = (level - n_avail) / c
    out["anchor_window"] = window
    out["revert_skill"] = skill
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
