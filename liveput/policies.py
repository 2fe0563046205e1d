"""Policies the trace-driven simulator compares: Parcae and the baselines it must beat.

Each policy sees one interval at a time — the true event of that interval (how many instances were there
before it, how many came and went) plus whatever it is allowed to know about the future — and answers
with the strategy it ran and what it trained. Accounting follows the reference simulator (§C.1, §H): a
reconfiguration costs wall time inside the interval, an unfinished one spills into the next, and a new
one started before the old finished pays a concurrent restart on top.

- ``parcae``: the liveput planner fed by a forecaster (persistence until a trained one is plugged in);
- ``parcae-oracle``: the same planner fed the true next K intervals (the reference's "truth" mode);
- ``reactive``: re-plan for throughput after every event with a checkpoint restart (torchrun, SkyPilot,
  Varuna; the reference's "throughput-optimized" baseline);
- ``bamboo``: redundant computation (Bamboo, NSDI '23), see `BambooPolicy`;
- ``ideal``: throughput-optimal with free reconfiguration, the upper bound;
- ``on-demand``: a fixed cluster of on-demand instances of the same type, for cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from math import comb
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.stats import hypergeom

from liveput.horizon import DEFAULT_INTERVAL_S, DEFAULT_LOOK_AHEAD
from liveput.migration import CostModel, MigrationKind, Trigger
from liveput.optimizer import IDLE, JobState, Plan, PlannerConfig, plan_interval
from liveput.scenarios import KINDS, IntervalForecast, ScenarioStore, persistence_forecast, with_noticed
from liveput.throughput import Strategy, ThroughputProfile

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class IntervalEvent:
    """The truth of one interval: N before its events, additions and preemptions."""

    interval: int
    prev_available: int
    n_in: int
    n_out: int

    @property
    def available(self) -> int:
        return self.prev_available + self.n_in - self.n_out


@dataclass(frozen=True)
class StepResult:
    """What a policy did in one interval."""

    strategy: Strategy
    samples: float
    pause_s: float
    cost_ms: float
    migrating: bool
    instances: int
    kinds: dict[str, float] = field(default_factory=dict)


Forecaster = Callable[[Sequence[IntervalEvent], Sequence[IntervalEvent], int], list[IntervalForecast]]
"""(history up to the previous interval, the true future from this interval on, K) -> K forecasts.

Only the oracle may read the true future; every other forecaster must ignore it."""


def history_persistence(
    history: Sequence[IntervalEvent], future: Sequence[IntervalEvent], k: int
) -> list[IntervalForecast]:
    """`liveput.scenarios.persistence_forecast` of the last observed N, as a simulator `Forecaster`."""
    return persistence_forecast(history[-1].available if history else 0, k)


def oracle_forecast(
    history: Sequence[IntervalEvent], future: Sequence[IntervalEvent], k: int
) -> list[IntervalForecast]:
    """The true next K intervals (padded with persistence past the end of the trace)."""
    out = [IntervalForecast.point(e.prev_available, e.n_in, e.n_out) for e in future[:k]]
    last = future[min(k, len(future)) - 1].available if future else (history[-1].available if history else 0)
    return out + persistence_forecast(last, k - len(out))


def trained_forecast(model: Any, trace: pd.DataFrame) -> Forecaster:
    """Adapt a fitted `forecasting.forecast.Forecaster` to the simulator: it sees the trace's past only.

    At interval i the history is ``trace.iloc[:i]`` (the last row is the last observed interval), so
    the model gets exactly what a live planner would have; the true future argument is ignored.
    """

    def forecast(history: Sequence[IntervalEvent], future: Sequence[IntervalEvent], k: int) -> list[IntervalForecast]:
        if not history:
            return persistence_forecast(0, k)
        return IntervalForecast.from_forecast(model.predict(trace.iloc[: len(history)], k))

    forecast.__name__ = f"forecast_{getattr(model, 'name', 'model')}"
    return forecast


class Policy:
    """Base: owns the model's profile and cost model; subclasses decide and account one interval."""

    name = "policy"
    spot = True  # pays spot prices for every instance it holds

    def __init__(self, profile: ThroughputProfile, cost: CostModel, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.profile = profile
        self.cost = cost
        self.T = interval_s

    def reset(self) -> None:
        pass

    def step(
        self, event: IntervalEvent, history: Sequence[IntervalEvent], future: Sequence[IntervalEvent], first: bool
    ) -> StepResult:
        raise NotImplementedError

    def _thr(self, s: Strategy) -> float:
        return 0.0 if s == IDLE else self.profile.throughput(*s)

    def _concurrent_ms(self, s: Strategy) -> float:
        """What a reconfiguration started while another is unfinished pays on top (§C.1)."""
        return self.cost.concurrent_restart_ms(*s) if s != IDLE else 0.0

    def _charged(
        self,
        acct: _RestartAccounting,
        strategy: Strategy,
        cost_ms: float,
        concurrent_ms: float,
        instances: int,
        kinds: dict[str, float],
    ) -> StepResult:
        """The interval of ``strategy`` after ``acct`` is charged ``cost_ms`` started now: what it trained, paused."""
        work_ms, pause_ms = acct.charge(cost_ms, concurrent_ms, self.T * 1000.0)
        return StepResult(
            strategy,
            self._thr(strategy) * work_ms / 1000.0,
            pause_ms / 1000.0,
            cost_ms,
            acct.busy,
            instances,
            kinds,
        )


class _RestartAccounting:
    """The remain/busy bookkeeping shared by every policy that pays reconfiguration time (§C.1, §H)."""

    def __init__(self) -> None:
        self.busy = False
        self.remain_ms = 0.0

    def charge(self, cost_ms: float, concurrent_ms: float, interval_ms: float) -> tuple[float, float]:
        """Charge ``cost_ms`` started now; returns (useful ms, paused ms) of this interval."""
        if cost_ms > 0:
            remain = cost_ms + (concurrent_ms if self.busy else 0.0)
        else:
            remain = self.remain_ms if self.busy else 0.0
        work = interval_ms - remain
        if work >= 0:
            self.busy, self.remain_ms = False, 0.0
            return work, remain
        self.busy, self.remain_ms = True, -work
        return 0.0, interval_ms


class ParcaePolicy(Policy):
    """The liveput planner, fed by ``forecaster``; only the first planned interval is applied.

    When the true event leaves too few instances for the planned strategy (a misprediction), the job
    re-plans against the true event, as the runtime would on a preemption notice, and pays that
    migration's true expected cost (§B.3). The re-plan keeps the full look-ahead: the true event for
    this interval, then a fresh forecast from the history that now includes it. Re-planning one interval
    only picked the cheapest reaction (say 4x8 -> 3x8 after losing 3 of 32) and paid a second, pipeline
    migration an interval later to reach the shape the look-ahead wanted.
    """

    def __init__(
        self,
        profile: ThroughputProfile,
        cost: CostModel,
        forecaster: Forecaster = history_persistence,
        look_ahead: int = DEFAULT_LOOK_AHEAD,
        interval_s: float = DEFAULT_INTERVAL_S,
        name: str = "parcae",
        store: ScenarioStore | None = None,
    ) -> None:
        super().__init__(profile, cost, interval_s)
        self.name = name
        self.forecaster = forecaster
        self.config = PlannerConfig(interval_s=interval_s, look_ahead=look_ahead)  # validated here, at construction
        self.store = store or ScenarioStore(profile, cost)
        self.decision_s: list[float] = []
        self.reset()

    def reset(self) -> None:
        self.state = JobState()
        self.decision_s = []

    def step(
        self, event: IntervalEvent, history: Sequence[IntervalEvent], future: Sequence[IntervalEvent], first: bool
    ) -> StepResult:
        forecast = self._noticed(self.forecaster(history, future, self.config.look_ahead), future)
        p = self._plan(forecast)
        spent = p.decision_s
        target = p.decision
        if target[0] * target[1] > event.available or self._surprised(forecast[0], event):
            # misprediction: react to the true event
            replan = self._plan(self._truth_first(event, history, future))
            target, spent = replan.decision, spent + replan.decision_s
        self.decision_s.append(spent)
        return self._apply(target, event)

    def _noticed(self, forecast: list[IntervalForecast], future: Sequence[IntervalEvent]) -> list[IntervalForecast]:
        """The forecast with the preemptions the cloud has noticed already (`scenarios.with_noticed`). An interval's
        event is what changed since the interval before (a trace samples the count at each start): its preemptions
        came at most T before its start, so those of the j-th interval from now were noticed by now if j T <= the
        notice — this interval's and the next floor(notice / T) (AWS, 120 s, T = 60 s: three). Only for a runtime
        that acts on notices (`Preparation.prepares` them); none without notice (`Preparation.notice_s` 0, and the
        reference's full stop)."""
        prep = self.cost.preparation
        ahead = int(prep.notice_s // self.T) + 1 if prep.notice_s > 0 and prep.prepares(Trigger.NOTICE) else 0
        return with_noticed(forecast, [e.n_out for e in future[:ahead]]) if ahead else forecast

    def _surprised(self, expected: IntervalForecast, event: IntervalEvent) -> bool:
        """A prepared runtime sees instances arrive as they do: an arrival the forecast did not make its most likely
        outcome is reacted to at once (unprepared, the policy keeps the paper's rule: react only when the plan does
        not fit)."""
        if not self.cost.preparation.prepares(Trigger.ADDITION) or event.n_in == 0:
            return False
        mode = max(w for _, _, w in expected.events)
        return not any(i == event.n_in and o == event.n_out and w == mode for i, o, w in expected.events)

    def _plan(self, forecast: Sequence[IntervalForecast]) -> Plan:
        return plan_interval(
            forecast, self.state, self.profile, self.cost, interval_s=self.config.interval_s, store=self.store
        )

    def _truth_first(
        self, event: IntervalEvent, history: Sequence[IntervalEvent], future: Sequence[IntervalEvent]
    ) -> list[IntervalForecast]:
        """The K intervals a re-plan sees: this interval's true event, then a forecast made after it (with the
        preemptions noticed already)."""
        truth = [IntervalForecast.point(event.prev_available, event.n_in, event.n_out)]
        k = self.config.look_ahead
        if k == 1:
            return truth
        return self._noticed(truth + list(self.forecaster([*history, event], future[1:], k - 1)), future)

    def _apply(self, target: Strategy, event: IntervalEvent) -> StepResult:
        st = self.state
        if target == IDLE:
            cost_ms, kinds = 0.0, {}
        else:
            n = max(event.prev_available, st.strategy[0] * st.strategy[1])
            o = self.store.outcome(n, st.strategy, event.n_in, event.n_out, [target])
            cost_ms = float(o.cost_ms[0])
            kinds = {
                k.value: float(o.kind[0, i])
                for i, k in enumerate(KINDS)
                if k != MigrationKind.NONE and o.kind[0, i] > 0
            }
        acct = _RestartAccounting()
        acct.busy, acct.remain_ms = st.migrating, st.leftover_ms
        result = self._charged(
            acct, target, cost_ms, self._concurrent_ms(target), event.available, kinds if cost_ms > 0 else {}
        )
        self.state = JobState(target, acct.busy, acct.remain_ms)
        return result


class ReactivePolicy(Policy):
    """Checkpoint-restart after every event, to the throughput-optimal strategy (§H "Tput-opt").

    At the first interval and at every interval with an addition or a preemption — even one that does
    not change the best strategy, as the reference does (§I.12) — it pays a restart (with rendezvous
    when instances were added), a checkpoint save + load, and a serialised reload of every stage.
    """

    name = "reactive"

    def reset(self) -> None:
        self.acct = _RestartAccounting()
        self.strategy: Strategy = IDLE

    def __init__(self, profile: ThroughputProfile, cost: CostModel, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        super().__init__(profile, cost, interval_s)
        self.reset()

    def step(
        self, event: IntervalEvent, history: Sequence[IntervalEvent], future: Sequence[IntervalEvent], first: bool
    ) -> StepResult:
        cost_ms, kinds = 0.0, {}
        if first or event.n_in + event.n_out > 0:
            target = self.profile.best(event.available) or IDLE
            if target != IDLE:
                add = first or event.n_in > 0
                cost_ms = self.cost.checkpoint_restart_ms(*target, add=add, save=not first)
                kinds = {(MigrationKind.START if first else MigrationKind.CHECKPOINT_RESTART).value: 1.0}
            self.strategy = target
        return self._charged(
            self.acct, self.strategy, cost_ms, self._concurrent_ms(self.strategy), event.available, kinds
        )


class IdealPolicy(Policy):
    """Throughput-optimal strategy for the instances alive, reconfigured for free: the upper bound."""

    name = "ideal"

    def step(
        self, event: IntervalEvent, history: Sequence[IntervalEvent], future: Sequence[IntervalEvent], first: bool
    ) -> StepResult:
        target = self.profile.best(event.available) or IDLE
        return StepResult(target, self._thr(target) * self.T, 0.0, 0.0, False, event.available)


class OnDemandPolicy(Policy):
    """A fixed on-demand cluster of ``instances`` of the same type: never preempted, full price."""

    name = "on-demand"
    spot = False

    def __init__(
        self, profile: ThroughputProfile, cost: CostModel, instances: int, interval_s: float = DEFAULT_INTERVAL_S
    ) -> None:
        super().__init__(profile, cost, interval_s)
        self.instances = instances
        self.reset()

    def reset(self) -> None:
        self.acct = _RestartAccounting()

    def step(
        self, event: IntervalEvent, history: Sequence[IntervalEvent], future: Sequence[IntervalEvent], first: bool
    ) -> StepResult:
        target = self.profile.best(self.instances) or IDLE
        cost_ms = self.cost.checkpoint_restart_ms(*target, add=True, save=False) if first and target != IDLE else 0.0
        kinds = {MigrationKind.START.value: 1.0} if cost_ms else {}
        return self._charged(self.acct, target, cost_ms, 0.0, self.instances, kinds)


@dataclass(frozen=True)
class BambooConstants:
    """Bamboo's redundant-computation model and where each number comes from.

    - ``overhead``: fraction of throughput lost to redundant forward computation of the successor's
      layers. Bamboo (Thorpe et al., NSDI '23) schedules it into pipeline bubbles and reports a low
      cost; its exact per-model figure is not in our reference, so 10% is an *assumption* — change it
      with ``--bamboo-overhead`` and read the results as a function of it.
    - ``memory_factor``: every instance also holds its successor's stage, so a strategy needs
      ``memory_factor`` x the model's minimum number of stages to fit (2: own + one redundant stage).
    Recovery from a preemption whose pipeline neighbour survived costs a communicator rebuild (the
    intra-stage cost of our model); losing two neighbours of one pipeline falls back to a checkpoint
    restart like ``reactive``. Redundancy is a ring: stage i holds stage i+1's layers, the last holds
    stage 0's.
    """

    overhead: float = 0.10
    memory_factor: int = 2


class BambooPolicy(Policy):
    """Redundant computation (Bamboo, NSDI '23) in the reference's cost model; see `BambooConstants`."""

    name = "bamboo"

    def __init__(
        self,
        profile: ThroughputProfile,
        cost: CostModel,
        interval_s: float = DEFAULT_INTERVAL_S,
        constants: BambooConstants = BambooConstants(),
    ) -> None:
        super().__init__(profile, cost, interval_s)
        self.k = constants
        self.allowed = tuple(s for s in profile.strategies() if s[1] >= constants.memory_factor * profile.min_p)
        self.reset()

    def reset(self) -> None:
        self.acct = _RestartAccounting()
        self.strategy: Strategy = IDLE

    def best(self, n: int) -> Strategy:
        fits = [s for s in self.allowed if s[0] * s[1] <= n]
        if not fits:
            return IDLE
        return max(fits, key=lambda s: (round(self.profile.throughput(*s), 9), -s[1], -s[0] * s[1]))

    def _thr(self, s: Strategy) -> float:
        return 0.0 if s == IDLE else self.profile.throughput(*s) * (1.0 - self.k.overhead)

    @staticmethod
    def survive_probability(d: int, p: int, k: int) -> float:
        """P(no pipeline loses two ring-neighbours | k of the d*p active instances preempted), exactly."""
        if k == 0:
            return 1.0
        # ways[m]: choices of m instances of a ring of p with no two neighbours, p/(p-m) * C(p-m, m)
        ways = np.zeros(p + 1, dtype=object)
        ways[0] = 1
        for m in range(1, p // 2 + 1):
            ways[m] = p * comb(p - m, m) // (p - m)
        poly = np.array([1], dtype=object)
        for _ in range(d):
            poly = np.convolve(poly, ways)
        good = poly[k] if k < len(poly) else 0
        return float(good) / comb(d * p, k)

    def step(
        self, event: IntervalEvent, history: Sequence[IntervalEvent], future: Sequence[IntervalEvent], first: bool
    ) -> StepResult:
        cm = self.cost
        cost_ms, kinds = 0.0, {}
        cur = self.strategy
        if first:
            target = self.best(event.available)
            if target != IDLE:
                cost_ms = cm.checkpoint_restart_ms(*target, add=True, save=False)
                kinds = {MigrationKind.START.value: 1.0}
            self.strategy = target
        elif event.n_in + event.n_out > 0:
            target = self.best(event.available)
            active = cur[0] * cur[1]
            if target == IDLE:
                self.strategy = IDLE
            elif cur == IDLE:
                cost_ms = cm.checkpoint_restart_ms(*target, add=True, save=False)
                kinds = {MigrationKind.CHECKPOINT_RESTART.value: 1.0}
                self.strategy = target
            else:
                kmax = min(active, event.n_out)
                pk = hypergeom.pmf(np.arange(kmax + 1), event.prev_available, active, event.n_out)
                p_fail = 0.0
                for k in range(kmax + 1):
                    surv = self.survive_probability(*cur, k)
                    changed = target != cur or k > 0
                    recover = cm.intra_stage_ms(*cur) if k > 0 else 0.0
                    reshape = 0.0
                    if target != cur:
                        add = target[0] * target[1] > active - k
                        reshape = cm.restart_ms(*target, add=add) + max(cm.stage_transfer_ms(target[1]))
                    fail = cm.checkpoint_restart_ms(*target, add=event.n_in > 0, save=True)
                    cost_ms += pk[k] * (surv * (recover + reshape) + (1 - surv) * fail) if changed else 0.0
                    p_fail += pk[k] * (1 - surv)
                if p_fail > 0:
                    kinds[MigrationKind.CHECKPOINT_RESTART.value] = float(p_fail)
                if cost_ms > 0 and 1 - p_fail > 0:
                    kinds["redundancy-failover"] = float(1 - p_fail)
                cost_ms = float(cost_ms)
                self.strategy = target
        return self._charged(
            self.acct, self.strategy, cost_ms, self._concurrent_ms(self.strategy), event.available, kinds
        )


@dataclass(frozen=True)
class PolicySetup:
    """What a policy is built from: the model (profile, cost model) and the knobs some policies read.

    ``capacity``: the on-demand cluster's size; ``store``: a scenario store to share between the planning
    policies; ``forecaster``: what feeds ``parcae`` (persistence when None).
    """

    profile: ThroughputProfile
    cost: CostModel
    look_ahead: int = DEFAULT_LOOK_AHEAD
    interval_s: float = DEFAULT_INTERVAL_S
    capacity: int = 32
    store: ScenarioStore | None = None
    forecaster: Forecaster | None = None
    bamboo: BambooConstants = BambooConstants()


#: The policies the simulator compares, by CLI name -> factory; a new policy plugs in here.
POLICIES: Mapping[str, Callable[[PolicySetup], Policy]] = MappingProxyType({
    "parcae": lambda s: ParcaePolicy(s.profile, s.cost, s.forecaster or history_persistence, s.look_ahead,
                                     s.interval_s, "parcae", s.store),
    "parcae-oracle": lambda s: ParcaePolicy(s.profile, s.cost, oracle_forecast, s.look_ahead, s.interval_s,
                                            "parcae-oracle", s.store),
    "reactive": lambda s: ReactivePolicy(s.profile, s.cost, s.interval_s),
    "bamboo": lambda s: BambooPolicy(s.profile, s.cost, s.interval_s, s.bamboo),
    "ideal": lambda s: IdealPolicy(s.profile, s.cost, s.interval_s),
    "on-demand": lambda s: OnDemandPolicy(s.profile, s.cost, s.capacity, s.interval_s),
})  # fmt: skip
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def make_policy(
    name: str,
    profile: ThroughputProfile,
    cost: CostModel,
    *,
    look_ahead: int = DEFAULT_LOOK_AHEAD,
    interval_s: float = DEFAULT_INTERVAL_S,
    capacity: int = 32,
    store: ScenarioStore | None = None,
    forecaster: Forecaster | None = None,
    bamboo: BambooConstants = BambooConstants(),
) -> Policy:
    """Build the policy ``name`` of `POLICIES`."""
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return factory(PolicySetup(profile, cost, look_ahead, interval_s, capacity, store, forecaster, bamboo))
