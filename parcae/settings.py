"""Fail-fast checks of configuration: a setting that cannot work is refused before any work starts.

Owns: the checks a flow runs at its start and `make serve` runs before deploying (``python -m parcae.settings``),
each turning a mistake into a `SettingError` whose message names the setting and the fix. Must not touch: the
work itself (loading traces, training, logging); a check only asks whether the work *could* start.

What is checked, and why here rather than where it would fail:

- a trace name (``trace``, ``eval_trace``, ...): unknown names would fail minutes later, inside a job or after a
  forecaster's training, with the list of known names lost in a traceback;
- the MLflow tracking store (``MLFLOW_TRACKING_URI``): MLflow retries an unreachable server for minutes, and a
  job that trains for an hour before finding out has wasted the hour (`tracking.check_reachable`);
- AWS credentials when ``provider="aws"``: boto3 looks for them only at the first call
  (`trainer.providers.aws.check_credentials`);
- the schedules of ``prefect.yaml``, with Prefect's own schedule models, before `prefect deploy` (which would read
  a zero interval as "Unknown schedule type") and with every problem of the file in one message;
- names with a fixed set of values (``model``, ``planner``, ``provider``) and a job folder that does not fit the
  request (``out_dir``: a finished job run again, an earlier job overwritten, a resume logging to another store);
- every flow's parameters (`FLOW_PARAMETERS`: names, counts and ranges): each flow checks its arguments with
  `flow_checks` at its start, and `check_deployments` checks each deployment's ``parameters`` with the same table,
  so a deployment that could not run is refused before `prefect deploy`, not at its first run. A parameter that
  becomes a field of the job's `JobConfig` (``workers``, ``steps``, ``look_ahead``, ...) is checked as the config
  checks it (`_job_field`): its range has one definition, the config's.

`check_all` runs several checks and raises one `SettingError` listing every problem, so a user fixes them in one
go. Prefect is imported only by the ``prefect.yaml`` checks (this package is not a domain package, but the
trainer's command line should not pay Prefect's import for a trace check).
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from liveput import shown

if TYPE_CHECKING:
    from trainer import JobConfig

__all__ = [
    "FLOW_NEEDS",
    "FLOW_PARAMETERS",
    "PLANNERS",  # noqa: F822 — served by the module's __getattr__ (importing the trainer loads torch)
    "SettingError",
    "check_all",
    "check_aws",
    "check_aws_setup",
    "check_count",
    "check_deployments",
    "check_interval",
    "check_look_ahead",
    "check_arguments",
    "check_model",
    "check_spec",
    "check_plan_model",
    "check_planner",
    "check_provider",
    "check_seconds",
    "check_resume",
    "check_schedule",
    "check_trace",
    "unrunnable_here",
    "check_tracking",
    "flow_checks",
    "main",
]

#: Deployment parameters that name a trace (checked against the known traces).
TRACE_PARAMETERS = ("trace", "eval_trace")


class SettingError(ValueError):
    """A configuration value that cannot work. ``problems``: one "<setting>: <problem>; <fix>" line each."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f"{len(self.problems)} configuration problems:\n" + "\n".join(f"- {p}" for p in self.problems)
        super().__init__(text)

    def __reduce__(
        self,
    ) -> tuple[type[SettingError], tuple[list[str]]]:  # picklable (Prefect persists failed states; multiprocessing)
        return (type(self), (self.problems,))


@dataclass(frozen=True)
class _Problem:
    setting: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.setting}: {self.problem}; {self.fix}"


_repr = functools.partial(shown, as_json=False)  # a value in a message as Python shows it, at most 60 characters


def _fail(setting: str, problem: str, fix: str) -> SettingError:
    return SettingError(str(_Problem(setting, problem, fix)))


# ------------------------------------------------------------------------------------------------ traces


def check_trace(trace: str | os.PathLike[str], *, setting: str = "trace") -> str:
    """The trace's display name if ``trace`` is a known trace name, an existing trace file or a live fleet's history
    in the trace store (``fleet:<job tag>``, recorded at 60 s), else SettingError listing the known names (bundled
    ones, plus ``$PARCAE_SHARED_TRACES`` when present) or the fleets in the store."""
    from forecasting import FLEET, FleetIntervalError, available_traces, load_trace

    if not isinstance(trace, (str, os.PathLike)) or not str(trace):
        raise _fail(setting, f"expected a trace name or file, got {trace!r}", "give a name from `parcae traces`")
    if isinstance(trace, str) and trace.startswith(FLEET):  # a live fleet's history: is it in the trace store?
        try:
            load_trace(trace)
        except FleetIntervalError as exc:  # a replay's intervals are 60 s (a count per interval is not cut)
            raise _fail(setting, str(exc), "replay a fleet's history recorded at 60 s") from None
        except (LookupError, OSError, ValueError) as exc:
            raise _fail(setting, str(exc), "`parcae traces` lists the fleets in the trace store") from None
        return trace
    known = available_traces()
    if isinstance(trace, str) and trace in known:
        return trace
    path = Path(trace)
    if path.is_file():
        return path.stem
    names = sorted(known)
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
    raise _fail(
        setting,
        f"unknown trace {str(trace)!r} (not a known trace name and not an existing file)",
        f"use one of: {shown or '(none)'}; or a path to a trace file (`parcae traces` lists them)",
    )


# ------------------------------------------------------------------------------------------------ MLflow


def check_tracking(uri: str | None = None, *, setting: str = "MLFLOW_TRACKING_URI", timeout: float = 5.0) -> str:
    """The tracking URI (``uri``, else the one `tracking` would use) once one request to it succeeded."""
    import tracking

    resolved = uri or tracking.tracking_uri()
    try:
        tracking.check_reachable(resolved, timeout=timeout)
    except tracking.TrackingError as exc:
        # TrackingError's message already says what failed and how to fix it; prefix the setting's name
        raise SettingError(f"{setting}: {exc}") from None
    return resolved


# ------------------------------------------------------------------------------------------------ providers


def check_provider(provider: str, *, setting: str = "provider") -> str:
    """A provider name of the registry (`trainer.providers.PROVIDERS`)."""
    from trainer import PROVIDERS

    if provider not in PROVIDERS:
        raise _fail(setting, f"unknown provider {provider!r}", f"choose one of {', '.join(PROVIDERS)}")
    return provider


def check_model(model: str, *, setting: str = "model") -> str:
    """A trainer model: a registered name (`trainer.MODELS`), an installed ``parcae.models`` entry point, or
    ``module:function`` (whose spec `check_spec` loads and checks before the job starts)."""
    from trainer import MODELS, ModelConfig, UnknownModelError

    try:
        ModelConfig(model)
    except UnknownModelError:
        raise _fail(setting, f"unknown trainer model {model!r}", f"choose one of {', '.join(sorted(MODELS))}, or "
                    "give module:function returning a parcae.TrainSpec") from None  # fmt: skip
    return model


def check_job_file(path: str | os.PathLike[str], *, setting: str = "config_file") -> str:
    """A job's settings file (`trainer.load_job`: a `JobConfig` as JSON or TOML) that reads and checks."""
    from trainer import load_job

    try:
        load_job(path)
    except ValueError as exc:  # trainer.ConfigError: "<path>: problem; fix"
        raise SettingError(f"{setting}: {exc}") from None
    return str(path)


def check_arguments(value: Any, *, setting: str = "model_args") -> dict[str, Any]:
    """Keyword arguments given as an object of names to plain JSON values."""
    from forecasting import jsonio

    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise _fail(setting, f"must be an object of argument names to values, got {value!r}",
                    'give e.g. {"hidden": 512}')  # fmt: skip
    try:
        jsonio.dumps_strict(dict(value))
    except (TypeError, ValueError) as exc:
        raise _fail(setting, f"must be plain JSON data ({exc})", "give numbers, strings, lists and objects") from None
    return dict(value)


def check_spec(config: JobConfig, *, setting: str = "model", batch_given: bool = False) -> JobConfig:
    """The job's training spec imported and checked (`trainer.check_job`) before any process starts; returns the
    `JobConfig` with the global batch the spec's batch() gives (unless `batch_given`: the job's own)."""
    from trainer import SpecError, check_job

    try:
        return check_job(config, batch_given=batch_given)
    except SpecError as exc:
        raise SettingError(f"{setting}: {exc}") from None


def _planners() -> tuple[str, ...]:
    """The live planners a training job can run with: `trainer.control.planning.PLANNERS`, the train flow's default
    (liveput) first. Read on first use (``settings.PLANNERS``), since importing the trainer loads torch."""
    from trainer import PLANNERS

    return ("liveput", *(p for p in PLANNERS if p != "liveput"))


def __getattr__(name: str) -> Any:
    if name == "PLANNERS":
        return _planners()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_planner(planner: str, *, setting: str = "planner") -> str:
    planners = _planners()
    if planner not in planners:
        raise _fail(setting, f"unknown planner {planner!r}", f"choose one of {', '.join(planners)}")
    return planner


def check_plan_model(model: str, *, setting: str = "model") -> str:
    """A model the liveput planner has a bundled throughput table of (`liveput.throughput.profile_names`)."""
    from liveput import profile_names

    if model not in profile_names():
        raise _fail(setting, f"unknown planning model {model!r}", f"choose one of {', '.join(profile_names())}, "
                    "or give a runtime profile (`parcae profile`) of the job's model")  # fmt: skip
    return model


# ------------------------------------------------------------------------------------------------ numbers


def check_count(value: Any, *, setting: str, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer in ``[minimum, maximum]`` (a bool is not one)."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        want = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum:,}"
        raise _fail(setting, f"expected {want}, got {_repr(value)}", f"set it to {want}")
    return value


def check_seconds(value: Any, *, setting: str, low: float = 0.0, high: float = math.inf) -> float:
    """A finite number of seconds in ``(low, high]`` (``[low, high]`` when ``low`` > 0)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        ok = number and math.isfinite(value) and (value >= low if low > 0 else value > 0) and value <= high
    except OverflowError:  # an integer too large for a float
        ok = False
    if not ok:
        bounded = low > 0 or high < math.inf
        want = f"a number of seconds in [{low:g}, {high:g}]" if bounded else "a number of seconds > 0"
        raise _fail(setting, f"expected {want}, got {_repr(value)}", f"set it to {want}")
    return float(value)


def check_look_ahead(value: Any, *, setting: str = "look_ahead") -> int:
    """A look-ahead K the planner takes: 1 to `liveput.MAX_LOOK_AHEAD` intervals."""
    from liveput import MAX_LOOK_AHEAD

    return check_count(value, setting=setting, maximum=MAX_LOOK_AHEAD)


def check_interval(value: Any, *, setting: str = "interval_s") -> float:
    """An interval T (seconds) in `forecasting.traces.INTERVAL_S_RANGE`."""
    from liveput import INTERVAL_S_RANGE

    return check_seconds(value, setting=setting, low=INTERVAL_S_RANGE[0], high=INTERVAL_S_RANGE[1])


def _optional(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check``, letting None (the flow's "default") through."""

    @functools.wraps(check)
    def optional(value: Any, *, setting: str) -> Any:
        return None if value is None else check(value, setting=setting)

    return optional


def _each(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check`` on every item of a list (None: the flow's default)."""

    def each(values: Any, *, setting: str) -> Any:
        if values is None:
            return None
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise _fail(setting, f"expected a list, got {_repr(values)}", "give a list, or null for the default")
        check_all(*(functools.partial(check, v, setting=f"{setting}[{i}]") for i, v in enumerate(values)))
        return values

    return each


def _instances(value: Any, *, setting: str) -> int:
    from liveput import MAX_INSTANCES

    return check_count(value, setting=setting, maximum=MAX_INSTANCES)


def _job_field(path: str) -> Callable[..., Any]:
    """The check of a flow parameter that becomes the job's `JobConfig` field ``path`` (``section.field``): the
    section built with the value, so that the range is the config's own (one definition), and the message names
    the flow's parameter. None passes where the field takes it (the flow's "none")."""
    section, _, name = path.partition(".")

    def check(value: Any, *, setting: str) -> Any:
        import trainer  # the configs are plain dataclasses: no torch

        kind = {"train": trainer.TrainConfig, "availability": trainer.AvailabilityConfig,
                "checkpoint": trainer.CheckpointConfig, "control": trainer.ControlPlaneConfig,
                "planning": trainer.PlanningConfig, "fleet": trainer.FleetConfig}[section]  # fmt: skip
        try:
            kind(**{name: value})
        except ValueError as exc:  # trainer.ConfigError: "section.field: problem; fix"
            problem, _, fix = str(exc).partition(": ")[2].partition("; ")
            raise _fail(setting, problem, fix or f"fix {path}") from None
        return value

    return check


_non_negative = functools.partial(check_count, minimum=0)

#: The parameters of the flows that train (train, pipeline) that are `JobConfig` fields, checked as the config
#: checks them.
_JOB_FIELDS: dict[str, Callable[..., Any]] = {
    "workers": _job_field("availability.workers"), "steps": _job_field("train.steps"),
    "interval_seconds": _job_field("availability.interval_seconds"),
    "step_seconds": _job_field("availability.step_seconds"),
    "start_interval": _job_field("availability.start_interval"), "checkpoint_every": _job_field("checkpoint.every"),
}  # fmt: skip

#: What each flow's parameters must be, by Prefect flow name: the checks that need nothing running (names, counts,
#: ranges). A flow runs them on its arguments at its start (`flow_checks`); `check_deployments` runs them on each
#: deployment's ``parameters`` (over the flow's defaults) before `prefect deploy`. Checks that need the world (the
#: tracking store, AWS credentials, the job folder) stay in the flows.
FLOW_PARAMETERS: dict[str, dict[str, Callable[..., Any]]] = {
    "train": {
        "config_file": _optional(check_job_file), "model": check_model, "model_args": _optional(check_arguments),
        "trace": check_trace, "planner": check_planner, "provider": check_provider, **_JOB_FIELDS,
        "look_ahead": _job_field("planning.look_ahead"), "timeout_s": _job_field("control.timeout_s"),
        "fleet": _job_field("fleet.max_instances"), "min_instances": _job_field("fleet.min_instances"),
        "device": _job_field("train.device"),
    },
    "pipeline": {
        "trace": check_trace, "train_traces": _each(check_trace), "horizon": _job_field("planning.look_ahead"),
        "model": check_model, **_JOB_FIELDS,
    },
    "plan-interval": {
        "model": check_plan_model, "trace": check_trace, "at_interval": _optional(_non_negative),
        "look_ahead": check_look_ahead, "interval_s": check_interval, "capacity": _optional(_instances),
    },
    "retrain-forecaster": {
        "eval_trace": check_trace, "train_traces": _each(check_trace), "horizon": check_look_ahead,
        "interval_s": check_interval,
    },
    "collect-traces": {"price_hours": check_seconds, "target_capacity": _instances},
}  # fmt: skip


def check_aws_setup(regions: Sequence[str] | None = None, *, setting: str = "regions") -> None:
    """The trace collector finds a region (``regions`` or the profile's) and credentials on this machine, read
    locally (no call to AWS; `forecasting.SpotCollector.check_setup`), else SettingError: what collect-traces needs
    from where it runs."""
    from botocore.exceptions import BotoCoreError

    from forecasting import CollectError, SpotCollector

    try:
        SpotCollector(regions=regions).check_setup()
    except BotoCoreError as exc:  # boto3.Session() itself: a profile that does not exist
        raise _fail(setting, f"AWS is not configured here ({exc})", "fix AWS_PROFILE or ~/.aws/config") from None
    except CollectError as exc:  # "<problem>. Fix: <fix>"
        problem, _, fix = str(exc).partition(". Fix: ")
        raise _fail(setting, problem, fix or "configure AWS for the worker that runs it") from None


#: What each flow needs from the machine it runs on, beyond valid parameters (by Prefect flow name; each takes the
#: flow's arguments). A deployment whose flow lacks it here can still be deployed — another worker may have it —
#: but `make serve` deploys it paused, saying why (`unrunnable_here`), instead of letting it fail every run.
FLOW_NEEDS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "collect-traces": lambda args: check_aws_setup(args.get("regions"), setting="regions"),
}


def flow_checks(flow: str, parameters: Mapping[str, Any], *, where: str = "") -> list[Callable[[], Any]]:
    """The zero-argument checks (for `check_all`) of the ``parameters`` of Prefect flow ``flow`` that
    `FLOW_PARAMETERS` knows; ``where`` prefixes each setting's name (``"prefect.yaml: deployment 'x'.parameters."``).

    plan-interval's ``model`` is left to the flow when it has a runtime ``profile``: the profile names its model.
    """
    table = FLOW_PARAMETERS[flow]
    skip = {"model"} if flow == "plan-interval" and parameters.get("profile") is not None else set()
    return [
        functools.partial(check, parameters[name], setting=f"{where}{name}")
        for name, check in table.items()
        if name in parameters and name not in skip
    ]


def check_resume(
    out_dir: str | os.PathLike[str],
    resume: bool,
    previous: Mapping[str, Any] | None,
    uri: str,
    *,
    setting: str = "out_dir",
) -> None:
    """The job folder fits the request: a finished job is not re-run, a job is not silently overwritten, and a
    resumed job logs to the MLflow store its run is in. ``previous``: what the folder's run file says (run_id,
    tracking_uri, status), or None."""
    out = Path(out_dir)
    if previous is not None and previous.get("status") == "FINISHED":
        raise _fail(
            setting,
            f"{str(out)!r} holds a finished job (MLflow run {previous.get('run_id')})",
            "give a fresh out_dir, or delete that folder to train again",
        )
    if not resume:
        used = [d.name for d in (out / "checkpoints", out / "layers") if d.is_dir() and any(d.iterdir())]
        if used:
            raise _fail(
                setting,
                f"{str(out)!r} holds an earlier job's {' and '.join(used)}",
                "set resume=True to continue that job from its latest checkpoint, or give a fresh out_dir",
            )
    elif previous is not None and previous.get("tracking_uri") not in (None, uri):
        raise _fail(
            "MLFLOW_TRACKING_URI",
            f"the job in {str(out)!r} is tracked by MLflow run {previous.get('run_id')} in "
            f"{previous.get('tracking_uri')!r}, but the store now is {uri!r}",
            f"set MLFLOW_TRACKING_URI={previous.get('tracking_uri')} to resume it into the same run, or give a "
            "fresh out_dir",
        )


def check_aws(region: str | None = None, *, session: Any = None, setting: str = "provider='aws'") -> None:
    """AWS credentials (and a region) are available to boto3 (`trainer.providers.aws.check_credentials`), else
    SettingError."""
    try:
        from trainer import check_aws_credentials as check_credentials
    except ImportError as exc:  # the AWS provider is not part of this build
        raise _fail(setting, f"the AWS provider is not available ({exc})", "use provider='local'") from None
    try:
        check_credentials(session=session, region=region)
    except Exception as exc:  # its own error type names what is missing; keep the message, name the setting
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise _fail(
            setting,
            f"AWS credentials are not usable ({text})",
            "configure them (`aws configure`, AWS_PROFILE, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and "
            "AWS_DEFAULT_REGION), or use provider='local'",
        ) from None


# ------------------------------------------------------------------------------------------------ prefect.yaml


def _validation_text(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return "; ".join(str(e.get("msg", e)).removeprefix("Value error, ") for e in errors())
        except Exception:  # noqa: BLE001 - fall back to the plain message
            pass
    return " ".join(str(exc).split())


_SCHEDULE_FIX = {
    "cron": 'a cron has 5 fields, minute hour day month weekday (e.g. "0 * * * *" for hourly)',
    "interval": "an interval is a number of seconds > 0 (e.g. 600)",
    "rrule": 'an rrule is an RFC 5545 rule (e.g. "FREQ=HOURLY;INTERVAL=2")',
}


def check_schedule(spec: Any, *, where: str) -> None:
    """One entry of a deployment's ``schedules`` parses as Prefect 3.9 would deploy it: a cron (croniter, via
    Prefect's ``CronSchedule``), an interval > 0 seconds or an rrule, with a known IANA timezone."""
    from datetime import timedelta

    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule, RRuleSchedule

    if not isinstance(spec, Mapping):
        raise _fail(where, f"a schedule must be a mapping, got {spec!r}", 'write e.g. `- cron: "0 * * * *"`')
    kinds = [k for k in ("cron", "interval", "rrule") if k in spec]
    if len(kinds) != 1:
        raise _fail(
            where,
            f"a schedule needs exactly one of cron, interval, rrule (got {', '.join(kinds) or 'none'})",
            'write e.g. `cron: "0 * * * *"` or `interval: 600` (seconds)',
        )
    kind = kinds[0]
    tz = spec.get("timezone")
    try:
        if kind == "cron":
            kw = {"cron": spec["cron"], "timezone": tz, "day_or": spec.get("day_or")}
            CronSchedule(**{k: v for k, v in kw.items() if v is not None})
        elif kind == "interval":
            raw = spec["interval"]
            if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
                raise ValueError(f"interval must be a number of seconds, got {raw!r}")
            if isinstance(raw, (int, float)) and not raw > 0:
                # Prefect 3.9 reads a zero interval as "Unknown schedule type"; say what is wrong instead
                raise ValueError(f"interval must be > 0 seconds, got {raw!r}")
            interval = timedelta(seconds=raw) if isinstance(raw, (int, float)) else raw
            interval_kw: dict[str, Any] = {"interval": interval, "timezone": tz}
            IntervalSchedule(**{k: v for k, v in interval_kw.items() if v is not None})
        else:
            RRuleSchedule(**{k: v for k, v in {"rrule": spec["rrule"], "timezone": tz}.items() if v is not None})
    except Exception as exc:  # pydantic ValidationError, ValueError, OverflowError
        raise _fail(
            f"{where}.{kind}",
            f"{spec[kind]!r}{f' (timezone {tz!r})' if tz else ''} does not parse: {_validation_text(exc)}",
            _SCHEDULE_FIX[kind] + "; a timezone is an IANA name such as UTC or Europe/Paris",
        ) from None


def _read_yaml(file: Path) -> Any:
    """The parsed YAML of ``file``; every way it can fail (unreadable, not UTF-8, not YAML, nested past the
    parser's recursion) a SettingError naming the file."""
    import yaml

    try:
        data = file.read_bytes()
    except OSError as exc:
        raise _fail(str(file), f"cannot read it ({exc.strerror or exc})", "run from the project root") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _fail(str(file), f"is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line})",
                    "save it as UTF-8 YAML (is it the right file?)") from None  # fmt: skip
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _fail(str(file), f"is not valid YAML ({' '.join(str(exc).split())[:300]})", "fix the syntax") from None
    except RecursionError:
        fix = "flatten it (a prefect.yaml nests a few levels)"
        raise _fail(str(file), "is nested too deeply to parse", fix) from None


def check_deployments(path: str | os.PathLike[str] = "prefect.yaml", *, load_flows: bool = True) -> list[str]:
    """Check every deployment of a ``prefect.yaml``; returns their ``<flow file>:<name>`` labels.

    Per deployment: the schedules parse (`check_schedule`) and, with ``load_flows``, the entrypoint loads, its
    ``parameters`` validate against the flow's signature and pass the flow's own checks (`FLOW_PARAMETERS`, over
    the flow's defaults); without ``load_flows``, trace parameters name known traces.
    Raises one SettingError listing every problem found.
    """
    file = Path(path)
    doc = _read_yaml(file)
    deployments = (doc or {}).get("deployments") if isinstance(doc, Mapping) else None
    if not isinstance(deployments, list) or not deployments:
        raise _fail(str(file), "has no `deployments:` list", "declare each deployment under `deployments:`")
    problems: list[str] = []
    labels: list[str] = []
    for i, dep in enumerate(deployments):
        name = dep.get("name", f"#{i}") if isinstance(dep, Mapping) else f"#{i}"
        where = f"{file.name}: deployment {name!r}"
        if not isinstance(dep, Mapping):
            problems.append(f"{where}: must be a mapping")
            continue
        entrypoint = str(dep.get("entrypoint", ""))
        labels.append(f"{entrypoint}:{name}")
        schedules = dep.get("schedules") or []
        if not isinstance(schedules, list):
            problems.append(f"{where}.schedules: must be a list; write `schedules: [{{interval: 600}}]` or omit it")
            schedules = []
        for j, spec in enumerate(schedules):
            try:
                check_schedule(spec, where=f"{where}.schedules[{j}]")
            except SettingError as exc:
                problems.extend(exc.problems)
        params = dep.get("parameters") or {}
        for key in () if load_flows else TRACE_PARAMETERS:  # with the flows, FLOW_PARAMETERS checks the traces
            if isinstance(params, Mapping) and params.get(key) is not None:
                try:
                    check_trace(params[key], setting=f"{where}.parameters.{key}")
                except SettingError as exc:
                    problems.extend(exc.problems)
        if load_flows:
            problems.extend(_check_entrypoint(file.parent, entrypoint, params, where))
    if problems:
        raise SettingError(problems)
    return labels


def unrunnable_here(path: str | os.PathLike[str] = "prefect.yaml") -> dict[str, str]:
    """The deployments of a (checked) ``prefect.yaml`` whose flow lacks what it needs on this machine
    (`FLOW_NEEDS`), as ``"<flow>/<deployment>"`` -> why."""
    from prefect.flows import Flow, load_flow_from_entrypoint

    file = Path(path)
    out: dict[str, str] = {}
    for dep in (_read_yaml(file) or {}).get("deployments") or []:
        script, _, fn = str(dep.get("entrypoint", "")).partition(":")
        flow: Flow[..., Any] = load_flow_from_entrypoint(f"{file.parent / script}:{fn}")
        need = FLOW_NEEDS.get(flow.name)
        if need is None:
            continue
        defaults = {k: p.default for k, p in inspect.signature(flow.fn).parameters.items() if p.default is not p.empty}
        try:
            need({**defaults, **(dep.get("parameters") or {})})
        except SettingError as exc:
            out[f"{flow.name}/{dep['name']}"] = "; ".join(exc.problems)
    return out


def _check_entrypoint(root: Path, entrypoint: str, params: Any, where: str) -> list[str]:
    from prefect.flows import Flow, load_flow_from_entrypoint

    path, _, fn = entrypoint.partition(":")
    if not fn or not (root / path).is_file():
        return [f"{where}.entrypoint: {entrypoint!r} is not <file.py>:<flow function> of an existing file; fix it"]
    try:
        flow: Flow[..., Any] = load_flow_from_entrypoint(f"{root / path}:{fn}")
    except Exception as exc:  # noqa: BLE001 - any import error is the user's to see
        return [f"{where}.entrypoint: {entrypoint!r} does not load ({type(exc).__name__}: {exc}); fix the flow"]
    try:
        validated = flow.validate_parameters(dict(params or {}))
    except Exception as exc:  # noqa: BLE001 - ParameterTypeError / SignatureMismatchError
        return [f"{where}.parameters: {' '.join(str(exc).split())}; use the flow's parameter names and types"]
    if flow.name not in FLOW_PARAMETERS:
        return []
    defaults = {k: p.default for k, p in inspect.signature(flow.fn).parameters.items() if p.default is not p.empty}
    arguments = {**defaults, **validated}
    try:
        check_all(*flow_checks(flow.name, arguments, where=f"{where}.parameters."))
    except SettingError as exc:
        return exc.problems
    # a flow that runs a training job builds its `JobConfig` from its arguments (`job_config` beside the flow):
    # build it here too, so that what only the config checks (a provider's options, ...) fails before the deploy
    build = getattr(sys.modules.get(flow.fn.__module__), "job_config", None)
    if callable(build):
        try:
            build(arguments)
        except ValueError as exc:  # trainer.ConfigError: "section.field: problem; fix"
            return [f"{where}.parameters: {exc}"]
    return []


# ------------------------------------------------------------------------------------------------ together


def check_all(*checks: Callable[[], Any]) -> None:
    """Run every check (zero-argument callables) and raise one SettingError with all their problems."""
    problems: list[str] = []
    for check in checks:
        try:
            check()
        except SettingError as exc:
            problems.extend(exc.problems)
    if problems:
        raise SettingError(problems)


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m parcae.settings [prefect.yaml]``: the deployments and the tracking store, before `make serve`.

    Prints ``error: <problem>`` lines and returns 2 when anything is wrong, 0 otherwise.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    path = args[0] if args else "prefect.yaml"
    labels: list[str] = []

    def deployments() -> None:
        labels.extend(check_deployments(path))

    try:
        check_all(deployments, check_tracking)
    except SettingError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"{path}: {len(labels)} deployments OK; MLflow store reachable")
    for name, why in unrunnable_here(path).items():
        print(f"note: {name} cannot run on this machine ({why}): `make serve` deploys it paused (resume it in the "
              "Prefect UI once fixed)")  # fmt: skip
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
