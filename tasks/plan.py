"""Tasks that produce forecasts of the next intervals and the liveput plan over them.

Wrappers over a `forecasting.forecast.Forecaster` and `liveput.optimizer.plan`. No retries: both are pure
computations on local data, so a failure is a bug or a bad input, and a retry would only hide it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pandas as pd
from prefect import task

from forecasting.forecast import Forecast, Forecaster
from liveput.migration import CostModel
from liveput.optimizer import JobState, PlannerConfig, plan
from liveput.scenarios import IntervalForecast, ScenarioStore
from liveput.throughput import load_profile

__all__ = ["forecast_next_intervals", "plan_next_interval"]


@task(name="forecast-next-intervals", persist_result=False)
def forecast_next_intervals(forecaster: Forecaster, history: pd.DataFrame, look_ahead: int) -> Forecast:
    """The forecast of the ``look_ahead`` intervals after the last one of ``history``."""
    return forecaster.predict(history, look_ahead)


@task(name="plan-next-interval", persist_result=False)
def plan_next_interval(model: str, forecast: Forecast, state: JobState, interval_s: float) -> dict[str, Any]:
    """The K-step liveput plan (K = the forecast's horizon) as JSON-able data; ``decision`` is the next strategy.

    The dict is `Plan.to_dict()` plus ``model``, ``look_ahead``, ``interval_s`` and the ``state`` planned from.
    """
    held = state.strategy[0] * state.strategy[1]
    if held > forecast.last_available:
        raise ValueError(
            f"state {state.strategy[0]}x{state.strategy[1]} runs on {held} instances but only "
            f"{forecast.last_available} are available at the forecast's origin"
        )
    store = ScenarioStore(load_profile(model), CostModel.reference(model))
    result = plan(store, IntervalForecast.from_forecast(forecast), state, PlannerConfig(interval_s, forecast.horizon))
    current = {**asdict(state), "strategy": list(state.strategy)}
    return {"model": model, "look_ahead": forecast.horizon, "interval_s": interval_s, "state": current,
            **result.to_dict()}  # fmt: skip
