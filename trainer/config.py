"""Configuration of a training job: one frozen dataclass per component, defaults in one place.

Owns: `JobConfig` — the one object that carries a job's settings end to end (built once by the command line or a
flow, validated on construction, passed down unchanged to the driver and the coordinator, written as `job.json`
and recorded by MLflow) — and its sections: `ModelConfig` (what network is trained), `TrainConfig` (how: batch,
optimiser, seed, steps), `AvailabilityConfig`, `CheckpointConfig`, `ControlPlaneConfig`, `ProviderConfig`,
`PlanningConfig`, `FleetConfig` (a live fleet: the provider, not a trace, decides what exists); the registry of
known model shapes. Must not touch: torch, processes, files — configs cross
process boundaries (pickled to spawned workers, stored in checkpoints as plain dicts), so they stay plain data.

Neither the model nor the training config changes at a migration: the global batch, micro-batch size and seed are
fixed for the whole job, which is what makes every D x P strategy compute the same training run
(`trainer.runtime.pipeline`). A bad value raises `ConfigError` naming the field (`section.field`) and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from liveput import DEFAULT_LOOK_AHEAD, MAX_INSTANCES, MAX_LOOK_AHEAD


class UnknownModelError(ValueError):
    """A model name that is neither registered (`MODELS`, a ``parcae.models`` entry point) nor ``module:function``."""


@dataclass(frozen=True)
class ModelEntry:
    """A registered model: the ``module:function`` that returns its `trainer.runtime.trainspec.TrainSpec` (the
    contract a user's own model is written against) and the args its `ModelConfig` starts from."""

    entry: str
    args: Mapping[str, Any]


#: The registry of models, by name. "tiny-gpt" is the CPU demo network (~0.2 M parameters, 6 layers in all);
#: "small-gpt" is a larger one for benchmarks that want stages with visible compute. Both are specs written against
#: the public contract (`trainer/examples/gpt.py`). Installed packages add names through the ``parcae.models``
#: entry-point group; any ``module:function`` path works without registering.
MODELS: dict[str, ModelEntry] = {}


def register_model(name: str, entry: str, **args: Any) -> ModelEntry:
    """Register model `name`: the ``module:function`` returning its spec (imported when a job uses it) and its
    default args."""
    if name in MODELS:
        raise ValueError(f"model {name!r} is registered already")
    if ":" in name or ":" not in entry:
        raise ValueError(f"register_model({name!r}, {entry!r}): the name has no ':', the entry is module:function")
    MODELS[name] = ModelEntry(entry, dict(args))
    return MODELS[name]


def model_entry(name: str) -> ModelEntry | None:
    """The registered entry of `name`, if any (entry points and ``module:function`` paths resolve in
    `trainer.runtime.trainspec.resolve`)."""
    return MODELS.get(name)


register_model("tiny-gpt", "trainer.examples.gpt:spec", n_layer=4, n_embd=64, n_head=4, block_size=32)
register_model("small-gpt", "trainer.examples.gpt:spec", n_layer=8, n_embd=128, n_head=4, block_size=64)
#: A Llama-shaped decoder from a transformers config (parcae[hf]; `trainer.examples.hf.TINY_LLAMA`, random weights).
register_model("tiny-llama", "trainer.examples.hf:spec")


ENTRY_POINT_GROUP = "parcae.models"


def installed_models() -> dict[str, str]:
    """Model names installed packages register under the ``parcae.models`` entry-point group -> their
    ``module:function``."""
    from importlib.metadata import entry_points  # only for a name that is not registered here

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _known_model(name: str) -> bool:
    return name in MODELS or ":" in name or name in installed_models()


@dataclass(frozen=True)
class ModelConfig:
    """The network, by reference: `name` (a registered model, an installed ``parcae.models`` entry point, or a
    ``module:function`` returning a `TrainSpec`) and the keyword `args` its function is called with (plain JSON
    data: configs cross process boundaries and are stored in checkpoints). `seed` fixes every layer's initial
    weights (each layer from its own generator, so the cut into stages does not matter — see
    `trainer.runtime.trainspec.layer_seed`). A registered model's args start from its registered defaults."""

    name: str = "tiny-gpt"
    args: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        _need(isinstance(self.name, str) and bool(self.name), "model.name", f"must be a model name, got "
              f"{self.name!r}", "give a registered name or module:function")  # fmt: skip
        if not _known_model(self.name):
            known = ", ".join(sorted({*MODELS, *installed_models()}))
            raise UnknownModelError(f"model.name: unknown model {self.name!r}; known models: {known}, or give "
                                    "module:function (mypkg.train:spec)")  # fmt: skip
        _need(isinstance(self.args, Mapping) and all(isinstance(k, str) for k in self.args), "model.args",
              f"must be a mapping of argument names to values, got {self.args!r}",
              "give the spec's keyword arguments as a JSON object")  # fmt: skip
        entry = MODELS.get(self.name)  # a registered model's args are its defaults, so equal configs compare equal
        try:
            canonical = json.loads(json.dumps({**(entry.args if entry else {}), **self.args}, sort_keys=True))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model.args: must be plain JSON data ({exc}); give numbers, strings, lists and "
                              "objects") from None  # fmt: skip
        object.__setattr__(self, "args", canonical)
        _need(_is_int(self.seed), "model.seed", f"must be an integer, got {self.seed!r}", "give an integer seed")

    def __hash__(self) -> int:
        return hash((self.name, json.dumps(self.args, sort_keys=True), self.seed))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "args": dict(self.args), "seed": self.seed}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """The inverse of `to_dict`; other fields (a job.json or checkpoint of an older parcae, which stored a GPT's
        shape as fields) are a `ConfigError` naming them."""
        unknown = sorted(set(d) - {"name", "args", "seed"})
        _need(not unknown, "model", f"unknown fields {unknown}", "a model is name, args and seed (parcae before model "
              "args wrote its GPT shape as fields: start the job afresh)")  # fmt: skip
        return cls(**d)


def model_config(name: str = "tiny-gpt", seed: int = 0, **args: Any) -> ModelConfig:
    """Model `name` with the keyword `args` (over a registered model's defaults), e.g.
    ``model_config("tiny-gpt", dtype="float64")``."""
    return ModelConfig(name=name, args=args, seed=seed)


#: The devices a job may train on (`TrainConfig.device`; `trainer.runtime.devices` resolves them) and the pipeline
#: schedules within a step (`TrainConfig.schedule`; `trainer.runtime.pipeline.schedule_order`).
DEVICES = ("auto", "cpu", "cuda")
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation, independent of D x P.

    `global_batch` sequences per step are split across the D replicas (uneven splits allowed, see
    `trainer.runtime.data.shard`) and then into micro-batches of at most `micro_batch` sequences.
    """

    global_batch: int = 16
    micro_batch: int = 2
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    seed: int = 0
    steps: int = 100
    schedule: str = "gpipe"  # the pipeline schedule within a step: "gpipe" or "1f1b" (trainer.runtime.pipeline)
    device: str = "cpu"  # "cpu", "cuda" or "auto" (CUDA where it exists): trainer.runtime.devices
    # what the stage cut balances, one cost per layer (a runtime profile's measured ms: `RuntimeProfile.stage_costs`);
    # empty: the spec's cost hints, else the layers' parameter counts (`trainer.runtime.migration.LayerSizes.cut`)
    stage_costs: tuple[float, ...] = ()
    # whether the spec's `validation` is scored (`trainer.runtime.validation`); a runtime profile's job does not: it
    # measures training
    validate: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.stage_costs, tuple):  # a list, from JSON (a job spec, job.json)
            object.__setattr__(self, "stage_costs", tuple(self.stage_costs))
        _need(all(_cost(c) for c in self.stage_costs), "train.stage_costs",
              f"every cost must be a finite number >= 0, got {list(self.stage_costs)}",
              "give one cost per layer, or measure the profile again (`parcae profile`)")  # fmt: skip
        _need(self.device in DEVICES, "train.device", f"must be {_choices(DEVICES)}, got {self.device!r}",
              "choose one")  # fmt: skip
        _need(self.schedule in SCHEDULES, "train.schedule", f"must be {_choices(SCHEDULES)}, got {self.schedule!r}",
              "choose one")  # fmt: skip
        _need_count(self.steps, "train.steps", 1, "give a step count")
        _need(isinstance(self.validate, bool), "train.validate", f"must be true or false, got {self.validate!r}",
              "give a boolean")  # fmt: skip
        _need_count(self.global_batch, "train.global_batch", 1, "give the rows of a step")
        _need_count(self.micro_batch, "train.micro_batch", 1, "give the rows of a micro-batch")
        _need(_finite_positive(self.lr), "train.lr", f"must be a positive number, got {self.lr!r}",
              "give a learning rate")  # fmt: skip


# ------------------------------------------------------------------------------------------------ the job

# A worker whose heartbeat stays silent this long is declared dead (a process that exits is seen at once). Long
# enough that a living worker on a loaded machine is not (1 s was: a job died at load 80); a hung one costs this
# long to detect.
DEFAULT_HB_TIMEOUT_S = 10.0
#: How worker processes start: "spawn" (cold, like a real restart) or "forkserver" (a warm pool).
START_METHODS = ("spawn", "forkserver")


class ConfigError(ValueError):
    """A `JobConfig` field that cannot work: the message names the field (`section.field`) and the fix."""


def config_default(section: type, name: str) -> Any:
    """The default of field `name` of a `JobConfig` section (`TrainConfig`, `CheckpointConfig`, ...): its one
    source, which the CLI's options and the flows' parameters take theirs from."""
    for f in dataclasses.fields(section):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            break
    raise AttributeError(f"{section.__name__}.{name} has no default")


def _choices(names: tuple[str, ...]) -> str:
    """ "a, b or c" """
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def _need(ok: bool, where: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {problem}; {fix}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _need_count(value: Any, where: str, minimum: int, fix: str, meaning: str = "") -> None:
    """`value` is an integer >= `minimum` (not a bool, a float or a string from a JSON config)."""
    _need(_is_int(value) and value >= minimum, where, f"must be an integer >= {minimum}{meaning}, got {value!r}", fix)


def _cost(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _finite_positive(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@dataclass(frozen=True)
class CheckpointConfig:
    """Periodic checkpoints: every `every` steps (0: never) into `dir` (default: `<out_dir>/checkpoints`), the
    newest `keep` complete ones kept (0: all); `resume` continues the job from its latest intact one. `uri`
    (``file:///path`` or ``s3://bucket/prefix``) keeps a copy of each complete checkpoint where it survives the
    instance that wrote it; a resumed job on a fresh machine starts from the newest one there."""

    every: int = 10
    dir: str | None = None
    keep: int = 0
    resume: bool = False
    uri: str | None = None

    def __post_init__(self) -> None:
        _need_count(self.every, "checkpoint.every", 0, "give a step count", " (0: never)")
        _need_count(self.keep, "checkpoint.keep", 0, "give a count", " (0: keep all)")
        _need(self.uri is None or (isinstance(self.uri, str) and self.uri.startswith(("file:///", "s3://"))),
              "checkpoint.uri", f"expected file:///path or s3://bucket/prefix, got {self.uri!r}",
              "give a folder as file:///abs/path, or an S3 bucket and prefix")  # fmt: skip


@dataclass(frozen=True)
class ControlPlaneConfig:
    """The coordinator's store and failure detector: where it listens (loopback unless told otherwise; port 0: a
    free one), how long collectives and store reads wait, the heartbeat, the grace of a preemption notice (GCP's
    30 s; AWS gives 120 s), the job's deadline (None: none — a job runs until it is done) and whether migrations
    known ahead (the schedule's, a worker's preemption notice, an interval's plan) are prepared: their process groups
    formed, and a joining standby's layers built, while the old strategy trains."""

    host: str = "127.0.0.1"
    port: int = 0
    pg_timeout_s: float = 30.0
    store_timeout_s: float = 60.0
    hb_interval_s: float = 0.1
    hb_timeout_s: float = DEFAULT_HB_TIMEOUT_S
    notice_grace_s: float = 30.0
    timeout_s: float | None = None
    prepare: bool = True

    def __post_init__(self) -> None:
        _need(
            _is_int(self.port) and 0 <= self.port <= 65535,
            "control.port",
            f"must be an integer in 0..65535, got {self.port!r}",
            "give a free port or 0",
        )
        for name in ("pg_timeout_s", "store_timeout_s", "hb_interval_s", "hb_timeout_s"):
            v = getattr(self, name)
            _need(_finite_positive(v), f"control.{name}", f"must be a positive number of seconds, got {v!r}",
                  "give seconds > 0")  # fmt: skip
        _need(self.hb_timeout_s > 2 * self.hb_interval_s, "control.hb_timeout_s",
              f"{self.hb_timeout_s} must exceed two heartbeat intervals ({self.hb_interval_s} s)",
              "raise the heartbeat timeout")  # fmt: skip
        _need(isinstance(self.notice_grace_s, (int, float)) and math.isfinite(self.notice_grace_s)
              and self.notice_grace_s >= 0, "control.notice_grace_s",
              f"must be >= 0 seconds, got {self.notice_grace_s!r}", "give seconds")  # fmt: skip
        _need(self.timeout_s is None or _finite_positive(self.timeout_s), "control.timeout_s",
              f"must be a positive number of seconds, or none (no deadline), got {self.timeout_s!r}",
              "give seconds > 0")  # fmt: skip
        _need(isinstance(self.prepare, bool), "control.prepare", f"must be true or false, got {self.prepare!r}",
              "give a boolean")  # fmt: skip


@dataclass(frozen=True)
class ProviderConfig:
    """Where instances come from: `name` is a `trainer.providers.PROVIDERS` entry and `options` its settings (hosts:
    hosts, coordinator, ...; aws: `trainer.providers.aws.AwsSpotConfig`'s fields); local worker processes start with
    `start_method`, ahead of their event while fewer than `max_processes` run (None: the most the schedule has
    alive at once)."""

    name: str = "local"
    options: Mapping[str, Any] = field(default_factory=dict)
    start_method: str = "spawn"
    max_processes: int | None = None

    def __post_init__(self) -> None:
        # (the provider's name and options are the registry's to check: `trainer.providers.provider_of`)
        _need(isinstance(self.name, str) and bool(self.name), "provider.name", f"must be a name, got {self.name!r}",
              "give a trainer.providers.PROVIDERS name")  # fmt: skip
        _need(isinstance(self.options, Mapping), "provider.options", f"must be a mapping, got {self.options!r}",
              "give the provider's options as a JSON object")  # fmt: skip
        _need(self.start_method in START_METHODS, "provider.start_method",
              f"must be one of {', '.join(START_METHODS)}, got {self.start_method!r}", "choose one")  # fmt: skip
        if self.max_processes is not None:
            _need_count(self.max_processes, "provider.max_processes", 1, "give a count, or None")


@dataclass(frozen=True)
class AvailabilityConfig:
    """Which instances exist when: `workers` at the start, then a replayed spot `trace` (from interval
    `start_interval`; one interval lasts `interval_seconds` of wall time, i.e. `interval_seconds / step_seconds`
    steps; a `kill_fraction` of its drops come without notice) or a scripted `events_file`, or neither. `strategy`
    is the first D x P (None: the rule's, for the instances alive at the start)."""

    workers: int = 4
    strategy: tuple[int, int] | None = None
    trace: str | None = None
    events_file: str | None = None
    interval_seconds: float = 2.0
    step_seconds: float = 0.1
    start_interval: int = 0
    kill_fraction: float = 0.5

    def __post_init__(self) -> None:
        _need_count(self.workers, "availability.workers", 1, "give a count")
        _need(self.trace is None or self.events_file is None, "availability",
              "give an events file or a trace, not both", "drop one")  # fmt: skip
        _need(_finite_positive(self.interval_seconds) and self.interval_seconds <= 86_400,
              "availability.interval_seconds", f"must be a positive number of seconds (at most a day), got "
              f"{self.interval_seconds!r}", "give seconds")  # fmt: skip
        _need(_finite_positive(self.step_seconds), "availability.step_seconds",
              f"must be a positive number of seconds, got {self.step_seconds!r}", "give seconds")  # fmt: skip
        _need_count(self.start_interval, "availability.start_interval", 0, "give an interval index")
        _need(isinstance(self.kill_fraction, (int, float)) and 0.0 <= self.kill_fraction <= 1.0,
              "availability.kill_fraction",
              f"must be in [0, 1], got {self.kill_fraction!r}", "give a fraction")  # fmt: skip


@dataclass(frozen=True)
class PlanningConfig:
    """Who decides D x P at each interval boundary (`planner`: a `trainer.control.planning.PLANNERS` name; None: the
    schedule's own plan events), over `look_ahead` intervals, with the runtime profile at `profile` (liveput);
    `accept_plans`: the job also takes plans handed in by the scheduled plan-interval flow (its own planner decides
    when none came in time), and registers itself for them (its MLflow run's tags)."""

    planner: str | None = None
    look_ahead: int = DEFAULT_LOOK_AHEAD
    profile: str | None = None
    accept_plans: bool = False

    def __post_init__(self) -> None:
        _need(_is_int(self.look_ahead) and 1 <= self.look_ahead <= MAX_LOOK_AHEAD, "planning.look_ahead",
              f"must be an integer from 1 to {MAX_LOOK_AHEAD:,}, got {self.look_ahead!r}",
              f"give K from 1 to {MAX_LOOK_AHEAD:,}")  # fmt: skip


@dataclass(frozen=True)
class FleetConfig:
    """A live fleet: keep up to `max_instances` instances requested from the provider, which — not a trace —
    decides what exists (None: no fleet; the instances come from `availability`). Training starts once
    `min_instances` have joined and never waits for more. A refused request is retried after `backoff_s` (default:
    a quarter interval), doubling up to `max_backoff_s` (default: half an interval) while refusals continue. The fleet's
    history goes, one row per interval, to the trace store at `trace_store` (a folder or ``s3://bucket/prefix``;
    default: ``$PARCAE_TRACE_STORE``, else ``./trace-store``), unless `record_history` is False."""

    max_instances: int | None = None
    min_instances: int = 1
    backoff_s: float | None = None
    max_backoff_s: float | None = None
    trace_store: str | None = None
    record_history: bool = True

    def __post_init__(self) -> None:
        if self.max_instances is not None:
            _need(_is_int(self.max_instances) and 1 <= self.max_instances <= MAX_INSTANCES, "fleet.max_instances",
                  f"must be an integer from 1 to {MAX_INSTANCES:,}, got {self.max_instances!r}",
                  "give a count, or none (no live fleet)")  # fmt: skip
        _need_count(self.min_instances, "fleet.min_instances", 1, "give a count")
        if self.max_instances is not None:
            _need(self.min_instances <= self.max_instances, "fleet.min_instances",
                  f"{self.min_instances} is above fleet.max_instances ({self.max_instances})",
                  "lower it or raise the maximum")  # fmt: skip
        for name in ("backoff_s", "max_backoff_s"):
            v = getattr(self, name)
            _need(v is None or _finite_positive(v), f"fleet.{name}",
                  f"must be a positive number of seconds or None (the default), got {v!r}", "give seconds")  # fmt: skip
        if self.live and self.record_history:  # a history that cannot go where it is told: before the job starts
            from forecasting import check_trace_store

            where, store = "fleet.trace_store", self.trace_store
            if store is None:
                where, store = "$PARCAE_TRACE_STORE", os.environ.get("PARCAE_TRACE_STORE")
            _need(store is None or isinstance(store, str), where, f"must be a folder, got {store!r}", "give a path")
            try:
                check_trace_store(store or "trace-store")
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}") from None

    @property
    def live(self) -> bool:
        return self.max_instances is not None


@dataclass(frozen=True)
class JobConfig:
    """Every setting of one training job, built once (by the command line or a flow), validated on construction,
    and passed down unchanged to the driver, the coordinator and the observers; `to_dict` is the form the job's
    folder (`job.json`) and its MLflow run record."""

    job: str = "job"
    out_dir: str = "runs/train"
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    availability: AvailabilityConfig = field(default_factory=AvailabilityConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    control: ControlPlaneConfig = field(default_factory=ControlPlaneConfig)
    provider: ProviderConfig = field(default_factory=ProviderConfig)
    planning: PlanningConfig = field(default_factory=PlanningConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)

    def __post_init__(self) -> None:
        _need(bool(self.job) and isinstance(self.job, str), "job", f"must be a non-empty name, got {self.job!r}",
              "name the job")  # fmt: skip
        _need(bool(str(self.out_dir)), "out_dir", "must be a folder", "give the job's output folder")
        av = self.availability
        _need(not self.fleet.live or (av.trace is None and av.events_file is None), "fleet",
              "a live fleet takes what the provider gives; it replays no trace and no events file",
              "drop availability.trace / events_file (--trace, --events), or the fleet")  # fmt: skip

    @property
    def steps(self) -> int:
        return self.train.steps

    @property
    def layers_dir(self) -> str:
        """Where the final parameters go (one shard per final stage)."""
        return str(Path(self.out_dir) / "layers")

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir if self.checkpoint.dir is not None else str(Path(self.out_dir) / "checkpoints")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobConfig:
        """The inverse of `to_dict` (JSON lists become the tuples the fields hold); unknown fields are errors."""
        sections = {"model": ModelConfig, "train": TrainConfig, "availability": AvailabilityConfig,
                    "checkpoint": CheckpointConfig, "control": ControlPlaneConfig, "provider": ProviderConfig,
                    "planning": PlanningConfig, "fleet": FleetConfig}  # fmt: skip
        unknown = sorted(set(d) - {"job", "out_dir", *sections})
        _need(not unknown, "JobConfig", f"unknown fields {unknown}", f"use {['job', 'out_dir', *sections]}")
        kw: dict[str, Any] = {k: d[k] for k in ("job", "out_dir") if k in d}
        for name, kind in sections.items():
            if name in d:
                _need(isinstance(d[name], Mapping), name, f"must be a section of fields, got {d[name]!r}",
                      f"give {name} as an object (a [{name}] table in TOML)")  # fmt: skip
                fields = {f.name for f in dataclasses.fields(kind)}
                extra = sorted(set(d[name]) - fields)
                _need(not extra, name, f"unknown fields {extra}", f"use {sorted(fields)}")
                kw[name] = kind(**{k: tuple(v) if isinstance(v, list) and k != "options" else v
                                   for k, v in d[name].items()})  # fmt: skip
        return cls(**kw)

    def replace(self, **sections: Any) -> JobConfig:
        """A copy with some sections' fields changed: `cfg.replace(checkpoint={"resume": True})`."""
        kw: dict[str, Any] = {}
        for name, change in sections.items():
            kw[name] = dataclasses.replace(getattr(self, name), **change) if isinstance(change, Mapping) else change
        return dataclasses.replace(self, **kw)
