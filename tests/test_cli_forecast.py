"""Tests of ``parcae forecast train/evaluate/predict`` and ``parcae collect`` (parcae.cli).

The shared traces folder is pointed at an empty location (the corpus is then the bundled p3 and
gcp-v100), MLflow at a temporary sqlite store shared by the module, and AWS at nothing: credentials
are cleared, or moto answers in-process.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from _aws import fake_aws_account, isolate_aws
from _mlflow import temporary_mlflow_store
from typer.testing import CliRunner

from forecasting import COMPACT_AT, TraceStore
from parcae.cli import app

FORECAST_KEYS = {"model", "last_available", "capacity", "point", "quantiles", "preemption_prob", "events"}
SCORE_KEYS = {"mae", "mae_mean", "pinball", "coverage80", "pit_coverage80", "brier"}


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory: pytest.TempPathFactory):
    yield from temporary_mlflow_store(tmp_path_factory)


@pytest.fixture(autouse=True)
def _isolated(mlflow_store: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PARCAE_SHARED_TRACES", str(tmp_path_factory.mktemp("no-shared") / "absent"))


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def event_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-hour, 8-node event log: two nodes leave at minute 10 of every quarter hour and return at 13."""
    lines = [f"{i},add,n{i}" for i in range(8)]
    for quarter in range(8):
        base = (quarter * 15) * 60_000
        lines += [
            f"{base + 600_000},remove,n0",
            f"{base + 600_500},remove,n1",
            f"{base + 780_000},add,n0",
            f"{base + 780_500},add,n1",
        ]
    lines += [f"{119 * 60_000},remove,n7", f"{119 * 60_000 + 30_000},add,n7"]
    path = tmp_path_factory.mktemp("traces") / "synthetic-events.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_user_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stderr.startswith("error: "), result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    assert "Traceback" not in result.output


# ------------------------------------------------------------------------------------------------ evaluate


def test_evaluate_writes_the_documented_json(runner: CliRunner, event_trace: Path, tmp_path: Path) -> None:
    from forecasting.backtest import rolling_origin
    from forecasting.baselines import PersistenceForecaster
    from forecasting.corpus import training_corpus
    from forecasting.traces import load_trace

    out = tmp_path / "nested" / "scores.json"
    result = runner.invoke(
        app,
        [
            "forecast",
            "evaluate",
            "--trace",
            str(event_trace),
            "--horizon",
            "4",
            "--models",
            "persistence,ets",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert set(doc) == {"models"} and list(doc["models"]) == ["persistence", "ets"]
    for scores in doc["models"].values():
        assert set(scores) == SCORE_KEYS
        assert len(scores["mae"]) == 4 and all(math.isfinite(x) for x in scores["mae"])
        assert scores["mae_mean"] == pytest.approx(sum(scores["mae"]) / 4)
        assert 0 <= scores["coverage80"] <= 1 and 0 <= scores["brier"] <= 1 and scores["pinball"] >= 0

    # persistence was fitted on the corpus (bundled p3 + gcp-v100) and scored on every origin
    table = load_trace(event_trace)
    expected = rolling_origin(PersistenceForecaster().fit(list(training_corpus().values())), table, 4).to_dict()
    assert doc["models"]["persistence"] == expected  # JSON keeps floats exactly

    assert "persistence" in result.stdout and "ets" in result.stdout and "mae_mean" in result.stdout
    assert "backtested 2 model(s)" in result.stderr  # the progress bar is on stderr


def test_evaluate_refuses_unknown_traces_models_and_short_traces(
    runner: CliRunner, event_trace: Path, tmp_path: Path
) -> None:
    out = tmp_path / "x.json"
    assert_user_error(
        runner.invoke(app, ["forecast", "evaluate", "--trace", "no-such-trace", "--json", str(out)]),
        "unknown trace 'no-such-trace'",
    )
    assert_user_error(
        runner.invoke(
            app,
            [
                "forecast",
                "evaluate",
                "--trace",
                str(event_trace),
                "--models",
                "persistence,prophet",
                "--json",
                str(out),
            ],
        ),
        "unknown model 'prophet'",
    )
    assert_user_error(
        runner.invoke(
            app, ["forecast", "evaluate", "--trace", str(event_trace), "--horizon", "200", "--json", str(out)]
        ),
        "too short",
    )
    assert not out.exists()


# ------------------------------------------------------------------------------------------------- predict


def test_predict_persistence_prints_forecast_json(runner: CliRunner) -> None:
    result = runner.invoke(app, ["forecast", "predict", "--model", "persistence", "--at", "600", "--horizon", "5"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) == FORECAST_KEYS
    assert doc["model"] == "persistence" and doc["capacity"] == 32
    assert len(doc["point"]) == 5 and set(doc["quantiles"]) == {"0.1", "0.5", "0.9"}
    assert doc["point"] == [float(doc["last_available"])] * 5
    assert "after interval 600" in result.stderr


def test_predict_draws_the_fan_it_printed(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "figs" / "fan.png"
    result = runner.invoke(app, ["forecast", "predict", "--model", "persistence", "--at", "682", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {out}" in result.stderr.replace("\n", "")
    assert_user_error(
        runner.invoke(app, ["forecast", "predict", "--model", "persistence", "--plot", str(tmp_path / "f.nope")]),
        "unknown image format '.nope'",
    )


def test_predict_refuses_an_origin_outside_the_trace(runner: CliRunner) -> None:
    assert_user_error(
        runner.invoke(app, ["forecast", "predict", "--model", "persistence", "--at", "99999"]), "--at 99999", "0-682"
    )
    assert_user_error(runner.invoke(app, ["forecast", "predict", "--trace", "nope"]), "unknown trace 'nope'")


# --------------------------------------------------------------------------------------------------- train


def test_train_logs_registers_and_predict_uses_the_outcome(
    runner: CliRunner, event_trace: Path, tmp_path: Path, mlflow_store: Path
) -> None:
    out = tmp_path / "outcome.json"
    result = runner.invoke(
        app,
        [
            "forecast",
            "train",
            "--trace",
            "gcp-v100",
            "--eval-trace",
            str(event_trace),
            "--horizon",
            "4",
            "--n-estimators",
            "5",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert set(doc) == {"run_id", "version", "promoted", "reason", "metrics", "persistence_version"}
    assert doc["version"] == 1 and doc["reason"].startswith("promoted: " if doc["promoted"] else "not promoted: ")
    assert {"mae_mean", "persistence_mae_mean", "mae_h4", "brier"} <= set(doc["metrics"])
    assert doc["run_id"] in result.stdout and doc["reason"] in result.stdout
    assert "lightgbm" in result.stdout and "persistence" in result.stdout
    assert (mlflow_store / "mlflow.db").is_file()

    predicted = runner.invoke(app, ["forecast", "predict", "--trace", str(event_trace), "--horizon", "4"])
    assert predicted.exit_code == 0, predicted.output
    forecast = json.loads(predicted.stdout)
    assert set(forecast) == FORECAST_KEYS and len(forecast["point"]) == 4
    if doc["promoted"]:
        assert forecast["model"] == "lightgbm"
    else:  # no champion: persistence, with a warning that says how to get one
        assert forecast["model"] == "persistence" and "parcae forecast train" in predicted.stderr


def test_train_refuses_unknown_names(runner: CliRunner) -> None:
    assert_user_error(runner.invoke(app, ["forecast", "train", "--exclude", "gcp-v10"]), "--exclude", "gcp-v100")
    assert_user_error(runner.invoke(app, ["forecast", "train", "--trace", "p3"]), "no training traces left")


# ------------------------------------------------------------------------------------------------- collect


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_aws(monkeypatch, tmp_path)


def test_collect_without_credentials_names_the_fix(runner: CliRunner, no_aws, tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = runner.invoke(
        app, ["collect", "--store", str(store), "--region", "us-east-1", "--endpoint-url", "http://127.0.0.1:9"]
    )
    assert_user_error(result, "no AWS credentials", "AWS_PROFILE", "AWS_ACCESS_KEY_ID")
    # no region either: both problems are named
    result = runner.invoke(app, ["collect", "--store", str(store)])
    assert_user_error(result, "AWS_REGION", "AWS_PROFILE", "AWS_ACCESS_KEY_ID")
    assert not store.exists()


def test_collect_with_moto_writes_prices(
    runner: CliRunner, no_aws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from moto import mock_aws

    fake_aws_account(monkeypatch)
    store = tmp_path / "store"
    args = ["collect", "--store", str(store), "--region", "us-east-1", "--instance-type", "m5.large"]
    args += ["--job-tag", "job-t"]
    with mock_aws():
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        [part] = (store / "spot_prices").glob("part-*.parquet")
        for i in range(COMPACT_AT - 1):  # the store of a long-lived collector: the round compacts it
            shutil.copy(part, part.with_name(f"part-copy-{i:02}.parquet"))
        again = runner.invoke(app, args)
    assert again.exit_code == 0 and f"compacted: {COMPACT_AT - 1} part files merged" in again.stdout, again.output
    [merged] = (store / "spot_prices").glob("part-*.parquet")  # one part, sorting where the oldest did
    assert merged.name.rsplit("-", 1)[0] == part.name.rsplit("-", 1)[0]
    rows = {
        line.split()[0]: line.split()[1:]
        for line in result.stdout.splitlines()
        if line.split() and line.split()[0] in ("fleet_events", "spot_prices", "placement_scores")
    }
    assert rows["fleet_events"][0] == "0"
    assert int(rows["spot_prices"][0]) > 0 and (store / "spot_prices").is_dir()
    assert rows["placement_scores"] == ["0", "0", "1"]  # moto does not implement placement scores
    assert "unsupported" in result.stderr


def test_collect_into_a_store_in_s3(runner: CliRunner, no_aws, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    from moto import mock_aws

    fake_aws_account(monkeypatch, "us-east-1")
    args = ["collect", "--region", "us-east-1", "--instance-type", "m5.large", "--job-tag", "job-t"]
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket="traces")
        result = runner.invoke(app, [*args, "--store", "s3://traces/team"])
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("store s3://traces/team, job tag 'job-t'"), result.stdout
        assert len(TraceStore("s3://traces/team").read("spot_prices")) > 0
        missing = runner.invoke(app, [*args, "--store", "s3://no-such-bucket/team"])
    assert_user_error(missing, "the trace store cannot be used", "s3://no-such-bucket/team", "NoSuchBucket")
    assert_user_error(runner.invoke(app, [*args, "--store", "gs://traces"]), "trace store 'gs://traces'", "s3://")


def test_a_live_fleet_s_history_is_a_trace_the_commands_take(runner, tmp_path, monkeypatch) -> None:
    """`parcae traces` lists the fleets' histories in the trace store as fleet:<job tag>; `parcae simulate` and
    `parcae forecast` take them (an AWS fleet's: with AWS's notice); `parcae train` too (tests/test_cli_train.py)."""
    store = TraceStore(tmp_path / "store")
    counts = [4, 4, 4, 3, 3, 2, 2, 4, 4, 4] * 9
    store.append("fleet_intervals", [{"job_tag": "nightly@1", "provider": "aws", "interval": i, "interval_s": 60.0,
                                      "capacity": 4, "requested": 0, "granted": 0, "refused": 0, "reclaimed": 0,
                                      "alive": n, "timestamp": "2026-12-01T00:00:00Z"}
                                     for i, n in enumerate(counts)])  # fmt: skip
    monkeypatch.setenv("PARCAE_TRACE_STORE", str(tmp_path / "store"))
    listed = runner.invoke(app, ["traces"])
    assert listed.exit_code == 0 and "fleet:nightly@1" in listed.stdout and "90 x 60 s" in listed.stdout, listed.output
    out = tmp_path / "sim.json"
    sim = runner.invoke(app, ["simulate", "--trace", "fleet:nightly@1", "-p", "parcae", "-p", "reactive",
                              "--model", "bert", "--json", str(out)])  # fmt: skip
    assert sim.exit_code == 0, sim.output
    doc = json.loads(out.read_text())
    assert doc["trace"] == "fleet:nightly@1" and doc["window"] == {"first_interval": 0, "last_interval": 89}
    assert doc["migrations"]["notice_s"] == 120.0 and doc["policies"]["parcae"]["samples"] > 0  # AWS's notice
    scores = tmp_path / "scores.json"
    evaluated = runner.invoke(app, ["forecast", "evaluate", "--trace", "fleet:nightly@1", "--horizon", "4",
                                    "--models", "persistence", "--json", str(scores)])  # fmt: skip
    assert evaluated.exit_code == 0 and json.loads(scores.read_text())["models"]["persistence"]["mae"], evaluated.output
    assert_user_error(runner.invoke(app, ["simulate", "--trace", "fleet:nightly@1", "--interval-seconds", "30"]),
                      "fleet:nightly@1 was recorded an interval every 60 s", "--interval-seconds 60")  # fmt: skip
    assert_user_error(runner.invoke(app, ["simulate", "--trace", "fleet:weekly@1"]),
                      "no live fleet 'fleet:weekly@1'", "fleet:nightly@1")  # fmt: skip
    monkeypatch.setenv("PARCAE_TRACE_STORE", "gs://elsewhere")
    assert_user_error(runner.invoke(app, ["simulate", "--trace", "fleet:nightly@1"]), "$PARCAE_TRACE_STORE")
    listed = runner.invoke(app, ["traces"])  # the bundled traces still listed, the store's problem said
    assert listed.exit_code == 0 and "p3" in listed.stdout and "gs://elsewhere" in listed.stderr, listed.output


def test_simulate_with_a_forecaster_drives_parcae(runner, tmp_path):
    out = tmp_path / "sim.json"
    res = runner.invoke(
        app,
        [
            "simulate",
            "--start-hour",
            "10",
            "--end-hour",
            "10.5",
            "-p",
            "parcae",
            "--forecaster",
            "ets",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["policies"]["parcae"]["samples"] > 0


def test_simulate_rejects_an_unknown_forecaster(runner):
    res = runner.invoke(
        app, ["simulate", "--start-hour", "10", "--end-hour", "10.5", "-p", "parcae", "--forecaster", "crystal-ball"]
    )
    assert res.exit_code == 2
    assert "crystal-ball" in res.output and "Traceback" not in res.output
