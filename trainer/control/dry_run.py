"""A schedule's dry run: the epochs the coordinator will publish for a job's schedule, planned by the coordinator's
own rules, or `ScheduleError` — before any process starts.

Owns: `check_schedule` (the whole schedule), `schedule_state` (where it stands before a boundary: what a resumed job
starts from), `ScheduleState`, `ScheduleError`. Must not touch: processes, the store (`trainer.control.coordinator`
publishes the same epochs for real), how an epoch is planned (`trainer.runtime.migration`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec

from trainer.config import ModelConfig, TrainConfig
from trainer.control.events import EventGroup
from trainer.runtime.migration import (
    Epoch,
    PlanError,
    first_epoch,
    job_layer_sizes,
    next_epoch,
    plan_recovery,
    restart_epoch,
)

_P = ParamSpec("_P")


class ScheduleError(ValueError):
    """A job or event schedule that cannot run; raised before any process starts."""


@dataclass(frozen=True)
class ScheduleState:
    """Where a schedule's dry run stands before a boundary: the epoch in force, the instances alive (ids) and the id
    the next added instance gets. A resumed job starts from it (`trainer.control.run.run_job` with
    `checkpoint.resume`)."""

    epochs: list[Epoch]
    alive: tuple[int, ...]
    next_id: int

    @property
    def epoch(self) -> Epoch:
        return self.epochs[-1]


def schedule_state(
    model: ModelConfig,
    train: TrainConfig,
    workers: int,
    strategy: tuple[int, int],
    steps: int,
    groups: Sequence[EventGroup],
    before_step: int | None = None,
    *,
    strategy_for: Callable[[int], tuple[int, int]] | None = None,
) -> ScheduleState:
    """The schedule's dry run with the coordinator's own planning, after every event of a step < `before_step`
    (all of them when None, as `check_schedule` runs it), or `ScheduleError`.

    Checks every strategy against the instances alive at its step (initial ones + adds - preemptions - kills),
    P against the layer count, D against the global batch, preempted and killed ids against who is alive, and event
    steps against the job's length. A kill is planned as the coordinator will recover from it: a live migration
    if every layer keeps a surviving holder, else a checkpoint-restart (its restore step is only known at run time;
    the dry run uses the kill's step).

    `strategy_for(n)` stands in for a live planner (`trainer.control.planning`), whose decisions are only known at run
    time: a group without a plan gets the strategy it returns for the n instances alive after the group's adds and
    preemptions, so ids, kills and recoveries are still checked (what a real planner decides is checked when it
    decides).
    """
    if workers < 1:
        raise ScheduleError(f"workers must be >= 1, got {workers}")
    if steps < 1:
        raise ScheduleError(f"steps must be >= 1, got {steps}")
    D, P = strategy
    sizes = job_layer_sizes(model, train)
    try:
        epoch = first_epoch(D, P, range(workers), sizes.cut, train.global_batch)
    except PlanError as e:
        raise ScheduleError(f"initial strategy: {e}") from None
    alive, next_id, epochs = set(range(workers)), workers, [epoch]
    for g in sorted(groups, key=lambda g: g.step):
        if before_step is not None and g.step >= before_step:
            break
        if not 1 <= g.step < steps:
            raise ScheduleError(f"event at step {g.step}: outside the job's boundaries 1..{steps - 1}")
        added = set(range(next_id, next_id + g.add))
        next_id += g.add
        alive |= added
        new: Epoch | None
        try:
            plan = g.strategy
            if plan is None and strategy_for is not None and not g.restart:
                plan = strategy_for(len(alive - set(g.preempt)))
            if g.restart:
                if g.preempt:
                    raise PlanError("a checkpoint-restart and preemptions in the same step: give them two steps")
                new = restart_epoch(epoch, g.step, alive, sizes.cut, plan, train.global_batch)
            else:
                new = next_epoch(epoch, g.step, alive, sizes, plan, g.preempt, train.global_batch)
            alive -= set(g.preempt)
            if new is not None:
                epoch = new
                epochs.append(new)
            if g.kill:
                unknown = sorted(set(g.kill) - alive)
                if unknown:
                    raise PlanError(f"cannot kill workers {unknown}: they are not alive")
                alive -= set(g.kill)
                if not alive:
                    raise PlanError(f"the kill leaves no instance alive (killed {sorted(g.kill)})")
                if set(g.kill) & set(epoch.members):
                    recovered = plan_recovery(epoch, g.step, alive, g.kill, sizes, train.global_batch)
                    if recovered is None:
                        recovered = restart_epoch(epoch, g.step, alive, sizes.cut, None, train.global_batch,
                                                  lost=g.kill)  # fmt: skip
                    epoch = recovered
                    epochs.append(recovered)
        except PlanError as e:
            raise ScheduleError(f"event at step {g.step}: {e}") from None
    return ScheduleState(epochs, tuple(sorted(alive)), next_id)


def _epochs_of(dry_run: Callable[_P, ScheduleState]) -> Callable[_P, list[Epoch]]:
    """`dry_run` returning only the epochs it publishes, with the same parameters (one signature for both)."""

    def check_schedule(*args: _P.args, **kwargs: _P.kwargs) -> list[Epoch]:
        """Dry-run the whole schedule (`schedule_state`, which documents the checks, to the end): the epochs the
        coordinator will publish, or `ScheduleError` — how the driver, the chaos schedules and the profile job check
        a schedule before any process starts."""
        return dry_run(*args, **kwargs).epochs

    return check_schedule


check_schedule = _epochs_of(schedule_state)
