"""Tests for trainer.observe.tracking: the MLflow run of a training job, fed by the driver's observer hooks.

Every test logs into one temporary SQLite store for the module (``MLFLOW_TRACKING_URI``, see ``_mlflow``), never the
repository's ``mlruns/``. The hook calls are a synthetic but realistic job replayed by hand (`StepInfo`, `PlanInfo`,
records shaped as `Coordinator.records()`, checkpoint shard files named as `trainer.runtime.checkpoint` names them), so
the tests check exactly what lands in the store. A store that blocks is a monkeypatched `log_batch` waiting on an Event:
the assertions are about what returned while it was blocked, never about time.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import tracking

import pytest
from _jobs import run_job
from _mlflow import temporary_mlflow_store
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (fixtures)
from mlflow import MlflowClient  # noqa: E402  (after tracking: telemetry off)
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE  # noqa: E402

from trainer.config import TrainConfig, model_config
from trainer.control.planning import RulePlanner
from trainer.observe.observer import PlanInfo, StepInfo
from trainer.observe.tracking import MlflowJobObserver, training_runs
from trainer.runtime import checkpoint
from trainer.runtime.model import layer_names
from trainer.runtime.pipeline import parameters_checksum

ROOT = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 16
T0 = 1_750_000_000.0  # wall-clock seconds of step 0 (the driver's time.time())
STEP_S = 0.1  # seconds per step in steady state: 160 samples/s


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    yield from temporary_mlflow_store(tmp_path_factory)


@pytest.fixture
def client(store: Path) -> MlflowClient:
    return MlflowClient(tracking.tracking_uri())


def start_info(job: str, **over: Any) -> dict[str, Any]:
    info = {"job": job, "model": "tiny-gpt", "workers": 4, "strategy": (2, 2), "steps": 20,
            "global_batch": GLOBAL_BATCH, "checkpoint_dir": "/tmp/ckpt", "resumed_from": None,
            "planner": "liveput"}  # fmt: skip
    info.update(over)
    return info


def loss_of(step: int, attempt: int = 0) -> float:
    return round(4.0 / (1.0 + 0.1 * step) + 0.001 * attempt, 6)


def val_of(step: int) -> float:
    return round(5.0 / (1.0 + 0.05 * step), 6)


def record(epoch: int, kind: str, step: int, strategy: list[int], pause_s: float, bytes_moved: int,
           steps_lost: int = 0, **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A reconfiguration record with every field `Coordinator.records()` gives."""
    return {"epoch": epoch, "kind": kind, "notice": True, "step": step, "strategy": strategy, "preempted": [],
            "lost": [], "pause_s": pause_s, "hold_s": 0.05, "spread_s": 0.004, "detect_s": None,
            "critical_s": {"last_step": 0.004, "reach": pause_s - 0.0045, "ahead": 0.0, "hand_off": 0.0,
                           "groups": 0.0002, "install": 0.0003}, "bytes_moved": bytes_moved,
            "bytes_planned": bytes_moved, "transfers": 3, "steps_lost": steps_lost, "restore_step": None,
            "phases_s": {"teardown": 0.01, "transfer": pause_s / 2, "form": 0.02}, **extra}  # fmt: skip


def plan_details(decision: list[int]) -> dict[str, Any]:
    """A liveput plan dict as `liveput.optimizer.Plan.to_dict()` makes it."""
    return {
        "decision": decision,
        "expected_samples": 5120.0,
        "decision_ms": 3.5,
        "steps": [
            {
                "strategy": decision,
                "migrating": True,
                "expected_samples": 2400.0,
                "expected_cost_ms": 800.0,
                "reach": 0.9,
                "kinds": {"inter-stage": 1.0},
            },
            {
                "strategy": decision,
                "migrating": False,
                "expected_samples": 2720.0,
                "expected_cost_ms": 0.0,
                "reach": 0.85,
                "kinds": {},
            },
        ],  # fmt: skip
        "alternatives": [
            {"strategy": [2, 2], "expected_samples": 4800.0},
            {"strategy": [1, 4], "expected_samples": 0.0},
        ],  # fmt: skip
        "intervals": [{"prev_available": 4, "events": [[0, 1, 0.5], [0, 0, 0.5]]}],  # the forecast it planned with
    }


def shards(directory: Path, step: int, stages: int) -> list[str]:
    """Checkpoint shard files of `step` (content irrelevant here: the observer only uploads them)."""
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    for k in range(stages):
        name = f"step{step:08d}.stage{k}.pt"
        (directory / name).write_bytes(f"shard {k} of step {step}".encode())
        names.append(name)
    return names


class Job:
    """A synthetic job, replayed through an observer's hooks: 20 steps on 4 instances starting at 2x2; a plan and
    an inter-stage migration to 1x3 at step 6 (one instance preempted); a checkpoint at step 8; an instance
    killed during step 11 -> checkpoint-restart from step 8 into 1x2 (steps 8-10 lost and recomputed); an added
    instance -> intra-stage migration to 3x1 at step 15."""

    def __init__(self, tmp: Path) -> None:
        self.ckpt = tmp / "checkpoints"
        self.records: list[dict[str, Any]] = []
        self.steps: list[StepInfo] = []
        self.shards: list[str] = []

    def play(self, obs: MlflowJobObserver, job: str, *, end: bool = True) -> dict[str, Any]:
        obs.on_start(start_info(job))
        t = T0
        strategy, alive = (2, 2), 4

        def step(s: int, attempt: int = 0) -> None:
            nonlocal t
            info = StepInfo(step=s, loss=loss_of(s, attempt), strategy=strategy, alive=alive, time=t,
                            loss_scale=2.0 ** (10 + s % 3), skipped=s % 5 == 4, lr=1e-3 * 0.9**s)  # fmt: skip
            self.steps.append(info)
            if s % 5 == 0:  # the held-out loss of boundary s comes before step s (the driver's order)
                obs.on_validation(s, val_of(s))
            obs.on_step(info)
            t += STEP_S

        for s in range(6):
            step(s)
        obs.on_plan(PlanInfo(interval=1, step=6, alive=3, current=(2, 2), decision=(1, 3), decision_s=0.004,
                             planner="liveput", details=plan_details([1, 3])))  # fmt: skip
        t += 0.8  # the migration's pause
        strategy, alive = (1, 3), 3
        self.reconfigure(obs, record(1, "inter-stage", 6, [1, 3], 0.8, 120_000, preempted=[3]))
        for s in range(6, 11):
            step(s)
        self.shards = shards(self.ckpt, 8, 3)
        obs.on_checkpoint(8, self.ckpt)
        t += 2.5  # kill during step 11, detection, restart, load
        strategy, alive = (1, 2), 2
        self.reconfigure(obs, record(2, "checkpoint-restart", 8, [1, 2], 2.5, 90_000, steps_lost=3, restore_step=8))
        for s in range(8, 15):
            step(s, attempt=1 if s < 11 else 0)
        t += 0.3
        strategy, alive = (3, 1), 3
        self.reconfigure(obs, record(3, "intra-stage", 15, [3, 1], 0.3, 40_000))
        for s in range(15, 20):
            step(s)
        obs.on_validation(20, val_of(20))  # the final layers'
        result = {"loss": [self.loss(s) for s in range(20)], "reconfigurations": self.records,
                  "throughput": {"samples_per_s": 123.0, "steps_per_s": 7.7}, "wall_s": t - T0,
                  "stopped_early": {"step": 20, "best_step": 20, "monitor": "loss", "mode": "min",
                                    "best": val_of(20), "patience": 3, "min_delta": 0.0}}  # fmt: skip
        if end:
            obs.on_end(result)
        return result

    def reconfigure(self, obs: MlflowJobObserver, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        obs.on_reconfiguration(rec)

    def loss(self, s: int) -> float:
        """The loss the job ended with at step `s` (the last report of it)."""
        return [i.loss for i in self.steps if i.step == s][-1]


def latest(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    """Metric `key` by step; for a step logged more than once, its latest point (the current value)."""
    out: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        if m.step not in out or m.timestamp >= out[m.step][0]:
            out[m.step] = (m.timestamp, m.value)
    return {s: v for s, (_, v) in out.items()}


def runs_with(client: MlflowClient, tag: str, value: str, experiment: str = "training") -> list[Any]:
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"experiment {experiment!r} was not created"
    return client.search_runs([exp.experiment_id], f"tags.`{tag}` = '{value}'")


def artifact_names(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    return {Path(a.path).name for a in client.list_artifacts(run_id, path)}


def read_json(client: MlflowClient, run_id: str, name: str, tmp: Path) -> Any:
    local = client.download_artifacts(run_id, name, str(tmp))
    return json.loads(Path(local).read_text())


# -- a whole job -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def replayed(store: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Job, dict[str, Any]]:
    job = Job(tmp_path_factory.mktemp("job"))
    obs = MlflowJobObserver(tags={"parcae.prefect_flow_run_id": "flow-123"}, flush_every_s=0.2)
    result = job.play(obs, "replay-job")
    assert obs.closed and obs.run_id is not None
    return obs.run_id, job, result


def test_the_run_s_best_held_out_score_is_the_monitored_one_in_its_direction(client: MlflowClient, store) -> None:
    """A job that watches its accuracy (`Validation(monitor="accuracy", mode="max")`): MLflow's summary is the
    highest accuracy and its step (the earliest of equal ones), as its best checkpoint is picked."""
    obs = MlflowJobObserver(flush_every_s=0.2)
    obs.on_start(start_info("accuracy-job", val_monitor="accuracy", val_mode="max"))
    for s, loss, accuracy in ((0, 2.0, 0.1), (5, 1.0, 0.8), (10, 0.9, 0.8), (15, 1.1, 0.7)):
        obs.on_validation(s, loss, {"accuracy": accuracy})
    obs.on_end({"loss": [1.0], "reconfigurations": []})
    final = client.get_run(obs.run_id).data.metrics
    assert (final["best_val_accuracy"], final["best_val_step"]) == (0.8, 5) and "best_val_loss" not in final


def test_a_fleet_s_cost_is_logged_with_the_prices_it_is_at(client: MlflowClient, store) -> None:
    """A live fleet's cost is a summary per figure, and a tag says whose spot prices they are: the cloud's, or the
    bundled ones and why not (so two runs' dollars are compared knowing what they stand on)."""
    runs = {}
    for name, cost in (
        ("aws-priced", {"instance_hours": 1.5, "spot_usd": 1.53, "on_demand_usd": 4.59,
                        "spot_prices": "AWS describe_spot_price_history, us-east-1"}),
        ("aws-denied", {"instance_hours": 1.5, "spot_usd": 0.918, "on_demand_usd": 4.59,
                        "spot_prices_error": "AWS describe_spot_price_history, us-east-1: UnauthorizedOperation"}),
        ("market", {"instance_hours": 1.5, "spot_usd": 0.918, "on_demand_usd": 4.59}),
    ):  # fmt: skip
        obs = MlflowJobObserver(flush_every_s=0.2)
        obs.on_start(start_info(name))
        obs.on_end({"loss": [1.0], "reconfigurations": [], "fleet_cost": cost})
        runs[name] = client.get_run(obs.run_id).data
    assert runs["aws-priced"].metrics["fleet_spot_usd"] == 1.53
    tags = {name: data.tags.get("parcae.fleet_spot_prices") for name, data in runs.items()}
    assert tags == {"aws-priced": "AWS describe_spot_price_history, us-east-1",
                    "aws-denied": "bundled: AWS describe_spot_price_history, us-east-1: UnauthorizedOperation",
                    "market": None}  # fmt: skip


def test_every_step_is_logged_at_its_step(client: MlflowClient, replayed) -> None:
    run_id, job, _ = replayed
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "replay-job"
    assert run.data.tags["parcae.job"] == "replay-job"
    assert run.data.tags["parcae.prefect_flow_run_id"] == "flow-123"
    params = run.data.params
    got = tuple(params[k] for k in ("model", "workers", "start_strategy", "global_batch", "planner"))
    assert got == ("tiny-gpt", "4", "2x2", str(GLOBAL_BATCH), "liveput")
    assert "resumed_from" not in params  # None values are not params

    loss = latest(client, run_id, "loss")
    assert loss == {s: job.loss(s) for s in range(20)}
    redone = [m.step for m in client.get_metric_history(run_id, "loss") if m.step in (8, 9, 10)]
    assert sorted(redone) == [8, 8, 9, 9, 10, 10]  # the recomputed steps keep both points
    last = {i.step: i for i in job.steps}
    assert latest(client, run_id, "alive_instances") == {s: float(i.alive) for s, i in last.items()}
    assert latest(client, run_id, "dp_D") == {s: float(i.strategy[0]) for s, i in last.items()}
    assert latest(client, run_id, "dp_P") == {s: float(i.strategy[1]) for s, i in last.items()}

    sps = latest(client, run_id, "samples_per_s")
    assert 0 not in sps  # one timestamp gives no rate
    assert sps[5] == pytest.approx(GLOBAL_BATCH / STEP_S)  # steady state
    assert sps[6] < sps[5] and sps[15] < sps[14]  # a reconfiguration's pause shows as a dip
    final = run.data.metrics
    assert final["final_loss"] == job.loss(19)
    assert final["mean_samples_per_s"] == 123.0  # the driver's own measure, when the result has it
    assert final["total_pause_s"] == pytest.approx(0.8 + 2.5 + 0.3)
    assert final["total_steps_lost"] == 3
    assert latest(client, run_id, "loss_scale") == {s: 2.0 ** (10 + s % 3) for s in range(20)}
    assert final["skipped_steps"] == 4  # steps 4, 9 (twice: recomputed), 14 and 19
    assert latest(client, run_id, "val_loss") == {s: val_of(s) for s in (0, 5, 10, 15, 20)}  # the final at 20
    assert (final["best_val_loss"], final["best_val_step"]) == (val_of(20), 20)  # a summary: the lowest one
    assert final["stopped_early_step"] == 20  # (the job's held-out loss stopped it there: `Validation.patience`)
    assert latest(client, run_id, "lr") == pytest.approx({s: 1e-3 * 0.9**s for s in range(20)})
    # one value at step 0: MLflow charts it as a bar, not as a lone dot at the last step
    assert [m.step for m in client.get_metric_history(run_id, "final_loss")] == [0]


def test_reconfigurations_are_a_table_summaries_and_tags(client: MlflowClient, replayed, tmp_path: Path) -> None:
    run_id, job, _ = replayed
    # per migration: a row of the table, not a step metric (a line joining steps 6, 8 and 15 would say nothing)
    for key in ("migration_pause_s", "migration_bytes", "steps_lost"):
        assert client.get_metric_history(run_id, key) == []
    table = read_json(client, run_id, "migrations_table.json", tmp_path)
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert [(r["step"], r["kind"], r["pause_s"], r["bytes_moved"], r["steps_lost"]) for r in rows] == [
        (6, "inter-stage", 0.8, 120_000, 0), (8, "checkpoint-restart", 2.5, 90_000, 3),
        (15, "intra-stage", 0.3, 40_000, 0)]  # fmt: skip
    # where each pause went, as text a reader can scan in the table
    assert rows[0]["spread_s"] == 0.004
    assert rows[0]["pause_parts"] == ("last_step 4.0 ms, reach 795.5 ms, ahead 0.0 ms, hand_off 0.0 ms, "
                                      "groups 0.2 ms, install 0.3 ms")  # fmt: skip
    # the counts are summaries: one value each, at the end
    final = client.get_run(run_id).data.metrics
    assert {k: v for k, v in final.items() if k.startswith("migrations_")} == {
        "migrations_inter_stage": 1, "migrations_checkpoint_restart": 1, "migrations_intra_stage": 1}  # fmt: skip
    assert (final["reconfigurations"], final["max_pause_s"], final["total_bytes_moved"]) == (3, 2.5, 250_000)
    assert [len(client.get_metric_history(run_id, k)) for k in ("reconfigurations", "max_pause_s")] == [1, 1]
    tags = client.get_run(run_id).data.tags
    assert {k: v for k, v in tags.items() if k.startswith("parcae.migrations.")} == {
        "parcae.migrations.inter-stage": "1", "parcae.migrations.checkpoint-restart": "1",
        "parcae.migrations.intra-stage": "1"}  # fmt: skip
    assert read_json(client, run_id, "migrations.json", tmp_path) == job.records  # reported once each


def test_plan_runs_and_the_training_run_point_at_each_other(client: MlflowClient, replayed, tmp_path: Path) -> None:
    run_id, _, _ = replayed
    plans = runs_with(client, "parcae.training_run_id", run_id, experiment="plans")
    assert len(plans) == 1
    plan = plans[0]
    assert plan.info.status == "FINISHED"
    assert plan.data.tags["decision"] == "1x3"
    training = client.get_run(run_id)
    assert plan.info.run_name == f"plan-{training.info.run_name}-i1"  # one job's plans apart from another's
    note = plan.data.tags["mlflow.note.content"]  # the UI's description: what was decided, a link to the job's run
    assert f"(#/experiments/{training.info.experiment_id}/runs/{run_id})" in note and "2x2 -> 1x3" in note
    assert plan.data.tags["parcae.prefect_flow_run_id"] == "flow-123"  # Prefect's tags follow to the plan runs
    assert (plan.data.params["interval"], plan.data.params["current_strategy"]) == ("1", "2x2")
    m = plan.data.metrics
    assert m["alive"] == 3 and "alive" not in plan.data.params  # one place each, a metric to sort and chart by
    assert (m["expected_samples"], m["reach"], m["expected_cost_ms"]) == (5120.0, 0.9, 800.0)
    assert m["decision_ms"] == pytest.approx(4.0) and m["optimizer_decision_ms"] == 3.5
    assert read_json(client, plan.info.run_id, "alternatives.json", tmp_path)["alternatives"][0] == {
        "strategy": [2, 2], "expected_samples": 4800.0}  # fmt: skip
    assert read_json(client, plan.info.run_id, "plan.json", tmp_path / "p")["decision"] == [1, 3]

    training = client.get_run(run_id)  # (again: its tags as the job ended)
    assert training.data.tags["parcae.plan_runs"] == "1"
    listed = read_json(client, run_id, "plans.json", tmp_path / "t")
    assert [(p["run_id"], p["step"], p["decision"]) for p in listed] == [(plan.info.run_id, 6, [1, 3])]
    assert listed[0]["forecast_n"] == 3.5  # what its forecast expected (4 alive, one lost with p = 0.5): drawn
    assert latest(client, run_id, "planned_D") == {6: 1} and latest(client, run_id, "planned_P") == {6: 3}


def test_the_experiments_open_as_model_training_and_say_what_they_hold(client: MlflowClient, replayed) -> None:
    """The MLflow UI opens an experiment without `mlflow.experimentKind` as a GenAI one ("Traces 0"): each of
    parcae's says it is model training and carries a description; a description written in the UI is kept."""
    for name in ("training", "plans"):
        exp = client.get_experiment_by_name(name)
        tags = exp.tags
        assert tags["mlflow.experimentKind"] == "custom_model_development"
        # the description, and a link to the saved view of the runs table with the columns that compare the runs
        link = f"[parcae](#/experiments/{exp.experiment_id}/runs?viewStateShareKey=parcae)"
        assert tags["mlflow.note.content"] == f"{tracking.DESCRIPTIONS[name]} The runs table with the columns to " \
                                              f"compare them by: view {link}."  # fmt: skip
        # MLflow's saved-view envelope (as its UI writes one: a name, times, the page state as a string)
        envelope = json.loads(tags["mlflow.sharedViewState.parcae"])
        assert envelope["name"] == "parcae" and envelope["createdAt"] == envelope["updatedAt"] > 0
        assert json.loads(envelope["state"]) == {"selectedColumns": tracking.VIEWS[name].columns()}
    exp = tracking.ensure_experiment(client, "someone-else-s")
    assert "mlflow.note.content" not in client.get_experiment(exp).tags  # no description of ours to give
    client.set_experiment_tag(exp, "mlflow.note.content", "mine")
    client.delete_experiment_tag(exp, "mlflow.experimentKind")
    assert tracking.ensure_experiment(client, "someone-else-s", "ours") == exp
    tags = client.get_experiment(exp).tags
    assert tags["mlflow.note.content"] == "mine" and tags["mlflow.experimentKind"] == "custom_model_development"
    assert not any(k.startswith("mlflow.sharedViewState.") for k in tags)  # no view of ours to give either
    # a view saved over ours in the UI stays
    training = client.get_experiment_by_name("training").experiment_id
    client.set_experiment_tag(training, "mlflow.sharedViewState.parcae", "theirs")
    tracking.ensure_experiment(client, "training")
    assert client.get_experiment(training).tags["mlflow.sharedViewState.parcae"] == "theirs"


def test_checkpoints_and_the_timeline_are_artifacts(client: MlflowClient, replayed, tmp_path: Path) -> None:
    run_id, job, _ = replayed
    assert {"migrations.json", "plans.json", "timeline.png", "checkpoints"} <= artifact_names(client, run_id)
    assert artifact_names(client, run_id, "checkpoints") == {"step-8"}
    assert artifact_names(client, run_id, "checkpoints/step-8") == set(job.shards)
    shard = client.download_artifacts(run_id, f"checkpoints/step-8/{job.shards[1]}", str(tmp_path))
    assert Path(shard).read_bytes() == (job.ckpt / job.shards[1]).read_bytes()
    png = Path(client.download_artifacts(run_id, "timeline.png", str(tmp_path)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_training_runs_compares_jobs(replayed) -> None:
    run_id, _, _ = replayed
    df = training_runs()
    row = df[df["run_id"] == run_id]
    assert len(row) == 1
    assert row["status"].iloc[0] == "FINISHED"
    assert row["params.start_strategy"].iloc[0] == "2x2"
    assert row["metrics.total_pause_s"].iloc[0] == pytest.approx(3.6)
    assert training_runs(experiment="no-such-experiment").empty


# -- failures ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("error, status", [(RuntimeError("worker 2 exited with code 1"), "FAILED"),
                                           (KeyboardInterrupt(), "KILLED")])  # fmt: skip
def test_on_error_flushes_everything_queued(client: MlflowClient, store: Path, tmp_path: Path,
                                            error: BaseException, status: str) -> None:  # fmt: skip
    job = f"failing-{status.lower()}"
    obs = MlflowJobObserver(flush_every_s=3600)  # nothing is flushed by the clock: only on_error can log it
    obs.on_start(start_info(job))
    for s in range(7):
        obs.on_step(StepInfo(s, loss_of(s), (2, 2), 4, T0 + STEP_S * s))
    obs.on_plan(PlanInfo(1, 7, 3, (2, 2), (1, 3), 0.002, "liveput", plan_details([1, 3])))
    obs.on_reconfiguration(record(1, "inter-stage", 7, [1, 3], 0.5, 1000))
    shards(tmp_path, 4, 2)
    obs.on_checkpoint(4, tmp_path)
    obs.on_error(error)
    assert obs.closed
    run = client.get_run(obs.run_id)
    assert run.info.status == status
    assert latest(client, obs.run_id, "loss") == {s: loss_of(s) for s in range(7)}
    assert (run.data.metrics["reconfigurations"], run.data.metrics["max_pause_s"]) == (1, 0.5)  # summaries too
    assert run.data.tags["parcae.migrations.inter-stage"] == "1"
    assert run.data.tags["parcae.error"].startswith(type(error).__name__)
    assert "worker 2" in run.data.tags["parcae.error"] or status == "KILLED"
    assert len(runs_with(client, "parcae.training_run_id", obs.run_id, experiment="plans")) == 1
    assert artifact_names(client, obs.run_id, "checkpoints/step-4") == {"step00000004.stage0.pt",
                                                                        "step00000004.stage1.pt"}  # fmt: skip


def test_reopening_a_run_records_the_resume(client: MlflowClient, store: Path) -> None:
    first = MlflowJobObserver(flush_every_s=3600)
    first.on_start(start_info("resumable"))
    for s in range(12):
        first.on_step(StepInfo(s, loss_of(s), (2, 2), 4, T0 + STEP_S * s))
    first.on_error(SystemExit(143))  # the driver was terminated after step 11; its last checkpoint is step 8
    run_id = first.run_id
    assert client.get_run(run_id).info.status == "KILLED"

    second = MlflowJobObserver(run_id=run_id, flush_every_s=3600)
    second.on_start(start_info("resumable", workers=2, strategy=(1, 2), resumed_from=8))
    for s in range(8, 20):
        second.on_step(StepInfo(s, loss_of(s, attempt=1), (1, 2), 2, T0 + 10 + STEP_S * s))
    second.on_end({"loss": [loss_of(s, 1 if s >= 8 else 0) for s in range(20)], "reconfigurations": []})
    assert second.run_id == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    assert tags["parcae.resumed"] == "true"
    interruption = (tags["parcae.interrupted_status"], tags["parcae.interrupted_at_step"],
                    tags["parcae.resumed_from_step"])  # fmt: skip
    assert interruption == ("KILLED", "11", "8")
    assert tags["parcae.interrupted_by"] == "SystemExit: 143" and "parcae.error" not in tags
    assert (metrics["resumes"], metrics["interrupted_at_step"], metrics["steps_recomputed"]) == (1, 11, 4)
    assert (params["workers"], params["start_strategy"]) == ("4", "2x2")  # the first start's params stay
    resumed = tuple(params[f"resume1.{k}"] for k in ("workers", "start_strategy", "from_step"))
    assert resumed == ("2", "1x2", "8")
    assert "resume1.model" not in params  # unchanged values are not repeated
    assert latest(client, run_id, "loss") == {s: loss_of(s, 1 if s >= 8 else 0) for s in range(20)}
    assert len(runs_with(client, "parcae.job", "resumable")) == 1  # one run for the job, not two


def test_a_blocked_store_never_blocks_the_driver(client: MlflowClient, store: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, caplog) -> None:  # fmt: skip
    entered, release, blocked = threading.Event(), threading.Event(), threading.Event()
    real = MlflowClient.log_batch

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        if any(m.key == "loss" for m in metrics) and not release.is_set():
            blocked.set()
            entered.set()
            release.wait(60)
            blocked.clear()
        return real(self, run_id, metrics=metrics, params=params, tags=tags, synchronous=synchronous)

    monkeypatch.setattr(MlflowClient, "log_batch", log_batch)
    obs = MlflowJobObserver(flush_every_s=0.05, max_pending=50)
    obs.on_start(start_info("blocked-store"))
    obs.on_step(StepInfo(0, loss_of(0), (2, 2), 4, T0))
    assert entered.wait(60), "the logging thread never sent the first step"

    returned = threading.Event()
    shards(tmp_path, 40, 1)

    def driver() -> None:  # the driver's hooks, while the logging thread is stuck in log_batch
        for s in range(1, 100):
            obs.on_step(StepInfo(s, loss_of(s), (2, 2), 4, T0 + STEP_S * s))
        obs.on_reconfiguration(record(1, "inter-stage", 50, [1, 3], 0.5, 1000))
        obs.on_plan(PlanInfo(1, 50, 3, (2, 2), (1, 3), 0.002, "liveput", plan_details([1, 3])))
        obs.on_checkpoint(40, tmp_path)
        returned.set()

    with caplog.at_level(logging.WARNING, logger="trainer.observe.tracking"):
        threading.Thread(target=driver, daemon=True).start()
        assert returned.wait(60), "a hook blocked on the store"
        assert blocked.is_set(), "the hooks must have returned while the store was still blocked"
        release.set()
        obs.on_end({"loss": [], "reconfigurations": []})

    run = client.get_run(obs.run_id)
    assert run.info.status == "FINISHED"
    # step 0 (4 points) was in flight; steps 1-2 brought 4 points each (no rate before three step intervals) and
    # steps 3-99 5 each: 50 fit, the other 443 were coalesced into the latest point of each of the 5 series, so 438
    # were dropped — counted, warned about, and the latest kept
    assert run.data.metrics["tracking_dropped_metrics"] == 438
    assert run.data.tags["parcae.tracking.dropped"] == "438"
    assert any("overflowed" in r.getMessage() for r in caplog.records)
    loss = latest(client, obs.run_id, "loss")
    assert loss[99] == loss_of(99) and all(loss[s] == loss_of(s) for s in range(11))
    assert [(r["step"], r["pause_s"]) for r in read_json(client, obs.run_id, "migrations.json", tmp_path)] == [
        (50, 0.5)]  # a record is never coalesced  # fmt: skip
    assert len(runs_with(client, "parcae.training_run_id", obs.run_id, experiment="plans")) == 1
    assert artifact_names(client, obs.run_id, "checkpoints/step-40") == {"step00000040.stage0.pt"}


def test_a_store_that_fails_for_a_while_loses_nothing(client: MlflowClient, store: Path,
                                                      monkeypatch: pytest.MonkeyPatch, caplog) -> None:  # fmt: skip
    failures = {"left": 3}
    real = MlflowClient.log_batch

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        if metrics and failures["left"] > 0:
            failures["left"] -= 1
            raise MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE)
        return real(self, run_id, metrics=metrics, params=params, tags=tags, synchronous=synchronous)

    monkeypatch.setattr(MlflowClient, "log_batch", log_batch)
    obs = MlflowJobObserver(flush_every_s=0.02)
    with caplog.at_level(logging.INFO, logger="trainer.observe.tracking"):
        obs.on_start(start_info("flaky-store"))
        for s in range(30):
            obs.on_step(StepInfo(s, loss_of(s), (2, 2), 4, T0 + STEP_S * s))
        assert obs.flush(60)
        obs.on_end({"loss": [], "reconfigurations": []})
    assert failures["left"] == 0
    assert latest(client, obs.run_id, "loss") == {s: loss_of(s) for s in range(30)}
    assert client.get_run(obs.run_id).info.status == "FINISHED"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("is failing" in m for m in messages) == 1  # one warning per outage, not one per retry
    assert any("answers again" in m for m in messages)


def test_an_unreachable_store_gives_up_at_close(caplog) -> None:
    obs = MlflowJobObserver(tracking="http://127.0.0.1:9", flush_every_s=0.05, close_timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="trainer.observe.tracking"):
        obs.on_start(start_info("nowhere"))
        for s in range(10):
            obs.on_step(StepInfo(s, loss_of(s), (1, 1), 1, T0 + s))
        obs.on_end({"loss": [], "reconfigurations": []})
    assert obs.closed and obs.run_id is None
    messages = [r.getMessage() for r in caplog.records]
    assert any("http://127.0.0.1:9 is failing" in m for m in messages)
    assert any("gave up" in m and "metric points" in m for m in messages)


def test_a_bad_setting_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="flush_every_s"):
        MlflowJobObserver(flush_every_s=0)
    with pytest.raises(ValueError, match="max_pending"):
        MlflowJobObserver(max_pending=0)


def test_an_unknown_run_id_logs_nothing_and_says_so(store: Path, caplog) -> None:
    obs = MlflowJobObserver(run_id="0" * 32, flush_every_s=0.05)
    with caplog.at_level(logging.ERROR, logger="trainer.observe.tracking"):
        obs.on_start(start_info("ghost", resumed_from=4))
        obs.on_step(StepInfo(4, 1.0, (1, 1), 1, T0))
        obs.on_end({"loss": [], "reconfigurations": []})
    assert obs.closed
    assert any("run_id '" + "0" * 32 + "'" in r.getMessage() for r in caplog.records)


def test_sigterm_of_the_driver_flushes_and_ends_the_run_killed(client: MlflowClient, store: Path) -> None:
    script = textwrap.dedent(f"""
        import os, signal, time
        from trainer.observe.observer import StepInfo
        from trainer.observe.tracking import MlflowJobObserver
        obs = MlflowJobObserver(flush_every_s=3600)  # only the exit can flush
        obs.on_start({{"job": "sigterm-job", "model": "tiny-gpt", "workers": 1, "strategy": (1, 1), "steps": 9,
                      "global_batch": 16}})
        for s in range(9):
            obs.on_step(StepInfo(s, 1.0 / (s + 1), (1, 1), 1, {T0} + s))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # the driver's poll loop: SIGTERM arrives here
        raise SystemExit("SIGTERM was not handled")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr
    (run,) = runs_with(client, "parcae.job", "sigterm-job")
    assert run.info.status == "KILLED"
    assert run.data.tags["parcae.error"] == "the driver process exited before the job ended"
    assert latest(client, run.info.run_id, "loss") == {s: 1.0 / (s + 1) for s in range(9)}


# -- a real job --------------------------------------------------------------------------------------------------
def test_a_real_job_is_tracked(client: MlflowClient, store: Path, tmp_path: Path, _no_orphans, monkeypatch) -> None:
    """tiny-gpt on 3 worker processes for 12 steps from 3x1; the rule planner moves it to 1x2 at step 6 (a
    pipeline migration); checkpoints every 4 steps."""
    import trainer.observe.tracking as observe_tracking

    drawn_with: list[tuple] = []
    drawn = observe_tracking.timeline_figure
    monkeypatch.setattr(
        observe_tracking,
        "timeline_figure",
        lambda *args: drawn_with.append(args) or drawn(*args),
    )
    obs = MlflowJobObserver(flush_every_s=0.2, tags={"parcae.prefect_flow_run_id": "flow-real"}, run_name="real-run")
    result = run_job("tiny-gpt", TrainConfig(), 3, (3, 1), 12, [], tmp_path / "job", job="tracked-real",
                     checkpoint_every=4, observer=obs, planner=RulePlanner(), steps_per_interval=6,
                     timeout_s=120)  # fmt: skip
    assert obs.closed
    run = client.get_run(obs.run_id)
    assert run.info.status == "FINISHED"
    assert (run.data.params["model"], run.data.params["workers"], run.data.params["start_strategy"]) == (
        "tiny-gpt", "3", "3x1")  # fmt: skip
    assert run.data.params["planner"] == "rule" and "port" not in run.data.params
    # what the run page shows: a description of the job and where to look, who made it and from what source
    note = run.data.tags["mlflow.note.content"]
    assert "**tiny-gpt** for 12 steps" in note and "3 workers" in note and "`timeline.png`" in note, note
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.type"] == "LOCAL"
    assert run.data.tags["mlflow.source.name"]
    assert latest(client, obs.run_id, "loss") == dict(enumerate(result["loss"]))
    assert latest(client, obs.run_id, "dp_P") == {s: 1.0 if s < 6 else 2.0 for s in range(12)}
    assert run.data.metrics["final_loss"] == result["loss"][-1]
    assert run.data.metrics["mean_samples_per_s"] == pytest.approx(result["throughput"]["samples_per_s"])
    assert "loss_scale" not in run.data.metrics and "skipped_steps" not in run.data.metrics  # (no float16)

    (rec,) = result["reconfigurations"]
    assert (rec["step"], rec["strategy"]) == (6, [1, 2])
    assert run.data.metrics["max_pause_s"] == pytest.approx(rec["pause_s"])
    assert run.data.metrics["total_bytes_moved"] == rec["bytes_moved"]
    assert run.data.tags[f"parcae.migrations.{rec['kind']}"] == "1"

    (plan,) = runs_with(client, "parcae.training_run_id", obs.run_id, experiment="plans")
    assert (plan.data.tags["decision"], plan.data.params["planner"], plan.data.params["step"]) == ("1x2", "rule", "6")
    assert plan.data.tags["parcae.prefect_flow_run_id"] == "flow-real"
    assert run.data.tags["parcae.plan_runs"] == "1"
    # the saved views' columns are what the runs hold (a column the runs lack would be an empty one)
    for held, view in ((run.data, tracking.VIEWS["training"]), (plan.data, tracking.VIEWS["plans"])):
        assert set(view.params) <= set(held.params) and set(view.tags) <= set(held.tags), view
        # expected_samples: a liveput plan's (tests/test_flows.py); the rule planner expects nothing; best_val_loss:
        # a validating spec's (tiny-gpt holds nothing out)
        assert set(view.metrics) - set(held.metrics) <= {"expected_samples", "best_val_loss"}, view

    ckpt = tmp_path / "job" / "checkpoints"
    assert artifact_names(client, obs.run_id, "checkpoints") == {"step-4", "step-8"}
    for step in (4, 8):
        assert artifact_names(client, obs.run_id, f"checkpoints/step-{step}") == {
            p.name for p in checkpoint.find_shards(ckpt, step)}  # fmt: skip
    assert "timeline.png" in artifact_names(client, obs.run_id)
    ((_, _, title, plans, checkpoints),) = drawn_with
    assert title == "real-run: availability, D x P and throughput"  # named as the run is, not "job: ..."
    assert [p["step"] for p in plans] == [6] and checkpoints == [4, 8]  # the plan and the checkpoints, drawn
    # the final layers: each stage's shard and its hash record, loadable from the download as they are
    layers = Path(result["layers"])
    assert artifact_names(client, obs.run_id, "final") == {p.name for p in layers.glob("step00000012.stage*")}
    final = Path(client.download_artifacts(obs.run_id, "final", str(tmp_path / "downloaded")))
    model = model_config("tiny-gpt")
    loaded = checkpoint.load(checkpoint.find_shards(final, 12), config=model, job="tracked-real")
    assert parameters_checksum(loaded.layers, layer_names(model)) == result["final_checksum"]
    job_json = read_json(client, obs.run_id, "job.json", tmp_path)  # the JobConfig the job ran with
    assert (job_json["train"]["steps"], job_json["model"]["name"], job_json["job"]) == (12, "tiny-gpt", "tracked-real")
