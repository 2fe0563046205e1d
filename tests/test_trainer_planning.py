"""Tests of the live planning hook: the planners (rule, liveput, handed), the forecasts a liveput planner plans with
(persistence, a fitted forecaster on the replayed trace's past) and `make_planner` as plain functions, the
feasibility check, handing plans to a coordinator (authentication, job, feasibility), and two real jobs — a trace
replay whose strategy the liveput optimizer decides at every interval boundary from a fitted LightGBM forecaster's
forecasts (it must still train exactly the uninterrupted run), and a job that changes its strategy when a plan is
handed to it from outside.

The liveput planner is given a small hand-made profile of tiny-gpt (iteration times per D x P, up to 5 instances)
and a cost model built from tiny-gpt's real per-layer parameter counts, as `parcae profile` would measure them.
"""

from __future__ import annotations

from dataclasses import replace

from tracking import plan_metrics

import numpy as np
import pytest
import torch
from _flow_fixtures import runtime_profile_file
from _jobs import coordinator, run_job, train
from _reference import uninterrupted
from _tables import canonical_table
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)

from forecasting.baselines import PersistenceForecaster
from forecasting.lgbm import LightGbmForecaster
from forecasting.skill_gate import skill_gated
from forecasting.traces import counts_table, load_trace, scale_trace
from liveput import CostConstants, CostModel, IntervalForecast, Layer, ModelSpec, ThroughputProfile
from trainer.config import TrainConfig, model_config
from trainer.control.dry_run import ScheduleError
from trainer.control.planning import (
    PLANNERS,
    HandedPlan,
    HandedPlanner,
    HandPlanError,
    HistoryForecast,
    LiveputPlanner,
    PlanError,
    PlanRequest,
    RulePlanner,
    TraceForecast,
    check_decision,
    hand_plan,
    keep_strategy,
    make_planner,
    observed_change,
    observed_persistence,
)
from trainer.control.schedules import trace_schedule, trace_strategy
from trainer.observe.observer import JobObserver, ObserverList, PlanInfo, RecordingObserver
from trainer.observe.profile import RuntimeProfile
from trainer.runtime import checkpoint
from trainer.runtime.migration import layer_sizes
from trainer.runtime.model import layer_names, n_layers
from trainer.runtime.store import read_token_file

CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()
N = n_layers(CFG)  # 6


@pytest.fixture(autouse=True)
def _no_orphans_here(_no_orphans):
    yield


def tiny_profile() -> ThroughputProfile:
    """Iteration times of tiny-gpt per D x P (P <= 3, D*P <= 5): more replicas are faster, stages cost a little."""
    table = {(d, p): 400.0 / (d * p**0.8) + 20.0 * p for p in (1, 2, 3) for d in range(1, 5) if d * p <= 5}
    return ThroughputProfile("tiny-gpt", global_batch=TRAIN.global_batch, micro_batch=TRAIN.micro_batch,
                             iteration_ms=table)  # fmt: skip


def tiny_cost() -> CostModel:
    spec = ModelSpec("tiny-gpt", tuple(Layer(n, p) for n, p in zip(layer_names(CFG), layer_sizes(CFG).params)))
    constants = CostConstants(rendezvous_ms=2000.0, proc_ms=100.0, group_base_ms=10.0, group_mode="instances",
                              group_add_ms=50.0, group_remove_ms=10.0, build_ms={p: 30.0 for p in range(1, 6)},
                              checkpoint_ms=500.0)  # fmt: skip
    return CostModel(spec, constants)


def tiny_runtime_profile() -> RuntimeProfile:
    """`tiny_profile` and `tiny_cost` as the runtime profile `parcae profile` writes."""
    cost = tiny_cost()
    return RuntimeProfile(tiny_profile(), cost.constants, cost.spec, {}, "", "test input")


def request(history: tuple[int, ...], current: tuple[int, int], interval: int | None = None, **kw) -> PlanRequest:
    interval = len(history) - 1 if interval is None else interval
    return PlanRequest(interval=interval, step=4 * interval, alive=history[-1], current=current, history=history,
                       n_layers=N, global_batch=TRAIN.global_batch, **kw)  # fmt: skip


@pytest.fixture(scope="module")
def lightgbm() -> LightGbmForecaster:
    """A LightGBM forecaster fitted (small and seeded) on gcp-v100, for up to 3 intervals ahead."""
    return LightGbmForecaster(horizon_max=3, n_estimators=20, min_child_samples=20, max_rows=2000, seed=0).fit(
        [load_trace("gcp-v100")]
    )


# ------------------------------------------------------------------------------------------------ planners


def test_plan_request_and_feasibility():
    with pytest.raises(ValueError, match="history must end with the alive count 3"):
        PlanRequest(1, 4, 3, (1, 2), (4, 4), N, 16)
    with pytest.raises(ValueError, match="at least one instance"):
        PlanRequest(1, 4, 0, (1, 2), (4, 0), N, 16)
    req = request((4, 5), (2, 2))
    assert check_decision("p", (2, 2), req) == (2, 2) and check_decision("p", [1, 5], req) == (1, 5)
    for decision, why in [
        ((3, 2), r"needs 6 instances, only 5 are alive"),
        ((1, 7), r"P=7 exceeds the model's 6 layers"),
        ((0, 0), r"\(0, 0\) means idle"),
        ((1.5, 2), r"is not a strategy"),
        ("2x2", r"is not a strategy"),
    ]:
        prefix = r"planner 'p' decided .* before step 4 \(interval 1, 5 instances alive\): .*"
        with pytest.raises(PlanError, match=prefix + why):
            check_decision("p", decision, req)
    wide = PlanRequest(1, 4, 20, (1, 1), (20, 20), N, 16)
    with pytest.raises(PlanError, match="D=17 replicas exceed global_batch=16"):
        check_decision("p", (17, 1), wide)


def test_rule_and_keep():
    rule = RulePlanner()
    for n in (1, 2, 3, 5, 40):
        decision, details = rule(request((n, n), (1, 1)))
        assert decision == trace_strategy(n, N, 16) and details == {"rule": "trace_strategy"}
    assert keep_strategy(request((4, 4), (2, 2))) == (2, 2)
    assert keep_strategy(request((4, 3), (2, 2))) == (1, 2)  # P kept, D shrinks
    assert keep_strategy(request((4, 1), (2, 2))) == (1, 1)  # fewer than P instances: one pipeline that fits


def test_persistence_forecast_prices_the_change_just_observed():
    assert observed_persistence(request((4, 3), (1, 2)), 3) == [
        IntervalForecast.point(4, 0, 1),
        IntervalForecast.point(3),
        IntervalForecast.point(3),
    ]
    assert observed_persistence(request((2,), (1, 2)), 2) == [IntervalForecast.point(2)] * 2
    assert observed_persistence(request((2, 5), (1, 2)), 1) == [IntervalForecast.point(2, 3, 0)]
    assert observed_change(request((4, 4, 1), (1, 2))) == IntervalForecast.point(4, 0, 3)


def test_liveput_planner_decides_feasible_strategies_from_the_history():
    planner = LiveputPlanner(tiny_profile(), tiny_cost(), look_ahead=4, interval_s=2.0)
    for history, current in [((4, 4), (2, 2)), ((4, 3), (2, 2)), ((4, 2), (2, 2)), ((3, 4), (1, 2)), ((2, 1), (1, 2))]:
        req = request(history, current)
        decision, details = planner(req)
        assert check_decision("liveput", decision, req) == decision, (history, decision)
        assert details["decision"] == list(decision) and len(details["steps"]) == 4
        assert planner(req)[0] == decision  # deterministic
    # more replicas are faster in this profile, and 4 instances stay: all of them train
    decision, details = planner(request((4, 4), (2, 2)))
    assert decision == (4, 1)
    # what it planned with is in the details: enough for MLflow to compute the expected liveput
    assert details["model"] == "tiny-gpt" and details["look_ahead"] == 4 and details["interval_s"] == 2.0
    assert details["forecast"] == "persistence" and len(details["intervals"]) == 4
    assert details["intervals"][0] == {"prev_available": 4, "events": [[0, 0, 1.0]]}
    metrics = plan_metrics(details)
    assert metrics["expected_liveput"] == pytest.approx(details["expected_samples"] / (4 * 2.0))
    # the forecast is asked with the request
    seen = []

    def forecast(req, k):
        seen.append((req.interval, req.history, k))
        return observed_persistence(req, k)

    _, details = LiveputPlanner(tiny_profile(), tiny_cost(), look_ahead=3, forecast=forecast)(request((4, 3), (2, 2)))
    assert seen == [(1, (4, 3), 3)] and details["forecast"] == "forecast"  # a plain function: its name

    # a forecast that promises instances the job does not have: the decision cannot run, and says so
    def optimistic(req, k):
        return [IntervalForecast.point(5)] * k

    with pytest.raises(PlanError, match=r"planner 'liveput' decided \(\d, \d\) .* 2 instances alive\): .* only 2"):
        LiveputPlanner(tiny_profile(), tiny_cost(), forecast=optimistic)(request((2, 2), (1, 2)))


def test_trace_forecast_predicts_from_the_replayed_trace_s_past(lightgbm):
    """p3 scaled to 4 instances, replayed from interval 51: the boundary of interval i has seen interval 50+i's
    change, so the fitted forecaster predicts from the trace's intervals before 51+i."""
    table = scale_trace(load_trace("p3"), 4)
    source = TraceForecast.of_trace(lightgbm, "p3", 4, start_interval=51)
    assert source.table["available"].tolist() == table["available"].tolist() and source.model == "lightgbm"
    assert table["available"].iloc[50:62].tolist() == [4, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 3]
    req = request((4, 3, 3, 3, 3, 3, 3, 2), (1, 3))  # interval 7: trace interval 57's drop to 2 has just been seen
    got = source(req, 4)
    want = lightgbm.predict(table.iloc[:58], 3)
    assert got == [IntervalForecast.point(3, 0, 1), *IntervalForecast.from_forecast(want)]
    assert source.last == "lightgbm"
    assert source(req, 1) == [IntervalForecast.point(3, 0, 1)] and "look-ahead 1" in source.last

    # the job's count is not the trace's (a kill without notice is still alive when the boundary plans): persistence,
    # and why
    alive = request((4, 3, 3, 3, 3, 3, 3, 3), (1, 3))
    assert source(alive, 3) == observed_persistence(alive, 3)
    assert source.last == "persistence: the trace's past (to interval 57) ends at 2, the job has 3 alive"
    # the forecaster refuses the history (a look-ahead beyond what it was trained for): persistence, and why
    assert source(req, 5) == observed_persistence(req, 5)
    assert source.last.startswith("persistence: lightgbm refused the history (lightgbm: horizon must be in 1..3")
    # a replay that keeps one instance where the trace has none
    empty = TraceForecast(PersistenceForecaster(), canonical_table([2, 1, 0, 0], 2), start_interval=0)
    assert empty(request((2, 1, 1), (1, 1), interval=3), 2) == observed_persistence(request((2, 1, 1), (1, 1)), 2)
    assert empty.last == "persistence: the trace's past (to interval 2) ends at 0, the job has 1 alive"
    with pytest.raises(ValueError, match="start_interval 700 outside the trace's 683 intervals"):
        TraceForecast.of_trace(lightgbm, "p3", 4, start_interval=700)


def test_a_fleet_s_forecast_comes_from_its_own_history(lightgbm):
    """A live fleet has no trace: the champion predicts from the alive counts the job saw at its boundaries."""
    source = HistoryForecast(lightgbm, capacity=4)
    history = (2, 3, 4, 4, 3, 3, 2)
    req = request(history, (1, 2))
    got = source(req, 4)
    want = lightgbm.predict(counts_table(history, 4), 3)
    assert got == [IntervalForecast.point(3, 0, 1), *IntervalForecast.from_forecast(want)]
    assert source.last == "lightgbm on the fleet's history"
    assert counts_table(history, 4)["prev_available"].tolist() == [2, 2, 3, 4, 4, 3, 3]
    # beyond what the model was trained for: persistence, and why
    assert source(req, 5) == observed_persistence(req, 5)
    assert source.last.startswith("persistence: lightgbm refused the fleet's history of 7 intervals")
    planner, what = make_planner("liveput", profile=tiny_runtime_profile(), forecaster=lightgbm, fleet=4,
                                 look_ahead=3)  # fmt: skip
    assert what.startswith("lightgbm-gated on the fleet's own history")  # behind the online skill gate
    decision, details = planner(req)
    assert details["forecast"] == "lightgbm-gated on the fleet's history" and decision[0] * decision[1] <= 2
    # seven intervals are too short a past to trust the model's point forecast: persistence's, with its quantiles
    gated = HistoryForecast(skill_gated(lightgbm), capacity=4)
    assert gated(req, 4)[1:] == IntervalForecast.from_forecast(replace(want, point=np.full(3, 2.0), events=()))
    with pytest.raises(ValueError, match="its own history, not a trace"):
        make_planner("liveput", profile=tiny_runtime_profile(), forecaster=lightgbm, fleet=4, trace="p3")


def test_a_liveput_decision_records_its_forecast_source(lightgbm):
    planner, what = make_planner("liveput", profile=tiny_runtime_profile(), forecaster=lightgbm, trace="p3",
                                 workers=4, start_interval=51, look_ahead=3)  # fmt: skip
    assert what.startswith("lightgbm-gated on p3's past")
    _, details = planner(request((4, 3, 3, 3, 3, 3, 3, 2), (1, 3)))
    assert details["forecast"] == "lightgbm-gated" and details["look_ahead"] == 3 and details["interval_s"] == 60.0
    assert details["intervals"][0] == {"prev_available": 3, "events": [[0, 1, 1.0]]}
    _, details = planner(request((4, 3, 3, 3, 3, 3, 3, 3), (1, 3)))
    assert details["forecast"] == "persistence: the trace's past (to interval 57) ends at 2, the job has 3 alive"


def test_make_planner_builds_each_kind_and_names_the_fix(tmp_path, lightgbm):
    assert PLANNERS == ("rule", "liveput", "handed")
    rule, what = make_planner("rule")
    assert isinstance(rule, RulePlanner) and what.startswith("none")
    handed, what = make_planner("handed", profile=None)
    assert isinstance(handed, HandedPlanner) and handed.name == "handed" and "handed in" in what
    profile = RuntimeProfile.load(runtime_profile_file(tmp_path / "profile.json", fastest=(2, 1)))
    liveput, what = make_planner("liveput", profile=profile, model="tiny-gpt", look_ahead=2, interval_s=30.0)
    assert isinstance(liveput, LiveputPlanner) and what.startswith("persistence")
    assert liveput.config.look_ahead == 2 and liveput.config.interval_s == 30.0
    assert liveput(request((4, 4), (1, 2)))[0] == (2, 1)  # the profile's fastest strategy
    with pytest.raises(ValueError, match=r"unknown planner 'oracle'; choose one of rule, liveput, handed"):
        make_planner("oracle")
    with pytest.raises(ValueError, match=r"needs a runtime profile.*--profile PATH.*`parcae profile`"):
        make_planner("liveput", profile=None)
    with pytest.raises(ValueError, match=r"profile is of model 'tiny-gpt', the job trains 'small-gpt'.*--model small"):
        make_planner("liveput", profile=profile, model="small-gpt")
    with pytest.raises(ValueError, match="forecasts from the replayed trace's past: give the trace"):
        make_planner("liveput", profile=profile, forecaster=lightgbm)
    with pytest.raises(ValueError, match="look_ahead must be >= 1"):
        make_planner("liveput", profile=profile, look_ahead=0)


def test_a_job_s_planner_comes_from_its_config_alone(tmp_path):
    """`job_planner` (what `parcae train` and the train flow both call): the planner, look-ahead, handed-in plans and
    interval of the `JobConfig`; a replay's and the local market's intervals are the trace's 60 s whatever
    interval_seconds compresses them to, a real fleet's and an events file's are interval_seconds."""
    from trainer import JobConfig, job_planner, planned_interval_s

    profile = RuntimeProfile.load(runtime_profile_file(tmp_path / "profile.json", fastest=(2, 1)))
    replay = JobConfig().replace(availability={"trace": "p3", "interval_seconds": 0.5},
                                 planning={"planner": "liveput", "look_ahead": 3, "accept_plans": True})  # fmt: skip
    planner, what = job_planner(replay, profile=profile)
    assert isinstance(planner, HandedPlanner) and planner.max_age_s == 1.0 and "each stands 1 s" in what
    own = planner.fallback.config
    assert own.look_ahead == 3 and own.interval_s == 60.0 == planned_interval_s(replay)
    market = JobConfig().replace(provider={"name": "market"}, fleet={"max_instances": 2, "record_history": False})
    assert planned_interval_s(market.replace(availability={"interval_seconds": 0.5})) == 60.0
    for real in (market.replace(provider={"name": "aws"}), JobConfig()):  # a real fleet's; an events file's
        assert planned_interval_s(real.replace(availability={"interval_seconds": 30.0})) == 30.0
    rule, _ = job_planner(replay.replace(planning={"planner": "rule", "accept_plans": False}))
    assert isinstance(rule, RulePlanner)
    assert job_planner(JobConfig()) == (None, "none (the events file's own plans)")


def test_a_job_that_prepares_its_migrations_is_planned_with_the_profile_s_measured_preparation():
    """notice_s (the job prepares, its provider's notices come that long ahead): liveput prices moves as prepared,
    the old strategy slowed by the profile's measured slowdown; a profile without that measurement prices full stops
    and every decision says why; no notice_s: full stops (the reference's model)."""
    from dataclasses import replace as copy

    measured = copy(tiny_runtime_profile(), measured={"prepared": {"slowdown": 0.2}})
    planner, _ = make_planner("liveput", profile=measured, look_ahead=2, notice_s=120.0)
    prep = planner.cost.preparation
    assert prep.enabled and prep.notice_s == 120.0 and prep.slowdown == 0.2
    _, details = planner(request((4, 4), (1, 2)))
    assert details["migrations"] == f"migrations priced as {prep.describe()}"
    full, _ = make_planner("liveput", profile=measured, look_ahead=2)
    assert not full.cost.preparation.enabled and "full stop" in full(request((4, 4), (1, 2)))[1]["migrations"]
    old, _ = make_planner("liveput", profile=tiny_runtime_profile(), look_ahead=2, notice_s=120.0)
    assert not old.cost.preparation.enabled
    why = old(request((4, 4), (1, 2)))[1]["migrations"]
    assert "although the job prepares them" in why and "measured.prepared.slowdown" in why and "parcae profile" in why


def test_liveput_plans_with_the_preemptions_its_cloud_has_noticed():
    """A job that prepares noticed preemptions (AWS: 120 s ahead, 60 s intervals): the request's `noticed` replaces
    the forecast's preemptions in the two intervals after the coming one, as the simulator's `parcae` plans; a job
    priced as full stops (no notice) plans without them."""
    from dataclasses import replace as copy

    measured = copy(tiny_runtime_profile(), measured={"prepared": {"slowdown": 0.2}})
    planner, _ = make_planner("liveput", profile=measured, look_ahead=4, interval_s=60.0, notice_s=120.0)
    assert planner.notices_ahead == 2 and HandedPlanner(planner).notices_ahead == 2
    _, plain = planner(request((4, 4), (2, 2)))
    _, told = planner(request((4, 4), (2, 2), noticed=(0, 2, 1)))  # (a third interval is past the notice)
    assert told["noticed"] == [0, 2] and "noticed" not in plain
    assert [i["events"] for i in told["intervals"]] == [[[0, 0, 1.0]], [[0, 0, 1.0]], [[0, 2, 1.0]], [[0, 0, 1.0]]]
    assert [i["prev_available"] for i in told["intervals"]] == [4, 4, 4, 2]  # those two are gone after it
    assert told["expected_samples"] < plain["expected_samples"]
    full, _ = make_planner("liveput", profile=measured, look_ahead=4, interval_s=60.0)
    assert full.notices_ahead == 0 and "noticed" not in full(request((4, 4), (2, 2), noticed=(0, 2)))[1]


class NoticedRecorder(RulePlanner):
    """The rule planner, asking for two intervals of notices and keeping what each request held."""

    notices_ahead = 2

    def __init__(self) -> None:
        self.seen: list[tuple[int, tuple[int, ...]]] = []

    def __call__(self, req: PlanRequest):
        self.seen.append((req.interval, req.noticed))
        return super().__call__(req)


def test_a_replay_tells_its_planner_the_preemptions_a_cloud_would_have_noticed(tmp_path):
    """Two steps an interval: the preemption with notice at step 6 (interval 3) is in the requests of intervals 1
    and 2 (within two intervals), not before; the kill at step 8 comes without notice: in no request."""
    planner = NoticedRecorder()
    events = [{"step": 6, "kind": "preempt", "instances": [3]}, {"step": 8, "kind": "kill", "instances": [2]}]
    run_job(CFG, TRAIN, 4, (2, 2), 12, events, tmp_path / "job", planner=planner, steps_per_interval=2,
            checkpoint_every=2, timeout_s=100)  # fmt: skip
    assert planner.seen[:3] == [(1, (0, 1)), (2, (1,)), (3, ())]
    assert all(noticed == () for _, noticed in planner.seen[3:])


def test_handed_planner_applies_the_latest_feasible_plan():
    plan = HandedPlan((1, 3), "flow-run-7", seq=2, sent_at=10.0, received_at=10.5)
    decision, details = HandedPlanner()(request((4, 4), (2, 2), handed=plan))
    assert decision == (1, 3) and details == {"source": "handed", "handed": plan.to_dict()}
    assert details["handed"]["source"] == "flow-run-7" and details["handed"]["received_at"] == 10.5
    # no plan: the fallback decides, else the current strategy stays
    assert HandedPlanner(RulePlanner())(request((4, 3), (2, 2)))[0] == (1, 2)
    assert HandedPlanner()(request((4, 4), (2, 2))) == ((2, 2), {"source": "keep"})
    # a plan that does not fit the instances alive now is rejected, with the reason, not applied
    big = HandedPlan((2, 2), "flow-run-8", seq=3, sent_at=11.0, received_at=11.2)
    decision, details = HandedPlanner(RulePlanner())(request((4, 3), (2, 2), handed=big))
    assert decision == (1, 2) and details["source"] == "rule" and details["fallback"] == {"rule": "trace_strategy"}
    assert details["rejected"]["source"] == "flow-run-8"
    assert "needs 4 instances, only 3" in details["rejected"]["reason"]
    assert HandedPlanner(RulePlanner()).name == "handed+rule"


def test_a_handed_plan_past_its_age_gives_the_job_s_own_planner_the_decision():
    import time

    fresh = HandedPlan((1, 3), "flow-run-9", seq=4, sent_at=time.time(), received_at=time.time())
    old = HandedPlan((1, 3), "flow-run-9", seq=4, sent_at=time.time() - 100, received_at=time.time() - 100)
    planner = HandedPlanner(RulePlanner(), max_age_s=60)
    assert planner(request((4, 4), (2, 2), handed=fresh))[0] == (1, 3)
    decision, details = planner(request((4, 4), (2, 2), handed=old))
    assert decision == (2, 2) and details["source"] == "rule" and details["stale"]["max_age_s"] == 60
    with pytest.raises(ValueError, match="max_age_s"):
        HandedPlanner(max_age_s=0)
    wrapped, what = make_planner("rule", accept_plans_for_s=120)
    assert isinstance(wrapped, HandedPlanner) and wrapped.name == "handed+rule" and wrapped.max_age_s == 120
    assert what.startswith("handed in from outside when fresh (each stands 120 s); else none (the rule planner")


def test_hand_plan_authenticates_and_checks_the_job(tmp_path):
    c = coordinator(CFG, TRAIN, 10, str(tmp_path), job="job-a", token="s3cret")
    where = rf"coordinator at 127\.0\.0\.1:{c.port}"
    with pytest.raises(HandPlanError, match=rf"job 'job-a' at the {where} takes no handed plans"):
        hand_plan("127.0.0.1", c.port, (1, 2), job="job-a", token="s3cret")
    c.accept_handed_plans("handed")
    with pytest.raises(HandPlanError, match=rf"^wrong token for the {where}; the plan was not handed in"):
        hand_plan("127.0.0.1", c.port, (1, 2), job="job-a", token="guess")
    with pytest.raises(HandPlanError, match=rf"the {where} requires a token and none was given"):
        hand_plan("127.0.0.1", c.port, (1, 2), job="job-a")
    with pytest.raises(HandPlanError, match=rf"the {where} runs job 'job-a', not 'job-b'"):
        hand_plan("127.0.0.1", c.port, (1, 2), job="job-b", token="s3cret")
    with pytest.raises(HandPlanError, match=r"job 'job-a' cannot run this plan: strategy 1x7: P=7 exceeds"):
        hand_plan("127.0.0.1", c.port, (1, 7), job="job-a", token="s3cret")
    with pytest.raises(HandPlanError, match=r"two integers >= 1, got \(0, 2\)"):
        hand_plan("127.0.0.1", c.port, (0, 2), job="job-a", token="s3cret")
    assert c.handed_plans(0) == []  # nothing refused was written
    hand_plan("127.0.0.1", c.port, [2, 2], job="job-a", token="s3cret", source="test")
    hand_plan("127.0.0.1", c.port, (1, 3), job="job-a", token="s3cret", source="test-2")
    got = c.handed_plans(0)
    assert [(i, p["strategy"], p["source"]) for i, p in got] == [(1, [2, 2], "test"), (2, [1, 3], "test-2")]
    assert c.handed_plans(1)[0][0] == 2 and c.handed_plans(2) == []
    c.finish()
    with pytest.raises(HandPlanError, match="has ended"):
        hand_plan("127.0.0.1", c.port, (1, 2), job="job-a", token="s3cret")
    free = coordinator(CFG, TRAIN, 10, str(tmp_path))  # a port nobody will listen on once it is gone
    port = free.port
    del free
    with pytest.raises(HandPlanError, match=rf"cannot reach the coordinator at 127\.0\.0\.1:{port} within 1 s"):
        hand_plan("127.0.0.1", port, (1, 2), job="job-a", timeout_s=1)


def test_a_planned_job_takes_availability_events_only(tmp_path):
    sched = trace_schedule("p3", 4, 24, 2, seed=0, start_interval=51)
    assert any(e["kind"] == "plan" for e in sched.events)
    bare = trace_schedule("p3", 4, 24, 2, seed=0, start_interval=51, plans=False)
    assert bare.events == [e for e in sched.events if e["kind"] != "plan"] and bare.steps_per_interval == 2
    with pytest.raises(ScheduleError, match=r"takes availability events only .* plan at step 2: drop them"):
        run_job(CFG, TRAIN, 4, (2, 2), 24, sched.events, tmp_path / "a", planner=RulePlanner(), steps_per_interval=2)
    with pytest.raises(ScheduleError, match="needs steps_per_interval >= 1"):
        run_job(CFG, TRAIN, 4, (2, 2), 24, bare.events, tmp_path / "b", planner=RulePlanner())
    with pytest.raises(ScheduleError, match="steps_per_interval=2 needs a planner"):
        run_job(CFG, TRAIN, 4, (2, 2), 24, bare.events, tmp_path / "c", steps_per_interval=2)


# ------------------------------------------------------------------------------------------------ real jobs


def reference(steps: int) -> tuple[list[float], dict]:
    return uninterrupted(CFG, TRAIN, steps)


def test_a_trace_job_planned_by_liveput_trains_the_uninterrupted_run(tmp_path):
    """p3 from interval 51, 4 instances, 2 steps per interval: a preemption with notice at step 2, a kill at 14, an
    added instance at 22; liveput decides at each of the 11 boundaries, forecasting with a fitted LightGBM model."""
    steps = 24
    rec = RecordingObserver()
    lgbm = LightGbmForecaster(horizon_max=3, n_estimators=20, min_child_samples=20, max_rows=2000, seed=0).fit(
        [load_trace("gcp-v100")]
    )
    planner, _ = make_planner("liveput", profile=tiny_runtime_profile(), forecaster=lgbm, trace="p3", workers=4,
                              start_interval=51, look_ahead=4)  # fmt: skip
    report = train(4, model=CFG, steps=steps, trace="p3", interval_seconds=0.2, step_seconds=0.1, seed=0,
                   start_interval=51, out_dir=tmp_path / "job", checkpoint_every=6, planner=planner, observer=rec,
                   timeout_s=100)  # fmt: skip
    plans: list[PlanInfo] = rec.of("plan")
    assert [p.step for p in plans] == list(range(2, steps, 2)) and [p.interval for p in plans] == list(range(1, 12))
    assert all(p.planner == "liveput" and len(p.details["steps"]) == 4 for p in plans)
    # forecasts by the fitted model from the trace's past, except at the kill's boundary (the victim still counts)
    sources = [p.details["forecast"] for p in plans]
    assert sources[6] == "persistence: the trace's past (to interval 57) ends at 2, the job has 3 alive", sources
    assert sources[:6] + sources[7:] == ["lightgbm-gated"] * 10, sources
    assert all(p.decision[0] * p.decision[1] <= p.alive for p in plans)
    # 4 instances, one preempted at 2, one killed during 14 (still alive when 14 is planned), one added at 22
    assert [p.alive for p in plans] == [3] * 7 + [2] * 3 + [3]
    # liveput re-cuts the pipeline, the kill is recovered live, the added instance is used
    kinds = [(r["kind"], r["notice"], r["step"]) for r in report["reconfigurations"]]
    assert ("pipeline", True, 2) in kinds and any(not notice for _, notice, _ in kinds), kinds
    # the planner was asked a step ahead (control.prepare): each of its reconfigurations formed its groups meanwhile
    planned = [r for r in report["reconfigurations"] if r["source"] == "planner"]
    assert planned and all(r["prepared"] for r in planned), [(r["step"], r["prepared"]) for r in planned]
    assert plans[-1].decision[0] * plans[-1].decision[1] == 3
    assert [(p["step"], tuple(p["decision"])) for p in report["plans"]] == [(p.step, p.decision) for p in plans]
    # every decision is what trains next: the steps after a boundary run the strategy decided there (until a kill)
    by_step = {s.step: s.strategy for s in rec.of("step")}
    kill_step = 14
    for p in plans:
        if p.step != kill_step and p.step + 1 < steps:
            assert by_step[p.step] == p.decision, (p.step, p.decision, by_step[p.step])
    assert sorted(by_step) == list(range(steps))
    # the same run as one uninterrupted process
    ref_losses, ref_layers = reference(steps)
    assert report["loss"] == pytest.approx(ref_losses, rel=1e-5)
    final = checkpoint.load(checkpoint.find_shards(tmp_path / "job" / "layers", steps), config=CFG, job="job")
    for name, want in ref_layers.items():
        for key in want:
            assert torch.allclose(final.layers[name][key], want[key], rtol=1e-5, atol=1e-9), f"{name} {key}"


class HandingObserver(JobObserver):
    """Hands plans to the job it watches: one too big for the instances before the first boundary, then, once the
    first boundary has decided, a feasible one."""

    def __init__(self) -> None:
        self.token: str | None = None
        self.where: tuple[str, int] | None = None
        self.handed_after: int | None = None

    def on_start(self, info):
        self.where = (info["host"], info["port"])
        self.token = read_token_file(info["token_file"])  # as a client of the job would find it
        hand_plan(*self.where, (3, 2), job=info["job"], token=self.token, source="too-big")

    def on_plan(self, plan):
        if self.handed_after is None:
            hand_plan(*self.where, (1, 2), job="handed-job", token=self.token, source="shrink")
            self.handed_after = plan.step


def test_a_plan_handed_to_a_running_job_applies_at_the_next_boundary(tmp_path):
    rec, hander = RecordingObserver(), HandingObserver()
    result = run_job(CFG, TRAIN, 4, (2, 2), 9, [], tmp_path / "job", job="handed-job",
                     planner=HandedPlanner(), steps_per_interval=3,
                     observer=ObserverList([hander, rec]), timeout_s=80)  # fmt: skip
    first, second = rec.of("plan")
    assert hander.handed_after == first.step == 3
    # the first plan was too big for the 4 instances: rejected with its reason, the strategy kept
    assert first.decision == (2, 2) and first.details["source"] == "keep"
    assert first.details["rejected"]["source"] == "too-big"
    assert "needs 6 instances, only 4 are alive" in first.details["rejected"]["reason"]
    # the second arrived after it and applies at the next boundary
    assert second.step == 6 and second.decision == (1, 2) and second.details["source"] == "handed"
    assert second.details["handed"]["source"] == "shrink" and second.details["handed"]["seq"] == 2
    assert [(r["kind"], r["step"], r["strategy"]) for r in result["reconfigurations"]] == [("intra-stage", 6, [1, 2])]
    assert [s.strategy for s in rec.of("step")] == [(2, 2)] * 6 + [(1, 2)] * 3
    log = result["events"]
    assert [e["source"] for e in log if e["event"] == "handed-plan"] == ["too-big", "shrink"]
    assert [e["details"].get("rejected", {}).get("source") for e in log if e["event"] == "plan"] == ["too-big", None]
    assert result["plans"][1]["details"]["handed"]["strategy"] == [1, 2]


def test_the_settings_check_knows_the_same_planners_as_make_planner():
    # parcae.settings keeps its own copy (importing trainer.control.planning would pull torch into every settings check)
    from parcae import settings
    from trainer.control import planning

    assert set(settings.PLANNERS) == set(planning.PLANNERS)
