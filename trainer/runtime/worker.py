"""One worker process per instance: joins the job, trains its stage, live-migrates at step boundaries, survives the
death of its peers.

Owns: the worker's state machine (`WorkerState`, `Worker`), the per-step boundary check and commit, the heartbeat
thread (which also reports preemption notices: `Notice`, SIGTERM), periodic checkpoint shards, when and in which
order a migration's hand-off runs (transfer group, sends/receives, install, commit or rollback), when preparations
start and are taken (the watcher, the helper that forms their groups, what is sent and read ahead), the
abandon-and-report of a broken epoch, and its own measurements in the store.
Must not touch: planning (it follows the `Epoch` the coordinator published; `trainer.runtime.migration`), the
training maths (`trainer.runtime.pipeline.train_step`), the hand-off's messages and catch-up
(`trainer.runtime.handoff`), what a preparation holds and its helpers move (`trainer.runtime.preparation`), other
workers' processes.

Where to look next: `docs/worker.md` (the state machine and its exit codes, what changes at a migration, failure
detection, the state hand-off, commit and rollback, preemption notices, in detail), `trainer.runtime.keys` (the store
keys it reads and writes), `trainer.control.coordinator` (the other side of every decision).
"""

from __future__ import annotations

import argparse
import enum
import json
import math
import os
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.distributed.distributed_c10d import Store

from liveput import MigrationKind
from trainer.runtime import checkpoint, handoff, keys, loss_scale, wire
from trainer.runtime.checkpoint_mirror import FINAL, CheckpointMirror, ShardUploader, gather_shards, mirror_for
from trainer.runtime.data import Prefetcher
from trainer.runtime.devices import DeviceError, resolve_device
from trainer.runtime.migration import Epoch, state_bytes
from trainer.runtime.model import layer_names, model_fingerprint, spec_of
from trainer.runtime.pipeline import (
    EpochGroups,
    HeldLayers,
    LayerState,
    StageContext,
    StepAbandoned,
    build_context,
    close_epoch,
    fresh_layers,
    gloo_address,
    gloo_group,
    hollow_layers,
    init_epoch,
    make_optimizer,
    parameters_checksum,
    train_step,
    validate,
)
from trainer.runtime.preparation import POLL_MAX_S, POLL_MIN_S, Prepared
from trainer.runtime.spec import ABORT, APPLY, HOLD, TRAIN, JobSpec
from trainer.runtime.store import DRIVER_KEY_ENV, TOKEN_ENV, SealedStore, StoreAuthError, connect_store
from trainer.runtime.trainspec import SpecError
from trainer.runtime.validation import Patience, Validation

# 13 and 125 are the reference's codes: "preempted", and "not needed in this configuration: restart me"
EXIT_DONE, EXIT_FAILED, EXIT_TOKEN, EXIT_ABORTED, EXIT_PREEMPTED, EXIT_RESTART = 0, 1, 2, 3, 13, 125
# how long the preparation watcher blocks in the store at a time (torch logs a warning line at each timeout)
PREPARE_WAIT_S = 3600.0
_T = TypeVar("_T")


class WorkerState(enum.Enum):
    JOINING = "JOINING"
    STANDBY = "STANDBY"
    TRAINING = "TRAINING"
    MIGRATING = "MIGRATING"
    RECOVERING = "RECOVERING"
    RESTARTING = "RESTARTING"
    PREEMPTED = "PREEMPTED"
    DONE = "DONE"
    FAILED = "FAILED"


_NEXT = {
    WorkerState.JOINING: {WorkerState.STANDBY},
    WorkerState.STANDBY: {WorkerState.TRAINING, WorkerState.MIGRATING, WorkerState.PREEMPTED, WorkerState.DONE,
                          WorkerState.RESTARTING},
    WorkerState.TRAINING: {WorkerState.MIGRATING, WorkerState.DONE, WorkerState.RECOVERING, WorkerState.RESTARTING},
    WorkerState.RECOVERING: {WorkerState.MIGRATING, WorkerState.RESTARTING},
    WorkerState.MIGRATING: {WorkerState.TRAINING, WorkerState.STANDBY, WorkerState.PREEMPTED, WorkerState.RESTARTING,
                            WorkerState.RECOVERING},
}  # fmt: skip


class TokenError(RuntimeError):
    """The worker was not given the token the coordinator requires."""


class Diverged(RuntimeError):
    """A non-finite loss: the job stops rather than train (and checkpoint) garbage."""


class Aborted(RuntimeError):
    """The coordinator aborted the job, or the process that started this worker is gone."""


class Restart(Exception):
    """The coordinator ordered this process to exit so that a fresh one takes its place (checkpoint-restart)."""


class MigrationAbandoned(RuntimeError):
    """The hand-off into an epoch broke (a party died, or the coordinator flagged the epoch): nothing of it was
    installed; the worker still holds the state of the epoch it migrated from."""


class Notice:
    """SIGTERM as a preemption notice, without I/O in the handler.

    `install()` (main thread) sets a handler that only notes the time of the first signal, and makes the interpreter's
    C-level handler write each signal's number to a non-blocking self-pipe (`signal.set_wakeup_fd`), so `wait()` —
    called by the heartbeat thread — returns within its timeout even while the main thread is blocked in C code.
    """

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self.signalled_at: float | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.time()

    def wait(self, timeout_s: float) -> float | None:
        """The time of a SIGTERM that arrived (within `timeout_s`), or None."""
        ready, _, _ = select.select([self.read_fd], [], [], timeout_s)
        if not ready:
            return None
        try:
            data = os.read(self.read_fd, 256)
        except BlockingIOError:
            return None
        if int(signal.SIGTERM) not in data:
            return None  # another signal with a Python handler (SIGINT)
        now = time.time()
        return min(now, self.signalled_at) if self.signalled_at is not None else now


_NOTICE: Notice | None = None  # installed by `process_main`; None in a worker run inside another process (tests)


def _heartbeat(
    host: str, port: int, token: str | None, worker: int, interval_s: float, timeout_s: float,
    notice: Notice | None = None, grace_s: float = 0.0,
) -> None:  # fmt: skip
    """Bump `hb/{worker}` every `interval_s` on a TCPStore client of this thread's own, until the process ends; when
    `notice` reports a SIGTERM, publish the notice's deadline (`ctl/notice/{worker}`, then `ctl/notices`)."""
    try:
        store = connect_store(host, port, token, timeout_s)
        key = keys.heartbeat(worker)
        while True:
            store.add(key, 1)
            if notice is None:
                time.sleep(interval_s)
                continue
            at = notice.wait(interval_s)
            if at is not None:
                store.set(keys.notice(worker), repr(at + grace_s))
                store.append(keys.NOTICES, f"{worker},")
                notice = None  # one notice per process: the instance is going away
    except Exception:  # noqa: BLE001 — the coordinator is gone; the main thread finds out by itself
        return


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process is started with; everything else comes from the coordinator's store."""

    worker_id: int
    host: str
    port: int
    token: str | None = None
    store_timeout_s: float = 60.0
    driver_key: str | None = None  # the driver's public key (hex): what verifies its orders (`trainer.runtime.store`)


class Worker:
    """One instance of the job (torchelastic's `Worker` is to its `WorkerSpec` as this is to `WorkerSpec`)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.id = spec.worker_id
        self.state = WorkerState.JOINING
        self._store: SealedStore | None = None  # both set by `join`: read them as `store` and `job`
        self._job: JobSpec | None = None
        # where this host's gloo groups listen: the address it reaches the coordinator from (None: gloo's default;
        # set by `join`, once the coordinator answered)
        self._gloo_address: str | None = None
        self.epoch: Epoch | None = None  # the epoch this worker trains in (None when standby)
        self.next: Epoch | None = None  # the epoch it is migrating into
        self.ctx: StageContext | None = None
        self.device = torch.device("cpu")  # set by `join` from the job's train.device (trainer.runtime.devices)
        self.step = 0
        self.watch = 1  # the next epoch number to look at
        self.last_step_end = 0.0
        self.last_cycle_s: float | None = None  # from the end of the step before the last one to the end of the last
        self.step_started = 0.0  # when the step in flight began (after its boundary was passed)
        self.incarnation = 0  # which process of this instance id we are (a checkpoint-restart starts the next)
        self._phases: dict[str, float | str] = {}  # durations of the current migration's phases, for the coordinator
        self._at: dict[str, float] = {}  # and the wall times of its milestones (`Coordinator._critical`)
        self._arrived: int | None = None  # the epoch number whose boundary we already reported arriving at
        self._saved: set[tuple[int, int]] = set()  # (step, epoch) checkpoint shards written
        self._parent = os.getppid()
        self._rows: Prefetcher | None = None  # the next step's rows, loaded while this one trains (`_prefetcher`)
        # a migration is committed with its epoch's first step; until then the state it started from is kept
        self._uncommitted = False
        self._base: tuple[Epoch, StageContext] | None = None  # (epoch migrated from, its stage) while uncommitted
        self._reported: int | None = None  # the broken epoch this worker reported in (it waits for ctl/e{n}/next)
        self._failed_at: float | None = None  # when the work lost to a failure started (the next arrival's time)
        self._form_store: Store | None = None  # the store client group formation uses (its own thread)
        self._mirror: CheckpointMirror | None = None  # the job's checkpoint URI, if it has one (set by `join`)
        self._uploads: ShardUploader | None = None  # this worker's shard uploads to it
        self._upload_errors: list[str] = []
        self._prep_watch = 1  # the next preparation number to look at (the watcher thread's)
        self._preps: dict[int, Prepared] = {}  # preparations whose groups this worker forms (or formed) ahead
        self._preps_taken: set[int] = set()  # preparations the main thread forms itself (reached before started)
        self._prep_lock = threading.Lock()  # guards the two above: the watcher and the main thread share them
        # prepared boundaries' decisions, read during the step before them (`_read_ahead`; a reader thread sets an
        # entry, the main thread pops it), by step, and the boundaries a reader was started for (under `_prep_lock`)
        self._decided: dict[int, str] = {}
        self._reading: set[int] = set()
        self._stopped = threading.Event()  # set when `run` returns: the watcher starts nothing more

    # -- plumbing ----------------------------------------------------------------------------------------
    @property
    def store(self) -> SealedStore:
        """The coordinator's store, as this worker's main thread talks to it."""
        assert self._store is not None, f"worker {self.id} has not joined"
        return self._store

    @property
    def job(self) -> JobSpec:
        """The job, as the coordinator published it."""
        assert self._job is not None, f"worker {self.id} has not joined"
        return self._job

    def _held(self) -> tuple[Epoch, StageContext]:
        """The epoch this worker trains in and its stage: both set from entering an epoch until leaving it."""
        assert self.epoch is not None and self.ctx is not None, f"worker {self.id} holds no epoch ({self.state.name})"
        return self.epoch, self.ctx

    def _to(self, new: WorkerState) -> None:
        if new is not WorkerState.FAILED and new not in _NEXT.get(self.state, set()):
            raise RuntimeError(f"worker {self.id}: illegal transition {self.state.name} -> {new.name}")
        self.state = new
        if self._store is not None:
            stepped = (WorkerState.TRAINING, WorkerState.MIGRATING, WorkerState.RECOVERING, WorkerState.DONE)
            at = self.step if new in stepped else "-"
            self.store.append(keys.states(self.id), f"{new.name}@{at};")

    def _control(self) -> None:
        """Raise `Aborted` if the coordinator aborted the job or our parent died (no orphans)."""
        if os.getppid() != self._parent:
            raise Aborted(f"worker {self.id}: the launching process exited")
        if self.store.check([keys.ABORT]):
            raise Aborted(f"worker {self.id}: job aborted by the coordinator: {self.store.get(keys.ABORT).decode()}")
        if self.store.check([keys.restart(self.id)]):
            raise Restart(f"worker {self.id}: checkpoint-restart ordered")

    def _epoch_abort(self, number: int) -> str | None:
        """Why epoch `number` was declared broken, or None (asked every 20 ms while an op of a step is pending)."""
        got = self.store.get_if(keys.epoch_abort(number))
        return None if got is None else got.decode()

    def _commit(self, step: int) -> bool:
        """Every collective of `step` completed here: take part in the once-only decision to apply it.

        Each rank marks itself done (a sealed key of its own, not a counter: a client without the job's token could
        bump a counter into a premature "apply"); the rank that finds every mark writes "apply"; the others wait
        for the decision, and once the epoch is declared broken they try to write "abort" — whichever was written
        first is what every rank does.
        """
        epoch, _ = self._held()
        n, world = epoch.number, epoch.strategy.world_size
        if world == 1 and not (self._uncommitted and step == epoch.start_step):
            return True  # (a migration's first step is decided in the store even on one rank: it commits it)
        key = keys.decide(n, step)
        marks = [keys.commit(n, step, w) for w in epoch.members]
        self.store.set(keys.commit(n, step, self.id), "1")
        if self.store.check(marks):
            applied = self.store.compare_set(key, "", APPLY).decode() == APPLY
        else:
            delay, waited = 0.0001, 0.0
            while (decided := self.store.get_if(key)) is None:
                if waited > 0.02 and self._epoch_abort(n):
                    return self.store.compare_set(key, "", ABORT).decode() == APPLY
                time.sleep(delay)
                waited += delay
                delay = min(2 * delay, 0.002)
            applied = decided.decode() == APPLY
        if applied and step > epoch.start_step:
            self._forget_commit(epoch, step - 1)
        return applied

    def _forget_commit(self, epoch: Epoch, step: int) -> None:
        """Delete this rank's mark of `step` (and, on the epoch's first member, its decision): every step leaves
        world + 1 keys, which a job of millions of steps would keep in the store's memory. Safe once the next step
        is applied: that needed every member's mark of it, made after its collectives, which every member joined
        only after reading `step`'s decision. The decision of an epoch's first step stays (the coordinator reads
        it to tell a migration rolled back)."""
        self.store.delete_key(keys.commit(epoch.number, step, self.id))
        if step > epoch.start_step and self.id == epoch.members[0]:
            self.store.delete_key(keys.decide(epoch.number, step))

    def _poll(self, ready: Callable[[], bool]) -> None:
        """Wait until `ready()` is true, checking for an abort. Backs off from 1 to 20 ms: a hold can last seconds
        (an added instance starting) and busy-polling the store would steal the CPU that instance needs."""
        delay = POLL_MIN_S
        while not ready():
            self._control()
            time.sleep(delay)
            delay = min(2 * delay, POLL_MAX_S)

    def _pg_timeout(self) -> timedelta:
        return timedelta(seconds=self.job.pg_timeout_s)

    def _connect(self) -> SealedStore:
        """A new client of the coordinator's store: each thread that blocks in the store has its own."""
        s = self.spec
        return connect_store(s.host, s.port, s.token, s.store_timeout_s, driver_key=s.driver_key)

    # -- JOINING -----------------------------------------------------------------------------------------
    def join(self) -> None:
        """Connect, check the token, read the job, register. -> STANDBY"""
        s = self.spec
        try:
            self._store = self._connect()
        except StoreAuthError as e:
            raise TokenError(f"worker {self.id}: {e}; refusing to join") from None
        self._gloo_address = gloo_address(s.host)
        self.store.append(keys.states(self.id), "JOINING@-;")
        self._job = JobSpec.from_json(self.store.get(keys.JOB_SPEC))
        # Pay one-off costs while joining rather than inside a migration's pause: loading the spec imports the
        # user's module (and the example GPT's corpus), and the first optimiser built in a process imports
        # torch._dynamo (~1 s).
        make_optimizer(torch.nn.Linear(1, 1), spec_of(self.job.model, self.job.train))
        self.device = resolve_device(self.job.train.device, self.id)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # this worker's GPU is the process's current one
            # torch 2.11's autograd thread creates its cuBLAS handle before it makes the device's (existing) context
            # current, warns, and makes it current: once per worker, on an H200, with results equal to the CPU's
            warnings.filterwarnings("ignore", message="Attempting to run cuBLAS, but there was no current CUDA context")
        if self.job.checkpoint_uri is not None:  # every shard this worker writes is copied there, from its own disk
            self._mirror = mirror_for(self.job.checkpoint_uri)
            self._uploads = ShardUploader(self._mirror)
        if self.job.fingerprint and model_fingerprint(self.job.model) != self.job.fingerprint:
            raise SpecError(f"model {self.job.model.name!r} builds other layers on this machine than where the job "
                            "started (its fingerprint differs: another version of the spec's code); install the "
                            "same version on every instance")  # fmt: skip
        # read the current epoch *before* registering: any epoch that includes us is published after that
        if (current := self.store.get_if(keys.EPOCH_CURRENT)) is not None:
            self.watch = Epoch.from_json(current).number + 1
        if (latest := self.store.get_if(keys.PREPARE_LATEST)) is not None:  # it may be for an epoch that includes us
            self._prep_watch = int(latest)
        # beat before registering: the coordinator watches the heartbeat from the moment it sees us join
        threading.Thread(
            target=_heartbeat, args=(s.host, s.port, s.token, self.id, self.job.hb_interval_s, s.store_timeout_s,
                                     _NOTICE, self.job.notice_grace_s),
            name="parcae-heartbeat", daemon=True,
        ).start()  # fmt: skip
        self._form_client()  # connect now rather than inside the first migration's pause
        threading.Thread(target=self._watch_preparations, name="parcae-prepare-watch", daemon=True).start()
        self.store.set(keys.worker_pid(self.id), str(os.getpid()))
        self.store.append(keys.JOINED, f"{self.id},")
        self.incarnation = self.store.add(keys.joins(self.id), 1)
        self._to(WorkerState.STANDBY)

    # -- STANDBY -----------------------------------------------------------------------------------------
    def _standby(self) -> None:
        """Wait for an epoch that gives this worker a role, the job's end, or a preemption."""
        delay = POLL_MIN_S
        while True:
            self._control()
            published = self.store.get_if(keys.epoch(self.watch))
            if published is not None:
                epoch = Epoch.from_json(published)
                self.watch += 1
                if self.id in epoch.assignment:
                    if epoch.kind in (MigrationKind.START, MigrationKind.CHECKPOINT_RESTART):
                        if self._enter(epoch, received={}):
                            self._to(WorkerState.TRAINING)
                    else:
                        self.next, self.step = epoch, epoch.start_step
                        self._to(WorkerState.MIGRATING)
                    return
                continue
            preempt = self.store.get_if(keys.preempt(self.id))
            if preempt is not None and int(preempt) < self.watch:
                self._to(WorkerState.PREEMPTED)
                return
            if self.store.check([keys.DONE]):
                self._to(WorkerState.DONE)
                return
            if self._prebuild():
                delay = POLL_MIN_S
                continue
            time.sleep(delay)
            delay = min(2 * delay, POLL_MAX_S)

    def _prebuild(self) -> bool:
        """Build the layers of a prepared epoch that gives this standby worker a stage, while it stands by: at the
        boundary it then only takes their state. Here, on the main thread, because seeding a layer's initialisation
        goes through the process's global generator, which a thread beside training would disturb; a standby
        trains nothing. Whether it built anything."""
        with self._prep_lock:
            mine = [prep for prep in self._preps.values() if self.id in prep.epoch.assignment]
        todo = [prep for prep in mine if prep.built is None]
        for prep in todo:
            stage, _ = prep.epoch.assignment[self.id]
            built = fresh_layers(self.job.model, self.job.train, prep.epoch.layers(stage), self.device)
            with prep.build_lock:  # the state may have come ahead meanwhile: install it (else the helper will)
                prep.built = built
                if prep.ahead_in:
                    prep.install_ahead(built)
                if prep.grads_in:  # and the step's gradients after it
                    prep.step_ahead(built)
        return bool(todo)

    def _take_built(self, epoch: Epoch) -> tuple[HeldLayers, HeldLayers, str | None]:
        """The layers built ahead for `epoch` — a standby's, initialised (`_prebuild`), and a member's, hollow
        (`_build_ahead`); none if it was not prepared or they were not built in time — and why a build or install
        ahead failed, if one did. From now on nothing more is built or installed ahead for it."""
        prep = self._preparation(epoch)
        if prep is None:
            return {}, {}, None
        with prep.build_lock:  # waits for a build or install under way (they need no peer)
            prep.ahead_taken = True
            built, hollow = prep.built or {}, prep.hollow or {}
            prep.built, prep.hollow = {}, None
            return built, hollow, prep.ahead_error

    # -- TRAINING ----------------------------------------------------------------------------------------
    def _boundary(self, step: int) -> Epoch | int | None:
        """The decision for the boundary before `step`, taken once for everyone (see trainer.control.coordinator):
        None to train on, the next `Epoch` to migrate into, or the number of the checkpoint-restart epoch."""
        current, _ = self._held()
        key = keys.boundary(step)
        ahead = self._decided.pop(step, None)  # (a decided boundary's value is final, whenever it was read)
        v = self.store.compare_set(key, "", TRAIN).decode() if ahead is None else ahead
        if v == HOLD:
            number = current.number

            def decided() -> bool:
                reason = self._epoch_abort(number)
                if reason:
                    raise StepAbandoned(f"epoch {number} aborted at the boundary before step {step}: {reason}")
                return self.store.get(key).decode() != HOLD

            self._poll(decided)
            v = self.store.get(key).decode()
        if v == TRAIN:
            return None
        kind, target, *prepared = v.split(":")
        if int(target) <= current.number:
            return None  # decided for an epoch we are already past: we are redoing steps after a recovery
        if kind == "restart":
            return int(target)
        self._decided[step] = v  # entered, the new epoch passes this boundary again: without asking the store
        if prepared:  # the epoch of preparation p, as published then: this worker may hold it (a round trip less)
            with self._prep_lock:
                prep = self._preps.get(int(prepared[0]))
            if prep is not None and prep.epoch.number == int(target):
                return prep.epoch
        return Epoch.from_json(self.store.get(keys.epoch(int(target))))

    def _save(self, directory: str, step: int) -> None:
        """Write this stage's shard of the checkpoint of `step` (replica 0 only) and record it for the coordinator."""
        (epoch, ctx), job = self._held(), self.job
        n = epoch.number
        if ctx.replica != 0 or (step, n) in self._saved:
            return
        path = checkpoint.shard_path(directory, step, ctx.stage)
        checkpoint.save(path, ctx.layer_states(), step=step, config=job.model, job=job.job, settings=job.settings)
        self._saved.add((step, n))
        if self._uploads is None:
            self.store.append(keys.CKPT_WRITTEN, f"{step}:{n}:{ctx.stage};")
        else:  # reported once at the URI: a checkpoint the driver counts complete survives this instance
            self._uploads.submit((step, n, ctx.stage), [path, checkpoint.record_path(path)])

    def _report_uploads(self, flush: bool = False) -> None:
        """Tell the driver which shards reached the checkpoint URI (and which could not); `flush`: wait for every
        upload queued first (this process is about to leave, or to report arriving at a restart's boundary)."""
        if self._uploads is None:
            return
        if flush:
            self._uploads.flush()
        for (step, n, stage), sizes in self._uploads.done():
            self.store.set(keys.ckpt_files(step, n, stage), json.dumps(sizes))
            self.store.append(keys.CKPT_WRITTEN, f"{step}:{n}:{stage};")
            self._keep_newest()
        failed = self._uploads.failed()
        if failed:
            self._upload_errors += [f"step {step} stage {stage}: {why}" for (step, _, stage), why in failed]
            self.store.set(keys.ckpt_failed(self.id), json.dumps(self._upload_errors))

    def _keep_newest(self) -> None:
        """This disk keeps its newest `checkpoint_keep` checkpoint steps once this worker's shards are at the URI
        (which holds every copy a restore needs, pruned by the driver): on instances that share no disk, nobody else
        would remove them."""
        keep = self.job.checkpoint_keep
        steps = checkpoint.checkpoint_steps(self.job.checkpoint_dir)  # newest first
        if keep and len(steps) > keep:
            checkpoint.remove_before(self.job.checkpoint_dir, steps[keep - 1])

    def _arrive(self, number: int, at: float | None = None) -> None:
        """Report reaching the end of our epoch (by default when our last step ended, with how long it took from the
        step before's end: `parcae profile` compares it with and without a preparation beside it), on the way into
        epoch `number` (once)."""
        if self._arrived != number:
            if at is None and self.last_cycle_s is not None and self.last_step_end >= self.step_started:
                self.store.multi_set([keys.arrive(number, self.id), keys.last_step(number, self.id)],
                                     [repr(self.last_step_end), repr(self.last_cycle_s)])  # fmt: skip
            else:
                self.store.set(keys.arrive(number, self.id), repr(self.last_step_end if at is None else at))
            self._arrived = number

    def _train(self) -> None:
        (_, ctx), job = self._held(), self.job
        # Every replica of the last stage records the step's loss (the same all-reduced value) once the step is
        # committed: one reporter killed between the decision and its write would leave an applied step without a
        # loss while the survivors train on. Losing every last-stage replica loses that stage's layers too, which
        # checkpoint-restarts and recomputes the steps after the checkpoint.
        reporter = ctx.is_last
        rows = self._prefetcher()
        held_out = ctx.spec.validation if job.train.validate else None
        # the held-out scores of this boundary ("loss", each metric), reported with its step (or the final layers)
        val: dict[str, float] | None = None
        end = job.steps  # (sooner where the held-out scores stop the job early: `_patience`)
        try:
            while True:
                decision = self._boundary(self.step)
                if isinstance(decision, Epoch):
                    self.next = decision
                    self._to(WorkerState.MIGRATING)
                    return
                if decision is not None:  # a checkpoint-restart: checkpoint this boundary, make way for a fresh process
                    self._save(job.checkpoint_dir, self.step)
                    self._report_uploads(flush=True)  # the restart picks its step once every member arrived
                    self._arrive(decision)
                    self._to(WorkerState.RESTARTING)
                    return
                val = None
                if held_out is not None and held_out.due(self.step, job.steps):
                    began = time.time()
                    val = validate(ctx, held_out)  # every member of the epoch, at the same boundaries
                    writer = reporter and ctx.replica == 0  # (one member keeps the count for all)
                    if held_out.patience is not None and self._patience(held_out.score(val), held_out, writer):
                        end = self.step
                    if self.last_step_end > 0:  # (the next step's cycle time is the step's own, not the validation's)
                        self.last_step_end += time.time() - began
                if self.step >= end:
                    break
                step = self.step
                self._report_uploads()
                sending = self._send_ahead(step)
                self._read_ahead(step + 1)
                self.step_started = time.time()
                self.store.set(keys.step_at(self.id), str(step))
                loss = train_step(ctx, step, commit=partial(self._commit, step),
                                  reduced=partial(self._grads_ahead, sending) if sending else None,
                                  rows=rows)  # fmt: skip
                ended, before = time.time(), self.last_step_end
                self.last_step_end, self.last_cycle_s = ended, ended - before if before > 0 else None
                if self._uncommitted:  # the migration into this epoch is committed: its old state can go
                    self._uncommitted, self._base = False, None
                if reporter:
                    if not math.isfinite(loss):  # diverged (or loaded bad state): stop before it is checkpointed
                        raise Diverged(f"the loss of step {step} is {loss!r}: training diverged; no checkpoint of "
                                       "it is written (the last good one stays the newest); lower the learning "
                                       "rate or resume from an earlier checkpoint")  # fmt: skip
                    scaled = ctx.scaled  # (float16: the loss scale after the step, and whether it was skipped)
                    reported = keys.StepLoss(
                        loss, scaled.value if scaled else None, bool(scaled and scaled.skipped), val
                    )
                    self.store.set(keys.loss(step), reported.value())
                self.step += 1
                every = job.checkpoint_every
                if every and self.step % every == 0 and self.step < job.steps:
                    self._save(job.checkpoint_dir, self.step)
        except StepAbandoned as e:
            self._abandon(str(e))
            return
        if ctx.replica == 0:  # one shard per stage, written by its first replica
            path = checkpoint.shard_path(job.layers_dir, end, ctx.stage)
            checkpoint.save(path, ctx.layer_states(), step=end, config=job.model, job=job.job, settings=job.settings)
            if self._mirror is not None:  # the driver fetches the final layers its own disk does not hold
                try:
                    self._mirror.child(FINAL).upload_files([path, checkpoint.record_path(path)])
                except Exception as e:  # noqa: BLE001 — reported; the driver says which final shard it lacks
                    self._upload_errors.append(f"final layers of stage {ctx.stage}: {type(e).__name__}: {e}")
                    self.store.set(keys.ckpt_failed(self.id), json.dumps(self._upload_errors))
        digest = parameters_checksum(ctx.layer_states(), ctx.names)
        final = {"stage": ctx.stage, "replica": ctx.replica, "digest": digest, "step": end,
                 **({"val": val} if val is not None and reporter else {})}  # fmt: skip
        self.store.set(keys.replica_final(self.id), json.dumps(final))
        close_epoch(ctx.groups)
        self._to(WorkerState.DONE)

    def _patience(self, score: float, held_out: Validation, writer: bool) -> bool:
        """Whether the job stops at this scored boundary (`Validation.patience`): the count as the store holds it (the
        latest boundary counted, by whichever member was there), after this boundary's `score` (`Validation.score`).
        Every member computes the same from the same all-reduced scores; the `writer` (the last stage's replica 0)
        keeps the new count."""
        assert held_out.patience is not None
        raw = self.store.get_if(keys.PATIENCE)
        count = Patience() if raw is None else Patience.from_json(raw)
        after = count.after(self.step, score, held_out.patience, held_out.min_delta)
        if writer and after is not count:
            self.store.set(keys.PATIENCE, after.to_json())
        return after.stop_at == self.step

    # -- RECOVERING --------------------------------------------------------------------------------------
    def _abandon(self, reason: str) -> None:
        """Give up the broken epoch's groups and step; report the step to redo (= the steps we applied). A worker
        whose epoch's migration is not committed yet goes back to the state it migrated from."""
        epoch, ctx = self._held()
        n = epoch.number
        assert ctx.groups is not None  # (an epoch's stage is built with its groups)
        ctx.groups.abandon()
        # flag the epoch ourselves: a peer waiting on a live-but-abandoned rank would otherwise wait for the heartbeat
        self.store.compare_set(keys.epoch_abort(n), "", f"worker {self.id}: {reason}")
        # the pause of a failure starts when the abandoned step started: its partial work is lost too
        at = max(self.last_step_end, self.step_started)
        if self._uncommitted:  # nothing of the epoch was applied: roll back (a joiner holds nothing)
            self.epoch, self.ctx = self._base if self._base is not None else (None, None)
            self._base, self._uncommitted = None, False
        self._report(n, at)
        self._to(WorkerState.RECOVERING)

    def _report(self, number: int, at: float) -> None:
        """Tell the coordinator we survived the break of epoch `number` holding the state after `self.step` steps."""
        self._failed_at = at
        self._reported = number
        self.store.set(keys.failed(number, self.id), repr(at))
        self.store.set(keys.abandon(number, self.id), str(self.step))

    def _recover(self) -> None:
        """Wait for the epoch the coordinator plans from the survivors (a live migration) or a restart order."""
        assert self._reported is not None  # RECOVERING is entered through `_report`
        key = keys.epoch_next(self._reported)
        self._poll(lambda: self.store.check([key]))
        self.next = Epoch.from_json(self.store.get(keys.epoch(int(self.store.get(key)))))
        self._reported = None
        self._to(WorkerState.MIGRATING)

    # -- MIGRATING ---------------------------------------------------------------------------------------
    def _migrate(self) -> None:
        new, old = self.next, self.epoch
        assert new is not None
        n = new.number
        leave: EpochGroups | None = None
        try:
            if old is None or self._failed_at is not None:
                self._check_epoch(n)
            # (an old member at a boundary does not read the flag: a round trip in every pause, for a break that
            # finds it anyway — in the hand-off's waits, or at the new epoch's first step, which is not committed)
            if old is not None:  # an old member: at the boundary with no op pending, or recovering (groups abandoned)
                if new.base_number != old.number:
                    raise RuntimeError(f"worker {self.id}: epoch {n} is planned from epoch {new.base_number}, "
                                       f"this worker holds epoch {old.number}'s state")  # fmt: skip
                self._arrive(n, self._failed_at)
                self._failed_at = None
                _, held = self._held()
                leave = held.groups  # released once this member is ready (below): nothing of it is in the pause
            else:  # joining from standby
                self._failed_at = None
                if self._preparation(new) is None:  # the old members must be at the boundary before groups can form
                    arrivals = [keys.arrive(n, w) for w in new.previous]
                    self._poll(lambda: self._check_epoch(n) or self.store.check(arrivals))
                # (prepared: its groups are formed; the hand-off's receives wait for the sources at the boundary)
            self.step = new.start_step
            self.watch = max(self.watch, n + 1)
            t0 = time.perf_counter()
            at = {"boundary": time.time()}  # where this member's part of the pause went (`Coordinator.record`)
            self._await_ahead(new, first=True)  # what comes ahead is installed (and stepped) in its layers first
            at["ahead"] = time.time()
            prebuilt, hollow, why = self._take_built(new)  # a standby's layers, or a member's incoming ones
            ahead = {**hollow, **prebuilt}
            received, caught, counts = self._transfer(new, ahead) if self.id in new.transfer_parties else ({}, {}, {})
            at["hand_off"] = time.time()
            self._phases, self._at = {"transfer_s": time.perf_counter() - t0, **counts}, at
            if why is not None:
                self._phases["build_ahead_error"] = why
            if self.id in new.assignment:
                if self._enter(new, received, prebuilt, caught, hollow):
                    self._to(WorkerState.TRAINING)
                return
            self._await_commit(new)  # leaving: our old state stays needed until the new epoch committed
        except MigrationAbandoned as e:
            self._phases, self._at = {}, {}
            self.store.compare_set(keys.epoch_abort(n), "", f"worker {self.id}: {e}")
            self.step = new.start_step  # nothing was applied since the boundary
            self._report(n, self.last_step_end)
            self._to(WorkerState.RECOVERING)
            return
        finally:
            # the old epoch's groups, released in the background (destroying a gloo group takes ~20 ms): after the
            # ready report, where starting that thread and its teardown no longer share the CPU with the pause
            if leave is not None:
                close_epoch(leave, background=True)
        self._drop()
        self._to(WorkerState.PREEMPTED if self.id in new.preempted else WorkerState.STANDBY)

    def _check_epoch(self, number: int) -> bool:
        """Raise `MigrationAbandoned` if epoch `number` was flagged broken (else False, for `_poll` conditions)."""
        reason = self._epoch_abort(number)
        if reason:
            raise MigrationAbandoned(f"epoch {number} broke during the hand-off: {reason}")
        return False

    def _await_commit(self, epoch: Epoch) -> None:
        """An old member without a role in `epoch`: wait until its first step's decision — "apply" (the migration
        committed: leave) or "abort" (rolled back: `MigrationAbandoned`, we hold our old state again)."""
        key = keys.decide(epoch.number, epoch.start_step)
        self._poll(lambda: self.store.check([key]))
        if self.store.get(key).decode() != APPLY:
            raise MigrationAbandoned(f"epoch {epoch.number}'s migration was rolled back")

    def _drop(self) -> None:
        self.ctx, self.epoch, self.next = None, None, None
        self._phases, self._at = {}, {}  # (a member that leaves reports no migration of its own)

    def _form_client(self) -> Store:
        """The store client group formation uses: its own, as formation blocks in store waits in another thread."""
        if self._form_store is None:
            self._form_store = self._connect()
        return self._form_store

    def _form(self, make: Callable[[Store], _T], number: int) -> _T:
        """Form process groups (`make(store)`) in a helper thread, checking epoch `number`'s abort flag every few ms:
        gloo's rendezvous cannot be interrupted, so a dead peer would hold us until the group timeout.
        `MigrationAbandoned` if the epoch is flagged or formation fails."""
        store = self._form_client()
        formed: list[_T] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                formed.append(make(store))
            except BaseException as e:  # noqa: BLE001 — handed to the main thread
                errors.append(e)

        t = threading.Thread(target=run, name="parcae-form", daemon=True)
        t.start()
        delay = POLL_MIN_S
        while True:
            t.join(delay)
            if not t.is_alive():
                break
            reason = self._epoch_abort(number)
            if reason:
                # the thread may stay blocked in its store client until the group timeout: use a new one from now on
                self._form_store = None
                raise MigrationAbandoned(f"epoch {number} broke while forming its groups: {reason}")
            self._control()
            delay = min(2 * delay, 0.01)
        if errors:
            raise MigrationAbandoned(f"forming the groups of epoch {number} failed: {errors[0]}")
        return formed[0]

    def _watch_preparations(self) -> None:
        """The preparation watcher (a thread, from `join` on): blocks in the store until the next preparation is
        published (`Coordinator.prepare`, a step or more ahead of its boundary) and starts forming its groups at
        once. Polling between steps, as the main thread could, would start them up to a step late: often too late
        to be ready at the boundary."""
        try:
            store = self._connect()
        except Exception:  # noqa: BLE001 — the coordinator is gone: the main thread finds out by itself
            return
        while not self._stopped.is_set():
            key = keys.prepare(self._prep_watch)
            try:
                store.wait([key], timedelta(seconds=PREPARE_WAIT_S))
                blob = store.get(key)
            except torch.distributed.DistStoreError as e:
                if "timeout" in str(e):
                    continue  # nothing new for an hour: wait again
                return  # the store went away: the main thread finds out by itself
            except Exception:  # noqa: BLE001 — (as above)
                return
            self._prep_watch += 1
            self._start_preparation(self._prep_watch - 1, Epoch.from_json(blob))

    def _start_preparation(self, p: int, epoch: Epoch) -> None:
        """Form preparation `p`'s groups in a helper thread, if this worker takes part in its epoch. A newer
        preparation overtakes older ones: they are dropped (a helper still blocked in a rendezvous ends at the group
        timeout)."""
        member, party = self.id in epoch.assignment, self.id in epoch.transfer_parties
        if epoch.number < self.watch or not (member or party):
            return
        with self._prep_lock:
            if p in self._preps_taken:  # the main thread reached its boundary first and forms them itself
                return
            for q, old in self._preps.items():
                if q < p:
                    old.overtaken = True
            self._preps = {q: prep for q, prep in self._preps.items() if q > p}
            prep = Prepared(epoch, self.id, layer_names(self.job.model), self.device,
                            partial(handoff.catch_up_lr, self.job, epoch))  # fmt: skip
            prep.thread = threading.Thread(target=self._form_ahead, args=(p, prep, member, party),
                                           name="parcae-prepare", daemon=True)  # fmt: skip
            self._preps[p] = prep
        prep.thread.start()

    def _form_ahead(self, p: int, prep: Prepared, member: bool, party: bool) -> None:
        """The helper thread of preparation `p`: the transfer group, then the epoch's groups (the order of
        `_migrate`, so that no two workers wait on each other in opposite orders)."""
        try:
            e = prep.epoch
            prep.store = self._connect()
            xfer = None
            if party:
                parties = e.transfer_parties
                xfer = gloo_group(prep.store, e.transfer_prefix, parties.index(self.id), len(parties),
                                  self._pg_timeout(), self._gloo_address)  # fmt: skip
                if any(t.src == self.id for t in e.transfers):
                    prep.xfer_ahead = xfer
                prep.xfer = xfer
            if member:
                n = e.number
                prep.groups = init_epoch(prep.store, n, e.strategy, e.rank(self.id), self._pg_timeout(),
                                         abort=lambda: self._epoch_abort(n), prefix=e.group_prefix,
                                         address=self._gloo_address)  # fmt: skip
            prep.store.set(keys.prepared(p, self.id), repr(time.time()))
            if member:
                self._build_ahead(prep)
            if party and any(t.dst == self.id for t in e.transfers):
                with self._prep_lock:
                    claimed = not prep.receiving and prep.ahead_in is None
                    prep.receiving = prep.receiving or claimed
                if claimed:
                    prep.receive_ahead(xfer, partial(self._ahead_abort, prep))
        except BaseException as exc:  # noqa: BLE001 — handed to the main thread when it needs the groups
            prep.error = exc

    def _build_ahead(self, prep: Prepared) -> None:
        """(The preparation's helper) A member's layers that the epoch's transfers will fill, built hollow while the
        old epoch trains (`pipeline.hollow_layers`: no values, no generator touched): at the boundary they only take
        their state. A standby builds its layers on its main thread instead (`_prebuild`). A build that fails (e.g.
        out of memory beside the old stage) is left to the boundary, and the epoch's record says why."""
        incoming = sorted({t.layer for t in prep.epoch.transfers if t.dst == self.id})
        if not incoming or self.epoch is None:
            return
        with prep.build_lock:
            if prep.ahead_taken:
                return
            try:
                prep.hollow = hollow_layers(self.job.model, self.job.train, incoming, self.device)
            except Exception as exc:  # noqa: BLE001 — the boundary builds them; the record names the failure
                prep.ahead_error = f"{type(exc).__name__}: {exc}"

    def _take_prepared(self, epoch: Epoch, part: str) -> Any:
        """The `part` ("xfer" or "groups") of `epoch`'s preparation, waiting for its helper if it is still forming
        (checking the epoch's abort flag, as `_form` does); None when the epoch was not prepared or this worker did
        not prepare it (it then forms them itself, on the same prefix). `MigrationAbandoned` if forming failed."""
        p = epoch.prepared
        if p is None:
            return None
        with self._prep_lock:
            prep = self._preps.get(p)
            if prep is None:  # not started (yet): from now on the watcher leaves it to us
                self._preps_taken.add(p)
                return None
        if prep.epoch != epoch or prep.thread is None:
            return None
        delay = POLL_MIN_S
        while getattr(prep, part) is None and prep.error is None and prep.thread.is_alive():
            reason = self._epoch_abort(epoch.number)
            if reason:
                raise MigrationAbandoned(f"epoch {epoch.number} broke while its prepared groups formed: {reason}")
            self._control()
            time.sleep(delay)
            delay = min(2 * delay, 0.01)
        got = getattr(prep, part)
        if got is None:
            raise MigrationAbandoned(f"forming the prepared groups of epoch {epoch.number} failed: {prep.error}")
        # the caller holds them now, and releases them (in the background: `close_epoch`); a reference left here
        # would destroy them wherever `prep` is dropped — on the main thread, at the boundary (~20 ms a gloo group)
        setattr(prep, part, None)
        if part == "groups":
            with self._prep_lock:
                self._preps.pop(p, None)
        return got

    def _transfer(
        self, epoch: Epoch, built_ahead: HeldLayers
    ) -> tuple[dict[str, LayerState], dict[int, tuple[torch.nn.Module, torch.optim.Optimizer]], dict[str, int]]:
        """Send and receive this worker's share of `epoch.transfers`; returns the states received, by layer name,
        the layers whose state came ahead, caught up (module and optimiser, by index; in the modules of
        `built_ahead`, built before the boundary, where there are), and how many of those had their early state
        installed before the boundary ("installed_ahead") and their step's gradients too ("grads_ahead": only the
        source's go came at it). `MigrationAbandoned` (nothing received is kept)
        if a party dies or the epoch is flagged meanwhile.

        Pairs are processed in one global order (blocking sends cannot deadlock). A prepared epoch's hand-off has
        two phases, each in that order: first every source's state as of the boundary before this one (sent during
        the step by `_send_ahead`, received by the preparation's helper: `Prepared.receive_ahead`; an empty message
        from a source that had not seen the preparation in time), then that step's gradients of what went ahead,
        sent as soon as the step reduced them (`Prepared.pack_grads`; an empty message: they follow at the
        boundary); then, at this boundary, a go (the step is committed) where the gradients went ahead, else those
        gradients, or else the state. `pipeline.catch_up` applies the gradients — ahead of the boundary where it can
        (`Prepared.step_ahead`) — and gives, bit for bit, the source's state now. The messages themselves:
        `trainer.runtime.handoff`."""
        parties = epoch.transfer_parties
        n = epoch.number
        rank = parties.index(self.id)
        prep = self._preparation(epoch)
        # the early states installed ahead (`Prepared.install_ahead`): complete, as `_take_built` took the build lock
        installed = dict(prep.installed) if prep is not None else {}
        stepped = dict(prep.stepped) if prep is not None else {}  # and those whose step was applied too
        world = self._take_prepared(epoch, "xfer")
        if prep is not None and prep.sender is None:
            prep.xfer_ahead = None  # nothing went ahead: no sender will drop it
        if world is None:
            world = self._form(lambda store: gloo_group(store, epoch.transfer_prefix, rank, len(parties),
                                                        self._pg_timeout(), self._gloo_address), n)  # fmt: skip
        groups = EpochGroups(epoch=n, rank=rank, world=world, dp=None, abort=lambda: self._epoch_abort(n))
        del world  # `groups` holds the only reference: `close_epoch` below releases it off the main thread
        names = layer_names(self.job.model)
        pairs = handoff.pairs(epoch)
        received: dict[str, LayerState] = {}
        caught: dict[int, tuple[torch.nn.Module, torch.optim.Optimizer]] = {}
        sent = 0
        went_ahead: set[tuple[int, int]] = set()
        grads_went: set[tuple[int, int]] = set()  # of those, the pairs whose step's gradients went ahead too
        ahead: dict[tuple[int, int], dict[str, LayerState] | None] = {}
        grads_ahead: dict[tuple[int, int], dict[str, LayerState] | None] = {}
        try:
            if epoch.prepared is not None:  # phase 1: what went ahead
                if prep is not None and prep.ahead_out is not None:
                    went_ahead = {pair for pair, _, _ in prep.ahead_out}
                    sent += sum(b for _, _, b in prep.ahead_out)
                    if not prep.grads_ready.is_set():  # (the step ran without `pack_grads`): at the boundary
                        prep.grads_out = [(pair, None) for pair, _, _ in prep.ahead_out]
                        prep.grads_ready.set()
                    grads_went = {pair for pair, g in prep.grads_out or () if g is not None}
                helper = False
                if prep is not None:
                    with self._prep_lock:
                        helper, prep.receiving = prep.receiving, True
                # what we send or receive here first — the receivers (helpers, elsewhere) may be waiting for it
                for (src, dst), _ in pairs:
                    if src == self.id and (src, dst) not in went_ahead:
                        handoff.send_empty(groups, epoch, dst)  # the state follows at the boundary
                    elif dst == self.id and not helper:
                        ahead[(src, dst)] = handoff.receive_one(groups, epoch, self.id, src, names, self.device,
                                                                ahead=True)  # fmt: skip
                if not helper:
                    grads_ahead = handoff.receive_grads(groups, epoch, self.id, ahead, names, self.device)
                if helper and prep is not None:
                    self._await_ahead(epoch)
                    if prep.receive_error is not None or prep.ahead_in is None or prep.grads_in is None:
                        raise MigrationAbandoned(f"receiving ahead for epoch {n} failed: {prep.receive_error}")
                    ahead, grads_ahead = prep.ahead_in, prep.grads_in
                # only now wait for our own sender: its sends may wait for the receives just above, elsewhere
                sender = prep.sender if prep is not None else None
                while sender is not None:
                    sender.join(POLL_MAX_S)  # returns as the sender ends: between, the abort flags every 20 ms
                    if not sender.is_alive():
                        break
                    self._check_epoch(n)
                    self._control()
                if prep is not None and prep.send_error is not None:
                    raise MigrationAbandoned(f"sending ahead for epoch {n} failed: {prep.send_error}")
            for (src, dst), layers in pairs:  # phase 2, at the boundary
                if src == self.id:
                    _, ctx = self._held()
                    if (src, dst) in grads_went:  # the go: the step whose gradients went ahead is committed here
                        handoff.send_empty(groups, epoch, dst)
                        continue
                    if (src, dst) in went_ahead:  # the step's gradients: the receiver applies them itself
                        bundle = handoff.step_grads(ctx, names, layers)
                    else:
                        bundle = handoff.live_states(ctx, names, layers)
                        sent += state_bytes(bundle)
                    handoff.send_one(groups, epoch, dst, wire.pack(bundle))
                elif dst == self.id:
                    early, grads = ahead.get((src, dst)), grads_ahead.get((src, dst))
                    got: dict[str, LayerState] | None = grads
                    if early is not None and grads is not None:
                        go = handoff.receive_one(groups, epoch, self.id, src, names, self.device, ahead=True)
                        if go is not None:
                            raise RuntimeError(f"worker {self.id}: expected worker {src}'s go, got layers")
                    else:
                        got = handoff.receive_one(groups, epoch, self.id, src, names, self.device)
                    assert got is not None
                    if early is None:
                        received.update(got)
                    else:
                        caught.update(handoff.catch_up_layers(self.job, epoch, self.device, early, got, built_ahead,
                                                              installed, stepped))  # fmt: skip
        except StepAbandoned as e:
            groups.abandon()
            raise MigrationAbandoned(f"the hand-off of epoch {n} broke: {e}") from e
        close_epoch(groups, background=True)
        if sent:  # sealed, not a counter a client without the token could bump (`Coordinator.record` sums them)
            self.store.set(keys.sent(n, self.id), str(sent))
        counts = {
            "installed_ahead": sum(1 for i, (layer, _) in caught.items() if installed.get(names[i]) is layer),
            "grads_ahead": sum(len(g) for g in grads_ahead.values() if g is not None),
        }
        return received, caught, counts

    def _preparation(self, epoch: Epoch) -> Prepared | None:
        """This worker's preparation of `epoch` (None if it was not prepared, or this worker did not take part)."""
        if epoch.prepared is None:
            return None
        with self._prep_lock:
            prep = self._preps.get(epoch.prepared)
        return prep if prep is not None and prep.epoch == epoch else None

    def _send_ahead(self, step: int) -> list[Prepared]:
        """Before training `step`: if a prepared epoch begins at the boundary after it and this worker sends layers in
        it, snapshot them — their state as of this boundary, one copy straight into the buffers sent — and send them
        during the step from a helper thread (`Prepared.send_ahead`), then the step's gradients as soon as the step
        has reduced them (`Prepared.pack_grads`); at that boundary only a go follows (`_transfer`). Returns those
        preparations."""
        current, ctx = self._held()
        with self._prep_lock:
            preps = [prep for prep in self._preps.values()
                     if prep.epoch.start_step == step + 1 and prep.sender is None and not prep.overtaken
                     and prep.epoch.base_number == current.number
                     and any(t.src == self.id for t in prep.epoch.transfers)]  # fmt: skip
        names = layer_names(self.job.model)
        for prep in preps:
            out = []
            for pair, layers in handoff.pairs(prep.epoch):
                if pair[0] == self.id:
                    bundle = handoff.live_states(ctx, names, layers)
                    out.append((pair, wire.pack(bundle), state_bytes(bundle)))
            prep.ahead_out = out
            prep.sender = threading.Thread(target=prep.send_ahead, args=(partial(self._ahead_abort, prep),),
                                           name="parcae-send-ahead", daemon=True)  # fmt: skip
            prep.sender.start()
        return preps

    def _read_ahead(self, boundary: int) -> None:
        """If a prepared epoch begins at `boundary` and this worker holds its base, read the boundary's decision in
        a helper thread during the step before it (the driver decides a prepared boundary early in that step): at
        the boundary `_boundary` then needs no round trip of its own — one less in every prepared pause."""
        current, _ = self._held()
        with self._prep_lock:
            wanted = boundary not in self._reading and any(
                prep.epoch.start_step == boundary and prep.epoch.base_number == current.number and not prep.overtaken
                for prep in self._preps.values())  # fmt: skip
            if not wanted:
                return
            self._reading.add(boundary)
        threading.Thread(target=self._reading_ahead, args=(boundary,), name="parcae-read-ahead", daemon=True).start()

    def _reading_ahead(self, boundary: int) -> None:
        """(A helper thread, its own store client) Wait until the coordinator decides `boundary`, then keep its value
        for `_boundary`. Anything else — the boundary passed undecided, the store gone, a value that is not the job's
        — leaves nothing: the boundary asks the store itself, as unprepared ones do."""
        try:
            store = self._connect()
            store.wait([keys.boundary_decided(boundary)], timedelta(seconds=PREPARE_WAIT_S))
            value = store.get(keys.boundary(boundary)).decode()
        except Exception:  # noqa: BLE001 — (see above: the boundary's own compare-and-set decides then)
            return
        if value not in ("", HOLD):
            self._decided[boundary] = value

    def _grads_ahead(self, preps: Sequence[Prepared]) -> None:
        """(`train_step`'s `reduced`, on the main thread) Hand the step's final gradients of what `preps` sent ahead
        to their senders (`Prepared.pack_grads`), which send them while this step commits and applies."""
        _, ctx = self._held()
        for prep in preps:
            prep.pack_grads(ctx)

    def _await_ahead(self, epoch: Epoch, first: bool = False) -> bool:
        """If this worker's preparation helper receives what comes ahead for `epoch`, wait until it has (and has
        installed and stepped it where it could): woken at once, checking the epoch's abort flag meanwhile. Whether
        the helper receives (else `_transfer` receives the first phase itself). `first`: before the hand-off, where
        a source that sent nothing ahead must not wait — its empty first-phase messages may be what the helpers
        (its own included, elsewhere) wait for."""
        prep = self._preparation(epoch)
        if prep is None:
            return False
        if first and prep.ahead_out is None and any(t.src == self.id for t in epoch.transfers):
            return False
        with self._prep_lock:
            if not prep.receiving:
                return False
        while not prep.received.wait(POLL_MAX_S):
            self._check_epoch(epoch.number)
            self._control()
        return True

    def _ahead_abort(self, prep: Prepared) -> str | None:
        """Why a preparation's helpers should stop waiting on their peers (None: keep waiting): a newer preparation,
        its epoch or the one it starts from broken, or its epoch decided otherwise."""
        if prep.overtaken:
            return "a newer preparation replaced it"
        if self._stopped.is_set():
            return "the worker stops"
        e = prep.epoch
        reason = self._epoch_abort(e.number) or self._epoch_abort(e.base_number)
        if reason:
            return reason
        key = keys.epoch(e.number)
        got = self.store.get_if(key)
        if got is not None and Epoch.from_json(got) != e:
            return f"epoch {e.number} was decided otherwise"
        return None

    def _enter(
        self, epoch: Epoch, received: Mapping[str, LayerState], prebuilt: HeldLayers | None = None,
        caught: HeldLayers | None = None, hollow: HeldLayers | None = None,
    ) -> bool:  # fmt: skip
        """Join `epoch`'s process groups and hold its layers: kept ones in place, the rest installed (or loaded from
        the checkpoint of a checkpoint-restart epoch). `prebuilt`: initialised layers a standby built ahead; `hollow`:
        layers without values, built ahead for the state `received` to fill; `caught`: layers already caught up.
        A migration that cannot form its groups (a peer died, or the epoch was flagged) raises `MigrationAbandoned`
        with nothing installed; a first or checkpoint-restart epoch returns False instead: the worker then holds the
        epoch's layers, flags it broken and is RECOVERING."""
        job, old = self.job, self.ctx
        t0 = time.perf_counter()
        number = epoch.number
        fresh = epoch.kind in (MigrationKind.START, MigrationKind.CHECKPOINT_RESTART)
        rank = epoch.rank(self.id)
        failure: Exception | None = None
        prebuilt, caught = prebuilt or {}, caught or {}
        hollow = {} if fresh else hollow or {}  # only a migration installs a state into every layer it builds
        try:
            groups = self._take_prepared(epoch, "groups")
            if groups is None:
                groups = self._form(lambda store: init_epoch(store, number, epoch.strategy, rank, self._pg_timeout(),
                                                             abort=lambda: self._epoch_abort(number),
                                                             prefix=epoch.group_prefix,
                                                             address=self._gloo_address), number)  # fmt: skip
        except MigrationAbandoned as e:
            if not fresh:
                raise
            failure = e
            groups = EpochGroups(epoch=number, rank=rank, world=None, dp=None, abandoned=True)
        t1, grouped = time.perf_counter(), time.time()
        stage, replica = epoch.assignment[self.id]
        want = epoch.layers(stage)
        # layers this member built for the epoch (at the boundary or ahead), and those whose state came ahead
        built = {"built": 0, "built_ahead": 0, "caught_up": 0}
        ahead = {**hollow, **prebuilt}
        if old is not None and old.module.indices == want:
            ctx = StageContext(job.model, job.train, epoch.strategy, stage, replica, old.module, old.optimizers, groups,
                               old.device)  # fmt: skip
        else:
            # the layers we keep stay as they are (modules and optimisers: nothing copied); the rest were built
            # while we stood by, or are built now, then take the state received (or the checkpoint's)
            kept = {} if fresh or old is None else {i: (old.module.layer(i), old.optimizers[i])
                                                     for i in old.module.indices if i in want}  # fmt: skip
            # the layers whose state arrives now, built hollow (their values are installed below) unless built ahead
            incoming = [] if fresh else [i for i in want if i not in kept and i not in caught and i not in ahead]
            now = hollow_layers(job.model, job.train, incoming, self.device)
            ctx = build_context(job.model, job.train, epoch.strategy, rank, groups, self.device,
                                held={**now, **ahead, **caught, **kept})  # fmt: skip
            built["built_ahead"] = sum(1 for i in want if i in ahead and i not in kept)
            built["built"] = sum(1 for i in want if i not in ahead and i not in kept)
            built["caught_up"] = sum(1 for i in want if i in caught)
            if epoch.kind is MigrationKind.CHECKPOINT_RESTART and epoch.restore_step:
                mine = self._restore(epoch, ctx.names)
                ctx.load_layer_states(mine)
                self.store.set(keys.loaded(number, self.id), str(state_bytes(mine)))  # (before the ready report)
            elif not fresh:
                lacking = [n for n, i in zip(ctx.names, ctx.module.indices, strict=True)
                           if i not in kept and i not in caught]  # fmt: skip
                ctx.load_layer_states(received, lacking)  # KeyError if a layer were lost
        # until the first step is applied, keep what we migrated from (a shared module is unchanged until then)
        self._uncommitted = not fresh
        self._base = self._held() if not fresh and old is not None else None  # still (the old epoch, `old`) here
        self.ctx, self.epoch, self.next = ctx, epoch, None
        self.step = epoch.start_step
        self.watch = max(self.watch, epoch.number + 1)
        self.last_step_end = max(self.last_step_end, time.time())  # a pause starts no earlier than we could train
        if failure is not None:
            self._phases, self._at = {}, {}
            self._to(WorkerState.TRAINING)
            self._abandon(f"forming the groups of epoch {number} failed: {failure}")
            return False
        phases: dict[str, Any] = {**self._phases, "groups_s": t1 - t0, "install_s": time.perf_counter() - t1, **built}
        if self._at:  # (a migration's: a first or restart epoch is not entered through `_migrate`)
            phases["at"] = {**self._at, "groups": grouped}
        self._phases, self._at = {}, {}
        # both reports in one request (the pause ends at the time taken before it, the ready report's own)
        self.store.multi_set([keys.phases(epoch.number, self.id), keys.ready(epoch.number, self.id)],
                             [json.dumps(phases), repr(time.time())])  # fmt: skip
        return True

    def _restore(self, epoch: Epoch, names: Sequence[str]) -> dict[str, LayerState]:
        """The state of layers `names` in the checkpoint restoring `epoch` loads: from the shards that hold them
        (the driver names them), read from this instance's disk, or fetched from the checkpoint URI where this disk
        does not hold them (instances that do not share a disk)."""
        job, step = self.job, epoch.restore_step
        assert step is not None, "a restoring epoch names its step"
        cut = json.loads(self.store.get(keys.ckpt_restore(epoch.number)))
        directory = Path(job.checkpoint_dir)
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=directory) as scratch:
            files = gather_shards(directory, step, cut, names, self._mirror, Path(scratch))
            ckpt = checkpoint.load(files, config=job.model, job=job.job, complete=False)
        missing = [n for n in names if n not in ckpt.layers]
        if missing:
            raise checkpoint.CheckpointError(f"the checkpoint of step {step} ({', '.join(f.name for f in files)}) "
                                             f"lacks layers {missing}")  # fmt: skip
        scales = spec_of(job.model, job.train).scaling is not None
        if any((loss_scale.SCALE_KEY in ckpt.layers[n]) != scales for n in names):
            raise checkpoint.CheckpointError(
                f"the checkpoint of step {step} {'holds no' if scales else 'holds a'} loss scale, and the spec "
                f"{'scales' if scales else 'does not scale'} its loss: it was written by a job with other "
                "`loss_scaling` (float16 autocast scales by default since 2026-12-06); give the spec the "
                "`loss_scaling` it was trained with, or start the job afresh")  # fmt: skip
        return {name: ckpt.layers[name] for name in names}

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> int:
        """Run to a terminal state; returns the process exit code."""
        try:
            return self._run()
        finally:
            self._stopped.set()
            if self._rows is not None:
                self._rows.close()

    def _prefetcher(self) -> Prefetcher | None:
        """Where this worker's rows come from: the next step's loaded while it trains (`TrainSpec.prefetch`), kept
        across epochs (a migration's first step loads its own rows now; the steps after it come ahead again)."""
        if self._rows is None:
            spec = spec_of(self.job.model, self.job.train)
            if spec.prefetch:
                self._rows = Prefetcher(spec.batch, self.job.steps)
        return self._rows

    def _run(self) -> int:
        try:
            self.join()
            while True:
                if self.state is WorkerState.STANDBY:
                    self._standby()
                elif self.state is WorkerState.TRAINING:
                    self._train()
                elif self.state is WorkerState.MIGRATING:
                    self._migrate()
                elif self.state is WorkerState.RECOVERING:
                    self._recover()
                elif self.state is WorkerState.PREEMPTED:
                    return self._end(EXIT_PREEMPTED)
                elif self.state is WorkerState.RESTARTING:
                    return self._end(EXIT_RESTART)
                else:
                    return self._end(EXIT_DONE)
        except Restart:
            self._to(WorkerState.RESTARTING)
            return self._end(EXIT_RESTART)
        except TokenError as e:
            self._fail("rejected", str(e))
            return EXIT_TOKEN
        except Aborted as e:  # the driver knows why (it says so itself): nothing to print here
            self._fail("error", str(e), quiet=True)
            return EXIT_ABORTED
        except (
            Diverged,
            loss_scale.LossScaleError,
            checkpoint.CheckpointError,
            SpecError,
            DeviceError,
        ) as e:  # a user's problem
            self._fail("error", f"worker {self.id} at step {self.step}: {e}")
            return EXIT_FAILED
        except BaseException as e:  # noqa: BLE001 — reported to the coordinator, then the process exits
            self._fail("error", f"worker {self.id} in {self.state.name} at step {self.step}: "
                                f"{type(e).__name__}: {e}\n{traceback.format_exc()}")  # fmt: skip
            return EXIT_FAILED

    def _end(self, code: int) -> int:
        """Tell the coordinator this process ends normally (its heartbeat is about to stop), once the shards it
        wrote are at the checkpoint URI."""
        self._report_uploads(flush=True)
        self.store.set(keys.exited(self.id), repr(time.time()))
        self.store.set(keys.final(self.id), str(self.incarnation))
        return code

    def _fail(self, kind: str, message: str, quiet: bool = False) -> None:
        if not quiet:  # one write, the line's end with it: workers failing together share the terminal
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        try:
            self._to(WorkerState.FAILED)
            if self._store is not None:
                self.store.set(keys.message(kind, self.id), message)
                self.store.set(keys.final(self.id), str(self.incarnation))
        except Exception:  # the store itself may be what failed
            pass


def _die_with_parent() -> None:
    """Linux: get SIGKILLed when the launcher dies, so no worker outlives its job (even one stuck in a gloo op).

    The kernel fires it when the *thread* that started us exits; `run_job` blocks that thread until every worker has
    ended, so this only triggers when the launcher crashes. `Worker._control` also checks getppid() as a fallback.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def process_main(spec: WorkerSpec) -> None:
    """Entry point of a spawned worker process. SIGTERM is a preemption notice from here on (`Notice`)."""
    global _NOTICE
    # Ctrl-C in a terminal reaches the whole process group: the driver stops the job, a worker does not print a
    # KeyboardInterrupt of its own (the provider starts us with SIGINT blocked: see LocalProcessProvider._spawn)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _NOTICE = Notice()
    _NOTICE.install()
    _die_with_parent()
    torch.set_num_threads(1)
    code = Worker(spec).run()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter finalisation (~1 s with torch loaded); everything worth keeping is in the store or on disk
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="A parcae trainer worker (one per instance).")
    p.add_argument("--id", type=int, required=True, help="this instance's worker id (stable across epochs)")
    p.add_argument("--host", default="127.0.0.1", help="the coordinator's store host")
    p.add_argument("--port", type=int, required=True, help="the coordinator's store port")
    a = p.parse_args(argv)
    # the token comes from the environment, not argv (visible to every user in `ps`)
    process_main(WorkerSpec(a.id, a.host, a.port, os.environ.get(TOKEN_ENV),
                            driver_key=os.environ.get(DRIVER_KEY_ENV)))  # fmt: skip


if __name__ == "__main__":
    main()
