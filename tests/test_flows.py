"""Tests for the Prefect flows (flows/, tasks/) and their deployments (prefect.yaml).

Everything is local and temporary: one Prefect test server for the session (`prefect_test_harness`, its
home under a temporary folder, telemetry off), one MLflow SQLite store for the module (named only through
``MLFLOW_TRACKING_URI``), tiny synthetic traces (``PARCAE_SHARED_TRACES``) and moto for EC2. The
environment is set by `_prefect_home`, imported before Prefect because Prefect reads its settings on import.
Flows are called directly (one process); `prefect.yaml` is checked by loading every entrypoint and
validating its schedules and parameters with Prefect's own models. The plan hand-over is checked against a real
running job (coordinator and worker processes, a `HandedPlanner`) in a thread of the test.
"""

from __future__ import annotations

import contextlib  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
from datetime import UTC, datetime, timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from tracking import VIEWS, TrackingError  # noqa: E402

import _prefect_home  # noqa: E402,F401 - before prefect: a temporary PREFECT_HOME, telemetry off
import boto3  # noqa: E402
import mlflow  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from _aws import fake_aws_account, isolate_aws  # noqa: E402
from _flow_fixtures import free_port, runtime_profile_file  # noqa: E402
from _jobs import run_job  # noqa: E402
from _paced import paced_gpt  # noqa: E402
from _tables import periodic_counts  # noqa: E402
from _trainer_fixtures import _no_orphans, _one_thread, market_job  # noqa: E402,F401 - activates them
from moto import mock_aws  # noqa: E402
from prefect.client.orchestration import get_client  # noqa: E402
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId  # noqa: E402
from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule  # noqa: E402
from prefect.flows import load_flow_from_entrypoint  # noqa: E402
from prefect.states import Failed  # noqa: E402

from flows.collect_traces import collect_traces  # noqa: E402
from flows.plan_interval import plan_interval  # noqa: E402
from flows.retrain_forecaster import retrain_forecaster  # noqa: E402
from forecasting import COMPACT_AT, TraceStore  # noqa: E402
from forecasting.registry import CHAMPION, DEFAULT_REGISTERED_NAME  # noqa: E402
from forecasting.traces import load_trace  # noqa: E402
from liveput.optimizer import JobState  # noqa: E402
from liveput.throughput import load_profile  # noqa: E402
from parcae.settings import check_deployments  # noqa: E402
from tasks import retry_on  # noqa: E402
from tasks.plan import hand_plan_to_coordinator  # noqa: E402
from tasks.tracking import FLOW_RUN_TAG, FORECASTER_RUN_TAG, store_unavailable  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.control.planning import HandedPlanner, HandPlanError  # noqa: E402
from trainer.observe.observer import JobObserver  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
AMI = "ami-12c6146b"  # any id: moto does not validate AMIs without its default set
LOOK_AHEAD = 8
#: A LightGBM small enough to train in well under a second on the synthetic traces.
TINY = dict(seed=1, n_estimators=60, learning_rate=0.1, num_leaves=15, min_child_samples=5)


pytestmark = pytest.mark.usefixtures("prefect_server")  # the session's Prefect test server (tests/conftest.py)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory):
    """A temporary MLflow store and a shared-traces folder holding three tiny ``ts_ms,count`` traces.

    Their names (``<stem>-counts``) are learnable by a small LightGBM and not by persistence, so a model
    trained on the first two and evaluated on the third is promoted.
    """
    root = tmp_path_factory.mktemp("flows")
    traces = root / "traces"
    traces.mkdir()
    series = {
        "periodic-a": periodic_counts(30),
        "periodic-b": periodic_counts(20, drop_at=5, capacity=16, low=12),
        "periodic-eval": periodic_counts(6, drop_at=9),
    }
    for name, counts in series.items():
        (traces / f"{name}.csv").write_text("".join(f"{i * 60_000},{n}\n" for i, n in enumerate(counts)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        mp.setenv("PARCAE_SHARED_TRACES", str(traces))
        yield root


@pytest.fixture(scope="module")
def trained(stores: Path):
    """One run of the retrain flow on the tiny corpus: its final state."""
    return retrain_forecaster(
        eval_trace="periodic-eval-counts",
        horizon=LOOK_AHEAD,
        train_traces=["periodic-a-counts", "periodic-b-counts"],
        forecaster_params=TINY,
        plots=False,
        return_state=True,
    )


def test_retrain_forecaster_logs_a_run_and_records_promotion(trained) -> None:
    assert trained.is_completed(), trained.message
    outcome = trained.result()
    assert outcome["promoted"] and outcome["reason"].startswith("promoted: ")
    assert outcome["metrics"]["mae_mean"] < outcome["metrics"]["persistence_mae_mean"]

    client = mlflow.MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("forecaster").experiment_id])
    assert [r.info.run_id for r in runs] == [outcome["run_id"]]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["eval_trace"] == "periodic-eval-counts"
    assert run.data.params["train_traces"] == "periodic-a-counts,periodic-b-counts"
    assert run.data.tags["promotion"] == "promoted"
    champion = client.get_model_version_by_alias(DEFAULT_REGISTERED_NAME, CHAMPION)
    assert int(champion.version) == outcome["version"] and champion.run_id == outcome["run_id"]


def test_plan_interval_returns_a_feasible_plan_and_logs_one_mlflow_run(trained, stores: Path) -> None:
    at = 300
    state = plan_interval(
        model="gpt-1.5b", trace="p3", at_interval=at, look_ahead=LOOK_AHEAD, state=JobState((2, 4)),
        return_state=True,
    )  # fmt: skip
    assert state.is_completed(), state.message
    plan = state.result()

    available = int(load_trace("p3").set_index("interval").loc[at, "available"])
    d, p = plan["decision"]
    assert (d, p) == (0, 0) or ((d, p) in load_profile("gpt-1.5b").strategies(available))
    assert len(plan["steps"]) == plan["look_ahead"] == LOOK_AHEAD
    assert plan["steps"][0]["reach"] > 0 and plan["expected_samples"] > 0
    assert plan["state"] == {"strategy": [2, 4], "migrating": False, "leftover_ms": 0.0}

    client = mlflow.MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("plans").experiment_id])
    assert [r.info.run_id for r in runs] == [plan["mlflow_run_id"]]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags[FLOW_RUN_TAG] == str(state.state_details.flow_run_id)
    assert run.data.tags[FORECASTER_RUN_TAG] == trained.result()["run_id"]  # the champion's training run
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.name"]  # "Created by", "Source" in the UI
    assert run.data.params["model"] == "gpt-1.5b" and run.data.params["look_ahead"] == str(LOOK_AHEAD)
    assert run.data.params["interval"] == str(at) and run.data.params["current_strategy"] == "2x4"
    assert run.data.params["forecaster"] == "lightgbm-gated"  # the champion, behind the online skill gate
    assert run.data.metrics["expected_samples"] == pytest.approx(plan["expected_samples"])
    assert {"decision_ms", "reach"} <= set(run.data.metrics)
    # the plans' saved view shows what a plan-interval run holds (the job's own plans add alive and decision_D/P)
    view = VIEWS["plans"]
    assert {"interval", "current_strategy"} <= set(run.data.params) and set(view.tags) <= set(run.data.tags)
    assert set(view.metrics) - set(run.data.metrics) == {"alive", "decision_D", "decision_P"}
    logged = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/plan.json")
    assert logged["decision"] == plan["decision"]
    assert mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/forecast.json")["capacity"] == 32

    # the Prefect UI gets the plan table with a pointer to the MLflow run, under a stable key
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        )
    [report] = [a for a in artifacts if a.type == "markdown"]
    assert report.key == "plan-gpt-1-5b"
    assert plan["mlflow_run_id"] in report.data and "| expected samples |" in report.data
    assert f"runs/{plan['mlflow_run_id']}?workflowType=machine_learning" in report.data  # the UI's training view


def test_handing_a_plan_over_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        hand_plan_to_coordinator.fn({"decision": [1, 2]}, "no-port", "job")
    with pytest.raises(HandPlanError, match="0x0"):
        hand_plan_to_coordinator.fn({"decision": [0, 0]}, "127.0.0.1:29500", "job")
    with pytest.raises(HandPlanError, match="cannot reach"):
        hand_plan_to_coordinator.fn({"decision": [1, 2]}, f"127.0.0.1:{free_port()}", "job", timeout_s=1)


def test_plan_interval_hands_its_plan_to_a_running_job(trained, tmp_path: Path, _no_orphans) -> None:
    """A real job (4 worker processes on 2x2, a `HandedPlanner` that keeps its strategy until told) runs in a
    thread; the flow plans on the job's runtime profile and hands the decision to its coordinator; the job
    reconfigures to it at its next interval boundary."""
    profile = runtime_profile_file(tmp_path / "profile.json", fastest=(1, 2))
    started, info, outcome = threading.Event(), {}, {}

    class Started(JobObserver):
        def on_start(self, i: Any) -> None:
            info.update(i)
            started.set()

    def job() -> None:
        try:
            outcome["result"] = run_job(
                "tiny-gpt", TrainConfig(steps=160), 4, (2, 2), 160, [], tmp_path / "job", job="handed-job",
                observer=Started(), planner=HandedPlanner(), steps_per_interval=5)  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=job, name="handed-job")
    thread.start()
    try:
        assert started.wait(120) and "error" not in outcome, outcome.get("error")
        state = plan_interval(
            model="tiny-gpt", trace="p3", at_interval=20, look_ahead=LOOK_AHEAD, state=JobState((2, 2)),
            profile=str(profile), capacity=4, coordinator=f"{info['host']}:{info['port']}", job="handed-job",
            token_file=info["token_file"],
            return_state=True,
        )  # fmt: skip
    finally:
        thread.join(180)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    assert state.is_completed(), state.message
    plan = state.result()
    decision = plan["decision"]
    assert decision != [2, 2], "the profile makes 1x2 ten times faster: the plan should move the job"
    assert plan["handed"]["strategy"] == decision and plan["handed"]["job"] == "handed-job"

    result = outcome["result"]
    applied = [p for p in result["plans"] if p["details"].get("source") == "handed"]
    assert applied, f"the job never applied the handed plan: {result['plans']}"
    first = applied[0]
    assert first["decision"] == decision and first["current"] == [2, 2]
    assert str(state.state_details.flow_run_id) in first["details"]["handed"]["source"]  # who sent it
    moved = [r for r in result["reconfigurations"] if r.get("step") == first["step"]]
    assert moved and list(moved[0]["strategy"]) == decision
    assert [p["decision"] for p in result["plans"] if p["step"] > first["step"]] == [decision] * sum(
        p["step"] > first["step"] for p in result["plans"]
    )  # the plan stands until replaced


def test_collect_traces_writes_fleet_rows_with_moto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolate_aws(monkeypatch, tmp_path)
    fake_aws_account(monkeypatch, REGION)
    store = tmp_path / "store"
    for i in range(COMPACT_AT):  # a store that collection rounds have grown: the round compacts it
        row = {"region": REGION, "az_id": "", "instance_types": "m5.large", "target_capacity": 4, "single_az": False,
               "score": 3, "timestamp": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=10 * i)}  # fmt: skip
        TraceStore(store).append("placement_scores", [row])
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        ec2.run_instances(
            ImageId=AMI, MinCount=3, MaxCount=3, InstanceType="m5.large",
            InstanceMarketOptions={"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}},
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "parcae:job", "Value": "job-a"}]}],
        )  # fmt: skip
        result = collect_traces(store=str(store), regions=[REGION], instance_types=("m5.large",), job_tag="job-a")

    assert result["store"] == str(store.resolve()) and result["regions"] == [REGION]
    assert result["rows_written"]["fleet_events"] == 3
    assert result["rows_written"]["spot_prices"] > 0
    assert any("get_spot_placement_scores" in u for u in result["unsupported"])  # moto lacks it
    assert result["parts_compacted"]["placement_scores"] == COMPACT_AT - 1
    assert len(TraceStore(store).read("placement_scores")) == COMPACT_AT
    events = TraceStore(store).read("fleet_events")
    assert len(events) == 3 and set(events["event"]) == {"add"} and set(events["job_tag"]) == {"job-a"}


def test_prefect_yaml_deploys_every_flow_on_the_local_pool_with_a_valid_schedule() -> None:
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert doc["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $PWD }}"}}]
    deployments = {f"{d['entrypoint']}:{d['name']}": d for d in doc["deployments"]}
    flow_files = {p.stem for p in (ROOT / "flows").glob("*.py")} - {"__init__", "deployments"}  # deployments: deploys
    assert {d["entrypoint"].split("/")[1].split(".")[0] for d in deployments.values()} == flow_files

    expected = {
        "flows/collect_traces.py:collect_traces": timedelta(minutes=10),
        "flows/retrain_forecaster.py:retrain_forecaster": "0 * * * *",
        "flows/plan_interval.py:plan_interval": timedelta(seconds=60),
        "flows/train.py:train": None,  # a job runs until done: started by hand (or by `pipeline`)
        "flows/pipeline.py:pipeline": None,
    }
    assert {d["entrypoint"] for d in deployments.values()} == set(expected)
    trains = [d["name"] for d in deployments.values() if d["entrypoint"] == "flows/train.py:train"]
    assert trains == ["on-demand", "from-file"]
    for spec in deployments.values():
        entrypoint = spec["entrypoint"]
        path, name = entrypoint.split(":")
        flow = load_flow_from_entrypoint(f"{ROOT / path}:{name}")
        flow.validate_parameters(spec.get("parameters") or {})  # raises on an unknown or ill-typed parameter
        assert spec["work_pool"]["name"] == "parcae-local"
        if expected[entrypoint] is None:
            assert not spec.get("schedules")
            continue
        [raw] = spec["schedules"]
        if "cron" in raw:
            schedule = CronSchedule(cron=raw["cron"], timezone=raw.get("timezone"))
            assert schedule.cron == expected[entrypoint]
        else:
            schedule = IntervalSchedule(interval=timedelta(seconds=raw["interval"]), timezone=raw.get("timezone"))
            assert schedule.interval == expected[entrypoint]
    # the `make serve` pre-check passes on the real file (and names every deployment)
    labels = check_deployments(ROOT / "prefect.yaml")
    assert sorted(labels) == sorted(deployments)


def test_make_serve_s_deploy_pauses_what_cannot_run_here_and_says_why(
    prefect_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m flows.deployments prefect.yaml` (what `make serve` runs) on a machine without AWS: every
    deployment is made, one line each (not Prefect's panels, which repeat "start a worker" five times), and
    collect-traces, which needs an AWS region and credentials, is paused saying so; the settings check notes it."""
    import subprocess
    import sys

    from parcae.settings import main as check_main
    from parcae.settings import unrunnable_here

    isolate_aws(monkeypatch, tmp_path)
    with get_client(sync_client=True) as client:
        from prefect.client.schemas.actions import WorkPoolCreate

        with contextlib.suppress(Exception):  # another test of the session may have made it
            client.create_work_pool(WorkPoolCreate(name="parcae-local", type="process"))
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PWD": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-m", "flows.deployments", "prefect.yaml"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=240)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        lines = [line for line in done.stdout.splitlines() if line.startswith("deployed ")]
        assert len(lines) == 6 and "start a worker" not in done.stdout, done.stdout
        assert "deployed collect-traces/every-10-minutes (paused: regions: no AWS region" in done.stdout
        assert "deployed plan-interval/every-minute (ready)" in done.stdout
        with get_client(sync_client=True) as client:
            paused = {n: client.read_deployment_by_name(n).paused for n in (
                "collect-traces/every-10-minutes", "plan-interval/every-minute", "train/on-demand",
                "train/from-file")}  # fmt: skip
        assert paused == {"collect-traces/every-10-minutes": True, "plan-interval/every-minute": False,
                          "train/on-demand": False, "train/from-file": False}  # fmt: skip
    finally:  # the session's server is shared: leave no scheduled deployment behind
        with get_client(sync_client=True) as client:
            for d in client.read_deployments():
                client.delete_deployment(d.id)
    assert list(unrunnable_here(ROOT / "prefect.yaml")) == ["collect-traces/every-10-minutes"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    assert check_main([str(ROOT / "prefect.yaml")]) == 0
    out = capsys.readouterr().out
    assert "6 deployments OK" in out and "note: collect-traces/every-10-minutes cannot run on this machine" in out
    fake_aws_account(monkeypatch, "us-east-1")  # a region and (moto's) credentials: it could run
    assert unrunnable_here(ROOT / "prefect.yaml") == {}


def test_an_idle_plan_interval_neither_plans_nor_reads_the_registry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every minute with no running job: nothing planned, and no "no model registered" warning on an empty store
    (the champion is loaded only for a job to plan)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/empty.db")
    with caplog.at_level(logging.WARNING, logger="forecasting"):
        idle = plan_interval(running_jobs=True)
    assert idle == {"jobs": [], "note": "no running job takes handed plans: nothing planned"}
    assert not [r for r in caplog.records if r.name.startswith("forecasting")], caplog.records


def test_retry_conditions_retry_only_transient_failures() -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE

    retry = retry_on(store_unavailable)
    assert retry(None, None, Failed(data=TrackingError("store down")))
    # what MLflow's SQLAlchemy store raises for "database is locked"
    assert retry(None, None, Failed(data=MlflowException("locked", error_code=TEMPORARILY_UNAVAILABLE)))
    assert not retry(None, None, Failed(data=MlflowException("bad", error_code=INVALID_PARAMETER_VALUE)))
    assert not retry(None, None, Failed(data=ValueError("horizon must be a positive integer")))
    assert retry_on(TimeoutError)(None, None, Failed(data=TimeoutError()))


def test_plan_interval_plans_for_each_running_fleet_job_and_each_follows_its_plan(trained, tmp_path: Path,
                                                                                   _no_orphans) -> None:  # fmt: skip
    """Two live-fleet jobs under the local market (2 instances each), registered for handed plans on their MLflow
    runs (`--accept-plans`: the rule planner decides when no plan is fresh). One run of the flow with
    ``running_jobs`` finds both, plans each from its own fleet history on its runtime profile (2x1 is the fastest:
    the rule would keep 1x2), hands each its plan and logs a plan run tied to each job's training run; each job
    applies its own plan. Once they have ended, the flow plans nothing and says so."""
    from trainer import JobObserver, MlflowJobObserver, ObserverList
    from trainer.config import CheckpointConfig
    from trainer.control.planning import make_planner
    from trainer.control.run import train as train_config

    profile = runtime_profile_file(tmp_path / "profile.json", fastest=(2, 1))
    market = tmp_path / "market.csv"
    market.write_text("0,2\n3600000,2\n")
    started = {name: threading.Event() for name in ("job-a", "job-b")}
    outcome: dict[str, Any] = {}
    observers: dict[str, MlflowJobObserver] = {}

    class Started(JobObserver):
        def __init__(self, name: str) -> None:
            self.name = name

        def on_step(self, step: Any) -> None:
            if step.step >= 5:
                started[self.name].set()

    def job(name: str) -> None:
        config = market_job(
            tmp_path / name,
            market,
            steps=160,  # paced: 24 s or more anywhere for the plan handed, stale, then the rule (was 250 unpaced)
            model=paced_gpt(0.15, dtype="float32"),
            max_instances=2,
            interval_s=2.0,
            job=name,
            checkpoint=CheckpointConfig(every=0),
            planning={"profile": str(profile), "accept_plans": True},
            fleet={"min_instances": 2, "trace_store": str(tmp_path / "store")},
        )
        planner, _ = make_planner("rule", accept_plans_for_s=4.0)
        observers[name] = MlflowJobObserver(run_name=name, flush_every_s=0.2)
        try:
            outcome[name] = train_config(config, observer=ObserverList([observers[name], Started(name)]),
                                         planner=planner)  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome[name] = exc
        finally:
            started[name].set()

    threads = [threading.Thread(target=job, args=(name,), name=name) for name in started]
    for t in threads:
        t.start()
    try:
        assert all(e.wait(120) for e in started.values()), outcome
        assert not any(isinstance(v, BaseException) for v in outcome.values()), outcome
        assert all(observers[n].flush(30) for n in started)  # their registration and first steps are in MLflow
        state = plan_interval(running_jobs=True, look_ahead=LOOK_AHEAD, return_state=True)
    finally:
        for t in threads:
            t.join(240)
    assert not any(t.is_alive() for t in threads)
    assert not any(isinstance(v, BaseException) for v in outcome.values()), outcome
    assert state.is_completed(), state.message
    planned = {j["job"]: j for j in state.result()["jobs"]}
    assert sorted(planned) == ["job-a", "job-b"], planned
    client = mlflow.MlflowClient()
    for name, j in planned.items():
        assert j["planned"] and j["decision"] == [2, 1], j
        assert j["training_run_id"] == observers[name].run_id and j["handed"]["job"] == name
        plan_run = client.get_run(j["mlflow_run_id"])
        assert plan_run.data.tags["parcae.training_run_id"] == observers[name].run_id
        assert plan_run.data.tags["parcae.decided_by"] == "plan-interval"
        # the job applied its own plan at a boundary, then its rule took over again once the plan was stale
        plans = outcome[name]["plans"]
        handed = [p for p in plans if p["details"].get("source") == "handed"]
        assert handed and all(p["decision"] == [2, 1] for p in handed), plans
        assert str(state.state_details.flow_run_id) in handed[0]["details"]["handed"]["source"]
        assert any(r["strategy"] == [2, 1] for r in outcome[name]["reconfigurations"])
        assert any(p["details"].get("source") == "rule" for p in plans)  # its own planner, before and after
    # nothing runs now: nothing is planned, and the flow says so
    idle = plan_interval(running_jobs=True, look_ahead=LOOK_AHEAD)
    assert idle == {"jobs": [], "note": "no running job takes handed plans: nothing planned"}


def test_a_training_flow_logs_its_progress_and_why_a_live_fleet_s_job_is_not_training(tmp_path: Path, caplog) -> None:
    """The train flow's observer says in the flow run's log what a log reader needs: the fleet's waits, and a line of
    progress a minute."""
    from prefect import flow

    from tasks.training import PrefectJobObserver
    from trainer import StepInfo

    @flow
    def job() -> None:
        observer = PrefectJobObserver(None, tmp_path, "job", 10)
        observer.on_fleet({"event": "fleet-waiting", "need": 2})
        observer.on_start({"job": "job", "steps": 10, "global_batch": 4, "workers": 2, "strategy": (1, 2)})
        for s in range(10):  # a step every 20 s
            observer.on_step(StepInfo(step=s, loss=4.0 - 0.1 * s, strategy=(1, 2), alive=2, time=1000.0 + 20.0 * s))
        observer.on_fleet({"event": "fleet-empty", "reason": "every instance was lost", "step": 7})

    with caplog.at_level(logging.INFO):
        job()
    said = [r.getMessage() for r in caplog.records]
    assert "waiting for the fleet: training starts once 2 instances joined" in said, said
    assert "the fleet is empty at step 7: every instance was lost; waiting for capacity" in said, said
    assert [m for m in said if m.startswith("step ")] == [
        "step 1/10: loss 4.0000, 1x2, 2 alive", "step 4/10: loss 3.7000, 1x2, 2 alive, 0.2 samples/s",
        "step 7/10: loss 3.4000, 1x2, 2 alive, 0.2 samples/s", "step 10/10: loss 3.1000, 1x2, 2 alive, 0.2 samples/s",
    ]  # fmt: skip
