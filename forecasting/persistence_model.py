"""Persistence as an MLflow model (logged from this file: MLflow's models-from-code, nothing pickled): what the
registry holds as its champion when no learned forecaster beats it.

Given the availability history — a frame with an ``available`` column, oldest first — it predicts that the last
count stays, for every row of the input. `forecasting.registry` logs it (`_register_persistence`) and knows such a
version by its tag ``kind = persistence``, for which it loads `forecasting.baselines.PersistenceForecaster`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from mlflow.models import set_model
from mlflow.pyfunc.model import PythonModel


class PersistenceModel(PythonModel):
    """N stays at its last value."""

    def predict(self, context: Any, model_input: pd.DataFrame, params: Any = None) -> pd.Series:
        last = float(model_input["available"].iloc[-1]) if len(model_input) else 0.0
        return pd.Series([last] * len(model_input), name="available")


set_model(PersistenceModel())
