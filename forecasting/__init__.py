"""forecasting: spot-availability traces in, forecasts out — the public face of the package.

Code outside the package imports from here only (``from forecasting import load_trace``), never from a module.
What is here, and where it lives:

- the interface: `Forecaster` (``fit`` / ``predict`` / ``history_window``) and the `Forecast` it returns
  (`forecasting.forecast`);
- the models: `FORECASTERS` (name -> factory), `make_forecaster`, `fit_forecaster` (`forecasting.forecasters`),
  and the classes themselves (`forecasting.baselines`, `forecasting.lgbm`);
- evaluation: `rolling_origin`, `BacktestResult` (`forecasting.backtest`);
- traces: `load_trace` and the trace catalog (`available_traces`), the canonical per-interval table
  (`forecasting.traces`), the training corpus (`forecasting.corpus`);
- the model registry in MLflow: `train_and_log`, `load_champion` (`forecasting.registry`);
- collection from EC2: `SpotCollector`, `TraceStore` (`forecasting.collect`) and the EC2 constants the trainer's
  AWS provider shares (`forecasting.ec2`);
- two namespaces whose names are too generic to flatten: `jsonio` (bounded JSON in, strict JSON out) and
  `features` (the look-ahead-free features and the anchor).

Names resolve on first use (PEP 562): a trainer worker that needs only `jsonio` must not pay for pandas,
LightGBM and pyarrow. ``tests/test_forecasting_face.py`` checks that the table below and the typed imports
agree.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it ("" for a sub-namespace of the package).
_HOMES: dict[str, str] = {
    # the interface
    "QUANTILES": "forecast",
    "Forecast": "forecast",
    "Forecaster": "forecast",
    # the models
    "FORECASTERS": "forecasters",
    "ForecasterFactory": "forecasters",
    "UnknownForecasterError": "forecasters",
    "fit_forecaster": "forecasters",
    "make_forecaster": "forecasters",
    "ArimaForecaster": "baselines",
    "EtsForecaster": "baselines",
    "PersistenceForecaster": "baselines",
    "LightGbmForecaster": "lgbm",
    # evaluation
    "DEFAULT_START": "backtest",
    "BacktestResult": "backtest",
    "rolling_origin": "backtest",
    # traces
    "COLUMNS": "traces",
    "DEFAULT_INTERVAL_S": "traces",
    "INTERVAL_S_RANGE": "traces",
    "MAX_INSTANCES": "traces",
    "TraceFormatError": "traces",
    "UnknownTraceError": "traces",
    "available_traces": "traces",
    "detect_format": "traces",
    "load_trace": "traces",
    "scale_trace": "traces",
    "slice_hours": "traces",
    "training_corpus": "corpus",
    # the model registry
    "CHAMPION": "registry",
    "DEFAULT_REGISTERED_NAME": "registry",
    "TrainOutcome": "registry",
    "champion_version": "registry",
    "load_champion": "registry",
    "trace_fingerprint": "registry",
    "train_and_log": "registry",
    # collection (the EC2 constants the trainer's AWS provider shares)
    "ALIVE_STATES": "ec2",
    "FILTER_VALUES_MAX": "ec2",
    "JOB_TAG_KEY": "ec2",
    "CollectError": "collect",
    "SpotCollector": "collect",
    "TraceStore": "collect",
    # namespaces
    "features": "",
    "jsonio": "",
}

if TYPE_CHECKING:
    from forecasting import features as features, jsonio as jsonio
    from forecasting.backtest import (
        DEFAULT_START as DEFAULT_START,
        BacktestResult as BacktestResult,
        rolling_origin as rolling_origin,
    )
    from forecasting.baselines import (
        ArimaForecaster as ArimaForecaster,
        EtsForecaster as EtsForecaster,
        PersistenceForecaster as PersistenceForecaster,
    )
    from forecasting.collect import (
        CollectError as CollectError,
        SpotCollector as SpotCollector,
        TraceStore as TraceStore,
    )
    from forecasting.corpus import training_corpus as training_corpus
    from forecasting.ec2 import (
        ALIVE_STATES as ALIVE_STATES,
        FILTER_VALUES_MAX as FILTER_VALUES_MAX,
        JOB_TAG_KEY as JOB_TAG_KEY,
    )
    from forecasting.forecast import QUANTILES as QUANTILES, Forecast as Forecast, Forecaster as Forecaster
    from forecasting.forecasters import (
        FORECASTERS as FORECASTERS,
        ForecasterFactory as ForecasterFactory,
        UnknownForecasterError as UnknownForecasterError,
        fit_forecaster as fit_forecaster,
        make_forecaster as make_forecaster,
    )
    from forecasting.lgbm import LightGbmForecaster as LightGbmForecaster
    from forecasting.registry import (
        CHAMPION as CHAMPION,
        DEFAULT_REGISTERED_NAME as DEFAULT_REGISTERED_NAME,
        TrainOutcome as TrainOutcome,
        champion_version as champion_version,
        load_champion as load_champion,
        trace_fingerprint as trace_fingerprint,
        train_and_log as train_and_log,
    )
    from forecasting.traces import (
        COLUMNS as COLUMNS,
        DEFAULT_INTERVAL_S as DEFAULT_INTERVAL_S,
        INTERVAL_S_RANGE as INTERVAL_S_RANGE,
        MAX_INSTANCES as MAX_INSTANCES,
        TraceFormatError as TraceFormatError,
        UnknownTraceError as UnknownTraceError,
        available_traces as available_traces,
        detect_format as detect_format,
        load_trace as load_trace,
        scale_trace as scale_trace,
        slice_hours as slice_hours,
    )

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` the first time someone asks for it."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'forecasting' has no attribute {name!r}")
    module = importlib.import_module(f"forecasting.{home or name}")
    value = module if not home else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
