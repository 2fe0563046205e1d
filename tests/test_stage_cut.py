"""The stage cut by measured per-layer time (issue 14, point 3): `trainer.observe.layer_times`, the job's
`TrainConfig.stage_costs`, the profile that records the times and the jobs that plan with it."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from _flow_fixtures import runtime_profile_file
from _jobs import run_job
from _reference import uninterrupted
from _trainer_fixtures import _no_orphans, _one_thread, warm_starts  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from liveput import CostConstants, ThroughputProfile
from parcae.cli import app
from trainer import ConfigError, JobConfig, SpecError, TrainConfig, check_job, model_config, profile_cut
from trainer.control.dry_run import check_schedule
from trainer.observe.layer_times import layer_times
from trainer.observe.profile import ProfileFormatError, RuntimeProfile, runtime_spec
from trainer.runtime.migration import job_layer_sizes, layer_sizes
from trainer.runtime.model import layer_names
from trainer.runtime.pipeline import parameters_checksum, partition

pytestmark = pytest.mark.usefixtures("warm_starts")  # workers fork warm: `_trainer_fixtures.warm_worker_starts`

TINY = model_config("tiny-gpt")
# the head costs as much as the other five layers together: a cut by parameter count (0, 3, 6) would leave it
# stuck with two blocks
COSTS = (1.0, 1.0, 1.0, 1.0, 1.0, 5.0)


def test_layer_times_are_one_positive_time_per_layer_and_touch_no_generator():
    torch.manual_seed(7)
    before = torch.rand(3)
    torch.manual_seed(7)
    ms = layer_times(TINY, TrainConfig(), repeats=2)
    assert len(ms) == 6 and all(math.isfinite(t) and t > 0 for t in ms)
    assert torch.equal(torch.rand(3), before)  # the layers are built on forked generators
    assert torch.get_num_threads() >= 1
    with pytest.raises(ValueError, match="repeats"):
        layer_times(TINY, TrainConfig(), repeats=0)


@pytest.mark.parametrize("costs", [(1.0, -1.0), (1.0, math.nan), (1.0, math.inf), (True, 1.0), ("1", 2.0)])
def test_bad_stage_costs_name_the_field(costs):
    with pytest.raises(ConfigError, match=r"train\.stage_costs: every cost must be a finite number >= 0"):
        TrainConfig(stage_costs=costs)


def test_the_cut_balances_the_job_s_costs_and_says_what_it_balances():
    plain = layer_sizes(TINY)
    assert plain.cut_source == "parameter counts" and partition(plain.cut, 2) == (0, 3, 6)
    sizes = job_layer_sizes(TINY, TrainConfig(stage_costs=COSTS))
    assert sizes.cut == COSTS and sizes.cut_source == "train.stage_costs" and sizes.params == plain.params
    assert partition(sizes.cut, 2) == (0, 5, 6)
    assert job_layer_sizes(TINY, TrainConfig()) is plain  # no costs: as the model's sizes are
    with pytest.raises(ConfigError, match=r"train\.stage_costs: 2 costs for a model of 6 layers"):
        job_layer_sizes(TINY, TrainConfig(stage_costs=(1.0, 2.0)))
    # before any process starts too
    with pytest.raises(SpecError, match=r"train\.stage_costs: 2 costs for model 'tiny-gpt', which has 6 layers"):
        check_job(JobConfig(model=TINY, train=TrainConfig(stage_costs=(1.0, 2.0))))
    # the dry run cuts as the coordinator will
    epochs = check_schedule(TINY, TrainConfig(stage_costs=COSTS), 2, (1, 2), 4, [])
    assert [e.bounds for e in epochs] == [(0, 5, 6)]


def test_a_job_cut_by_its_costs_trains_the_same_run(tmp_path, _no_orphans):
    """1x2 -> 1x3 -> 1x2 with the stages cut by `COSTS`: every epoch on the costs' cut, and D = 1 throughout, so the
    same losses and parameters as one uninterrupted process, bit for bit."""
    base = TrainConfig(global_batch=8, micro_batch=2)
    steps = 6
    losses, layers = uninterrupted(TINY, base, steps)
    schedule = [{"step": 2, "kind": "plan", "strategy": [1, 3]}, {"step": 4, "kind": "plan", "strategy": [1, 2]}]
    result = run_job(TINY, dataclasses.replace(base, stage_costs=COSTS), 3, (1, 2), steps, schedule,
                     tmp_path / "job", timeout_s=80)  # fmt: skip
    cuts = [(e["strategy"][1], tuple(e["bounds"])) for e in result["epochs"]]
    assert cuts == [(2, partition(COSTS, 2)), (3, partition(COSTS, 3)), (2, partition(COSTS, 2))]
    assert partition(COSTS, 3) != partition(layer_sizes(TINY).cut, 3)  # the costs, not the parameter counts
    assert result["loss"] == losses
    assert result["final_checksum"] == parameters_checksum(layers, layer_names(TINY))


def test_a_profile_hands_its_measured_times_to_the_job_s_cut_and_says_what_does_not_fit():
    thr = ThroughputProfile("tiny-gpt", 16, 2, {(1, 1): 30.0, (1, 2): 25.0}, source="test")
    prof = RuntimeProfile(thr, CostConstants(), runtime_spec(TINY), {})  # no layer times: as an older parcae wrote
    config = JobConfig(model=TINY)
    same, told = profile_cut(config, prof)
    assert same is config and len(told) == 1 and "parameter counts" in told[0] and "measured.layer_ms" in told[0]
    with pytest.raises(ProfileFormatError, match="measured.layer_ms"):
        prof.stage_costs()
    measured = dataclasses.replace(prof, measured={**prof.measured, "layer_ms": list(COSTS)})
    cut, told = profile_cut(config, measured)
    assert cut.train.stage_costs == COSTS and told == []
    assert cut.replace(train={"stage_costs": ()}) == config  # nothing else changed
    # a profile of another kind of device is said (an older profile says none: it was measured on the CPU)
    assert measured.device_type == "cpu"
    on_gpu = dataclasses.replace(measured, measured={**measured.measured, "job": {"device_type": "cuda"}})
    cut, told = profile_cut(config, on_gpu)
    assert cut.train.stage_costs == COSTS and len(told) == 1, told
    assert "measured on cuda, the job trains on cpu" in told[0] and "parcae profile --device cpu" in told[0]
    with pytest.raises(ValueError, match="with 6 layers, the job's has 10"):
        profile_cut(JobConfig(model=model_config("small-gpt")), measured)
    short = dataclasses.replace(prof, measured={**prof.measured, "layer_ms": [1.0, 2.0]})
    with pytest.raises(ProfileFormatError, match="each of the 6 layers"):
        short.stage_costs()


def test_parcae_train_on_a_profile_cuts_the_stages_by_its_times(tmp_path, _no_orphans):
    """`parcae train --planner liveput --profile P`: the stages are cut by the times P measured per layer (here
    the head costs as much as the blocks together), every epoch; a profile without them says how it cuts."""
    profile = runtime_profile_file(tmp_path / "profile.json", fastest=(1, 3), max_instances=3, layer_ms=COSTS)
    out = tmp_path / "report.json"
    args = ["train", "--workers", "3", "--steps", "4", "--trace", "p3", "--start-interval", "49",
            "--interval-seconds", "0.2", "--planner", "liveput", "--look-ahead", "2"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--profile", str(profile), "--out-dir", str(tmp_path / "run"),
                                   "--json", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    records = json.loads(out.read_text())["reconfigurations"]
    assert [1, 3] in [r["strategy"] for r in records], records
    assert all(tuple(r["bounds"]) == partition(COSTS, r["strategy"][1]) for r in records), records
    assert "stages cut by" not in res.output  # nothing to warn of
    older = runtime_profile_file(tmp_path / "older.json", fastest=(1, 3), max_instances=3)
    res = CliRunner().invoke(app, [*args, "--steps", "1", "--profile", str(older), "--out-dir", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "stages cut by the spec's cost hints or parameter counts" in said and "parcae profile" in said, said


def test_a_gpu_profile_is_cached_apart_from_a_cpu_one():
    from trainer.control.measure import profile_path

    assert profile_path("tiny-gpt", 3).name == "profile-tiny-gpt-3.json"  # where CPU profiles always were
    assert profile_path("tiny-gpt", 3, device_type="cuda").name == "profile-tiny-gpt-3-cuda.json"
    # a job's config holds a registered model's default args: they are the same shape, hence the same profile
    assert profile_path("tiny-gpt", 3, model_args={"n_layer": 4, "n_embd": 64}).name == "profile-tiny-gpt-3.json"
    assert profile_path("tiny-gpt", 3, model_args={"n_layer": 2}).name.startswith("profile-tiny-gpt-")
    assert profile_path("tiny-gpt", 3, model_args={"n_layer": 2}).name != "profile-tiny-gpt-3.json"
