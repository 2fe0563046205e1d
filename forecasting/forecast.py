"""The one interface every availability forecaster shares, and the forecast it returns.

A forecaster learns from canonical per-interval trace tables (`forecasting.traces`) and, given the history
up to an origin, predicts the next ``horizon`` intervals. The result is a `Forecast`:

- per future interval, a point estimate of the available instances N and quantiles of N (at least the
  10/50/90% levels);
- the law over (n_in, n_out) per interval that the liveput planner's scenario model accepts
  (plain tuples; `liveput.scenarios.IntervalForecast.from_forecast` wraps them), derived from those
  quantiles;
- the probability of at least one preemption per interval, which the backtest scores with a Brier score.

Evaluation code (`forecasting.backtest`) does not know which model it scores. Forecasting never imports
the planner: the planner imports forecasts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class Forecast:
    """Forecast of the ``horizon`` intervals that follow the last interval of the history.

    ``point[h]`` and ``quantiles[q][h]`` are the available instances during future interval h (0-based),
    clipped to [0, capacity]; quantile arrays are non-decreasing in q at every h. ``preemption_prob[h]``
    is P(at least one instance is preempted during future interval h). ``preemption_size``, when known,
    is the expected number of instances lost in an interval that has a preemption; the planner's
    per-interval law then comes from the hazard (`events_from_hazard`), otherwise from the quantiles.
    """

    model: str
    last_available: int
    capacity: int
    point: np.ndarray
    quantiles: Mapping[float, np.ndarray]
    preemption_prob: np.ndarray
    events: tuple[tuple[tuple[int, int, float], ...], ...] = field(default=())
    preemption_size: float | None = None

    def __post_init__(self) -> None:
        h = len(self.point)
        for q, arr in self.quantiles.items():
            if len(arr) != h:
                raise ValueError(f"{self.model}: quantile {q} has {len(arr)} values, expected {h}")
        levels = sorted(self.quantiles)
        for lo, hi in zip(levels, levels[1:]):
            if np.any(self.quantiles[lo] > self.quantiles[hi] + 1e-9):
                raise ValueError(f"{self.model}: quantiles {lo} and {hi} cross")
        if not self.events:
            if self.preemption_size is not None:
                events = events_from_hazard(
                    self.last_available, self.point, self.preemption_prob, self.preemption_size, self.capacity
                )
            else:
                events = events_from_quantiles(self.last_available, self.point, self.quantiles, self.capacity)
            object.__setattr__(self, "events", events)

    @property
    def horizon(self) -> int:
        return len(self.point)

    def intervals(self) -> list[tuple[int, tuple[tuple[int, int, float], ...]]]:
        """The planner's input as plain data: (N before interval h's events, law of those events).

        N before interval h is the rounded point forecast of interval h-1 (the last observation for
        h = 0); the law of interval h's change is taken around that path.
        """
        out = []
        prev = self.last_available
        for h in range(self.horizon):
            law = tuple((i, min(o, prev), w) for i, o, w in self.events[h])
            out.append((prev, _normalise(law)))
            prev = int(np.clip(round(float(self.point[h])), 0, self.capacity))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "last_available": self.last_available,
            "capacity": self.capacity,
            "point": [float(x) for x in self.point],
            "quantiles": {str(q): [float(x) for x in a] for q, a in sorted(self.quantiles.items())},
            "preemption_prob": [float(x) for x in self.preemption_prob],
            "events": [[list(e) for e in law] for law in self.events],
        }


@runtime_checkable
class Forecaster(Protocol):
    """``fit`` on many traces, ``predict`` from one history; both pure with respect to their inputs.

    ``history_window(horizon)``: the rows of past the model needs for an exact forecast, so a backtest can hand it
    only those (`forecasting.backtest.rolling_origin`'s ``max_history``); None means the whole past. Each model
    knows its own, so evaluation code never asks which model it scores.
    """

    name: str

    def fit(self, histories: Sequence[pd.DataFrame]) -> Forecaster: ...

    def predict(self, history: pd.DataFrame, horizon: int) -> Forecast: ...

    def history_window(self, horizon: int) -> int | None: ...


def events_from_quantiles(
    last: int,
    point: np.ndarray,
    quantiles: Mapping[float, np.ndarray],
    capacity: int,
    max_outcomes: int = 5,
) -> tuple[tuple[tuple[int, int, float], ...], ...]:
    """Per interval, a small law over (n_in, n_out) consistent with the forecast quantiles.

    The quantiles of N_h define a piecewise-linear CDF (flat beyond the outer levels, whose remaining
    mass is put on them). It is discretised to integers, expressed as a change from the previous
    interval's rounded point path, and reduced to at most ``max_outcomes`` outcomes by merging the least
    likely into their nearest neighbour — enough for the planner to weigh robustness, small enough to
    keep it fast. A net gain becomes n_in, a net loss n_out (gross flows are not forecast).
    """
    levels = np.array(sorted(quantiles))
    laws = []
    prev = int(last)
    for h in range(len(point)):
        values = np.array([float(quantiles[q][h]) for q in levels])
        lo = int(np.floor(values[0]))
        hi = int(np.ceil(values[-1]))
        grid = np.arange(max(lo, 0), min(hi, capacity) + 1)
        if len(grid) == 0:
            grid = np.array([int(np.clip(round(float(point[h])), 0, capacity))])
        # CDF at half-integers: P(N <= k + 0.5), linear between quantile points
        edges = np.concatenate([grid - 0.5, [grid[-1] + 0.5]])
        cdf = (
            np.interp(edges, values, levels, left=0.0, right=1.0)
            if len(set(values)) > 1
            else ((edges >= values[0]).astype(float))
        )
        mass = np.diff(cdf)
        mass[0] += cdf[0]
        mass[-1] += 1.0 - cdf[-1]
        outcomes = {int(k): float(m) for k, m in zip(grid, mass) if m > 0}
        outcomes = _merge(outcomes, max_outcomes)
        law = []
        for n_next, w in sorted(outcomes.items()):
            delta = n_next - prev
            law.append((max(delta, 0), max(-delta, 0), w))
        laws.append(_normalise(tuple(law)))
        prev = int(np.clip(round(float(point[h])), 0, capacity))
    return tuple(laws)


def events_from_hazard(
    last: int, point: np.ndarray, preemption_prob: np.ndarray, preemption_size: float, capacity: int
) -> tuple[tuple[tuple[int, int, float], ...], ...]:
    """Per interval, the point path's own change, and with probability ``preemption_prob[h]`` a loss.

    Quantiles describe where N may be *after h intervals*; using their spread as the law of every single
    interval would tell the planner that each minute brings a change with high probability. The
    interval's own risk is the hazard of a preemption, so the law is two outcomes: follow the point path,
    or also lose ``preemption_size`` instances (rounded, at least 1) that interval.
    """
    size = max(1, int(round(preemption_size)))
    laws = []
    prev = int(last)
    for h in range(len(point)):
        nxt = int(np.clip(round(float(point[h])), 0, capacity))
        p = float(np.clip(preemption_prob[h], 0.0, 1.0))
        law = []
        for target, w in ((nxt, 1.0 - p), (max(nxt - size, 0), p)):
            if w <= 0:
                continue
            delta = target - prev
            law.append((max(delta, 0), max(-delta, 0), w))
        laws.append(_normalise(tuple(law)))
        prev = nxt
    return tuple(laws)


def recent_preemption_size(n_out: np.ndarray, window: int = 60) -> float:
    """Mean instances lost per preemption over the last ``window`` intervals (whole history if none; 1 if never)."""
    n_out = np.asarray(n_out)
    for part in (n_out[-window:], n_out):
        hits = part[part > 0]
        if len(hits):
            return float(hits.mean())
    return 1.0


def _merge(outcomes: dict[int, float], k: int) -> dict[int, float]:
    out = dict(outcomes)
    while len(out) > k:
        least = min(out, key=lambda n: (out[n], n))
        w = out.pop(least)
        nearest = min(out, key=lambda n: (abs(n - least), n))
        out[nearest] += w
    return out


def _normalise(law: tuple[tuple[int, int, float], ...]) -> tuple[tuple[int, int, float], ...]:
    merged: dict[tuple[int, int], float] = {}
    for i, o, w in law:
        merged[(i, o)] = merged.get((i, o), 0.0) + w
    total = sum(merged.values())
    return tuple((i, o, w / total) for (i, o), w in sorted(merged.items()))
