"""`trainer.observe.profile` / `parcae profile`: the visit schedule, the calibration on synthetic measurements (known
constants recovered), the profile file and its errors, one real profiling job feeding the planner, and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)
from typer.testing import CliRunner

from liveput.migration import CostConstants, CostModel, healthy_missing
from liveput.optimizer import IDLE, JobState, PlannerConfig, plan
from liveput.scenarios import IntervalForecast, ScenarioStore
from liveput.throughput import ThroughputProfile
from parcae.cli import app
from trainer.config import TrainConfig, model_config
from trainer.control.dry_run import check_schedule
from trainer.control.events import group_events, parse_events
from trainer.control.measure import (
    feasible_strategies,
    iteration_times,
    measure,
    profile_schedule,
    slowdown_pairs,
    visit_order,
    visit_rounds,
)
from trainer.observe.calibration import (
    Migration,
    calibrate,
    fit_build_ms,
    fit_group_costs,
    fit_line,
    fit_p2p,
    fit_slowdown,
    p2p_table,
    predict_ms,
    predict_time,
    split_lead_down,
)
from trainer.observe.profile import ProfileError, ProfileFormatError, RuntimeProfile, runtime_spec
from trainer.runtime.pipeline import partition

SPEC = runtime_spec("tiny-gpt")
KIB = 1024


# ---------------------------------------------------------------------------------------------------- schedule


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_the_schedule_visits_every_strategy_and_every_migration_kind(workers):
    strategies = feasible_strategies(workers, 6, 16)
    assert all(d * p <= workers and p <= 5 for d, p in strategies)
    order = visit_order(strategies)
    assert set(order) == set(strategies)
    sched = profile_schedule(workers, order, 2, 16)
    # the coordinator's own dry run of the schedule: the epochs the job will publish
    epochs = check_schedule(model_config("tiny-gpt"), TrainConfig(), workers, sched.initial, sched.steps,
                            group_events(parse_events(list(sched.events))))  # fmt: skip
    main = [e for e in epochs[1:] if e.start_step > sched.main_start and e.kind.value != "checkpoint-restart"]
    kinds = {e.kind.value for e in main}
    assert {"intra-stage", "inter-stage", "pipeline"} <= kinds
    assert epochs[-1].kind.value == "checkpoint-restart"
    assert epochs[2].start_step == sched.main_start and order[0] == (epochs[2].D, epochs[2].P)  # the add's epoch
    # every P of the visit is entered by a pipeline migration
    assert {e.P for e in main if e.kind.value == "pipeline"} == {p for _, p in strategies}
    if workers >= 3:  # two distinct group counts among the intra-stage migrations
        assert len({e.D + e.P + 1 + e.D * e.P for e in main if e.kind.value == "intra-stage"}) >= 2


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_rounds_visit_every_strategy_again_without_a_plan_that_changes_nothing(workers):
    order = visit_order(feasible_strategies(workers, 6, 16))
    twice = visit_rounds(order, 2)
    assert visit_rounds(order, 1) == order and twice[: len(order)] == order
    for s in set(order):
        assert twice.count(s) >= 2 * order.count(s) - (s == order[0])  # the shared first/last strategy counts once
    assert all(a != b for a, b in zip(twice, twice[1:]))
    sched = profile_schedule(workers, twice, 2, 16)
    epochs = check_schedule(model_config("tiny-gpt"), TrainConfig(), workers, sched.initial, sched.steps,
                            group_events(parse_events(list(sched.events))))  # fmt: skip
    visited = [(e.D, e.P) for e in epochs if sched.main_start <= e.start_step < sched.restart_step]
    assert all(visited.count(s) >= 2 for s in set(order))
    with pytest.raises(ProfileError, match="rounds must be >= 1"):
        visit_rounds(order, 0)


def test_schedule_needs_two_workers():
    with pytest.raises(ProfileError, match="workers must be >= 2"):
        profile_schedule(1, [(1, 1)], 2, 16)


def test_iteration_times_skip_the_prologue_and_unmeasured_spans():
    epochs = [
        {"strategy": [4, 1], "start_step": 0, "end_step": 2, "train_s": 0.3},  # prologue
        {"strategy": [4, 1], "start_step": 3, "end_step": 7, "train_s": 0.2},
        {"strategy": [2, 1], "start_step": 7, "end_step": 9, "train_s": 0.1},
        {"strategy": [4, 1], "start_step": 9, "end_step": 11, "train_s": 0.2},
        {"strategy": [4, 1], "start_step": 11, "end_step": 12, "train_s": None},  # last epoch: no end recorded
    ]
    got = iteration_times(epochs, first_step=3)
    assert got == {(4, 1): [pytest.approx(50.0), pytest.approx(100.0)], (2, 1): [pytest.approx(50.0)]}


# ---------------------------------------------------------------------------------------------------- fits


def test_fit_line_and_group_costs_recover_a_known_line():
    assert fit_line([1, 2, 3], [5, 7, 9]) == (pytest.approx(3.0), pytest.approx(2.0))
    base, per, how = fit_group_costs([(4, 7 + 3 * 4), (6, 7 + 3 * 6), (8, 7 + 3 * 8)])
    assert (base, per) == (pytest.approx(7.0), pytest.approx(3.0)) and "least squares" in how
    base, per, how = fit_group_costs([(6, 30.0), (6, 36.0)])  # one group count: all of it per group
    assert (base, per) == (0.0, pytest.approx(5.5)) and "one group count" in how
    base, per, how = fit_group_costs([(4, 40.0), (8, 20.0)])  # falling with the groups: noise, a constant
    assert (base, per) == (pytest.approx(30.0), 0.0) and "clamped" in how
    with pytest.raises(ProfileError, match="intra-stage"):
        fit_group_costs([])


def test_fit_p2p_recovers_latency_and_bandwidth():
    lat, per = 12.0, 1.0 / (40 * KIB)  # 12 ms + 40 KiB/ms
    pts = [(b, lat + per * b) for b in (100 * KIB, 600 * KIB, 2500 * KIB)]
    got_lat, got_per, _ = fit_p2p(pts)
    assert (got_lat, got_per) == (pytest.approx(lat), pytest.approx(per))
    table = p2p_table(got_lat, got_per, "test")
    assert table.ms(1000 * KIB) == pytest.approx(lat + per * 1000 * KIB)
    got_lat, got_per, how = fit_p2p([(1000, 1.0), (2000, 0.5), (3000, 3.0)])  # intercept < 0 -> through origin
    assert got_lat == 0.0 and got_per > 0 and "clamped" in how
    with pytest.raises(ProfileError, match="no transfer"):
        fit_p2p([])


def test_fit_build_ms_interpolates_and_extrapolates_and_says_so():
    build, how = fit_build_ms({2: [20.0, 22.0, 21.0], 4: [41.0], 5: [-3.0]}, ps=[1, 2, 3, 4, 5])
    assert build == {1: 21.0, 2: 21.0, 3: pytest.approx(31.0), 4: 41.0, 5: 0.0}
    assert how[2].startswith("measured") and how[5].endswith("clamped to 0)")
    assert how[3] == "interpolated between P=2 and P=4" and how[1].startswith("extrapolated")
    with pytest.raises(ProfileError, match="pipeline"):
        fit_build_ms({}, ps=[1])


def _truth() -> CostModel:
    build = {1: 5.0, 2: 8.0, 3: 11.0, 4: 14.0}
    return CostModel(SPEC, CostConstants(
        rendezvous_ms=2500.0, extra_restart_ms=0.0, proc_ms=0.0, group_base_ms=7.0, group_mode="groups",
        group_add_ms=3.0, group_remove_ms=3.0, build_ms=build, checkpoint_ms=900.0,
        p2p=p2p_table(12.0, 1.0 / (40 * KIB), "truth"),
    ))  # fmt: skip


def _synthetic(cost: CostModel) -> list[Migration]:
    """The migrations of a profile job, timed exactly as `cost` says (transfers on its p2p line)."""
    lp, part = SPEC.layer_params, SPEC.partition
    p2p = cost.constants.p2p

    def pipe(epoch, src, dst):
        missing = healthy_missing(lp, part(src[1]), part(dst[1]), src[0])
        xfer = missing * SPEC.bytes_per_param
        return Migration(epoch, epoch, "pipeline", src, dst, cost.pipeline_ms(*dst, missing, add=False),
                         transfer_ms=p2p.ms(xfer), transfer_bytes=xfer)  # fmt: skip

    stage1 = SPEC.stage_bytes(1)[0]
    return [
        Migration(2, 2, "intra-stage", (4, 1), (3, 1), 999.0, role="preempt"),  # contended: must not be fitted
        Migration(
            3,
            3,
            "inter-stage",
            (3, 1),
            (4, 1),
            321.0,
            role="add",
            add=True,
            join_ms=2500.0,
            transfer_ms=p2p.ms(stage1),
            transfer_bytes=stage1,
            survivors=(3,),
        ),
        Migration(4, 9, "intra-stage", (4, 1), (3, 1), cost.intra_stage_ms(3, 1)),
        Migration(5, 15, "intra-stage", (3, 1), (2, 1), cost.intra_stage_ms(2, 1)),
        Migration(6, 21, "intra-stage", (2, 1), (1, 1), cost.intra_stage_ms(1, 1)),
        pipe(7, (1, 1), (1, 2)),
        pipe(8, (2, 2), (1, 4)),
        Migration(
            9, 40, "checkpoint-restart", (1, 4), (1, 4), cost.checkpoint_restart_ms(1, 4, add=True), role="restart"
        ),
    ]


def test_calibrate_recovers_known_constants():
    truth = _truth()
    constants, report = calibrate(SPEC, _synthetic(truth), ps=[1, 2, 3, 4], source="synthetic")
    assert constants.group_mode == "groups"
    assert constants.group_base_ms == pytest.approx(7.0)
    assert constants.group_remove_ms == pytest.approx(3.0) and constants.group_add_ms == pytest.approx(3.0)
    assert constants.rendezvous_ms == pytest.approx(2500.0)
    for b in (4, 64 * KIB, 3 * 1024 * KIB):
        assert constants.p2p.ms(b) == pytest.approx(truth.constants.p2p.ms(b))
    # P=2 and P=4 measured; P=3 interpolated (the truth is linear); P=1 extrapolated from P=2, and recorded so
    assert constants.build_ms == {1: pytest.approx(8.0), 2: pytest.approx(8.0), 3: pytest.approx(11.0),
                                  4: pytest.approx(14.0)}  # fmt: skip
    assert report["sources"]["build_ms"]["1"].startswith("extrapolated")
    assert report["sources"]["build_ms"]["3"].startswith("interpolated")
    assert constants.checkpoint_ms == pytest.approx(900.0)
    for key in ("group_base_ms", "p2p", "rendezvous_ms", "checkpoint_ms", "build_ms"):
        assert key in constants.source
    rows = {r["epoch"]: r for r in report["rows"]}
    assert rows[2]["used_for"] == "" and "not fitted" in rows[2]["note"]
    for n in (4, 5, 6, 7, 8, 9):  # every fitted pause is reproduced by the calibrated model
        assert rows[n]["model_ms"] == pytest.approx(rows[n]["measured_ms"], rel=1e-9), rows[n]
    assert rows[3]["model_ms"] > rows[3]["measured_ms"]  # the model charges the whole join


def test_calibrate_names_what_is_missing():
    no_add = [m for m in _synthetic(_truth()) if m.role != "add"]
    with pytest.raises(ProfileError, match="added instance"):
        calibrate(SPEC, no_add, ps=[1, 2, 4])


def test_the_split_pairs_each_migration_with_its_prepared_run_and_the_model_s_split():
    """The full pauses (nothing prepared) beside the same epochs' prepared pauses: lead = full - down for a prepared
    migration, 0 for one the runtime did not prepare; the model's split is `predict_time`'s (its full cost the one
    the fits use)."""
    from dataclasses import replace

    truth = _truth()
    full = _synthetic(truth)
    prepared = [replace(m, pause_ms=m.pause_ms / 4, prepared=m.kind != "checkpoint-restart") for m in full]
    split = split_lead_down(truth, full, prepared)
    rows = {r["epoch"]: r for r in split["rows"]}
    for m in full:
        r, t = rows[m.epoch], predict_time(truth, m)
        assert r["full_ms"] == m.pause_ms and r["down_ms"] == m.pause_ms / 4
        assert r["lead_ms"] == (0.0 if m.kind == "checkpoint-restart" else pytest.approx(0.75 * m.pause_ms))
        assert (r["model_full_ms"], r["model_lead_ms"], r["model_down_ms"]) == (t.full_ms, t.lead_ms, t.down_ms)
        assert t.full_ms == predict_ms(truth, m) and t.lead_ms + t.down_ms >= t.full_ms - 1e-9  # (+ the catch-up)
    kinds = split["kinds"]
    assert {"notice", "addition", "intra-stage", "checkpoint-restart"} <= set(kinds)
    assert kinds["checkpoint-restart"]["prepared"] == 0 and kinds["checkpoint-restart"]["lead_ms"] == 0.0
    assert sum(k["count"] for k in kinds.values()) == len(full)
    with pytest.raises(ProfileError, match="same schedule"):
        split_lead_down(truth, full, prepared[1:])


def test_the_slowdown_is_the_median_extra_time_over_one_step_clamped():
    value, how = fit_slowdown([(10.0, 1.0), (10.0, 2.0), (20.0, 10.0), (10.0, -3.0)])
    assert value == pytest.approx(0.15) and "median over 4 epochs" in how and "quartiles" in how
    assert fit_slowdown([(10.0, -5.0)])[0] == 0.0 and "clamped" in fit_slowdown([(10.0, 50.0)])[1]
    value, how = fit_slowdown([])
    assert value is None and how.startswith("not measured") and "--steps-per-strategy" in how
    full = [{"epoch": n, "start_step": 2 * n, "end_step": 2 * n + 2, "train_s": 0.02, "last_step_s": 0.01}
            for n in range(5)]  # fmt: skip
    prep = [{**e, "train_s": 0.01, "last_step_s": 0.015} for e in full]  # (the whole epoch is not compared)
    prep[3]["last_step_s"] = None
    full[4]["end_step"] = 9  # one step: its last step is its first after the migration
    # epoch 0 is before the visit; epoch 2's successor was not prepared; epoch 3 has no prepared last step
    assert slowdown_pairs(full, prep, {2, 4, 5}, first_step=2) == [(10.0, pytest.approx(5.0))]


# ---------------------------------------------------------------------------------------------------- the file


def _synthetic_profile() -> RuntimeProfile:
    constants, report = calibrate(SPEC, _synthetic(_truth()), ps=[1, 2, 4], source="synthetic")
    thr = ThroughputProfile("tiny-gpt", 16, 2, {(1, 1): 30.0, (2, 1): 20.0, (1, 2): 25.0, (1, 4): 40.0}, source="t")
    return RuntimeProfile(thr, constants, SPEC, {"fit": report["rows"]}, "2026-01-01T00:00:00+00:00", "test")


def test_profile_round_trips_through_json(tmp_path):
    prof = _synthetic_profile()
    path = tmp_path / "p.json"
    prof.to_json(path)
    back = RuntimeProfile.load(path)
    assert back.to_dict() == prof.to_dict()
    assert dict(back.throughput.iteration_ms) == dict(prof.throughput.iteration_ms)
    assert back.constants.build_ms == prof.constants.build_ms and back.constants.p2p == prof.constants.p2p
    assert back.spec.bytes_per_param == 12 and back.spec.layer_params == SPEC.layer_params
    a, b = prof.cost_model(), back.cost_model()
    for d, p in ((1, 2), (2, 1), (1, 4)):
        assert b.restart_ms(d, p, add=True) == a.restart_ms(d, p, add=True)
        assert b.stage_transfer_ms(p) == a.stage_transfer_ms(p)


def test_float64_model_moves_twice_the_bytes():
    spec = runtime_spec(model_config("tiny-gpt", dtype="float64"))
    assert spec.bytes_per_param == 24 and spec.stage_bytes(1)[0] == 2 * SPEC.stage_bytes(1)[0]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        (None, "field 'format'"),  # a liveput throughput table: a foreign file
        ("drop:constants", "field 'constants' is missing"),
        ('set:constants.build_ms={"two": 3}', "constants.build_ms"),
        ('set:constants.group_base_ms="fast"', "constants.group_base_ms"),
        ("set:spec.layers=[]", "spec.layers"),
        ("set:version=99", "field 'version'"),
    ],
)
def test_bad_profile_files_name_the_file_and_field(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is None:
        path.write_text(ThroughputProfile("x", 16, 2, {(1, 1): 1.0}).to_json())
    elif content.startswith(("drop:", "set:")):
        data = _synthetic_profile().to_dict()
        if content.startswith("drop:"):
            del data[content[5:]]
        else:
            where, value = content[4:].split("=", 1)
            *parents, key = where.split(".")
            node = data
            for k in parents:
                node = node[k]
            node[key] = json.loads(value)
        path.write_text(json.dumps(data))
    else:
        path.write_text(content)
    with pytest.raises(ProfileFormatError) as err:
        RuntimeProfile.load(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_a_missing_profile_file_is_named(tmp_path):
    with pytest.raises(ProfileFormatError, match="nope.json"):
        RuntimeProfile.load(tmp_path / "nope.json")


# ---------------------------------------------------------------------------------------------------- real jobs


def test_measure_profiles_every_strategy_and_migration_and_feeds_the_planner(tmp_path):
    prof = measure("tiny-gpt", 3, steps_per_strategy=2, rounds=1, out_dir=tmp_path / "job",
                   start_method="forkserver", timeout_s=120)  # fmt: skip
    thr = prof.throughput
    feasible = feasible_strategies(3, 6, 16)
    assert set(thr.strategies()) == set(feasible)
    assert all(thr.iteration_ms[s] > 0 and math.isfinite(thr.iteration_ms[s]) for s in feasible)
    # the epochs tile the job (Coordinator.epoch_spans); every visit epoch has a measured span
    spans = prof.measured["epochs"]
    assert [e["end_step"] for e in spans[:-1]] == [e["start_step"] for e in spans[1:]]
    assert spans[-1]["end_step"] == prof.measured["job"]["steps"] and spans[-1]["train_s"] is None
    assert all(e["train_s"] > 0 for e in spans[:-1])
    # the stages were cut by the times measured per layer, as the jobs that plan with the profile cut them
    layer_ms = prof.stage_costs()
    assert len(layer_ms) == 6 and all(ms > 0 for ms in layer_ms)
    assert all(tuple(e["bounds"]) == partition(layer_ms, e["strategy"][1]) for e in spans), spans
    migrations = prof.measured["migrations"]
    main = {m["kind"] for m in migrations if m["role"] == "main"}
    assert {"intra-stage", "inter-stage", "pipeline"} <= main
    assert [m["kind"] for m in migrations if m["role"] == "restart"] == ["checkpoint-restart"]
    add = [m for m in migrations if m["role"] == "add"]
    assert len(add) == 1 and add[0]["join_ms"] > 0 and add[0]["bytes_moved"] > 0
    assert all(m["pause_ms"] > 0 for m in migrations)
    assert len(prof.measured["fit"]) == len(migrations)
    c = prof.constants
    assert set(c.build_ms) == {p for _, p in feasible} and c.rendezvous_ms > 0 and c.group_mode == "groups"
    assert prof.measured["machine"]["start_method"] == "forkserver"
    assert prof.measured["machine"]["device"] == "cpu" and prof.device_type == "cpu"  # measure's default device
    assert (prof.measured["job"]["device"], prof.measured["job"]["device_type"]) == ("cpu", "cpu")
    # the profile is what the planner runs on
    store = ScenarioStore(thr, prof.cost_model())
    forecast = [IntervalForecast.point(3), IntervalForecast(3, ((0, 0, 0.7), (0, 1, 0.3))), IntervalForecast.point(2)]
    decision = plan(store, forecast, JobState((3, 1)), PlannerConfig(interval_s=10.0, look_ahead=3)).decision
    assert decision != IDLE and thr.is_feasible(*decision) and decision[0] * decision[1] <= 3
    # and it survives its file
    path = tmp_path / "profile.json"
    prof.to_json(path)
    back = RuntimeProfile.load(path)
    assert back.to_dict() == prof.to_dict()
    # the constants are fitted on full stops: the first run prepared nothing; the second run, the same schedule,
    # prepared every migration the runtime prepares (a scripted notice, a plan; not the prologue's add, whose
    # instance starts at its boundary, nor the checkpoint-restart) and trained the same losses
    assert not any(m["prepared"] for m in migrations)
    prep = prof.measured["prepared"]
    assert prep["loss_first_last"] == prof.measured["job"]["loss_first_last"]
    kinds = prep["kinds"]
    assert set(kinds) == {"notice", "addition", "intra-stage", "inter-stage", "pipeline", "checkpoint-restart"}
    for kind in ("notice", "intra-stage", "inter-stage", "pipeline"):
        assert kinds[kind]["prepared"] == kinds[kind]["count"] >= 1, kinds
    assert kinds["checkpoint-restart"]["prepared"] == 0
    assert all(r["lead_ms"] >= 0 and r["down_ms"] > 0 for r in prep["split"])
    assert 0.0 <= prep["slowdown"] <= 1.0 and "median over" in prep["slowdown_source"]
    assert back.preparation(120.0).slowdown == prep["slowdown"] and back.cost_model().preparation.enabled is False


def test_cli_profile_writes_the_file_and_prints_the_tables(tmp_path):
    out = tmp_path / "sub" / "profile.json"
    res = CliRunner().invoke(app, ["profile", "--workers", "2", "--steps-per-strategy", "1", "--rounds", "2",
                                   "--start-method", "forkserver", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    prof = RuntimeProfile.load(out)
    assert set(prof.throughput.strategies()) == {(1, 1), (2, 1), (1, 2)}
    assert "parcae profile --workers 2" in prof.command and "--rounds 2" in prof.command
    # every strategy measured in two epochs (two rounds); its iteration time is the fastest one's
    step_ms = prof.measured["step_ms"]
    for (d, p), ms in prof.throughput.iteration_ms.items():
        assert len(step_ms[f"{d}x{p}"]) >= 2 and ms == min(step_ms[f"{d}x{p}"])
    for text in ("iteration time per strategy", "measured pause vs the calibrated model", "checkpoint-restart",
                 "rendezvous_ms", "1x2", "lead time and downtime per kind", "model down", "(cpu, 2 cores",
                 "what the stage cut balances", "stage at P=2"):  # fmt: skip
        assert text in " ".join(res.output.split())  # (titles wrap at the console's width)
    # each layer's time, and the stage the cut by those times gives it at P = 2
    cut = partition(prof.stage_costs(), 2)
    rows = {line.split()[0]: line.split() for line in res.output.splitlines() if line.strip()}
    for i, layer in enumerate(prof.spec.layers):
        assert rows[layer.name][-1] == str(0 if i < cut[1] else 1), rows[layer.name]
    # one step a strategy: every epoch is prepared before it starts, so no epoch measures the slowdown — and it says so
    assert prof.measured["prepared"]["slowdown"] is None and "slowdown while a preparation runs: not measured" in (
        " ".join(res.output.split())
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "0"], "--workers must be >= 2"),
        (["--model", "gpt-17"], "gpt-17"),
        (["--steps-per-strategy", "0"], "--steps-per-strategy"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--start-method", "fork"], "--start-method"),
        (["--device", "gpu"], "--device must be one of auto, cpu, cuda"),
        *([(["--device", "cuda"], "no CUDA device")] if not torch.cuda.is_available() else []),
    ],
)
def test_cli_profile_bad_input_exits_2(tmp_path, args, message):
    res = CliRunner().invoke(app, ["profile", *args, "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "p.json").exists()


def test_cli_profile_unwritable_out_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (tmp_path, blocker / "p.json"):  # a directory; a path under a file
        res = CliRunner().invoke(app, ["profile", "--out", str(out)])
        assert res.exit_code == 2, res.output
        assert "cannot write profile" in res.output and str(out) in res.output


def test_a_profile_whose_epoch_broke_says_so_and_how():
    """A death or a timeout under load can break one of the schedule's epochs (its members never get ready, the job
    trains on in a recovery epoch): one clear ProfileError, not a TypeError on its missing pause (seen in a CI run)."""
    from trainer.control.dry_run import check_schedule
    from trainer.control.events import group_events, parse_events
    from trainer.control.measure import migrations_from_result, profile_schedule, visit_order
    from trainer.runtime.migration import layer_sizes

    mcfg = model_config("tiny-gpt")
    sched = profile_schedule(3, visit_order([(3, 1), (2, 1), (1, 2)]), 2, 16)
    planned = check_schedule(mcfg, TrainConfig(steps=sched.steps, global_batch=16), 3, sched.initial, sched.steps,
                             group_events(parse_events(sched.events)))  # fmt: skip
    second = planned[1]
    broken = {"epoch": second.number, "kind": second.kind.value, "strategy": [second.D, second.P], "pause_s": None,
              "hold_s": 0.0, "phases_s": {}, "step": second.start_step, "preempted": list(second.preempted),
              "bytes_moved": 0}  # fmt: skip
    result = {"reconfigurations": [broken], "epochs": [], "events": [{"event": "dead", "worker": 2, "step": 2}]}
    with pytest.raises(ProfileError, match=rf"epoch {second.number} .* broke before any of its members was ready "
                                           r"\(.*'dead'.*\): .*run it again"):  # fmt: skip
        migrations_from_result(result, planned, sched, layer_sizes(mcfg).state_bytes)
