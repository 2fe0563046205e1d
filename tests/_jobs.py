"""Flat-argument builders of a trainer job for the tests: one `JobConfig` (and `Schedule`) per call.

The trainer takes one `JobConfig`; the tests vary one or two settings per job, so they name just those here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from trainer.config import (
    AvailabilityConfig,
    CheckpointConfig,
    ControlPlaneConfig,
    JobConfig,
    ModelConfig,
    PlanningConfig,
    ProviderConfig,
    TrainConfig,
    model_config,
)
from trainer.control import run as _run
from trainer.control.coordinator import Coordinator
from trainer.control.events import Schedule

# 2x2 on workers 0-3, then: intra-stage; inter-stage forced by a preemption whose victim holds the last copy of its
# stage; an added worker + inter-stage; pipeline 2 -> 3; pipeline 3 -> 2 under a preemption (last copy again);
# pipeline 2 -> 1 with 3 replicas (uneven data shards). Every kind of live migration, for any model of >= 3 layers.
EVERY_MIGRATION: list[dict[str, Any]] = [
    {"step": 2, "kind": "plan", "strategy": [1, 2]},
    {"step": 3, "kind": "preempt", "instances": [2], "notice": True},
    {"step": 4, "kind": "add", "workers": 1},
    {"step": 4, "kind": "plan", "strategy": [2, 2]},
    {"step": 6, "kind": "plan", "strategy": [1, 3]},
    {"step": 8, "kind": "preempt", "instances": [0]},
    {"step": 8, "kind": "plan", "strategy": [1, 2]},
    {"step": 9, "kind": "plan", "strategy": [3, 1]},
]

_CHECKPOINT = {"checkpoint_every": "every", "checkpoint_dir": "dir", "keep_checkpoints": "keep", "resume": "resume",
               "checkpoint_uri": "uri"}  # fmt: skip
_CONTROL = ("host", "port", "pg_timeout_s", "store_timeout_s", "hb_interval_s", "hb_timeout_s", "notice_grace_s",
            "timeout_s", "prepare")  # fmt: skip
_PROVIDER = ("start_method", "max_processes")


def job_config(
    model: ModelConfig | str, train: TrainConfig, steps: int, out_dir: str | os.PathLike[str], **settings: Any
) -> JobConfig:
    """A `JobConfig` of `steps` steps: `settings` are the names of the old flat `run_job` keywords (job,
    checkpoint_every, checkpoint_dir, keep_checkpoints, resume, host, port, *_timeout_s, hb_interval_s,
    notice_grace_s, start_method, max_processes); periodic checkpoints are off unless asked for; workers are forked
    from a warm server unless `start_method="spawn"`."""
    model = model_config(model) if isinstance(model, str) else model
    ckpt: dict[str, Any] = {"every": 0}
    control: dict[str, Any] = {}
    provider: dict[str, Any] = {}
    job = settings.pop("job", "job")
    # workers forked from a server that imported torch once (~0.1 s a worker instead of ~2.5 s of CPU, the most of
    # a short job's time on 2 cores); a test of what a cold start does asks for "spawn", the product's default
    provider["start_method"] = settings.pop("start_method", "forkserver")
    for name, value in settings.items():
        if name in _CHECKPOINT:
            ckpt[_CHECKPOINT[name]] = None if value is None else (str(value) if name == "checkpoint_dir" else value)
        elif name in _CONTROL:
            control[name] = value
        elif name in _PROVIDER:
            provider[name] = value
        else:
            raise TypeError(f"job_config: unknown setting {name!r}")
    train = TrainConfig(**{**vars(train), "steps": steps})
    return JobConfig(job=job, out_dir=str(out_dir), model=model, train=train, checkpoint=CheckpointConfig(**ckpt),
                     control=ControlPlaneConfig(**control), provider=ProviderConfig(**provider))  # fmt: skip


def run_job(
    model: ModelConfig | str, train: TrainConfig, workers: int, strategy: tuple[int, int], steps: int,
    events: Sequence[Any], out_dir: str | os.PathLike[str], *, observer: Any = None, planner: Any = None,
    remote: Any = None, steps_per_interval: int = 0, **settings: Any,
) -> dict[str, Any]:  # fmt: skip
    """`trainer.control.run.run_job` of `job_config(...)` on the schedule (workers, strategy, events)."""
    config = job_config(model, train, steps, out_dir, **settings)
    schedule = Schedule(workers=workers, strategy=tuple(strategy), events=list(events),
                        steps_per_interval=steps_per_interval)  # fmt: skip
    return _run.run_job(config, schedule, observer=observer, planner=planner, remote=remote)


def train(
    workers: int = 4, *, model: ModelConfig | str = "tiny-gpt", steps: int = 40, seed: int = 0,
    out_dir: str | os.PathLike[str] = "runs/train", observer: Any = None, planner: Any = None,
    json_out: Any = None, train_cfg: TrainConfig | None = None, **settings: Any,
) -> dict[str, Any]:  # fmt: skip
    """`trainer.control.run.train` of a `JobConfig` from the names `parcae train` has (trace, events_file, strategy,
    interval_seconds, step_seconds, start_interval, kill_fraction; checkpoint_every defaults to 10 as there)."""
    avail = {k: settings.pop(k) for k in list(settings) if k in AvailabilityConfig.__dataclass_fields__}
    if "events_file" in avail and avail["events_file"] is not None:
        avail["events_file"] = str(avail["events_file"])
    settings.setdefault("checkpoint_every", 10)
    mcfg = model_config(model, seed=seed) if isinstance(model, str) else model
    tcfg = train_cfg or TrainConfig(steps=steps, seed=seed)
    base = job_config(mcfg, tcfg, steps, out_dir, **settings)
    config = base.replace(availability=AvailabilityConfig(workers=workers, **avail),
                          planning=PlanningConfig(planner=getattr(planner, "name", None)))  # fmt: skip
    return _run.train(config, observer=observer, planner=planner, json_out=json_out)


def coordinator(model: ModelConfig, train: TrainConfig, steps: int, out_dir: str | os.PathLike[str], *,
                token: str | None = None, **settings: Any) -> Coordinator:  # fmt: skip
    """A `Coordinator` of `job_config(...)` (its layers under `out_dir/layers`)."""
    return Coordinator(job_config(model, train, steps, out_dir, **settings), token=token)


__all__ = ["coordinator", "job_config", "run_job", "train"]
