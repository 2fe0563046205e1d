"""Job observers: how the outside world watches a running job without slowing it down.

Owns: the `JobObserver` interface the driver (`trainer.control.run`) calls as the job advances, `ObserverList` (fan-out
to several observers), `RecordingObserver` (keeps every call; tests and reports), and for logs `ProgressLog` (a line
of progress every so often) and `fleet_text` (a live fleet's wait in words). Must not touch: training, the
control plane. Concrete observers live with their tool: the MLflow run of a training job (`trainer.observe.tracking`),
the CLI's progress bar (`parcae.progress`).

Contract, for implementers:
- The driver calls these methods from its own thread, between control decisions; a slow observer delays
  decisions (not the workers' steps, which run in other processes) — so an observer that does I/O must queue and
  return (MLflow logging is batched in a background thread).
- An exception raised by an observer is logged once and that observer is dropped; it never fails the job.
- Calls come in order: `on_start`, then any mix of `on_step` (each step once, in step order — a step recomputed
  after a checkpoint-restart is reported again, after the `on_reconfiguration` of that restart), `on_plan`,
  `on_reconfiguration` (once per reconfiguration, when its record is complete), `on_checkpoint` (once per complete
  checkpoint), then `on_end` (success) or `on_error` (the job failed; the observer should flush what it has).
- `on_fleet` (a live fleet's wait for instances) may come before `on_start`: a job waits for its first ones.
- Invalid input (unknown model, impossible strategy, bad events) raises before any hook is called. A job that
  fails after validation but before its first epoch (workers never joined) gets `on_error` without `on_start`.
- `on_checkpoint` reports files that a later checkpoint-restart may delete (it discards checkpoints newer than the
  one it restores): an observer that reads them later must expect them gone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from liveput import strategy_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInfo:
    """One committed training step as the driver saw it."""

    step: int
    loss: float
    strategy: tuple[int, int]  # (D, P) of the epoch that trained it
    alive: int  # instances alive (admitted, not preempted or dead) when the driver saw the step
    time: float  # wall-clock time.time() when the driver saw it
    loss_scale: float | None = None  # float16's loss scale after the step (None: the job scales none)
    skipped: bool = False  # its update was skipped: its scaled gradients overflowed
    lr: float | None = None  # the learning rate it applied, where the spec gives one per step (`TrainSpec.lr`)


@dataclass(frozen=True)
class PlanInfo:
    """One decision of the live planning hook (`trainer.control.planning`), at an interval boundary."""

    interval: int
    step: int  # the boundary the decision applies at
    alive: int
    current: tuple[int, int]
    decision: tuple[int, int]
    decision_s: float
    planner: str
    details: Mapping[str, Any] = field(default_factory=dict)  # e.g. the liveput plan's to_dict()


def fleet_text(event: Mapping[str, Any]) -> str:
    """One line for a live fleet's wait (`JobObserver.on_fleet`), for a log or a progress display."""
    kind = event.get("event")
    if kind == "fleet-waiting":
        need = int(event["need"])
        return f"waiting for the fleet: training starts once {need} instance{'s' * (need != 1)} joined"
    if kind == "fleet-empty":
        return f"the fleet is empty at step {event.get('step')}: {event.get('reason')}; waiting for capacity"
    if kind == "fleet-back":
        workers = ", ".join(map(str, event.get("workers") or []))
        return f"the fleet is back after {float(event['waited_s']):.1f} s: workers {workers}"
    return f"fleet: {dict(event)}"


class ProgressLog:
    """Lines of progress for a log (`parcae train` without a terminal, the train flow's run log): at most one every
    `every_s` of the steps' own times, with the samples a second trained since the line before.

    `line(step)` is the line for a committed step when one is due, else None; `start(info)` takes the job's steps
    and global batch from `JobObserver.on_start`'s info."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self.total: int | None = None
        self.global_batch: int | None = None
        self._last: tuple[int, float] | None = None  # (steps done, time) at the last line

    def start(self, info: Mapping[str, Any]) -> None:
        self.total = int(info["steps"]) if info.get("steps") else None
        self.global_batch = int(info["global_batch"]) if info.get("global_batch") else None

    def line(self, step: StepInfo) -> str | None:
        done, last = step.step + 1, self._last
        if last is not None and step.time - last[1] < self.every_s:
            return None
        text = f"step {done}/{self.total}: loss {step.loss:.4f}, {strategy_text(step.strategy)}, {step.alive} alive"
        if last is not None and self.global_batch and done > last[0]:  # (no rate across a restart's rewind)
            text += f", {(done - last[0]) * self.global_batch / (step.time - last[1]):.1f} samples/s"
        self._last = (done, step.time)
        return text


class JobObserver:
    """Base class: every hook does nothing. Override the ones you need."""

    def on_start(self, info: Mapping[str, Any]) -> None:
        """The first epoch is published. `info`: job, model, workers, strategy, steps, global_batch,
        checkpoint_dir, resumed_from (step or None), host and port (the coordinator's store), planner (name or
        None), steps_per_interval."""

    def on_step(self, step: StepInfo) -> None:
        """A step was committed."""

    def on_validation(self, step: int, loss: float, metrics: Mapping[str, float] | None = None) -> None:
        """The held-out loss (`parcae.Validation`) of the parameters after `step` steps: delivered before the step
        that starts from them (`on_step(step)`), and at the end for the final layers (`step` = the job's steps).
        `metrics`: the validation's own metrics by name (passed only by a spec that has some)."""

    def on_plan(self, plan: PlanInfo) -> None:
        """The planner decided the strategy for the coming interval."""

    def on_reconfiguration(self, record: Mapping[str, Any]) -> None:
        """A reconfiguration is complete: one record of `Coordinator.records()` (kind, notice, pause_s,
        bytes_moved, steps_lost, ...)."""

    def on_checkpoint(self, step: int, directory: Path) -> None:
        """Every shard of the checkpoint of `step` is written: under `directory` where the instances share the
        driver's disk, at the job's checkpoint URI where it has one (workers elsewhere copy them there)."""

    def on_fleet(self, event: Mapping[str, Any]) -> None:
        """A live fleet waits for instances (`fleet_text` says it in words): ``{"event": "fleet-waiting", "need": n}``
        before the job starts (it starts once n have joined); ``{"event": "fleet-empty", "reason": ..., "step": s}``
        when the cloud took every instance (the job waits for capacity) and ``{"event": "fleet-back", "workers":
        [...], "waited_s": t}`` when it trains again, the entries of the job's timeline (its report's ``events``)."""

    def on_end(self, result: Mapping[str, Any]) -> None:
        """The job finished; `result` is `run_job`'s return value."""

    def on_error(self, error: BaseException) -> None:
        """The job failed (or was interrupted); flush and close."""


class ObserverList(JobObserver):
    """Calls each observer in turn; one that raises is logged and dropped, the others go on."""

    def __init__(self, observers: Iterable[JobObserver | None] = ()) -> None:
        self.observers = [o for o in observers if o is not None]

    def _call(self, name: str, *args: Any) -> None:
        for o in list(self.observers):
            try:
                getattr(o, name)(*args)
            except Exception:  # an observer must never fail the job
                log.exception("observer %s failed in %s; it is dropped for the rest of the job", type(o).__name__, name)
                self.observers.remove(o)

    def on_start(self, info: Mapping[str, Any]) -> None:
        self._call("on_start", info)

    def on_step(self, step: StepInfo) -> None:
        self._call("on_step", step)

    def on_validation(self, step: int, loss: float, metrics: Mapping[str, float] | None = None) -> None:
        # (without metrics, as a hook written before they existed takes it)
        self._call("on_validation", step, loss, *([dict(metrics)] if metrics else []))

    def on_plan(self, plan: PlanInfo) -> None:
        self._call("on_plan", plan)

    def on_reconfiguration(self, record: Mapping[str, Any]) -> None:
        self._call("on_reconfiguration", record)

    def on_checkpoint(self, step: int, directory: Path) -> None:
        self._call("on_checkpoint", step, directory)

    def on_fleet(self, event: Mapping[str, Any]) -> None:
        self._call("on_fleet", event)

    def on_end(self, result: Mapping[str, Any]) -> None:
        self._call("on_end", result)

    def on_error(self, error: BaseException) -> None:
        self._call("on_error", error)


class RecordingObserver(JobObserver):
    """Keeps every call as (hook name, argument) in `calls`, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_start(self, info: Mapping[str, Any]) -> None:
        self.calls.append(("start", dict(info)))

    def on_step(self, step: StepInfo) -> None:
        self.calls.append(("step", step))

    def on_validation(self, step: int, loss: float, metrics: Mapping[str, float] | None = None) -> None:
        self.calls.append(("validation", (step, loss, *([dict(metrics)] if metrics else []))))

    def on_plan(self, plan: PlanInfo) -> None:
        self.calls.append(("plan", plan))

    def on_reconfiguration(self, record: Mapping[str, Any]) -> None:
        self.calls.append(("reconfiguration", dict(record)))

    def on_checkpoint(self, step: int, directory: Path) -> None:
        self.calls.append(("checkpoint", (step, Path(directory))))

    def on_fleet(self, event: Mapping[str, Any]) -> None:
        self.calls.append(("fleet", dict(event)))

    def on_end(self, result: Mapping[str, Any]) -> None:
        self.calls.append(("end", result))

    def on_error(self, error: BaseException) -> None:
        self.calls.append(("error", error))

    def of(self, hook: str) -> list[Any]:
        """The arguments of every call to `hook` ("step", "plan", ...), in order."""
        return [a for h, a in self.calls if h == hook]
