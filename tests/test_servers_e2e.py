"""End to end on real servers: a Prefect server, an MLflow tracking server, the `train` deployment of prefect.yaml
run by a process worker, and the training run checked through the MLflow server.

Everything listens on 127.0.0.1 at free ports, with telemetry off and every file under a temporary folder; each
server and the worker run in their own process group and are killed (group and all) at teardown. The deployment is
made the way `make serve` makes it (`prefect --no-prompt deploy` from the project root), with the worker's
environment naming the MLflow server, as an operator would run it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from _flow_fixtures import free_port, runtime_profile_file

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
STEPS, SPI = 20, 5  # 3 workers replaying p3; a plan every 5 steps (interval_seconds 0.5 / step_seconds 0.1)


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} not healthy within {timeout_s:g} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen, first: int = signal.SIGINT, grace_s: float = 10.0) -> None:
    """Stop a process group: `first` (Prefect's worker only heeds SIGINT while runs are active), then SIGKILL."""
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the leader left behind in its group
        return
    try:
        os.killpg(proc.pid, first)
        proc.wait(grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, str]]:
    prefect_port, mlflow_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(
        DO_NOT_TRACK="true",
        MLFLOW_DISABLE_TELEMETRY="true",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_API_URL=f"http://127.0.0.1:{prefect_port}/api",
        MLFLOW_TRACKING_URI=f"http://127.0.0.1:{mlflow_port}",
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW="ignore",
    )
    procs: list[subprocess.Popen] = []

    def start(name: str, args: list[str], cwd: Path) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"{name}.log"
        proc = subprocess.Popen(args, cwd=cwd, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=log.open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
        procs.append(proc)
        return proc, log

    try:
        prefect, prefect_log = start("prefect-server", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                                        "--port", str(prefect_port), "--analytics-off"],
                                     tmp_path)  # fmt: skip
        mlflow_dir = tmp_path / "mlflow"
        mlflow_dir.mkdir()
        mlflow, mlflow_log = start("mlflow-server", [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port",
                                                     str(mlflow_port), "--backend-store-uri",
                                                     f"sqlite:///{mlflow_dir}/mlflow.db", "--workers", "1"],
                                   mlflow_dir)  # fmt: skip
        _wait_healthy(f"http://127.0.0.1:{prefect_port}/api/health", prefect, prefect_log)
        _wait_healthy(f"http://127.0.0.1:{mlflow_port}/health", mlflow, mlflow_log)

        def cli(*args: str) -> None:
            done = subprocess.run([str(BIN / "prefect"), *args], cwd=ROOT, env={**env, "PWD": str(ROOT)},
                                  capture_output=True, text=True, timeout=120)  # fmt: skip
            assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

        cli("work-pool", "create", "parcae-local", "--type", "process")
        cli("--no-prompt", "deploy", "--name", "on-demand")  # only train: the scheduled ones would start running
        worker, _ = start("worker", [str(BIN / "prefect"), "worker", "start", "--pool", "parcae-local"], tmp_path)
        yield {"prefect": env["PREFECT_API_URL"], "mlflow": env["MLFLOW_TRACKING_URI"], "home": env["PREFECT_HOME"]}
    finally:
        for proc in reversed(procs):  # the worker (and its flow runs) first, then the servers
            _stop(proc, signal.SIGINT if proc is procs[-1] else signal.SIGTERM)


def test_the_train_deployment_runs_on_a_worker_and_logs_to_the_mlflow_server(
    servers: dict[str, str], tmp_path: Path
) -> None:
    from mlflow import MlflowClient
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    profile = runtime_profile_file(tmp_path / "profile.json", fastest=(2, 1))
    # a trace replay on local processes (the deployment's defaults train small-gpt under the local market)
    parameters = dict(model="tiny-gpt", provider="local", fleet=None, workers=3, steps=STEPS, interval_seconds=0.5,
                      start_interval=49, planner="liveput",
                      profile=str(profile), checkpoint_every=10, out_dir=str(tmp_path / "job"),
                      resume=False)  # fmt: skip
    with temporary_settings({PREFECT_API_URL: servers["prefect"]}):
        run = run_deployment(name="train/on-demand", parameters=parameters, timeout=150, poll_interval=1)
    assert run.state is not None and run.state.is_completed(), f"{run.state}\n" + "\n".join(
        (tmp_path / "worker.log").read_text().splitlines()[-60:]
    )

    client = MlflowClient(servers["mlflow"])
    experiment = client.get_experiment_by_name("training")
    [training] = client.search_runs([experiment.experiment_id], f"tags.`prefect.flow_run_id` = '{run.id}'")
    assert training.info.status == "FINISHED"
    assert training.data.tags["prefect.flow_run_name"] == run.name
    assert training.data.tags["prefect.deployment"] == "on-demand"
    losses = client.get_metric_history(training.info.run_id, "loss")
    assert sorted(m.step for m in losses) == list(range(STEPS))
    assert training.data.metrics["reconfigurations"] >= 1
    assert any(k.startswith("parcae.migrations.") for k in training.data.tags)
    plans = client.search_runs([client.get_experiment_by_name("plans").experiment_id],
                               f"tags.`parcae.training_run_id` = '{training.info.run_id}'")  # fmt: skip
    assert sorted(int(p.data.params["step"]) for p in plans) == list(range(SPI, STEPS, SPI))
    assert {p.data.tags["prefect.flow_run_id"] for p in plans} == {str(run.id)}
    artifacts = {a.path for a in client.list_artifacts(training.info.run_id)}
    assert {"timeline.png", "migrations.json", "checkpoints"} <= artifacts  # through the server's artifact proxy
