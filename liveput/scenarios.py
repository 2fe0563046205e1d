"""Preemption scenarios: the exact distribution of migration outcomes for a planned change of strategy.

For a running strategy (D, P) on N instances and an interval that brings n_in new instances and takes
n_out away — chosen uniformly at random among the N — this module gives, for every target (d, p), the
probability that it is reachable, the probability of each migration kind, and the expected cost.

The reference sampled 10,000 preemption draws in Python per key (§C.2). The cost depends only on how many
replicas of each stage survive, and those counts follow a multivariate hypergeometric law, so we compute
the expectation exactly: first the number k of preemptions that hit active (non-idle) instances is
hypergeometric, then, given k, every way of spreading k losses over the P stages of D replicas is equally
likely and we sum over them with small dynamic programs over stages. Results are cached per
(D, P, d, p) and k, which do not depend on N, so one table serves every cluster size.

Beyond the paper, a scenario is a *distribution* over (n_in, n_out) per interval (`IntervalForecast`),
not a point forecast: reachability then is a real probability, and liveput weighs throughput against
robustness.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from math import comb
from typing import Protocol

import numpy as np
from scipy.stats import hypergeom

from liveput.migration import (
    CostModel,
    MigrationKind,
    MigrationTime,
    Trigger,
    advance_assignment,
    healthy_missing,
    migration_kind,
    stage_overlap,
)
from liveput.throughput import InfeasibleStrategy, Strategy, ThroughputProfile

KINDS: tuple[MigrationKind, ...] = (
    MigrationKind.NONE,
    MigrationKind.INTRA_STAGE,
    MigrationKind.INTER_STAGE,
    MigrationKind.PIPELINE,
    MigrationKind.START,
)


class _Intervals(Protocol):
    """A forecast that lists its intervals: `forecasting.forecast.Forecast` (not imported: duck-typed)."""

    def intervals(self) -> Iterable[tuple[int, tuple[tuple[int, int, float], ...]]]: ...


@dataclass(frozen=True)
class IntervalForecast:
    """What one future interval may bring: instances before its events and a law over (n_in, n_out)."""

    prev_available: int
    events: tuple[tuple[int, int, float], ...] = ((0, 0, 1.0),)

    def __post_init__(self) -> None:
        if self.prev_available < 0:
            raise ValueError(f"prev_available must be >= 0, got {self.prev_available}")
        total = sum(w for _, _, w in self.events)
        if not self.events or abs(total - 1.0) > 1e-6 or any(w < 0 for _, _, w in self.events):
            raise ValueError(f"event probabilities must be >= 0 and sum to 1, got {self.events}")
        for n_in, n_out, _ in self.events:
            if n_in < 0 or n_out < 0 or n_out > self.prev_available:
                raise ValueError(f"impossible event (n_in={n_in}, n_out={n_out}) with N={self.prev_available}")

    @classmethod
    def point(cls, prev_available: int, n_in: int = 0, n_out: int = 0) -> IntervalForecast:
        return cls(prev_available, ((n_in, n_out, 1.0),))

    @classmethod
    def from_forecast(cls, forecast: _Intervals) -> list[IntervalForecast]:
        """Wrap a `forecasting.forecast.Forecast` (anything with ``intervals()``) for the planner."""
        return [cls(prev, law) for prev, law in forecast.intervals()]

    @property
    def expected_available(self) -> float:
        return self.prev_available + sum((i - o) * w for i, o, w in self.events)


def persistence_forecast(alive: int, k: int, first: IntervalForecast | None = None) -> list[IntervalForecast]:
    """Nothing will change: ``alive`` instances and no events for K intervals — after ``first`` when it is given
    (the coming interval, bringing the change a running job has just observed, so the planner prices it)."""
    if first is None:
        return [IntervalForecast.point(alive)] * k
    return [first] + [IntervalForecast.point(alive)] * (k - 1)


def with_noticed(forecast: Sequence[IntervalForecast], noticed: Sequence[int]) -> list[IntervalForecast]:
    """``forecast`` with the preemptions already noticed: ``noticed[j]`` instances leave in its j-th interval, as
    their cloud's notices said (AWS's come two minutes ahead). Those intervals' preemptions are then known, not
    forecast; their arrivals stay the forecast's law. Every later interval starts with the instances the forecast
    expected less those the notices took and it did not expect (so a perfect forecast is left as it is)."""
    out: list[IntervalForecast] = []
    shift = 0.0  # instances the forecast still counts that noticed preemptions took
    for j, f in enumerate(forecast):
        prev = max(0, round(f.prev_available - shift))
        law: dict[tuple[int, int], float] = {}
        for n_in, n_out, w in f.events:
            o = min(noticed[j], prev) if j < len(noticed) else min(n_out, prev)
            law[(n_in, o)] = law.get((n_in, o), 0.0) + w
        if j < len(noticed):
            shift += min(noticed[j], prev) - sum(o * w for _, o, w in f.events)
        out.append(IntervalForecast(prev, tuple((i, o, w) for (i, o), w in law.items())))
    return out


@dataclass(frozen=True)
class Outcome:
    """Per-target result of one scenario key, arrays aligned with ``targets``.

    ``cost_ms`` is the expected migration cost over the scenarios in which the target is reachable,
    weighted by their probability (so ``reach * T - cost_ms/1000`` is the expected useful time).
    ``kind[i]`` is the probability of each migration kind, in the order of ``KINDS``.
    """

    targets: tuple[Strategy, ...]
    reach: np.ndarray
    cost_ms: np.ndarray
    kind: np.ndarray

    def of(self, target: Strategy) -> tuple[float, float]:
        i = self.targets.index(target)
        return float(self.reach[i]), float(self.cost_ms[i])


TAIL = 1e-18


def loss_law(n: int, active: int, n_out: int) -> np.ndarray:
    """P(k of the ``n_out`` preempted instances are among the ``active`` ones), k = 0, 1, ...

    Hypergeometric. The upper tail is cut where every remaining term is below 1e-18: those scenarios
    change an expected cost of at most 1e5 ms by less than 1e-12 ms, far below float precision of the
    sum, and on large clusters they are most of the work.
    """
    kmax = min(active, n_out)
    if active == 0:
        return np.array([1.0])
    pk: np.ndarray = hypergeom.pmf(np.arange(kmax + 1), n, active, n_out)
    mode = int(np.argmax(pk))
    tail = np.flatnonzero(pk[mode:] < TAIL)
    if len(tail):
        pk = pk[: mode + tail[0]]
    return pk


#: An assignment DP table as sorted items: (replicas of the boundary stage used, best overlap).
_Table = tuple[tuple[int, int], ...]
#: The static tables of one model: restart ms, stage transfers, pipeline ms, no-loss costs, cost upper bounds,
#: and lower bounds where a loss may cost less than none (`ScenarioStore._notice_floors`).
_Tables = tuple[
    dict[tuple[int, int, bool], float],
    dict[int, tuple[float, ...]],
    dict[tuple[int, int, int, bool], float],
    dict[tuple[Strategy, tuple[Strategy, ...]], np.ndarray],
    dict[tuple[Strategy, tuple[Strategy, ...], int], np.ndarray],
    dict[tuple[Strategy, tuple[Strategy, ...]], np.ndarray],
]
_STATIC: dict[tuple[int, int], tuple[ThroughputProfile, CostModel, _Tables]] = {}


def _static_tables(profile: ThroughputProfile, cost: CostModel) -> _Tables:
    """Per-process tables of one (profile, cost model) pair, keyed by identity (the objects are kept)."""
    key = (id(profile), id(cost))
    hit = _STATIC.get(key)
    if hit is None or hit[0] is not profile or hit[1] is not cost:
        hit = _STATIC[key] = (profile, cost, ({}, {}, {}, {}, {}, {}))
    return hit[2]


class ScenarioStore:
    """Exact, cached scenario outcomes for one model (profile + cost model)."""

    def __init__(self, profile: ThroughputProfile, cost: CostModel) -> None:
        self.profile = profile
        self.cost = cost
        self._cond: dict[tuple[int, int, int, int, bool], tuple[int, np.ndarray, np.ndarray]] = {}
        self._pipe: dict[tuple[int, int, int], tuple[int, list[dict[int, int]]]] = {}
        self._keys: dict[tuple[int, int, int, int, int, tuple[Strategy, ...]], Outcome] = {}
        self._targets: dict[int, tuple[Strategy, ...]] = {}
        # Static tables (no scenario in them: restart terms, transfers, no-preemption costs, cost upper
        # bounds) are shared by every store of the same profile and cost model in the process.
        static = _static_tables(profile, cost)
        self._restart, self._transfer, self._pipe_ms, self._base, self._uppers, self._floors = static
        self._pks: dict[tuple[int, int, int], np.ndarray] = {}
        self._pairs: dict[tuple[IntervalForecast, Strategy, Strategy], tuple[float, float, np.ndarray]] = {}
        self._fallbacks: dict[tuple[IntervalForecast, Strategy, tuple[Strategy, ...], float], np.ndarray] = {}

    def targets(self, max_instances: int) -> tuple[Strategy, ...]:
        """Feasible strategies using at most ``max_instances``, in the profile's order."""
        if max_instances not in self._targets:
            self._targets[max_instances] = tuple(self.profile.strategies(max_instances))
        return self._targets[max_instances]

    def clear(self) -> None:
        """Forget every cached scenario (the static model tables stay)."""
        for cache in (self._cond, self._pipe, self._keys, self._pks, self._pairs, self._fallbacks):
            cache.clear()

    # -- public ----------------------------------------------------------------------------------------
    def outcome(self, n: int, current: Strategy, n_in: int, n_out: int, targets: Sequence[Strategy]) -> Outcome:
        """Exact outcome of the point event (n_in, n_out) for every target in ``targets``."""
        D, P = current
        key = (n, D, P, n_in, n_out, tuple(targets))
        hit = self._keys.get(key)
        if hit is not None:
            return hit
        if n < D * P:
            raise ValueError(f"current strategy {D}x{P} uses more than the N={n} instances")
        if n_out > n:
            raise ValueError(f"n_out={n_out} exceeds N={n}")
        active = D * P
        pk = self._pk(n, active, n_out)
        kmax = len(pk) - 1
        alive = n + n_in - n_out
        reach = np.zeros(len(targets))
        cost = np.zeros(len(targets))
        kind = np.zeros((len(targets), len(KINDS)))
        for i, (d, p) in enumerate(targets):
            if d * p > alive:
                continue
            kprob, kcost = self._conditional(D, P, d, p, kmax, fresh=d * p > n - n_out)
            reach[i] = 1.0
            cost[i] = float(pk @ kcost[: kmax + 1])
            kind[i] = pk @ kprob[: kmax + 1]
        out = Outcome(tuple(targets), reach, cost, kind)
        self._keys[key] = out
        return out

    def mixed(self, forecast: IntervalForecast, current: Strategy, targets: Sequence[Strategy]) -> Outcome:
        """Outcome averaged over the interval's law of (n_in, n_out).

        A predecessor may hold more instances than the forecast's N for this interval (it was reached in
        a scenario with more additions than the point path); the instances it holds exist, so N is
        raised to D*P rather than declaring the state impossible.
        """
        n = max(forecast.prev_available, current[0] * current[1])
        reach = np.zeros(len(targets))
        cost = np.zeros(len(targets))
        kind = np.zeros((len(targets), len(KINDS)))
        for n_in, n_out, w in forecast.events:
            if w == 0:
                continue
            o = self.outcome(n, current, n_in, n_out, targets)
            reach += w * o.reach
            cost += w * o.cost_ms
            kind += w * o.kind
        return Outcome(tuple(targets), reach, cost, kind)

    # -- per-pair exact values and cheap bounds, for the optimizer's lazy search ------------------------
    def _pk(self, n: int, active: int, n_out: int) -> np.ndarray:
        key = (n, active, n_out)
        v = self._pks.get(key)
        if v is None:
            v = self._pks[key] = loss_law(n, active, n_out)
        return v

    def pair(self, forecast: IntervalForecast, current: Strategy, target: Strategy) -> tuple[float, float, np.ndarray]:
        """Exact (reach, expected cost ms, kind probabilities) of one target under the interval's law."""
        key = (forecast, current, target)
        hit = self._pairs.get(key)
        if hit is not None:
            return hit
        D, P = current
        d, p = target
        n = max(forecast.prev_available, D * P)
        reach, cost = 0.0, 0.0
        kind = np.zeros(len(KINDS))
        for n_in, n_out, w in forecast.events:
            if w == 0 or d * p > n + n_in - n_out:
                continue
            pk = self._pk(n, D * P, n_out)
            kprob, kcost = self._conditional(D, P, d, p, len(pk) - 1, fresh=d * p > n - n_out)
            reach += w
            cost += w * float(pk @ kcost[: len(pk)])
            kind += w * (pk @ kprob[: len(pk)])
        hit = self._pairs[key] = (reach, cost, kind)
        return hit

    def bounds(
        self, forecast: IntervalForecast, current: Strategy, targets: Sequence[Strategy]
    ) -> tuple[np.ndarray, ...]:
        """(reach, lower, upper) bounds on the expected cost of every target, without the scenario sums.

        Reach is exact (it only depends on how many instances are alive). The lower bound is the cost
        with no active instance preempted — losing instances never makes a migration cheaper: fewer
        replicas survive, more state is missing, and a rendezvous becomes more likely. (Prepared under a
        notice, a loss can hide lead time a planned move pays: where instances may go, the bound is then
        the no-loss move's downtime and the lead a notice cannot hide, `_notice_floors`.) The upper bound
        lets every possible loss hurt: each preempted replica unmatches at most one new stage (so at most
        k stages' worth of extra parameters to fetch), at most k stages run short, and a rendezvous is
        needed if it could be. The optimizer evaluates exactly only what these bounds cannot rule out.
        """
        D, P = current
        n = max(forecast.prev_available, D * P)
        tk = tuple(targets)
        base = self._no_loss_costs(current, tk)
        floor = self._notice_floors(current, tk, base)
        need = np.array([d * p for d, p in tk])
        reach = np.zeros(len(tk))
        lower = np.zeros(len(tk))
        upper = np.zeros(len(tk))
        for n_in, n_out, w in forecast.events:
            ok = need <= n + n_in - n_out
            kmax = min(D * P, n_out)
            reach += w * ok
            lower += w * ok * (base if kmax == 0 else floor)
            hi = base if kmax == 0 else self._upper(current, tk, kmax, base)
            upper += w * ok * hi
        return reach, lower, upper

    def _no_loss_costs(self, current: Strategy, targets: tuple[Strategy, ...]) -> np.ndarray:
        """`_no_loss_cost` of every target, kept in the shared static tables."""
        base = self._base.get((current, targets))
        if base is None:
            D, P = current
            base = self._base[(current, targets)] = np.array([self._no_loss_cost(D, P, d, p) for d, p in targets])
        return base

    def _no_loss_cost(self, D: int, P: int, d: int, p: int) -> float:
        """Cost when no active instance is preempted: a function of the model and constants only."""
        if D * P == 0:
            return float(self._start(d, p, 0)[1][0])
        if p == P:
            return float(self._same_depth(D, P, d, 0)[1][0])
        miss0 = self._healthy_missing(D, P, p)
        add = self._add(D, P, d, p, 0)
        if self.cost.preparation.enabled:
            ratio = self._old_over_new((D, P), (d, p))
            return self._prepared_pipeline_ms(P, d, p, miss0, add, self.cost.trigger(False, add), ratio)
        return self._pipeline_ms(d, p, miss0, add)

    def _notice_floors(self, current: Strategy, targets: tuple[Strategy, ...], base: np.ndarray) -> np.ndarray:
        """A lower bound on every target's cost when active instances may be lost: ``base`` itself, unless noticed
        preemptions are prepared (then a loss may hide lead time the no-loss move pays)."""
        cm = self.cost
        if not cm.preparation.prepares(Trigger.NOTICE) or current[0] * current[1] == 0:
            return base
        key = (current, targets)
        hit = self._floors.get(key)
        if hit is None:
            S = 1000.0 * cm.preparation.notice_s
            low = []
            for (d, p), b in zip(targets, base):
                t = self._no_loss_time(*current, d, p)
                low.append(min(b, t.full_ms, t.down_ms + max(0.0, t.lead_ms - S)))  # standbys: the join is hidden
            hit = self._floors[key] = np.array(low)
        return hit

    def _healthy_missing(self, D: int, P: int, p: int) -> int:
        """Parameters re-cutting D x P into p stages must fetch when no replica is lost (`healthy_missing`)."""
        spec = self.cost.spec
        return healthy_missing(spec.layer_params, spec.partition(P), spec.partition(p), D)

    def _no_loss_time(self, D: int, P: int, d: int, p: int) -> MigrationTime:
        """The `MigrationTime` of moving (D, P) to (d, p) when no active instance is lost (D * P > 0)."""
        cm = self.cost
        if p != P:
            return cm.pipeline_time(d, p, self._healthy_missing(D, P, p), self._add(D, P, d, p, 0), old_p=P)
        if d == D:
            return MigrationTime(0.0)
        if d < D:
            return cm.intra_stage_time(d, P)
        return cm.inter_stage_time(d, P, max(self._transfers(P)), add=True)  # every stage is short, none serial

    def fallback(
        self, forecast: IntervalForecast, current: Strategy, targets: Sequence[Strategy], interval_s: float
    ) -> np.ndarray:
        """Samples credited, per target, to the scenarios in which that target is unreachable.

        The paper's liveput counts an unreachable target as training nothing. A running job instead falls
        back to the best strategy it can reach (the runtime reacts to the preemption), so a wide forecast
        would make the plan needlessly timid. For each scenario we credit the best reachable strategy's
        samples with its migration cost's *upper* bound (`bounds`): a conservative credit that only
        depends on the predecessor, so the search stays exact for it. Zero for point forecasts.
        """
        if len(forecast.events) == 1:  # a point forecast: the target is reachable or not a candidate
            return np.zeros(len(targets))
        key = (forecast, current, tuple(targets), interval_s)
        hit = self._fallbacks.get(key)
        if hit is not None:
            return hit
        D, P = current
        n = max(forecast.prev_available, D * P)
        tk = tuple(targets)
        need = np.array([d * p for d, p in tk])
        thr = np.array([self.profile.throughput(d, p) for d, p in tk])
        out = np.zeros(len(tk))
        base = self._no_loss_costs(current, tk)
        for n_in, n_out, w in forecast.events:
            alive = n + n_in - n_out
            if np.all(need <= alive):
                continue
            kmax = min(D * P, n_out)
            hi = base if kmax == 0 else self._upper(current, tk, kmax, base)
            ok = need <= alive
            best = float(np.max(np.where(ok, thr * np.maximum(0.0, interval_s - hi / 1000.0), 0.0), initial=0.0))
            out += w * (need > alive) * best
        self._fallbacks[key] = out
        return out

    def _upper(self, current: Strategy, targets: tuple[Strategy, ...], kmax: int, base: np.ndarray) -> np.ndarray:
        key = (current, targets, kmax)
        hit = self._uppers.get(key)
        if hit is not None:
            return hit
        D, P = current
        spec = self.cost.spec
        out = np.empty(len(targets))
        for i, (d, p) in enumerate(targets):
            add = d * p > D * P - kmax
            if D * P == 0:
                out[i] = base[i]
            elif p == P:
                t = sorted(self._transfers(P), reverse=True)
                inter = max(t[0], sum(t[: kmax + 1])) + self._restart_ms(d, P, add)
                out[i] = max(base[i], inter)
            else:
                old, new = spec.partition(P), spec.partition(p)
                miss0 = healthy_missing(spec.layer_params, old, new, D)
                biggest = max(stage_overlap(spec.layer_params, old, new).size)
                worst = min(spec.total_params, miss0 + kmax * biggest)
                out[i] = max(base[i], self._pipeline_ms(d, p, worst, add))
        self._uppers[key] = out
        return out

    # -- conditional on k active losses ----------------------------------------------------------------
    def _conditional(
        self, D: int, P: int, d: int, p: int, kmax: int, fresh: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(probability of each kind, expected cost) given k = 0..kmax preempted active instances.

        ``fresh``: the target needs instances that arrive in this interval (more than survive from before it), so
        under a notice their rendezvous cannot be prepared; standbys that were already there can. Only a prepared
        notice tells the two apart.
        """
        fresh = fresh and self.cost.preparation.prepares(Trigger.NOTICE)
        key = (D, P, d, p, fresh)
        hit = self._cond.get(key)
        if hit is not None and hit[0] >= kmax:
            return hit[1], hit[2]
        # A cached table for fewer losses is recomputed for the larger range (it covers both).
        want = kmax
        if D * P == 0:
            probs, costs = self._start(d, p, want)
        elif p == P:
            probs, costs = self._same_depth(D, P, d, want, fresh)
        else:
            probs, costs = self._repartition(D, P, d, p, want, fresh)
        self._cond[key] = (want, probs, costs)
        return probs, costs

    def _restart_ms(self, d: int, p: int, add: bool) -> float:
        key = (d, p, add)
        v = self._restart.get(key)
        if v is None:
            v = self._restart[key] = self.cost.restart_ms(d, p, add)
        return v

    def _transfers(self, p: int) -> tuple[float, ...]:
        v = self._transfer.get(p)
        if v is None:
            v = self._transfer[p] = self.cost.stage_transfer_ms(p)
        return v

    def _pipeline_ms(self, d: int, p: int, missing: int, add: bool) -> float:
        key = (d, p, missing, add)
        v = self._pipe_ms.get(key)
        if v is None:
            v = self._pipe_ms[key] = self.cost.pipeline_ms(d, p, missing, add)
        return v

    def _add(self, D: int, P: int, d: int, p: int, k: int) -> bool:
        # New instances must rendezvous when the target needs more than the surviving active ones.
        # (The reference used D*P - n_out, counting preempted idle instances as active losses, §I.8.)
        return d * p > D * P - k

    def _start(self, d: int, p: int, kmax: int) -> tuple[np.ndarray, np.ndarray]:
        probs = np.zeros((kmax + 1, len(KINDS)))
        probs[:, KINDS.index(MigrationKind.START)] = 1.0
        return probs, np.full(kmax + 1, self._pipeline_ms(d, p, self.cost.spec.total_params, True))

    def _same_depth(self, D: int, P: int, d: int, kmax: int, fresh: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """p == P: intra-stage when every stage keeps >= d replicas, else inter-stage.

        Dynamic program over stages; the state is (losses so far, slowest parallel transfer, serial
        transfer sum), which is all the inter-stage cost depends on. Ways are exact integers.
        """
        cm = self.cost
        t = self._transfers(P)
        states: dict[tuple[int, float, float], int] = {(0, 0.0, 0.0): 1}
        for s in range(P):
            nxt: dict[tuple[int, float, float], int] = defaultdict(int)
            for (lost, par, ser), ways in states.items():
                for lost_now in range(0, min(D, kmax - lost) + 1):
                    c = D - lost_now
                    short = c < d
                    serial = c == 0 or (s == P - 1 and c == 1 and d >= 2)
                    key = (lost + lost_now, max(par, t[s]) if short else par, ser + t[s] if serial else ser)
                    nxt[key] += ways * comb(D, lost_now)
            states = nxt
        probs = np.zeros((kmax + 1, len(KINDS)))
        costs = np.zeros(kmax + 1)
        intra_ms = cm.intra_stage_ms(d, P)
        prepared = cm.preparation.enabled
        ratio = self._old_over_new((D, P), (d, P)) if prepared else 0.0
        intra = cm.intra_stage_time(d, P) if prepared else None
        for (lost, par, ser), ways in states.items():
            w = ways / comb(D * P, lost)
            kind = migration_kind(P, P, short=par != 0.0)  # a short stage has a transfer time
            if kind is MigrationKind.INTRA_STAGE and lost == 0 and d == D:
                probs[lost, KINDS.index(MigrationKind.NONE)] += w
            elif kind is MigrationKind.INTRA_STAGE:
                probs[lost, KINDS.index(kind)] += w
                if intra is None:
                    costs[lost] += w * intra_ms
                else:
                    costs[lost] += w * cm.effective_ms(intra, cm.trigger(lost > 0, add=False), ratio, not fresh)
            else:
                probs[lost, KINDS.index(kind)] += w
                add = self._add(D, P, d, P, lost)
                if not prepared:
                    costs[lost] += w * (max(par, ser) + self._restart_ms(d, P, add))
                else:
                    time = cm.inter_stage_time(d, P, max(par, ser), add)
                    costs[lost] += w * cm.effective_ms(time, cm.trigger(lost > 0, add), ratio, not fresh)
        return probs, costs

    def _old_over_new(self, old: Strategy, new: Strategy) -> float:
        """Throughput of the old strategy over the target's: what prices a prepared move's lead time (0 when the
        old one is outside the profile: it trains nothing)."""
        try:
            return self.profile.throughput(*old) / self.profile.throughput(*new)
        except InfeasibleStrategy:
            return 0.0

    def _missing_law(self, D: int, P: int, p: int, kmax: int) -> list[dict[int, int]]:
        """For k = 0..kmax: {missing parameters: number of loss patterns} under the optimal assignment.

        New stage j overlaps a contiguous run of old stages and shares at most one (the boundary stage)
        with j+1, so a chain DP over new stages reveals old stages in order. Its state is the losses so
        far, the boundary stage's useful replicas, and the assignment DP's own table (best overlap per
        replicas of the boundary stage used) — the optimum of `migration.assign_stages`, in expectation.
        """
        key = (D, P, p)
        hit = self._pipe.get(key)
        if hit is not None and hit[0] >= kmax:
            return hit[1]
        spec = self.cost.spec
        so = stage_overlap(spec.layer_params, spec.partition(P), spec.partition(p))
        max_demand = max(so.demand.values())
        if kmax == 0 or kmax <= D - max_demand:
            # Too few losses to leave any old stage with fewer replicas than new stages could use:
            # every pattern gives the full-survivor optimum. (kmax = 0, the common case, lands here.)
            miss0 = healthy_missing(spec.layer_params, spec.partition(P), spec.partition(p), min(D, max_demand))
            law: list[dict[int, int]] = [{miss0: comb(D * P, k)} for k in range(kmax + 1)]
            self._pipe[key] = (kmax, law)
            return law
        # state: (losses, useful replicas of the boundary stage, assignment table as sorted items)
        states: dict[tuple[int, int, tuple[tuple[int, int], ...]], int] = {(0, 0, ((0, 0),)): 1}
        revealed, carry = -1, -1
        for j in range(p):
            fresh = [s for s in so.ranges[j] if s > revealed]
            revealed = max(revealed, so.ranges[j][-1])
            nxt_carry = so.carry(j)
            combos = self._fresh_combos(D, tuple(so.demand[s] for s in fresh), kmax)
            step: dict[tuple[int, tuple[int, ...], _Table], tuple[int, _Table]] = {}
            nxt: dict[tuple[int, int, tuple[tuple[int, int], ...]], int] = defaultdict(int)
            for (lost, cl, table), ways in states.items():
                for cvec, lmap in combos:
                    memo = step.get((cl, cvec, table))
                    if memo is None:
                        cap = dict(zip(fresh, cvec))
                        if carry >= 0:
                            cap[carry] = cl
                        out, _ = advance_assignment(so, j, dict(table), cap)
                        memo = step[(cl, cvec, table)] = (
                            cap.get(nxt_carry, 0) if nxt_carry >= 0 else 0,
                            tuple(sorted(out.items())),
                        )
                    cl_out, t_out = memo
                    for lost_now, w in lmap:
                        if lost + lost_now <= kmax:
                            nxt[(lost + lost_now, cl_out, t_out)] += ways * w
            states, carry = nxt, nxt_carry
        law = [defaultdict(int) for _ in range(kmax + 1)]
        for (lost, _, table), ways in states.items():
            law[lost][so.total - max(v for _, v in table)] += ways
        self._pipe[key] = (kmax, law)
        return law

    @staticmethod
    def _fresh_combos(
        D: int, demands: tuple[int, ...], kmax: int
    ) -> list[tuple[tuple[int, ...], list[tuple[int, int]]]]:
        """Joint law of the revealed stages' useful replicas: [(capped survivors, [(losses, ways)])].

        Survivors beyond a stage's demand are useless, so loss counts that leave the same capped
        survivors merge; with few losses most stages keep their full demand and there is one combo.
        """
        combos: dict[tuple[int, ...], dict[int, int]] = {(): {0: 1}}
        for dem in demands:
            cap = min(D, dem)
            nxt: dict[tuple[int, ...], dict[int, int]] = defaultdict(lambda: defaultdict(int))
            for cvec, lmap in combos.items():
                for lost_now in range(0, min(D, kmax) + 1):
                    c = min(D - lost_now, cap)
                    for l0, w0 in lmap.items():
                        if l0 + lost_now <= kmax:
                            nxt[cvec + (c,)][l0 + lost_now] += w0 * comb(D, lost_now)
            combos = nxt
        return [(cvec, sorted(lmap.items())) for cvec, lmap in combos.items()]

    def _repartition(
        self, D: int, P: int, d: int, p: int, kmax: int, fresh: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        law = self._missing_law(D, P, p, kmax)
        probs = np.zeros((kmax + 1, len(KINDS)))
        costs = np.zeros(kmax + 1)
        probs[:, KINDS.index(migration_kind(P, p, short=False))] = 1.0  # p != P: a pipeline migration
        prepared = self.cost.preparation.enabled
        ratio = self._old_over_new((D, P), (d, p)) if prepared else 0.0
        for k in range(kmax + 1):
            total = comb(D * P, k)
            add = self._add(D, P, d, p, k)
            if not prepared:
                costs[k] = sum(w * self._pipeline_ms(d, p, miss, add) for miss, w in law[k].items()) / total
            else:
                trigger = self.cost.trigger(k > 0, add)
                costs[k] = sum(w * self._prepared_pipeline_ms(P, d, p, miss, add, trigger, ratio, not fresh)
                               for miss, w in law[k].items()) / total  # fmt: skip
        return probs, costs

    def _prepared_pipeline_ms(
        self, P: int, d: int, p: int, missing: int, add: bool, trigger: Trigger, ratio: float, standbys: bool = False
    ) -> float:
        time = self.cost.pipeline_time(d, p, missing, add, old_p=P)
        return self.cost.effective_ms(time, trigger, ratio, standbys)
