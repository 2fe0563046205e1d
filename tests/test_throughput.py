"""Tests of liveput.throughput: the bundled §E.2 tables, feasibility, best(), persistence, the 1F1B estimator."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from liveput.model_spec import load_model_spec
from liveput.network import P3_P2P
from liveput.throughput import (
    InfeasibleStrategy,
    ThroughputProfile,
    estimate_profile,
    load_profile,
    parse_strategy,
    profile_names,
    simulate_1f1b,
    strategy_key,
    strategy_text,
)

MODELS = ("gpt-1.5b", "gpt-6.7b", "bert", "resnet152", "vgg19")


def test_a_strategy_has_one_key_that_parses_back_and_one_text_for_people() -> None:
    for strategy in [(4, 8), (1, 1), (0, 0), (12, 3)]:
        assert parse_strategy(strategy_key(strategy)) == strategy
    assert strategy_key([2, 3]) == "2x3" and parse_strategy("2X3") == (2, 3)  # JSON lists; either case
    assert [strategy_text(s) for s in [(2, 3), [1, 4], (0, 0), None, []]] == ["2x3", "1x4", "idle", "-", "-"]
    with pytest.raises(ValueError, match="expected 'DxP'"):
        parse_strategy("2by3")


# ----------------------------------------------------------------------------------- bundled tables

# §E.1 / §E.2 headers: (global batch, micro batch, entries)
HEADERS = {
    "gpt-1.5b": (128, 1, 47),
    "gpt-6.7b": (64, 1, 10),
    "bert": (1024, 8, 62),
    "resnet152": (2048, 32, 42),
    "vgg19": (2048, 32, 48),
}

# §A.5: (min P, max P, excluded P, excluded D)
CONSTRAINTS = {
    "gpt-1.5b": (6, 32, set(), set()),
    "gpt-6.7b": (12, 32, {17, 19, 21, 23, 25, 27, 28, 29, 30, 31, 32}, set()),
    "bert": (2, 16, {9, 11, 13, 15}, set()),
    "vgg19": (2, 9, set(), {1}),
    "resnet152": (2, 16, {3, 5, 7, 9, 11, 13, 15}, set()),
}

# §E.2 "Throughput-optimal (D,P) by N" as (N from, N to, (D, P)); N below the first range is infeasible.
OPTIMAL_BY_N = {
    "gpt-1.5b": [(n, n, (1, n)) for n in range(6, 12)]
    + [
        (12, 12, (2, 6)),
        (13, 13, (1, 13)),
        (14, 15, (2, 7)),
        (16, 16, (2, 8)),
        (17, 17, (1, 17)),
        (18, 19, (2, 9)),
        (20, 20, (2, 10)),
        (21, 21, (3, 7)),
        (22, 23, (2, 11)),
        (24, 25, (3, 8)),
        (26, 29, (2, 13)),
        (30, 31, (3, 10)),
        (32, 32, (4, 8)),
    ],
    "gpt-6.7b": [(12, 12, (1, 12)), (13, 15, (1, 13)), (16, 23, (1, 16)), (24, 32, (2, 12))],
    "bert": [
        (2, 2, (1, 2)),
        (3, 3, (1, 3)),
        (4, 5, (2, 2)),
        (6, 7, (3, 2)),
        (8, 8, (4, 2)),
        (9, 9, (3, 3)),
        (10, 11, (5, 2)),
        (12, 13, (6, 2)),
        (14, 14, (7, 2)),
        (15, 15, (5, 3)),
        (16, 19, (4, 4)),
        (20, 20, (10, 2)),
        (21, 21, (7, 3)),
        (22, 23, (11, 2)),
        (24, 25, (8, 3)),
        (26, 26, (13, 2)),
        (27, 29, (9, 3)),
        (30, 31, (10, 3)),
        (32, 32, (8, 4)),
    ],
    "resnet152": [
        (2, 3, (1, 2)),
        (4, 5, (2, 2)),
        (6, 7, (3, 2)),
        (8, 9, (4, 2)),
        (10, 11, (5, 2)),
        (12, 13, (6, 2)),
        (14, 15, (7, 2)),
        (16, 21, (8, 2)),
        (22, 23, (11, 2)),
        (24, 27, (12, 2)),
        (28, 31, (14, 2)),
        (32, 32, (16, 2)),
    ],
    "vgg19": [
        (4, 5, (2, 2)),
        (6, 7, (3, 2)),
        (8, 9, (4, 2)),
        (10, 11, (5, 2)),
        (12, 13, (6, 2)),
        (14, 15, (7, 2)),
        (16, 19, (8, 2)),
        (20, 21, (10, 2)),
        (22, 23, (11, 2)),
        (24, 25, (12, 2)),
        (26, 27, (13, 2)),
        (28, 29, (14, 2)),
        (30, 31, (15, 2)),
        (32, 32, (16, 2)),
    ],
}


def test_bundled_models_are_the_five_tables():
    assert set(profile_names()) == set(MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_table_header_and_entry_count(model):
    prof = load_profile(model)
    gbs, micro, entries = HEADERS[model]
    assert (prof.model, prof.global_batch, prof.micro_batch) == (model, gbs, micro)
    assert len(prof.iteration_ms) == entries
    assert "efedee7" in prof.source and "p3.2xlarge" in prof.source


@pytest.mark.parametrize("model", MODELS)
def test_constraints_match_a5(model):
    prof = load_profile(model)
    assert (prof.min_p, prof.max_p, set(prof.excluded_p), set(prof.excluded_d)) == CONSTRAINTS[model]
    # every shipped entry respects its model's limits, so all of them are candidates
    assert len(prof.strategies()) == HEADERS[model][2]


@pytest.mark.parametrize(
    ("model", "d", "p", "ms", "printed"),
    [
        ("gpt-1.5b", 4, 8, 2944.7, 43.47),
        ("gpt-1.5b", 1, 6, 8836.9, 14.48),
        ("gpt-1.5b", 2, 16, 3090.9, 41.41),
        ("gpt-1.5b", 1, 32, 3884.0, 32.96),
        ("gpt-6.7b", 2, 12, 5768.4, 11.10),
        ("gpt-6.7b", 2, 16, 8955.2, 7.15),
        ("bert", 1, 2, 15020.4, 68.17),
        ("bert", 8, 4, 1842.7, 555.71),
        ("vgg19", 2, 2, 4024.4, 508.89),
        ("vgg19", 3, 9, 3831.7, 534.49),
        ("resnet152", 1, 2, 14011.1, 146.17),
    ],
)
def test_cells_and_printed_samples_per_s(model, d, p, ms, printed):
    prof = load_profile(model)
    assert prof.iteration_ms[(d, p)] == ms
    assert prof.throughput(d, p) == pytest.approx(printed, abs=0.01)


def test_large_batch_cells_agree_with_printed_rate_up_to_ms_rounding():
    # §E.2 prints ms to 0.1; at GBS 2048 and ~650 ms that alone moves samples/s by ~0.24.
    prof = load_profile("resnet152")
    bound = 2048 * 1000 * 0.05 / 653.7**2 + 0.005
    assert prof.throughput(16, 2) == pytest.approx(3133.15, abs=bound)


@pytest.mark.parametrize("model", MODELS)
def test_optimal_by_n_matches_e2(model):
    prof = load_profile(model)
    ranges = OPTIMAL_BY_N[model]
    expected = {n: s for lo, hi, s in ranges for n in range(lo, hi + 1)}
    first = ranges[0][0]
    differs = []
    for n in range(1, 33):
        got = prof.best(n)
        if n < first:
            assert got is None, (model, n, got)
            continue
        want = expected[n]
        if got != want:  # a tie broken differently (§E.1 first-found vs ours): throughput must be equal
            differs.append((n, got, want))
            assert prof.throughput(*got) == pytest.approx(prof.throughput(*want), rel=1e-9)
            assert got[1] < want[1] or (got[1] == want[1] and got[0] * got[1] <= want[0] * want[1])
    # the only tie in the five tables: gpt-1.5b N=17, 2x8 and 1x17 both at 4341.3 ms (§E.1)
    assert differs == ([(17, (2, 8), (1, 17))] if model == "gpt-1.5b" else [])


# ------------------------------------------------------------------------------ queries and errors


def test_feasibility_and_errors_name_model_strategy_and_range():
    prof = load_profile("gpt-6.7b")
    assert prof.is_feasible(1, 12) and prof.is_feasible(2, 16)
    assert not prof.is_feasible(1, 11)  # P below min
    assert not prof.is_feasible(1, 17)  # excluded P
    assert not prof.is_feasible(3, 12)  # not in the table
    with pytest.raises(InfeasibleStrategy, match=r"gpt-6\.7b.*D=3 x P=12.*not in the table.*P in \[12, 32\]"):
        prof.throughput(3, 12)
    with pytest.raises(ValueError, match=r"P=17 is excluded"):
        prof.throughput(1, 17)
    with pytest.raises(InfeasibleStrategy, match=r"D=1 is excluded"):
        load_profile("vgg19").throughput(1, 2)


def test_strategies_sorted_by_p_then_d_and_filtered_by_instances():
    prof = load_profile("bert")
    allp = prof.strategies()
    assert list(allp) == sorted(allp, key=lambda s: (s[1], s[0]))
    assert prof.strategies(8) == tuple(s for s in allp if s[0] * s[1] <= 8)
    assert prof.strategies(1) == ()
    assert prof.best(1) is None


def test_as_arrays_follow_strategies_and_are_read_only():
    prof = load_profile("gpt-1.5b")
    d, p, thr = prof.as_arrays(16)
    assert list(zip(d.tolist(), p.tolist())) == list(prof.strategies(16))
    assert np.allclose(thr, [prof.throughput(*s) for s in prof.strategies(16)])
    assert not thr.flags.writeable
    best = int(np.argmax(thr))
    assert (int(d[best]), int(p[best])) == prof.best(16) == (2, 8)


def test_tie_break_prefers_fewer_stages_then_fewer_instances():
    prof = ThroughputProfile(
        "toy",
        global_batch=100,
        micro_batch=1,
        iteration_ms={(1, 4): 1000.0, (2, 2): 1000.0 * (1 + 1e-12), (3, 2): 1000.0, (1, 1): 2000.0},
    )
    assert prof.best(8) == (2, 2)  # equal within 1e-9 -> P=2 wins, then 4 instances beat 6
    assert prof.best(3) == (1, 1)


def test_profile_is_immutable_and_hashable():
    table = {(1, 2): 100.0, (2, 2): 60.0}
    prof = ThroughputProfile("toy", 8, 1, table)
    table[(4, 2)] = 1.0
    assert (4, 2) not in prof.iteration_ms
    with pytest.raises(TypeError):
        prof.iteration_ms[(4, 2)] = 1.0  # type: ignore[index]
    assert hash(prof) == hash(ThroughputProfile("toy", 8, 1, {(2, 2): 60.0, (1, 2): 100.0}))
    assert prof.max_p == 2


def test_json_round_trip_for_any_model_name(tmp_path):
    prof = ThroughputProfile(
        "my-trainer-model",
        global_batch=64,
        micro_batch=2,
        iteration_ms={(1, 1): 500.0, (2, 1): 260.0, (1, 2): 300.0},
        min_p=1,
        max_p=2,
        excluded_d=frozenset({3}),
        source="measured by the CPU trainer",
    )
    path = tmp_path / "p.json"
    prof.to_json(path)
    assert json.loads(path.read_text())["iteration_ms"] == {"1x1": 500.0, "2x1": 260.0, "1x2": 300.0}
    back = ThroughputProfile.from_json(path)
    assert back == prof and back.source == prof.source
    assert back.best(2) == (2, 1)


def test_bundled_files_round_trip_unchanged():
    for model in MODELS:
        prof = load_profile(model)
        assert ThroughputProfile.from_dict(json.loads(prof.to_json())) == prof


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"model": "x", "global_batch": 8, "micro_batch": 1, "iteration_ms": {"2by2": 1.0}}, "expected 'DxP'"),
        ({"model": "x", "global_batch": 8, "micro_batch": 1, "iteration_ms": {"1x2": -1.0}}, "positive"),
        ({"model": "x", "global_batch": 8, "iteration_ms": {}}, "missing micro_batch"),
        (
            {
                "model": "x",
                "global_batch": 8,
                "micro_batch": 1,
                "iteration_ms": {"1x2": 1.0},
                "constraints": {"min_p": 3, "max_p": 2},
            },
            "min_p <= max_p",
        ),
    ],
)
def test_bad_profiles_are_rejected(data, match):
    with pytest.raises(ValueError, match=match):
        ThroughputProfile.from_dict(data)


def test_unknown_model_lists_known_ones():
    with pytest.raises(KeyError, match="gpt-1.5b.*vgg19"):
        load_profile("gpt-2.7b")


def test_other_global_batch_falls_back_to_the_estimate_with_a_note():
    table = load_profile("gpt-1.5b")
    assert load_profile("gpt-1.5b", 128) is table
    est = load_profile("gpt-1.5b", 256)
    assert est.global_batch == 256 and "ANALYTIC ESTIMATE" in est.source and "GBS 128" in est.source
    assert (est.min_p, est.max_p, est.excluded_p) == (table.min_p, table.max_p, table.excluded_p)
    assert est.strategies() and all(p >= 6 and d * p <= 32 for d, p in est.strategies())


# --------------------------------------------------------------------------------- 1F1B simulator


@pytest.mark.parametrize("n_micro", [1, 3, 8])
def test_single_stage_is_serial(n_micro):
    assert simulate_1f1b([3.0], [5.0], n_micro, p2p_ms_per_edge=99.0) == n_micro * 8.0


@pytest.mark.parametrize(("p", "n_micro"), [(2, 1), (2, 2), (2, 7), (4, 4), (4, 9), (8, 3)])
def test_uniform_stages_give_classic_1f1b_makespan(p, n_micro):
    f, b = 2.0, 3.5
    assert simulate_1f1b([f] * p, [b] * p, n_micro) == pytest.approx((n_micro + p - 1) * (f + b))


def test_hand_computed_unequal_stages_with_p2p_and_tail():
    # P=2, n=1: F0 -> edge -> F1 -> B1 -> edge -> B0
    assert simulate_1f1b([1.0, 2.0], [2.0, 4.0], 1, p2p_ms_per_edge=0.5) == 1 + 0.5 + 2 + 4 + 0.5 + 2
    # P=2, n=2, no p2p. Stage 0: F0 [0,1] F1 [1,2] B0 [7,9] B1 [13,15];
    # stage 1: F0 [1,3] B0 [3,7] F1 [7,9] B1 [9,13].
    assert simulate_1f1b([1.0, 2.0], [2.0, 4.0], 2) == 15.0
    # tails are added per stage before the max: stage 1 ends at 13 + 3 = 16 > 15 + 0.5
    assert simulate_1f1b([1.0, 2.0], [2.0, 4.0], 2, stage_tail_ms=[0.5, 3.0]) == 16.0


def test_simulator_rejects_bad_input():
    with pytest.raises(ValueError):
        simulate_1f1b([1.0], [1.0, 2.0], 2)
    with pytest.raises(ValueError):
        simulate_1f1b([1.0], [1.0], 0)


# --------------------------------------------------------------------------------- the estimator


def test_estimate_formula_for_one_strategy():
    spec = load_model_spec("gpt-1.5b")
    est = estimate_profile(spec, 128, 32, min_p=6, max_p=8)
    d, p = 3, 8  # D does not divide GBS: ceil(128/3) = 43 micro-batches, 129 samples per iteration
    cuts = spec.partition(p)
    stages = [spec.layers[cuts[s] : cuts[s + 1]] for s in range(p)]
    fwd = [sum(x.fwd_ms for x in st) for st in stages]
    bwd = [sum(x.bwd_ms for x in st) for st in stages]
    tail = [P3_P2P.allreduce_ms(2 * n, d) + sum(x.opt_ms for x in st) for n, st in zip(spec.stage_params(p), stages)]
    # 8 stages of GPT-1.5B overflow 15.5 GiB of activations at stage 0, so the estimator recomputes there
    bwd_rc = [b + f if s == 0 else b for s, (f, b) in enumerate(zip(fwd, bwd))]
    edge = P3_P2P.ms(1 * 1024 * 1600 * 4)
    ms = simulate_1f1b(fwd, bwd_rc, 43, edge, tail)
    assert est.throughput(d, p) == pytest.approx(129 * 1000 / ms)
    assert {pp for _, pp in est.iteration_ms} == {6, 7, 8}


def test_estimate_memory_limit_prunes_strategies():
    spec = load_model_spec("gpt-1.5b")
    roomy = estimate_profile(spec, 128, 32)
    no_rc = estimate_profile(spec, 128, 32, recompute=False)
    assert set(no_rc.iteration_ms) < set(roomy.iteration_ms)
    assert not estimate_profile(spec, 128, 32, memory_gib=0.5).iteration_ms
    with pytest.raises(InfeasibleStrategy):
        estimate_profile(spec, 128, 32, memory_gib=0.5).throughput(1, 8)


def test_estimate_needs_layer_timings():
    with pytest.raises(ValueError, match="gpt-2.7b.*no forward/backward times"):
        estimate_profile(load_model_spec("gpt-2.7b"), 128, 32)


def test_estimate_ranking_correlates_with_the_gpt_1_5b_table():
    table = load_profile("gpt-1.5b")
    est = estimate_profile(load_model_spec("gpt-1.5b"), table.global_batch, 32)
    common = [s for s in table.strategies() if s in est.iteration_ms]
    assert len(common) == len(table.strategies())
    rho = spearmanr([table.throughput(*s) for s in common], [est.throughput(*s) for s in common]).statistic
    assert rho > 0.5, rho
    assert not math.isnan(rho)
