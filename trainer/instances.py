"""Instances: where worker processes run, how they come and go — the trainer's view of a (spot) cloud.

Owns: the `InstanceProvider` interface (start instances, preempt them with notice, kill them without, list the
live ones), `LocalProcessProvider` (an instance is a local spawned worker process; used by `trainer.run.run_job`)
and `LocalTraceProvider` / `trace_events` (an availability trace turned into a scripted event schedule for a
local job). Must not touch: the job's control plane (`trainer.coordinator`: a provider never tells workers
anything — the driver does), planning, training.

How the pieces fit: the driver (`trainer.run`) asks the provider for processes and reports to the coordinator
what the provider did; the coordinator tells the workers. A *preemption with notice* is `preempt(ids, notice_s)`:
the provider sends SIGTERM (the cloud's warning), the worker reports the notice through the store, the driver decides
the preemption at the next boundary, the workers hand off their layers and exit, and whatever is still running when
the notice expires is killed — as a spot instance is reclaimed after its two-minute warning. A *kill* is a
reclaim without warning (SIGKILL). `restart(ids)` is the per-instance agent's part, not the cloud's: a fresh worker
process on the same instance after a checkpoint-restart (what torchelastic's agent does).

`LocalTraceProvider` compresses a trace in time: one trace interval (60 s in p3) becomes `interval_seconds` of
wall time, i.e. `steps_per_interval` training steps, and the trace is scaled (`forecasting.traces.scale_trace`) to
the number of local worker processes. A drop in availability becomes preemptions, a seeded share of them without
notice (`kill`); a rise becomes `add`s; a plan follows every change (`trace_strategy`),
unless a live planner (`trainer.planning`) decides the strategy instead (`plans=False`).

EC2 spot instances are `trainer.aws`'s (`aws_spot_provider`), other machines `trainer.hosts`'s.
"""

from __future__ import annotations

import abc
import multiprocessing as mp
import os
import random
import signal as _signal
import threading
import time
from pathlib import Path
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from trainer.config import START_METHODS
from trainer.events import Schedule
from trainer.worker import WorkerSpec, process_main


class InstanceProvider(abc.ABC):
    """Where a job's instances come from. Ids are stable: 0, 1, ... in the order `start` handed them out."""

    @abc.abstractmethod
    def start(self, n: int) -> list[int]:
        """Start `n` new instances (each runs a worker process that joins the job); their ids."""

    @abc.abstractmethod
    def preempt(self, ids: Iterable[int], notice_s: float) -> None:
        """Reclaim `ids` after `notice_s` seconds (those still running then are killed)."""

    @abc.abstractmethod
    def kill(self, ids: Iterable[int]) -> None:
        """Reclaim `ids` now, without notice."""

    @abc.abstractmethod
    def alive(self) -> set[int]:
        """Ids of the instances running now."""


class NumberedInstances(InstanceProvider):
    """The id bookkeeping every provider shares: `start(n)` hands out the next n ids (0, 1, ... in start order),
    `start_ids(ids, next_id)` starts given ids (a resumed job starts those its schedule had alive; ids need not be
    contiguous) and later `start`s number on past them. Subclasses launch (`_launch`, all or nothing: ids whose
    launch failed are not handed out) and say why some ids cannot start again (`_taken`). Thread-safe."""

    def __init__(self) -> None:
        self._next_id = 0
        self._lock = threading.RLock()

    @abc.abstractmethod
    def _launch(self, ids: list[int]) -> None:
        """Start an instance for each of `ids` (called with the lock held)."""

    def _taken(self, ids: list[int]) -> str | None:
        """Why some of `ids` cannot be started now (e.g. they are running), or None."""
        return None

    def start(self, n: int) -> list[int]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        with self._lock:
            ids = list(range(self._next_id, self._next_id + n))
            self._launch(ids)
            self._next_id += n
            return ids

    def start_ids(self, ids: Iterable[int], next_id: int) -> list[int]:
        ids = list(dict.fromkeys(ids))
        with self._lock:
            why = self._taken(ids)
            if why is not None:
                raise ValueError(why)
            self._launch(ids)
            self._next_id = max([self._next_id, next_id, *(w + 1 for w in ids)])
            return ids


class NoticeDeadlines:
    """A preemption with notice as clouds give it, for the driver's view of instances (`LocalProcessProvider`,
    `trainer.agent.AgentInstances`): `preempt(ids, notice_s)` sends SIGTERM (unless `notify` is False: they have
    their notice already) and `_reclaim_due()` kills whatever still runs at the deadline, listing it in
    `reclaimed`. The class using it provides `signal`, `kill`, `exitcodes` and the two attributes."""

    _reclaim_at: dict[int, float]
    reclaimed: list[tuple[int, float]]  # (id, wall time) of instances killed at a notice's deadline

    def preempt(self, ids: Iterable[int], notice_s: float, *, notify: bool = True) -> None:
        """Give `ids` notice (SIGTERM, unless `notify` is False: they already have it) and kill those still running
        `notice_s` seconds from now (an earlier deadline already set stands)."""
        ids = list(ids)
        deadline = time.monotonic() + notice_s
        for w in ids:
            self._reclaim_at[w] = min(self._reclaim_at.get(w, deadline), deadline)
        if notify:
            self.signal(ids, _signal.SIGTERM)  # type: ignore[attr-defined]

    def _reclaim_due(self) -> None:
        now = time.monotonic()
        due = [w for w, t in self._reclaim_at.items() if t <= now]
        for w in due:
            self._reclaim_at.pop(w)
        codes = self.exitcodes()  # type: ignore[attr-defined]
        running = [w for w in due if w in codes and codes[w] is None]
        if running:
            at = time.time()
            self.kill(running)  # type: ignore[attr-defined]
            codes = self.exitcodes()  # type: ignore[attr-defined]
            self.reclaimed.extend((w, at) for w in running if codes.get(w) == -_signal.SIGKILL)


# "spawn": every worker process starts cold (imports torch, ~2.5 s of CPU) — a restart costs what a real one does.
# "forkserver": workers are forked from a server that imported torch once — a warm pool, for fast tests.


class LocalProcessProvider(NoticeDeadlines, NumberedInstances):
    """Instances are local worker processes (`trainer.worker.process_main`) of the job at `host:port`, started
    with `start_method` (see START_METHODS).

    None outlives `stop()` (and each dies with its parent, see `trainer.worker._die_with_parent`). Exit codes of
    every process an instance ran are kept (`exit_history`), the current one is `exitcode(id)`.

    It plays the cloud: `preempt(ids, notice_s)` gives notice as clouds do — SIGTERM now (the worker reports it to
    the job, `trainer.worker.Notice`) — and SIGKILLs whatever still runs at the deadline (`poll`, which the driver
    calls all along; `reclaimed` lists those it killed). With `notify=False` it only enforces the deadline of a
    notice the worker already received some other way (a signal from outside the job). `signal(ids, signum)`
    sends any signal.
    """

    def __init__(
        self, host: str, port: int, token: str | None = None, start_method: str = "spawn",
        driver_key: str | None = None,
    ) -> None:  # fmt: skip
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
        self.host, self.port, self.token, self.driver_key = host, port, token, driver_key
        self.start_method = start_method
        self.ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # the server imports these once; every worker is forked from it with torch (and dynamo, which the first
            # optimiser imports) already loaded: ~0.1 s to start instead of ~2.5 s of CPU
            self.ctx.set_forkserver_preload(["torch", "torch._dynamo", "trainer.worker"])
        super().__init__()
        self.procs: dict[int, Any] = {}
        self.exit_history: dict[int, list[int]] = {}
        self._reclaim_at: dict[int, float] = {}
        self.reclaimed: list[tuple[int, float]] = []  # (id, wall time) of processes killed at a notice's deadline

    def _spawn(self, w: int) -> None:
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # read when the child imports torch
        try:
            # the token travels pickled, never in argv; the driver's key too, so a worker never trusts the store for it
            spec = WorkerSpec(w, self.host, self.port, self.token, driver_key=self.driver_key)
            p = self.ctx.Process(target=process_main, args=(spec,), name=f"parcae-worker-{w}", daemon=True)
            # a Ctrl-C meant for the driver must not hit a child still importing torch: it starts with SIGINT
            # blocked (the mask survives fork and exec) and ignores it from `process_main` on
            mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT})
            try:
                p.start()
            finally:
                _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
            self.procs[w] = p
        finally:
            os.environ.pop("OMP_NUM_THREADS") if old is None else os.environ.__setitem__("OMP_NUM_THREADS", old)

    def _launch(self, ids: list[int]) -> None:
        for w in ids:
            self._spawn(w)

    def _taken(self, ids: list[int]) -> str | None:
        running = sorted(w for w in ids if w in self.procs and self.procs[w].exitcode is None)
        return f"instances {running} are already running" if running else None

    def signal(self, ids: Iterable[int], signum: int) -> list[int]:
        """Send `signum` to the running processes of `ids`; returns the ids it reached."""
        reached = []
        for w in ids:
            p = self.procs.get(w)
            if p is not None and p.exitcode is None and p.pid is not None:
                try:
                    os.kill(p.pid, signum)
                except ProcessLookupError:  # it ended meanwhile
                    continue
                reached.append(w)
        return reached

    def restart(self, ids: Iterable[int]) -> None:
        """The agent's part of a checkpoint-restart: a fresh worker process for each of `ids` (theirs has ended)."""
        for w in ids:
            old = self.procs[w]
            if old.exitcode is None:
                raise RuntimeError(f"instance {w}: its process {old.pid} is still running")
            old.join(timeout=5)
            self.exit_history.setdefault(w, []).append(old.exitcode)
            self._spawn(w)

    def kill(self, ids: Iterable[int]) -> None:
        for w in ids:
            p = self.procs.get(w)
            if p is not None and p.exitcode is None:
                p.kill()
        for w in ids:
            p = self.procs.get(w)
            if p is not None:
                p.join(timeout=5)

    def poll(self) -> None:
        """Enforce expired notices (killed ones are appended to `reclaimed`)."""
        self._reclaim_due()

    def alive(self) -> set[int]:
        self.poll()
        return {w for w, p in self.procs.items() if p.exitcode is None}

    def exitcode(self, w: int) -> int | None:
        return self.procs[w].exitcode

    def exitcodes(self) -> dict[int, int | None]:
        """Every instance's current process's exit code (None: running)."""
        return {w: p.exitcode for w, p in self.procs.items()}

    def pid(self, w: int) -> int | None:
        return self.procs[w].pid

    def running(self, w: int) -> bool | None:
        """Whether instance `w`'s process is running and schedulable (not ended, not stopped): the evidence that a
        silent heartbeat means a starved process on a loaded machine, not a dead or hung one. None if unknown
        (no /proc)."""
        p = self.procs.get(w)
        if p is None or p.exitcode is not None or p.pid is None:
            return False
        try:
            state = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return None
        return state in ("R", "S", "D")  # T/t: stopped (hung, as a partitioned host), Z: exited

    def stop(self) -> None:
        """Reap every process; kill those still running (the job failed or timed out)."""
        for p in self.procs.values():
            p.join(timeout=0.5 if p.exitcode is None else 5)
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


# ------------------------------------------------------------------------------------------------ traces


def trace_strategy(n: int, n_layers: int = 6, global_batch: int = 16) -> tuple[int, int]:
    """The D x P a trace schedule plans for `n` live instances: two stages once there are two instances (so
    changes exercise pipeline, inter- and intra-stage migrations), as many replicas as fit."""
    p = 2 if n >= 2 and n_layers >= 2 else 1
    return max(1, min(n // p, global_batch)), p


def _trace_table(trace: str | pd.DataFrame, workers: int) -> pd.DataFrame:
    from forecasting import load_trace, scale_trace

    df = load_trace(trace) if isinstance(trace, str) else trace
    return scale_trace(df, workers)


def trace_schedule(
    trace: str | pd.DataFrame,
    workers: int,
    steps: int,
    steps_per_interval: int,
    seed: int = 0,
    *,
    kill_fraction: float = 0.5,
    start_interval: int = 0,
    strategy_for: Callable[[int], tuple[int, int]] | None = None,
    plans: bool = True,
) -> Schedule:
    """Turn `trace` (a name for `forecasting.traces.load_trace`, or its table) into a local job's schedule.

    The trace is scaled to `workers` instances; interval `start_interval + i`'s change takes effect at the boundary
    before step `(i + 1) * steps_per_interval` (intervals whose step is not < `steps` are dropped). A rise adds
    instances; a drop preempts randomly chosen live instances (seeded), each without notice (`kill`) with
    probability `kill_fraction`. At least one instance always stays (a drop to zero keeps one). Every change is
    followed by a plan for the new count (`strategy_for`, default `trace_strategy`) — unless `plans` is False: the
    schedule of a job whose live planner (`trainer.planning`) decides the strategy at every interval boundary
    carries the availability changes only.
    """
    if steps_per_interval < 1:
        raise ValueError(f"steps_per_interval must be >= 1, got {steps_per_interval}")
    if not 0.0 <= kill_fraction <= 1.0:
        raise ValueError(f"kill_fraction must be in [0, 1], got {kill_fraction}")
    pick = strategy_for or trace_strategy
    df = _trace_table(trace, workers)
    if not 0 <= start_interval < len(df):
        raise ValueError(f"start_interval {start_interval} outside the trace's {len(df)} intervals")
    rows = df.iloc[start_interval:].reset_index(drop=True)
    rng = random.Random(seed)
    n0 = int(min(max(1, rows["prev_available"].iloc[0]), workers))
    alive = list(range(n0))
    next_id = n0
    strategy = pick(n0)
    events: list[dict[str, Any]] = []
    covered = 0
    for i, available in enumerate(rows["available"]):
        step = (i + 1) * steps_per_interval
        if step >= steps:
            break
        covered = i + 1
        target = int(min(max(1, available), workers))
        if target == len(alive):
            continue
        if target > len(alive):
            n = target - len(alive)
            events.append({"step": step, "kind": "add", "workers": n})
            alive += list(range(next_id, next_id + n))
            next_id += n
        else:
            victims = sorted(rng.sample(alive, len(alive) - target))
            killed = [w for w in victims if rng.random() < kill_fraction]
            noticed = [w for w in victims if w not in killed]
            if noticed:
                events.append({"step": step, "kind": "preempt", "instances": noticed, "notice": True})
            if killed:
                events.append({"step": step, "kind": "kill", "instances": killed})
            alive = [w for w in alive if w not in victims]
        new = pick(len(alive))
        if plans and new != strategy:
            # a plan at the boundary must fit the instances alive *before* this step's kills
            fits = new[0] * new[1] <= len(alive) + sum(len(e["instances"]) for e in events
                                                       if e["step"] == step and e["kind"] == "kill")  # fmt: skip
            if fits:
                events.append({"step": step, "kind": "plan", "strategy": list(new)})
            strategy = new
    return Schedule(workers=n0, strategy=pick(n0), events=events, intervals=covered,
                         steps_per_interval=steps_per_interval)


def trace_events(
    trace: str | pd.DataFrame, workers: int, steps: int, steps_per_interval: int, seed: int = 0, **kw: Any
) -> list[dict[str, Any]]:
    """The events of `trace_schedule` (start the job with `trace_schedule(...).workers` instances)."""
    return trace_schedule(trace, workers, steps, steps_per_interval, seed, **kw).events


class LocalTraceProvider:
    """A trace replayed on local processes, compressed in time: one trace interval lasts `interval_seconds`.

    `schedule(steps, step_seconds)` converts the wall-clock compression into steps (`steps_per_interval =
    round(interval_seconds / step_seconds)`, at least 1) and returns the `Schedule` for `run_job`, which runs
    it on a `LocalProcessProvider`.
    """

    def __init__(
        self, trace: str | pd.DataFrame = "p3", workers: int = 4, interval_seconds: float = 2.0, seed: int = 0,
        *, kill_fraction: float = 0.5, start_interval: int = 0,
    ) -> None:  # fmt: skip
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds}")
        self.trace, self.workers, self.interval_seconds, self.seed = trace, workers, interval_seconds, seed
        self.kill_fraction, self.start_interval = kill_fraction, start_interval

    def steps_per_interval(self, step_seconds: float) -> int:
        return max(1, round(self.interval_seconds / step_seconds))

    def schedule(self, steps: int, step_seconds: float = 0.1, *, plans: bool = True) -> Schedule:
        """The schedule (`trace_schedule`); `plans=False` for a job with a live planner (availability only)."""
        return trace_schedule(
            self.trace, self.workers, steps, self.steps_per_interval(step_seconds), self.seed,
            kill_fraction=self.kill_fraction, start_interval=self.start_interval, plans=plans,
        )  # fmt: skip


def chaos_schedule(
    workers: int,
    steps: int,
    n_events: int,
    seed: int = 0,
    *,
    model: Any = None,
    train: Any = None,
    max_workers: int = 5,
    max_restarts: int = 1,
    kinds: tuple[str, ...] = ("plan", "preempt", "kill", "add"),
) -> Schedule:
    """A seeded random schedule of `n_events` events (plans, preemptions with notice, kills, additions) that the
    coordinator can carry out: every prefix passes `check_schedule`, at most `max_workers` instances are alive at
    once and at most `max_restarts` kills lose a layer's last holder (a checkpoint-restart, seconds each).

    Events fall on steps 1..steps-2, at most two per step. Raises ValueError if the steps are too few to place them.
    """
    from liveput import MigrationKind
    from trainer.config import TrainConfig, model_config
    from trainer.coordinator import ScheduleError, check_schedule
    from trainer.events import EventError, group_events, parse_events

    model = model or model_config("tiny-gpt")
    train = train or TrainConfig()
    n_layers = model.n_layers_total
    rng = random.Random(seed)
    strategy = trace_strategy(workers, n_layers, train.global_batch)
    events: list[dict[str, Any]] = []
    alive = list(range(workers))
    next_id = workers

    def dry_run(candidate: list[dict[str, Any]]) -> list[Any] | None:
        try:
            epochs = check_schedule(model, train, workers, strategy, steps, group_events(parse_events(candidate)))
        except (ScheduleError, EventError):
            return None
        return epochs if sum(e.kind is MigrationKind.CHECKPOINT_RESTART for e in epochs) <= max_restarts else None

    for step in range(1, steps - 1):
        if len(events) >= n_events:
            break
        remaining_steps = steps - 1 - step
        need = n_events - len(events)
        per_step = 2 if need > remaining_steps else rng.choice((1, 1, 2))
        for _ in range(per_step):
            if len(events) >= n_events:
                break
            for _try in range(8):
                kind = rng.choice(kinds)
                if kind == "add":
                    if len(alive) >= max_workers:
                        continue
                    e: dict[str, Any] = {"step": step, "kind": "add", "workers": 1}
                elif kind in ("preempt", "kill"):
                    taken = {w for x in events if x["step"] == step for w in x.get("instances", ())}
                    pool = [w for w in alive if w not in taken]
                    if len(alive) < 2 or not pool:
                        continue
                    e = {"step": step, "kind": kind, "instances": [rng.choice(pool)]}
                    if kind == "preempt":
                        e["notice"] = True
                else:
                    if any(x["step"] == step and x["kind"] == "plan" for x in events):
                        continue
                    n = len(alive)
                    last = dry_run(events)[-1]  # the strategy in force: a plan must change it
                    options = [(d, p) for p in range(1, min(n, n_layers) + 1) for d in range(1, n // p + 1)
                               if d <= train.global_batch and (d, p) != (last.D, last.P)]  # fmt: skip
                    if not options:
                        continue
                    e = {"step": step, "kind": "plan", "strategy": list(rng.choice(options))}
                if dry_run(events + [e]) is not None:
                    events.append(e)
                    if kind == "add":
                        alive.append(next_id)
                        next_id += 1
                    elif kind in ("preempt", "kill"):
                        alive.remove(e["instances"][0])
                    break
    if len(events) < n_events:
        raise ValueError(f"placed only {len(events)} of {n_events} events in {steps} steps; give more steps")
    return Schedule(workers=workers, strategy=strategy, events=events)
