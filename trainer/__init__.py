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
  examples/   the built-in models (the example GPTs), written against the public `TrainSpec` contract
  runtime/    the worker's runtime: the training spec and its checks, the model's stages, data, the pipeline
              step, migrations' hand-off, checkpoints and their export, the worker, and the wire it speaks (sealed
              store, keys, spec)
  corpus      the bundled character corpus the example GPTs train on
  jsonfile    a JSON file read with one clear error (schedules, profiles)

Where a new piece plugs in: a model — a function returning a `TrainSpec` (layers, batch, loss, optimizer), named
``module:function`` on the command line or registered with `register_model` / a ``parcae.models`` entry point (the
GPTs in `trainer/examples/gpt.py` are written against that contract); a provider —
`register_provider(Provider(...))` in `trainer/providers/__init__.py`; a planner — `trainer/control/planning.py`
(`make_planner`, `PLANNERS`).

Names resolve on first use (PEP 562): the settings checks read `MODELS` or `PROVIDERS` without loading torch.
None of it imports Prefect.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_HOMES: dict[str, str] = {
    **dict.fromkeys(("AvailabilityConfig", "CheckpointConfig", "ConfigError", "ControlPlaneConfig", "DEVICES",
                     "DEFAULT_HB_TIMEOUT_S", "FleetConfig", "JobConfig", "MODELS", "ModelConfig", "PlanningConfig",
                     "ProviderConfig", "SCHEDULES", "START_METHODS", "TrainConfig", "UnknownModelError",
                     "config_default", "model_config", "register_model"),
                    "trainer.config"),
    **dict.fromkeys(("PROVIDERS", "Provider", "ProviderError", "provider", "provider_of", "register_provider",
                     "with_notice_grace"),
                   "trainer.providers"),
    "HostsError": "trainer.providers.hosts",
    **dict.fromkeys(("AwsConfigError", "AwsSpotConfig"), "trainer.providers.aws_config"),
    "JobError": "trainer.control.driver",
    "load_job": "trainer.control.job_file",
    **dict.fromkeys(("job_report", "job_schedule", "run_job", "train"), "trainer.control.run"),
    **dict.fromkeys(("EventError", "Schedule", "load_events"), "trainer.control.events"),
    "ScheduleError": "trainer.control.dry_run",
    "chaos_schedule": "trainer.control.schedules",
    **dict.fromkeys(("fleet_cost", "fleet_cost_text"), "trainer.control.fleet"),
    **dict.fromkeys(("HandPlanError", "PLANNERS", "hand_plan", "handed_in", "job_planner", "make_planner",
                     "planned_interval_s", "plans_stand_s", "profile_cut"),
                    "trainer.control.planning"),
    **dict.fromkeys(("cached_profile", "measure"), "trainer.control.measure"),
    **dict.fromkeys(("JobObserver", "ObserverList", "PlanInfo", "ProgressLog", "StepInfo", "fleet_text"),
                    "trainer.observe.observer"),
    **dict.fromkeys(("ACCEPTS_PLANS_TAG", "DECIDED_BY_TAG", "MlflowJobObserver", "TRAINING_RUN_TAG"),
                    "trainer.observe.tracking"),
    **dict.fromkeys(("ProfileError", "ProfileFormatError", "RuntimeProfile"), "trainer.observe.profile"),
    "StepTimeline": "trainer.observe.timeline",
    **dict.fromkeys(("TOKEN_ENV", "read_token_file"), "trainer.runtime.store"),
    **dict.fromkeys(("Stage", "build_layers", "layer_names", "spec_of"), "trainer.runtime.model"),
    **dict.fromkeys(("Layer", "SpecError", "TrainSpec", "check_job", "check_spec", "fingerprint", "load_spec"),
                    "trainer.runtime.trainspec"),
    **dict.fromkeys(("StageLayout", "build_context", "host_copy", "micro_loss", "parameters_checksum", "partition",
                     "train_step", "validate"), "trainer.runtime.pipeline"),
    **dict.fromkeys(("StepSampler", "TokenWindows", "shard"), "trainer.runtime.data"),
    **dict.fromkeys(("DeviceError", "resolve_device"), "trainer.runtime.devices"),
    **dict.fromkeys(("LossScaleError", "LossScaling"), "trainer.runtime.loss_scale"),
    **dict.fromkeys(("Patience", "Validation", "score_text"), "trainer.runtime.validation"),
    "warm_start": "trainer.runtime.warm_start",
    "global_batch": "trainer.examples.gpt",
    "hf_decoder": "trainer.examples.hf",
    "corpus": "trainer.corpus",
    **dict.fromkeys(("Exported", "export_from_uri", "export_state_dict", "write_state_dict"), "trainer.runtime.export"),
    "checkpoint": "",  # the checkpoint module itself: a namespace (`trainer.checkpoint.latest_intact`)
}  # fmt: skip

if TYPE_CHECKING:
    from trainer.config import (
        DEFAULT_HB_TIMEOUT_S as DEFAULT_HB_TIMEOUT_S,
    )
    from trainer.config import (
        DEVICES as DEVICES,
    )
    from trainer.config import (
        MODELS as MODELS,
    )
    from trainer.config import (
        SCHEDULES as SCHEDULES,
    )
    from trainer.config import (
        START_METHODS as START_METHODS,
    )
    from trainer.config import (
        AvailabilityConfig as AvailabilityConfig,
    )
    from trainer.config import (
        CheckpointConfig as CheckpointConfig,
    )
    from trainer.config import (
        ConfigError as ConfigError,
    )
    from trainer.config import (
        ControlPlaneConfig as ControlPlaneConfig,
    )
    from trainer.config import (
        FleetConfig as FleetConfig,
    )
    from trainer.config import (
        JobConfig as JobConfig,
    )
    from trainer.config import (
        ModelConfig as ModelConfig,
    )
    from trainer.config import (
        PlanningConfig as PlanningConfig,
    )
    from trainer.config import (
        ProviderConfig as ProviderConfig,
    )
    from trainer.config import (
        TrainConfig as TrainConfig,
    )
    from trainer.config import (
        UnknownModelError as UnknownModelError,
    )
    from trainer.config import (
        config_default as config_default,
    )
    from trainer.config import (
        model_config as model_config,
    )
    from trainer.config import (
        register_model as register_model,
    )
    from trainer.control.driver import JobError as JobError
    from trainer.control.dry_run import ScheduleError as ScheduleError
    from trainer.control.events import EventError as EventError
    from trainer.control.events import Schedule as Schedule
    from trainer.control.events import load_events as load_events
    from trainer.control.fleet import fleet_cost as fleet_cost
    from trainer.control.fleet import fleet_cost_text as fleet_cost_text
    from trainer.control.job_file import load_job as load_job
    from trainer.control.measure import cached_profile as cached_profile
    from trainer.control.measure import measure as measure
    from trainer.control.planning import (
        PLANNERS as PLANNERS,
    )
    from trainer.control.planning import (
        HandPlanError as HandPlanError,
    )
    from trainer.control.planning import (
        hand_plan as hand_plan,
    )
    from trainer.control.planning import (
        handed_in as handed_in,
    )
    from trainer.control.planning import (
        job_planner as job_planner,
    )
    from trainer.control.planning import (
        make_planner as make_planner,
    )
    from trainer.control.planning import (
        planned_interval_s as planned_interval_s,
    )
    from trainer.control.planning import (
        plans_stand_s as plans_stand_s,
    )
    from trainer.control.planning import (
        profile_cut as profile_cut,
    )
    from trainer.control.run import (
        job_report as job_report,
    )
    from trainer.control.run import (
        job_schedule as job_schedule,
    )
    from trainer.control.run import (
        run_job as run_job,
    )
    from trainer.control.run import (
        train as train,
    )
    from trainer.control.schedules import chaos_schedule as chaos_schedule
    from trainer.corpus import corpus as corpus
    from trainer.examples.gpt import global_batch as global_batch
    from trainer.examples.hf import hf_decoder as hf_decoder
    from trainer.observe.observer import (
        JobObserver as JobObserver,
    )
    from trainer.observe.observer import (
        ObserverList as ObserverList,
    )
    from trainer.observe.observer import (
        PlanInfo as PlanInfo,
    )
    from trainer.observe.observer import (
        ProgressLog as ProgressLog,
    )
    from trainer.observe.observer import (
        StepInfo as StepInfo,
    )
    from trainer.observe.observer import (
        fleet_text as fleet_text,
    )
    from trainer.observe.profile import (
        ProfileError as ProfileError,
    )
    from trainer.observe.profile import (
        ProfileFormatError as ProfileFormatError,
    )
    from trainer.observe.profile import (
        RuntimeProfile as RuntimeProfile,
    )
    from trainer.observe.timeline import StepTimeline as StepTimeline
    from trainer.observe.tracking import ACCEPTS_PLANS_TAG as ACCEPTS_PLANS_TAG
    from trainer.observe.tracking import DECIDED_BY_TAG as DECIDED_BY_TAG
    from trainer.observe.tracking import TRAINING_RUN_TAG as TRAINING_RUN_TAG
    from trainer.observe.tracking import MlflowJobObserver as MlflowJobObserver
    from trainer.providers import (
        PROVIDERS as PROVIDERS,
    )
    from trainer.providers import (
        Provider as Provider,
    )
    from trainer.providers import (
        ProviderError as ProviderError,
    )
    from trainer.providers import (
        provider as provider,
    )
    from trainer.providers import (
        provider_of as provider_of,
    )
    from trainer.providers import (
        register_provider as register_provider,
    )
    from trainer.providers import (
        with_notice_grace as with_notice_grace,
    )
    from trainer.providers.aws_config import AwsConfigError as AwsConfigError
    from trainer.providers.aws_config import AwsSpotConfig as AwsSpotConfig
    from trainer.providers.hosts import HostsError as HostsError
    from trainer.runtime import checkpoint as checkpoint
    from trainer.runtime.data import StepSampler as StepSampler
    from trainer.runtime.data import TokenWindows as TokenWindows
    from trainer.runtime.data import shard as shard
    from trainer.runtime.devices import (
        DeviceError as DeviceError,
    )
    from trainer.runtime.devices import (
        resolve_device as resolve_device,
    )
    from trainer.runtime.export import Exported as Exported
    from trainer.runtime.export import export_from_uri as export_from_uri
    from trainer.runtime.export import export_state_dict as export_state_dict
    from trainer.runtime.export import write_state_dict as write_state_dict
    from trainer.runtime.loss_scale import LossScaleError as LossScaleError
    from trainer.runtime.loss_scale import LossScaling as LossScaling
    from trainer.runtime.model import (
        Stage as Stage,
    )
    from trainer.runtime.model import (
        build_layers as build_layers,
    )
    from trainer.runtime.model import (
        layer_names as layer_names,
    )
    from trainer.runtime.model import (
        spec_of as spec_of,
    )
    from trainer.runtime.pipeline import (
        StageLayout as StageLayout,
    )
    from trainer.runtime.pipeline import (
        build_context as build_context,
    )
    from trainer.runtime.pipeline import (
        host_copy as host_copy,
    )
    from trainer.runtime.pipeline import (
        micro_loss as micro_loss,
    )
    from trainer.runtime.pipeline import (
        parameters_checksum as parameters_checksum,
    )
    from trainer.runtime.pipeline import (
        partition as partition,
    )
    from trainer.runtime.pipeline import (
        train_step as train_step,
    )
    from trainer.runtime.pipeline import (
        validate as validate,
    )
    from trainer.runtime.store import TOKEN_ENV as TOKEN_ENV
    from trainer.runtime.store import read_token_file as read_token_file
    from trainer.runtime.trainspec import Layer as Layer
    from trainer.runtime.trainspec import SpecError as SpecError
    from trainer.runtime.trainspec import TrainSpec as TrainSpec
    from trainer.runtime.trainspec import check_job as check_job
    from trainer.runtime.trainspec import check_spec as check_spec
    from trainer.runtime.trainspec import fingerprint as fingerprint
    from trainer.runtime.trainspec import load_spec as load_spec
    from trainer.runtime.validation import Patience as Patience
    from trainer.runtime.validation import Validation as Validation
    from trainer.runtime.validation import score_text as score_text
    from trainer.runtime.warm_start import warm_start as warm_start

__all__ = sorted([*_HOMES, "check_aws_credentials"])


def check_aws_credentials(session: Any = None, region: str | None = None) -> dict[str, str]:
    """`trainer.providers.aws.check_credentials`: boto3 finds usable credentials (and a region), else its error
    naming what is missing. Imported on call: boto3 is the AWS provider's alone."""
    from trainer.providers.aws import check_credentials

    return check_credentials(session=session, region=region)


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` the first time someone asks for it."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    value = (importlib.import_module("trainer.runtime.checkpoint") if not home
             else getattr(importlib.import_module(home), name))  # fmt: skip
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
