"""Tests of liveput.network, liveput.model_spec (partition) and liveput.migration, against hand-computed
values and the reference numbers of parcae-reference §D.2, §E.3 and §E.4."""

from __future__ import annotations

import math
import random

import pytest
from _small_model import brute_force_min_missing, overlap, small_spec

from liveput.migration import CostModel, assign_stages
from liveput.model_spec import load_model_spec
from liveput.network import P3_P2P, GiB, MiB, P2PTable, p2p_ms

GPT = CostModel.reference("gpt-1.5b")

# ----------------------------------------------------------------------------------- p2p table (§E.3)


@pytest.mark.parametrize(
    "nbytes, us",
    [
        (4, 142.907),
        (8, 139.679),
        (1024, 137.372),
        (64 * 1024, 194.492),
        (MiB, 1428.108),
        (32 * MiB, 38560.219),
        (512 * MiB, 601380.752),
        (GiB, 1198255.900),
    ],
)
def test_p2p_at_table_points(nbytes, us):
    assert P3_P2P.ms(nbytes) == pytest.approx(us / 1000.0, rel=1e-12)
    assert p2p_ms(nbytes) == P3_P2P.ms(nbytes)


def test_p2p_interpolates_linearly_between_points():
    # halfway between 2 KiB (140.417 us) and 4 KiB (141.651 us)
    assert P3_P2P.ms(3 * 1024) == pytest.approx((140.417 + 141.651) / 2 / 1000, rel=1e-12)
    # a quarter of the way from 1 MiB (1428.108) to 2 MiB (3006.771)
    nbytes = MiB + MiB // 4
    assert P3_P2P.ms(nbytes) == pytest.approx((1428.108 + 0.25 * (3006.771 - 1428.108)) / 1000, rel=1e-12)
    # just above a point is just above its value (bisect_left picks the segment to the right)
    assert P3_P2P.ms(MiB + 1) > P3_P2P.ms(MiB)


def test_p2p_below_first_point_and_empty():
    for nbytes in (1, 2, 3, 3.5):
        assert P3_P2P.ms(nbytes) == pytest.approx(0.142907, rel=1e-12)
    assert P3_P2P.ms(0) == 0.0
    assert P3_P2P.ms(-10) == 0.0


def test_p2p_above_last_point_is_linear_from_origin():
    assert P3_P2P.ms(2 * GiB) == pytest.approx(2 * 1198.2559, rel=1e-12)
    # the §E.3 reference values: p2p(1 GB) (interpolated, below 1 GiB) and p2p(4 GB) (extrapolated)
    assert P3_P2P.ms(1e9) == pytest.approx(1116.27, abs=0.005)
    assert P3_P2P.ms(4e9) == pytest.approx(4463.85, abs=0.005)


def test_p2p_table_validation():
    with pytest.raises(ValueError):
        P2PTable(points=((8, 1.0), (4, 2.0)))
    with pytest.raises(ValueError):
        P2PTable(points=((4, 1.0), (4, 2.0)))
    with pytest.raises(ValueError):
        P2PTable(points=())


# ---------------------------------------------------------------------------- gpt-1.5b constants (§D.2)


@pytest.mark.parametrize("d, p, ms", [(4, 8, 2043.5), (3, 8, 1689.8), (2, 16, 2279.3)])
def test_gpt15b_intra_stage(d, p, ms):
    assert GPT.intra_stage_ms(d, p) == pytest.approx(ms, abs=0.05)
    # by formula: 35 + 39.3 * (d + p + 1 + d*p) + proc 240
    assert GPT.intra_stage_ms(d, p) == pytest.approx(35 + 39.3 * (d + p + 1 + d * p) + 240, rel=1e-12)


def test_gpt15b_restart():
    assert GPT.restart_ms(4, 8, add=True) == pytest.approx(32189.8, abs=0.1)
    assert GPT.restart_ms(4, 8, add=False) == pytest.approx(4858.3, abs=0.1)
    # 45 comm groups x 500 ms = 22.5 s of the add restart
    assert GPT.comm_groups_ms(4, 8, add=True) == pytest.approx(35 + 500 * 45, rel=1e-12)
    assert GPT.concurrent_restart_ms(4, 8) == GPT.restart_ms(4, 8, add=False)


@pytest.mark.parametrize(
    "p, ms", [(6, 3674.8), (8, 2814.8), (12, 1954.8), (16, 1524.8), (24, 1094.8), (32, 1094.8), (48, 664.8)]
)
def test_gpt15b_build(p, ms):
    assert GPT.constants.build(p) == pytest.approx(ms, abs=0.1)
    assert GPT.constants.build(p) == pytest.approx(P3_P2P.ms(50257 * 1024 * 4) + 430 * math.ceil(48 / p), rel=1e-12)


def test_gpt67b_group_rate():
    cm = CostModel.reference("gpt-6.7b")
    assert cm.comm_groups_ms(2, 12, add=False) == pytest.approx(35 + 115.6 * (2 + 12 + 1 + 24), rel=1e-12)
    assert cm.comm_groups_ms(2, 12, add=True) == pytest.approx(35 + 500 * (2 + 12 + 1 + 24), rel=1e-12)
    assert cm.restart_ms(2, 12, add=True) == pytest.approx(6600 + 2000 + 35 + 500 * 39 + 240 + 7961, rel=1e-12)


# ---------------------------------------------------------------------- other models' comm groups (§D.2)


@pytest.mark.parametrize("d, p", [(2, 4), (1, 9), (3, 3)])
def test_vgg19_comm_groups_per_instance(d, p):
    cm = CostModel.reference("vgg19")
    assert cm.comm_groups_ms(d, p, add=True) == pytest.approx(35 + 440 * d * p, rel=1e-12)
    assert cm.comm_groups_ms(d, p, add=False) == pytest.approx(35 + 340 * d * p, rel=1e-12)
    build = {2: 110, 3: 94, 4: 90, 9: 106}[p]
    # restart: rendezvous 6600 + extra 2000 (add only) + groups + proc 30 + build
    assert cm.restart_ms(d, p, add=True) == pytest.approx(6600 + 2000 + 35 + 440 * d * p + 30 + build, rel=1e-12)
    assert cm.restart_ms(d, p, add=False) == pytest.approx(35 + 340 * d * p + 30 + build, rel=1e-12)


@pytest.mark.parametrize("model", ["bert", "resnet152"])
@pytest.mark.parametrize("d, g", [(1, 1000), (5, 1000), (6, 1500), (11, 1500), (12, 2000), (16, 2000)])
def test_replica_step_comm_groups(model, d, g):
    cm = CostModel.reference(model)
    assert cm.comm_groups_ms(d, 2, add=False) == pytest.approx(35 + g, rel=1e-12)
    assert cm.comm_groups_ms(d, 2, add=True) == pytest.approx(35 + 1.5 * g, rel=1e-12)
    # independent of p
    assert cm.comm_groups_ms(d, 8, add=True) == cm.comm_groups_ms(d, 2, add=True)


def test_resnet152_restart_extra():
    cm = CostModel.reference("resnet152")
    assert cm.restart_ms(2, 4, add=True) == pytest.approx(6600 + 3360.374 + 35 + 1500 + 30 + 90, rel=1e-12)
    assert cm.restart_ms(2, 4, add=False) == pytest.approx(35 + 1000 + 30 + 90, rel=1e-12)


def test_unprofiled_p_raises_value_error_naming_p():
    with pytest.raises(ValueError, match=r"P=9\b"):
        CostModel.reference("bert").restart_ms(1, 9, add=False)
    with pytest.raises(ValueError, match=r"P=17\b"):
        CostModel.reference("gpt-6.7b").restart_ms(1, 17, add=True)


# ---------------------------------------------------------------------------------- partition (§E.4)


def test_gpt15b_partition_p8():
    spec = load_model_spec("gpt-1.5b")
    assert spec.partition(8) == (0, 7, 13, 19, 25, 31, 37, 44, 50)
    assert [round(x / 1e6, 1) for x in spec.stage_params(8)] == [266.6, 184.4, 184.4, 184.4, 184.4, 184.4, 215.2, 235.8]
    assert sum(spec.stage_params(8)) == spec.total_params == 1_639_811_200
    assert spec.stage_bytes(8) == tuple(12 * n for n in spec.stage_params(8))


# ---------------------------------------------------------------------------------- inter-stage (§D.2)


def test_inter_stage_serial_z_dominates():
    d, p = 3, 8
    t = GPT.stage_transfer_ms(p)
    survivors = [3, 0, 2, 3, 0, 3, 3, 1]
    # need = d - survivors = [0, 3, 1, 0, 3, 0, 0, 2]: stages 1, 2, 4 and 7 are short.
    # Short stages refill in parallel from their own surviving replicas: the slowest one counts.
    parallel = max(t[1], t[2], t[4], t[7])
    # Stages 1 and 4 lost every replica, and the last stage is down to one replica (d >= 2): these
    # are restored one after another from the single hand-off holder, so their times add up (Z).
    serial = t[1] + t[4] + t[7]
    assert serial > parallel  # two 184 M stages + the 236 M head in series beat the slowest single one
    for add in (True, False):
        expected = max(parallel, serial) + GPT.restart_ms(d, p, add)
        assert GPT.inter_stage_ms(d, p, survivors, add) == pytest.approx(expected, rel=1e-12)


def test_inter_stage_parallel_max_dominates():
    d, p = 3, 8
    t = GPT.stage_transfer_ms(p)
    # stage 0 (the 267 M embedding stage) is short by one, last stage keeps 2 of 3: nothing is in Z
    survivors = [2, 3, 3, 3, 3, 3, 3, 2]
    expected = max(t[0], t[7]) + GPT.restart_ms(d, p, False)
    assert GPT.inter_stage_ms(d, p, survivors, False) == pytest.approx(expected, rel=1e-12)
    # one stage wiped out (Z = {5}) and stage 0 short: max(max(t0, t5), t5) = t0
    survivors = [1, 3, 3, 3, 3, 0, 3, 3]
    expected = max(max(t[0], t[5]), t[5]) + GPT.restart_ms(d, p, True)
    assert GPT.inter_stage_ms(d, p, survivors, True) == pytest.approx(expected, rel=1e-12)


def test_inter_stage_with_nobody_short_is_intra_stage():
    assert GPT.inter_stage_ms(2, 8, [2, 3, 2, 2, 4, 2, 2, 2], add=True) == GPT.intra_stage_ms(2, 8)


# ---------------------------------------------------------------------------------- pipeline (§D.2)


def test_pipeline_ms_formula():
    spec = GPT.spec
    missing = 500_000_000
    d, p = 4, 6
    expected = P3_P2P.ms(12 * missing) + max(GPT.stage_transfer_ms(p)) + GPT.restart_ms(d, p, True)
    assert GPT.pipeline_ms(d, p, missing, add=True) == pytest.approx(expected, rel=1e-12)
    # no broadcast with a single replica
    assert GPT.pipeline_ms(1, p, missing, add=False) == pytest.approx(
        P3_P2P.ms(12 * missing) + GPT.restart_ms(1, p, False), rel=1e-12
    )
    assert GPT.start_ms(2, 8) == GPT.pipeline_ms(2, 8, spec.total_params, add=True)


def test_pipeline_sums_every_new_stages_missing_params():
    """The reference overwrote the sum with the last stage's missing parameters (§D.2 bug, §I.6)."""
    spec = GPT.spec
    old, new = spec.partition(8), spec.partition(6)
    survivors = [4] * 8  # 4x8 -> 4x6 with nobody lost
    chosen, missing = assign_stages(spec.layer_params, old, new, survivors)
    per_stage = []
    for j, s in enumerate(chosen):
        rng = (new[j], new[j + 1])
        held = overlap(spec.layer_params, rng, (old[s], old[s + 1])) if s is not None else 0
        per_stage.append(sum(spec.layer_params[rng[0] : rng[1]]) - held)
    assert missing == sum(per_stage)
    assert sum(1 for m in per_stage if m > 0) >= 2  # several stages fetch something ...
    assert missing > per_stage[-1]  # ... so "last stage only" is strictly less
    cost = GPT.pipeline_ms(4, 6, missing, add=False)
    buggy = GPT.pipeline_ms(4, 6, per_stage[-1], add=False)
    assert cost == pytest.approx(
        P3_P2P.ms(12 * sum(per_stage)) + max(GPT.stage_transfer_ms(6)) + GPT.restart_ms(4, 6, False)
    )
    assert cost > buggy


# ------------------------------------------------------------------------- assign_stages: the optimum


def _check_assignment(layer_params, old, new, survivors):
    chosen, missing = assign_stages(layer_params, old, new, survivors)
    assert len(chosen) == len(new) - 1
    # the returned assignment is valid and its missing parameters are what it reports
    for s in range(len(old) - 1):
        assert sum(1 for c in chosen if c == s) <= survivors[s]
    recount = 0
    for j, s in enumerate(chosen):
        rng = (new[j], new[j + 1])
        held = overlap(layer_params, rng, (old[s], old[s + 1])) if s is not None else 0
        recount += sum(layer_params[rng[0] : rng[1]]) - held
    assert recount == missing
    assert missing == brute_force_min_missing(layer_params, old, new, survivors)
    return chosen, missing


def test_assign_stages_beats_greedy_on_hand_case():
    # layers [4, 5, 10]; old stages B = layer 0 (4), A = layers 1-2 (15); new stages X = layers 0-1, Y = layer 2.
    # Greedy in stage order gives X the larger overlap (A: 5) and leaves Y nothing: 4 + 10 = 14 missing.
    # The optimum gives X to B (fetch 5) and Y to A (fetch 0): 5 missing.
    chosen, missing = _check_assignment([4, 5, 10], (0, 1, 3), (0, 2, 3), [1, 1])
    assert missing == 5
    assert chosen == [0, 1]


def test_assign_stages_trivial_cases():
    lp = [3, 1, 4, 1, 5, 9]
    cuts = (0, 2, 4, 6)
    assert _check_assignment(lp, cuts, cuts, [1, 1, 1]) == ([0, 1, 2], 0)
    assert _check_assignment(lp, cuts, cuts, [0, 0, 0])[1] == sum(lp)
    # one old stage holding everything serves at most as many new stages as it has survivors
    assert _check_assignment(lp, (0, 6), (0, 3, 6), [1])[1] == min(3 + 1 + 4, 1 + 5 + 9)
    assert _check_assignment(lp, (0, 6), (0, 3, 6), [2])[1] == 0


def _random_cuts(rng: random.Random, n_layers: int, p: int) -> tuple[int, ...]:
    return (0, *sorted(rng.sample(range(1, n_layers), p - 1)), n_layers)


def test_assign_stages_is_optimal_on_random_small_cases():
    rng = random.Random(1234)
    for _ in range(400):
        n_layers = rng.randint(2, 9)
        layer_params = [rng.randint(1, 40) for _ in range(n_layers)]
        P = rng.randint(1, min(6, n_layers))
        p = rng.randint(1, min(6, n_layers))
        survivors = [rng.randint(0, 3) for _ in range(P)]
        _check_assignment(layer_params, _random_cuts(rng, n_layers, P), _random_cuts(rng, n_layers, p), survivors)


def test_assign_stages_is_optimal_on_uniform_partitions():
    rng = random.Random(99)
    for _ in range(200):
        n_layers = rng.randint(3, 10)
        layer_params = [rng.randint(1, 60) for _ in range(n_layers)]
        P = rng.randint(1, min(6, n_layers - 1))
        p = rng.randint(1, min(6, n_layers - 1))
        survivors = [rng.randint(0, 2) for _ in range(P)]
        spec = small_spec(layer_params)
        _check_assignment(layer_params, spec.partition(P), spec.partition(p), survivors)
