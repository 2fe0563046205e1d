"""Baseline availability forecasters: persistence, the reference's post-processed ARIMA, damped-trend ETS.

This module owns the three models every learnt forecaster must beat, all behind the
`forecasting.forecast.Forecaster` interface:

- `PersistenceForecaster`: N stays at its last value; its spread and its preemption probability are
  empirical, learnt in ``fit`` from how N moved h intervals after every origin of the training traces.
- `ArimaForecaster`: the Parcae reference predictor (reference doc §B.2) re-implemented on current
  statsmodels: outlier removal, turn-point flattening, monotone-trend damping, ARIMA(1,1,0) with drift,
  growth and range clips, a seeded flat-forecast jitter, and the in/out penalty rebuild.
- `EtsForecaster`: Holt's additive damped trend on the same recent window.

The reference's post-processing steps are pure functions here (`remove_outliers`, `flatten_turnpoint`,
`trend_penalties`, `rebuild_with_penalties`, `reference_window`) so they can be tested one by one.

Every model predicts from the history it is given and nothing else (the backtest checks this); every
random draw comes from a generator seeded by the constructor's ``seed`` and the origin's interval number,
so the same call gives the same forecast. This module must not import the planner or the backtest.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Self

import numpy as np
import pandas as pd

from forecasting.forecast import QUANTILES, Forecast

__all__ = [
    "ArimaForecaster",
    "EtsForecaster",
    "PersistenceForecaster",
    "rebuild_with_penalties",
    "reference_window",
    "flatten_turnpoint",
    "remove_outliers",
    "table_capacity",
    "trend_penalties",
]

#: Reference window W per look-ahead K (reference doc §A.4); other K use W = max(K, 7).
_REFERENCE_WINDOWS: Final[dict[int, int]] = {14: 17, 12: 12, 10: 10, 9: 9, 8: 8, 7: 8, 5: 10}
_LO, _HI = QUANTILES[0], QUANTILES[-1]


# ----------------------------------------------------------------------------------- table helpers


def table_capacity(table: pd.DataFrame) -> int:
    """Cluster cap of a canonical table: ``attrs["capacity"]``, else its ``capacity`` column, else max N."""
    cap = table.attrs.get("capacity")
    if cap is None and "capacity" in table.columns and len(table):
        cap = table["capacity"].iloc[-1]
    if cap is None:
        cap = table["available"].max() if len(table) else 1
    return max(int(cap), 1)


def _check_history(history: pd.DataFrame, horizon: int, model: str) -> None:
    if isinstance(horizon, bool) or int(horizon) != horizon or horizon < 1:
        raise ValueError(f"{model}: horizon must be a positive integer, got {horizon!r}")
    if "available" not in history.columns or len(history) == 0:
        raise ValueError(
            f"{model}: history must be a non-empty canonical table with an 'available' column "
            f"(forecasting.traces.COLUMNS); got {len(history)} rows and columns {list(history.columns)}"
        )


def _origin_rng(seed: int, history: pd.DataFrame) -> np.random.Generator:
    """A generator that depends only on the seed and the origin, so repeated calls agree."""
    origin = int(history["interval"].iloc[-1]) if "interval" in history.columns else len(history) - 1
    return np.random.default_rng([int(seed), max(origin, 0)])


def _preemption_rate(history: pd.DataFrame) -> float:
    if "n_out" not in history.columns or len(history) == 0:
        return 0.0
    return float(np.mean(history["n_out"].to_numpy() >= 1))


def _clip(a: np.ndarray, capacity: int) -> np.ndarray:
    return np.clip(np.asarray(a, dtype=np.float64), 0.0, float(capacity))


def _drops(point: np.ndarray, last: float) -> np.ndarray:
    """True at step h when the (rounded) point path loses instances relative to step h-1."""
    path = np.rint(np.concatenate(([last], point)))
    return path[1:] < path[:-1]


# ------------------------------------------------------------------------------------ persistence


@dataclass(eq=False)  # a fitted model is equal only to itself (numpy state, counters)
class PersistenceForecaster:
    """N̂_{t+h} = N_t, with empirical spread: the baseline the reference ARIMA loses to (§B.4).

    ``fit`` pools, over every origin t of every training table and every h = 1..``max_horizon``, the
    change ``(N_{t+h} - N_t) / capacity`` and whether interval t+h lost an instance. Normalising by
    capacity lets a fit on 16- or 80-instance traces transfer to a 32-instance one. At prediction the
    quantiles are ``N_t + capacity * q_h`` and the preemption probability is the pooled rate at h; a
    horizon beyond ``max_horizon`` reuses the last learnt step.

    Unfitted (or fitted on tables too short to give a change) it still answers: quantiles of zero
    width, and as preemption probability the share of intervals of the given history that lost an
    instance (0 when there are none) — a prior of 0 would claim preemptions never happen.
    """

    name: str = "persistence"
    max_horizon: int = 24
    levels: tuple[float, ...] = QUANTILES
    delta_quantiles: np.ndarray | None = field(default=None, init=False, repr=False)  # (H, levels)
    preemption_rates: np.ndarray | None = field(default=None, init=False, repr=False)  # (H,)
    n_origins: int = field(default=0, init=False)  # origins behind the h = 1 statistics

    def __post_init__(self) -> None:
        if self.max_horizon < 1:
            raise ValueError(f"max_horizon must be >= 1, got {self.max_horizon}")
        if not {_LO, 0.5, _HI} <= set(self.levels):
            raise ValueError(f"levels must include {_LO}, 0.5 and {_HI}, got {self.levels}")
        self.levels = tuple(sorted(self.levels))

    @property
    def fitted(self) -> bool:
        return self.delta_quantiles is not None

    def history_window(self, horizon: int) -> int | None:
        """Fitted, it reads only the last row; unfitted, its fallback spread uses the whole history."""
        return 1 if self.fitted else None

    def fit(self, histories: Sequence[pd.DataFrame]) -> PersistenceForecaster:
        if isinstance(histories, pd.DataFrame):  # one table, not an iterable of its column names
            histories = [histories]
        deltas: list[list[np.ndarray]] = [[] for _ in range(self.max_horizon)]
        outs: list[list[np.ndarray]] = [[] for _ in range(self.max_horizon)]
        for table in histories:
            n = table["available"].to_numpy(dtype=np.float64)
            lost = table["n_out"].to_numpy() >= 1 if "n_out" in table.columns else np.zeros(len(n), bool)
            cap = table_capacity(table)
            for h in range(1, min(self.max_horizon, len(n) - 1) + 1):
                deltas[h - 1].append((n[h:] - n[:-h]) / cap)
                outs[h - 1].append(lost[h:])
        learnt = [h for h in range(self.max_horizon) if deltas[h]]
        if not learnt:
            self.delta_quantiles = self.preemption_rates = None
            self.n_origins = 0
            return self
        dq = np.empty((len(learnt), len(self.levels)))
        rates = np.empty(len(learnt))
        for row, h in enumerate(learnt):  # learnt is 0..k-1: a trace long enough for h has all h' < h
            dq[row] = np.quantile(np.concatenate(deltas[h]), self.levels)
            rates[row] = float(np.mean(np.concatenate(outs[h])))
        self.delta_quantiles = np.maximum.accumulate(dq, axis=1)  # guard float noise in the ordering
        self.preemption_rates = rates
        self.n_origins = int(sum(len(d) for d in deltas[0]))
        return self

    def spread(self, history: pd.DataFrame, horizon: int) -> tuple[dict[float, np.ndarray], np.ndarray]:
        """Quantile offsets from N_t (instances) and preemption probabilities for ``horizon`` steps.

        The piece `ArimaForecaster` and `EtsForecaster` reuse when they fall back to persistence.
        """
        cap = table_capacity(history)
        deltas, rates = self.delta_quantiles, self.preemption_rates  # both set by a fit, or neither
        if deltas is None or rates is None:
            zero = np.zeros(horizon)
            return {q: zero.copy() for q in self.levels}, np.full(horizon, _preemption_rate(history))
        steps = np.minimum(np.arange(horizon), len(rates) - 1)
        offsets = {q: cap * deltas[steps, j] for j, q in enumerate(self.levels)}
        return offsets, rates[steps].copy()

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        _check_history(history, horizon, self.name)
        cap = table_capacity(history)
        last = int(history["available"].iloc[-1])
        offsets, prob = self.spread(history, horizon)
        return Forecast(
            model=self.name,
            last_available=last,
            capacity=cap,
            point=_clip(np.full(horizon, float(last)), cap),
            quantiles={q: _clip(last + off, cap) for q, off in offsets.items()},
            preemption_prob=prob,
        )


# ------------------------------------------------------------------ reference post-processing (§B.2)


def reference_window(horizon: int) -> int:
    """Past window W of the reference for look-ahead K (§A.4); W = 8 below K = 5, never below 7."""
    if horizon < 5:
        return 8
    return _REFERENCE_WINDOWS.get(horizon, max(horizon, 7))


def remove_outliers(a: np.ndarray, size: int = 3) -> np.ndarray:
    """Flatten spikes and dips of at most ``size`` intervals (reference ``remove_outlier_all``).

    For s = size..1 and every i (in order, on the running result): when ``a[i] == a[i+1+s]`` and the
    s values between all differ from ``a[i]``, they are overwritten with ``a[i]``. The last value is
    never changed, so the origin's N survives.
    """
    out = np.array(a, dtype=np.float64, copy=True)
    for s in range(size, 0, -1):
        for i in range(len(out) - 1 - s):
            if out[i] == out[i + 1 + s] and np.all(out[i + 1 : i + 1 + s] != out[i]):
                out[i + 1 : i + 1 + s] = out[i]
    return out


def flatten_turnpoint(a: np.ndarray) -> np.ndarray:
    """Keep only the leg after an interior extreme (reference ``handle_turnpoint``).

    If the minimum lies strictly below both ends, every entry before its last occurrence becomes the
    minimum; otherwise the same for an interior maximum. A dip-then-recovery thus reads as a rise from
    the dip, which is what ARIMA should extrapolate.
    """
    out = np.array(a, dtype=np.float64, copy=True)
    lo, hi = out.min(), out.max()
    if lo < min(out[0], out[-1]):
        last = len(out) - 1 - int(np.argmax(out[::-1] == lo))
        out[:last] = lo
    elif hi > max(out[0], out[-1]):
        last = len(out) - 1 - int(np.argmax(out[::-1] == hi))
        out[:last] = hi
    return out


def trend_penalties(a: np.ndarray) -> tuple[float, float]:
    """(in_penalty, out_penalty) damping a monotone run: 0.75 for a rise/fall of 5-9, 0.5 for >= 10.

    Computed afresh for every window. The reference stores them on the trace object and never resets
    them (§B.2 step 3, §I.7), so one steep window damps every later forecast; we do not reproduce that.
    """

    def damping(delta: float) -> float:
        return 0.5 if delta >= 10 else 0.75 if delta >= 5 else 1.0

    diffs = np.diff(a)
    in_pen = damping(a[-1] - a.min()) if np.all(diffs >= 0) else 1.0
    out_pen = damping(a.max() - a[-1]) if np.all(diffs <= 0) else 1.0
    return in_pen, out_pen


def rebuild_with_penalties(
    last: float, n_in: np.ndarray, n_out: np.ndarray, in_penalty: float, out_penalty: float
) -> np.ndarray:
    """``N'_k = rint(N'_{k-1} + in_k * in_penalty - out_k * out_penalty)`` from ``N'_{-1} = last`` (§B.2 step 8)."""
    path = np.empty(len(n_in))
    prev = float(last)
    for k, (i, o) in enumerate(zip(n_in, n_out)):
        prev = float(np.rint(prev + i * in_penalty - o * out_penalty))
        path[k] = prev
    return path


def _in_out(last: float, path: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    delta = np.diff(np.concatenate(([last], path)))
    return np.maximum(delta, 0.0), np.maximum(-delta, 0.0)


# ------------------------------------------------------------------------------- refitted models


class _RefitPerCall:
    """``predict``, ``fit``, ``window_for`` and ``history_window`` of the models refitted per call on the last W
    values of N; a subclass says how it fits in ``_refit``.

    Only the fallback's persistence spread is learnt in ``fit``; W is ``window`` if set, else
    `reference_window` of the horizon. Subclasses are dataclasses with ``name``, ``window`` and ``persistence``.
    """

    name: str
    window: int | None
    persistence: PersistenceForecaster

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast:
        """Persistence's answer under this model's name until W intervals have passed (the reference's warm-up),
        then `_refit`'s."""
        _check_history(history, horizon, self.name)
        w = self.window_for(horizon)
        base = self.persistence.predict(history, horizon)
        if len(history) - 1 < w:
            return _renamed(base, self.name)
        return self._refit(history, horizon, w, base)

    def _refit(self, history: pd.DataFrame, horizon: int, w: int, base: Forecast) -> Forecast:
        """The forecast of the model fitted on the last ``w`` values; ``base`` is persistence's, its fallback."""
        raise NotImplementedError

    def fit(self, histories: Sequence[pd.DataFrame]) -> Self:
        """The model is refitted per call on the recent window; only the persistence spread is learnt."""
        self.persistence.fit(histories)
        return self

    def window_for(self, horizon: int) -> int:
        return self.window if self.window is not None else reference_window(horizon)

    def history_window(self, horizon: int) -> int | None:
        """The last W + 1 rows once fitted; unfitted, the persistence fallback's spread uses the whole history."""
        return self.window_for(horizon) + 1 if self.persistence.fitted else None


def _guarded_fit(
    fit: Callable[[], tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray] | None:
    """``fit()`` with statsmodels warnings silenced, or None when it raises or returns non-finite values."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean, other = fit()
    except Exception:  # any statsmodels/numpy failure: persistence answers for this call
        return None
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(other))):
        return None
    return mean, other


def _refit_forecast(
    name: str,
    last: float,
    cap: int,
    point: np.ndarray,
    band: tuple[np.ndarray, np.ndarray, np.ndarray],
    base: Forecast,
) -> Forecast:
    """The answer of a refitted model: ``band`` is (q0.1, q0.5, q0.9); preemption is 1 where ``point``
    drops, else persistence's (``base``) empirical rate."""
    prob = np.where(_drops(point, last), 1.0, base.preemption_prob)
    return Forecast(
        model=name,
        last_available=int(last),
        capacity=cap,
        point=point,
        quantiles=_ordered(*band, cap),
        preemption_prob=prob,
    )


# ----------------------------------------------------------------------------------------- ARIMA


@dataclass(eq=False)  # a fitted model is equal only to itself (numpy state, counters)
class ArimaForecaster(_RefitPerCall):
    """The reference predictor (§B.2) on statsmodels' state-space ARIMA(1,1,0) with drift (``trend="t"``).

    Per call, on the last W values of N (W = `reference_window` of the horizon unless ``window`` is set):
    outlier removal, turn-point flattening, trend penalties, then a forecast — persistence when the
    processed window is constant, else the ARIMA mean — rounded, clipped to ±``grow_bound`` around the
    first step and to [``lower_frac``, ``upper_frac``] x capacity (the reference's [8, 32] at 32
    instances); a flat forecast from a non-flat window gets Poisson(min(std, var, mean n_out))
    removals per interval (seeded from ``seed`` and the origin; they are out events, so N keeps falling);
    the path is turned into in/out counts and rebuilt with the penalties. The range bounds are
    ``floor(lower_frac * capacity)`` and ``min(ceil(upper_frac * capacity), capacity)``.

    With fewer than W intervals before the origin the forecast is flat (the reference's warm-up).
    Quantiles: the ARIMA 80% prediction interval (``conf_int(alpha=0.2)``) shifted by the same offset
    post-processing applied to the mean; whenever persistence answers instead (warm-up, constant window,
    failed fit) they are the empirical ones of ``persistence``, fitted in ``fit``. ``preemption_prob[h]``
    is 1 where the point path drops at step h, else persistence's empirical rate. A fit that raises or
    returns non-finite values falls back to plain persistence for that call and adds one to
    ``fallbacks``; statsmodels warnings are silenced.
    """

    name: str = "arima"
    seed: int = 0
    window: int | None = None
    grow_bound: int = 3
    lower_frac: float = 8 / 32
    upper_frac: float = 32 / 32
    jitter: bool = True
    persistence: PersistenceForecaster = field(default_factory=PersistenceForecaster)
    fallbacks: int = field(default=0, init=False)
    fits: int = field(default=0, init=False)

    def _refit(self, history: pd.DataFrame, horizon: int, w: int, base: Forecast) -> Forecast:
        cap = table_capacity(history)
        raw = history["available"].to_numpy(dtype=np.float64)[-w:]
        removed = history["n_out"].to_numpy(dtype=np.float64)[-w:] if "n_out" in history.columns else np.zeros(w)
        last = raw[-1]
        a = flatten_turnpoint(remove_outliers(raw))
        in_pen, out_pen = trend_penalties(a)

        if np.std(a) == 0:
            mean = np.full(horizon, last)
            band = None
        else:
            fitted = self._arima(a, horizon)
            if fitted is None:
                self.fallbacks += 1
                return _renamed(base, self.name)
            mean, band = fitted

        f = np.rint(mean)
        f[1:] = np.clip(f[1:], f[0] - self.grow_bound, f[0] + self.grow_bound)
        lower = np.floor(self.lower_frac * cap)
        upper = min(np.ceil(self.upper_frac * cap), cap)
        f = np.clip(f, lower, upper)
        n_in, n_out = _in_out(last, f)
        if self.jitter and np.all(f == f[0]) and np.std(a) > 0:
            lam = min(np.std(a), np.var(a), float(np.mean(removed)))
            if lam > 0:
                n_out = n_out + _origin_rng(self.seed, history).poisson(lam, size=horizon)
        point = _clip(rebuild_with_penalties(last, n_in, n_out, in_pen, out_pen), cap)

        if band is None:
            offsets, _ = self.persistence.spread(history, horizon)
            lo, mid, hi = point + offsets[_LO], point + offsets[0.5], point + offsets[_HI]
        else:
            shift = point - mean
            lo, mid, hi = band[0] + shift, point, band[1] + shift
        return _refit_forecast(self.name, last, cap, point, (lo, mid, hi), base)

    def _arima(self, a: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray] | None:
        """ARIMA mean and (q0.1, q0.9) band, or None when the fit fails."""
        from statsmodels.tsa.arima.model import ARIMA  # deferred: statsmodels takes ~1 s to import

        def fit() -> tuple[np.ndarray, np.ndarray]:
            fc = ARIMA(a, order=(1, 1, 0), trend="t").fit().get_forecast(horizon)
            mean = np.asarray(fc.predicted_mean, dtype=np.float64)
            return mean, np.asarray(fc.conf_int(alpha=1 - (_HI - _LO)), dtype=np.float64).T

        self.fits += 1
        return _guarded_fit(fit)


# ------------------------------------------------------------------------------------------- ETS


@dataclass(eq=False)  # a fitted model is equal only to itself (numpy state, counters)
class EtsForecaster(_RefitPerCall):
    """Holt's additive damped trend (statsmodels ``ExponentialSmoothing``) on the last W values of N.

    W as for `ArimaForecaster` (``window`` overrides). The point is the model's mean clipped to
    [0, capacity] — not rounded, and without the reference's growth/range heuristics, so it shows what
    the smoother alone does. Quantiles come from ``n_paths`` simulated future paths with additive
    errors drawn from a generator seeded by ``seed`` and the origin. ``preemption_prob[h]`` is 1 where
    the rounded point path drops at step h, else persistence's empirical rate. Warm-up, a constant
    window or a failed fit answer with `persistence` (a failure also counts in ``fallbacks``).
    """

    name: str = "ets"
    seed: int = 0
    window: int | None = None
    n_paths: int = 200
    persistence: PersistenceForecaster = field(default_factory=PersistenceForecaster)
    fallbacks: int = field(default=0, init=False)
    fits: int = field(default=0, init=False)

    def _refit(self, history: pd.DataFrame, horizon: int, w: int, base: Forecast) -> Forecast:
        a = history["available"].to_numpy(dtype=np.float64)[-w:]
        if np.std(a) == 0:
            return _renamed(base, self.name)
        fitted = self._ets(a, horizon, _origin_rng(self.seed, history))
        if fitted is None:
            self.fallbacks += 1
            return _renamed(base, self.name)
        mean, paths = fitted
        cap = table_capacity(history)
        last = a[-1]
        point = _clip(mean, cap)
        lo, mid, hi = np.quantile(paths, [_LO, 0.5, _HI], axis=1)
        return _refit_forecast(self.name, last, cap, point, (lo, mid, hi), base)

    def _ets(self, a: np.ndarray, horizon: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray] | None:
        """Mean forecast and simulated paths (horizon x n_paths), or None when the fit fails."""
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        def fit() -> tuple[np.ndarray, np.ndarray]:
            # use_brute=False: the grid search for starting values costs 3-5x and buys nothing on 8-17 points
            res = ExponentialSmoothing(a, trend="add", damped_trend=True, initialization_method="estimated").fit(
                use_brute=False
            )
            mean = np.asarray(res.forecast(horizon), dtype=np.float64)
            paths = np.asarray(
                res.simulate(
                    horizon, repetitions=self.n_paths, error="add", anchor="end", **{_simulate_rng_keyword(res): rng}
                ),
                dtype=np.float64,
            ).reshape(horizon, self.n_paths)
            return mean, paths

        self.fits += 1
        return _guarded_fit(fit)


def _simulate_rng_keyword(results: Any) -> str:
    """statsmodels 0.15 renamed ``simulate(random_state=)`` to ``rng=`` (0.14 only knows the former)."""
    return "rng" if "rng" in inspect.signature(results.simulate).parameters else "random_state"


# --------------------------------------------------------------------------------------- helpers


def _ordered(lo: np.ndarray, mid: np.ndarray, hi: np.ndarray, capacity: int) -> dict[float, np.ndarray]:
    """Clip to [0, capacity] and make q0.1 <= q0.5 <= q0.9 at every step."""
    mid = _clip(mid, capacity)
    return {_LO: np.minimum(_clip(lo, capacity), mid), 0.5: mid, _HI: np.maximum(_clip(hi, capacity), mid)}


def _renamed(forecast: Forecast, name: str) -> Forecast:
    """Persistence's answer under another model's name (the backtest groups by ``model``)."""
    return replace(forecast, model=name)
