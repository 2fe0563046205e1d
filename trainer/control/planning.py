"""Live planning: the strategy (D x P) a running job trains with in the coming interval, decided at every interval
boundary from what has happened so far — the runtime side of Parcae's receding horizon (reference §A.4, §C.1).

Owns: `PlanRequest` (what a planner is told at a boundary), the `Planner` protocol and three planners —
`RulePlanner` (the trace replay's fixed rule, `trainer.control.schedules.trace_strategy`), `LiveputPlanner` (the liveput
optimizer, `liveput.plan_interval`, over a forecast of the next intervals) and `HandedPlanner` (plans handed in
from outside, e.g. by the Prefect `plan_interval` flow, through `hand_plan`) —, the forecasts a liveput planner
plans with (`observed_persistence`; `TraceForecast`, a fitted forecasting model on the replayed trace's past;
`HistoryForecast`, one on a live fleet's own history),
`make_planner` (a planner by kind, as `parcae train` and the train flow build one) and the feasibility check every
decision passes (`check_decision`). Must not touch: processes, epochs and the store layout (`trainer.control.run`'s
driver asks the planner and publishes the reconfiguration; `trainer.control.coordinator` owns the keys `hand_plan`
writes), training, fitting or choosing a forecaster (`forecasting`; the flows pick the champion).

A planner is any callable `planner(request) -> ((D, P), details)` with a `name`; `details` is a JSON-able mapping
that goes into the job's log and `PlanInfo.details` (the liveput plan's `to_dict()`, where a handed plan came from,
...). A decision that cannot run — D*P above the instances alive, P above the model's layers, D above the global
batch — raises `PlanError` naming the planner and the decision: it is never silently replaced by another.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from liveput import DEFAULT_INTERVAL_S, DEFAULT_LOOK_AHEAD, Trigger
from trainer.runtime.migration import PlanError, check_strategy

if TYPE_CHECKING:
    import pandas as pd

    from liveput import CostModel, IntervalForecast, Strategy, ThroughputProfile
    from trainer.config import JobConfig
    from trainer.observe.profile import RuntimeProfile

log = logging.getLogger(__name__)

__all__ = [
    "PLANNERS",
    "Forecast",
    "HandPlanError",
    "HandedPlan",
    "HandedPlanner",
    "HistoryForecast",
    "LiveputPlanner",
    "PlanError",
    "PlanRequest",
    "Planner",
    "RulePlanner",
    "TraceForecast",
    "check_decision",
    "hand_plan",
    "infeasibility",
    "keep_strategy",
    "make_planner",
    "observed_change",
    "observed_persistence",
    "plan_info_dict",
    "profile_cut",
]

#: The planner kinds `make_planner` builds (`parcae train --planner`, the train flow's ``planner``).
PLANNERS: Final = ("rule", "liveput", "handed")


@dataclass(frozen=True)
class HandedPlan:
    """A plan handed to the running job from outside (`hand_plan`). `sent_at` is the sender's clock, `received_at`
    the driver's (when it read the plan from the store); `seq` numbers the plans handed to the job, from 1."""

    strategy: Strategy
    source: str
    seq: int
    sent_at: float
    received_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": list(self.strategy), "source": self.source, "seq": self.seq, "sent_at": self.sent_at,
                "received_at": self.received_at}  # fmt: skip


@dataclass(frozen=True)
class PlanRequest:
    """What the driver tells the planner at the boundary before step `step`, the start of interval `interval`.

    `alive`: the instances alive for the coming interval, after this boundary's availability events (added ones
    in, preempted ones out; an instance that will be killed without notice during the interval is still alive —
    nobody knows yet). `current`: the (D, P) training now. `history`: the alive count at each interval boundary
    since the job (re)started, this one last (`history[-1] == alive`; the first entry is the count it started
    with). `n_layers`, `global_batch`: the model's layer count and the batch (P and D cannot exceed them).
    `handed`: the latest plan handed in from outside, if any (only `HandedPlanner` reads it). `noticed`: the
    preemptions the cloud has noticed already in the intervals after the coming one — ``noticed[j]`` instances leave
    at the start of interval ``interval + 1 + j`` —, as many intervals as the planner's `notices_ahead` asks (a
    replay's schedule gives its preemptions with notice there, as a cloud's notices would have told them).
    """

    interval: int
    step: int
    alive: int
    current: Strategy
    history: tuple[int, ...]
    n_layers: int
    global_batch: int
    handed: HandedPlan | None = None
    noticed: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.alive < 1:
            raise ValueError(f"a plan request needs at least one instance alive, got {self.alive}")
        if not self.history or self.history[-1] != self.alive:
            raise ValueError(f"history must end with the alive count {self.alive}, got {self.history}")


@runtime_checkable
class Planner(Protocol):
    """Decides the strategy of the coming interval; `details` are logged with the decision."""

    name: str

    def __call__(self, req: PlanRequest) -> tuple[Strategy, Mapping[str, Any]]: ...


def plan_info_dict(info: Any) -> dict[str, Any]:
    """A `trainer.observe.observer.PlanInfo` as plain JSON-able data (the job's log, `run_job`'s result["plans"])."""
    return {"interval": info.interval, "step": info.step, "alive": info.alive, "current": list(info.current),
            "decision": list(info.decision), "decision_s": info.decision_s, "planner": info.planner,
            "details": dict(info.details)}  # fmt: skip


# ------------------------------------------------------------------------------------------------ feasibility


def _as_strategy(decision: Any) -> Strategy | None:
    try:
        d, p = decision
        if int(d) != d or int(p) != p:
            return None
        return int(d), int(p)
    except (TypeError, ValueError):
        return None


def infeasibility(decision: Any, req: PlanRequest) -> str | None:
    """Why `decision` cannot run in the interval `req` describes, or None if it can."""
    s = _as_strategy(decision)
    if s is None:
        return f"{decision!r} is not a strategy (D, P) of two integers"
    if s == (0, 0):
        return "(0, 0) means idle: the runtime does not stop a job"
    try:
        check_strategy(s[0], s[1], req.alive, req.n_layers, req.global_batch)
    except PlanError as e:
        return str(e)
    return None


def check_decision(planner: str, decision: Any, req: PlanRequest) -> Strategy:
    """`decision` as a (D, P) tuple, or `PlanError` naming the planner, the decision and why it cannot run."""
    why = infeasibility(decision, req)
    if why is not None:
        raise PlanError(f"planner {planner!r} decided {decision!r} at the boundary before step {req.step} "
                        f"(interval {req.interval}, {req.alive} instances alive): {why}")  # fmt: skip
    s = _as_strategy(decision)
    assert s is not None
    return s


def keep_strategy(req: PlanRequest) -> Strategy:
    """Keep the current strategy; if the instances no longer allow it, keep P and as many replicas as fit (one
    pipeline of as many stages as instances when fewer than P remain) — what the coordinator does unplanned."""
    d, p = req.current
    if d * p <= req.alive:
        return d, p
    if req.alive >= p:
        return min(req.alive // p, req.global_batch), p
    return 1, min(req.alive, req.n_layers)


# ------------------------------------------------------------------------------------------------ planners


class RulePlanner:
    """The trace replay's fixed rule (`trainer.control.schedules.trace_strategy`): two stages once two instances are
    alive, as many replicas as fit. What a planned job does by default."""

    name = "rule"

    def __call__(self, req: PlanRequest) -> tuple[Strategy, Mapping[str, Any]]:
        from trainer.control.schedules import trace_strategy

        return trace_strategy(req.alive, req.n_layers, req.global_batch), {"rule": "trace_strategy"}


Forecast = Callable[[PlanRequest, int], "list[IntervalForecast]"]
"""``forecast(req, k)``: the K = ``k`` `liveput.scenarios.IntervalForecast`s a `LiveputPlanner` plans over at the
boundary `req` describes, the first for the coming interval (its `prev_available` and events: the change from the
previous boundary's count to this one's, `observed_change`). A forecast may say where its latest forecasts came
from — a model's name, or why persistence stood in — in a ``last`` attribute (str); the planner records it in the
decision's details as ``"forecast"`` (`observed_persistence` as "persistence", another function by its name)."""


def observed_change(req: PlanRequest) -> IntervalForecast:
    """The coming interval as the job sees it at this boundary: it starts from the previous boundary's count and
    brings the change already observed (adds, preemptions, kills since), so the planner prices the migration that
    change forces. The first interval of every forecast here."""
    from liveput import IntervalForecast

    now = req.history[-1]
    before = req.history[-2] if len(req.history) > 1 else now
    return IntervalForecast.point(before, max(0, now - before), max(0, before - now))


def observed_persistence(req: PlanRequest, k: int) -> list[IntervalForecast]:
    """`liveput.persistence_forecast` of the alive count, after the change observed at this boundary
    (`observed_change`), which is the first interval's event."""
    from liveput import persistence_forecast

    return persistence_forecast(req.alive, k, first=observed_change(req))


class _FittedForecast:
    """What `TraceForecast` and `HistoryForecast` share: a fitted model's K-1 intervals after the observed change,
    and persistence — said in `last` — where the model refuses the history."""

    forecaster: Any
    last: str

    @property
    def model(self) -> str:
        return str(getattr(self.forecaster, "name", type(self.forecaster).__name__))

    def _observed_only(self, req: PlanRequest) -> list[IntervalForecast]:
        self.last = "observed change only (look-ahead 1)"
        return [observed_change(req)]

    def _predict(self, req: PlanRequest, k: int, past: pd.DataFrame, what: str) -> list[IntervalForecast] | None:
        """The K intervals from the model's forecast of `past`, or None (and `last` says why) when it refuses it."""
        from liveput import IntervalForecast

        try:
            forecast = self.forecaster.predict(past, k - 1)
        except ValueError as exc:  # e.g. a history shorter than the forecaster's window
            self.last = f"persistence: {self.model} refused {what} ({exc})"
            log.info("interval %d: %s", req.interval, self.last)
            return None
        self.last = str(forecast.model)
        return [observed_change(req), *IntervalForecast.from_forecast(forecast)]


@dataclass
class TraceForecast(_FittedForecast):
    """Parcae's availability predictor for a replayed trace (reference §A.3): a fitted forecasting model
    (`forecasting.forecast.Forecaster`, e.g. the registry's champion) predicting from the trace's past.

    The first of the K intervals is `observed_change`; the K-1 after it are ``forecaster.predict(past, K-1)``, where
    ``past`` is `table` up to the interval whose change the job has just seen: the replay starts at trace interval
    `start_interval` and applies interval ``start_interval + i``'s change at the boundary of interval ``i + 1``
    (`trainer.control.schedules.trace_schedule`), so the past of the boundary of ``req.interval`` is
    ``table[: start_interval + req.interval]``. `table` is the trace scaled to the job's instances, as the replay
    scales it (`of_trace`).

    When the model cannot forecast the job's situation — the trace's past does not end at the alive count the job
    sees (the replay keeps one instance where the trace has none; the trace has run out), or the forecaster refuses
    the history (shorter than its window) — that decision is planned with `observed_persistence` and `last` says
    why, and the planner records it in the decision's details ("forecast"): never silently.
    """

    forecaster: Any
    table: pd.DataFrame
    start_interval: int = 0
    last: str = field(default="", init=False)

    @classmethod
    def of_trace(
        cls, forecaster: Any, trace: str | pd.DataFrame, workers: int, start_interval: int = 0
    ) -> TraceForecast:
        """The forecast of a replay of ``trace`` (a name or path for `forecasting.traces.load_trace`, or its table) on
        ``workers`` instances from ``start_interval``, scaled as `trainer.control.schedules.trace_schedule` scales
        it."""
        from forecasting import load_trace, scale_trace

        table = load_trace(trace) if isinstance(trace, str) else trace
        if not 0 <= start_interval < len(table):
            raise ValueError(f"start_interval {start_interval} outside the trace's {len(table)} intervals")
        return cls(forecaster, scale_trace(table, workers), start_interval)

    def __call__(self, req: PlanRequest, k: int) -> list[IntervalForecast]:
        if k == 1:
            return self._observed_only(req)
        past = self.table.iloc[: self.start_interval + req.interval]
        seen = None if past.empty else int(past["available"].iloc[-1])
        if seen != req.alive:
            upto = self.start_interval + req.interval - 1
            self.last = (f"persistence: the trace's past (to interval {upto}) ends at "
                         f"{'nothing' if seen is None else seen}, the job has {req.alive} alive")  # fmt: skip
            log.info("interval %d: %s", req.interval, self.last)
            return observed_persistence(req, k)
        return self._predict(req, k, past, "the history") or observed_persistence(req, k)


@dataclass
class HistoryForecast(_FittedForecast):
    """The availability predictor of a live fleet: a fitted forecasting model (the registry's champion)
    predicting from the job's own history — the alive count at each interval boundary (`PlanRequest.history`) as a
    canonical table of `capacity` instances (`forecasting.counts_table`) — never from a trace.

    The first of the K intervals is `observed_change`, the K-1 after it the model's. While the history is shorter
    than the model's window (or the model refuses it otherwise), the decision is planned with
    `observed_persistence` and `last` says why (the decision's details: "forecast").
    """

    forecaster: Any
    capacity: int
    interval_s: float = DEFAULT_INTERVAL_S
    last: str = field(default="", init=False)

    def __call__(self, req: PlanRequest, k: int) -> list[IntervalForecast]:
        from forecasting import counts_table

        if k == 1:
            return self._observed_only(req)
        past = counts_table(req.history, max(self.capacity, *req.history), self.interval_s, name="fleet")
        out = self._predict(req, k, past, f"the fleet's history of {len(req.history)} intervals")
        if out is None:
            return observed_persistence(req, k)
        self.last += " on the fleet's history"
        return out


def _forecast_name(forecast: Any) -> str:
    """How a decision's details name the forecasts it planned with (`Forecast`'s ``last``)."""
    if forecast is observed_persistence:
        return "persistence"
    last = getattr(forecast, "last", None)
    return str(last) if last else str(getattr(forecast, "__name__", type(forecast).__name__))


class LiveputPlanner:
    """The liveput optimizer (`liveput.plan_interval`): the strategy that maximises the expected samples over the
    next `look_ahead` intervals of `interval_s` seconds, migration costs included; only the first decision is
    applied (receding horizon).

    `profile` and `cost` describe the runtime's model (e.g. tiny-gpt as measured by `parcae profile`); the
    scenario tables (`liveput.scenarios.ScenarioStore`) are built once and cached across decisions. `forecast`
    (a `Forecast`) gives the K interval forecasts at each boundary (default `observed_persistence`). Details: the
    plan's `to_dict()` (decision, expected samples, the K steps, the alternatives, decision time), the ``model``,
    ``look_ahead`` and ``interval_s`` it planned with, ``forecast`` (where the forecasts came from) and
    ``intervals`` (the forecasts: per interval, the instances before it and its law over (n_in, n_out, prob)), and
    ``noticed`` where the request has notices.

    `notices_ahead`: for a job that prepares noticed preemptions (`cost.preparation`), how many intervals after the
    coming one the cloud's notice reaches (AWS's 120 s over 60 s intervals: 2) — the request's `noticed` then
    replaces the forecast's preemptions there (`liveput.with_noticed`), as the simulator's `parcae` policy plans.
    """

    name = "liveput"

    def __init__(
        self, profile: ThroughputProfile, cost: CostModel, *, forecast: Forecast | None = None,
        pricing: str | None = None, **horizon: Any,
    ) -> None:  # fmt: skip
        """`horizon`: ``look_ahead`` (K) and ``interval_s`` (T), as `liveput.PlannerConfig` takes them (its defaults,
        its checks); `pricing`: how migrations are priced, in a sentence for each decision's details (default: what
        `cost.preparation` says)."""
        from liveput import PlannerConfig, ScenarioStore

        self.profile, self.cost = profile, cost
        self.pricing = pricing or f"migrations priced as {cost.preparation.describe()}"
        self.config = PlannerConfig(**horizon)
        self.store = ScenarioStore(profile, cost)
        self.forecast: Forecast = forecast or observed_persistence
        prep = cost.preparation
        noticing = prep.notice_s > 0 and prep.prepares(Trigger.NOTICE)
        self.notices_ahead = int(prep.notice_s // self.config.interval_s) if noticing else 0

    def __call__(self, req: PlanRequest) -> tuple[Strategy, Mapping[str, Any]]:
        from liveput import JobState, plan_interval, with_noticed

        forecast = list(self.forecast(req, self.config.look_ahead))
        noticed = req.noticed[: self.notices_ahead]
        if noticed:  # (the first interval is the change seen at this boundary: known already)
            forecast = [forecast[0], *with_noticed(forecast[1:], noticed)]
        d, p = req.current
        result = plan_interval(forecast, JobState(strategy=(d, p)), self.profile, self.cost,
                               interval_s=self.config.interval_s, store=self.store)  # fmt: skip
        details = {
            "model": getattr(self.profile, "model", None),
            "look_ahead": self.config.look_ahead,
            "interval_s": self.config.interval_s,
            "forecast": _forecast_name(self.forecast),
            "migrations": self.pricing,
            "intervals": [{"prev_available": f.prev_available, "events": [list(e) for e in f.events]}
                          for f in forecast],
            **({"noticed": list(noticed)} if noticed else {}),
            **result.to_dict(),
        }  # fmt: skip
        return check_decision(self.name, result.decision, req), details


class HandedPlanner:
    """The latest plan handed in from outside (`hand_plan`, e.g. by the Prefect `plan_interval` flow) if it can run
    in the coming interval; else `fallback`'s decision; else the current strategy (`keep_strategy`).

    A handed plan stands until another replaces it (a late flow run leaves the previous plan in force) — or, with
    `max_age_s`, until it is that old (received that long ago): the job's own `fallback` decides again when no
    fresh plan arrives in time. One that cannot run with the instances alive at a boundary is rejected there — not
    applied, and the reason is in the details ("rejected") the driver logs and in a warning — and considered again
    at the next boundary. Details: "source" ("handed", the fallback's name, or "keep"), "handed" (the plan applied:
    who sent it, when it was sent and received), "rejected", "stale" (a plan past its age), "fallback" (the
    fallback's details).
    """

    accepts_handed = True  # the driver lets `hand_plan` clients write to the job only for such a planner

    def __init__(self, fallback: Planner | None = None, max_age_s: float | None = None) -> None:
        if max_age_s is not None and not max_age_s > 0:
            raise ValueError(f"max_age_s must be > 0 seconds or None, got {max_age_s!r}")
        self.fallback, self.max_age_s = fallback, max_age_s
        self.notices_ahead: int = getattr(fallback, "notices_ahead", 0)  # (what its fallback plans with)
        self.name = "handed" if fallback is None else f"handed+{fallback.name}"

    def __call__(self, req: PlanRequest) -> tuple[Strategy, Mapping[str, Any]]:
        details: dict[str, Any] = {}
        h = req.handed
        if h is not None and self.max_age_s is not None and time.time() - h.received_at > self.max_age_s:
            details["stale"] = {**h.to_dict(), "max_age_s": self.max_age_s}
            h = None
        if h is not None:
            why = infeasibility(h.strategy, req)
            if why is None:
                return h.strategy, {"source": "handed", "handed": h.to_dict()}
            details["rejected"] = {**h.to_dict(), "reason": why}
            log.warning("boundary before step %d: the plan %s handed in by %r is rejected: %s", req.step,
                        h.strategy, h.source, why)  # fmt: skip
        if self.fallback is not None:
            decision, more = self.fallback(req)
            return decision, {"source": self.fallback.name, "fallback": dict(more), **details}
        return keep_strategy(req), {"source": "keep", **details}


# ------------------------------------------------------------------------------------------------ by kind


def make_planner(
    kind: str,
    *,
    profile: RuntimeProfile | None = None,
    forecaster: Any = None,
    trace: str | pd.DataFrame | None = None,
    workers: int | None = None,
    start_interval: int = 0,
    look_ahead: int = DEFAULT_LOOK_AHEAD,
    interval_s: float = DEFAULT_INTERVAL_S,
    model: str | None = None,
    fleet: int | None = None,
    accept_plans_for_s: float | None = None,
    notice_s: float | None = None,
) -> tuple[Planner, str]:
    """The live planner of kind ``kind`` (one of `PLANNERS`) and, in a sentence, the forecasts it plans with (for a
    run's tags and the job's report) — how `parcae train` and the train flow build their planner.

    ``rule``: `RulePlanner`. ``handed``: `HandedPlanner` (plans handed in with `hand_plan`, e.g. by plan-interval
    flow runs; the current strategy until one arrives). ``liveput``: `LiveputPlanner` on the runtime ``profile``
    (`trainer.observe.profile.RuntimeProfile`, what `parcae profile` writes; of ``model`` when that is given) over
    ``look_ahead`` intervals of ``interval_s`` seconds, forecasting with ``forecaster`` (a fitted
    `forecasting.forecast.Forecaster`; a learned one behind the online skill gate, `forecasting.skill_gated`) on
    the past of the replayed ``trace`` scaled to ``workers`` instances from ``start_interval`` (`TraceForecast`)
    — or, for a live fleet of up to ``fleet`` instances, on the fleet's own history (`HistoryForecast`) —, or with
    `observed_persistence` when no forecaster is given. ``notice_s``: the job prepares its migrations in the
    background (`ControlPlaneConfig.prepare`) and its provider's notices come that long ahead: liveput prices each
    move as prepared, its old strategy slowed by what the profile measured (`RuntimeProfile.preparation`); None,
    or a profile without that measurement (said in the sentence): the reference's full stop. The other kinds
    ignore ``profile``, ``forecaster``, ``trace`` and ``fleet``. With ``accept_plans_for_s``, a rule or liveput
    planner also takes plans handed in from outside (the scheduled plan-interval flow's): each stands that many
    seconds, and the planner decides again when no fresh one has come (`HandedPlanner`'s fallback).

    Raises ValueError naming the fix: an unknown kind, a liveput planner without a profile or with another model's,
    a forecaster without the trace (and instances) it forecasts.
    """
    if accept_plans_for_s is not None and kind != "handed":
        own, what = make_planner(kind, profile=profile, forecaster=forecaster, trace=trace, workers=workers,
                                 start_interval=start_interval, look_ahead=look_ahead, interval_s=interval_s,
                                 model=model, fleet=fleet, notice_s=notice_s)  # fmt: skip
        return HandedPlanner(own, max_age_s=accept_plans_for_s), handed_in(accept_plans_for_s, what)
    if kind == "rule":
        return RulePlanner(), "none (the rule planner: two stages once two are alive, as many replicas as fit)"
    if kind == "handed":
        return HandedPlanner(), "none in the job (plans are handed in from outside, e.g. by plan-interval flow runs)"
    if kind != "liveput":
        raise ValueError(f"unknown planner {kind!r}; choose one of {', '.join(PLANNERS)}")
    if profile is None:
        raise ValueError("the liveput planner needs a runtime profile of the trainer (--profile PATH; the train "
                         "flow's `profile`): measure one with `parcae profile`")  # fmt: skip
    throughput = profile.throughput
    if model is not None and throughput.model != model:
        raise ValueError(f"the runtime profile is of model {throughput.model!r}, the job trains {model!r}: measure "
                         f"one with `parcae profile --model {model}`")  # fmt: skip
    # a learned model's point forecast is kept only where it has beaten persistence on the past the job has seen
    from forecasting import skill_gated

    if forecaster is None:
        forecast: Forecast = observed_persistence
        what = "persistence (the alive count stays; the change seen at each boundary is priced)"
    elif fleet is not None:
        if trace is not None:
            raise ValueError("a live fleet's forecasts come from its own history, not a trace: give one or the other")
        forecast = HistoryForecast(skill_gated(forecaster), fleet, interval_s)
        what = (f"{forecast.model} on the fleet's own history (persistence while it is too short, said in each "
                "decision's details)")  # fmt: skip
    else:
        if trace is None or workers is None:
            raise ValueError("a forecaster forecasts from the replayed trace's past: give the trace and the job's "
                             "instances (workers), or no forecaster (persistence)")  # fmt: skip
        source = TraceForecast.of_trace(skill_gated(forecaster), trace, workers, start_interval)
        name = trace if isinstance(trace, str) else str(trace.attrs.get("name", "the trace"))
        forecast = source
        what = (f"{source.model} on {name}'s past (persistence where it cannot forecast, said in each decision's "
                "details)")  # fmt: skip
    cost, pricing = profile.cost_model(), None
    if notice_s is not None:
        from trainer.observe.profile import ProfileFormatError

        try:
            cost = profile.cost_model(profile.preparation(notice_s))
        except ProfileFormatError as exc:  # priced as full stops (an upper bound), and said in every decision
            pricing = (f"migrations priced as {cost.preparation.describe()}, although the job prepares them: the "
                       f"runtime profile's {exc}")  # fmt: skip
    planner = LiveputPlanner(throughput, cost, look_ahead=look_ahead, interval_s=interval_s,
                             forecast=forecast, pricing=pricing)  # fmt: skip
    return planner, what


def handed_in(stands_s: float, own: str) -> str:
    """The forecasts of a planner that takes plans handed in, each standing `stands_s`, else plans with `own`."""
    return f"handed in from outside when fresh (each stands {stands_s:g} s); else {own}"


def plans_stand_s(config: JobConfig) -> float | None:
    """How long a plan handed in to the job `config` describes stands (two of its intervals), None where it takes
    none (``planning.accept_plans``)."""
    return 2 * config.availability.interval_seconds if config.planning.accept_plans else None


def planned_interval_s(config: JobConfig) -> float:
    """The seconds one planned interval stands for in the job `config` describes: a trace replay's and the local
    market's are the trace's own (60 s), whatever ``interval_seconds`` compresses them to; a real fleet's and an
    events file's are ``interval_seconds`` of wall time."""
    av = config.availability
    return DEFAULT_INTERVAL_S if av.trace is not None or config.provider.name == "market" else av.interval_seconds


def job_planner(config: JobConfig, *, profile: RuntimeProfile | None = None,
                forecaster: Any = None) -> tuple[Planner | None, str]:  # fmt: skip
    """`make_planner` for the job `config` describes — its planner, look-ahead, trace or fleet, instances, interval
    (`planned_interval_s`), whether it takes plans handed in (each standing two intervals) and whether it prepares
    its migrations (then its notices come ``control.notice_grace_s`` ahead) — with the runtime `profile` and the
    `forecaster` the caller loaded: how `parcae train` and the train flow build a job's planner. None where the job
    has none (``planning.planner`` None: an events file's own plans)."""
    plan, av = config.planning, config.availability
    if plan.planner is None:
        return None, "none (the events file's own plans)"
    return make_planner(
        plan.planner, profile=profile, forecaster=forecaster, trace=av.trace, workers=av.workers,
        start_interval=av.start_interval, look_ahead=plan.look_ahead, interval_s=planned_interval_s(config),
        model=config.model.name, fleet=config.fleet.max_instances,
        accept_plans_for_s=plans_stand_s(config),
        notice_s=config.control.notice_grace_s if config.control.prepare else None,
    )  # fmt: skip


def profile_cut(config: JobConfig, profile: RuntimeProfile) -> tuple[JobConfig, list[str]]:
    """`config` with its stages cut by the per-layer times ``profile`` measured (`TrainConfig.stage_costs`), and
    what the user should be told of the profile. Its iteration times were measured on that cut, so a job that plans
    with them trains on it too. A profile without the times (an older parcae's) leaves the cut to the spec's hints
    or parameter counts, and a profile measured on another kind of device than the job's prices another machine:
    both are said. A profile of a model with another layer count is a ValueError naming the fix."""
    from trainer.observe.profile import ProfileFormatError
    from trainer.runtime.devices import device_type
    from trainer.runtime.model import n_layers

    layers = n_layers(config.model)
    if len(profile.spec.layers) != layers:
        raise ValueError(f"the runtime profile is of a model with {len(profile.spec.layers)} layers, the job's has "
                         f"{layers}: measure one with `parcae profile --model {config.model.name}` and the job's "
                         "--model-args")  # fmt: skip
    told = []
    job_device = device_type(config.train.device)  # (whether this machine has it is checked where it trains)
    if profile.device_type != job_device:
        told.append(f"the runtime profile was measured on {profile.device_type}, the job trains on {job_device}: its "
                    "iteration times and migration costs are another machine's; measure one with `parcae profile "
                    f"--device {job_device}`")  # fmt: skip
    try:
        costs = profile.stage_costs()
    except ProfileFormatError as exc:
        told.append(f"stages cut by the spec's cost hints or parameter counts: the runtime profile's {exc}")
        return config, told
    return config.replace(train={"stage_costs": costs}), told


# ------------------------------------------------------------------------------------------------ handing plans in


class HandPlanError(RuntimeError):
    """A plan could not be handed to a running job: the coordinator is unreachable, refuses the token, runs another
    job, takes no handed plans or has finished, or the plan cannot run on its model."""


def hand_plan(
    host: str,
    port: int,
    strategy: Sequence[int],
    *,
    job: str,
    token: str | None = None,
    source: str = "",
    timeout_s: float = 10.0,
) -> None:
    """Hand `strategy` = (D, P) to the job `job` whose coordinator listens at `host:port`; its `HandedPlanner`
    applies it from the next interval boundary on (if the instances alive then allow it).

    The client authenticates as a worker does (`token` must open the job's sealed store, `trainer.runtime.store`; a job
    started by `run_job` keeps it in `out_dir/token`) and checks the job's name,
    that the job takes handed plans and that P and D fit the model and batch; any refusal raises `HandPlanError`
    saying which. `source` names the sender in the job's log (e.g. the flow run).
    """
    from trainer.runtime import keys
    from trainer.runtime.model import n_layers as layer_count
    from trainer.runtime.spec import JobSpec
    from trainer.runtime.store import StoreAuthError, connect_store

    s = _as_strategy(strategy)
    if s is None or min(s) < 1:
        raise HandPlanError(f"a plan is a strategy [D, P] of two integers >= 1, got {strategy!r}")
    where = f"coordinator at {host}:{port}"
    try:
        store = connect_store(host, port, token, timeout_s)
    except StoreAuthError as e:
        raise HandPlanError(f"{e}; the plan was not handed in") from None
    except (RuntimeError, OSError) as e:  # DistNetworkError / DistStoreError are RuntimeErrors
        raise HandPlanError(f"cannot reach the {where} within {timeout_s:g} s: {e}") from None
    spec = JobSpec.from_json(store.get(keys.JOB_SPEC))
    if spec.job != job:
        raise HandPlanError(f"the {where} runs job {spec.job!r}, not {job!r}; the plan was not handed in")
    if store.check([keys.DONE]) or store.check([keys.ABORT]):
        raise HandPlanError(f"job {job!r} at the {where} has ended; the plan was not handed in")
    if not store.check([keys.ACCEPTS]):
        raise HandPlanError(f"job {job!r} at the {where} takes no handed plans (its driver runs without a "
                            "HandedPlanner); the plan was not handed in")  # fmt: skip
    d, p = s
    try:
        check_strategy(d, p, d * p, layer_count(spec.model), spec.train.global_batch)
    except PlanError as e:
        raise HandPlanError(f"job {job!r} cannot run this plan: {e}") from None
    i = store.add(keys.HANDED_SEQ, 1)
    store.set(keys.handed(i), json.dumps({"strategy": [d, p], "source": source, "sent_at": time.time()}))
