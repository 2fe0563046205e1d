"""Tests for forecasting.registry: promotion both ways, load_champion, an empty registry, the store's errors.

Every test uses one temporary MLflow store for the module (``MLFLOW_TRACKING_URI`` = a sqlite file
under tmp; creating and migrating it takes seconds, so it is shared), never the repository's
``mlruns/``. The traces are synthetic: a cluster that loses 3 of 10 instances at a fixed phase of every
period, which a small LightGBM learns exactly and persistence cannot foresee.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import tracking

import pandas as pd
import pytest
from _mlflow import temporary_mlflow_store
from _tables import canonical_table, periodic_counts

from forecasting.baselines import PersistenceForecaster
from forecasting.lgbm import LightGbmForecaster
from forecasting.registry import (
    CHAMPION,
    DEFAULT_REGISTERED_NAME,
    VIEW,
    load_champion,
    trace_fingerprint,
    train_and_log,
)

HORIZON = 6
FAST = dict(horizon_max=HORIZON, seed=1, n_estimators=60, learning_rate=0.1, num_leaves=15, min_child_samples=5)


def periodic(periods: int, period: int = 20, drop_at: int = 12, capacity: int = 10, low: int = 7) -> pd.DataFrame:
    """Full cluster except ``low`` instances for 3 intervals from phase ``drop_at`` of every period."""
    return canonical_table(periodic_counts(periods, period, drop_at, capacity, low), capacity)


TRAIN = {"periodic-a": periodic(30), "periodic-b": periodic(20, drop_at=5, capacity=16, low=12)}
EVAL = ("periodic-eval", periodic(6, drop_at=9))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    """One temporary MLflow store for the module, named only through MLFLOW_TRACKING_URI."""
    yield from temporary_mlflow_store(tmp_path_factory)


@pytest.fixture(scope="module")
def first(store: Path):
    """Version 1: a model that learns the drops, trained into an empty registry."""
    made: list[LightGbmForecaster] = []

    def factory() -> LightGbmForecaster:
        made.append(LightGbmForecaster(**FAST))
        return made[-1]

    outcome = train_and_log(factory, train_traces=TRAIN, eval_trace=EVAL, horizon=HORIZON)
    assert outcome.forecaster is made[0]
    return outcome


def client():
    import mlflow

    return mlflow.MlflowClient()


def artifact_json(run_id: str, path: str) -> dict:
    import mlflow

    return json.loads(Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path)).read_text())


def champion_of(name: str) -> int | None:
    aliases = client().get_registered_model(name).aliases
    return int(aliases[CHAMPION]) if CHAMPION in aliases else None


# -------------------------------------------------------------------------------------------- promotion


def test_first_model_that_beats_persistence_is_promoted(first, store: Path) -> None:
    assert first.promoted and first.version == 1
    assert first.reason.startswith("promoted: ") and "no champion yet" in first.reason
    m = first.metrics
    assert m["mae_mean"] < m["persistence_mae_mean"]
    expected = {
        f"{p}{k}"
        for p in ("", "persistence_")
        for k in (
            "mae_mean",
            "pinball",
            "coverage80",
            "pit_coverage80",
            "brier",
            *(f"mae_h{h}" for h in range(1, HORIZON + 1)),
        )  # fmt: skip
    }
    assert set(m) == expected
    assert champion_of(DEFAULT_REGISTERED_NAME) == 1

    run = client().get_run(first.run_id)
    assert run.data.tags["promotion"] == "promoted"
    assert run.data.metrics["mae_mean"] == pytest.approx(m["mae_mean"])
    assert run.data.metrics["persistence_mae_h6"] == pytest.approx(m["persistence_mae_h6"])
    params = run.data.params
    assert params["horizon"] == str(HORIZON) and params["seed"] == "1" and params["n_estimators"] == "60"
    assert params["train_traces"] == "periodic-a,periodic-b" and params["eval_trace"] == "periodic-eval"
    # the experiment's saved view shows what its runs hold
    assert set(VIEW.params) <= set(params) and set(VIEW.metrics) <= set(run.data.metrics)
    tags = client().get_experiment(run.info.experiment_id).tags
    assert json.loads(json.loads(tags["mlflow.sharedViewState.parcae"])["state"])["selectedColumns"] == VIEW.columns()
    assert params["eval_fingerprint"] == trace_fingerprint(EVAL[1])
    assert int(params["n_train_rows"]) > 0
    doc = artifact_json(first.run_id, "promotion.json")
    assert doc["promoted"] is True and doc["version"] == 1 and doc["champion"] is None

    names = {a.path for a in client().list_artifacts(first.run_id, "forecaster")}
    assert {"forecaster/meta.json", "forecaster/q0.5.txt", "forecaster/preempt.txt"} <= names
    assert [a.path for a in client().list_artifacts(first.run_id, "plots")] == ["plots/fans.png"]
    # the run's artifacts live beside the database named by MLFLOW_TRACKING_URI
    assert (store / "artifacts" / "forecaster").is_dir()
    # the registered version is the median booster, a loadable MLflow LightGBM model
    version = client().get_model_version(DEFAULT_REGISTERED_NAME, "1")
    assert version.run_id == first.run_id
    assert version.tags["promotion"] == "promoted"
    # what the registry pages show: what the model is, and what each version is and why it was (not) promoted
    assert "alias `champion`" in client().get_registered_model(DEFAULT_REGISTERED_NAME).description
    assert first.run_id in version.description and version.description.endswith(f"{first.reason}.")


def test_model_worse_than_the_champion_is_not_promoted(first) -> None:
    weaker = dict(FAST, n_estimators=5)  # learns part of the pattern: better than persistence, worse than v1
    outcome = train_and_log(lambda: LightGbmForecaster(**weaker), train_traces=TRAIN, eval_trace=EVAL, horizon=HORIZON)
    m = outcome.metrics
    assert first.metrics["mae_mean"] < m["mae_mean"] < m["persistence_mae_mean"], m  # the scenario holds
    assert not outcome.promoted and outcome.version == 2
    assert champion_of(DEFAULT_REGISTERED_NAME) == 1
    assert m["champion_mae_mean"] == pytest.approx(first.metrics["mae_mean"])
    assert outcome.reason.startswith("not promoted: ") and "champion version 1" in outcome.reason
    assert f"{m['mae_mean']:.4f}" in outcome.reason and f"{first.metrics['mae_mean']:.4f}" in outcome.reason

    run = client().get_run(outcome.run_id)
    assert run.data.tags["promotion"] == outcome.reason
    doc = artifact_json(outcome.run_id, "promotion.json")
    assert doc["promoted"] is False and doc["version"] == 2 and doc["reason"] == outcome.reason
    assert doc["champion"]["version"] == 1 and doc["champion"]["run_id"] == first.run_id


def test_champion_is_rescored_when_evaluated_on_another_trace(first) -> None:
    """The stored mae_mean of v1 is for another trace: v1 is backtested on this one; a tie does not promote."""
    other = ("periodic-eval-2", periodic(6, drop_at=4))
    outcome = train_and_log(
        lambda: LightGbmForecaster(**FAST), train_traces=TRAIN, eval_trace=other, horizon=HORIZON, plots=False
    )
    m = outcome.metrics
    assert m["mae_mean"] < m["persistence_mae_mean"]
    # the same settings and data give the same model as v1, so the re-scored champion ties with it
    assert m["champion_mae_mean"] == m["mae_mean"]
    assert not outcome.promoted and champion_of(DEFAULT_REGISTERED_NAME) == 1
    assert "re-scored on this evaluation trace" in outcome.reason and "champion version 1" in outcome.reason


def test_without_a_champion_persistence_itself_is_registered_and_promoted(store: Path, caplog) -> None:
    """Nothing beats persistence and there is no champion: persistence becomes the champion (the registry always
    has one), the run says so, and a later learned model must beat persistence to replace it."""
    name = "misled-forecaster"
    # trained where drops come every 20 intervals, evaluated where they come every 35: it predicts drops
    # that do not happen
    outcome = train_and_log(
        lambda: LightGbmForecaster(**FAST),
        train_traces=TRAIN,
        eval_trace=("every-35", periodic(5, period=35, drop_at=9)),
        horizon=HORIZON,
        registered_name=name,
        plots=False,
    )
    m = outcome.metrics
    assert m["mae_mean"] > m["persistence_mae_mean"]
    assert not outcome.promoted and outcome.version == 1 and outcome.persistence_version == 2
    assert champion_of(name) == 2  # persistence
    assert "champion_mae_mean" not in m
    assert outcome.reason.startswith("not promoted: ") and "does not beat persistence" in outcome.reason
    assert outcome.reason.endswith("persistence registered as version 2 and promoted as the champion (no learned "
                                   "model beats it yet)")  # fmt: skip
    assert client().get_run(outcome.run_id).data.tags["promotion.reason"] == outcome.reason
    assert client().list_artifacts(outcome.run_id, "plots") == []
    version = client().get_model_version(name, "2")
    assert version.tags["kind"] == "persistence" and version.run_id == outcome.run_id
    assert version.description.startswith("Persistence: ")
    assert "does not beat persistence" in client().get_model_version(name, "1").description
    assert outcome.to_dict()["persistence_version"] == 2

    # the champion is persistence: loaded as such, without a warning
    with caplog.at_level(logging.WARNING, logger="forecasting.registry"):
        model = load_champion(name)
    assert isinstance(model, PersistenceForecaster)
    assert not [r for r in caplog.records if r.name == "forecasting.registry" and r.levelno >= logging.WARNING]
    # as an MLflow model too: the last count stays
    import mlflow.pyfunc

    served = mlflow.pyfunc.load_model(f"models:/{name}/2")
    assert served.predict(pd.DataFrame({"available": [4.0, 3.0, 2.0]})).tolist() == [2.0, 2.0, 2.0]

    # the same misled model again: compared with the champion (persistence), still not promoted, nothing new
    again = train_and_log(lambda: LightGbmForecaster(**FAST), train_traces=TRAIN,
                          eval_trace=("every-35", periodic(5, period=35, drop_at=9)), horizon=HORIZON,
                          registered_name=name, plots=False)  # fmt: skip
    assert not again.promoted and again.persistence_version is None and champion_of(name) == 2
    assert again.metrics["champion_mae_mean"] == pytest.approx(m["persistence_mae_mean"])


# ---------------------------------------------------------------------------------------------- loading


def test_load_champion_rebuilds_the_trained_model_exactly(first) -> None:
    loaded = load_champion()
    assert isinstance(loaded, LightGbmForecaster) and loaded is not first.forecaster
    table = EVAL[1]
    for t in (30, 57, 90, len(table) - 1):
        history = table.iloc[: t + 1]
        assert loaded.predict(history, HORIZON).to_dict() == first.forecaster.predict(history, HORIZON).to_dict()


def test_empty_registry_gives_persistence_and_a_warning(store: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="forecasting.registry"):
        model = load_champion("never-registered")
    assert isinstance(model, PersistenceForecaster) and not model.fitted
    [record] = [r for r in caplog.records if r.name == "forecasting.registry"]
    assert record.levelno == logging.WARNING
    assert "never-registered" in record.getMessage() and "`parcae forecast train`" in record.getMessage()
    # it still forecasts: flat, zero-width
    f = model.predict(EVAL[1], 3)
    assert list(f.point) == [10.0] * 3


def test_lightgbm_backtest_window_is_exact(first) -> None:
    """history_window's truncation (what the backtests use) gives the same forecasts as the whole past."""
    model = first.forecaster
    table = TRAIN["periodic-a"]
    window = model.history_window(HORIZON)
    for t in (window + 5, 400, len(table) - 2):
        full = model.predict(table.iloc[: t + 1], HORIZON).to_dict()
        cut = table.iloc[t + 1 - window : t + 1].reset_index(drop=True)
        assert model.predict(cut, HORIZON).to_dict() == full


# ------------------------------------------------------------------------------------------------ errors


def test_unreachable_server_fails_fast_with_the_fix(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing listens
    start = time.monotonic()
    with pytest.raises(tracking.TrackingError, match="MLFLOW_TRACKING_URI") as info:
        load_champion()
    assert time.monotonic() - start < 10
    assert "http://127.0.0.1:9" in str(info.value) and "mlflow server" in str(info.value)
    with pytest.raises(tracking.TrackingError):
        train_and_log(lambda: LightGbmForecaster(**FAST), train_traces=TRAIN, eval_trace=EVAL, horizon=HORIZON)


def test_bad_inputs_are_refused_before_anything_is_logged(store: Path) -> None:
    with pytest.raises(ValueError, match="also a training trace"):
        train_and_log(train_traces=TRAIN, eval_trace=("periodic-a", TRAIN["periodic-a"]), horizon=HORIZON)
    with pytest.raises(ValueError, match="horizon_max"):
        train_and_log(lambda: LightGbmForecaster(**FAST), train_traces=TRAIN, eval_trace=EVAL, horizon=HORIZON + 1)
    with pytest.raises(ValueError, match="too short"):
        train_and_log(train_traces=TRAIN, eval_trace=("tiny", periodic(1)), horizon=HORIZON)
    with pytest.raises(TypeError, match="LightGBM-style"):
        train_and_log(PersistenceForecaster, train_traces=TRAIN, eval_trace=EVAL, horizon=HORIZON)


def test_explicit_root_wins_and_sqlite_artifacts_sit_beside_the_database(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    assert tracking.tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    assert tracking.tracking_uri() == "http://127.0.0.1:9"
    location = tracking.artifact_location("forecaster", "sqlite:////srv/ml/mlflow.db")
    assert location == "file:///srv/ml/artifacts/forecaster"
    assert tracking.artifact_location("forecaster", "http://127.0.0.1:5000") is None
