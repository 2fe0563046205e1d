"""forecasting: spot-availability traces in, forecasts out — the public face of the package.

Code outside the package imports from here only (``from forecasting import load_trace``), never from a module.
What is here, and where it lives:

- the interface: `Forecaster` (``fit`` / ``predict`` / ``history_window``) and the `Forecast` it returns
  (`forecasting.forecast`);
- the models: `FORECASTERS` (name -> factory), `make_forecaster`, `fit_forecaster` (`forecasting.forecasters`),
  and the classes themselves (`forecasting.baselines`, `forecasting.lgbm`); the online skill gate that keeps a
  learned point forecast only where it beat persistence on the trace's own past (`SkillGated`, `skill_gated`:
  `forecasting.skill_gate`);
- evaluation: `rolling_origin`, `BacktestResult` (`forecasting.backtest`);
- traces: the trace catalog (`available_traces`), the canonical per-interval table (`forecasting.traces`), the
  training corpus (`forecasting.corpus`); `load_trace`, a name or path (the catalog's) or a live fleet's history
  (`fleet:<job tag>`, in the trace store: `forecasting.trace_store`);
- the model registry in MLflow: `train_and_log`, `load_champion` (`forecasting.registry`);
- collection from EC2: `SpotCollector` and `spot_price_history` (`forecasting.collect`; the trainer's AWS provider
  prices a live fleet with the latter) and the EC2 constants the trainer's AWS provider shares (`forecasting.ec2`);
- the trace store, in a folder or on S3: `TraceStore`, its compaction threshold `COMPACT_AT`, the prefix of a
  live fleet's history as a trace (`FLEET`; `FleetIntervalError` where asked at another interval), where the store
  is by default (`trace_store_root`) and whether a location can be one (`check_trace_store`)
  (`forecasting.trace_store`);
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
    "SkillGated": "skill_gate",
    "skill_gated": "skill_gate",
    # evaluation
    "DEFAULT_START": "backtest",
    "BacktestResult": "backtest",
    "past_rows": "backtest",
    "pit_coverage": "backtest",
    "plot_fans": "backtest",
    "rolling_origin": "backtest",
    # traces
    "COLUMNS": "traces",
    "DEFAULT_INTERVAL_S": "traces",
    "INTERVAL_S_RANGE": "traces",
    "MAX_INSTANCES": "traces",
    "TraceFormatError": "traces",
    "UnknownTraceError": "traces",
    "available_traces": "traces",
    "counts_table": "traces",
    "detect_format": "traces",
    "scale_trace": "traces",
    "slice_hours": "traces",
    "trace_cloud": "traces",
    "training_corpus": "corpus",
    # the model registry
    "CHAMPION": "registry",
    "DEFAULT_REGISTERED_NAME": "registry",
    "PERSISTENCE_KIND": "registry",
    "TrainOutcome": "registry",
    "champion_version": "registry",
    "load_champion": "registry",
    "trace_fingerprint": "registry",
    "train_and_log": "registry",
    # collection (the EC2 constants the trainer's AWS provider shares)
    "ALIVE_STATES": "ec2",
    "FILTER_VALUES_MAX": "ec2",
    "JOB_TAG_KEY": "ec2",
    "SPOT_RECLAIMED_RE": "ec2",
    "SPOT_WARNING_RE": "ec2",
    "no_credentials": "ec2",
    "no_region": "ec2",
    "CollectError": "collect",
    "SpotCollector": "collect",
    "spot_price_history": "collect",
    # the trace store
    "COMPACT_AT": "trace_store",
    "FLEET": "trace_store",
    "FleetIntervalError": "trace_store",
    "TraceStore": "trace_store",
    "check_trace_store": "trace_store",
    "load_trace": "trace_store",
    "trace_store_root": "trace_store",
    # namespaces
    "features": "",
    "jsonio": "",
}

if TYPE_CHECKING:
    from forecasting import features as features
    from forecasting import jsonio as jsonio
    from forecasting.backtest import DEFAULT_START as DEFAULT_START
    from forecasting.backtest import BacktestResult as BacktestResult
    from forecasting.backtest import past_rows as past_rows
    from forecasting.backtest import pit_coverage as pit_coverage
    from forecasting.backtest import plot_fans as plot_fans
    from forecasting.backtest import rolling_origin as rolling_origin
    from forecasting.baselines import ArimaForecaster as ArimaForecaster
    from forecasting.baselines import EtsForecaster as EtsForecaster
    from forecasting.baselines import PersistenceForecaster as PersistenceForecaster
    from forecasting.collect import CollectError as CollectError
    from forecasting.collect import SpotCollector as SpotCollector
    from forecasting.collect import spot_price_history as spot_price_history
    from forecasting.corpus import training_corpus as training_corpus
    from forecasting.ec2 import ALIVE_STATES as ALIVE_STATES
    from forecasting.ec2 import FILTER_VALUES_MAX as FILTER_VALUES_MAX
    from forecasting.ec2 import JOB_TAG_KEY as JOB_TAG_KEY
    from forecasting.ec2 import SPOT_RECLAIMED_RE as SPOT_RECLAIMED_RE
    from forecasting.ec2 import SPOT_WARNING_RE as SPOT_WARNING_RE
    from forecasting.ec2 import no_credentials as no_credentials
    from forecasting.ec2 import no_region as no_region
    from forecasting.forecast import QUANTILES as QUANTILES
    from forecasting.forecast import Forecast as Forecast
    from forecasting.forecast import Forecaster as Forecaster
    from forecasting.forecasters import FORECASTERS as FORECASTERS
    from forecasting.forecasters import ForecasterFactory as ForecasterFactory
    from forecasting.forecasters import UnknownForecasterError as UnknownForecasterError
    from forecasting.forecasters import fit_forecaster as fit_forecaster
    from forecasting.forecasters import make_forecaster as make_forecaster
    from forecasting.lgbm import LightGbmForecaster as LightGbmForecaster
    from forecasting.registry import CHAMPION as CHAMPION
    from forecasting.registry import DEFAULT_REGISTERED_NAME as DEFAULT_REGISTERED_NAME
    from forecasting.registry import PERSISTENCE_KIND as PERSISTENCE_KIND
    from forecasting.registry import TrainOutcome as TrainOutcome
    from forecasting.registry import champion_version as champion_version
    from forecasting.registry import load_champion as load_champion
    from forecasting.registry import trace_fingerprint as trace_fingerprint
    from forecasting.registry import train_and_log as train_and_log
    from forecasting.skill_gate import SkillGated as SkillGated
    from forecasting.skill_gate import skill_gated as skill_gated
    from forecasting.trace_store import COMPACT_AT as COMPACT_AT
    from forecasting.trace_store import FLEET as FLEET
    from forecasting.trace_store import FleetIntervalError as FleetIntervalError
    from forecasting.trace_store import TraceStore as TraceStore
    from forecasting.trace_store import check_trace_store as check_trace_store
    from forecasting.trace_store import load_trace as load_trace
    from forecasting.trace_store import trace_store_root as trace_store_root
    from forecasting.traces import COLUMNS as COLUMNS
    from forecasting.traces import DEFAULT_INTERVAL_S as DEFAULT_INTERVAL_S
    from forecasting.traces import INTERVAL_S_RANGE as INTERVAL_S_RANGE
    from forecasting.traces import MAX_INSTANCES as MAX_INSTANCES
    from forecasting.traces import TraceFormatError as TraceFormatError
    from forecasting.traces import UnknownTraceError as UnknownTraceError
    from forecasting.traces import available_traces as available_traces
    from forecasting.traces import counts_table as counts_table
    from forecasting.traces import detect_format as detect_format
    from forecasting.traces import scale_trace as scale_trace
    from forecasting.traces import slice_hours as slice_hours
    from forecasting.traces import trace_cloud as trace_cloud

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
