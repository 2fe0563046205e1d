"""Train, log, register and promote availability forecasters with MLflow; load the current champion.

This module owns the life cycle of a learnt forecaster in the tracking store (``tracking`` says
where that is):

* `train_and_log` fits a forecaster on training traces, backtests it *and* persistence (fitted on the same
  traces) on a held-out evaluation trace with `forecasting.backtest.rolling_origin`, and records
  everything in one run of the ``forecaster`` experiment: parameters, per-horizon and summary metrics
  (the persistence ones prefixed ``persistence_``), the fan plot, each LightGBM booster as an MLflow
  model (the median one registered as ``availability-forecaster``), and the whole forecaster directory
  (``LightGbmForecaster.save``) as the run artifact ``forecaster/``, from which it is rebuilt exactly.
* Promotion: the new version gets the alias ``champion`` only if its backtest ``mae_mean`` beats
  persistence's and the current champion's. The run records the decision (tag ``promotion``, tag
  ``promotion.reason``, artifact ``promotion.json``). When nothing beats persistence and there is no champion yet,
  persistence itself is registered (`forecasting.persistence_model`, version tag ``kind = persistence``) and
  promoted, so the registry always has a champion; a learned model must then beat persistence to replace it.
* `load_champion` rebuilds the champion forecaster; without one it answers with an unfitted
  `PersistenceForecaster` and logs a warning that says how to train one.

Comparing with the champion: its ``mae_mean`` is read from its run's metrics when that run was
evaluated on the same trace (same count series) at the same horizon. Otherwise the stored number is not
comparable, so the champion's forecaster is downloaded and backtested on this run's evaluation trace;
a champion that cannot be rebuilt (artifact missing, shorter ``horizon_max``) is treated as absent.

Two trainers promoting at the same moment may both read the old champion; the last alias write wins.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol, cast

import tracking

import numpy as np
import pandas as pd
from lightgbm.basic import LightGBMError

from forecasting.backtest import DEFAULT_START, BacktestResult, plot_fans, rolling_origin
from forecasting.baselines import PersistenceForecaster
from forecasting.features import features_at, stack_steps
from forecasting.forecast import Forecaster
from forecasting.forecasters import fit_forecaster
from forecasting.lgbm import LightGbmForecaster

__all__ = [
    "CHAMPION",
    "DEFAULT_EXPERIMENT",
    "DEFAULT_REGISTERED_NAME",
    "FORECASTER_ARTIFACT",
    "VIEW",
    "TrainOutcome",
    "backtest_metrics",
    "champion_version",
    "load_champion",
    "trace_fingerprint",
    "train_and_log",
]

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT: Final = "forecaster"
#: The forecaster experiment's description in the MLflow UI.
EXPERIMENT_DESCRIPTION: Final = (
    "One run per forecaster training: the model, its backtest against persistence on a held-out trace (MAE per "
    "horizon, pinball, coverage, Brier), and whether it was promoted to the registry's champion, and why."
)
#: The forecaster experiment's saved view (`tracking.views`): what compares forecasters, as columns.
VIEW: Final = tracking.RunsView(
    params=("forecaster", "eval_trace", "horizon"),
    metrics=("mae_mean", "persistence_mae_mean", "pinball", "coverage80", "brier"),
)
DEFAULT_REGISTERED_NAME: Final = "availability-forecaster"
#: The registered model's description in the MLflow UI (set when it has none: one written in the UI stays).
MODEL_DESCRIPTION: Final = (
    "Forecasts how many spot instances will be available over the next intervals (the look-ahead), for the liveput "
    "planner. The alias `champion` is the version the flows plan with; a new version takes it only if its backtest "
    "MAE beats the champion's and persistence's on the same trace. A LightGBM version is the median sub-model of "
    "its training run; the flows load the whole forecaster (every quantile) from that run's `forecaster/` folder."
)
CHAMPION: Final = "champion"
#: Run artifact folder holding ``LightGbmForecaster.save`` output.
FORECASTER_ARTIFACT: Final = "forecaster"
#: The model-version tag ``kind`` of a registered persistence champion (`forecasting/persistence_model.py`).
PERSISTENCE_KIND: Final = "persistence"
_MEDIAN_KEY: Final = "q0.5"
_INPUT_EXAMPLE_ROWS: Final = 5
_HOW_TO_TRAIN: Final = "train and register one with `parcae forecast train`"


# ------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class TrainOutcome:
    """What `train_and_log` did: its run, the registered version, and the promotion decision.

    ``metrics`` holds every logged metric: ``mae_h1..mae_hH``, ``mae_mean``, ``pinball``,
    ``coverage80``, ``brier`` of the new model, the same prefixed ``persistence_``, and
    ``champion_mae_mean`` when there was a champion to compare with. ``reason`` starts with
    ``"promoted: "`` or ``"not promoted: "`` and gives the numbers. ``forecaster`` is the fitted
    in-memory model (not serialised by `to_dict`). ``persistence_version``: when nothing beat persistence and there
    was no champion, persistence itself was registered as this version and promoted (the registry then always has a
    champion, and the reason says so).
    """

    run_id: str
    version: int | None
    promoted: bool
    reason: str
    metrics: dict[str, float]
    forecaster: Forecaster | None = field(default=None, repr=False, compare=False)
    persistence_version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "version": self.version,
            "promoted": self.promoted,
            "reason": self.reason,
            "metrics": {k: _json_number(v) for k, v in self.metrics.items()},
            "persistence_version": self.persistence_version,
        }


@dataclass(frozen=True)
class _Champion:
    version: int
    run_id: str
    mae_mean: float
    basis: str  # where the number comes from, for the reason


def _json_number(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)


# ------------------------------------------------------------------------------------------- helpers


def trace_fingerprint(table: pd.DataFrame) -> str:
    """Short identity of a trace's count series and capacity (independent of name and file format)."""
    n = table["available"].to_numpy(dtype=np.int64)
    cap = int(table.attrs.get("capacity", table["capacity"].iloc[-1] if "capacity" in table else 0))
    return hashlib.sha256(n.tobytes() + str(cap).encode()).hexdigest()[:16]


def backtest_metrics(result: BacktestResult, prefix: str = "") -> dict[str, float]:
    """``{prefix}mae_h{h}`` for h = 1..H plus ``mae_mean``, ``pinball``, ``coverage80``, ``pit_coverage80``,
    ``brier``."""
    out = {f"{prefix}mae_h{h}": float(v) for h, v in enumerate(result.mae, start=1)}
    summary = result.to_dict()
    for key in ("mae_mean", "pinball", "coverage80", "pit_coverage80", "brier"):
        out[f"{prefix}{key}"] = float(summary[key])
    return out


def _flat_params(params: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in params.items():
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        out[key] = tracking.clip(text, tracking.MAX_PARAM_LENGTH)
    return out


def _model_name(key: str) -> str:
    """MLflow model names may not contain '.', '/', ':', '%', quotes: ``q0.5`` -> ``model-q0_5``."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in key)
    return f"model-{safe}"


def _fan_origins(result: BacktestResult, table: pd.DataFrame, horizon: int) -> list[int]:
    """Up to three origins, a horizon apart, around the sharpest drop of the backtest (where fans differ most)."""
    avail = table["available"].to_numpy(dtype=np.float64)
    origins = result.origins
    drop = result.truth.min(axis=1) - avail[origins]
    t = int(origins[int(np.argmin(drop))])
    lo, hi = int(origins[0]), int(origins[-1])
    picks = sorted({min(max(t + k * horizon, lo), hi) for k in (-1, 0, 1)})
    return [p for p in picks if 0 <= p < len(table) - 1]


class _FeatureModel(Protocol):
    """What the input example needs of a LightGBM-style forecaster (`LightGbmForecaster` has it)."""

    horizon_max: int
    feature_names: tuple[str, ...]


def _input_example(forecaster: _FeatureModel, table: pd.DataFrame, horizon: int) -> pd.DataFrame:
    origin = max(len(table) - 1 - horizon, 0)
    feats = features_at(table, [origin])
    rows = stack_steps(feats, min(horizon, forecaster.horizon_max))[list(forecaster.feature_names)]
    return rows.iloc[:_INPUT_EXAMPLE_ROWS].reset_index(drop=True)


def _registered_aliases(client: Any, name: str) -> dict[str, int] | None:
    """Aliases of a registered model (alias -> version), or None when the model is not registered."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return {alias: int(version) for alias, version in (model.aliases or {}).items()}


def champion_version(
    registered_name: str = DEFAULT_REGISTERED_NAME, root: str | os.PathLike[str] | None = None
) -> Any | None:
    """The ``ModelVersion`` the ``champion`` alias points at, or None."""
    client = tracking.connect(root)
    aliases = _registered_aliases(client, registered_name)
    if not aliases or CHAMPION not in aliases:
        return None
    return client.get_model_version(registered_name, str(aliases[CHAMPION]))


def _download_forecaster(client: Any, run_id: str | None) -> LightGbmForecaster:
    import mlflow

    with tempfile.TemporaryDirectory(prefix="parcae-champion-") as tmp:
        path = mlflow.artifacts.download_artifacts(
            run_id=run_id, artifact_path=FORECASTER_ARTIFACT, dst_path=tmp, tracking_uri=client.tracking_uri
        )
        return LightGbmForecaster.load(path)


def _current_champion(
    client: Any, name: str, eval_table: pd.DataFrame, fingerprint: str, horizon: int
) -> tuple[_Champion | None, str]:
    """The champion's comparable ``mae_mean``; (None, why) when there is none or it cannot be scored."""
    from mlflow.exceptions import MlflowException

    aliases = _registered_aliases(client, name)
    if not aliases or CHAMPION not in aliases:
        return None, "no champion yet"
    version = aliases[CHAMPION]
    mv = client.get_model_version(name, str(version))
    try:
        run = client.get_run(mv.run_id)
    except MlflowException:
        return None, f"champion version {version} has lost its run {mv.run_id}"
    stored = run.data.metrics.get("mae_mean")
    same_basis = run.data.params.get("eval_fingerprint") == fingerprint and run.data.params.get("horizon") == str(
        horizon
    )
    if mv.tags.get("kind") == PERSISTENCE_KIND:  # persistence is the champion: beating it means beating persistence
        stored = run.data.metrics.get("persistence_mae_mean")
        if stored is not None and same_basis:
            return _Champion(version, mv.run_id, float(stored), "persistence, its run's metric"), ""
        base = PersistenceForecaster()
        result = rolling_origin(base, eval_table, horizon, max_history=base.history_window(horizon))
        return _Champion(version, mv.run_id, result.mae_mean, "persistence, re-scored on this evaluation trace"), ""
    if stored is not None and same_basis:
        return _Champion(version, mv.run_id, float(stored), "its run's metric"), ""
    try:
        model = _download_forecaster(client, mv.run_id)
        if horizon > model.horizon_max:
            return None, f"champion version {version} forecasts at most {model.horizon_max} intervals, not {horizon}"
        result = rolling_origin(model, eval_table, horizon, max_history=model.history_window(horizon))
    except (MlflowException, OSError, ValueError, KeyError, LightGBMError) as exc:
        return None, f"champion version {version} could not be rebuilt ({exc})"
    return _Champion(version, mv.run_id, result.mae_mean, "re-scored on this evaluation trace"), ""


def _decide(
    mae: float, persistence: float, champion: _Champion | None, why_no_champion: str, where: str
) -> tuple[bool, str]:
    if not mae < persistence:
        return False, f"not promoted: mae_mean {mae:.4f} does not beat persistence's {persistence:.4f} {where}"
    if champion is not None and not mae < champion.mae_mean:
        return False, (
            f"not promoted: mae_mean {mae:.4f} beats persistence's {persistence:.4f} but not champion version "
            f"{champion.version}'s {champion.mae_mean:.4f} ({champion.basis}, run {champion.run_id}) {where}"
        )
    if champion is None:
        return True, f"promoted: mae_mean {mae:.4f} beats persistence's {persistence:.4f} {where} ({why_no_champion})"
    return True, (
        f"promoted: mae_mean {mae:.4f} beats persistence's {persistence:.4f} and champion version "
        f"{champion.version}'s {champion.mae_mean:.4f} ({champion.basis}) {where}"
    )


# ------------------------------------------------------------------------------------------ training


def train_and_log(
    forecaster_factory: Callable[[], Forecaster] = LightGbmForecaster,
    *,
    train_traces: Mapping[str, pd.DataFrame],
    eval_trace: tuple[str, pd.DataFrame],
    horizon: int = 12,
    experiment: str = DEFAULT_EXPERIMENT,
    registered_name: str = DEFAULT_REGISTERED_NAME,
    root: str | os.PathLike[str] | None = None,
    plots: bool = True,
    progress: Callable[[str], None] | None = None,
) -> TrainOutcome:
    """Fit, backtest against persistence, log, register, and promote if better; one MLflow run.

    ``forecaster_factory()`` must build an unfitted LightGBM-style forecaster: ``fit``/``predict``,
    ``models`` (LightGBM estimators or boosters by key, the median under ``"q0.5"``), ``save(dir)`` and
    a ``horizon_max`` of at least ``horizon``. ``train_traces`` maps names to canonical tables;
    ``eval_trace`` is ``(name, table)`` and should not be among them. ``root``: a local store folder
    (default: ``tracking``'s choice). ``progress`` receives a short message per stage.
    Raises ``tracking.TrackingError`` when the store cannot be reached.
    """
    import lightgbm
    import mlflow
    from mlflow.models import infer_signature

    say = progress or (lambda message: None)
    if isinstance(horizon, bool) or int(horizon) != horizon or horizon < 1:
        raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
    horizon = int(horizon)
    if not train_traces:
        raise ValueError("train_traces is empty: nothing to fit")
    eval_name, eval_table = eval_trace
    if eval_name in train_traces:
        raise ValueError(f"evaluation trace {eval_name!r} is also a training trace; exclude it from the corpus")
    fingerprint = trace_fingerprint(eval_table)
    n_origins = len(eval_table) - 1 - horizon - DEFAULT_START + 1
    if n_origins < 1:
        raise ValueError(
            f"evaluation trace {eval_name!r} has {len(eval_table)} intervals: too short for a backtest at "
            f"horizon {horizon} (needs at least {DEFAULT_START + horizon + 1})"
        )

    forecaster = forecaster_factory()
    if not (hasattr(forecaster, "models") and hasattr(forecaster, "save")):
        raise TypeError(
            f"{type(forecaster).__name__} cannot be registered: train_and_log needs a LightGBM-style forecaster "
            "with .models and .save(dir) (see forecasting.lgbm.LightGbmForecaster)"
        )
    horizon_max = getattr(forecaster, "horizon_max", horizon)
    if horizon > horizon_max:
        raise ValueError(f"horizon {horizon} exceeds the forecaster's horizon_max {horizon_max}")

    client = tracking.connect(root)
    exp_id = tracking.experiment_id(experiment, root, EXPERIMENT_DESCRIPTION, VIEW)
    tables = list(train_traces.values())
    get_params = getattr(forecaster, "get_params", None)
    params = dict(get_params()) if callable(get_params) else {}
    params.update(
        forecaster=getattr(forecaster, "name", type(forecaster).__name__),
        forecaster_class=f"{type(forecaster).__module__}.{type(forecaster).__qualname__}",
        train_traces=",".join(train_traces),
        n_train_traces=len(train_traces),
        n_train_intervals=int(sum(len(t) for t in tables)),
        eval_trace=eval_name,
        eval_fingerprint=fingerprint,
        n_eval_intervals=len(eval_table),
        horizon=horizon,
        seed=params.get("seed", getattr(forecaster, "seed", "")),
    )

    nested = mlflow.active_run() is not None
    with mlflow.start_run(
        experiment_id=exp_id, run_name=f"{params['forecaster']}-{eval_name}-h{horizon}", nested=nested
    ) as run:
        run_id = run.info.run_id
        mlflow.log_params(_flat_params(params))
        mlflow.set_tags({"eval_trace": eval_name, "registered_name": registered_name})

        say(f"fitting {params['forecaster']} on {len(tables)} trace(s)")
        forecaster.fit(tables)
        persistence = fit_forecaster("persistence", tables, horizon)
        n_rows = getattr(forecaster, "n_train_rows", None)
        if n_rows is not None:
            mlflow.log_param("n_train_rows", int(n_rows))

        say(f"backtesting on {eval_name} ({n_origins} origins x 2 models)")
        result = rolling_origin(forecaster, eval_table, horizon, max_history=forecaster.history_window(horizon))
        base = rolling_origin(persistence, eval_table, horizon, max_history=persistence.history_window(horizon))
        metrics = {**backtest_metrics(result), **backtest_metrics(base, "persistence_")}

        say("comparing with the champion")
        champion, why_not = _current_champion(client, registered_name, eval_table, fingerprint, horizon)
        if champion is not None:
            metrics["champion_mae_mean"] = champion.mae_mean
        mlflow.log_metrics(metrics)  # one log_batch call
        mlflow.log_dict({"model": result.to_dict(), "persistence": base.to_dict()}, "backtest.json")

        with tempfile.TemporaryDirectory(prefix="parcae-train-") as tmp:
            if plots:
                say("plotting forecast fans")
                png = plot_fans(
                    eval_table,
                    {params["forecaster"]: forecaster, "persistence": persistence},
                    _fan_origins(result, eval_table, horizon),
                    horizon,
                    Path(tmp) / "fans.png",
                )
                mlflow.log_artifact(str(png), "plots")
            say("logging the model")
            saved = forecaster.save(Path(tmp) / FORECASTER_ARTIFACT)
            mlflow.log_artifacts(str(saved), FORECASTER_ARTIFACT)

        # a LightGBM-style forecaster (checked above: .models, .save) also has its feature names
        example = _input_example(cast(_FeatureModel, forecaster), next(iter(train_traces.values())), horizon)
        version: int | None = None
        requirements = [f"lightgbm=={lightgbm.__version__}"]
        for key, model in forecaster.models.items():
            booster = getattr(model, "booster_", model)  # the Booster: no skops/sklearn import (seconds)
            with warnings.catch_warnings():
                # MLflow 3.17 compares DataFrame columns with a range (Pandas4Warning under pandas 3)
                warnings.filterwarnings("ignore", message="Operation with range is deprecated", module="mlflow")
                info = mlflow.lightgbm.log_model(
                    booster,
                    name=_model_name(key),
                    signature=infer_signature(example, booster.predict(example)),
                    input_example=example,
                    pip_requirements=requirements,
                    registered_model_name=registered_name if key == _MEDIAN_KEY else None,
                )
            if key == _MEDIAN_KEY:
                version = int(info.registered_model_version)
        if version is None:
            raise ValueError(
                f"the forecaster has no median model {_MEDIAN_KEY!r} to register; keys: {list(forecaster.models)}"
            )

        where = f"on {eval_name} at horizon {horizon}"
        promoted, reason = _decide(metrics["mae_mean"], metrics["persistence_mae_mean"], champion, why_not, where)
        persistence_version = None
        if promoted:
            client.set_registered_model_alias(registered_name, CHAMPION, str(version))
        elif champion is None:  # nothing beats persistence and there is no champion: persistence is the champion
            persistence_version = _register_persistence(client, registered_name, metrics["persistence_mae_mean"])
            client.set_registered_model_alias(registered_name, CHAMPION, str(persistence_version))
            reason += (f"; persistence registered as version {persistence_version} and promoted as the champion "
                       "(no learned model beats it yet)")  # fmt: skip
        tag = "promoted" if promoted else reason
        described = (f"LightGBM forecaster trained in run `{run_id}` (this version is its median sub-model; the "
                     f"flows load the run's `forecaster/` folder). Backtest {where}: MAE {metrics['mae_mean']:.4g}, "
                     f"persistence's {metrics['persistence_mae_mean']:.4g}. {reason}.")  # fmt: skip
        _describe(client, registered_name, version, described)
        mlflow.set_tags({"promotion": tag[:5000], "promotion.reason": reason[:5000]})
        client.set_model_version_tag(registered_name, str(version), "promotion", tag[:5000])
        client.set_model_version_tag(registered_name, str(version), "mae_mean", f"{metrics['mae_mean']:.6g}")
        mlflow.log_dict(
            {
                "promoted": promoted,
                "reason": reason,
                "version": version,
                "persistence_version": persistence_version,
                "registered_name": registered_name,
                "eval_trace": eval_name,
                "horizon": horizon,
                "mae_mean": metrics["mae_mean"],
                "persistence_mae_mean": metrics["persistence_mae_mean"],
                "champion": None
                if champion is None
                else {
                    "version": champion.version,
                    "run_id": champion.run_id,
                    "mae_mean": champion.mae_mean,
                    "basis": champion.basis,
                },
            },
            "promotion.json",
        )
    return TrainOutcome(run_id, version, promoted, reason, metrics, forecaster, persistence_version)


def _register_persistence(client: Any, registered_name: str, mae: float) -> int:
    """Log persistence as a model of the active run, register it, tag the version ``kind = persistence``."""
    import mlflow

    example = pd.DataFrame({"available": [3.0, 4.0]})
    with warnings.catch_warnings():  # MLflow 3.17 compares DataFrame columns with a range (Pandas4Warning)
        warnings.filterwarnings("ignore", message="Operation with range is deprecated", module="mlflow")
        info = mlflow.pyfunc.log_model(name="persistence", python_model=str(Path(__file__).with_name(
            "persistence_model.py")), input_example=example, registered_model_name=registered_name,
            pip_requirements=[f"pandas=={pd.__version__}"])  # fmt: skip
    version = int(info.registered_model_version)
    client.set_model_version_tag(registered_name, str(version), "kind", PERSISTENCE_KIND)
    client.set_model_version_tag(registered_name, str(version), "mae_mean", f"{mae:.6g}")
    client.set_model_version_tag(registered_name, str(version), "promotion", "persistence: no learned model beats it")
    _describe(client, registered_name, version, "Persistence: each of the next intervals has the instances the last "
              f"one had. The champion while no learned model beats it (backtest MAE {mae:.4g}).")  # fmt: skip
    return version


# ------------------------------------------------------------------------------------------- loading


def _describe(client: Any, name: str, version: int, text: str) -> None:
    """The version's description, and the registered model's where it has none (what the registry pages show)."""
    if not client.get_registered_model(name).description:
        client.update_registered_model(name, description=MODEL_DESCRIPTION)
    client.update_model_version(name, str(version), description=text[:5000])


def load_champion(
    registered_name: str = DEFAULT_REGISTERED_NAME, root: str | os.PathLike[str] | None = None
) -> Forecaster:
    """The champion forecaster, rebuilt from its run's ``forecaster/`` artifact.

    Without a champion (model not registered, no alias, artifact missing or unreadable) it returns an
    unfitted `PersistenceForecaster` and logs a warning saying why and how to train one. Raises
    ``tracking.TrackingError`` when the store cannot be reached.
    """
    from mlflow.exceptions import MlflowException

    client = tracking.connect(root)
    uri = client.tracking_uri
    fallback = "forecasting with an unfitted persistence model (N stays at its last value)"
    aliases = _registered_aliases(client, registered_name)
    if aliases is None:
        log.warning("no model %r is registered in %s; %s; %s", registered_name, uri, fallback, _HOW_TO_TRAIN)
        return PersistenceForecaster()
    if CHAMPION not in aliases:
        log.warning(
            "registered model %r in %s has no %r alias (no version beat persistence yet); %s; %s",
            registered_name,
            uri,
            CHAMPION,
            fallback,
            _HOW_TO_TRAIN,
        )
        return PersistenceForecaster()
    version = aliases[CHAMPION]
    try:
        mv = client.get_model_version(registered_name, str(version))
        if mv.tags.get("kind") == PERSISTENCE_KIND:
            log.info("the champion (version %s of %r) is persistence: no learned model beats it", version,
                     registered_name)  # fmt: skip
            return PersistenceForecaster()
        return _download_forecaster(client, mv.run_id)
    except (MlflowException, OSError, ValueError, KeyError, LightGBMError) as exc:
        log.warning(
            "champion version %s of %r in %s cannot be rebuilt from its run's %s/ artifact (%s); %s; %s",
            version,
            registered_name,
            uri,
            FORECASTER_ARTIFACT,
            exc,
            fallback,
            _HOW_TO_TRAIN,
        )
        return PersistenceForecaster()
