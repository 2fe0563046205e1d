"""Model-agnostic evaluation of availability forecasters: rolling-origin backtests and their scores.

This module owns how a forecaster is scored. It calls only the `forecasting.forecast.Forecaster`
interface, so persistence, ARIMA and learnt models are measured the same way:

- `rolling_origin` replays one canonical table: at every origin t it hands the forecaster a fresh copy
  of rows 0..t (never a view of the future) and keeps the forecast next to the truth of t+1..t+horizon;
- `BacktestResult` holds those per-origin arrays and derives the scores: per-horizon MAE, pinball
  loss, 80% interval coverage (plain, and tie-aware: `pit_coverage`), and the Brier score of "at least one
  preemption within h intervals";
- `leave_one_trace_out` fits a fresh forecaster on all traces but one and backtests on that one;
- `plot_fans` draws forecast fans against the truth, one panel per model.

It must not import a particular model (they come in as arguments) nor the planner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forecasting.forecast import Forecast, Forecaster

__all__ = [
    "DEFAULT_START",
    "BacktestResult",
    "leave_one_trace_out",
    "pit_coverage",
    "plot_fans",
    "rolling_origin",
]

#: First origin by default: 24 intervals of past (24 min at 60 s), enough for every reference window W.
DEFAULT_START = 24


@dataclass(frozen=True, eq=False)  # eq=False: numpy fields make the generated __eq__ ambiguous
class BacktestResult:
    """A model's forecasts at many origins of one table, next to what happened.

    Row i of every array belongs to origin ``origins[i]`` (a row position in the table; the table's
    own interval number is ``intervals[i]``); column h is future interval h+1 of that origin.
    ``truth`` is the observed N, ``truth_lost`` whether that interval lost at least one instance.
    Scores are in instances and average over every origin and step unless they say otherwise.
    """

    model: str
    horizon: int
    origins: np.ndarray  # (n,)
    intervals: np.ndarray  # (n,)
    point: np.ndarray  # (n, H)
    quantiles: Mapping[float, np.ndarray]  # level -> (n, H)
    preemption_prob: np.ndarray  # (n, H)
    truth: np.ndarray  # (n, H)
    truth_lost: np.ndarray  # (n, H) bool

    @property
    def n_origins(self) -> int:
        return len(self.origins)

    @property
    def mae(self) -> np.ndarray:
        """Mean |N̂ - N| per step (length ``horizon``); the reference's accuracy measure (§B.4)."""
        out: np.ndarray = np.mean(np.abs(self.point - self.truth), axis=0)
        return out

    @property
    def mae_mean(self) -> float:
        """Mean |N̂ - N| over every step of every origin (§B.4's "all steps")."""
        return float(np.mean(np.abs(self.point - self.truth)))

    @property
    def pinball(self) -> float:
        """Quantile (pinball) loss averaged over levels, steps and origins, in instances."""
        losses = [pinball_loss(self.truth, pred, q) for q, pred in self.quantiles.items()]
        return float(np.mean(losses))

    @property
    def coverage80(self) -> float:
        """Share of outcomes inside [q0.1, q0.9], ends included (NaN without those levels)."""
        if 0.1 not in self.quantiles or 0.9 not in self.quantiles:
            return float("nan")
        inside = (self.truth >= self.quantiles[0.1]) & (self.truth <= self.quantiles[0.9])
        return float(np.mean(inside))

    @property
    def pit_coverage80(self) -> float:
        """Tie-aware coverage of the central 80% (`pit_coverage`): what ``coverage80`` means for counts that
        often repeat, where a band of whole instances holding the likely value covers far more than 80%."""
        return pit_coverage(self.truth, self.quantiles)

    @property
    def brier(self) -> float:
        """Brier score of "at least one preemption within the first h intervals", mean over h = 1..H.

        P(within h) = 1 - prod_{i<h}(1 - preemption_prob[i]) treats steps as independent, which is
        what a per-step probability can say.
        """
        p_within = 1.0 - np.cumprod(1.0 - np.clip(self.preemption_prob, 0.0, 1.0), axis=1)
        happened = np.logical_or.accumulate(self.truth_lost, axis=1)
        return float(np.mean((p_within - happened) ** 2))

    def to_dict(self) -> dict[str, Any]:
        return {
            "mae": [float(x) for x in self.mae],
            "mae_mean": self.mae_mean,
            "pinball": self.pinball,
            "coverage80": self.coverage80,
            "pit_coverage80": self.pit_coverage80,
            "brier": self.brier,
        }


def _count_cdf(x: np.ndarray, quantiles: Mapping[float, np.ndarray]) -> np.ndarray:
    """P(N <= x) at integer `x`, from quantiles alone: q_tau = inf{x : F(x) >= tau} bounds F(x) below by the
    largest level whose quantile is <= x and above by the smallest whose quantile is > x (0 and 1 without
    one); the midpoint of those bounds."""
    lo, hi = np.zeros(x.shape), np.ones(x.shape)
    for level, q in quantiles.items():
        lo = np.where(q <= x, np.maximum(lo, level), lo)
        hi = np.where(q > x, np.minimum(hi, level), hi)
    out: np.ndarray = (lo + hi) / 2
    return out


def pit_coverage(truth: np.ndarray, quantiles: Mapping[float, np.ndarray], lo: float = 0.1, hi: float = 0.9) -> float:
    """Share of outcomes in the central band [lo, hi] of the forecast, counted with the non-randomised PIT for
    count data (Czado, Gneiting & Held, Biometrics 65(4), 2009): an integer outcome y covers the probability
    interval [F(y-1), F(y)] of the predictive CDF F (`_count_cdf`), and counts for the part of it inside [lo,
    hi]. A calibrated forecast scores hi - lo; a forecast whose every quantile is the value that came (a calm
    trace) scores 0.8/0.9 of the band, not 1 as the plain "inside [q_lo, q_hi]" does. NaN without quantiles."""
    if not quantiles:
        return float("nan")
    y = np.rint(np.asarray(truth, dtype=np.float64))
    p1, p0 = _count_cdf(y, quantiles), _count_cdf(y - 1, quantiles)
    width = p1 - p0

    def inside(u: float) -> np.ndarray:  # the PIT's CDF at u, given the outcome
        spread = np.clip((u - p0) / np.where(width > 0, width, 1.0), 0.0, 1.0)
        out: np.ndarray = np.where(width > 0, spread, (u >= p1).astype(np.float64))
        return out

    return float(np.mean(inside(hi) - inside(lo)))


def pinball_loss(truth: np.ndarray, pred: np.ndarray, level: float) -> float:
    """Mean quantile loss at ``level``: under-prediction costs ``level``, over-prediction ``1 - level``."""
    err = np.asarray(truth, dtype=np.float64) - np.asarray(pred, dtype=np.float64)
    return float(np.mean(np.maximum(level * err, (level - 1.0) * err)))


def past_rows(table: pd.DataFrame, t: int, max_history: int | None = None) -> pd.DataFrame:
    """Rows up to and including origin t (the last `max_history` of them), as a deep copy with the table's attrs:
    no array reachable from it holds the future."""
    lo = 0 if max_history is None else max(0, t + 1 - max_history)
    past = table.iloc[lo : t + 1].copy(deep=True)
    past.attrs = dict(table.attrs)
    return past


def rolling_origin(
    forecaster: Forecaster,
    table: pd.DataFrame,
    horizon: int,
    *,
    start: int | None = None,
    step: int = 1,
    stop: int | None = None,
    max_history: int | None = None,
) -> BacktestResult:
    """Forecast from every origin t = start, start+step, ... that has ``horizon`` intervals of truth.

    Origins are row positions; the last usable one is ``len(table) - 1 - horizon`` (``stop``, if given,
    is an exclusive upper bound on top of that). The forecaster receives a deep copy of rows
    ``0..t`` — only the past, with the origin as its last row — so it cannot read the future even by
    accident. ``max_history`` hands over only the last rows instead, which keeps long traces linear in
    cost for models that need a short past (persistence needs one row).
    """
    if isinstance(horizon, bool) or int(horizon) != horizon or horizon < 1:
        raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    start = DEFAULT_START if start is None else start
    last = len(table) - 1 - horizon
    if stop is not None:
        last = min(last, stop - 1)
    origins = np.arange(max(start, 0), last + 1, step)
    if len(origins) == 0:
        raise ValueError(
            f"no origin with {horizon} intervals of truth: table {table.attrs.get('name', '')!r} has "
            f"{len(table)} rows and the first origin is {start}; lower start or horizon, or use a longer trace"
        )
    available = table["available"].to_numpy(dtype=np.float64)
    lost = table["n_out"].to_numpy() >= 1
    interval = table["interval"].to_numpy() if "interval" in table.columns else np.arange(len(table))

    forecasts: list[Forecast] = []
    for t in origins:
        fc = forecaster.predict(past_rows(table, int(t), max_history), horizon)
        if fc.horizon != horizon:
            raise ValueError(f"{fc.model} returned {fc.horizon} steps at origin {t}, expected {horizon}")
        forecasts.append(fc)
    levels = sorted(forecasts[0].quantiles)
    for t, fc in zip(origins, forecasts):
        if sorted(fc.quantiles) != levels:
            raise ValueError(
                f"{fc.model} changed its quantile levels at origin {t}: {sorted(fc.quantiles)} vs {levels}"
            )
    rows = origins[:, None] + np.arange(1, horizon + 1)[None, :]
    return BacktestResult(
        model=forecasts[0].model,
        horizon=int(horizon),
        origins=origins,
        intervals=interval[origins],
        point=np.stack([fc.point for fc in forecasts]).astype(np.float64),
        quantiles={q: np.stack([fc.quantiles[q] for fc in forecasts]).astype(np.float64) for q in levels},
        preemption_prob=np.stack([fc.preemption_prob for fc in forecasts]).astype(np.float64),
        truth=available[rows],
        truth_lost=lost[rows],
    )


def leave_one_trace_out(
    make_forecaster: Callable[[], Forecaster],
    tables: Mapping[str, pd.DataFrame],
    horizon: int,
    *,
    held_out: Sequence[str] | None = None,
    **backtest_options: Any,
) -> dict[str, BacktestResult]:
    """For each held-out trace, fit a fresh forecaster on all the others and backtest on it.

    ``held_out`` limits which traces are held out (all by default); the training set is always every
    other trace. Extra keyword arguments go to `rolling_origin`.
    """
    names = list(tables) if held_out is None else list(held_out)
    unknown = [n for n in names if n not in tables]
    if unknown:
        raise KeyError(f"held_out names not among the tables: {unknown}; known: {list(tables)}")
    results = {}
    for name in names:
        model = make_forecaster().fit([t for other, t in tables.items() if other != name])
        results[name] = rolling_origin(model, tables[name], horizon, **backtest_options)
    return results


def plot_fans(
    table: pd.DataFrame,
    forecasters: Mapping[str, Forecaster],
    origins: Sequence[int],
    horizon: int,
    path: str | Path,
) -> Path:
    """PNG of forecast fans (q0.1-q0.9 band, median, point) from ``origins`` against the truth, one panel per
    model.

    Origins are row positions of ``table``; each model sees only the past of each origin, as in
    `rolling_origin`. A fan past the table's end (an origin near or at its last row: a forecast of what has not
    happened yet) is drawn without truth beside it. Returns the written path.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no global pyplot state
    from matplotlib.figure import Figure

    if not forecasters:
        raise ValueError("plot_fans needs at least one forecaster")
    bad = [t for t in origins if not 0 <= t < len(table)]
    if bad:
        raise ValueError(f"origins {bad} are not row positions of a table of {len(table)} rows")
    lo = max(min(origins) - 2 * horizon, 0)
    hi = min(max(origins) + horizon + 1, len(table))
    x = np.arange(lo, hi)
    truth = table["available"].to_numpy()[lo:hi]

    fig = Figure(figsize=(10, 2.6 * len(forecasters)), tight_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(forecasters), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, model) in zip(axes, forecasters.items()):
        ax.step(x, truth, where="post", color="black", lw=1.2, label="truth")
        for i, t in enumerate(origins):
            steps = horizon
            fc = model.predict(past_rows(table, int(t)), steps)
            xs = np.arange(t + 1, t + 1 + steps)
            ax.fill_between(
                xs,
                fc.quantiles[0.1],
                fc.quantiles[0.9],
                step="post",
                alpha=0.25,
                color="C0",
                label="q0.1-q0.9" if i == 0 else None,
            )
            ax.step(xs, fc.quantiles[0.5], where="post", color="C0", lw=1.0, label="median" if i == 0 else None)
            ax.step(xs, fc.point, where="post", color="C3", lw=1.0, ls="--", label="point" if i == 0 else None)
            ax.axvline(t, color="grey", lw=0.5, ls=":")
        ax.set_title(name)
        ax.set_xlim(lo, max(origins) + horizon + 1)
        ax.set_ylabel("available")
        ax.legend(loc="lower left", fontsize=7, ncols=4)
    axes[-1].set_xlabel(f"interval (row) of {table.attrs.get('name', 'trace')}")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out
