"""Tests of prepared migrations (issue 16's cost model): lead time and downtime, the triggers, and that the scenario
store and the planner stay exact under them.

The brute forces enumerate every preemption subset (as tests/test_scenarios.py does) and every strategy sequence (as
tests/test_optimizer.py does), pricing each scenario with `CostModel.effective_ms` of its own `MigrationTime`.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from _small_model import small_cost, small_profile
from test_optimizer import FORECASTS, STATES, brute_force, replay

from forecasting import load_trace
from liveput import (
    FULL_STOP,
    CostModel,
    MigrationKind,
    MigrationTime,
    Preparation,
    SimulationConfig,
    Trigger,
    assign_stages,
    load_profile,
    simulate,
)
from liveput.optimizer import PlannerConfig, plan
from liveput.scenarios import KINDS, IntervalForecast, ScenarioStore

PROFILE = small_profile()
#: a notice shorter than most leads here (rendezvous 6.6 s, groups 1-3 s, transfers 0.1-2 s): partly hidden
SHORT = small_cost().prepared(Preparation(notice_s=1.5, slowdown=0.2))
LONG = small_cost().prepared(Preparation(notice_s=120.0))
NO_NOTICE = small_cost().prepared(Preparation(notice_s=0.0))
#: memory for some re-cuts' survivors to build beside the stage they train, and not for others (`builds_beside`)
BESIDE = small_cost(memory_gib=1.2).prepared(Preparation(notice_s=1.5, slowdown=0.2))
TARGETS = tuple((d, p) for p in range(1, 6) for d in range(1, 5))


def _thr(s):
    try:
        return PROFILE.throughput(*s)
    except Exception:  # noqa: BLE001 — outside the profile: trains nothing
        return 0.0


def _scenario_ms(cost: CostModel, N, D, P, n_out, d, p, survivors, lost_active) -> tuple[MigrationKind, float]:
    """Kind and effective cost of one preemption pattern, from the rules of §D.1 and the lead/down split."""
    spec = cost.spec
    if D * P == 0:
        return MigrationKind.START, cost.pipeline_ms(d, p, spec.total_params, add=True)
    add = d * p > D * P - lost_active
    trigger = (
        (Trigger.NOTICE if cost.preparation.notice_s > 0 else Trigger.KILL)
        if lost_active
        else (Trigger.ADDITION if add else Trigger.PLANNED)
    )
    standbys = d * p <= N - n_out  # every instance the target adds was alive before the interval
    ratio = _thr((D, P)) / _thr((d, p)) if _thr((d, p)) else 0.0  # (a target outside the profile: never planned)
    if p == P:
        if (d, p) == (D, P) and lost_active == 0:
            return MigrationKind.NONE, 0.0
        if all(c >= d for c in survivors):
            return MigrationKind.INTRA_STAGE, cost.effective_ms(cost.intra_stage_time(d, p), trigger, ratio, standbys)
        t = cost.stage_transfer_ms(p)
        need = [s for s in range(p) if survivors[s] < d]
        serial = sum(t[s] for s in range(p) if survivors[s] == 0 or (s == p - 1 and survivors[s] == 1 and d >= 2))
        moved = max(max(t[s] for s in need), serial)
        time = cost.inter_stage_time(d, p, moved, add)
        return MigrationKind.INTER_STAGE, cost.effective_ms(time, trigger, ratio, standbys)
    missing = assign_stages(spec.layer_params, spec.partition(P), spec.partition(p), list(survivors))[1]
    time = cost.pipeline_time(d, p, missing, add, old_p=P)
    return MigrationKind.PIPELINE, cost.effective_ms(time, trigger, ratio, standbys)


def brute_force_outcome(cost, N, D, P, n_in, n_out):
    reach, ms, kind = np.zeros(len(TARGETS)), np.zeros(len(TARGETS)), np.zeros((len(TARGETS), len(KINDS)))
    subsets = list(itertools.combinations(range(N), n_out))
    for lost in map(set, subsets):
        survivors = tuple(sum(1 for r in range(D) if r * P + s not in lost) for s in range(P))
        lost_active = sum(1 for k in lost if k < D * P)
        for i, (d, p) in enumerate(TARGETS):
            if d * p > N + n_in - n_out:
                continue
            k, c = _scenario_ms(cost, N, D, P, n_out, d, p, survivors, lost_active)
            reach[i] += 1
            ms[i] += c
            kind[i, KINDS.index(k)] += 1
    return reach / len(subsets), ms / len(subsets), kind / len(subsets)


CASES = [
    (D, P, n_out, idle, n_in)
    for D in (1, 2, 3)
    for P in (1, 2, 3)
    for n_out in (0, 1, 2)
    for idle, n_in in ((0, 0), (2, 0), (1, 3))
    if n_out <= D * P + idle
]


@pytest.mark.parametrize(
    "cost", [SHORT, LONG, NO_NOTICE, BESIDE], ids=["short-notice", "long-notice", "no-notice", "build-beside"]
)
@pytest.mark.parametrize("D, P, n_out, idle, n_in", CASES)
def test_prepared_outcomes_match_brute_force_and_bounds_bracket_them(cost, D, P, n_out, idle, n_in):
    N = D * P + idle
    want = brute_force_outcome(cost, N, D, P, n_in, n_out)
    store = ScenarioStore(PROFILE, cost)
    got = store.outcome(N, (D, P), n_in, n_out, TARGETS)
    np.testing.assert_allclose(got.reach, want[0], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got.cost_ms, want[1], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.kind, want[2], rtol=1e-9, atol=1e-12)
    reach, lo, hi = store.bounds(IntervalForecast.point(N, n_in, n_out), (D, P), TARGETS)
    assert np.all(lo <= got.cost_ms * (1 + 1e-12) + 1e-9), "a lower bound cut off an exact cost"
    assert np.all(got.cost_ms <= hi * (1 + 1e-12) + 1e-9), "an upper bound is below an exact cost"


OPT_CASES = [(T, f, s) for T in (60.0, 5.0) for f in FORECASTS for s in STATES
             if STATES[s].strategy[0] * STATES[s].strategy[1] <= FORECASTS[f][0].prev_available]  # fmt: skip


@pytest.mark.parametrize("cost", [SHORT, BESIDE], ids=["short-notice", "build-beside"])
@pytest.mark.parametrize("T, fname, sname", OPT_CASES)
def test_the_planner_stays_exact_with_prepared_migrations(T, fname, sname, cost):
    """The lazy search (whose pruning rests on the bounds) finds the brute force's best sequence."""
    forecast, current = FORECASTS[fname], STATES[sname]
    store = ScenarioStore(PROFILE, cost)
    best, _ = brute_force(store, forecast, current, T)
    config = PlannerConfig(interval_s=T, look_ahead=len(forecast))
    got = plan(store, forecast, current, config)
    assert got.expected_samples == pytest.approx(best, rel=1e-9, abs=1e-9)
    full = plan(ScenarioStore(PROFILE, cost), forecast, current, config, exhaustive=True)
    assert [s.strategy for s in full.steps] == [s.strategy for s in got.steps]
    total, _, _ = replay(store, forecast, current, [s.strategy for s in got.steps], T)
    assert total == pytest.approx(best, rel=1e-9, abs=1e-9)


# -- the rule of each trigger ----------------------------------------------------------------------------


def test_each_trigger_pays_what_its_preparation_cannot_hide():
    cost = small_cost().prepared(Preparation(notice_s=10.0, slowdown=0.1))
    t = MigrationTime(full_ms=20_000.0, lead_ms=18_000.0, join_ms=8_000.0, down_ms=3_000.0)
    assert cost.effective_ms(t, Trigger.KILL, 1.0) == 20_000.0  # nothing was known: the full stop
    # a notice hides up to 10 s of the 10 s of lead that needs no new instance (the old strategy 10% slower)
    assert cost.effective_ms(t, Trigger.NOTICE, 0.5) == pytest.approx(3_000 + 8_000 + 0 + 0.1 * 10_000 * 0.5)
    # with standbys (alive at the notice) the join is lead like the rest: 18 s of it, 10 s hidden
    assert cost.effective_ms(t, Trigger.NOTICE, 0.5, standbys=True) == pytest.approx(3_000 + 8_000 + 0.1 * 10_000 * 0.5)
    # planned / addition: the old strategy (at 0.9 of its throughput) trains through the lead, then the stop
    assert cost.effective_ms(t, Trigger.ADDITION, 0.5) == pytest.approx(3_000 + 18_000 * (1 - 0.45))
    assert cost.effective_ms(t, Trigger.PLANNED, 2.0) == pytest.approx(3_000)  # the old one is faster: only the stop
    # never more than the full stop: a runtime can always not prepare
    assert cost.effective_ms(t, Trigger.ADDITION, 0.0) == 20_000.0
    slow = small_cost().prepared(Preparation(notice_s=1000.0, slowdown=1.0))
    assert slow.effective_ms(t, Trigger.NOTICE, 30.0) == 20_000.0


def test_a_trigger_left_out_of_the_preparation_is_a_full_stop():
    t = MigrationTime(full_ms=9_000.0, lead_ms=8_000.0, down_ms=2_000.0)
    only_notices = small_cost().prepared(Preparation(triggers=frozenset({Trigger.NOTICE})))
    assert only_notices.effective_ms(t, Trigger.PLANNED, 1.0) == 9_000.0
    assert only_notices.effective_ms(t, Trigger.NOTICE, 1.0) < 9_000.0
    assert FULL_STOP.prepares(Trigger.NOTICE) is False
    assert small_cost().effective_ms(t, Trigger.NOTICE, 1.0) == 9_000.0  # the default model is the reference's
    assert NO_NOTICE.trigger(preempted=True, add=False) is Trigger.KILL
    assert LONG.trigger(preempted=True, add=False) is Trigger.NOTICE
    assert LONG.trigger(preempted=False, add=True) is Trigger.ADDITION


def test_the_split_keeps_the_reference_s_full_cost_and_adds_only_the_catch_up():
    cost = CostModel.reference("gpt-1.5b", Preparation())
    c = cost.constants
    t = cost.pipeline_time(2, 8, 400_000_000, add=True)
    assert t.full_ms == cost.pipeline_ms(2, 8, 400_000_000, add=True)
    moved = c.p2p.ms(400_000_000 * cost.spec.bytes_per_param) + max(cost.stage_transfer_ms(8))
    assert t.join_ms == pytest.approx(c.rendezvous_ms + cost.comm_groups_ms(2, 8, add=True))
    assert t.down_ms == pytest.approx(c.proc_ms + c.build(8) + moved * 4 / cost.spec.bytes_per_param)
    assert t.lead_ms + t.down_ms == pytest.approx(t.full_ms + moved * 4 / cost.spec.bytes_per_param)
    intra = cost.intra_stage_time(4, 8)
    assert (intra.full_ms, intra.down_ms) == (cost.intra_stage_ms(4, 8), c.proc_ms)


def test_a_re_cut_builds_beside_the_old_stage_only_where_memory_holds_both():
    """Survivors build what they lack of their new stage while they train the old one when the largest old stage's
    training footprint plus what one survivor can lack fit the instance's memory; then the build is lead time."""
    cost = CostModel.reference("gpt-1.5b", Preparation())
    c, spec = cost.constants, cost.spec
    assert c.memory_gib == 15.5  # the reference's V100s
    # P = 8: stage 0 trains with 8 micro-batches in flight (13.1 GiB); a stage of 12 (2.3 GiB of state) fits beside
    assert cost.builds_beside(8, 12, missing_params=10**9)
    # P = 12: 14.9 GiB in training; a whole stage of 8 (3 GiB) does not fit, a few layers do
    assert not cost.builds_beside(12, 8, missing_params=10**9)
    assert cost.builds_beside(12, 8, missing_params=10_000_000)
    fits = cost.pipeline_time(2, 12, 10**9, add=False, old_p=8)
    full = cost.pipeline_time(2, 8, 10**9, add=False, old_p=12)
    for t, p in ((fits, 12), (full, 8)):
        moved = c.p2p.ms(10**9 * spec.bytes_per_param) + max(cost.stage_transfer_ms(p))
        assert t.full_ms == cost.pipeline_ms(2, p, 10**9, add=False)  # the reference's cost is untouched
        catch_up = moved * 4 / spec.bytes_per_param
        beside = t is fits
        assert t.down_ms == pytest.approx(c.proc_ms + catch_up + (0.0 if beside else c.build(p)))
        assert t.lead_ms == pytest.approx(cost.comm_groups_ms(2, p, add=False) + moved + (c.build(p) if beside else 0))
    assert cost.pipeline_time(2, 12, 10**9, add=False) == replace(fits, lead_ms=fits.lead_ms - c.build(12),
                                                                  down_ms=fits.down_ms + c.build(12))  # fmt: skip
    unknown = small_cost()  # measured constants without an instance's memory: nothing is built beside
    assert unknown.constants.memory_gib is None and not unknown.builds_beside(2, 3, missing_params=1)


def test_preparation_rejects_what_cannot_be():
    with pytest.raises(ValueError, match="kill"):
        Preparation(triggers=frozenset({Trigger.KILL}))
    with pytest.raises(ValueError, match="notice_s"):
        Preparation(notice_s=-1.0)
    with pytest.raises(ValueError, match="slowdown"):
        Preparation(slowdown=1.5)
    assert "full stop" in FULL_STOP.describe()
    assert "120 s notice" in Preparation().describe()


# -- the simulator -----------------------------------------------------------------------------------------


def test_preparation_lifts_parcae_on_p3_and_leaves_the_baselines_alone():
    trace = load_trace("p3")
    profile = load_profile("gpt-1.5b")
    config = SimulationConfig(model="gpt-1.5b")
    runs = {}
    for name, prep in (("full", FULL_STOP), ("aws", Preparation()), ("none", Preparation(notice_s=0.0))):
        cost = CostModel.reference("gpt-1.5b", prep)
        runs[name] = simulate(trace, ["parcae", "reactive", "bamboo", "ideal"], config, first_interval=90,
                              last_interval=119, profile=profile, cost=cost)  # fmt: skip
    for policy in ("reactive", "bamboo", "ideal"):  # they prepare nothing: the same samples under every setting
        assert {runs[k][policy].samples for k in runs} == {runs["full"][policy].samples}
    ratio = {k: r["parcae"].samples / r["ideal"].samples for k, r in runs.items()}
    assert ratio["aws"] > ratio["none"] > ratio["full"]
    # the full stop is the reference's model: the same numbers as the default cost model
    default = simulate(trace, ["parcae"], config, first_interval=90, last_interval=119, profile=profile)
    assert default["parcae"].samples == runs["full"]["parcae"].samples
    assert replace(Preparation(), triggers=frozenset()).enabled is False
