"""Tests for the `train` flow (and the fail-fast settings of the flows): a real job, a real MLflow store.

The session's Prefect test server (tests/conftest.py: `prefect_test_harness`, its home under a temporary folder,
telemetry off) and one temporary MLflow SQLite store. The flow runs a real elastic job (worker processes, gloo)
replaying p3 on 3 processes, planned by the liveput planner on a runtime profile file written by the test (an
input, so the plans are known: 2x1 whenever two instances are alive). Resume is checked across a SIGKILL: the flow
runs in a subprocess against the same Prefect server and MLflow store, is killed after its first checkpoint, and is
run again.
"""

from __future__ import annotations

import json  # noqa: E402
import os
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import _prefect_home  # noqa: E402,F401 - before prefect: a temporary PREFECT_HOME, telemetry off
import boto3  # noqa: E402
import mlflow  # noqa: E402
import mlflow.pytorch  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from _aws import fake_aws_account, isolate_aws  # noqa: E402
from _ec2_standin import Ec2StandIn, coordinator_host, moto_server_env  # noqa: E402
from _flow_fixtures import free_port, runtime_profile_file  # noqa: E402
from _trainer_fixtures import _no_orphans, _one_thread, warm_worker_starts  # noqa: E402,F401 - activates them
from moto import mock_aws  # noqa: E402
from prefect.client.orchestration import get_client  # noqa: E402
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey  # noqa: E402

from flows.train import train  # noqa: E402
from parcae import settings  # noqa: E402
from tasks.training import RUN_FILE  # noqa: E402
from trainer.config import model_config  # noqa: E402
from trainer.runtime import checkpoint  # noqa: E402
from trainer.runtime.export import export_state_dict  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: p3 scaled to 3 processes from interval 49: 3 alive, 2 from interval 51, 1 at 59-60, 2 again from 61.
JOB = dict(model="tiny-gpt", workers=3, trace="p3", start_interval=49, interval_seconds=0.2, step_seconds=0.1)
STEPS, SPI, CHECKPOINT_EVERY = 30, 2, 10


pytestmark = pytest.mark.usefixtures("prefect_server")  # the session's Prefect test server (tests/conftest.py)


@pytest.fixture(scope="module", autouse=True)
def _warm_starts():
    """The flows' local workers fork warm here (`_trainer_fixtures.warm_worker_starts`); the killed flow's first
    incarnation, a process of its own, starts them cold."""
    with warm_worker_starts():
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("pipeline")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        # create the schema now, in this process: two processes opening a fresh SQLite store at once race in
        # MLflow's migrations ("no such column: spans.dimension_attributes")
        mlflow.MlflowClient().search_experiments()
        yield root


@pytest.fixture(scope="module")
def profile(store: Path) -> Path:
    return runtime_profile_file(store / "profile-tiny-gpt-3.json", fastest=(2, 1))


@pytest.fixture(scope="module")
def trained(store: Path, profile: Path):
    """One run of the train flow: 30 steps, an interval every 2 steps, checkpoints every 10."""
    out = store / "job"
    state = train(**JOB, steps=STEPS, profile=str(profile), checkpoint_every=CHECKPOINT_EVERY, out_dir=str(out),
                  return_state=True)  # fmt: skip
    return state, out


def _artifacts(flow_run_id) -> dict[str, object]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found if a.key}


def test_train_flow_logs_the_job_to_one_mlflow_run(trained, _no_orphans) -> None:
    state, out = trained
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["steps"] == STEPS and summary["first_step"] == 0 and summary["resumed_from"] is None
    assert summary["forecast"].startswith("persistence (no champion")  # said, never silent
    assert summary["profile"].startswith("loaded ")
    # the replay drops to one instance and comes back: every kind of live migration happens
    assert {"pipeline", "intra-stage", "inter-stage"} <= set(summary["migrations"]), summary["migrations"]

    client = mlflow.MlflowClient()
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["prefect.flow_run_id"] == str(state.state_details.flow_run_id)
    assert run.data.tags["parcae.planner"] == "liveput" and run.data.tags["parcae.trace"] == "p3"
    assert run.data.params["workers"] == "3" and run.data.params["steps"] == str(STEPS)
    losses = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in losses] == list(range(STEPS))
    assert losses[0].value == pytest.approx(summary["loss_first"]) and losses[-1].value == pytest.approx(
        summary["loss_last"]
    )
    assert run.data.metrics["final_loss"] == pytest.approx(summary["loss_last"])
    for kind, n in summary["migrations"].items():
        assert run.data.tags[f"parcae.migrations.{kind}"] == str(n)
    records = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/migrations.json")
    assert len(records) == sum(summary["migrations"].values())

    # one plan run per interval boundary, tied to the training run and the flow run
    boundaries = list(range(SPI, STEPS, SPI))
    assert summary["plans"] == len(boundaries)
    plans = client.search_runs([client.get_experiment_by_name("plans").experiment_id],
                               f"tags.`parcae.training_run_id` = '{run.info.run_id}'")  # fmt: skip
    assert sorted(int(p.data.params["step"]) for p in plans) == boundaries
    assert {p.data.tags["prefect.flow_run_id"] for p in plans} == {str(state.state_details.flow_run_id)}
    assert {p.data.tags["decision"] for p in plans} == set(summary["decisions"])

    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"timeline.png", "migrations.json", "plans.json", "checkpoints"} <= artifacts
    steps = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert steps == {f"checkpoints/step-{s}" for s in range(CHECKPOINT_EVERY, STEPS, CHECKPOINT_EVERY)}

    # next to the checkpoints: which MLflow run the job is; in Prefect: the summary, the plans, the run's link
    assert json.loads((out / RUN_FILE).read_text())["run_id"] == run.info.run_id
    found = _artifacts(state.state_details.flow_run_id)
    keys = {"training-summary", "plan", "plans", "training-run", "training-progress"}
    assert {f"{k}-tiny-gpt-p3" for k in keys} <= set(found), set(found)
    summary_md = found["training-summary-tiny-gpt-p3"].data
    assert run.info.run_id in summary_md and "| intra-stage |" in summary_md
    # one card for the first plan and one per change of strategy, not one per interval; every plan in the table
    with get_client(sync_client=True) as client_:
        cards = client_.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]),
            key=ArtifactFilterKey(any_=["plan-tiny-gpt-p3"])))  # fmt: skip
    rows = json.loads(found["plans-tiny-gpt-p3"].data)
    assert len(rows) == summary["plans"] and [r["decision"] for r in rows] == summary["decisions"]
    assert len(cards) == 1 + sum(r["from"] != r["decision"] for r in rows[1:]) < summary["plans"], len(cards)


def test_a_finished_job_is_not_run_again(trained, profile: Path) -> None:
    _, out = trained
    state = train(**JOB, steps=STEPS, profile=str(profile), out_dir=str(out), return_state=True)
    assert state.is_failed()
    assert "out_dir" in state.message and "finished job" in state.message and "fresh out_dir" in state.message


# ------------------------------------------------------------------------------------------------ resume


def _complete_checkpoint(directory: Path) -> int | None:
    """The step of a complete checkpoint of the flow's job in `directory`, if one is on disk yet."""
    if not directory.is_dir():
        return None
    steps = sorted({int(p.name[4:12]) for p in directory.glob("step*.pt")}, reverse=True)
    for s in steps:
        try:
            checkpoint.load(checkpoint.find_shards(directory, s), config=model_config("tiny-gpt"), job="job")
            return s
        except checkpoint.CheckpointError:
            continue
    return None


def _logged_past(client: mlflow.MlflowClient, out: Path, step: int) -> bool:
    """The job's MLflow run (named in its run file) has the loss of every step before `step`: the observer flushes
    every second, and a kill loses what it has not flushed yet; the test kills once the run holds the steps up to
    the checkpoint, so that what the resumed run must show is known."""
    if not (out / RUN_FILE).exists():
        return False
    run_id = json.loads((out / RUN_FILE).read_text())["run_id"]
    return max((m.step for m in client.get_metric_history(run_id, "loss")), default=-1) >= step - 1


def test_a_killed_train_flow_resumes_from_its_checkpoint_into_the_same_mlflow_run(
    prefect_server: str, store: Path, tmp_path: Path, _no_orphans
) -> None:
    out = tmp_path / "job"
    args = dict(JOB, planner="rule", steps=120, interval_seconds=1.0, checkpoint_every=10, out_dir=str(out))
    code = f"from flows.train import train; train(**{args!r})"
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    client = mlflow.MlflowClient()
    try:
        deadline = time.monotonic() + 180
        killed_at = None
        while time.monotonic() < deadline and proc.poll() is None:
            killed_at = _complete_checkpoint(out / "checkpoints")
            if killed_at is not None and _logged_past(client, out, killed_at):
                os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers die at once, as a lost machine
                break
            time.sleep(0.02)
        proc.wait(30)
        assert killed_at is not None, f"no checkpoint before the flow ended: {proc.stderr.read().decode()[-3000:]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    # The kill lands at `killed_at`'s checkpoint: a later one that completed in the test's reaction time (it loads
    # a checkpoint and reads MLflow between looks) goes, as if the machine had died before writing it; otherwise
    # the resume starts past the steps the observer had flushed and what the run must show is not known.
    checkpoint.remove_after(out / "checkpoints", killed_at)
    before = json.loads((out / RUN_FILE).read_text())
    assert client.get_run(before["run_id"]).info.status == "RUNNING"  # SIGKILL: nobody ended it

    state = train(**args, return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    restored = summary["resumed_from"]
    assert restored == killed_at
    assert summary["first_step"] == restored and summary["steps"] == 120
    assert summary["mlflow_run_id"] == before["run_id"] and summary["mlflow_resumed_run"]

    run = client.get_run(before["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["parcae.resumed"] == "true" and run.data.tags["parcae.resumed_from_step"] == str(restored)
    assert run.data.metrics["resumes"] == 1
    assert int(run.data.tags["parcae.interrupted_at_step"]) >= restored - 1
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert {m.step for m in losses} == set(range(120))  # both incarnations, in one run
    assert json.loads((out / RUN_FILE).read_text())["status"] == "FINISHED"


# ------------------------------------------------------------------------------------------------ bad settings


def test_an_unknown_trace_and_model_fail_together_before_anything_starts(store: Path, tmp_path: Path) -> None:
    state = train(**{**JOB, "trace": "p4", "model": "gpt-17"}, steps=STEPS, out_dir=str(tmp_path / "job"),
                  return_state=True)  # fmt: skip
    assert state.is_failed() and "2 configuration problems" in state.message  # every problem at once
    assert "trace: unknown trace 'p4'" in state.message and "p3" in state.message  # with the known names
    assert "model: unknown trainer model 'gpt-17'" in state.message and "tiny-gpt" in state.message
    assert not (tmp_path / "job").exists()


def test_an_unreachable_tracking_server_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    state = train(**JOB, steps=STEPS, out_dir=str(tmp_path / "job"), return_state=True)
    assert state.is_failed() and time.monotonic() - t0 < 60  # one request, no minutes of retries
    assert "MLFLOW_TRACKING_URI" in state.message and "start the server" in state.message
    assert not (tmp_path / "job").exists()


AWS = dict(region="us-east-1", image_id="ami-0123456789abcdef0", job="parcae-job", coordinator_host="10.0.0.5",
           coordinator_port=29500, token_parameter="/parcae/job-token",
           iam_instance_profile="parcae-worker")  # fmt: skip


def test_the_aws_provider_needs_credentials_and_a_valid_configuration(
    store: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    isolate_aws(monkeypatch, tmp_path)
    state = train(
        **JOB, steps=STEPS, provider="aws", provider_options=AWS, out_dir=str(tmp_path / "job"), return_state=True
    )
    assert state.is_failed()
    assert "provider='aws'" in state.message and "credentials" in state.message.lower()
    assert "provider='local'" in state.message

    fake_aws_account(monkeypatch, "us-east-1")
    with mock_aws():
        boto3.client("sts", region_name="us-east-1")  # moto answers sts:GetCallerIdentity
        state = train(**JOB, steps=STEPS, provider="aws", provider_options={**AWS, "coordinator_host": "127.0.0.1"},
                      out_dir=str(tmp_path / "job"), return_state=True)  # fmt: skip
    assert state.is_failed()
    assert "aws: AwsSpotConfig.coordinator_host" in state.message and "is the instance itself" in state.message
    assert not (tmp_path / "job").exists()


def test_the_train_flow_runs_its_job_on_spot_instances(
    store: Path, profile: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """provider='aws' end to end: boto3 against a moto_server on 127.0.0.1, each instance a local process group
    running its real boot script (`_ec2_standin`): the token from SSM, the instance agent, the worker."""
    job = "flow-e2e"
    with moto_server_env(monkeypatch, tmp_path, "us-east-1") as session:
        aws = {**AWS, "job": job, "image_id": "ami-12c6146b", "coordinator_host": coordinator_host(),
               "coordinator_port": free_port(), "python": sys.executable, "workdir": str(ROOT)}  # fmt: skip
        ec2 = session.client("ec2")
        env = {k: v for k, v in os.environ.items() if k != "PARCAE_TOKEN"}
        with Ec2StandIn(ec2, job, env, tmp_path) as standin:
            state = train(**JOB, steps=STEPS, profile=str(profile), checkpoint_every=CHECKPOINT_EVERY,
                          provider="aws", provider_options=aws, out_dir=str(tmp_path / "job"),
                          return_state=True)  # fmt: skip
        states = [i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    assert standin.error is None, standin.error
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["steps"] == STEPS
    # the replay's drops terminated instances that were running, its rises launched new ones
    assert standin.reclaimed and len(states) > JOB["workers"]
    assert {"pipeline", "intra-stage", "inter-stage"} <= set(summary["migrations"]), summary["migrations"]
    assert set(states) == {"terminated"}  # nothing left running, and paid for, after the job
    run = mlflow.MlflowClient().get_run(summary["mlflow_run_id"])
    assert run.data.tags["parcae.provider"] == "aws"


def test_an_earlier_jobs_checkpoints_are_not_overwritten(store: Path, tmp_path: Path) -> None:
    (tmp_path / "job" / "checkpoints").mkdir(parents=True)
    (tmp_path / "job" / "checkpoints" / "step00000010.pt").write_bytes(b"")
    state = train(**JOB, steps=STEPS, resume=False, out_dir=str(tmp_path / "job"), return_state=True)
    assert state.is_failed() and "resume=True" in state.message and "fresh out_dir" in state.message


def test_bad_schedules_in_prefect_yaml_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    bad = {"hourly": {"cron": "0 * * *", "timezone": "UTC"}, "every-minute": {"interval": 0},
           "every-10-minutes": {"interval": 600, "timezone": "Mars/Olympus"}}  # fmt: skip
    for dep in doc["deployments"]:
        if dep["name"] in bad:
            dep["schedules"] = [bad[dep["name"]]]
    path = tmp_path / "prefect.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "flows").symlink_to(ROOT / "flows")  # entrypoints resolve beside the file

    with pytest.raises(settings.SettingError) as err:
        settings.check_deployments(path)
    problems = err.value.problems
    assert len(problems) == 3, problems
    assert any("'hourly'.schedules[0].cron" in p and "5 fields" in p for p in problems)
    assert any("'every-minute'.schedules[0].interval" in p and "> 0" in p for p in problems)
    assert any("'every-10-minutes'" in p and "Mars/Olympus" in p and "IANA" in p for p in problems)

    assert settings.main([str(path)]) == 2  # the `make serve` pre-check
    assert capsys.readouterr().err.count("error: ") == 3


def test_the_train_flow_trains_a_users_model_by_module_function(store: Path, _no_orphans) -> None:
    """A team's own model through the `train` flow: `model` is module:function (here a file path), `model_args` its
    arguments; the job's global batch is the spec's rows, and the MLflow run says which spec trained."""
    digits = f"{ROOT / 'examples' / 'digits_cnn.py'}:spec"
    state = train(model=digits, model_args={"batch_size": 12, "validate_every": 4}, workers=2, trace="p3",
                  start_interval=49, interval_seconds=0.2, step_seconds=0.1, planner="rule", steps=8,
                  checkpoint_every=4, out_dir=str(store / "digits"), return_state=True)  # fmt: skip
    assert state.is_completed(), state.message
    summary = state.result()
    run = mlflow.MlflowClient().get_run(summary["mlflow_run_id"])
    assert run.data.params["model"] == digits
    assert json.loads(run.data.params["model_args"]) == {"batch_size": 12, "validate_every": 4}
    assert run.data.params["global_batch"] == "12" and len(run.data.params["model_fingerprint"]) == 16
    assert summary["steps"] == 8
    # its held-out digits, scored at boundaries 0, 4 and 8 (the final layers): charted, and the last in the summary
    held_out = mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_loss")
    assert sorted(m.step for m in held_out) == [0, 4, 8]
    accuracy = mlflow.MlflowClient().get_metric_history(run.info.run_id, "val_accuracy")  # the example's metric
    assert sorted(m.step for m in accuracy) == [0, 4, 8] and all(0 <= m.value <= 1 for m in accuracy)
    assert summary["val_loss_last"] == pytest.approx(max(held_out, key=lambda m: m.step).value)
    # the one checkpoint (step 4) was scored: it is the best one, and MLflow has the run's lowest held-out loss
    at_4 = next(m.value for m in held_out if m.step == 4)
    assert summary["best_checkpoint"] == {"step": 4, "val_loss": at_4, "monitor": "loss", "mode": "min", "value": at_4}
    best = min(held_out, key=lambda m: (m.value, m.step))
    ended = mlflow.MlflowClient().get_run(run.info.run_id).data.metrics
    assert (ended["best_val_loss"], ended["best_val_step"]) == (best.value, best.step)
    # the trained model and the best checkpoint, as MLflow models of the run: each loads as the spec's layers
    client = mlflow.MlflowClient()
    models = client.search_logged_models([run.info.experiment_id], f"source_run_id = '{run.info.run_id}'")
    assert {m.name: (m.params["step"], str(m.status)) for m in models} == {"model": ("8", "READY"),
                                                                           "best": ("4", "READY")}  # fmt: skip
    assert summary["mlflow_models"] == {m.name: f"models:/{m.model_id}" for m in models}  # (and in its artifact)
    final = next(m for m in models if m.name == "model")
    assert float(final.params["val_loss"]) == pytest.approx(max(held_out, key=lambda m: m.step).value, rel=1e-5)
    loaded = mlflow.pytorch.load_model(final.artifact_location)  # (models:/ would read MLflow's global tracking URI)
    exported = export_state_dict(store / "digits" / "layers")
    for key, value in exported.state.items():
        name, rest = key.split(".", 1)
        assert torch.equal(loaded.layer(name).state_dict()[rest], value), key


def test_the_train_flow_runs_a_job_from_its_settings_file(store: Path, tmp_path: Path, _no_orphans) -> None:
    """``config_file``: the job's settings from one file (TOML here; the job.json a job writes reads the same), as
    `parcae train --config` takes them; beside it only out_dir and resume, and a file's mistake names the file."""
    job = tmp_path / "nightly.toml"
    job.write_text('[model]\nname = "tiny-gpt"\nargs = {n_layer = 2}\n\n[train]\nsteps = 0\n')
    state = train(config_file=str(job), out_dir=str(tmp_path / "job"), return_state=True)
    assert state.is_failed() and f"config_file: {job}: train.steps" in state.message, state.message
    job.write_text('[model]\nname = "tiny-gpt"\nargs = {n_layer = 2}\n\n[train]\nsteps = 4\n\n'
                   '[availability]\nworkers = 2\ntrace = "p3"\nstart_interval = 49\ninterval_seconds = 0.2\n\n'
                   '[planning]\nplanner = "rule"\n\n[checkpoint]\nevery = 2\n')  # fmt: skip
    state = train(config_file=str(job), workers=3, steps=5, out_dir=str(tmp_path / "job"), return_state=True)
    assert state.is_failed() and "workers, steps cannot be given beside it" in state.message, state.message
    assert not (tmp_path / "job").exists()
    state = train(config_file=str(job), out_dir=str(tmp_path / "job"), return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["steps"] == 4 and summary["planner"] == "rule"
    run = mlflow.MlflowClient().get_run(summary["mlflow_run_id"])
    assert run.data.tags["parcae.config_file"] == str(job) and run.data.tags["parcae.trace"] == "p3"
    assert run.data.tags["prefect.flow_run_name"] == "train-nightly"
    written = json.loads((tmp_path / "job" / "job.json").read_text())  # the file's job, in the run's out_dir
    assert written["model"]["args"]["n_layer"] == 2 and written["availability"]["workers"] == 2
    assert written["out_dir"] == str(tmp_path / "job") and written["checkpoint"]["every"] == 2


def test_the_train_flow_runs_a_live_fleet_under_the_local_market(store: Path, profile: Path, _no_orphans,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """provider="market" with a fleet of 2: the market's capacity follows p3 from interval 49 (the job is blind to
    it), liveput plans every interval from the fleet's own history; the MLflow run holds the fleet's table."""
    monkeypatch.setenv("PARCAE_TRACE_STORE", str(store / "trace-store"))
    state = train(model="tiny-gpt", workers=3, fleet=2, provider="market", trace="p3", start_interval=49,
                  interval_seconds=1.0, planner="liveput", profile=str(profile), steps=20, checkpoint_every=10,
                  out_dir=str(store / "fleet"), return_state=True)  # fmt: skip
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["steps"] == 20
    run = mlflow.MlflowClient().get_run(summary["mlflow_run_id"])
    assert run.data.tags["parcae.fleet"] == "2" and run.data.tags["parcae.provider"] == "market"
    assert run.info.run_name.startswith("train-tiny-gpt-market-fleet-")
    config = json.loads(run.data.params["config"]) if "config" in run.data.params else None
    assert config is None or config["availability"]["trace"] is None  # the job itself replays nothing
    table = mlflow.artifacts.load_dict(f"runs:/{summary['mlflow_run_id']}/fleet.json")
    assert table["columns"] == ["t", "requested", "granted", "alive", "refused", "reclaimed"]
    assert table["data"] and max(row[3] for row in table["data"]) >= 1
    cost = summary["fleet_cost"]  # what the fleet cost: the market's instances stand for p3's p3.2xlarge
    assert cost["instance_type"] == "p3.2xlarge" and cost["instance_hours"] > 0 and cost["spot_usd"] > 0
    assert run.data.metrics["fleet_spot_usd"] == pytest.approx(cost["spot_usd"])
    job = json.loads((store / "fleet" / "job.json").read_text())
    assert job["fleet"]["max_instances"] == 2 and job["provider"]["options"]["trace"] == "p3"
    assert job["availability"]["trace"] is None
    assert (store / "trace-store" / "fleet_intervals").is_dir()  # the fleet's history, where collected traces go
