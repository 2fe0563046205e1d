"""Train: an elastic job replaying a spot trace, re-planned every interval, tracked in MLflow. Not scheduled.

    settings (parameters, or a job file: config_file; MLflow store, out_dir) --fail fast--+
    runtime profile (runs/profile-<model>-<workers>.json, measured if absent) --+
    champion forecaster (or persistence) --------------------------------------+--training_planner--+
                                                                                                     |
    trace (scaled to the workers, one interval = interval_seconds) ----------------train_job---------+
          |  MlflowJobObserver: the training run (steps, migrations, a plan run per interval, checkpoints, timeline)
          |  PrefectJobObserver: the run's link, progress, one artifact per plan
    publish_train_report (markdown summary) --> result (JSON)

Resume: running the flow again with the same ``out_dir`` (``resume=True``, the default) continues a killed job from
its latest checkpoint and reopens the same MLflow run (its id is kept in ``<out_dir>/mlflow-run.json``), which
records the interruption. A finished job is not re-run. Long-running: no flow or task timeout and no deadline unless
``timeout_s`` gives one (the trainer's own: it stops the job and its workers) and no retries (a retry would restart
the job from scratch; resuming is a decision, taken by running the flow again).

``provider="aws"`` (``provider_options``: `trainer.providers.aws.AwsSpotConfig`'s fields, credentials from boto3's
standard chain) runs the same job on EC2 spot instances: each runs its worker under the instance agent
(`trainer.providers.agent`), the trace's changes are applied to the fleet (instances launched and terminated as the
replay says: a drill), and the cloud's own interruption notices are handled as they come (two minutes of grace).
The credentials and the configuration are checked before anything is launched; every instance is terminated when
the job ends, fails or is killed.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tracking

from prefect import flow, get_run_logger, runtime

from parcae import settings
from tasks.forecaster import champion_forecaster
from tasks.tracking import FLOW_RUN_TAG, publish_train_report
from tasks.training import previous_run, runtime_profile, train_job, training_planner
from trainer import (
    AvailabilityConfig,
    CheckpointConfig,
    ControlPlaneConfig,
    FleetConfig,
    JobConfig,
    ModelConfig,
    PlanningConfig,
    ProviderConfig,
    TrainConfig,
    config_default,
    load_job,
    model_config,
    profile_cut,
    with_notice_grace,
)

#: The train flow's parameters that go with ``config_file``: this run's own, not the job's settings.
WITH_CONFIG = frozenset({"config_file", "out_dir", "resume"})


def check_train_settings(arguments: Mapping[str, Any]) -> JobConfig:
    """Every fail-fast check of the train flow's ``arguments`` (one `SettingError` listing the problems): its
    parameters (`settings.FLOW_PARAMETERS`, as `python -m parcae.settings` checks a deployment's) or its job file
    (``config_file``), the tracking store, the job folder, then the `JobConfig` they make (the provider's options
    too: `trainer.providers`) and, for AWS, the credentials. Returns that `JobConfig`."""
    uri = tracking.tracking_uri()
    config, batch_given = (None, False) if arguments["config_file"] is None else job_from_file(arguments)
    out_dir, resume = arguments["out_dir"] if config is None else config.out_dir, arguments["resume"]

    def resume_ok() -> None:
        try:
            previous = previous_run(out_dir)
        except ValueError as exc:
            raise settings.SettingError(f"out_dir: {exc}") from None
        settings.check_resume(out_dir, resume, previous, uri)

    own = settings.flow_checks("train", arguments) if config is None else []  # (a file's: checked as it loaded)
    settings.check_all(*own, lambda: settings.check_tracking(uri), resume_ok)
    if config is None:
        try:
            config = job_config(arguments)
        except ValueError as exc:  # trainer.ConfigError: "section.field: problem; fix"
            field_name, _, rest = str(exc).partition(": ")
            where = arguments["provider"] if field_name == "provider.options" else field_name
            raise settings.SettingError(f"{where}: {rest}") from None
    if config.provider.name == "aws":
        settings.check_aws(config.provider.options.get("region"))
    return settings.check_spec(config, batch_given=batch_given)


def job_from_file(arguments: Mapping[str, Any]) -> tuple[JobConfig, bool]:
    """The `JobConfig` in the file that the ``config_file`` argument names (`trainer.load_job`: JSON, as each job
    writes it in job.json and its MLflow run records it, or TOML with the same sections), with the run's
    ``out_dir`` (where it is not the default, or where the file has none) and ``resume``, and whether the file gives
    the global batch (else the spec's rows set it). A parameter that is a job setting, given beside it (other than
    its default), is refused: a file that the flow silently overrode would not be the job that ran."""
    path = arguments["config_file"]
    defaults = _defaults()
    beside = [name for name, value in arguments.items() if name not in WITH_CONFIG and value != defaults[name]]
    if beside:
        raise settings.SettingError(f"config_file: {path} holds the job's settings: {', '.join(beside)} cannot be "
                                    "given beside it; change them in the file, or give every setting as a "
                                    "parameter without config_file")  # fmt: skip
    out_dir = arguments["out_dir"]
    try:
        return load_job(path, out_dir=None if out_dir == defaults["out_dir"] else out_dir, resume=arguments["resume"])
    except ValueError as exc:  # trainer.ConfigError: "<path>: problem"
        raise settings.SettingError(f"config_file: {exc}") from None


def job_config(arguments: Mapping[str, Any]) -> JobConfig:
    """The `JobConfig` of the train flow's (checked) ``arguments``: built once, passed down unchanged. The notice
    grace is the provider's (AWS: two minutes; else GCP's 30 s)."""
    a = arguments
    options = dict(a.get("provider_options") or {})
    fleet = a.get("fleet")
    if a["provider"] == "market":  # the local market follows the flow's trace, as a replay would (the job is blind)
        options = {"trace": a["trace"], "start_interval": a["start_interval"], "seed": a["seed"], **options}
    config = JobConfig(
        out_dir=str(Path(a["out_dir"])),
        model=model_config(a["model"], seed=a["seed"], **dict(a.get("model_args") or {})),
        train=TrainConfig(steps=a["steps"], seed=a["seed"], device=a.get("device", "auto")),
        availability=AvailabilityConfig(workers=a["workers"], trace=None if fleet else a["trace"],
                                        interval_seconds=a["interval_seconds"], step_seconds=a["step_seconds"],
                                        start_interval=0 if fleet else a["start_interval"]),
        checkpoint=CheckpointConfig(every=a["checkpoint_every"], resume=a["resume"], uri=a.get("checkpoint_uri")),
        control=ControlPlaneConfig(timeout_s=a["timeout_s"]),
        provider=ProviderConfig(name=a["provider"], options=options),
        planning=PlanningConfig(planner=a["planner"], look_ahead=a["look_ahead"], profile=a["profile"],
                                accept_plans=a.get("accept_plans", False)),
        fleet=FleetConfig(max_instances=fleet, min_instances=a.get("min_instances", 1)),
    )  # fmt: skip
    return with_notice_grace(config)  # (checked against its provider: its name, its options and what it runs)


def _defaults() -> dict[str, Any]:
    """The train flow's parameters' defaults."""
    return {name: p.default for name, p in inspect.signature(train.fn).parameters.items()}


def _run_name() -> str:
    """``train-<model>-<trace>``, or ``train-<file>`` for a job given as a file (``config_file``)."""
    given = {**_defaults(), **runtime.flow_run.parameters}  # (a deployment's run may hold only what it sets)
    if given["config_file"]:
        return f"train-{Path(given['config_file']).stem}"
    return f"train-{given['model']}-{given['trace']}"


@flow(name="train", flow_run_name=_run_name, persist_result=True, result_serializer="json")
def train(
    config_file: str | None = None,
    model: str = config_default(ModelConfig, "name"),
    model_args: dict[str, Any] | None = None,
    device: str = "auto",
    workers: int = config_default(AvailabilityConfig, "workers"),
    steps: int = 200,
    trace: str = "p3",
    interval_seconds: float = 1.0,
    step_seconds: float = 0.1,
    start_interval: int = 49,
    planner: str = "liveput",
    profile: str | None = None,
    look_ahead: int = config_default(PlanningConfig, "look_ahead"),
    provider: str = config_default(ProviderConfig, "name"),
    provider_options: dict[str, Any] | None = None,
    fleet: int | None = None,
    min_instances: int = config_default(FleetConfig, "min_instances"),
    accept_plans: bool = config_default(PlanningConfig, "accept_plans"),
    checkpoint_every: int = 20,
    checkpoint_uri: str | None = None,
    out_dir: str = "runs/train",
    resume: bool = True,
    seed: int = config_default(TrainConfig, "seed"),
    timeout_s: float | None = config_default(ControlPlaneConfig, "timeout_s"),
) -> dict[str, Any]:
    """Train the job that ``config_file`` holds (a `JobConfig` as JSON, the job.json that every job writes to
    its out_dir and its MLflow run records, or as TOML with the same sections; beside it only ``out_dir`` and
    ``resume`` may be given), or the job the other parameters give: ``model`` (a registered name, or
    ``module:function`` returning a ``parcae.TrainSpec``, called with ``model_args``) on ``device`` (auto: CUDA
    where it exists, else the CPU) for ``steps`` steps on ``workers`` instances replaying ``trace`` from
    ``start_interval`` (one trace interval = ``interval_seconds / step_seconds`` steps), re-planned every interval.
    ``provider``: a `trainer.providers.PROVIDERS` name — ``local`` (worker processes on this machine), ``hosts``
    (machines over ssh) or ``aws`` (EC2 spot instances, see the module docstring) — with its ``provider_options``.
    With ``fleet`` (a live fleet of up to that many instances, training once ``min_instances`` joined;
    ``provider="market"``: the local spot market, its capacity following ``trace`` from ``start_interval``, one
    interval = ``interval_seconds``) the provider, not a replay, decides what exists, and every interval is planned
    from the fleet's own history. ``checkpoint_uri`` (``file:///dir`` or ``s3://bucket/prefix``): a copy of every
    complete checkpoint that survives the machine; a resumed job on a fresh one starts from the newest there.
    ``accept_plans``: the job also takes the plans the scheduled plan-interval flow hands it (registered for them
    on its MLflow run); its own planner decides when none came within two intervals.

    ``planner``: ``liveput`` (the liveput optimizer on the runtime profile over ``look_ahead`` intervals priced at
    the trace's 60 s, forecasting with the champion forecaster, else persistence), ``rule`` or ``handed`` (plans
    handed in by plan-interval runs, the current strategy until one comes). ``profile``: a
    runtime profile JSON (default ``runs/profile-<model>-<workers>.json``, measured and written when absent).
    Returns the summary (`tasks.tracking.train_summary`).
    """
    arguments = dict(locals())  # the flow's arguments: nothing else is bound yet
    config = check_train_settings(arguments)  # built once, checked, passed down unchanged
    # from here on the job is its config alone, whether the parameters or a file (``config_file``) gave it
    av, plan, fleet = config.availability, config.planning, config.fleet.max_instances
    model, workers = config.model.name, av.workers
    market = config.provider.options if config.provider.name == "market" else {}
    followed = av.trace if fleet is None else market.get("trace")  # (the local market's: one the job never reads)
    from_interval = av.start_interval if fleet is None else market.get("start_interval")
    logger = get_run_logger()
    runtime_prof, profile_source, forecaster, forecaster_run = None, "none (not needed by this planner)", None, None
    if plan.planner == "liveput":
        runtime_prof, profile_source = runtime_profile(model, workers, plan.profile, dict(config.model.args) or None,
                                                       config.train.device)  # fmt: skip
        config, told = profile_cut(config, runtime_prof)  # the stages cut as in the profile's job
        for line in told:
            logger.warning(line)
        forecaster, forecaster_run = champion_forecaster()
    plan_with, forecast = training_planner(config, runtime_prof, forecaster, forecaster_run)
    logger.info("planner %s; forecasts: %s; runtime profile: %s", plan.planner, forecast, profile_source)
    tags = {
        FLOW_RUN_TAG: runtime.flow_run.id,
        "prefect.flow_run_name": runtime.flow_run.name,
        "prefect.deployment": runtime.deployment.name,
        "parcae.config_file": arguments["config_file"],
        "parcae.trace": followed,
        "parcae.start_interval": from_interval,
        "parcae.interval_seconds": av.interval_seconds,
        "parcae.planner": plan.planner,
        "parcae.forecast": forecast,
        "parcae.forecaster_run_id": forecaster_run,
        "parcae.profile": profile_source,
        "parcae.provider": config.provider.name,
        "parcae.fleet": fleet,
    }
    trained = train_job(
        config, planner=plan_with, tags={k: v for k, v in tags.items() if v not in (None, "")},
    )  # fmt: skip
    return publish_train_report(trained, planner=plan.planner or "none", forecast=forecast, profile=profile_source)
