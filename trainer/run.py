"""Run one elastic job end to end on this machine: a coordinator, worker processes, a scripted event schedule.

Owns: `run_job` (used by the tests, the benchmark and, later, the CLI: `train`), the driver loop that applies the
schedule (`_Driver`), the reaction to failures (detection -> recovery or checkpoint-restart), the worker processes'
lifetime through a `trainer.instances.LocalProcessProvider` (none outlives the call) and the job's result. Must not
touch: planning (`trainer.migration`), the control plane's store layout (`trainer.coordinator`), training
(`trainer.worker`).

How a schedule is driven: every event step's boundary is *held* before any worker starts (a scripted schedule is a
perfect forecast), so workers reaching it wait for its decision and each reconfiguration lands exactly at its step.
Events are then decided in order as soon as possible — a preemption with notice or a plan needs nothing from the
workers; an `add` starts the new instances' processes when the schedule reaches it (i.e. right after the previous
reconfiguration is published) and is decided once they have joined, so if they are slower to start than training
is to reach the step, the hold shows up in that migration's pause (as a real scale-up's rendezvous would).

A `kill` at step s: the boundary before s+1 is held as well, the driver waits until the victim has *started* step s
(its `ctl/at` key) and SIGKILLs it — mid-step, or at the latest while it waits at boundary s+1. Nothing tells the
survivors: the coordinator sees the victim's heartbeat stop (`hb_timeout_s`), flags the epoch broken, the survivors
abandon the step in flight (nothing applied) and report the step to redo, and the coordinator publishes a live
migration from the survivors if every layer still has a live holder, else the driver runs a checkpoint-restart from
the latest complete checkpoint (the steps since it are recomputed: `steps_lost`). The same recovery runs for any
worker whose heartbeat stops. A `checkpoint-restart` event does the same restart on demand at its boundary, after
checkpointing there (no step lost). Before any plan the driver waits until every alive instance's heartbeat is
fresh (`_Driver.settle`): two instances killed together are detected a moment apart, and the second must not be
given a role or a transfer by the recovery from the first.

Not recovered: a death *during* a migration's hand-off (the transfer group fails at its timeout and the job fails
with `JobError`); scripted kills therefore land mid-step, once every member has formed the epoch's groups.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


from trainer import checkpoint
from trainer.config import ModelConfig, TrainConfig, model_config
from trainer.coordinator import Coordinator, ScheduleError, check_schedule
from trainer.events import Event, EventGroup, group_events, load_events, parse_events
from trainer.instances import LocalProcessProvider, LocalTraceProvider
from trainer.model import layer_names
from trainer.pipeline import parameters_checksum
from trainer.worker import EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART

POLL_S = 0.005
KILLED = -9  # exit code of a SIGKILLed process
NOTICE_S = 120.0  # a preempted worker still running this long after its notice is killed (AWS: two minutes)


class JobError(RuntimeError):
    """A job that started but did not finish: a worker failed, exited unexpectedly or the job timed out."""


class _Driver:
    """Applies one job's schedule: the provider's processes on one side, the coordinator's decisions on the other."""

    def __init__(
        self, coord: Coordinator, provider: LocalProcessProvider, groups: Sequence[EventGroup], steps: int,
        deadline: float, pg_timeout_s: float, max_processes: int,
    ) -> None:  # fmt: skip
        self.coord, self.provider, self.groups, self.steps = coord, provider, list(groups), steps
        self.deadline, self.pg_timeout_s = deadline, pg_timeout_s
        self.allowed: dict[int, set[int]] = {}  # exit codes each instance's current process may end with
        self.max_processes = max_processes
        self._started: dict[int, list[int]] = {}  # group index -> ids started for its `add` (maybe ahead of time)
        self._recovering = False
        self._no_death_recoveries = 0

    # -- waiting --------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise `JobError` if a process ended with a code it was not expected to."""
        self.provider.poll()
        for w, p in self.provider.procs.items():
            code = p.exitcode
            if code is not None and code not in self.allowed.get(w, {EXIT_DONE}):
                c = self.coord
                msg = c.message("error", w) or c.message("rejected", w)
                raise JobError(f"worker {w} exited with code {code}" + (f": {msg}" if msg else " (no message)"))

    def tick(self) -> None:
        self.check()
        if self._recovering:
            return
        stale = self.coord.check_heartbeats()
        if stale or self.coord.epoch_broken():
            self.recover(stale)

    def wait(self, cond: Callable[[], bool], what: str, timeout_s: float | None = None) -> None:
        end = self.deadline if timeout_s is None else min(self.deadline, time.monotonic() + timeout_s)
        while not cond():
            self.tick()
            if time.monotonic() > end:
                raise JobError(f"timed out waiting for {what}")
            time.sleep(POLL_S)

    def settle(self) -> set[int]:
        """Wait until every alive instance's heartbeat is fresh; returns those that went silent meanwhile (the caller
        declares them dead). Typically returns at once; a silent one takes up to the heartbeat timeout."""
        c = self.coord
        silent: set[int] = set()
        end = time.monotonic() + c.hb_timeout_s + 1.0
        while True:
            silent |= c.check_heartbeats(every_s=0)
            if not (c.unsettled() - silent) or time.monotonic() > end:
                return silent
            self.check()
            time.sleep(POLL_S)

    def start_instances(self, n: int) -> list[int]:
        ids = self.provider.start(n)
        self.coord.expect(ids)
        for w in ids:
            self.allowed[w] = {EXIT_DONE}
        return ids

    def wait_joined(self, ids: Sequence[int]) -> None:
        self.coord.wait_joined(ids, self.deadline - time.monotonic(), self.check)

    # -- the schedule -----------------------------------------------------------------------------------------
    def run(self, workers: int, strategy: tuple[int, int]) -> None:
        c = self.coord
        group_steps = {g.step for g in self.groups}
        holds = group_steps | {g.step + 1 for g in self.groups if g.kill}
        for s in sorted(holds):
            c.claim(s)
        ids = self.start_instances(workers)
        self.wait_joined(ids)
        c.start(strategy, ids)
        for i, g in enumerate(self.groups):
            self.apply(i, g)
            if g.kill and g.step + 1 not in group_steps:
                c.release(g.step + 1)
        # the final epoch trains to the end and writes its shards
        self.wait(lambda: all(self.provider.exitcode(w) == EXIT_DONE for w in c.current.members), "the last step")

    def prestart(self, first: int) -> None:
        """Start the processes of upcoming `add`s early (in schedule order, so ids stay as scheduled) while fewer than
        `max_processes` run: an added instance is then ready at its step instead of holding training ~2-3 s while
        it imports torch. The coordinator admits it only at its event (`Coordinator.alive`)."""
        for i in range(first, len(self.groups)):
            g = self.groups[i]
            if not g.add or i in self._started:
                continue
            if len(self.provider.alive()) + g.add > self.max_processes:
                return
            self._started[i] = self.start_instances(g.add)

    def apply(self, i: int, g: EventGroup) -> None:
        c = self.coord
        self.prestart(i)
        if g.add and i not in self._started:
            self._started[i] = self.start_instances(g.add)
        added = self._started.get(i, [])
        self.wait_joined(added)
        silent = self.settle()  # plan only with instances known to be alive
        if silent:
            self.recover(silent)
        if g.restart:
            c.admit(added)
            self.checkpoint_restart(g.step, g.strategy, on_demand=True)
        else:
            c.reconfigure(g.step, g.strategy, g.preempt, added)
            for w in g.preempt:
                self.allowed[w] = {EXIT_PREEMPTED, KILLED}
            self.provider.preempt(g.preempt, NOTICE_S)
        if g.kill:
            self.kill(g.step, g.kill)

    def kill(self, step: int, victims: Sequence[int]) -> None:
        """SIGKILL `victims` once they have started `step` (standby victims: once training has), then wait until the
        coordinator has noticed and the job has recovered."""
        c = self.coord
        members = set(c.current.members)
        in_epoch = [v for v in victims if v in members]

        def started() -> bool:
            # every member has formed the epoch's groups (a kill inside group formation is only noticed at the
            # group timeout), and the victims are inside step `step`
            if c.ready() != members:
                return False
            if in_epoch:
                return all(c.progress(v) >= step for v in in_epoch)
            return any(c.progress(m) >= step for m in members)

        self.wait(started, f"workers {sorted(victims)} to start step {step}")
        for v in victims:
            self.allowed[v] = {KILLED, EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART}
        at = time.time()
        self.provider.kill(victims)
        c.note_killed(victims, at)
        self.wait(lambda: set(victims) <= c.dead, f"the death of {sorted(victims)} to be detected")

    # -- failures ---------------------------------------------------------------------------------------------
    def recover(self, stale: Iterable[int]) -> None:
        """The current epoch broke, or heartbeats stopped: declare the dead, collect the survivors' reports, then
        continue with a live migration or, failing that, a checkpoint-restart."""
        c = self.coord
        self._recovering = True
        try:
            dead = set(stale)
            report_by = time.monotonic() + self.pg_timeout_s + 2 * c.hb_timeout_s + 5
            while True:
                if dead:
                    for w in dead:
                        self.allowed[w] = {KILLED, EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART, 1, 3}
                    c.declare_dead(dead)
                    self.provider.kill(dead)  # fence: a hung worker must not come back into the job
                if not c.epoch_broken():
                    return  # a standby instance died: nothing to redo
                survivors = set(c.current.members) - c.dead
                if not survivors:
                    reports: dict[int, int] = {}
                    break
                dead = c.check_heartbeats()
                if dead:
                    continue
                self.check()
                reports = c.abandoned()
                if survivors <= reports.keys():
                    break
                if time.monotonic() > report_by:
                    raise JobError(f"survivors {sorted(survivors - reports.keys())} of epoch {c.current.number} "
                                   "did not report after it broke")  # fmt: skip
                time.sleep(POLL_S)
            more = self.settle()  # a standby killed with the member must not be planned in
            if more:
                c.declare_dead(more)
                self.provider.kill(more)
                for w in more:
                    self.allowed[w] = {KILLED, EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART, 1, 3}
                survivors -= more
            if not (c.dead & set(c.current.members)):
                self._no_death_recoveries += 1
                if self._no_death_recoveries > 3:
                    raise JobError(f"epoch {c.current.number} keeps breaking with every worker alive: "
                                   f"{c.epoch_broken()}")  # fmt: skip
            redo = set(reports.values())
            if len(redo) > 1:
                raise JobError(f"survivors disagree on the step to redo: {reports}")
            if redo:
                r = redo.pop()
            else:  # nobody survived: the step is the one the dead started last
                r = max(c.progress(w) for w in c.current.members)
            if c.recover(r) is None:
                self.checkpoint_restart(r, None, on_demand=False, survivors=sorted(survivors))
        finally:
            self._recovering = False

    def checkpoint_restart(
        self, step: int, strategy: tuple[int, int] | None, *, on_demand: bool, survivors: Sequence[int] = ()
    ) -> None:
        """What torchrun does: stop every worker process of the epoch, start fresh ones, load the latest complete
        checkpoint into `strategy`, continue. On demand (at the held boundary before `step`) the members first
        write the checkpoint of `step`; after a failure the survivors' state is discarded."""
        c = self.coord
        was, self._recovering = self._recovering, True
        try:
            ids = c.restart_members()
            for w in ids:
                self.allowed[w] = {EXIT_RESTART}
            c.order_restart(ids if not on_demand else (), step=step if on_demand else None)
            self.wait(lambda: all(self.provider.exitcode(w) is not None for w in ids),
                      f"workers {ids} to exit for a checkpoint-restart", self.pg_timeout_s + 30)  # fmt: skip
            self.check()
            restore = c.latest_checkpoint()
            if on_demand and restore != step:
                raise JobError(f"checkpoint-restart at step {step}: the latest complete checkpoint is {restore}")
            c.clear_restart(ids)
            c.expect(ids)
            self.provider.restart(ids)
            for w in ids:
                self.allowed[w] = {EXIT_DONE}
            self.wait_joined(ids)
            c.publish_restart(restore, strategy, ids if on_demand else survivors, steps_lost=step - restore)
        finally:
            self._recovering = was


def peak_instances(workers: int, groups: Sequence[EventGroup]) -> int:
    """The most instances alive at once under the schedule (adds before the same step's departures)."""
    alive = peak = workers
    for g in groups:
        alive += g.add
        peak = max(peak, alive)
        alive -= len(g.preempt) + len(g.kill)
    return peak


def run_job(
    model_cfg: ModelConfig | str,
    train_cfg: TrainConfig,
    workers: int,
    strategy: tuple[int, int],
    steps: int,
    events: Sequence[Event | Mapping[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    job: str = "job",
    host: str = "127.0.0.1",
    token: str | None = None,
    require_token: bool | None = None,
    pg_timeout_s: float = 30.0,
    timeout_s: float = 180.0,
    checkpoint_every: int = 0,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    hb_interval_s: float = 0.1,
    hb_timeout_s: float = 1.0,
    max_processes: int | None = None,
    start_method: str = "spawn",
) -> dict[str, Any]:
    """Train `steps` steps on `workers` initial instances starting at `strategy` = (D, P), applying `events`.

    Everything is validated before a process starts (unknown model, impossible strategies, bad events, an
    `out_dir` holding an earlier job's files: `UnknownModelError`, `ScheduleError`, `EventError`); a job that
    starts but fails raises `JobError` with the failing worker's message, and no worker outlives the call.
    `events` are dicts in the `trainer.events` format or `Event`s. Every `checkpoint_every` steps (0: never) the
    replica 0 of each stage writes its shard to `checkpoint_dir` (default `out_dir/checkpoints`); a
    checkpoint-restart loads the latest complete one. Added instances are started ahead of their event while fewer
    than `max_processes` worker processes run (default: the most instances the schedule has alive at once).
    `start_method` is how worker processes start (`trainer.instances.START_METHODS`: "spawn", cold like a real
    restart, or "forkserver", a warm pool).
    Returns (JSON-serialisable)::

        {"loss": [loss of each step], "reconfigurations": [one record per reconfiguration, see
         Coordinator.records], "final_checksum": sha256 of all parameters, "layers": directory of the final
         shards (one per final stage), "replicas": {worker id: {"stage", "replica", "digest"}} of the final epoch,
         "latest_checkpoint": step, "throughput": {"steps_per_s", "samples_per_s", "tokens_per_s", "train_s"},
         "events": the coordinator's log, "states": {worker id: its state transitions},
         "exit_codes": {worker id: code of its last process}, "wall_s": seconds}
    """
    t0 = time.monotonic()
    model = model_config(model_cfg) if isinstance(model_cfg, str) else model_cfg
    evs = parse_events(list(events))
    groups = group_events(evs)
    check_schedule(model, train_cfg, workers, tuple(strategy), steps, groups)
    if max_processes is None:
        max_processes = max(workers, peak_instances(workers, groups))
    if checkpoint_every < 0:
        raise ScheduleError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
    out = Path(out_dir)
    layers_dir = out / "layers"
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else out / "checkpoints"
    for d in (layers_dir, ckpt_dir):
        if d.exists() and any(d.iterdir()):
            raise ScheduleError(f"{d} already holds files (of an earlier job?); give run_job a fresh out_dir")
    coord = Coordinator(
        model, train_cfg, steps, layers_dir=str(layers_dir), checkpoint_dir=str(ckpt_dir),
        checkpoint_every=checkpoint_every, job=job, host=host, token=token, require_token=require_token,
        pg_timeout_s=pg_timeout_s, hb_interval_s=hb_interval_s, hb_timeout_s=hb_timeout_s,
    )  # fmt: skip
    provider = LocalProcessProvider(coord.host, coord.port, token, start_method)
    driver = _Driver(coord, provider, groups, steps, t0 + timeout_s, pg_timeout_s, max_processes)
    ok = False
    try:
        driver.run(workers, tuple(strategy))
        t_train = time.time() - float(coord.store.get("ctl/e1/decided"))
        coord.finish()
        driver.wait(lambda: all(p.exitcode is not None for p in provider.procs.values()), "every process to end")
        shards = checkpoint.find_shards(layers_dir, steps)
        final = checkpoint.load(shards, config=model, job=job)
        samples = steps * train_cfg.global_batch
        result = {
            "loss": coord.losses(),
            "reconfigurations": coord.records(),
            "final_checksum": parameters_checksum(final.layers, layer_names(model)),
            "layers": str(layers_dir),
            "replicas": {w: json.loads(coord.store.get(f"final/{w}")) for w in coord.current.members},
            "latest_checkpoint": coord.latest_checkpoint(),
            "throughput": {"steps_per_s": steps / t_train, "samples_per_s": samples / t_train,
                           "tokens_per_s": samples * model.block_size / t_train, "train_s": t_train},
            "events": coord.log,
            "states": {w: coord.states(w) for w in sorted(provider.procs)},
            "exit_codes": {w: p.exitcode for w, p in sorted(provider.procs.items())},
            "wall_s": time.monotonic() - t0,
        }
        ok = True
        return result
    except TimeoutError as e:
        raise JobError(str(e)) from None
    finally:
        if not ok:
            coord.abort("run_job failed")
        provider.stop()


def train(
    workers: int = 4,
    *,
    model: str | ModelConfig = "tiny-gpt",
    steps: int = 40,
    strategy: tuple[int, int] | None = None,
    events_file: str | os.PathLike[str] | None = None,
    trace: str | None = None,
    interval_seconds: float = 2.0,
    step_seconds: float = 0.1,
    seed: int = 0,
    out_dir: str | os.PathLike[str] = "runs/train",
    json_out: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 10,
    train_cfg: TrainConfig | None = None,
    timeout_s: float = 600.0,
    start_interval: int = 0,
    kill_fraction: float = 0.5,
    start_method: str = "spawn",
) -> dict[str, Any]:
    """What `parcae train` runs: a local elastic job on `workers` processes, from an events file, a trace
    (`trace_schedule` via `LocalTraceProvider`: one interval lasts `interval_seconds`, i.e.
    `interval_seconds / step_seconds` steps) or no events; the report is `job_report(result)` (also written to
    `json_out`)."""
    if events_file is not None and trace is not None:
        raise ValueError("give an events file or a trace, not both")
    events: list[Any] = []
    n = workers
    if trace is not None:
        provider = LocalTraceProvider(trace, workers, interval_seconds, seed, kill_fraction=kill_fraction,
                                      start_interval=start_interval)  # fmt: skip
        sched = provider.schedule(steps, step_seconds)
        n, events = sched.workers, sched.events
        strategy = strategy or sched.strategy
    elif events_file is not None:
        events = load_events(events_file)
    mcfg = model_config(model) if isinstance(model, str) else model
    if strategy is None:
        from trainer.instances import trace_strategy

        strategy = trace_strategy(n, mcfg.n_layers_total)
    result = run_job(mcfg, train_cfg or TrainConfig(steps=steps), n, strategy, steps, events, out_dir,
                     checkpoint_every=checkpoint_every, timeout_s=timeout_s, start_method=start_method)  # fmt: skip
    report = job_report(result)
    if json_out is not None:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(report, indent=2))
    return report


def job_report(result: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON a CLI writes: the loss per step, throughput, each reconfiguration (kind, notice, pause_s,
    bytes_moved, steps_lost, ...) and the final parameter checksum."""
    keep = ("epoch", "kind", "notice", "step", "strategy", "preempted", "lost", "pause_s", "hold_s", "detect_s",
            "bytes_moved", "steps_lost", "restore_step")  # fmt: skip
    return {
        "loss": list(result["loss"]),
        "throughput": dict(result["throughput"]),
        "reconfigurations": [{k: r[k] for k in keep} for r in result["reconfigurations"]],
        "final_checksum": result["final_checksum"],
        "wall_s": result["wall_s"],
    }
