"""The progress display of ``parcae train``: a `trainer.observe.observer.JobObserver` that draws a rich progress bar.

Owns: what a user watching a training job sees on stderr while it runs — steps done / total, the current loss, the
strategy D x P, the instances alive and the last migration's kind on one bar, plus one line per reconfiguration
(`format_reconfiguration`). Must not touch: the job (it only reads what the driver hands its hooks), stdout (the
command prints its results there), MLflow.

On a terminal the bar is live and stays on screen when the job ends (not transient); the reconfiguration lines, and
a live fleet's waits for instances, are printed above it as they happen. When the console is not a terminal (piped,
a CI log) there is no bar, no cursor control: those lines, one each, and a line of progress at most every
`log_every_s` (30 s) of training with the samples a second since the last, so the log reads as a record of the
job and shows it is alive.

The driver calls the hooks from its own thread between control decisions (see `trainer.observe.observer`), so every hook
only updates a few fields; rich redraws from its own refresh thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from liveput import strategy_text
from trainer import JobObserver, ProgressLog, StepInfo, fleet_text


def _pair(strategy: Sequence[int]) -> tuple[int, int]:
    """(D, P) as a tuple of ints: records from JSON carry strategies as lists."""
    return int(strategy[0]), int(strategy[1])


def scores_text(metrics: Mapping[str, float] | None) -> str:
    """A validation's own metrics as they follow its loss on a line: ", accuracy 0.9562"."""
    return "".join(f", {name} {value:.4f}" for name, value in (metrics or {}).items())


def migration_label(record: Mapping[str, Any]) -> str:
    """The kind of a reconfiguration as the bar shows it: "pipeline", or "inter-stage (kill)" without notice."""
    kind = str(record.get("kind", "?"))
    return kind if record.get("notice", True) else f"{kind} (kill)"


def _ids(workers: Sequence[int]) -> str:
    return ", ".join(map(str, workers))


def trigger_text(record: Mapping[str, Any]) -> str:
    """What made a reconfiguration, with the workers it concerns: "planned", "addition (joined 4)", "notice
    (preempted 3)" or "kill (lost 2)" (a record without a trigger, from before it had one: "notice" or "no notice")."""
    trigger = record.get("trigger")
    if trigger is None:
        lost = record.get("lost") or []
        text = "notice" if record.get("notice", True) else f"no notice (lost {_ids(lost)})" if lost else "no notice"
        return text + (f", preempted {_ids(record['preempted'])}" if record.get("preempted") else "")
    field = {"kill": "lost", "notice": "preempted", "addition": "joined"}.get(str(trigger))  # the workers it names
    listed = (record.get(field) or []) if field else []
    return f"{trigger} ({field} {_ids(listed)})" if listed else str(trigger)


def format_reconfiguration(record: Mapping[str, Any]) -> str:
    """One line for one reconfiguration record (`trainer.control.coordinator.Coordinator.records`), e.g.
    ``step 12: pipeline -> 1x4, notice (preempted 3), pause 0.153 s, 1.20 MB moved``."""
    parts = [f"step {record.get('step', '?')}: {record.get('kind', '?')} -> {strategy_text(record.get('strategy'))}",
             trigger_text(record)]  # fmt: skip
    if record.get("pause_s") is not None:
        parts.append(f"pause {record['pause_s']:.3f} s")
    if record.get("bytes_moved") is not None:
        parts.append(f"{record['bytes_moved'] / 1e6:.2f} MB moved")
    if record.get("steps_lost"):
        restored = record.get("restore_step")
        parts.append(f"{record['steps_lost']} steps lost" + (f" (restored step {restored})" if restored is not None
                                                              else ""))  # fmt: skip
    return ", ".join(parts)


class TrainProgress(JobObserver):
    """Shows a job's progress on `console` (default: stderr). Use it as a context manager around the job, or rely
    on `on_end` / `on_error` to stop the bar; `stop()` is idempotent.

    `live` is whether a bar is drawn (the console is a terminal); otherwise lines are printed: reconfigurations,
    the fleet's waits, and progress at most every `log_every_s` of the steps' own times (`trainer.ProgressLog`).
    """

    def __init__(self, console: Console | None = None, *, refresh_per_second: float = 4.0,
                 log_every_s: float = 30.0) -> None:  # fmt: skip
        self.console = console if console is not None else Console(stderr=True, highlight=False)
        self.live = self.console.is_terminal
        self.log = ProgressLog(log_every_s)
        self.total: int | None = None
        self.steps_done = 0
        self.loss: float | None = None
        self.strategy: tuple[int, int] | None = None
        self.alive: int | None = None
        self.last_migration: str | None = None
        self.reconfigurations = 0
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._refresh = refresh_per_second

    # -- the bar ---------------------------------------------------------------------------------------------
    def _fields(self) -> dict[str, Any]:  # str values; Any, as rich's **fields are typed
        return {
            "loss": "-" if self.loss is None else f"{self.loss:.4f}",
            "strategy": strategy_text(self.strategy),
            "alive": "-" if self.alive is None else str(self.alive),
            "last": self.last_migration or "none",
        }

    def _update(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self.steps_done, total=self.total, **self._fields())

    def stop(self) -> None:
        """Draw the final state and release the terminal (the bar stays on screen)."""
        if self._progress is not None:
            self._update()
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> TrainProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    # -- the hooks -------------------------------------------------------------------------------------------
    def on_start(self, info: Mapping[str, Any]) -> None:
        self.total = int(info["steps"])
        self.log.start(info)
        self.steps_done = int(info.get("resumed_from") or 0)
        strategy = info.get("strategy")
        self.strategy = _pair(strategy) if strategy else None
        workers = info.get("workers")
        self.alive = len(workers) if isinstance(workers, Sequence) else workers
        if info.get("resume_note"):  # where a resumed job continues from (and what it skipped)
            self.console.print(str(info["resume_note"]), highlight=False, soft_wrap=True)
        if str(info.get("planner") or "").startswith(
            "handed"
        ):  # where plans can be handed in (trainer.control.planning.hand_plan)
            self.console.print(f"handed plans: coordinator {info.get('host')}:{info.get('port')}, job "
                               f"{info.get('job')!r}, token in {info.get('token_file')}", highlight=False,
                               soft_wrap=True)  # fmt: skip
        if not self.live or self._progress is not None:
            return
        # e.g. "━━━━━━━━━━━╸━━━━━━━━ 12/30 steps loss 3.0963 2x2 4 alive last: pipeline 0:00:03": fits 80 columns
        self._progress = Progress(
            BarColumn(bar_width=20), MofNCompleteColumn(), TextColumn("steps"), TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[strategy]}"), TextColumn("{task.fields[alive]} alive"),
            TextColumn("last: {task.fields[last]}"), TimeElapsedColumn(),
            console=self.console, transient=False, refresh_per_second=self._refresh,
        )  # fmt: skip
        self._task = self._progress.add_task("train", total=self.total, completed=self.steps_done, **self._fields())
        self._progress.start()

    def on_step(self, step: StepInfo) -> None:
        # a step recomputed after a checkpoint-restart is reported again: the count goes back, truthfully
        self.steps_done = step.step + 1
        self.loss = step.loss
        self.strategy = _pair(step.strategy)
        self.alive = step.alive
        self._update()
        if not self.live and (line := self.log.line(step)) is not None:
            self.console.print(line, highlight=False, soft_wrap=True)

    def on_validation(self, step: int, loss: float, metrics: Mapping[str, float] | None = None) -> None:
        # one line per validation, above the bar while it is live
        self.console.print(f"validation loss {loss:.4f}{scores_text(metrics)} after {step} steps", highlight=False,
                           soft_wrap=True)  # fmt: skip

    def on_reconfiguration(self, record: Mapping[str, Any]) -> None:
        self.reconfigurations += 1
        self.last_migration = migration_label(record)
        if record.get("strategy"):
            self.strategy = _pair(record["strategy"])
        # while the bar is live, rich prints this above it; otherwise it is just the next line of the log
        self.console.print(format_reconfiguration(record), highlight=False, soft_wrap=True)
        self._update()

    def on_fleet(self, event: Mapping[str, Any]) -> None:
        self.console.print(fleet_text(event), highlight=False, soft_wrap=True)

    def on_end(self, result: Mapping[str, Any]) -> None:
        if self.total is not None:
            self.steps_done = self.total
        self.stop()

    def on_error(self, error: BaseException) -> None:
        self.stop()
