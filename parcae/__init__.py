"""parcae: the front door of liveput-optimised DNN training on spot instances — the ``parcae`` command line, the
checks the flows run first, and the contract a user's own model is written against (`TrainSpec`, `Layer`,
`LossScaling`, `Validation`, the data helpers `StepSampler` and `TokenWindows`, and `warm_start`, from the trainer's
face).

Map:

- `cli`          the command line, one module per command group (``parcae --help``; `parcae.cli` lists them);
- `settings`     fail-fast checks of a flow's parameters, of ``prefect.yaml`` and of the stores (`SettingError`);
- `progress`     what ``parcae train`` shows on stderr while a job runs (a trainer observer);
- `simulations`  a ``parcae simulate --mlflow`` comparison laid out as MLflow runs, and rebuilt from them.

Must not touch: the work itself — planning and simulation (`liveput`), traces and forecasters (`forecasting`), the
trainer (`trainer`), each reached through its face; Prefect lives in `flows/` and `tasks/`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

#: What a user's training module imports (``import parcae; parcae.TrainSpec(...)``), from the trainer's face.
_CONTRACT = (
    "Layer",
    "LossScaling",
    "StepSampler",
    "TokenWindows",
    "TrainSpec",
    "Validation",
    "hf_decoder",
    "warm_start",
)

if TYPE_CHECKING:
    from trainer import Layer as Layer
    from trainer import LossScaling as LossScaling
    from trainer import StepSampler as StepSampler
    from trainer import TokenWindows as TokenWindows
    from trainer import TrainSpec as TrainSpec
    from trainer import Validation as Validation
    from trainer import hf_decoder as hf_decoder
    from trainer import warm_start as warm_start

__all__ = list(_CONTRACT)


def __getattr__(name: str) -> Any:
    """The contract's names, imported on first use (``parcae --help`` does not load torch)."""
    if name not in _CONTRACT:
        raise AttributeError(f"module 'parcae' has no attribute {name!r}")
    import trainer

    value = getattr(trainer, name)
    globals()[name] = value
    return value
