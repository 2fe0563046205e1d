"""Tests of parcae.simulations: the simulator's policy comparison logged to a real (temporary SQLite) MLflow store
and rebuilt with `mlflow.search_runs`, through the library and through ``parcae simulate --mlflow`` /
``parcae simulations``. A quarter hour of the bundled p3 trace with K=2 keeps each simulation around a second."""

from __future__ import annotations

import math
import re
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from _mlflow import temporary_mlflow_store
from mlflow import MlflowClient
from typer.testing import CliRunner

from forecasting.traces import load_trace
from liveput.simulator import SimulationConfig, comparison_table, simulate
from parcae.cli import app
from parcae.simulations import (
    COMPARISON_TAG,
    SIMULATIONS_EXPERIMENT,
    SIMULATIONS_VIEW,
    ComparisonNotFound,
    comparison_from_mlflow,
    list_comparisons,
    load_comparison,
    log_comparison,
)

WINDOW = (600, 614)  # 10:00-10:15 of p3
POLICIES = ["parcae", "ideal", "reactive", "bamboo", "on-demand", "parcae-oracle"]


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory):
    yield from temporary_mlflow_store(tmp_path_factory)


@pytest.fixture(autouse=True)
def _isolated(mlflow_store: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PARCAE_SHARED_TRACES", str(tmp_path_factory.mktemp("no-shared") / "absent"))


@pytest.fixture(scope="module")
def results():
    return simulate(load_trace("p3"), POLICIES, SimulationConfig(look_ahead=2),
                    first_interval=WINDOW[0], last_interval=WINDOW[1])  # fmt: skip


def assert_same_table(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Same columns in the same order, same policies in the same order, numbers equal to float tolerance."""
    assert list(got.columns) == list(want.columns)
    assert list(got["policy"]) == list(want["policy"])
    for col in want.columns:
        for g, w in zip(got[col], want[col], strict=True):
            if isinstance(w, str):
                assert g == w, (col, g, w)
            elif w is None or (isinstance(w, float) and math.isnan(w)):
                assert g is None or (isinstance(g, float) and math.isnan(g)), (col, g)
            else:
                assert g == pytest.approx(w, rel=1e-12, abs=1e-12), (col, g, w)


def test_search_runs_reproduces_the_comparison_table(results, tmp_path: Path, mlflow_store: Path) -> None:
    plot = tmp_path / "timeline.png"
    plot.write_bytes(b"\x89PNG not really")  # any file: the store keeps it as it is
    cid = log_comparison(results, trace="p3", model="gpt-1.5b", window=(10.0, 10.25), look_ahead=2, interval_s=60,
                         plot=plot, tags={"parcae.command": "parcae simulate --mlflow"})  # fmt: skip
    want = comparison_table(results)
    assert "vs_ideal" in want.columns and len(want) == len(POLICIES)
    assert_same_table(comparison_from_mlflow(cid), want)
    assert_same_table(comparison_from_mlflow(cid, reference=None), comparison_table(results, reference=None))

    # the layout a user searches by hand: one run per policy, nested under the comparison's run
    runs = mlflow.search_runs(experiment_names=[SIMULATIONS_EXPERIMENT],
                              filter_string=f"tags.`{COMPARISON_TAG}` = '{cid}' and params.policy = 'reactive'",
                              )  # fmt: skip
    assert len(runs) == 1
    row = runs.iloc[0]
    assert row["tags.mlflow.parentRunId"] == cid and row["status"] == "FINISHED"
    assert row["params.trace"] == "p3" and row["params.look_ahead"] == "2" and row["params.forecaster"] == "none"
    assert row["metrics.samples"] == results["reactive"].samples
    assert row["metrics.vs_ideal"] == pytest.approx(results["reactive"].samples / results["ideal"].samples)
    # the experiment's saved view shows what a policy's run holds
    assert {f"params.{p}" for p in SIMULATIONS_VIEW.params} | {f"metrics.{m}" for m in SIMULATIONS_VIEW.metrics} <= set(
        runs.columns)  # fmt: skip
    for kind, value in results["reactive"].migrations.items():
        assert row[f"metrics.migrations/{kind}"] == pytest.approx(value)
    client = MlflowClient()
    assert {a.path for a in client.list_artifacts(row["run_id"])} == {"timeline.csv"}
    assert {a.path for a in client.list_artifacts(cid)} == {"comparison.json", "timeline.png"}
    assert client.get_run(cid).data.tags["parcae.command"] == "parcae simulate --mlflow"

    logged = load_comparison(cid)
    assert logged.policies["parcae"].decision_ms_median is not None
    assert logged.policies["ideal"].decision_ms_median is None  # no planner: not logged, read back as None
    assert logged.ideal_samples == results["ideal"].samples
    assert cid in set(list_comparisons()["comparison"])


def test_unknown_comparison_is_reported(mlflow_store: Path) -> None:
    with pytest.raises(ComparisonNotFound, match="parcae simulations"):
        comparison_from_mlflow("0" * 32)


def test_cli_logs_and_shows_the_comparison(tmp_path: Path) -> None:
    runner = CliRunner()
    plot = tmp_path / "run.png"
    args = ["simulate", "--start-hour", "10", "--end-hour", "10.25", "--look-ahead", "2", "-p", "reactive",
            "-p", "parcae", "--plot", str(plot)]  # fmt: skip
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0, plain.output
    assert "logged comparison" not in plain.output  # off by default

    result = runner.invoke(app, [*args, "--mlflow"])
    assert result.exit_code == 0, result.output
    found = re.search(r"parcae simulations --comparison ([0-9a-f]{32})", result.stdout)
    assert found, result.stdout
    cid = found.group(1)
    table = result.stdout.split("\n", 1)[1].split("logged comparison")[0].strip()  # the table simulate printed

    shown = runner.invoke(app, ["simulations", "--comparison", cid])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.split("\n", 1)[1].strip() == table  # the same table, rebuilt from MLflow

    rebuilt = comparison_from_mlflow(cid)
    assert list(rebuilt["policy"]) == ["reactive", "parcae"]
    assert "vs_ideal" not in rebuilt.columns  # as comparison_table without an ideal run ...
    assert rebuilt["samples"].iloc[1] > rebuilt["samples"].iloc[0]  # parcae beats reactive on this window
    logged = load_comparison(cid)
    assert logged.ideal_samples and logged.ideal_samples > logged.policies["parcae"].samples  # ... the bound is kept
    command = MlflowClient().get_run(cid).data.tags["parcae.command"]
    assert "--policy reactive --policy parcae" in command and "--mlflow" in command and "--look-ahead 2" in command
    assert {a.path for a in MlflowClient().list_artifacts(cid)} == {"comparison.json", "run.png"}

    listed = runner.invoke(app, ["simulations"])
    assert listed.exit_code == 0 and cid in listed.stdout

    missing = runner.invoke(app, ["simulations", "--comparison", "f" * 32])
    assert missing.exit_code == 2 and missing.stderr.startswith("error: no comparison")
    assert "Traceback" not in missing.output


def test_unreachable_tracking_uri_fails_before_simulating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing answers
    args = ["simulate", "--start-hour", "10", "--end-hour", "10.25", "-p", "ideal", "--mlflow"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: --mlflow: cannot use the MLflow tracking store 'http://127.0.0.1:9'")
    assert "MLFLOW_TRACKING_URI" in result.stderr and "Traceback" not in result.output
    assert "trace p3" not in result.stdout  # nothing was simulated
