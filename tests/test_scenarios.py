"""Tests of liveput.scenarios: exact outcomes against brute force over every preemption subset.

Layout (parcae-reference §A.2, §C.2): instance k in [0, D*P) runs stage k % P of replica k // P; ids
>= D*P are idle. Every subset of n_out preempted instances among N is equally likely.
"""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
from _small_model import small_cost, small_profile
from scipy.stats import hypergeom

from liveput.migration import MigrationKind, assign_stages
from liveput.scenarios import KINDS, IntervalForecast, ScenarioStore

COST = small_cost()
SPEC = COST.spec
PROFILE = small_profile()
TARGETS = tuple((d, p) for p in range(1, 6) for d in range(1, 5))  # p in 1..5 around P, d in 1..4 around D


def _kind_index(kind: MigrationKind) -> int:
    return KINDS.index(kind)


@cache
def _missing(P: int, p: int, survivors: tuple[int, ...]) -> int:
    return assign_stages(SPEC.layer_params, SPEC.partition(P), SPEC.partition(p), list(survivors))[1]


def _one_scenario(
    D: int, P: int, d: int, p: int, survivors: tuple[int, ...], lost_active: int
) -> tuple[MigrationKind, float]:
    """Kind and cost of reaching (d, p) from (D, P) given the survivors per stage (the §D.1/§D.2 rules)."""
    if D * P == 0:
        # ScenarioStore's start rule: load every layer's state (a pipeline migration of the whole model)
        return MigrationKind.START, COST.pipeline_ms(d, p, SPEC.total_params, add=True)
    add = d * p > D * P - lost_active
    if p == P:
        if (d, p) == (D, P) and lost_active == 0:
            return MigrationKind.NONE, 0.0
        if all(c >= d for c in survivors):
            return MigrationKind.INTRA_STAGE, COST.intra_stage_ms(d, p)
        return MigrationKind.INTER_STAGE, COST.inter_stage_ms(d, p, list(survivors), add)
    return MigrationKind.PIPELINE, COST.pipeline_ms(d, p, _missing(P, p, survivors), add)


def brute_force(N: int, D: int, P: int, n_in: int, n_out: int, targets) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Average over every n_out-subset of range(N): (reach, cost_ms, kind probabilities)."""
    reach = np.zeros(len(targets))
    cost = np.zeros(len(targets))
    kind = np.zeros((len(targets), len(KINDS)))
    alive = N + n_in - n_out
    subsets = list(itertools.combinations(range(N), n_out))
    for lost in subsets:
        lost = set(lost)
        survivors = tuple(sum(1 for r in range(D) if r * P + s not in lost) for s in range(P))
        lost_active = sum(1 for k in lost if k < D * P)
        for i, (d, p) in enumerate(targets):
            if d * p > alive:
                continue
            kd, c = _one_scenario(D, P, d, p, survivors, lost_active)
            reach[i] += 1
            cost[i] += c
            kind[i, _kind_index(kd)] += 1
    m = len(subsets)
    return reach / m, cost / m, kind / m


SHARED = ScenarioStore(PROFILE, COST)  # reused across cases: exercises the cache-extension path too

CASES = [
    (D, P, n_out, idle, n_in)
    for D in (1, 2, 3)
    for P in (1, 2, 3, 4)
    for n_out in (0, 1, 2, 3)
    for idle, n_in in ((0, 0), (2, 3))
    if n_out <= D * P + idle
]


@pytest.mark.parametrize("D, P, n_out, idle, n_in", CASES)
def test_outcome_matches_brute_force(D, P, n_out, idle, n_in):
    N = D * P + idle
    want = brute_force(N, D, P, n_in, n_out, TARGETS)
    for store in (SHARED, ScenarioStore(PROFILE, COST)):
        got = store.outcome(N, (D, P), n_in, n_out, TARGETS)
        assert got.targets == TARGETS
        np.testing.assert_allclose(got.reach, want[0], rtol=1e-9, atol=0)
        np.testing.assert_allclose(got.cost_ms, want[1], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(got.kind, want[2], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("D, P, n_out, idle, n_in", CASES[::3])
def test_bounds_bracket_exact_cost_and_pair_matches(D, P, n_out, idle, n_in):
    """`bounds` (the optimizer's pruning) never cut off the exact cost; `pair` is one entry of `mixed`."""
    N = D * P + idle
    store = ScenarioStore(PROFILE, COST)
    f = IntervalForecast.point(N, n_in, n_out)
    exact = store.mixed(f, (D, P), TARGETS)
    reach, lo, hi = store.bounds(f, (D, P), TARGETS)
    np.testing.assert_array_equal(reach, exact.reach)
    assert np.all(lo <= exact.cost_ms * (1 + 1e-12) + 1e-9)
    assert np.all(exact.cost_ms <= hi * (1 + 1e-12) + 1e-9)
    for i, t in enumerate(TARGETS):
        q, c, kind = store.pair(f, (D, P), t)
        assert q == exact.reach[i]
        assert c == pytest.approx(exact.cost_ms[i], rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(kind, exact.kind[i], rtol=1e-12, atol=1e-15)


def test_case_matrix_covers_every_kind_of_target():
    """The targets above include p == P, p < P, p > P, d < D, d > D and unreachable ones."""
    D, P, N, n_in, n_out = 2, 3, 6, 0, 2
    got = SHARED.outcome(N, (D, P), n_in, n_out, TARGETS)
    alive = N + n_in - n_out
    kinds = {k: got.kind[:, _kind_index(k)].sum() for k in KINDS}
    assert kinds[MigrationKind.INTRA_STAGE] > 0 and kinds[MigrationKind.INTER_STAGE] > 0
    assert kinds[MigrationKind.PIPELINE] > 0
    unreachable = [t for t in TARGETS if t[0] * t[1] > alive]
    assert unreachable and all(got.of(t) == (0.0, 0.0) for t in unreachable)
    assert all(got.reach[i] == 1.0 for i, t in enumerate(TARGETS) if t[0] * t[1] <= alive)
    # kind probabilities of reachable targets sum to 1, unreachable ones to 0
    np.testing.assert_allclose(got.kind.sum(axis=1), got.reach, rtol=1e-12)


@pytest.mark.parametrize("n_out", [0, 1, 2])
def test_start_from_nothing(n_out):
    N = 5
    got = SHARED.outcome(N, (0, 0), 2, n_out, TARGETS)
    want = brute_force(N, 0, 0, 2, n_out, TARGETS)
    np.testing.assert_allclose(got.reach, want[0], rtol=1e-9)
    np.testing.assert_allclose(got.cost_ms, want[1], rtol=1e-9)
    np.testing.assert_allclose(got.kind, want[2], rtol=1e-9)
    for i, (d, p) in enumerate(TARGETS):
        if got.reach[i]:
            assert got.cost_ms[i] == pytest.approx(COST.start_ms(d, p), rel=1e-12)
            assert got.kind[i, _kind_index(MigrationKind.START)] == 1.0


def test_staying_put_without_losses_is_free():
    got = SHARED.outcome(8, (2, 3), 0, 0, [(2, 3), (1, 3)])
    assert got.of((2, 3)) == (1.0, 0.0)
    assert got.kind[0, _kind_index(MigrationKind.NONE)] == 1.0
    # dropping a replica with nobody lost is an intra-stage migration
    assert got.of((1, 3)) == (1.0, pytest.approx(COST.intra_stage_ms(1, 3)))


def test_losing_only_idle_instances_is_free():
    # (D, P) = (2, 2) on N = 6: instances 4 and 5 are idle; one preemption hits an idle one with prob 2/6
    got = SHARED.outcome(6, (2, 2), 0, 1, [(2, 2)])
    assert got.kind[0, _kind_index(MigrationKind.NONE)] == pytest.approx(2 / 6, rel=1e-12)


# ------------------------------------------------------------------------------------ structure


def test_n_only_enters_through_hypergeometric_weights():
    D, P, n_out, n_in = 2, 3, 2, 6
    store = ScenarioStore(PROFILE, COST)
    targets = [(d, p) for d, p in TARGETS if d * p <= D * P - n_out + n_in]
    per_k = [store.outcome(D * P, (D, P), n_in, k, targets) for k in range(n_out + 1)]  # N = D*P: k = n_out
    for N in (6, 7, 9, 12):
        got = store.outcome(N, (D, P), n_in + (D * P - N), n_out, targets)  # same alive count
        w = hypergeom.pmf(np.arange(n_out + 1), N, D * P, n_out)
        np.testing.assert_allclose(got.cost_ms, sum(wk * o.cost_ms for wk, o in zip(w, per_k)), rtol=1e-9)
        np.testing.assert_allclose(got.kind, sum(wk * o.kind for wk, o in zip(w, per_k)), rtol=1e-9, atol=1e-15)


def test_idle_instances_change_nothing_without_preemptions():
    D, P = 2, 2
    store = ScenarioStore(PROFILE, COST)
    targets = [(d, p) for d, p in TARGETS if d * p <= D * P]
    base = store.outcome(D * P, (D, P), 0, 0, targets)
    for N in (5, 7, 10):
        got = store.outcome(N, (D, P), 0, 0, targets)
        # equal up to rounding: the hypergeometric weight of k = 0 is 1 within an ulp or two
        np.testing.assert_allclose(got.cost_ms, base.cost_ms, rtol=1e-14)
        np.testing.assert_allclose(got.kind, base.kind, rtol=1e-14)
        np.testing.assert_array_equal(got.reach, base.reach)


def test_cache_returns_identical_results():
    store = ScenarioStore(PROFILE, COST)
    a = store.outcome(9, (2, 4), 1, 3, TARGETS)
    b = store.outcome(9, (2, 4), 1, 3, TARGETS)
    for x, y in ((a.reach, b.reach), (a.cost_ms, b.cost_ms), (a.kind, b.kind)):
        np.testing.assert_array_equal(x, y)
    # same key, other target order: the answer follows the targets
    rev = tuple(reversed(TARGETS))
    c = store.outcome(9, (2, 4), 1, 3, rev)
    assert c.targets == rev
    np.testing.assert_array_equal(c.cost_ms, a.cost_ms[::-1])
    np.testing.assert_array_equal(c.kind, a.kind[::-1])
    # a fresh store agrees exactly
    d = ScenarioStore(PROFILE, COST).outcome(9, (2, 4), 1, 3, TARGETS)
    np.testing.assert_array_equal(d.cost_ms, a.cost_ms)
    store.clear()
    e = store.outcome(9, (2, 4), 1, 3, TARGETS)
    np.testing.assert_array_equal(e.cost_ms, a.cost_ms)


def test_outcome_errors():
    with pytest.raises(ValueError):
        SHARED.outcome(5, (2, 3), 0, 0, TARGETS)  # 6 instances in use on N = 5
    with pytest.raises(ValueError):
        SHARED.outcome(5, (1, 2), 0, 6, TARGETS)


# -------------------------------------------------------------------------------------- forecasts


def test_mixed_is_weighted_average_of_points():
    store = ScenarioStore(PROFILE, COST)
    N, cur = 8, (2, 3)
    f = IntervalForecast(N, ((0, 2, 0.3), (3, 0, 0.7)))
    got = store.mixed(f, cur, TARGETS)
    a = store.outcome(N, cur, 0, 2, TARGETS)
    b = store.outcome(N, cur, 3, 0, TARGETS)
    np.testing.assert_allclose(got.reach, 0.3 * a.reach + 0.7 * b.reach, rtol=1e-12)
    np.testing.assert_allclose(got.cost_ms, 0.3 * a.cost_ms + 0.7 * b.cost_ms, rtol=1e-12)
    np.testing.assert_allclose(got.kind, 0.3 * a.kind + 0.7 * b.kind, rtol=1e-12)
    # a target reachable only with the additions has reach 0.7
    assert got.of((4, 2))[0] == pytest.approx(0.7)
    # a point forecast is the point outcome
    pt = store.mixed(IntervalForecast.point(N, 0, 2), cur, TARGETS)
    np.testing.assert_array_equal(pt.cost_ms, a.cost_ms)


def test_mixed_raises_n_to_the_instances_held():
    store = ScenarioStore(PROFILE, COST)
    got = store.mixed(IntervalForecast.point(4, 1, 1), (2, 3), TARGETS)
    want = store.outcome(6, (2, 3), 1, 1, TARGETS)
    np.testing.assert_array_equal(got.cost_ms, want.cost_ms)
    np.testing.assert_array_equal(got.reach, want.reach)


def test_interval_forecast_validation():
    with pytest.raises(ValueError):
        IntervalForecast(-1)
    with pytest.raises(ValueError):
        IntervalForecast(5, ())
    with pytest.raises(ValueError):
        IntervalForecast(5, ((0, 1, 0.5), (1, 0, 0.4)))  # sums to 0.9
    with pytest.raises(ValueError):
        IntervalForecast(5, ((0, 1, 1.5), (1, 0, -0.5)))  # negative weight
    with pytest.raises(ValueError):
        IntervalForecast(5, ((0, 6, 1.0),))  # more preemptions than instances
    with pytest.raises(ValueError):
        IntervalForecast(5, ((-1, 0, 1.0),))
    with pytest.raises(ValueError):
        IntervalForecast(5, ((0, -1, 1.0),))
    f = IntervalForecast(5, ((2, 0, 0.25), (0, 3, 0.75)))
    assert f.expected_available == pytest.approx(5 + 0.5 - 2.25)
    assert IntervalForecast.point(4, 1, 2).events == ((1, 2, 1.0),)
