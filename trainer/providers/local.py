"""Local instances: worker processes on this machine — the trainer's view of a cloud.

Owns: `LocalProcessProvider` (an instance is a local spawned worker process; the `local` provider of
`trainer.providers`), on the interface of `trainer.providers.instances`. Must not touch: the job's control plane (a
provider never tells workers anything — the driver does), planning, training.

A *preemption with notice* is `preempt(ids, notice_s)`: the provider sends SIGTERM (the cloud's warning), the
worker reports the notice through the store, the driver decides the preemption at the next boundary, the workers
hand off their layers and exit, and whatever is still running when the notice expires is killed — as a spot
instance is reclaimed after its two-minute warning. A *kill* is a reclaim without warning (SIGKILL).
`restart(ids)` is the per-instance agent's part: a fresh worker process on the same instance after a
checkpoint-restart (what torchelastic's agent does). Other machines: `trainer.providers.hosts`, EC2 spot
instances: `trainer.providers.aws`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal as _signal
from collections.abc import Iterable
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path

from trainer.config import START_METHODS
from trainer.providers.instances import NoticeDeadlines, NumberedInstances
from trainer.runtime.worker import WorkerSpec, process_main

# "spawn": every worker process starts cold (imports torch, ~2.5 s of CPU) — a restart costs what a real one does.
# "forkserver": workers are forked from a server that imported torch once — a warm pool, for fast tests.
# What that server imports, once (torch and dynamo, which the first optimiser imports): ~0.1 s a worker, not ~2.5 s.
FORKSERVER_PRELOAD = ["torch", "torch._dynamo", "trainer.runtime.worker"]


class LocalProcessProvider(NoticeDeadlines, NumberedInstances):
    """Instances are local worker processes (`trainer.runtime.worker.process_main`) of the job at `host:port`, started
    with `start_method` (see START_METHODS).

    None outlives `stop()` (and each dies with its parent, see `trainer.runtime.worker._die_with_parent`). Exit codes of
    every process an instance ran are kept (`exit_history`), the current one is `exitcode(id)`.

    It plays the cloud: `preempt(ids, notice_s)` gives notice as clouds do — SIGTERM now (the worker reports it to
    the job, `trainer.runtime.worker.Notice`) — and SIGKILLs whatever still runs at the deadline (`poll`, which the
    driver calls all along; `reclaimed` lists those it killed). With `notify=False` it only enforces the deadline of a
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
        # (two literal calls, so each context keeps its type: `get_context(str)` is typed as a bare BaseContext)
        self.ctx: SpawnContext | ForkServerContext = (
            mp.get_context("forkserver") if start_method == "forkserver" else mp.get_context("spawn")
        )
        if start_method == "forkserver":
            self.ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        super().__init__()
        self.procs: dict[int, BaseProcess] = {}
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
