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
from collections.abc import Sequence
from dataclasses import dataclass
from math import comb

import numpy as np
from scipy.stats import hypergeom

from liveput.migration import CostModel, MigrationKind
from liveput.throughput import ThroughputProfile

Strategy = tuple[int, int]
KINDS: tuple[MigrationKind, ...] = (
    MigrationKind.NONE,
    MigrationKind.INTRA_STAGE,
    MigrationKind.INTER_STAGE,
    MigrationKind.PIPELINE,
    MigrationKind.START,
)


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

    @property
    def expected_available(self) -> float:
        return self.prev_available + sum((i - o) * w for i, o, w in self.events)


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


class ScenarioStore:
    """Exact, cached scenario outcomes for one model (profile + cost model)."""

    def __init__(self, profile: ThroughputProfile, cost: CostModel, max_instances: int | None = None) -> None:
        self.profile = profile
        self.cost = cost
        self._cond: dict[tuple[int, int, int, int], tuple[int, np.ndarray, np.ndarray]] = {}
        self._pipe: dict[tuple[int, int, int], tuple[int, list[dict[int, int]]]] = {}
        self._keys: dict[tuple[int, int, int, int, int], Outcome] = {}
        self._targets: dict[int, tuple[Strategy, ...]] = {}
        # static, model-only tables (no scenario in them): restart terms, transfers, stage overlaps
        self._restart: dict[tuple[int, int, bool], float] = {}
        self._transfer: dict[int, tuple[float, ...]] = {}
        self._pipe_ms: dict[tuple[int, int, int, bool], float] = {}
        self._overlaps: dict[tuple[int, int], tuple] = {}
        self._prefix = [0]
        for n_params in cost.spec.layer_params:
            self._prefix.append(self._prefix[-1] + n_params)

    def targets(self, max_instances: int) -> tuple[Strategy, ...]:
        """Feasible strategies using at most ``max_instances``, in the profile's order."""
        if max_instances not in self._targets:
            self._targets[max_instances] = tuple(self.profile.strategies(max_instances))
        return self._targets[max_instances]

    def clear(self) -> None:
        self._cond.clear()
        self._pipe.clear()
        self._keys.clear()

    # -- public ----------------------------------------------------------------------------------------
    def outcome(self, n: int, current: Strategy, n_in: int, n_out: int, targets: Sequence[Strategy]) -> Outcome:
        """Exact outcome of the point event (n_in, n_out) for every target in ``targets``."""
        D, P = current
        key = (n, D, P, n_in, n_out)
        hit = self._keys.get(key)
        if hit is not None and hit.targets == tuple(targets):
            return hit
        if D * P > n:
            raise ValueError(f"current strategy {D}x{P} uses more than the N={n} instances")
        if n_out > n:
            raise ValueError(f"n_out={n_out} exceeds N={n}")
        active = D * P
        kmax = min(active, n_out)
        k = np.arange(kmax + 1)
        pk = hypergeom.pmf(k, n, active, n_out) if active > 0 else np.array([1.0])
        alive = n + n_in - n_out
        reach = np.zeros(len(targets))
        cost = np.zeros(len(targets))
        kind = np.zeros((len(targets), len(KINDS)))
        for i, (d, p) in enumerate(targets):
            if d * p > alive:
                continue
            kprob, kcost = self._conditional(D, P, d, p, kmax)
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
            o = self.outcome(n, current, n_in, n_out + 0, targets)
            reach += w * o.reach
            cost += w * o.cost_ms
            kind += w * o.kind
        return Outcome(tuple(targets), reach, cost, kind)

    # -- conditional on k active losses ----------------------------------------------------------------
    def _conditional(self, D: int, P: int, d: int, p: int, kmax: int) -> tuple[np.ndarray, np.ndarray]:
        """(probability of each kind, expected cost) given k = 0..kmax preempted active instances."""
        key = (D, P, d, p)
        hit = self._cond.get(key)
        if hit is not None and hit[0] >= kmax:
            return hit[1], hit[2]
        # Compute for the full range when it is cheap enough, so later keys reuse it.
        want = max(kmax, hit[0] + 1 if hit else 0)
        if D * P == 0:
            probs, costs = self._start(d, p, want)
        elif p == P:
            probs, costs = self._same_depth(D, P, d, want)
        else:
            probs, costs = self._repartition(D, P, d, p, want)
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

    def _overlap_tables(self, P: int, p: int) -> tuple:
        """Which old stages each new stage overlaps, by how many parameters, and each stage's size."""
        key = (P, p)
        hit = self._overlaps.get(key)
        if hit is not None:
            return hit
        spec = self.cost.spec
        prefix = self._prefix
        old, new = spec.partition(P), spec.partition(p)
        ranges, overlap = [], []
        s = 0
        for j in range(p):
            lo, hi = new[j], new[j + 1]
            while old[s + 1] <= lo:  # old stages are in layer order: advance to the first overlapping one
                s += 1
            ov, t = {}, s
            while t < P and old[t] < hi:
                ov[t] = prefix[min(hi, old[t + 1])] - prefix[max(lo, old[t])]
                t += 1
            ranges.append(list(ov))
            overlap.append(ov)
        demand: dict[int, int] = defaultdict(int)  # new stages wanting each old stage: more replicas are useless
        for ov in ranges:
            for t in ov:
                demand[t] += 1
        size = [prefix[new[j + 1]] - prefix[new[j]] for j in range(p)]
        hit = self._overlaps[key] = (ranges, dict(demand), overlap, size)
        return hit

    def _add(self, D: int, P: int, d: int, p: int, k: int) -> bool:
        # New instances must rendezvous when the target needs more than the surviving active ones.
        # (The reference used D*P - n_out, counting preempted idle instances as active losses, §I.8.)
        return d * p > D * P - k

    def _start(self, d: int, p: int, kmax: int) -> tuple[np.ndarray, np.ndarray]:
        probs = np.zeros((kmax + 1, len(KINDS)))
        probs[:, KINDS.index(MigrationKind.START)] = 1.0
        return probs, np.full(kmax + 1, self._pipeline_ms(d, p, self.cost.spec.total_params, True))

    def _same_depth(self, D: int, P: int, d: int, kmax: int) -> tuple[np.ndarray, np.ndarray]:
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
                for l in range(0, min(D, kmax - lost) + 1):
                    c = D - l
                    short = c < d
                    serial = c == 0 or (s == P - 1 and c == 1 and d >= 2)
                    key = (lost + l, max(par, t[s]) if short else par, ser + t[s] if serial else ser)
                    nxt[key] += ways * comb(D, l)
            states = nxt
        probs = np.zeros((kmax + 1, len(KINDS)))
        costs = np.zeros(kmax + 1)
        intra_ms = cm.intra_stage_ms(d, P)
        for (lost, par, ser), ways in states.items():
            w = ways / comb(D * P, lost)
            if par == 0.0:  # nobody short
                if lost == 0 and d == D:
                    probs[lost, KINDS.index(MigrationKind.NONE)] += w
                else:
                    probs[lost, KINDS.index(MigrationKind.INTRA_STAGE)] += w
                    costs[lost] += w * intra_ms
            else:
                probs[lost, KINDS.index(MigrationKind.INTER_STAGE)] += w
                costs[lost] += w * (max(par, ser) + self._restart_ms(d, P, self._add(D, P, d, P, lost)))
        return probs, costs

    def _missing_law(self, D: int, P: int, p: int, kmax: int) -> list[dict[int, int]]:
        """For k = 0..kmax: {missing parameters: number of loss patterns} under `assign_stages`' greedy.

        A chain DP over the new stages: a new stage overlaps a contiguous run of old stages and shares
        at most one (the boundary stage) with the next, so the state is (losses so far, which old
        stage is carried, its replicas left, missing so far).
        """
        key = (D, P, p)
        hit = self._pipe.get(key)
        if hit is not None and hit[0] >= kmax:
            return hit[1]
        ranges, demand, overlap, size = self._overlap_tables(P, p)
        if kmax <= D - max(demand.values()):
            # Too few losses to leave any stage with fewer replicas than new stages want from it: every
            # pattern gives the full-survivor greedy. (kmax = 0, the common case, always lands here.)
            miss0 = self._greedy_missing(ranges, overlap, size, {s: min(D, c) for s, c in demand.items()})
            law = [{miss0: comb(D * P, k)} for k in range(kmax + 1)]
            self._pipe[key] = (kmax, law)
            return law
        # The carried (boundary) stage is fixed by j, so the state is (losses, its replicas left, missing).
        states: dict[tuple[int, int, int], int] = {(0, 0, 0): 1}
        revealed, carry = -1, -1
        for j in range(p):
            fresh = [s for s in ranges[j] if s > revealed]
            revealed = max(revealed, ranges[j][-1])
            nxt_carry = ranges[j][-1] if j + 1 < p and ranges[j][-1] in ranges[j + 1] else -1
            combos = self._fresh_combos(D, tuple(demand[s] for s in fresh), kmax)
            greedy: dict[tuple[int, tuple[int, ...]], tuple[int, int]] = {}
            nxt: dict[tuple[int, int, int], int] = defaultdict(int)
            for (lost, cl, miss), ways in states.items():
                for cvec, lmap in combos:
                    g = greedy.get((cl, cvec))
                    if g is None:
                        left = dict(zip(fresh, cvec))
                        if carry >= 0:
                            left[carry] = cl
                        best, best_ov = -1, 0
                        for s in ranges[j]:
                            if left[s] > 0 and overlap[j][s] > best_ov:
                                best, best_ov = s, overlap[j][s]
                        if best >= 0:
                            left[best] -= 1
                        g = greedy[(cl, cvec)] = (left[nxt_carry] if nxt_carry >= 0 else 0, size[j] - best_ov)
                    cl_out, add = g
                    for l, w in lmap:
                        if lost + l <= kmax:
                            nxt[(lost + l, cl_out, miss + add)] += ways * w
            states, carry = nxt, nxt_carry
        law: list[dict[int, int]] = [defaultdict(int) for _ in range(kmax + 1)]
        for (lost, _, miss), ways in states.items():
            law[lost][miss] += ways
        self._pipe[key] = (kmax, law)
        return law

    @staticmethod
    def _fresh_combos(D: int, demands: tuple[int, ...], kmax: int) -> list[tuple[tuple[int, ...], list[tuple[int, int]]]]:
        """Joint law of the revealed stages' useful replicas: [(capped survivors, [(losses, ways)])].

        Survivors beyond a stage's demand are useless, so loss counts that leave the same capped
        survivors merge; with few losses most stages keep their full demand and there is one combo.
        """
        combos: dict[tuple[int, ...], dict[int, int]] = {(): {0: 1}}
        for dem in demands:
            cap = min(D, dem)
            nxt: dict[tuple[int, ...], dict[int, int]] = defaultdict(lambda: defaultdict(int))
            for cvec, lmap in combos.items():
                for l in range(0, min(D, kmax) + 1):
                    c = min(D - l, cap)
                    for l0, w0 in lmap.items():
                        if l0 + l <= kmax:
                            nxt[cvec + (c,)][l0 + l] += w0 * comb(D, l)
            combos = nxt
        return [(cvec, sorted(lmap.items())) for cvec, lmap in combos.items()]

    @staticmethod
    def _greedy_missing(ranges, overlap, size, left: dict[int, int]) -> int:
        """`migration.assign_stages` on precomputed overlaps: the missing parameters only."""
        left = dict(left)
        missing = 0
        for j, ov in enumerate(ranges):
            best, best_ov = -1, 0
            for s in ov:
                if left[s] > 0 and overlap[j][s] > best_ov:
                    best, best_ov = s, overlap[j][s]
            if best >= 0:
                left[best] -= 1
            missing += size[j] - best_ov
        return missing

    def _repartition(self, D: int, P: int, d: int, p: int, kmax: int) -> tuple[np.ndarray, np.ndarray]:
        law = self._missing_law(D, P, p, kmax)
        probs = np.zeros((kmax + 1, len(KINDS)))
        costs = np.zeros(kmax + 1)
        probs[:, KINDS.index(MigrationKind.PIPELINE)] = 1.0
        for k in range(kmax + 1):
            total = comb(D * P, k)
            add = self._add(D, P, d, p, k)
            costs[k] = sum(w * self._pipeline_ms(d, p, miss, add) for miss, w in law[k].items()) / total
        return probs, costs
