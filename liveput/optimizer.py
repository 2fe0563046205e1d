"""The liveput optimizer: a K-interval dynamic program over (d, p, migrating) states.

Every interval the planner asks: given the running strategy and the forecast of the next K intervals,
which sequence of strategies maximises the expected number of samples trained (the liveput summed over
the look-ahead), migration costs included? It then applies only the first decision (receding horizon) and
re-plans next interval with fresh information (parcae-reference §C.1).

Per interval j and target (d, p), reached from a predecessor with expected migration cost c (ms) and
reachability probability q, the useful time is r = T*q - total/1000 where total = c, or, when the
predecessor was still migrating, c + concurrent restart (or the carried leftover if nothing new starts).
If r >= 0 the step trains thr(d, p) * r samples; otherwise it trains nothing and -r carries over
(state "migrating"). Ties go to fewer stages, then fewer instances, so the same inputs give the same plan.

The DP is vectorised over predecessor x target with numpy; scenario outcomes come from
`liveput.scenarios.ScenarioStore`, which caches them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from liveput.migration import MigrationKind
from liveput.scenarios import KINDS, IntervalForecast, ScenarioStore, Strategy

IDLE: Strategy = (0, 0)


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the planner. ``interval_s`` is T; ``look_ahead`` is K."""

    interval_s: float = 60.0
    look_ahead: int = 8

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if self.look_ahead < 1:
            raise ValueError(f"look_ahead must be >= 1, got {self.look_ahead}")


@dataclass(frozen=True)
class JobState:
    """Where the running job is: its strategy, and whether a migration is still in flight."""

    strategy: Strategy = IDLE
    migrating: bool = False
    leftover_ms: float = 0.0


@dataclass(frozen=True)
class PlanStep:
    """One interval of a plan: the strategy, its expected samples and what reaching it costs."""

    strategy: Strategy
    migrating: bool
    expected_samples: float
    expected_cost_ms: float
    reach: float
    kinds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "strategy": list(self.strategy),
            "migrating": self.migrating,
            "expected_samples": self.expected_samples,
            "expected_cost_ms": self.expected_cost_ms,
            "reach": self.reach,
            "kinds": self.kinds,
        }


@dataclass(frozen=True)
class Plan:
    """The K-step plan; ``steps[0].strategy`` is the decision for the coming interval."""

    steps: tuple[PlanStep, ...]
    expected_samples: float
    alternatives: tuple[tuple[Strategy, float], ...]
    decision_s: float

    @property
    def decision(self) -> Strategy:
        return self.steps[0].strategy

    def to_dict(self) -> dict:
        return {
            "decision": list(self.decision),
            "expected_samples": self.expected_samples,
            "decision_ms": 1000.0 * self.decision_s,
            "steps": [s.to_dict() for s in self.steps],
            "alternatives": [{"strategy": list(s), "expected_samples": v} for s, v in self.alternatives],
        }


def plan(
    store: ScenarioStore,
    forecast: Sequence[IntervalForecast],
    current: JobState = JobState(),
    config: PlannerConfig = PlannerConfig(),
) -> Plan:
    """Solve the K-step DP from ``current`` over ``forecast`` (K = len(forecast))."""
    if not forecast:
        raise ValueError("the forecast must cover at least one interval")
    t0 = time.perf_counter()
    T = config.interval_s
    max_alive = max(max(f.prev_available + i - o for i, o, _ in f.events) for f in forecast)
    targets = list(store.targets(max_alive))
    thr = np.array([store.profile.throughput(d, p) for d, p in targets] + [0.0])
    states = targets + [IDLE]  # IDLE last: chosen only when nothing else is reachable or worth it
    n = len(states)
    rc = np.array([store.cost.concurrent_restart_ms(d, p) for d, p in targets] + [0.0])

    # Values per state: normal (v0) and migrating (v1 samples, l1 leftover ms); -inf = unreachable.
    v0 = np.full(n, -np.inf)
    v1 = np.full(n, -np.inf)
    l1 = np.zeros(n)
    if current.strategy not in states:
        states.append(current.strategy)
        thr = np.append(thr, 0.0)  # a strategy outside the profile trains nothing until it migrates
        rc = np.append(rc, 0.0)
        v0 = np.append(v0, -np.inf)
        v1 = np.append(v1, -np.inf)
        l1 = np.append(l1, 0.0)
        n += 1
    ci = states.index(current.strategy)
    if current.migrating:
        v1[ci], l1[ci] = 0.0, current.leftover_ms
    else:
        v0[ci] = 0.0

    back: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    step_info: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    n_t = len(targets)
    for f in forecast:
        live = np.flatnonzero(np.isfinite(v0) | np.isfinite(v1))
        reach = np.zeros((n, n))
        cost = np.zeros((n, n))
        kinds = np.zeros((n, n, len(KINDS)))
        for i in live:
            o = store.mixed(f, states[i], targets)
            reach[i, :n_t], cost[i, :n_t], kinds[i, :n_t] = o.reach, o.cost_ms, o.kind
        reach[:, n_t] = 1.0  # stopping (IDLE) is always possible and costs nothing
        ok = reach > 0
        r0 = T * reach - cost / 1000.0
        tot1 = np.where(cost > 0, cost + rc[None, :], l1[:, None])
        r1 = T * reach - tot1 / 1000.0
        gain0 = np.where(r0 >= 0, thr[None, :] * r0, 0.0)
        gain1 = np.where(r1 >= 0, thr[None, :] * r1, 0.0)
        # candidates: rows 0..n-1 from normal predecessors, n..2n-1 from migrating ones
        prev_v = np.concatenate([v0, v1])
        r_all = np.concatenate([r0, r1])
        ok_all = np.concatenate([ok, ok]) & np.isfinite(prev_v)[:, None]
        to_normal = np.where(ok_all & (r_all >= 0), prev_v[:, None] + np.concatenate([gain0, gain1]), -np.inf)
        to_migr = np.where(ok_all & (r_all < 0), prev_v[:, None], -np.inf)
        left_migr = np.where(ok_all & (r_all < 0), -1000.0 * r_all, np.inf)
        b0 = np.argmax(to_normal, axis=0)
        nv0 = to_normal[b0, np.arange(n)]
        # migrating: max samples, then the smaller leftover
        order = np.lexsort((left_migr, -to_migr), axis=0) if n else None
        b1 = order[0] if order is not None else np.zeros(n, dtype=int)
        nv1 = to_migr[b1, np.arange(n)]
        nl1 = np.where(np.isfinite(nv1), left_migr[b1, np.arange(n)], 0.0)
        back.append((b0, b1, nv0, nv1))
        step_info.append((reach, cost, kinds))
        v0, v1, l1 = nv0, nv1, nl1

    # final choice: most samples, then smaller leftover, then state order (fewer stages, instances)
    finals = [(v0[i], 0.0, i, 0) for i in range(n) if np.isfinite(v0[i])]
    finals += [(v1[i], l1[i], i, 1) for i in range(n) if np.isfinite(v1[i])]
    if not finals:
        raise RuntimeError("no feasible plan: the forecast leaves no reachable strategy")
    best = min(finals, key=lambda x: (-x[0], x[1], x[2], x[3]))
    total = float(best[0])

    # backtrack
    path: list[tuple[int, int, float]] = []  # (state index, migrating flag, cumulative value)
    idx, s = best[2], best[3]
    for j in range(len(forecast) - 1, -1, -1):
        b0, b1, nv0, nv1 = back[j]
        val = nv0[idx] if s == 0 else nv1[idx]
        path.append((idx, s, float(val)))
        row = b0[idx] if s == 0 else b1[idx]
        idx, s = int(row % n), int(row // n)
    path.reverse()
    prev_idx = ci
    steps = []
    cum_prev = 0.0
    for j, (i, s, cum) in enumerate(path):
        reach, cost, kinds = step_info[j]
        steps.append(
            PlanStep(
                strategy=states[i],
                migrating=bool(s),
                expected_samples=cum - cum_prev,
                expected_cost_ms=float(cost[prev_idx, i]),
                reach=float(reach[prev_idx, i]),
                kinds={k.value: float(kinds[prev_idx, i, m]) for m, k in enumerate(KINDS) if kinds[prev_idx, i, m] > 0},
            )
        )
        cum_prev, prev_idx = cum, i
    alternatives = _alternatives(back[0], states)
    return Plan(tuple(steps), total, alternatives, time.perf_counter() - t0)


def _alternatives(first, states: list[Strategy], top: int = 5) -> tuple[tuple[Strategy, float], ...]:
    """The best first-interval values per strategy, to explain what the decision beat."""
    _, _, nv0, _ = first
    order = [i for i in np.argsort(-nv0, kind="stable") if np.isfinite(nv0[i])][:top]
    return tuple((states[i], float(nv0[i])) for i in order)
