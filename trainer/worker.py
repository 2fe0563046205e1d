"""One worker process per instance: joins the job, trains its stage, live-migrates at step boundaries.

Owns: the worker's state machine, the per-step boundary check, the state hand-off of a migration (transfer group,
sends/receives, install) and its own measurements in the store. Must not touch: planning (it follows the `Epoch`
the coordinator published; `trainer.migration`), the training maths (`trainer.pipeline.train_step`), other
workers' processes.

State machine (`WorkerState`):

    JOINING --registered--> STANDBY --epoch 1 gives a role--> TRAINING
                            STANDBY --a later epoch gives a role--> MIGRATING (receives its layers)
    TRAINING --boundary decided "epoch:n"--> MIGRATING
    MIGRATING --role in epoch n--> TRAINING          (same step: no step is lost or repeated)
    MIGRATING --no role--> STANDBY                   (drops its layers)
    MIGRATING --listed as preempted--> PREEMPTED     (after sending what the plan asks; exit 13)
    STANDBY --preempted--> PREEMPTED;  STANDBY --job done--> DONE;  TRAINING --last step--> DONE (exit 0)
    any --error--> FAILED (exit 1; 2 for a wrong token; 3 when the coordinator aborts the job)

What changes at a migration: the epoch, the strategy (D, P, layer bounds), this worker's (stage, replica) and its
**rank — ranks are not stable across epochs** (rank = stage * D + replica of the new epoch; the worker id is the
stable identity), the process groups (a fresh default group on `PrefixStore(f"epoch{n}")`), and the layers held
(kept by global index when the stage's range is unchanged, else rebuilt and installed from the kept snapshots plus
the received layers). The step counter, the data order and the optimiser state carry over unchanged.

State hand-off: the layers of the epoch's `transfers` move in a separate gloo group of just the senders and
receivers (`PrefixStore(f"xfer{n}")`, rank = position in id order), so a worker under a preemption notice can send
without being part of the new epoch's training group. Each (src, dst) pair sends one `send_object_list` message with
a dict {layer name: `pipeline.layer_state`} — shapes, dtypes and optimiser keys travel with the data, and for
these CPU models (MBs) pickling costs little next to group formation (stack.md §4d: 335 MB/s vs 1.1 GB/s for flat
tensors). Pairs are processed in one global order, so blocking sends cannot deadlock.
"""

from __future__ import annotations

import argparse
import enum
import hmac
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from liveput.migration import MigrationKind
from trainer import checkpoint
from trainer.data import corpus
from trainer.coordinator import HOLD, TRAIN, JobSpec, token_digest
from trainer.migration import Epoch, state_bytes
from trainer.model import layer_names
from trainer.pipeline import (
    LayerState,
    StageContext,
    build_context,
    close_epoch,
    init_epoch,
    layer_state,
    make_optimizer,
    train_step,
)

EXIT_DONE, EXIT_FAILED, EXIT_TOKEN, EXIT_ABORTED, EXIT_PREEMPTED = 0, 1, 2, 3, 13  # 13: the reference's code
POLL_MIN_S, POLL_MAX_S = 0.001, 0.02


class WorkerState(enum.Enum):
    JOINING = "JOINING"
    STANDBY = "STANDBY"
    TRAINING = "TRAINING"
    MIGRATING = "MIGRATING"
    PREEMPTED = "PREEMPTED"
    DONE = "DONE"
    FAILED = "FAILED"


_NEXT = {
    WorkerState.JOINING: {WorkerState.STANDBY},
    WorkerState.STANDBY: {WorkerState.TRAINING, WorkerState.MIGRATING, WorkerState.PREEMPTED, WorkerState.DONE},
    WorkerState.TRAINING: {WorkerState.MIGRATING, WorkerState.DONE},
    WorkerState.MIGRATING: {WorkerState.TRAINING, WorkerState.STANDBY, WorkerState.PREEMPTED},
}


class TokenError(RuntimeError):
    """The worker was not given the token the coordinator requires."""


class Aborted(RuntimeError):
    """The coordinator aborted the job, or the process that started this worker is gone."""


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process is started with; everything else comes from the coordinator's store."""

    worker_id: int
    host: str
    port: int
    token: str | None = None
    store_timeout_s: float = 60.0


class Worker:
    """One instance of the job (torchelastic's `Worker` is to its `WorkerSpec` as this is to `WorkerSpec`)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.id = spec.worker_id
        self.state = WorkerState.JOINING
        self.store: dist.TCPStore | None = None
        self.job: JobSpec | None = None
        self.epoch: Epoch | None = None  # the epoch this worker trains in (None when standby)
        self.next: Epoch | None = None  # the epoch it is migrating into
        self.ctx: StageContext | None = None
        self.step = 0
        self.watch = 1  # the next epoch number to look at
        self.last_step_end = 0.0
        self._phases: dict[str, float] = {}  # durations of the current migration's phases, for the coordinator
        self._parent = os.getppid()

    # -- plumbing ----------------------------------------------------------------------------------------
    def _to(self, new: WorkerState) -> None:
        if new is not WorkerState.FAILED and new not in _NEXT.get(self.state, set()):
            raise RuntimeError(f"worker {self.id}: illegal transition {self.state.name} -> {new.name}")
        self.state = new
        if self.store is not None:
            at = self.step if new in (WorkerState.TRAINING, WorkerState.MIGRATING, WorkerState.DONE) else "-"
            self.store.append(f"ctl/states/{self.id}", f"{new.name}@{at};")

    def _control(self) -> None:
        """Raise `Aborted` if the coordinator aborted the job or our parent died (no orphans)."""
        if os.getppid() != self._parent:
            raise Aborted(f"worker {self.id}: the launching process exited")
        if self.store.check(["ctl/abort"]):
            raise Aborted(f"worker {self.id}: job aborted by the coordinator: {self.store.get('ctl/abort').decode()}")

    def _poll(self, ready) -> None:
        """Wait until `ready()` is true, checking for an abort. Backs off from 1 to 20 ms: a hold can last seconds
        (an added instance starting) and busy-polling the store would steal the CPU that instance needs."""
        delay = POLL_MIN_S
        while not ready():
            self._control()
            time.sleep(delay)
            delay = min(2 * delay, POLL_MAX_S)

    def _pg_timeout(self) -> timedelta:
        return timedelta(seconds=self.job.pg_timeout_s)

    # -- JOINING -----------------------------------------------------------------------------------------
    def join(self) -> None:
        """Connect, check the token, read the job, register. -> STANDBY"""
        s = self.spec
        self.store = dist.TCPStore(s.host, s.port, is_master=False, timeout=timedelta(seconds=s.store_timeout_s))
        self.store.append(f"ctl/states/{self.id}", "JOINING@-;")
        mode = self.store.get("auth/mode").decode()
        if mode == "token":
            where = f"coordinator at {s.host}:{s.port}"
            if not s.token:
                raise TokenError(f"worker {self.id}: the {where} requires a token and none was given")
            salt = self.store.get("auth/salt").decode()
            if not hmac.compare_digest(token_digest(salt, s.token), self.store.get("auth/digest").decode()):
                raise TokenError(f"worker {self.id}: wrong token for the {where}; refusing to join")
        self.job = JobSpec.from_json(self.store.get("job/spec"))
        # Pay one-off costs while joining rather than inside a migration's pause: the first optimiser built in a
        # process imports torch._dynamo (~1 s), and the corpus is loaded on first use.
        make_optimizer(torch.nn.Linear(1, 1), self.job.train)
        corpus()
        # read the current epoch *before* registering: any epoch that includes us is published after that
        if self.store.check(["epoch/current"]):
            self.watch = Epoch.from_json(self.store.get("epoch/current")).number + 1
        self.store.set(f"ctl/worker/{self.id}", str(os.getpid()))
        self.store.append("ctl/joined", f"{self.id},")
        self._to(WorkerState.STANDBY)

    # -- STANDBY -----------------------------------------------------------------------------------------
    def _standby(self) -> None:
        """Wait for an epoch that gives this worker a role, the job's end, or a preemption."""
        delay = POLL_MIN_S
        while True:
            self._control()
            key = f"epoch/{self.watch}"
            if self.store.check([key]):
                epoch = Epoch.from_json(self.store.get(key))
                self.watch += 1
                if self.id in epoch.assignment:
                    if epoch.kind is MigrationKind.START:
                        self._enter(epoch, received={})
                        self._to(WorkerState.TRAINING)
                    else:
                        self.next, self.step = epoch, epoch.start_step
                        self._to(WorkerState.MIGRATING)
                    return
                continue
            pkey = f"ctl/preempt/{self.id}"
            if self.store.check([pkey]) and int(self.store.get(pkey)) < self.watch:
                self._to(WorkerState.PREEMPTED)
                return
            if self.store.check(["ctl/done"]):
                self._to(WorkerState.DONE)
                return
            time.sleep(delay)
            delay = min(2 * delay, POLL_MAX_S)

    # -- TRAINING ----------------------------------------------------------------------------------------
    def _boundary(self, step: int) -> Epoch | None:
        """The decision for the boundary before `step`, taken once for everyone (see trainer.coordinator)."""
        key = f"ctl/boundary/{step}"
        v = self.store.compare_set(key, "", TRAIN).decode()
        if v == HOLD:
            self._poll(lambda: self.store.get(key).decode() != HOLD)
            v = self.store.get(key).decode()
        if v == TRAIN:
            return None
        return Epoch.from_json(self.store.get(f"epoch/{int(v.split(':', 1)[1])}"))

    def _train(self) -> None:
        ctx, epoch, job = self.ctx, self.epoch, self.job
        reporter = ctx.is_last and ctx.replica == 0
        while self.step < job.steps:
            if self.step != epoch.start_step:
                nxt = self._boundary(self.step)
                if nxt is not None:
                    self.next = nxt
                    self._to(WorkerState.MIGRATING)
                    return
            loss = train_step(ctx, self.step)
            self.last_step_end = time.time()
            if reporter:
                self.store.set(f"loss/{self.step}", repr(loss))
            self.step += 1
        if ctx.replica == 0:  # one shard per stage, written by its first replica
            path = checkpoint.shard_path(job.checkpoint_dir, job.steps, ctx.stage)
            checkpoint.save(path, ctx.layer_states(), step=job.steps, config=job.model, job=job.job)
        close_epoch()
        self._to(WorkerState.DONE)

    # -- MIGRATING ---------------------------------------------------------------------------------------
    def _migrate(self) -> None:
        new, old = self.next, self.epoch
        assert new is not None
        n = new.number
        if old is not None:  # an old member: we are at the boundary, with no op pending
            if new.number != old.number + 1:
                raise RuntimeError(f"worker {self.id}: epoch {old.number} followed by epoch {new.number}")
            self.store.set(f"ctl/e{n}/arrive/{self.id}", repr(self.last_step_end))
            self.store.add(f"ctl/e{n}/arrived", 1)
            close_epoch()
        else:  # joining from standby: the old members must be at the boundary before groups can form
            self._poll(lambda: self.store.add(f"ctl/e{n}/arrived", 0) >= len(new.previous))
        self.step = new.start_step
        self.watch = max(self.watch, n + 1)
        t0 = time.perf_counter()
        received = self._transfer(new) if self.id in new.transfer_parties else {}
        self._phases = {"transfer_s": time.perf_counter() - t0}
        if self.id in new.preempted:
            self._drop()
            self._to(WorkerState.PREEMPTED)
        elif self.id not in new.assignment:
            self._drop()
            self._to(WorkerState.STANDBY)
        else:
            self._enter(new, received)
            self._to(WorkerState.TRAINING)

    def _drop(self) -> None:
        self.ctx, self.epoch, self.next = None, None, None

    def _transfer(self, epoch: Epoch) -> dict[str, LayerState]:
        """Send and receive this worker's share of `epoch.transfers`; returns what it received, by layer name."""
        parties = epoch.transfer_parties
        dist.init_process_group(
            "gloo", store=dist.PrefixStore(f"xfer{epoch.number}", self.store), rank=parties.index(self.id),
            world_size=len(parties), timeout=self._pg_timeout(),
        )  # fmt: skip
        names = layer_names(self.job.model)
        pairs: dict[tuple[int, int], list[int]] = {}
        for t in epoch.transfers:
            pairs.setdefault((t.src, t.dst), []).append(t.layer)
        received: dict[str, LayerState] = {}
        sent = 0
        try:
            for (src, dst), layers in sorted(pairs.items()):
                if src == self.id:
                    ctx = self.ctx
                    bundle = {names[i]: layer_state(ctx.module.layer(i), ctx.optimizers[i]) for i in layers}
                    dist.send_object_list([bundle], dst=parties.index(dst))
                    sent += state_bytes(bundle)
                elif dst == self.id:
                    buf: list = [None]
                    dist.recv_object_list(buf, src=parties.index(src))
                    if set(buf[0]) != {names[i] for i in layers}:
                        got = sorted(buf[0])
                        raise RuntimeError(f"worker {self.id}: expected layers {layers} from {src}, got {got}")
                    received.update(buf[0])
        finally:
            dist.destroy_process_group()
        self.store.add(f"ctl/e{epoch.number}/bytes", sent)
        return received

    def _enter(self, epoch: Epoch, received: Mapping[str, LayerState]) -> None:
        """Join `epoch`'s process groups and hold its layers: kept ones in place, the rest installed."""
        job, old = self.job, self.ctx
        t0 = time.perf_counter()
        groups = init_epoch(self.store, epoch.number, epoch.strategy, epoch.rank(self.id), self._pg_timeout())
        t1 = time.perf_counter()
        stage, replica = epoch.assignment[self.id]
        want = epoch.layers(stage)
        if old is not None and old.module.indices == want:
            ctx = StageContext(job.model, job.train, epoch.strategy, stage, replica, old.module, old.optimizers, groups)
        else:
            ctx = build_context(job.model, job.train, epoch.strategy, epoch.rank(self.id), groups)
            if epoch.kind is not MigrationKind.START:
                kept = old.layer_states() if old is not None else {}
                ctx.load_layer_states({**kept, **received})  # KeyError if a layer were lost
        self.ctx, self.epoch, self.next = ctx, epoch, None
        self.step = epoch.start_step
        self.watch = max(self.watch, epoch.number + 1)
        phases = {**self._phases, "groups_s": t1 - t0, "install_s": time.perf_counter() - t1}
        self._phases = {}
        self.store.set(f"ctl/e{epoch.number}/phases/{self.id}", json.dumps(phases))
        self.store.set(f"ctl/e{epoch.number}/ready/{self.id}", repr(time.time()))

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> int:
        """Run to a terminal state; returns the process exit code."""
        try:
            self.join()
            while True:
                if self.state is WorkerState.STANDBY:
                    self._standby()
                elif self.state is WorkerState.TRAINING:
                    self._train()
                elif self.state is WorkerState.MIGRATING:
                    self._migrate()
                elif self.state is WorkerState.PREEMPTED:
                    return EXIT_PREEMPTED
                else:
                    return EXIT_DONE
        except TokenError as e:
            self._fail("rejected", str(e))
            return EXIT_TOKEN
        except Aborted as e:
            self._fail("error", str(e))
            return EXIT_ABORTED
        except BaseException as e:  # noqa: BLE001 — reported to the coordinator, then the process exits
            self._fail("error", f"worker {self.id} in {self.state.name} at step {self.step}: "
                                f"{type(e).__name__}: {e}\n{traceback.format_exc()}")  # fmt: skip
            return EXIT_FAILED

    def _fail(self, kind: str, message: str) -> None:
        print(message, file=sys.stderr, flush=True)
        try:
            self._to(WorkerState.FAILED)
            if self.store is not None:
                self.store.set(f"ctl/{kind}/{self.id}", message)
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
    """Entry point of a spawned worker process."""
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
    process_main(WorkerSpec(a.id, a.host, a.port, os.environ.get("PARCAE_TOKEN")))


if __name__ == "__main__":
    main()
