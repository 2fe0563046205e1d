"""The forecasters a name picks: ``FORECASTERS`` (name -> factory of an unfitted model).

Owns: the names the CLI, the flows and `forecasting.registry` know models by, and each model's defaults for a
horizon (one place: persistence learns at least 24 steps, LightGBM at least 12). Must not touch: MLflow (the
trained champion is `forecasting.registry.load_champion`'s), fitting policy (callers fit on their corpus).

Adding a forecaster: a class with ``fit`` / ``predict`` / ``history_window`` (`forecasting.forecast.Forecaster`)
and one entry here; the CLI's ``--models`` / ``--forecaster`` and the backtests pick it up from this mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the models are imported when built: the CLI reads the names at start-up, in milliseconds
    import pandas as pd

    from forecasting.baselines import ArimaForecaster, EtsForecaster, PersistenceForecaster
    from forecasting.forecast import Forecaster
    from forecasting.lgbm import LightGbmForecaster
    from forecasting.skill_gate import SkillGated

__all__ = ["FORECASTERS", "ForecasterFactory", "UnknownForecasterError", "fit_forecaster", "make_forecaster"]


class ForecasterFactory(Protocol):
    """Builds an unfitted forecaster able to forecast ``horizon`` intervals; ``params`` override its defaults."""

    def __call__(self, horizon: int, seed: int = 0, **params: Any) -> Forecaster: ...


class UnknownForecasterError(KeyError):
    """A forecaster name that `FORECASTERS` does not hold; the message lists the known ones."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown forecaster {self.name!r}; choose from {', '.join(FORECASTERS)}"


def _persistence(horizon: int, seed: int = 0, **params: Any) -> PersistenceForecaster:
    from forecasting.baselines import PersistenceForecaster

    return PersistenceForecaster(**{"max_horizon": max(24, horizon), **params})


def _arima(horizon: int, seed: int = 0, **params: Any) -> ArimaForecaster:
    from forecasting.baselines import ArimaForecaster

    return ArimaForecaster(**{"seed": seed, "persistence": _persistence(horizon), **params})


def _ets(horizon: int, seed: int = 0, **params: Any) -> EtsForecaster:
    from forecasting.baselines import EtsForecaster

    return EtsForecaster(**{"seed": seed, "persistence": _persistence(horizon), **params})


def _lightgbm(horizon: int, seed: int = 0, **params: Any) -> LightGbmForecaster:
    from forecasting.lgbm import LightGbmForecaster  # deferred: LightGBM takes seconds to import

    return LightGbmForecaster(**{"horizon_max": max(12, horizon), "seed": seed, **params})


def _lightgbm_gated(horizon: int, seed: int = 0, **params: Any) -> SkillGated:
    from forecasting.skill_gate import SkillGated

    return SkillGated(_lightgbm(horizon, seed, **params))


#: Name -> factory, in the order tables list the models (baselines first).
FORECASTERS: Mapping[str, ForecasterFactory] = MappingProxyType(
    {"persistence": _persistence, "arima": _arima, "ets": _ets, "lightgbm": _lightgbm,
     "lightgbm-gated": _lightgbm_gated}
)  # fmt: skip


def make_forecaster(name: str, horizon: int, seed: int = 0, **params: Any) -> Forecaster:
    """An unfitted ``name`` forecaster for ``horizon`` intervals; `UnknownForecasterError` for other names."""
    try:
        factory = FORECASTERS[name]
    except KeyError:
        raise UnknownForecasterError(name) from None
    return factory(horizon, seed, **params)


def fit_forecaster(name: str, tables: Sequence[pd.DataFrame], horizon: int, seed: int = 0) -> Forecaster:
    """``make_forecaster(name, horizon, seed)`` fitted on ``tables`` (canonical per-interval tables)."""
    return make_forecaster(name, horizon, seed).fit(tables)
