"""Tasks that produce forecasters: a newly trained (and maybe promoted) one, and the registry's champion.

Wrappers over `forecasting.registry`. Both reach the MLflow store, so both retry when it is unreachable
or busy (`tasks.tracking.store_unavailable`); a bad trace or horizon fails at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from prefect import get_run_logger, task

from forecasting import (
    PERSISTENCE_KIND,
    Forecaster,
    PersistenceForecaster,
    TrainOutcome,
    champion_version,
    load_champion,
    make_forecaster,
    train_and_log,
)
from tasks import retry_on
from tasks.tracking import store_unavailable

__all__ = ["champion_forecaster", "train_forecaster"]


@task(
    name="train-forecaster",
    retries=2,
    retry_delay_seconds=[10, 60],
    retry_condition_fn=retry_on(store_unavailable),
    timeout_seconds=1800,
    persist_result=False,
)
def train_forecaster(
    train_traces: Mapping[str, pd.DataFrame],
    eval_trace: tuple[str, pd.DataFrame],
    horizon: int,
    forecaster_params: Mapping[str, Any] | None = None,
    plots: bool = True,
) -> TrainOutcome:
    """Fit a LightGBM forecaster, backtest it against persistence, log and register it, promote if better.

    ``forecaster_params`` are `LightGbmForecaster` arguments (``horizon_max`` defaults to ``horizon``).
    A retry after a store failure trains again in a new MLflow run; the failed one stays marked FAILED.
    """
    params = {"horizon_max": horizon, **(forecaster_params or {})}
    return train_and_log(
        lambda: make_forecaster("lightgbm", horizon, **params),
        train_traces=train_traces,
        eval_trace=eval_trace,
        horizon=horizon,
        plots=plots,
        progress=get_run_logger().info,
    )


@task(
    name="champion-forecaster",
    retries=2,
    retry_delay_seconds=[5, 30],
    retry_condition_fn=retry_on(store_unavailable),
    persist_result=False,
)
def champion_forecaster() -> tuple[Forecaster, str | None]:
    """The champion forecaster and the MLflow run that trained it (persistence itself, when no learned model beat
    it: `forecasting.registry`). Without a usable champion: an unfitted persistence model (`load_champion` logs
    why) and None.
    """
    forecaster = load_champion()
    version = champion_version()
    if version is not None and version.tags.get("kind") == PERSISTENCE_KIND:
        return forecaster, version.run_id  # persistence is the champion: the run that registered it says why
    # load_champion falls back to persistence when the champion cannot be rebuilt: no training run then
    if version is None or isinstance(forecaster, PersistenceForecaster):
        return forecaster, None
    return forecaster, version.run_id
