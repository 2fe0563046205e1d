"""trainer: the elastic D x P runtime that Parcae live-migrates — its public face.

Code outside the package imports from here only (``from trainer import JobConfig, train``). Every D x P strategy
trains exactly the same run (the global batch depends only on (seed, step), layers are initialised per layer, the
loss is normalised by the global batch, a step is applied all or nothing), so a job that is live-migrated, loses
workers without notice, or restarts from a checkpoint ends with the parameters of one uninterrupted process.

The folder is laid out by layer, each sub-package with a face of its own (imports run down this list only):

  config      `JobConfig` and its sections — one object carries a job's settings end to end; `MODELS`
  control/    the control plane: coordinator, the driver (`run_job`, `train`), events and schedules, the live
              planners, the profiling job
  providers/  where instances come from: the `PROVIDERS` registry (local processes, hosts over ssh, EC2 spot), the
              instance agent, the on-instance IMDS watcher
  observe/    observers (`JobObserver`), MLflow tracking, the runtime profile and its calibration
  runtime/    the worker's runtime: the model protocol and the example GPT, data, the pipeline step, migrations'
              hand-off, checkpoints, the worker, and the wire it speaks (sealed store, keys, spec)
  corpus      the bundled character corpus the example GPTs train on

Where a new piece plugs in: a model — a module with `layer_names`, `build_layer`, `loss`
(`trainer.runtime.model.ModelFamily`; the GPT in `trainer/runtime/gpt.py` is the example), registered with
`register_model`; a provider — `register_provider(Provider(...))` in `trainer/providers/__init__.py`; a planner —
`trainer/control/planning.py` (`make_planner`, `PLANNERS`).

Names resolve on first use (PEP 562): the settings checks read `MODELS` or `PROVIDERS` without loading torch.
None of it imports Prefect.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_HOMES: dict[str, str] = {
    **dict.fromkeys(("AvailabilityConfig", "CheckpointConfig", "ConfigError", "ControlPlaneConfig",
                     "DEFAULT_HB_TIMEOUT_S", "JobConfig", "MODELS", "ModelConfig", "PlanningConfig", "ProviderConfig",
                     "START_METHODS", "TrainConfig", "UnknownModelError", "model_config", "register_model"),
                    "trainer.config"),
    **dict.fromkeys(("PROVIDERS", "Provider", "ProviderError", "provider", "register_provider"), "trainer.providers"),
    "HostsError": "trainer.providers.hosts",
    **dict.fromkeys(("AwsConfigError", "AwsSpotConfig"), "trainer.providers.aws_config"),
    "check_aws_credentials": "trainer.providers.aws",
    **dict.fromkeys(("JobError", "job_report", "job_schedule", "run_job", "train"), "trainer.control.run"),
    **dict.fromkeys(("EventError", "Schedule", "load_events"), "trainer.control.events"),
    "ScheduleError": "trainer.control.coordinator",
    "chaos_schedule": "trainer.control.schedules",
    **dict.fromkeys(("HandPlanError", "PLANNERS", "hand_plan", "make_planner"), "trainer.control.planning"),
    **dict.fromkeys(("cached_profile", "measure"), "trainer.control.measure"),
    **dict.fromkeys(("JobObserver", "ObserverList", "PlanInfo", "StepInfo"), "trainer.observe.observer"),
    "MlflowJobObserver": "trainer.observe.tracking",
    **dict.fromkeys(("ProfileError", "ProfileFormatError", "RuntimeProfile"), "trainer.observe.profile"),
    **dict.fromkeys(("TOKEN_ENV", "read_token_file"), "trainer.runtime.store"),
    **dict.fromkeys(("ModelFamily", "build_layers", "layer_names"), "trainer.runtime.model"),
    **dict.fromkeys(("StageLayout", "build_context", "micro_loss", "parameters_checksum", "train_step"),
                    "trainer.runtime.pipeline"),
    **dict.fromkeys(("global_batch", "shard"), "trainer.runtime.data"),
    "corpus": "trainer.corpus",
    "checkpoint": "",  # the checkpoint module itself: a namespace (`trainer.checkpoint.latest_intact`)
}  # fmt: skip
_RENAMED = {"check_aws_credentials": "check_credentials"}

if TYPE_CHECKING:
    from trainer.config import (
        DEFAULT_HB_TIMEOUT_S as DEFAULT_HB_TIMEOUT_S,
        MODELS as MODELS,
        START_METHODS as START_METHODS,
        AvailabilityConfig as AvailabilityConfig,
        CheckpointConfig as CheckpointConfig,
        ConfigError as ConfigError,
        ControlPlaneConfig as ControlPlaneConfig,
        JobConfig as JobConfig,
        ModelConfig as ModelConfig,
        PlanningConfig as PlanningConfig,
        ProviderConfig as ProviderConfig,
        TrainConfig as TrainConfig,
        UnknownModelError as UnknownModelError,
        model_config as model_config,
        register_model as register_model,
    )
    from trainer.control.coordinator import ScheduleError as ScheduleError
    from trainer.control.events import EventError as EventError, Schedule as Schedule, load_events as load_events
    from trainer.control.measure import cached_profile as cached_profile, measure as measure
    from trainer.control.planning import (
        PLANNERS as PLANNERS,
        HandPlanError as HandPlanError,
        hand_plan as hand_plan,
        make_planner as make_planner,
    )
    from trainer.control.run import (
        JobError as JobError,
        job_report as job_report,
        job_schedule as job_schedule,
        run_job as run_job,
        train as train,
    )
    from trainer.control.schedules import chaos_schedule as chaos_schedule
    from trainer.corpus import corpus as corpus
    from trainer.observe.observer import (
        JobObserver as JobObserver,
        ObserverList as ObserverList,
        PlanInfo as PlanInfo,
        StepInfo as StepInfo,
    )
    from trainer.observe.profile import (
        ProfileError as ProfileError,
        ProfileFormatError as ProfileFormatError,
        RuntimeProfile as RuntimeProfile,
    )
    from trainer.observe.tracking import MlflowJobObserver as MlflowJobObserver
    from trainer.providers import (
        PROVIDERS as PROVIDERS,
        Provider as Provider,
        ProviderError as ProviderError,
        provider as provider,
        register_provider as register_provider,
    )
    from trainer.providers.aws import check_credentials as check_aws_credentials  # noqa: F401 (renamed on the face)
    from trainer.providers.aws_config import AwsConfigError as AwsConfigError, AwsSpotConfig as AwsSpotConfig
    from trainer.providers.hosts import HostsError as HostsError
    from trainer.runtime import checkpoint as checkpoint
    from trainer.runtime.data import global_batch as global_batch, shard as shard
    from trainer.runtime.model import (
        ModelFamily as ModelFamily,
        build_layers as build_layers,
        layer_names as layer_names,
    )
    from trainer.runtime.pipeline import (
        StageLayout as StageLayout,
        build_context as build_context,
        micro_loss as micro_loss,
        parameters_checksum as parameters_checksum,
        train_step as train_step,
    )
    from trainer.runtime.store import TOKEN_ENV as TOKEN_ENV, read_token_file as read_token_file

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` the first time someone asks for it."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    value = (importlib.import_module("trainer.runtime.checkpoint") if not home
             else getattr(importlib.import_module(home), _RENAMED.get(name, name)))  # fmt: skip
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
