"""Tests of liveput.policies: Bamboo's survival probability, the reactive and ideal baselines on
hand-made traces with hand-computed samples (parcae-reference §H), and how parcae reacts to a
misprediction."""

from __future__ import annotations

import itertools
from math import comb

import pytest

from liveput import (
    IDLE,
    POLICY_NAMES,
    CostModel,
    IntervalForecast,
    JobState,
    ParcaePolicy,
    Preparation,
    Trigger,
    load_profile,
    make_policy,
    plan,
)
from liveput.policies import BambooPolicy, IdealPolicy, IntervalEvent, ReactivePolicy, history_persistence

GPT_COST = CostModel.reference("gpt-1.5b")
GPT_PROFILE = load_profile("gpt-1.5b")

# ------------------------------------------------------------------------------ Bamboo survival


def brute_survive(d: int, p: int, k: int) -> float:
    """Fraction of k-subsets of the d*p instances that leave no pipeline without a ring-neighbour copy.

    Instance r*p + s is stage s of pipeline r; stage s's layers are also held by stage s-1 (a ring), so a
    pipeline fails when it loses stage s and its successor (s+1) % p. With p == 2 the two nodes are each
    other's neighbour; with p == 1 the only node is its own successor, so losing it is fatal.
    """
    good = 0
    subsets = list(itertools.combinations(range(d * p), k))
    for lost in subsets:
        lost = set(lost)
        ok = all(not (r * p + s in lost and r * p + (s + 1) % p in lost) for r in range(d) for s in range(p))
        good += ok
    return good / len(subsets)


@pytest.mark.parametrize("d, p", [(d, p) for d in range(1, 5) for p in range(1, 6) if d * p <= 12])
def test_bamboo_survive_probability_matches_brute_force(d, p):
    for k in range(d * p + 1):
        assert BambooPolicy.survive_probability(d, p, k) == pytest.approx(brute_survive(d, p, k), rel=1e-12, abs=1e-15)


def test_bamboo_survive_probability_hand_values():
    assert BambooPolicy.survive_probability(3, 4, 0) == 1.0
    # one loss never kills a pipeline with p >= 2
    assert BambooPolicy.survive_probability(2, 3, 1) == 1.0
    # p = 2, d = 1: losing both nodes of the pair is fatal
    assert BambooPolicy.survive_probability(1, 2, 2) == 0.0
    # d = 2, p = 2, k = 2: of C(4,2) = 6 pairs, the 2 that take a whole pipeline are fatal
    assert BambooPolicy.survive_probability(2, 2, 2) == pytest.approx(4 / 6)
    # d = 1, p = 4, k = 2: only the 2 opposite pairs of the 4-ring survive
    assert BambooPolicy.survive_probability(1, 4, 2) == pytest.approx(2 / comb(4, 2))


# ------------------------------------------------------------------------------ reactive (§H)


def _run(policy, events):
    policy.reset()
    return [policy.step(e, events[:i], events[i:], first=(i == 0)) for i, e in enumerate(events)]


def _thr(n: int) -> tuple[tuple[int, int], float]:
    s = GPT_PROFILE.best(n)
    return s, GPT_PROFILE.throughput(*s)


def _reactive_cost(s, add: bool, save: bool) -> float:
    # §H: restart R(d, p, type) + 14 s checkpoint save + load (not at the first interval)
    # + a serialised reload of every stage's state (sum of the per-stage p2p transfers)
    return GPT_COST.restart_ms(*s, add=add) + (14000.0 if save else 0.0) + sum(GPT_COST.stage_transfer_ms(s[1]))


def test_reactive_spill_and_drain():
    ev = [
        IntervalEvent(0, 20, 0, 0),  # first interval: start on 20 with a rendezvous, nothing to save
        IntervalEvent(1, 20, 2, 0),  # +2: restart on 22 with rendezvous + checkpoint: longer than 60 s
        IntervalEvent(2, 22, 0, 0),  # no event: finish the leftover, train the rest
        IntervalEvent(3, 22, 0, 6),  # -6: restart on 16, no rendezvous
        IntervalEvent(4, 16, 0, 12),  # 4 left: gpt-1.5b needs P >= 6, so nothing runs
    ]
    s20, t20 = _thr(20)
    s22, t22 = _thr(22)
    s16, t16 = _thr(16)
    assert (s20, s22, s16) == ((2, 10), (2, 11), (2, 8))
    c0 = _reactive_cost(s20, add=True, save=False)
    c1 = _reactive_cost(s22, add=True, save=True)
    c3 = _reactive_cost(s16, add=False, save=True)
    assert c0 < 60000 < c1 and c3 < 60000
    want = [
        t20 * (60.0 - c0 / 1000),  # trains after the start
        0.0,  # still restarting at the end of the interval
        t22 * (60.0 - (c1 - 60000) / 1000),  # pays only the leftover
        t16 * (60.0 - c3 / 1000),
        0.0,
    ]
    res = _run(ReactivePolicy(GPT_PROFILE, GPT_COST), ev)
    assert [r.samples for r in res] == pytest.approx(want, rel=1e-12)
    assert [r.strategy for r in res] == [s20, s22, s22, s16, IDLE]
    assert [r.migrating for r in res] == [False, True, False, False, False]
    assert [r.cost_ms for r in res] == pytest.approx([c0, c1, 0.0, c3, 0.0], rel=1e-12)
    assert res[0].kinds == {"start": 1.0} and res[1].kinds == {"checkpoint-restart": 1.0}
    assert res[2].kinds == {} and res[4].kinds == {}
    assert [r.pause_s for r in res] == pytest.approx([c0 / 1000, 60.0, (c1 - 60000) / 1000, c3 / 1000, 0.0])


def test_reactive_concurrent_restart_while_busy():
    ev = [
        IntervalEvent(0, 20, 0, 0),
        IntervalEvent(1, 20, 2, 0),  # spills 3.2 s into the next interval
        IntervalEvent(2, 22, 0, 6),  # new event while busy: new restart + concurrent restart
        IntervalEvent(3, 16, 0, 0),  # quiet: full interval
    ]
    s20, t20 = _thr(20)
    s22, _ = _thr(22)
    s16, t16 = _thr(16)
    c0 = _reactive_cost(s20, add=True, save=False)
    c1 = _reactive_cost(s22, add=True, save=True)
    c2 = _reactive_cost(s16, add=False, save=True)
    remain2 = c2 + GPT_COST.restart_ms(*s16, add=False)  # concurrent restart Rc = R(d, p, no-op)
    assert c1 > 60000 and remain2 < 60000
    want = [t20 * (60.0 - c0 / 1000), 0.0, t16 * (60.0 - remain2 / 1000), t16 * 60.0]
    res = _run(ReactivePolicy(GPT_PROFILE, GPT_COST), ev)
    assert [r.samples for r in res] == pytest.approx(want, rel=1e-12)
    assert [r.migrating for r in res] == [False, True, False, False]
    assert res[2].pause_s == pytest.approx(remain2 / 1000)


def test_reactive_pays_a_restart_even_when_the_strategy_does_not_change():
    # §I.12: 17 -> 16 -> 17 instances; best(17) == best(16) == (2, 8), yet every event restarts
    assert GPT_PROFILE.best(17) == GPT_PROFILE.best(16) == (2, 8)
    ev = [IntervalEvent(0, 17, 0, 0), IntervalEvent(1, 17, 0, 1), IntervalEvent(2, 16, 1, 0)]
    s, t = _thr(16)
    res = _run(ReactivePolicy(GPT_PROFILE, GPT_COST), ev)
    assert [r.strategy for r in res] == [s, s, s]
    assert res[1].samples == pytest.approx(t * (60.0 - _reactive_cost(s, add=False, save=True) / 1000), rel=1e-12)
    assert res[2].samples == pytest.approx(t * (60.0 - _reactive_cost(s, add=True, save=True) / 1000), rel=1e-12)


# ------------------------------------------------------------------------------------------ ideal


def test_ideal_trains_best_throughput_for_free():
    ev = [
        IntervalEvent(0, 20, 0, 0),
        IntervalEvent(1, 20, 2, 0),
        IntervalEvent(2, 22, 0, 17),
        IntervalEvent(3, 5, 3, 0),
    ]
    res = _run(IdealPolicy(GPT_PROFILE, GPT_COST), ev)
    want = [_thr(20)[1] * 60, _thr(22)[1] * 60, 0.0, _thr(8)[1] * 60]
    assert [r.samples for r in res] == pytest.approx(want, rel=1e-12)
    assert [r.strategy for r in res] == [(2, 10), (2, 11), IDLE, (1, 8)]
    assert all(r.cost_ms == 0 and r.pause_s == 0 and not r.migrating for r in res)
    assert [r.instances for r in res] == [20, 22, 5, 8]


# ------------------------------------------------------------------------- parcae: mispredictions


class _OneIntervalReaction(ParcaePolicy):
    """The earlier rule, for comparison: a misprediction re-plans one interval against the truth."""

    def _truth_first(self, event, history, future):
        return [IntervalForecast.point(event.prev_available, event.n_in, event.n_out)]


def test_parcae_misprediction_replans_with_the_full_look_ahead():
    # 4x8 runs on 32; persistence forecasts no change, then 3 instances are preempted and 29 stay
    # for the rest of the window.
    history = [IntervalEvent(0, 32, 0, 0)]
    ev = [IntervalEvent(1, 32, 0, 3)] + [IntervalEvent(i, 29, 0, 0) for i in range(2, 10)]
    seen = []

    def forecaster(hist, future, k):
        seen.append((len(hist), hist[-1], k))
        return history_persistence(hist, future, k)

    def run(cls):
        pol = cls(GPT_PROFILE, GPT_COST, forecaster, look_ahead=8)
        pol.state = JobState((4, 8))
        events = history + ev
        return [pol.step(e, events[: i + 1], events[i + 1 :], first=False) for i, e in enumerate(ev)]

    res = run(ParcaePolicy)
    # the planned 4x8 does not fit on 29, so the policy asked again with the preemption in the history
    assert seen[:2] == [(1, history[0], 8), (2, ev[0], 7)]
    truth = [IntervalForecast.point(32, 0, 3)] + [IntervalForecast.point(29)] * 7
    store = ParcaePolicy(GPT_PROFILE, GPT_COST).store
    full = plan(store, truth, JobState((4, 8))).decision
    myopic = plan(store, truth[:1], JobState((4, 8))).decision
    assert full != myopic  # the two rules disagree here, so the test tells them apart
    assert res[0].strategy == full and res[0].strategy[0] * res[0].strategy[1] <= 29
    old = run(_OneIntervalReaction)
    assert old[0].strategy == myopic
    # the cheap reaction pays a second migration later; over the window the look-ahead trains more
    assert sum(r.samples for r in res) > sum(r.samples for r in old)
    assert sum(r.cost_ms > 0 for r in res) < sum(r.cost_ms > 0 for r in old)


# ----------------------------------------------------------------------------------- make_policy


def test_make_policy_known_names():
    for name in POLICY_NAMES:
        pol = make_policy(name, GPT_PROFILE, GPT_COST)
        assert pol.name == name


def test_make_policy_unknown_name_lists_choices():
    with pytest.raises(ValueError) as err:
        make_policy("varuna", GPT_PROFILE, GPT_COST)
    msg = str(err.value)
    assert "varuna" in msg
    for name in POLICY_NAMES:
        assert name in msg


# ------------------------------------------------------------------------- parcae: preemptions noticed ahead


def test_a_forecast_takes_the_preemptions_noticed_ahead():
    from liveput.scenarios import persistence_forecast, with_noticed

    # persistence: the noticed preemptions leave, the count after them persists
    got = with_noticed(persistence_forecast(10, 4), [2, 1])
    assert got == [IntervalForecast.point(10, 0, 2), IntervalForecast.point(8, 0, 1), IntervalForecast.point(7),
                   IntervalForecast.point(7)]  # fmt: skip
    # a forecast that knew them already is left as it is
    exact = [IntervalForecast.point(10, 0, 2), IntervalForecast.point(8, 1, 1), IntervalForecast.point(8)]
    assert with_noticed(exact, [2, 1]) == exact
    # arrivals keep the forecast's law; a later interval starts with what the notices took (here one more than the
    # forecast's expected 0.5), and cannot lose more than it has
    law = [IntervalForecast(10, ((0, 0, 0.5), (2, 1, 0.5))), IntervalForecast(10, ((0, 0, 0.7), (1, 10, 0.3)))]
    assert with_noticed(law, [2]) == [IntervalForecast(10, ((0, 2, 0.5), (2, 2, 0.5))),
                                      IntervalForecast(8, ((0, 0, 0.7), (1, 8, 0.3)))]  # fmt: skip
    assert with_noticed(law, [])[1] == law[1]


@pytest.mark.parametrize(
    "notice_s, acts, known", [(120.0, True, 3), (30.0, True, 1), (0.0, True, 0), (120.0, False, 0)]
)
def test_parcae_plans_with_the_preemptions_its_cloud_noticed(notice_s, acts, known):
    """An interval's preemptions came at most T before its start: with AWS's 120 s notice and T = 60 s, those of
    this interval and the next two are known when it is planned; with GCP's 30 s, this one's; without notice, or in
    a runtime that does not act on notices, none."""
    triggers = frozenset(Trigger) - {Trigger.KILL} if acts else frozenset({Trigger.PLANNED})
    cost = CostModel.reference("gpt-1.5b").prepared(Preparation(triggers=triggers, notice_s=notice_s))
    asked: list[list[IntervalForecast]] = []

    class Seen(ParcaePolicy):
        def _plan(self, forecast):
            asked.append(list(forecast))
            return super()._plan(forecast)

    pol = Seen(GPT_PROFILE, cost, history_persistence, look_ahead=8)
    pol.state = JobState((4, 8))
    history = [IntervalEvent(0, 32, 0, 0)]
    future = [IntervalEvent(1, 32, 0, 1), IntervalEvent(2, 31, 0, 2), IntervalEvent(3, 29, 0, 1),
              IntervalEvent(4, 28, 0, 5)] + [IntervalEvent(i, 23, 0, 0) for i in range(5, 12)]  # fmt: skip
    pol.step(future[0], history, future, first=False)
    outs = [[o for _, o, _ in f.events] for f in asked[0]]
    assert outs == [[e.n_out] if j < known else [0] for j, e in enumerate(future[:8])]
    assert asked[0][-1].prev_available == 32 - sum(e.n_out for e in future[:known])
