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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from liveput.horizon import DEFAULT_INTERVAL_S, DEFAULT_LOOK_AHEAD, MAX_LOOK_AHEAD
from liveput.migration import CostModel
from liveput.scenarios import KINDS, IntervalForecast, ScenarioStore
from liveput.throughput import Strategy, ThroughputProfile

IDLE: Strategy = (0, 0)


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the planner. ``interval_s`` is T; ``look_ahead`` is K."""

    interval_s: float = DEFAULT_INTERVAL_S
    look_ahead: int = DEFAULT_LOOK_AHEAD

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if self.look_ahead < 1:
            raise ValueError(f"look_ahead must be >= 1, got {self.look_ahead}")
        if self.look_ahead > MAX_LOOK_AHEAD:
            raise ValueError(f"look_ahead must be <= {MAX_LOOK_AHEAD} (MAX_LOOK_AHEAD), got {self.look_ahead}")


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

    def to_dict(self) -> dict[str, Any]:
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

    def to_dict(self) -> dict[str, Any]:
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
    *,
    exhaustive: bool = False,
) -> Plan:
    """Solve the K-step DP from ``current`` over ``forecast`` (K = len(forecast)).

    A "normal" state (d, p) keeps the single best value. A "migrating" state keeps every Pareto-optimal
    (samples, leftover) label: fewer samples with less migration left can win later, which the
    reference's rule (keep the most samples) misses. The search is exact but lazy: cheap bounds on
    every transition's cost (`ScenarioStore.bounds`) decide which transitions can still matter, and only
    those get the exact scenario sum. ``exhaustive=True`` evaluates every transition exactly.
    """
    if not forecast:
        raise ValueError("the forecast must cover at least one interval")
    t0 = time.perf_counter()
    T = config.interval_s
    max_alive = max(max(f.prev_available + i - o for i, o, _ in f.events) for f in forecast)
    targets = list(store.targets(max_alive))
    states = targets + [IDLE]  # IDLE last: chosen only when nothing else is reachable or worth it
    thr = [store.profile.throughput(d, p) for d, p in targets] + [0.0]
    rc = [store.cost.concurrent_restart_ms(d, p) for d, p in targets] + [0.0]
    if current.strategy not in states:
        states.append(current.strategy)  # a strategy outside the profile trains nothing until it migrates
        thr.append(0.0)
        rc.append(0.0)
    n = len(states)
    n_t = len(targets)
    thr_a = np.array(thr)
    rc_a = np.array(rc)
    ci = states.index(current.strategy)

    # Labels of the current step: state, migrating flag, samples, leftover ms, label it came from.
    rows = _Rows([ci], [int(current.migrating)], [0.0], [current.leftover_ms if current.migrating else 0.0], [-1])
    history: list[_Rows] = []
    for f in forecast:
        live = np.unique(rows.state)
        reach = np.zeros((n, n))
        lo = np.zeros((n, n))
        hi = np.zeros((n, n))
        fb = np.zeros((n, n))
        for i in live:
            fb[i, :n_t] = store.fallback(f, states[i], targets, T)
            if exhaustive:
                o = store.mixed(f, states[i], targets)
                reach[i, :n_t], lo[i, :n_t], hi[i, :n_t] = o.reach, o.cost_ms, o.cost_ms
            else:
                reach[i, :n_t], lo[i, :n_t], hi[i, :n_t] = store.bounds(f, states[i], targets)
        reach[:, n_t] = 1.0  # stopping (IDLE) is always possible and costs nothing
        cost = _lazy_cost(store, f, states, n_t, lo, hi)

        st, mig, val, left = rows.state, rows.migrating.astype(bool), rows.samples, rows.leftover
        q = reach[st]  # rows x targets
        lo_r, hi_r = lo[st], hi[st]
        rc_row = rc_a[None, :]
        tot_lo = np.where(mig[:, None], np.where(lo_r > 0, lo_r + rc_row, np.minimum(left[:, None], rc_row)), lo_r)
        tot_hi = np.where(mig[:, None], np.maximum(hi_r + rc_row, left[:, None]), hi_r)
        r_ub = T * q - tot_lo / 1000.0
        r_lb = T * q - tot_hi / 1000.0
        valid = q > 0
        fb_r = fb[st]
        ub = np.where(valid & (r_ub >= 0), val[:, None] + thr_a[None, :] * np.maximum(r_ub, 0.0) + fb_r, -np.inf)
        by_ub = np.argsort(-ub, axis=0, kind="stable")  # ties: lower row first, as a full argmax would
        may_migrate = valid & (r_lb < 0)

        useful = _useful_time(cost, rows, q, rc, T)

        nxt = _NextRows()
        for t in range(n):
            # normal state: the single best value
            best_val, best_row = -np.inf, -1
            for row in by_ub[:, t]:
                bound = ub[row, t]
                if bound == -np.inf or bound < best_val or (bound == best_val and row > best_row):
                    break
                r = useful(int(row), t)
                if r < 0:
                    continue
                v = val[row] + thr_a[t] * r + fb_r[row, t]
                if v > best_val or (v == best_val and row < best_row):
                    best_val, best_row = v, int(row)
            if best_row >= 0:
                nxt.add(t, 0, best_val, 0.0, best_row)
            # migrating state: Pareto labels (more samples, less leftover), above the normal value
            kept: list[tuple[float, float, int]] = []
            min_left = np.inf
            mval = val + fb_r[:, t]
            by_mval = np.argsort(-mval, kind="stable")
            for row in by_mval[may_migrate[by_mval, t]]:
                if mval[row] <= best_val:
                    break  # the normal state reaches t with at least as many samples and no leftover
                left_lb = max(0.0, -1000.0 * r_ub[row, t])
                if left_lb >= min_left:
                    continue
                r = useful(int(row), t)
                if r >= 0:
                    continue
                lf = -1000.0 * r
                if lf < min_left:
                    if kept and kept[-1][0] == mval[row]:
                        kept.pop()  # same samples, less leftover
                    kept.append((float(mval[row]), lf, int(row)))
                    min_left = lf
            for v, lf, row in kept:
                nxt.add(t, 1, v, lf, row)
        history.append(rows)
        rows = nxt.done()
    history.append(rows)

    # final choice: most samples, then smaller leftover, then state order (fewer stages, instances)
    if not len(rows.state):
        raise RuntimeError("no feasible plan: the forecast leaves no reachable strategy")
    order = sorted(
        range(len(rows.state)), key=lambda r: (-rows.samples[r], rows.leftover[r], rows.state[r], rows.migrating[r])
    )
    last = order[0]
    total = float(rows.samples[last])
    path = []
    row = last
    for j in range(len(forecast), 0, -1):
        lab = history[j]
        path.append((int(lab.state[row]), int(lab.migrating[row]), float(lab.samples[row])))
        row = int(lab.back[row])
    path.reverse()
    steps = []
    prev_idx, cum_prev = ci, 0.0
    for j, (i, s_, cum) in enumerate(path):
        if i < n_t:
            qq, c, kinds = store.pair(forecast[j], states[prev_idx], states[i])
        else:
            qq, c, kinds = 1.0, 0.0, np.zeros(len(KINDS))
        steps.append(
            PlanStep(
                strategy=states[i],
                migrating=bool(s_),
                expected_samples=cum - cum_prev,
                expected_cost_ms=float(c),
                reach=float(qq),
                kinds={k.value: float(kinds[m]) for m, k in enumerate(KINDS) if kinds[m] > 0},
            )
        )
        cum_prev, prev_idx = cum, i
    first = history[1]
    alternatives = tuple(
        sorted(
            (
                (states[int(first.state[r])], float(first.samples[r]))
                for r in range(len(first.state))
                if not first.migrating[r]
            ),
            key=lambda x: -x[1],
        )[:5]
    )
    return Plan(tuple(steps), total, alternatives, time.perf_counter() - t0)


def plan_interval(
    forecast: Sequence[IntervalForecast],
    current: JobState,
    profile: ThroughputProfile,
    cost: CostModel,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    store: ScenarioStore | None = None,
) -> Plan:
    """The planning step at one interval boundary: the plan over ``forecast`` (K = its length) from ``current``.

    Every planner calls this one function (the plan task, `parcae plan`, the trainer's live planner, the simulated
    Parcae policy). ``store`` caches the scenarios of ``profile`` and ``cost`` across decisions; it must be theirs.
    """
    if store is None:
        store = ScenarioStore(profile, cost)
    elif store.profile is not profile or store.cost is not cost:
        raise ValueError("the scenario store caches another profile or cost model than the one planned with")
    return plan(store, forecast, current, PlannerConfig(interval_s, len(forecast)))


def _lazy_cost(
    store: ScenarioStore, f: IntervalForecast, states: list[Strategy], n_t: int, lo: np.ndarray, hi: np.ndarray
) -> Callable[[int, int], float]:
    """One interval's cost (ms) of the move from state i to target t: the bound where the bounds agree, else the
    exact scenario sum, computed once per pair (the lazy part of the search)."""
    exact: dict[tuple[int, int], float] = {}

    def cost(i: int, t: int) -> float:
        if t >= n_t or lo[i, t] == hi[i, t]:
            return float(lo[i, t])
        if (i, t) not in exact:
            exact[(i, t)] = store.pair(f, states[i], states[t])[1]
        return exact[(i, t)]

    return cost


def _useful_time(
    cost: Callable[[int, int], float], rows: _Rows, q: np.ndarray, rc: list[float], T: float
) -> Callable[[int, int], float]:
    """The useful time r (s) of label ``row`` moving to target t, exactly: negative while the move is unfinished."""
    st, mig, left = rows.state, rows.migrating.astype(bool), rows.leftover

    def useful(row: int, t: int) -> float:
        c = cost(int(st[row]), t)
        total = (c + rc[t] if c > 0 else left[row]) if mig[row] else c
        return float(T * q[row, t] - total / 1000.0)

    return useful


class _Rows:
    """The labels of one DP step, as parallel arrays."""

    def __init__(
        self,
        state: Sequence[int],
        migrating: Sequence[int],
        samples: Sequence[float],
        leftover: Sequence[float],
        back: Sequence[int],
    ) -> None:
        self.state = np.asarray(state, dtype=int)
        self.migrating = np.asarray(migrating, dtype=int)
        self.samples = np.asarray(samples, dtype=float)
        self.leftover = np.asarray(leftover, dtype=float)
        self.back = np.asarray(back, dtype=int)


class _NextRows:
    """The labels of the next DP step, collected as they are found; `done` freezes them into `_Rows`."""

    def __init__(self) -> None:
        self.state: list[int] = []
        self.migrating: list[int] = []
        self.samples: list[float] = []
        self.leftover: list[float] = []
        self.back: list[int] = []

    def add(self, state: int, migrating: int, samples: float, leftover: float, back: int) -> None:
        self.state.append(state)
        self.migrating.append(migrating)
        self.samples.append(samples)
        self.leftover.append(leftover)
        self.back.append(back)

    def done(self) -> _Rows:
        return _Rows(self.state, self.migrating, self.samples, self.leftover, self.back)
