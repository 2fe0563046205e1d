"""Resume: where a killed or finished job continues from, and what its folders must hold for that.

Owns: `check_same_job` (a resumed job must be the job its folder holds: `job.json`, the `JobConfig` the earlier run
wrote), `resume_point` (the newest intact checkpoint of the job: hash records verified, then loaded; a finished job
refused unless it trains more steps), `finished_step`, `clear_for_resume`. Must not touch: the driver, the store.
Where to look next: `trainer.runtime.checkpoint` (the files), `docs/driver.md` (Resume).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer.config import JobConfig, ModelConfig
from trainer.control.dry_run import ScheduleError
from trainer.runtime import checkpoint
from trainer.runtime.model import layer_names


def resume_point(
    ckpt_dir: Path, layers_dir: Path, model: ModelConfig, job: str, steps: int
) -> tuple[int, list[Path], list[str]] | None:
    """Where a resumed job of `steps` steps starts: (step, files, why each newer checkpoint was skipped), or None.

    The newest intact checkpoint of job `job` in `ckpt_dir` (hash records verified, then loaded: same model config,
    finite values). A corrupt, incomplete or unverified newer one is skipped, and said why; with none intact but
    some corrupt, resuming is refused (`ScheduleError` naming them) rather than silently restarted from scratch.
    A finished job (final parameters in `layers_dir`) is refused unless `steps` is larger: then it trains on from
    its final parameters, which become the checkpoint of its last step — later weights are never replaced by
    earlier ones. A checkpoint of another job or model is an error naming the file."""
    names = layer_names(model)
    done = finished_step(layers_dir, names, job)
    if done is not None:
        if done >= steps:
            raise ScheduleError(f"job {job!r} has finished: it trained {done} steps (its final parameters are in "
                                f"{layers_dir}); nothing to resume. Ask for more steps than {done} to train on from "
                                "there, or give a fresh output folder (--out-dir) for a new job")  # fmt: skip
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.remove_after(ckpt_dir, done - 1)  # (a partial checkpoint of that same step)
        for f in checkpoint.step_files(layers_dir, done):
            os.replace(f, ckpt_dir / f.name)
    skipped: list[str] = []
    damaged = False
    for s in checkpoint.checkpoint_steps(ckpt_dir):
        v = checkpoint.verify_step(ckpt_dir, s, names, job=job)
        if v.status == "foreign":
            raise ScheduleError(f"cannot resume from {ckpt_dir}: {', '.join(f.name for f in v.files)} (step {s}) "
                                f"is not this job's checkpoint ({'; '.join(v.problems)}); move it away or give "
                                "another checkpoint_dir")  # fmt: skip
        if not v.intact:
            skipped.append(str(v))
            damaged |= v.status != "incomplete"  # (a killed run's last, partly written one is no damage)
            continue
        try:
            checkpoint.load(list(v.files), config=model, job=job)
        except checkpoint.ForeignCheckpointError as e:
            raise ScheduleError(f"cannot resume from {ckpt_dir}: {e}; move the file away or give another "
                                "checkpoint_dir") from None  # fmt: skip
        except checkpoint.CheckpointError as e:
            skipped.append(f"step {s} ({e})")
            damaged = True
            continue
        if s >= steps:
            raise ScheduleError(f"cannot resume from {ckpt_dir}: its latest checkpoint is of step {s}, not "
                                f"before this job's last step ({steps} steps); was it a longer job?")  # fmt: skip
        return s, list(v.files), skipped
    if damaged:
        raise ScheduleError(f"cannot resume from {ckpt_dir}: no intact checkpoint; skipped {'; '.join(skipped)}. "
                            "Move the damaged files away to start from scratch")  # fmt: skip
    return None


def finished_step(layers_dir: Path, names: Sequence[str], job: str) -> int | None:
    """The step count of a job that finished here: its final shards in `layers_dir`, complete and intact."""
    for s in checkpoint.checkpoint_steps(layers_dir):
        if checkpoint.verify_step(layers_dir, s, names, job=job).intact:
            return s
    return None


def clear_for_resume(layers_dir: Path, ckpt_dir: Path, restore: int) -> None:
    """Remove what the killed run left that the resumed one would trip over: its final shards (if it got that far)
    and temporary files, and checkpoints after the resume step (an incomplete one, or one of another cut). Anything
    else in these directories is not the job's: refuse to touch it."""
    checkpoint.remove_after(ckpt_dir, restore)
    checkpoint.remove_after(layers_dir, -1)
    for d in (layers_dir, ckpt_dir):
        if not d.is_dir():
            continue
        checkpoint.remove_temporary(d)
        others = sorted(p.name for p in d.iterdir() if not checkpoint.is_checkpoint_file(p.name))
        if others:
            raise ScheduleError(f"{d} holds files that are not this job's checkpoints ({', '.join(others[:3])}); "
                                "move them away to resume")  # fmt: skip


#: What a resumed job must share with the run that wrote its folder: what it trains, on which schedule, how often
#: it checkpoints (the schedule restarts at the resume step). The rest may change on resume: more steps, deadlines,
#: heartbeats, retention, the provider, the planner.
SAME_ON_RESUME: dict[str, tuple[str, ...] | None] = {
    "job": None,
    "model": None,
    "train": ("global_batch", "micro_batch", "lr", "betas", "weight_decay", "seed"),
    "availability": None,
    "checkpoint": ("every", "dir"),
}


def check_same_job(previous: Mapping[str, Any], config: JobConfig, where: Path) -> None:
    """`ScheduleError` naming each setting in which `config` differs from `previous` (the `JobConfig.to_dict` an
    earlier run of the job wrote to `where`) among `SAME_ON_RESUME`: resuming it with other settings would not
    continue that job."""
    now = config.to_dict()
    changed = []
    for section, fields in SAME_ON_RESUME.items():
        before, after = previous.get(section), now[section]
        if not isinstance(after, dict):
            if before != after:
                changed.append(f"{section}: {before!r} -> {after!r}")
            continue
        before = before if isinstance(before, Mapping) else {}
        for name in fields or sorted(after):
            old, new = before.get(name), after[name]
            if isinstance(old, list):
                old = list(old)
            if isinstance(new, tuple):
                new = list(new)
            if old != new:
                changed.append(f"{section}.{name}: {old!r} -> {new!r}")
    if changed:
        raise ScheduleError(f"cannot resume the job in {where.parent}: it was started with other settings "
                            f"({'; '.join(changed)}); resume with the same ones, or give a fresh output folder "
                            "(--out-dir) for a new job")  # fmt: skip
