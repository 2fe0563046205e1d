"""``parcae train`` (the elastic trainer on local processes, hosts or AWS) and ``parcae profile`` (measure it).

Owns: turning the options into one `trainer.JobConfig` (a config error names its option: `TRAIN_OPTIONS`), the
provider's options, Ctrl-C (`EXIT_INTERRUPTED`, the command that continues the job), the printed reports. Must not
touch: running the job (`trainer.train`, `trainer.measure`), the live progress (`parcae.progress`).
"""

import bisect
import itertools
import math
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, NoReturn

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from liveput import DEFAULT_INTERVAL_S, strategy_key, strategy_text
from parcae.cli.common import (
    CommandFailed,
    UserError,
    check_outputs,
    check_writable,
    check_writable_dir,
    command,
    grouped,
    json_object_option,
    stderr,
    stdout,
    warn,
    write_file,
)
from trainer import (
    AvailabilityConfig,
    CheckpointConfig,
    ControlPlaneConfig,
    FleetConfig,
    ModelConfig,
    PlanningConfig,
    ProviderConfig,
    TrainConfig,
    config_default,
    fleet_cost_text,
)

#: --model and --model-args, as `parcae train` and `parcae profile` take them.
ModelOption = Annotated[
    str,
    typer.Option(
        metavar="NAME|MODULE:FUNCTION",
        help="The model: tiny-gpt or small-gpt (built in), a name an installed package registers "
        "(entry points `parcae.models`), or module:function returning a parcae.TrainSpec.",
    ),
]
#: The default of --model: the config's (one source).
DEFAULT_MODEL = config_default(ModelConfig, "name")
#: --device, as `parcae train` and `parcae profile` take it.
DeviceOption = Annotated[
    str,
    typer.Option(
        metavar="auto|cpu|cuda",
        help="Where workers train: auto is CUDA where it exists (one GPU per "
        "worker where there are enough, shared in turn where not), else the CPU.",
    ),
]
ModelArgsOption = Annotated[
    str | None,
    typer.Option(metavar="JSON|@FILE", help="Keyword arguments of the model's function, as a JSON object."),
]


#: The groups `parcae train --help` lists its options in (the rest come under "Options").
TRAIN_PANELS: Final = {
    "Capacity (what instances exist)": ("workers", "trace", "events", "start_interval", "interval_seconds", "fleet",
                                        "min_instances", "market_trace", "provider", "provider_options"),
    "Model and training": ("model", "model_args", "steps", "global_batch", "schedule", "device", "seed"),
    "Planning and migration": ("planner", "profile", "look_ahead", "accept_plans", "prepare"),
    "Checkpoints and outputs": ("out_dir", "resume", "checkpoint_every", "checkpoint_uri", "keep_checkpoints",
                                "json_out", "plot"),
    "Other hosts (--hosts)": ("hosts", "coordinator", "slots", "remote_python", "remote_workdir"),
    "Failures and time": ("timeout", "heartbeat_timeout"),
    "Settings from a file": ("config_file",),
}  # fmt: skip


@command("train", cls=grouped(TRAIN_PANELS))
def train_cmd(
    ctx: typer.Context,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help="The job's settings from a file instead of the options: a JobConfig as JSON (the job.json of "
            "every job's MLflow run: a run again) or TOML. Only --out-dir, --resume, --json and --plot go with it.",
        ),
    ] = None,
    workers: Annotated[int, typer.Option(help="Local worker processes (instances) at the start.")] = config_default(
        AvailabilityConfig, "workers"
    ),
    trace: Annotated[
        str | None,
        typer.Option(
            metavar="NAME|PATH",
            help="Replay this spot trace, scaled to the workers (a name from `parcae traces`, a live fleet's "
            "history fleet:<job tag> among them, or a file).",
        ),
    ] = None,
    events: Annotated[
        Path | None, typer.Option(metavar="FILE", help="A scripted schedule of events (JSON) instead of a trace.")
    ] = None,
    interval_seconds: Annotated[
        float | None,
        typer.Option(
            help="Wall time of one interval: of the replayed trace (time compression; default 2), or between two "
            "plans of a live fleet (default 60; under the local market, of one market-trace interval too).",
        ),
    ] = None,
    fleet: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Train on a live fleet of up to N instances: the provider (e.g. --provider market), not a trace, "
            "decides what exists; the job plans every --interval-seconds from the fleet's own history.",
        ),
    ] = None,
    min_instances: Annotated[
        int, typer.Option(metavar="N", help="With --fleet: start training once N instances have joined.")
    ] = config_default(FleetConfig, "min_instances"),
    market_trace: Annotated[
        str | None,
        typer.Option(
            metavar="NAME|PATH",
            help="With --provider market: the trace the local market's capacity follows "
            "(scaled to --fleet; the job never reads it). Sets --provider market.",
        ),
    ] = None,
    steps: Annotated[int, typer.Option(help="Training steps.")] = 40,
    model: ModelOption = DEFAULT_MODEL,
    model_args: ModelArgsOption = None,
    global_batch: Annotated[
        int | None,
        typer.Option(help="Rows per step (the built-in GPTs take it; a spec's batch() has its own: default)."),
    ] = None,
    schedule: Annotated[
        str,
        typer.Option(metavar="gpipe|1f1b", help="Pipeline schedule within a step (1f1b keeps fewer activations)."),
    ] = config_default(TrainConfig, "schedule"),
    device: DeviceOption = "auto",
    checkpoint_every: Annotated[int, typer.Option(help="Checkpoint every N steps (0: never).")] = config_default(
        CheckpointConfig, "every"
    ),
    checkpoint_uri: Annotated[
        str | None,
        typer.Option(
            metavar="file:///DIR|s3://BUCKET/PREFIX",
            help="Also keep each complete checkpoint here, where it survives this machine; --resume on a fresh "
            "machine starts from the newest one there.",
        ),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option(metavar="DIR", help="Fresh folder for checkpoints and layers (or the one to --resume).")
    ] = Path("runs/train"),
    json_out: Annotated[
        Path | None, typer.Option("--json", metavar="OUT.json", help="Write the loss, throughput and migrations here.")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            metavar="OUT.png",
            help="Draw the job's timeline here: instances alive, D x P and throughput per step, a marker per "
            "migration (the figure of its MLflow run).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the model, the data order and the trace replay.")] = config_default(
        TrainConfig, "seed"
    ),
    planner: Annotated[
        str,
        typer.Option(
            metavar="rule|liveput|handed",
            help="Who decides D x P at every interval boundary: rule (two stages once two instances are alive, as "
            "many replicas as fit; with --events, the file's own plan events decide), liveput (the liveput "
            "optimizer on --profile, persistence forecasts) or handed (plans handed in from outside; the current "
            "strategy until one comes).",
        ),
    ] = "rule",
    profile: Annotated[
        Path | None,
        typer.Option(metavar="PROFILE.json", help="A runtime profile written by `parcae profile` (for liveput)."),
    ] = None,
    accept_plans: Annotated[
        bool,
        typer.Option(
            "--accept-plans",
            help="Also take plans handed in from outside (the scheduled plan-interval flow plans for every job "
            "that does): each stands two intervals; --planner decides when none came in time.",
        ),
    ] = config_default(PlanningConfig, "accept_plans"),
    look_ahead: Annotated[
        int,
        typer.Option(
            metavar="K",
            help="Intervals the liveput planner plans over (a trace's each priced at "
            "its own 60 s: the replay compresses time, the plans do not).",
        ),
    ] = config_default(PlanningConfig, "look_ahead"),
    start_interval: Annotated[int, typer.Option(metavar="N", help="Trace interval the replay starts at.")] = (
        config_default(AvailabilityConfig, "start_interval")
    ),
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint in --out-dir (same arguments).")
    ] = False,
    hosts: Annotated[
        str | None,
        typer.Option(
            metavar="HOST,HOST,...",
            help="Run the instances on these machines (ssh destinations; OpenSSH "
            "in BatchMode) instead of local processes: each runs `python -m trainer.providers.agent`.",
        ),
    ] = None,
    coordinator: Annotated[
        str | None,
        typer.Option(
            metavar="ADDRESS:PORT",
            help="With --hosts: this machine's address and a free port, as the hosts reach them.",
        ),
    ] = None,
    slots: Annotated[int, typer.Option(help="With --hosts: instances per host at most.")] = 1,
    provider: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Where instances come from (trainer.providers): local (worker processes "
            "here, the default), hosts (machines over ssh; --hosts sets it), aws (EC2 spot instances) or market "
            "(a live fleet under a local spot market; --market-trace sets it).",
        ),
    ] = None,
    provider_options: Annotated[
        str | None,
        typer.Option(
            metavar="JSON|@FILE",
            help="The provider's options as a JSON object, e.g. aws: "
            '\'{"region": "us-east-1", "image_id": "ami-..."}\' (trainer.providers.aws.AwsSpotConfig\'s fields).',
        ),
    ] = None,
    remote_python: Annotated[
        str, typer.Option(metavar="PATH", help="With --hosts: the interpreter with this project on the hosts.")
    ] = "python3",
    remote_workdir: Annotated[
        str, typer.Option(metavar="DIR", help="With --hosts: the project's folder on the hosts.")
    ] = ".",
    timeout: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="Stop the job if it has not finished after this long "
            "(default: no deadline; a job runs until it has trained its steps, is cancelled or fails).",
        ),
    ] = None,
    keep_checkpoints: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Keep the newest N complete checkpoints on disk (0: all), and the best-scored one of a validating "
            "spec.",
        ),
    ] = config_default(CheckpointConfig, "keep"),
    heartbeat_timeout: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="A worker whose heartbeat is silent this long "
            "is declared dead (one whose process exits is seen at once; default: "
            "trainer.config.DEFAULT_HB_TIMEOUT_S); raise it on a loaded machine.",
        ),
    ] = None,
    prepare: Annotated[
        bool,
        typer.Option(
            "--prepare/--no-prepare",
            help="Prepare each reconfiguration known a step ahead (the schedule's, a preemption notice, an "
            "interval's plan) while the old strategy trains: its process groups form and joining instances build "
            "their layers (the boundary then only moves the state and swaps the groups).",
        ),
    ] = config_default(ControlPlaneConfig, "prepare"),
) -> None:
    """Train on worker processes that live-migrate as instances come and go: local processes, or instance agents
    on other hosts (--hosts). Ctrl-C stops the workers and prints the command that continues the job."""
    from trainer import (
        DEFAULT_HB_TIMEOUT_S,
        PLANNERS,
        AvailabilityConfig,
        CheckpointConfig,
        ControlPlaneConfig,
        DeviceError,
        EventError,
        FleetConfig,
        HostsError,
        JobConfig,
        JobError,
        PlanningConfig,
        ProfileFormatError,
        ProviderConfig,
        RuntimeProfile,
        ScheduleError,
        SpecError,
        TrainConfig,
        UnknownModelError,
        check_job,
        job_planner,
        model_config,
        profile_cut,
        resolve_device,
        train,
        with_notice_grace,
    )

    if config_file is not None:  # the job as a file holds it; the options that are this run's own go with it
        config, batch_given = job_from_file(ctx, config_file, out_dir=out_dir, resume=resume)
        out_dir = Path(config.out_dir)  # (the file's, where --out-dir is not given)
        av, plan, opts = config.availability, config.planning, config.provider.options
        model, trace, provider_name, options = config.model.name, av.trace, config.provider.name, dict(opts)
        market_trace = opts.get("trace") if provider_name == "market" else None
        interval_seconds, device = av.interval_seconds, config.train.device
        global_batch = config.train.global_batch if batch_given else None  # (None: the spec's rows set it)
        try:
            liveput_on = plan.profile is not None and plan.planner == "liveput"  # (as --profile: liveput's only)
            runtime = RuntimeProfile.load(plan.profile) if liveput_on else None
        except ProfileFormatError as exc:
            raise UserError(f"--config {config_file}: planning.profile: {exc}") from None
    else:
        if events is not None and trace is not None:
            raise UserError("give --events or --trace, not both")
        provider_name, options = _provider_options(provider, provider_options, hosts=hosts, coordinator=coordinator,
                                                   slots=slots, python=remote_python, workdir=remote_workdir,
                                                   market=market_trace)  # fmt: skip
        if provider_name == "market":  # the market follows --start-interval and --seed as a replay does
            options = {"start_interval": start_interval, "seed": seed, **options}
            if fleet is None:
                raise UserError("--provider market runs a live fleet: give its size, --fleet N")
        if fleet is not None and (trace is not None or events is not None):
            raise UserError("--fleet trains on what the provider gives: it replays no --trace and no --events "
                            "(the local market follows a trace the job never reads: --market-trace)")  # fmt: skip
        if interval_seconds is None:  # a replay's and the local market's time is compressed; a real fleet's is not
            interval_seconds = 2.0 if fleet is None or provider_name == "market" else DEFAULT_INTERVAL_S
        if events is not None and not events.is_file():
            raise UserError(f"--events: no such file {str(events)!r}")
        if planner not in PLANNERS:
            raise UserError(f"--planner must be one of {', '.join(PLANNERS)}, got {planner!r}")
        runtime = None
        if profile is not None and planner != "liveput":
            warn(f"--profile is used by --planner liveput only; {str(profile)!r} is ignored")
        elif profile is not None:
            try:
                runtime = RuntimeProfile.load(profile)
            except ProfileFormatError as exc:
                raise UserError(f"--profile: {exc}") from None
        # an events file with the rule planner keeps its scripted plans
        planned = planner != "rule" or events is None

        batch_size: dict[str, Any] = {"schedule": schedule, "device": device}
        if global_batch is not None:
            batch_size["global_batch"] = global_batch
        try:
            config = JobConfig(
                out_dir=str(out_dir),
                model=model_config(model, seed=seed,
                                   **json_object_option(model_args, "--model-args", '{"hidden": 512}')),
                # `seed` seeds the initial weights and the data order too
                train=TrainConfig(steps=steps, seed=seed, **batch_size),
                availability=AvailabilityConfig(workers=workers, trace=trace, interval_seconds=interval_seconds,
                                                events_file=None if events is None else str(events),
                                                start_interval=start_interval),
                checkpoint=CheckpointConfig(every=checkpoint_every, keep=keep_checkpoints, resume=resume,
                                            uri=checkpoint_uri),
                control=ControlPlaneConfig(timeout_s=timeout,
                                           hb_timeout_s=DEFAULT_HB_TIMEOUT_S if heartbeat_timeout is None
                                           else heartbeat_timeout, prepare=prepare),
                provider=ProviderConfig(name=provider_name, options=options),
                planning=PlanningConfig(planner=planner if planned else None, look_ahead=look_ahead,
                                        profile=None if profile is None else str(profile), accept_plans=accept_plans),
                fleet=FleetConfig(max_instances=fleet, min_instances=min_instances),
            )  # fmt: skip
            config = with_notice_grace(config)  # (checked against its provider: its name, options, what it runs)
        except ValueError as exc:  # ConfigError, UnknownModelError: a message naming the option
            raise UserError(_config_message(exc)) from None
    if provider_name == "local":  # the workers run here: a device this machine lacks is refused before anything
        try:
            resolve_device(device, 0)
        except DeviceError as exc:
            raise UserError(_config_message(exc)) from None
    try:
        live, forecasts = job_planner(config, profile=runtime)  # (None: an events file's own plans)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    from parcae.progress import TrainProgress, scores_text

    try:  # the spec imports, cuts, feeds and scores before any process starts; it sets the global batch
        config = check_job(config, batch_given=global_batch is not None)
    except SpecError as exc:
        raise UserError(str(exc)) from None
    if runtime is not None:  # the stages are cut as in the profile's job: by the times it measured per layer
        try:
            config, told = profile_cut(config, runtime)
        except ValueError as exc:
            raise UserError(f"--profile: {exc}") from None
        for line in told:
            warn(line)
    if provider_name == "aws":  # boto3 would look for credentials only at the first call, after the job started
        from parcae import settings

        try:
            settings.check_aws(options.get("region"), setting="--provider aws")
        except settings.SettingError as exc:
            raise UserError(str(exc)) from None
    for option, given in (("--trace", trace), ("--market-trace", market_trace)):  # before any process starts
        if given is not None:
            from parcae.cli.traces import load_window

            # a replay's intervals are the planner's (60 s), whatever --interval-seconds compresses them to
            load_window(given, DEFAULT_INTERVAL_S, None, None,
                        interval_fix=f"{option} replays a trace's {DEFAULT_INTERVAL_S:g} s intervals, each in "
                        "--interval-seconds")  # fmt: skip
    if plot is not None:
        check_outputs(None, plot)  # a known image format, a folder that can be made
    check_writable_dir(out_dir, "--out-dir")  # before training, not after it: the report would be lost
    if json_out is not None:
        check_writable(json_out, "--json report")
    from trainer import ObserverList, StepTimeline, score_text

    timeline = StepTimeline()
    try:
        # a live bar on a terminal; piped, one line per reconfiguration (parcae.progress)
        with TrainProgress(stderr()) as progress:
            report = train(config, observer=ObserverList([progress, timeline]), planner=live, json_out=json_out)
    except KeyboardInterrupt:
        _interrupted(config)
    except (EventError, ScheduleError, UnknownModelError, ValueError) as exc:
        raise UserError(str(exc)) from None
    except JobError as exc:
        raise CommandFailed(f"the job failed: {exc}") from None
    except HostsError as exc:
        raise UserError(f"--hosts: {exc}") from None
    out = stdout()
    loss = report["loss"]
    thr = report["throughput"]
    out.print(
        f"{model}: {len(loss)} steps, loss {loss[0]:.4f} -> {loss[-1]:.4f}, {thr['samples_per_s']:.1f} samples/s, "
        f"checksum {report['final_checksum'][:16]}",
        soft_wrap=True,  # one line, whatever the width: scripts grep it
    )
    if report.get("validation"):  # the held-out loss of the final layers (each scored boundary's: --json, MLflow)
        last = report["validation"][-1]
        out.print(f"validation loss {last['loss']:.4f}{scores_text(last.get('metrics'))} after {last['step']} steps "
                  f"({len(report['validation'])} validations)", soft_wrap=True)  # fmt: skip
    if stop := report.get("stopped_early"):  # the held-out scores stopped it (the spec's `Validation.patience`)
        on = ("was not a number" if stop["best_step"] is None else
              f"has not improved on step {stop['best_step']}'s {stop['best']:.4f}")  # fmt: skip
        what = (
            "loss"
            if stop["monitor"] == "loss"
            else f"{stop['monitor']} ({'higher' if stop['mode'] == 'max' else 'lower'} is better)"
        )
        out.print(f"stopped early at step {stop['step']} of {config.steps}: the validation {what} {on} for "
                  f"{stop['patience']} validations (min_delta {stop['min_delta']:g})", soft_wrap=True)  # fmt: skip
    if best := report.get("best_checkpoint"):  # kept by the retention beside the newest
        where = f"parcae export {config.checkpoint.uri or config.checkpoint_dir} --best"
        score = score_text(best["monitor"], best["value"], best["val_loss"])
        out.print(f"best checkpoint: step {best['step']}, {score} ({where})", soft_wrap=True)
    if "loss_scale" in report:  # float16: the steps it skipped (many: a scale or a learning rate to look at)
        scaled = report["loss_scale"]
        out.print(f"loss scale {scaled['final']:g} at the end; {len(scaled['skipped_steps'])} of {len(loss)} steps "
                  "skipped for an overflow", soft_wrap=True)  # fmt: skip
    table = Table(box=None)
    for col in ("step", "kind", "trigger", "strategy", "pause s", "MB moved", "steps lost"):
        table.add_column(col, justify="right" if col not in ("kind",) else "left")
    for r in report["reconfigurations"]:
        strategy = "x".join(str(x) for x in r.get("strategy") or []) or "-"
        pause = "-" if r["pause_s"] is None else f"{r['pause_s']:.3f}"  # (None: it broke before any member was ready)
        table.add_row(str(r.get("step")), r["kind"], str(r.get("trigger")), strategy, pause,
                      f"{r['bytes_moved'] / 1e6:.2f}", str(r["steps_lost"]))  # fmt: skip
    if report["reconfigurations"]:
        out.print(table)
    else:
        out.print("no migrations")
    if live is not None:
        n = len(report["plans"])
        out.print(f"{n} plan{'' if n == 1 else 's'} by {live.name} ({plan_runs(report['plans'])}); forecasts: "
                  f"{forecasts}", soft_wrap=True)  # fmt: skip
    if "fleet_cost" in report:  # a live fleet: what its instances cost
        out.print(fleet_cost_text(report["fleet_cost"]), soft_wrap=True)
    _warn_uncopied(report)
    if json_out:
        out.print(f"wrote {json_out}")
    if plot is not None:
        title = f"{model}: availability, D x P and throughput"
        write_file(
            plot,
            "plot",
            lambda p: timeline.figure(report["reconfigurations"], title, report["plans"]).savefig(p, dpi=110),
        )
        out.print(f"wrote {plot}")


def plan_runs(plans: Sequence[Mapping[str, Any]]) -> str:
    """The plans' decisions, a run of equal ones once with its intervals: "1x2 (1-3), 2x2 (4), 1x2 (5-44)" (a job
    plans every interval: one entry each would make a day's summary a line of a thousand)."""
    runs = [(strategy_text(d), [p["interval"] for p in group])
            for d, group in itertools.groupby(plans, key=lambda p: tuple(p["decision"]))]  # fmt: skip
    return ", ".join(f"{text} ({i[0]}{f'-{i[-1]}' if len(i) > 1 else ''})" for text, i in runs) or "none"


def _warn_uncopied(report: dict[str, Any]) -> None:
    """The job trained, but copies to its --checkpoint-uri failed: say so at the end (not only in the JSON), with
    what the URI lacks and where the local copies are."""
    copies = report.get("checkpoint_uri") or {}
    errors = copies.get("errors") or []
    if not errors:
        return
    shown = "; ".join(errors[:3]) + (f"; and {len(errors) - 3} more" if len(errors) > 3 else "")
    copied = copies.get("uploaded") or "none"
    warn(f"{len(errors)} cop{'y' if len(errors) == 1 else 'ies'} to {copies.get('uri')} failed ({shown}): the URI "
         f"holds the checkpoints of steps {copied}; what it lacks is in --out-dir")  # fmt: skip


#: The options of `parcae train` that go with --config: this run's own, not the job's settings.
WITH_CONFIG: Final = frozenset({"config_file", "out_dir", "resume", "json_out", "plot"})


def job_from_file(ctx: typer.Context, path: Path, *, out_dir: Path, resume: bool) -> tuple[Any, bool]:
    """The `JobConfig` that `path` holds (`trainer.load_job`: JSON, as each job writes it in job.json and its MLflow
    run records it, or TOML with the same sections), with this run's --out-dir (where given, or where the file has
    none) and --resume, and whether the file gives the global batch. An option that is a job setting given beside
    it is refused, naming the field to change in the file instead: a file that the command line silently overrode
    would not be the job that ran."""
    from trainer import load_job

    def given(name: str) -> bool:  # typed on the command line, or from an environment variable
        source = ctx.get_parameter_source(name)  # (typer's own click: its enum is not click's, so by name)
        return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")

    beside = [p for p in ctx.command.params if p.name is not None and p.name not in WITH_CONFIG and given(p.name)]
    if beside:
        fields: dict[str, str] = {}
        for field_path, option in TRAIN_OPTIONS.items():
            fields.setdefault(option, field_path)
        named = ", ".join(f"{p.opts[0]} ({fields[p.opts[0]]})" if p.opts[0] in fields else p.opts[0] for p in beside)
        raise UserError(f"--config {path} holds the job's settings: {named} cannot be given beside it; change them in "
                        "the file, or give every setting as an option without --config")  # fmt: skip
    try:
        return load_job(path, out_dir=out_dir if given("out_dir") else None, resume=resume)
    except ValueError as exc:  # trainer.ConfigError: "<path>: problem"
        raise UserError(f"--config {exc}") from None


#: The `JobConfig` field behind each `parcae train` option, so that a config error names the option to fix.
TRAIN_OPTIONS = {
    "availability.workers": "--workers", "availability.trace": "--trace", "availability.events_file": "--events",
    "availability.interval_seconds": "--interval-seconds", "availability.start_interval": "--start-interval",
    "availability": "--events/--trace", "train.steps": "--steps", "checkpoint.every": "--checkpoint-every",
    "checkpoint.keep": "--keep-checkpoints", "checkpoint.uri": "--checkpoint-uri", "control.timeout_s": "--timeout",
    "control.hb_timeout_s": "--heartbeat-timeout",
    "control.prepare": "--prepare", "planning.look_ahead": "--look-ahead", "out_dir": "--out-dir",
    "fleet.max_instances": "--fleet", "fleet.min_instances": "--min-instances", "fleet": "--fleet",
    "model.name": "--model", "model.args": "--model-args", "model.seed": "--seed", "train.seed": "--seed",
    "train.global_batch": "--global-batch", "train.schedule": "--schedule", "train.device": "--device",
    "checkpoint.resume": "--resume", "planning.planner": "--planner", "planning.profile": "--profile",
    "planning.accept_plans": "--accept-plans", "provider.name": "--provider", "provider.options": "--provider-options",
}  # fmt: skip


def _config_message(exc: Exception) -> str:
    """A `trainer.ConfigError` ("section.field: problem; fix") with the field named as its command-line option."""
    text = str(exc)
    field_name, sep, rest = text.partition(": ")
    if field_name == "provider.options":  # the hosts provider's options are options of the command: --hosts, ...
        if rest.startswith("hosts and coordinator "):
            return "--hosts and --coordinator " + rest.removeprefix("hosts and coordinator ")
        if rest.startswith(("hosts:", "coordinator:", "slots ")):
            return "--" + rest
        return f"--provider-options: {rest}"
    return f"{TRAIN_OPTIONS[field_name]}: {rest}" if sep and field_name in TRAIN_OPTIONS else text


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _interrupted(config: Any) -> NoReturn:
    """Ctrl-C: the workers are stopped (`run_job` lets none outlive it); say in one line where the job stands and
    how to continue it, then exit 130."""
    from trainer import checkpoint, layer_names

    ckpt = config.checkpoint_dir
    try:
        point = checkpoint.latest_intact(Path(ckpt), layer_names(config.model), job=config.job)
        where = (f"the last complete checkpoint is step {point.step} in {ckpt}"
                 if point.step is not None else "no checkpoint was written yet")  # fmt: skip
    except Exception:  # noqa: BLE001 — the one line must come out whatever the folder holds
        where = f"checkpoints are in {ckpt}"
    args = [a for a in sys.argv[1:] if a != "--resume"]
    again = shlex.join(["parcae", *args, "--resume"])
    stderr().print(Text(f"interrupted: the workers are stopped; {where}. Continue with: {again}",
                         style="yellow"), soft_wrap=True)  # fmt: skip
    raise typer.Exit(EXIT_INTERRUPTED)


def _provider_options(name: str | None, raw: str | None, **hosts: Any) -> tuple[str, dict[str, Any]]:
    """The provider (`trainer.providers`) and its options from --provider and --provider-options (a JSON object,
    or @FILE holding one); the --hosts shortcut options make them the hosts provider's."""
    from trainer import PROVIDERS

    market = hosts.pop("market", None)
    shortcut = {k: v for k, v in hosts.items() if v is not None}
    given = hosts.get("hosts") is not None or hosts.get("coordinator") is not None
    name = name or ("hosts" if given else "market" if market is not None else "local")
    if name not in PROVIDERS:
        raise UserError(f"--provider: unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
    options = json_object_option(raw, "--provider-options", '{"region": "us-east-1"}')
    if given:
        if name != "hosts":
            raise UserError(f"--hosts and --coordinator are the hosts provider's options, not {name!r}'s")
        options = {**options, **shortcut}
    if market is not None:
        if name != "market":
            raise UserError(f"--market-trace is the market provider's option, not {name!r}'s")
        options = {**options, "trace": market}
    return name, options


@command("profile")
def profile_cmd(
    workers: Annotated[int, typer.Option(help="Local worker processes; every D x P fitting them is measured.")] = (
        config_default(AvailabilityConfig, "workers")
    ),
    model: ModelOption = DEFAULT_MODEL,
    model_args: ModelArgsOption = None,
    steps_per_strategy: Annotated[int, typer.Option(help="Training steps measured per strategy.")] = 6,
    rounds: Annotated[
        int, typer.Option(help="Visits of every strategy; its iteration time is the fastest visit's.")
    ] = 2,
    out: Annotated[Path, typer.Option("--out", metavar="OUT.json", help="Where to write the profile.")] = Path(
        "profile.json"
    ),
    json_flag: Annotated[bool, typer.Option("--json", help="Print the profile as JSON instead of the tables.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the model and the data order.")] = config_default(
        TrainConfig, "seed"
    ),
    start_method: Annotated[
        str, typer.Option(help="How worker processes start: spawn (cold, as real instances) or forkserver (warm).")
    ] = config_default(ProviderConfig, "start_method"),
    device: DeviceOption = "auto",
) -> None:
    """Measure this machine's trainer: iteration time per D x P and the real migration costs, calibrated into the
    liveput cost model (a profile the planner can use instead of the paper's V100 tables)."""
    import tempfile

    from trainer import (
        DEVICES,
        START_METHODS,
        DeviceError,
        JobError,
        ModelConfig,
        ProfileError,
        ScheduleError,
        SpecError,
        measure,
    )

    if workers < 2:
        raise UserError(
            f"--workers must be >= 2 (an instance must leave and join to measure migrations), got {workers}"
        )
    if steps_per_strategy < 1:
        raise UserError(f"--steps-per-strategy must be >= 1, got {steps_per_strategy}")
    if rounds < 1:
        raise UserError(f"--rounds must be >= 1, got {rounds}")
    args = json_object_option(model_args, "--model-args", '{"hidden": 512}')
    try:
        ModelConfig(model, args=args)
    except ValueError as exc:  # UnknownModelError, ConfigError
        raise UserError(f"--model: {exc}") from None
    if start_method not in START_METHODS:
        raise UserError(f"--start-method must be one of {', '.join(START_METHODS)}, got {start_method!r}")
    if device not in DEVICES:
        raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    check_writable(out, "profile")
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise UserError(f"cannot write profile {str(out)!r}: permission denied")
    from forecasting import jsonio

    shown_args = f" --model-args {shlex.quote(jsonio.dumps_strict(args))}" if args else ""
    command_line = (f"parcae profile --workers {workers} --model {model}{shown_args} "
                    f"--steps-per-strategy {steps_per_strategy} "
                    f"--rounds {rounds} --seed {seed} --start-method {start_method} --device {device} "
                    f"--out {out}")  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="parcae-profile-") as tmp, stderr().status("profiling") as status:
            prof = measure(model, workers, steps_per_strategy=steps_per_strategy, rounds=rounds, seed=seed,
                           model_args=args, out_dir=Path(tmp) / "job", progress=status.update,
                           start_method=start_method, device=device,
                           command=command_line)  # fmt: skip
    except DeviceError as exc:
        raise UserError(_config_message(exc)) from None
    except (ProfileError, ScheduleError, SpecError) as exc:
        raise UserError(str(exc)) from None
    except JobError as exc:
        raise CommandFailed(f"the profiling job failed: {exc}") from None
    write_file(out, "profile", prof.to_json)
    if json_flag:
        typer.echo(prof.to_json(), nl=False)
        stderr().print(f"wrote {out}", soft_wrap=True)
        return
    _print_profile(prof)
    stdout().print(f"wrote {out}", soft_wrap=True)


def _print_profile(prof: Any) -> None:
    """The tables of `parcae profile`: iteration time per strategy, each migration against the model, the constants."""
    from trainer import ProfileFormatError, partition

    out = stdout()
    m = prof.measured
    job, machine = m["job"], m["machine"]
    out.print(f"{job['model']} on {job['workers']} workers ({machine.get('device', 'cpu')}, "
              f"{machine['usable_cores']} cores, {machine['start_method']}): {job['steps']} steps in "
              f"{job['wall_s']:.1f} s, global batch {job['global_batch']}")  # fmt: skip
    thr = prof.throughput
    try:
        layer_ms = prof.stage_costs()
    except ProfileFormatError:
        layer_ms = None
    if layer_ms is not None:  # what the stages were cut by, and the cuts
        total = sum(layer_ms) or 1.0
        stages = sorted({p for _, p in thr.strategies() if p > 1})
        cuts = {p: partition(layer_ms, p) for p in stages}
        table = Table(title="time per layer (one micro-batch): what the stage cut balances", box=box.SIMPLE,
                      title_justify="left")  # fmt: skip
        for col in ("layer", "params", "ms", "share", *(f"stage at P={p}" for p in stages)):
            table.add_column(col, justify="left" if col == "layer" else "right")
        for i, (layer, ms) in enumerate(zip(prof.spec.layers, layer_ms, strict=True)):
            at = [str(bisect.bisect_right(cuts[p], i) - 1) for p in stages]  # the stage whose bounds hold layer i
            table.add_row(layer.name, f"{layer.params:,}", f"{ms:.2f}", f"{ms / total:.0%}", *at)
        out.print(table)
    table = Table(title="iteration time per strategy", box=box.SIMPLE, title_justify="left")
    for col in ("D x P", "iteration ms", "samples/s", "epochs"):
        table.add_column(col, justify="right")
    for d, p in thr.strategies():
        table.add_row(strategy_key((d, p)), f"{thr.iteration_ms[(d, p)]:.1f}", f"{thr.throughput(d, p):.1f}",
                      str(len(m["step_ms"].get(strategy_key((d, p)), []))))  # fmt: skip
    out.print(table)
    table = Table(title="migrations: measured pause vs the calibrated model", box=box.SIMPLE, title_justify="left")
    for col in ("epoch", "kind", "from", "to", "measured ms", "model ms", "fits"):
        table.add_column(col, justify="left" if col in ("kind", "fits") else "right")
    notes = []
    for r in m["fit"]:
        table.add_row(str(r["epoch"]), r["kind"], strategy_key(r["from"]), strategy_key(r["to"]),
                      f"{r['measured_ms']:.0f}", f"{r['model_ms']:.0f}", r["used_for"] or "-")  # fmt: skip
        if r["note"]:
            notes.append(f"epoch {r['epoch']}: {r['note']}")
    out.print(table)
    for line in notes:
        out.print(f"  {line}", soft_wrap=True)
    c = m["calibration"]["constants"]
    src = m["calibration"]["sources"]
    table = Table(title="calibrated constants (liveput CostConstants)", box=box.SIMPLE, title_justify="left")
    table.add_column("constant")
    table.add_column("value", justify="right")
    table.add_column("source")
    rows = [("group_base_ms", f"{c['group_base_ms']:.1f}", src["group_base_ms"]),
            ("group_remove_ms", f"{c['group_remove_ms']:.2f} / group", src["group_remove_ms"]),
            ("p2p", f"{c['p2p_latency_ms']:.1f} ms + {c['p2p_mib_per_s'] or math.inf:.0f} MiB/s", src["p2p"]),
            ("rendezvous_ms", f"{c['rendezvous_ms']:.0f}", src["rendezvous_ms"]),
            ("checkpoint_ms", f"{c['checkpoint_ms']:.0f}", src["checkpoint_ms"])]  # fmt: skip
    rows += [(f"build_ms[{p}]", f"{v:.1f}", src["build_ms"][p]) for p, v in c["build_ms"].items()]
    for row in rows:
        table.add_row(*row)
    out.print(table)
    prep = m["prepared"]
    table = Table(title="lead time and downtime per kind (median ms): the same schedule, nothing prepared vs "
                  "prepared in the background", box=box.SIMPLE, title_justify="left")  # fmt: skip
    for name in ("kind", "n", "prepared", "full", "down", "lead", "model down", "model lead"):
        table.add_column(name, justify="left" if name == "kind" else "right")
    for kind, k in prep["kinds"].items():
        table.add_row(
            kind,
            str(k["count"]),
            str(k["prepared"]),
            *(f"{k[f]:.0f}" for f in ("full_ms", "down_ms", "lead_ms", "model_down_ms", "model_lead_ms")),
        )
    out.print(table)
    slowdown = prep["slowdown"]
    shown = f"{slowdown:.3f} ({prep['slowdown_source']})" if slowdown is not None else prep["slowdown_source"]
    out.print(f"old strategy's slowdown while a preparation runs: {shown}", soft_wrap=True)


@command("export")
def export_cmd(
    directory: Annotated[
        str,
        typer.Argument(
            metavar="DIR|URI",
            help="A job's checkpoints/ or layers/ folder, or its --checkpoint-uri (s3://bucket/prefix, "
            "file:///path); its newest intact checkpoint unless --step or --best.",
        ),
    ],
    out: Annotated[Path, typer.Option("--out", metavar="MODEL.pt|MODEL.safetensors", help="Where to write.")] = Path(
        "model.pt"
    ),
    step: Annotated[int | None, typer.Option(min=0, help="Export this step's checkpoint, not the newest.")] = None,
    best: Annotated[
        bool,
        typer.Option(
            "--best",
            help="Export the checkpoint with the best held-out score (a job whose spec validates: the "
            "lowest loss, or its validation's monitor).",
        ),
    ] = False,
) -> None:
    """Write a checkpoint's parameters as one state dict keyed "<layer name>.<parameter>", to load into a module of
    the spec's layers outside parcae (the optimiser state stays in parcae's checkpoints)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from trainer import SpecError, checkpoint, export_from_uri, export_state_dict, score_text, write_state_dict

    if out.suffix not in (".pt", ".safetensors"):
        raise UserError(f"--out: {str(out)!r} must end in .pt or .safetensors")
    if best and step is not None:
        raise UserError("--best and --step: give one of them (the best-scored checkpoint, or a step's)")
    check_writable(out, "--out")
    uri = "://" in directory  # (which schemes a checkpoint URI may have is `mirror_for`'s to say)
    try:
        exported = export_from_uri(directory, step, best=best) if uri else export_state_dict(directory, step, best=best)
    except (checkpoint.CheckpointError, SpecError) as exc:
        raise UserError(str(exc)) from None
    except (BotoCoreError, ClientError, OSError, ValueError) as exc:  # (a URI's MirrorError is a ValueError)
        raise UserError(f"{directory}: cannot read the checkpoint there: {type(exc).__name__}: {exc}") from None
    try:
        write_state_dict(exported.state, out)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    n = sum(t.numel() for t in exported.state.values())
    held = exported.held_out
    val = "" if held is None else f", {score_text(held.monitor.name, held.value, held.loss)}"
    stdout().print(f"wrote {out}: {len(exported.state)} tensors, {n:,} parameters of {exported.model} (job "
                   f"{exported.job!r}, step {exported.step}{val})", soft_wrap=True)  # fmt: skip
