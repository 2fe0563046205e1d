"""The online skill gate: a learned forecaster's point forecast where it has beaten persistence on this trace's own
past, persistence's where it has not — per step ahead, and never from the future.

Why: a model trained on other traces transfers unevenly. Each trace of the corpus left out in turn
(`benchmarks/forecast_skill_gate.py`, horizon 12), LightGBM's mean MAE is 0.90-1.012 x persistence's (worse on
six of the eleven traces other than p3, by up to 1.2% on aws2020-g4dn-us-east-1c), while its quantiles and
preemption odds are better everywhere. A live fleet is a trace nobody trained on, so which of the two point
forecasts to trust can only be learned from the fleet's own history as it grows. The gate scores both on the
h-step forecasts whose truth is already in (origins ``t - h - window + 1 .. t - h``) and, per step h, keeps the
model's point only if its mean |error| there is below persistence's by ``margin`` (a tenth of it); with fewer than
``min_origins`` scored origins (a short history) it keeps persistence. Gated, the same backtests give 0.91-1.0005
x persistence (mean 0.9915 against the ungated 0.9908 on the eleven; p3, never used to choose, 1.000): the model's
gains on gcp-v100 (0.91) stay, its losses go. The model's quantiles and preemption probabilities are kept as they
are: the gate is about the point forecast only.

- `gate_choices` is the rule, a pure function of the counts and the model's past point forecasts, vectorised over
  origins (what backtests and benchmarks call on a whole trace at once);
- `SkillGated` wraps any `forecasting.forecast.Forecaster` in it (what the planner forecasts a fleet with, and
  `FORECASTERS["gated"]`): its ``predict`` runs the wrapped model at the history's recent origins and applies the
  same rule at the last one, so it equals `gate_choices` on the whole trace (tested).

Errors are summed in whole 1/1024ths of an instance: integer window sums make a truncated history give
bit-identical choices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
import pandas as pd

from forecasting.backtest import past_rows
from forecasting.forecast import Forecast, Forecaster

__all__ = [
    "GATE_MARGIN",
    "GATE_MIN_ORIGINS",
    "GATE_WINDOW",
    "SkillGated",
    "gate_choices",
    "past_forecasts",
    "past_points",
    "skill_gated",
]

#: Origins each step's score averages over (the latest whose truth is in).
GATE_WINDOW: Final = 200
#: The model must beat persistence's mean |error| by this fraction of it to be trusted (chosen on the corpus
#: without p3, `benchmarks/forecast_skill_gate.py`: with no margin a model that won a calm window by luck was
#: trusted into the next event, 1.012 x persistence on aws2020-g4dn-us-east-1c).
GATE_MARGIN: Final = 0.1
#: Fewer scored origins than this: persistence (the history is too short to tell).
GATE_MIN_ORIGINS: Final = 24
_UNIT: Final = 1024  # errors are summed in whole 1/1024ths of an instance (exact window sums)


def gate_choices(
    n_avail: np.ndarray,
    points: np.ndarray,
    *,
    window: int = GATE_WINDOW,
    margin: float = GATE_MARGIN,
    min_origins: int = GATE_MIN_ORIGINS,
) -> np.ndarray:
    """Per origin t (row) and step h (column, 1-based h = column + 1): whether the gate keeps the model's point.

    ``n_avail`` is the trace's available count per row; ``points[o, h - 1]`` the model's h-step point forecast made
    at origin o from rows <= o (NaN where the model made none: those origins are not scored). The choice at t uses
    origins o <= t - h only, so it never reads the future.
    """
    n = np.asarray(n_avail, dtype=np.float64)
    rows, horizon = points.shape
    if rows != len(n):
        raise ValueError(f"points has {rows} rows, the trace {len(n)}")
    out = np.zeros((rows, horizon), dtype=bool)
    pos = np.arange(rows)
    for h in range(1, horizon + 1):
        scored = np.zeros(rows, dtype=bool)
        err_model = np.zeros(rows, dtype=np.int64)
        err_pers = np.zeros(rows, dtype=np.int64)
        if rows > h:
            truth = n[h:]
            made = points[: rows - h, h - 1]
            ok = ~np.isnan(made)
            scored[: rows - h] = ok
            err_model[: rows - h] = np.where(ok, np.rint(np.abs(np.where(ok, made, 0.0) - truth) * _UNIT), 0)
            err_pers[: rows - h] = np.where(ok, np.rint(np.abs(n[: rows - h] - truth) * _UNIT), 0)

        hi = np.maximum(pos - h + 1, 0)  # origins o <= t - h, the latest `window` of them
        lo = np.maximum(pos - h - window + 1, 0)

        count, model, pers = (_window_sums(a, lo, hi) for a in (scored.astype(np.int64), err_model, err_pers))
        out[:, h - 1] = (count >= min_origins) & (model < pers * (1.0 - margin))
    return out


def _window_sums(a: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    csum = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(a)])
    out: np.ndarray = csum[hi] - csum[lo]
    return out


def past_forecasts(
    forecaster: Forecaster, table: pd.DataFrame, origins: Sequence[int] | np.ndarray, horizon: int
) -> list[Forecast]:
    """The forecasts of `forecaster` from each of `origins` of `table`, each from the rows up to its origin only: in
    one batched call when the model has ``predict_many`` (whose contract that is), else one ``predict`` per
    prefix."""
    idx = [int(o) for o in origins]
    batch = getattr(forecaster, "predict_many", None)
    if callable(batch):
        return list(batch(table, idx, horizon))
    return [forecaster.predict(past_rows(table, o), horizon) for o in idx]


def past_points(
    forecasts: Sequence[Forecast],
    rows: int,
    origins: Sequence[int] | np.ndarray,
    value: Callable[[Forecast], np.ndarray] = lambda f: f.point,
) -> np.ndarray:
    """`gate_choices`'s ``points``: the forecasts' points (or another `value` of each, e.g. a quantile) at their
    `origins`, NaN at the other of `rows` rows."""
    horizon = forecasts[0].horizon if forecasts else 0
    points = np.full((rows, horizon), np.nan)
    if forecasts:
        points[np.asarray(origins, dtype=np.int64)] = np.stack([np.asarray(value(f), np.float64) for f in forecasts])
    return points


@dataclass
class SkillGated:
    """`base`'s forecast with its point replaced, per step, by persistence's wherever the skill gate
    (`gate_choices`) does not trust it on the history's own past. `chosen` holds the last forecast's choices."""

    base: Any
    window: int = GATE_WINDOW
    margin: float = GATE_MARGIN
    min_origins: int = GATE_MIN_ORIGINS
    name: str = ""  # default: the base's name + "-gated"

    def __post_init__(self) -> None:
        self.name = self.name or f"{getattr(self.base, 'name', type(self.base).__name__)}-gated"
        if self.window < 1 or self.min_origins < 1 or not 0.0 <= self.margin < 1.0:
            raise ValueError(
                f"skill gate: window and min_origins must be >= 1 and margin in [0, 1); got window={self.window}, "
                f"min_origins={self.min_origins}, margin={self.margin}"
            )
        self.chosen: np.ndarray = np.zeros(0, dtype=bool)

    def fit(self, histories: Sequence[pd.DataFrame]) -> SkillGated:
        self.base.fit(histories)
        return self

    def history_window(self, horizon: int) -> int | None:
        """The base model's window behind each of the scored origins, and those origins."""
        own = self.base.history_window(horizon)
        return None if own is None else own + self.window + horizon

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        t = len(history) - 1
        first = max(t - horizon - self.window + 1, 0)  # the oldest origin any step's window scores
        origins = np.arange(first, t + 1)
        forecasts = past_forecasts(self.base, history, origins, horizon)
        points = past_points(forecasts, len(history), origins)
        n = history["available"].to_numpy(dtype=np.float64)
        self.chosen = gate_choices(n, points, window=self.window, margin=self.margin, min_origins=self.min_origins)[t]
        own = forecasts[-1]
        point = np.where(self.chosen, own.point, float(n[t]))
        return replace(own, model=self.name, point=point, events=())


def skill_gated(forecaster: Forecaster) -> Forecaster:
    """`forecaster` behind the skill gate, unless it is persistence (which the gate would only copy) or gated."""
    if isinstance(forecaster, SkillGated) or getattr(forecaster, "name", None) == "persistence":
        return forecaster
    return SkillGated(forecaster)
