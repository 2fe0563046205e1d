"""The instance agent: what runs on an instance whose job is driven from another machine (EC2 spot instances, other
hosts), and the driver's view of such instances.

Owns: `InstanceAgent` (the per-instance loop: start the worker process, report how it ended, start a fresh one
when the driver asks for a checkpoint-restart, pass a preemption notice on to it), `AgentInstances` (the driver's
side: a cloud `InstanceProvider` for starting and reclaiming instances, the store for everything the local
provider learns from its child processes) — both speaking the `agent/...` keys of `trainer.runtime.keys` — and
`python -m trainer.providers.agent`.
Must not touch: the job's control plane (`trainer.control.coordinator`), what a worker does (`trainer.runtime.worker`),
the cloud API (`trainer.providers.aws`), the IMDS watcher it runs (`trainer.providers.imds`).

Why an agent: `trainer.control.run`'s driver learns how each worker process ended from its exit code and asks for a
fresh process on the same instance after a checkpoint-restart (what torchelastic's agent does). A local process
is the driver's child; a process on another machine is not, so the agent reports for it through the job's store
(`trainer.runtime.keys`: agent/{id}/up, exit and start per process; signals the driver asks it to pass on, which is how
a preemption notice the driver learns of — a trace replay, a spot request's status — reaches a worker elsewhere).

A worker that ends with any code but EXIT_RESTART ends the agent with the same code (the instance is then the
cloud's to reclaim). SIGTERM or SIGINT to the agent — the cloud's preemption notice, from the IMDS watcher this
agent runs (`--imds`) or from whatever manages the host — is passed on to the worker, once the worker can take it
(its heartbeat moved: its handler is installed), never lost in between.

On the driver's side an instance's exit code is the agent's report if there is one, else -9 (killed) once the
cloud no longer lists the instance as alive (it was reclaimed without notice: the agent died with it), else None
(still running). The driver asks the cloud at most every `alive_every_s`; heartbeats catch a death sooner.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal as _signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trainer.providers.instances import InstanceProvider, NoticeDeadlines
from trainer.runtime import keys

KILLED = -9  # exit code the driver reads for an instance reclaimed without its agent reporting (SIGKILL)
EXIT_RESTART = 125  # = trainer.runtime.worker.EXIT_RESTART (not imported: the agent must not import torch's model code)
POLL_S = 0.1
RESTART_WAIT_S = 600.0  # how long an agent waits for the driver's go after its worker exited for a restart


# ------------------------------------------------------------------------------------------- on the instance


class InstanceAgent:
    """Runs instance `worker`'s worker processes for the job whose store is at `host:port`, one at a time.

    `command` builds a worker process's argv (default: `python -m trainer.runtime.worker --id --host --port`); the token
    reaches the worker in PARCAE_TOKEN (never argv: `ps`). `store` (tests) replaces the TCPStore client."""

    def __init__(
        self, worker: int, host: str, port: int, token: str | None = None, *, poll_s: float = POLL_S,
        restart_wait_s: float = RESTART_WAIT_S, store_timeout_s: float = 60.0, store: Any = None,
        command: Callable[[int, str, int], list[str]] | None = None,
    ) -> None:  # fmt: skip
        self.worker, self.host, self.port, self.token = int(worker), host, int(port), token
        self.poll_s, self.restart_wait_s, self.store_timeout_s = poll_s, restart_wait_s, store_timeout_s
        self.store = store
        self.command = command or _worker_command
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnation = -1
        self._pending: list[int] = []  # signals to pass on once the worker can take them
        self._hb_at_start = 0
        self._forwarded = 0  # driver signals handled (agent/{id}/signals)
        self._lock = threading.RLock()  # re-entrant: the signal handler runs on the thread that may hold it

    # -- signals from the instance (the cloud's notice) ----------------------------------------------------
    def notify(self, signum: int) -> None:
        """Pass `signum` on to the worker (now, or as soon as it can take it). Safe from a signal handler."""
        with self._lock:
            self._pending.append(int(signum))

    def install(self) -> None:
        """SIGTERM/SIGINT to this process become notices for the worker instead of ending the agent."""
        for s in (_signal.SIGTERM, _signal.SIGINT):
            _signal.signal(s, lambda signum, _frame: self.notify(signum))

    # -- the loop -------------------------------------------------------------------------------------------
    def connect(self) -> Any:
        if self.store is None:
            from trainer.runtime.store import connect_store  # here, not at import: `--help` must not need torch

            self.store = connect_store(self.host, self.port, self.token, self.store_timeout_s)
        return self.store

    def run(self) -> int:
        """Start worker process 0; return the exit code of the last one (what ends the agent)."""
        store = self.connect()
        self._spawn(0)
        try:
            while True:
                code = self.proc.poll() if self.proc is not None else None
                if code is None:
                    self._deliver(store)
                    time.sleep(self.poll_s)
                    continue
                store.set(keys.agent_exit(self.worker, self.incarnation), str(code))
                if code != EXIT_RESTART or not self._await_restart(store):
                    return code
                self._spawn(self.incarnation + 1)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()  # the agent is going (its store is gone): its worker must not outlive it
                self.proc.wait()

    def _spawn(self, k: int) -> None:
        store = self.store
        hb = keys.heartbeat(self.worker)
        self._hb_at_start = int(store.add(hb, 0))
        env = dict(os.environ)
        from trainer.runtime.store import DRIVER_KEY_ENV, TOKEN_ENV  # (torch is loaded by now: `connect` came first)

        if self.token:
            env[TOKEN_ENV] = self.token
        driver = getattr(store, "driver_key", None)  # the key the agent pinned when it connected
        if driver:
            env[DRIVER_KEY_ENV] = driver
        self.proc = subprocess.Popen(self.command(self.worker, self.host, self.port), env=env)
        self.incarnation = k
        store.set(keys.agent_up(self.worker, k), str(self.proc.pid))

    def _deliver(self, store: Any) -> None:
        """Pass on the driver's signals and the instance's pending ones, once the worker's handler is in."""
        n = int(store.add(keys.agent_signals(self.worker), 0))
        while self._forwarded < n:
            self._forwarded += 1
            self.notify(int(store.get(keys.agent_signal(self.worker, self._forwarded))))
        with self._lock:
            if not self._pending or int(store.add(keys.heartbeat(self.worker), 0)) <= self._hb_at_start:
                return
            pending, self._pending = self._pending, []
        proc = self.proc
        assert proc is not None  # `run` delivers only once it has spawned the worker
        for s in pending:
            with contextlib.suppress(ProcessLookupError):  # the worker ended meanwhile
                proc.send_signal(s)

    def _await_restart(self, store: Any) -> bool:
        """After an EXIT_RESTART: True once the driver asks for the next process, False if the job ended first."""
        key = keys.agent_start(self.worker, self.incarnation + 1)
        end = time.monotonic() + self.restart_wait_s
        while time.monotonic() < end:
            if store.check([key]):
                return True
            if store.check([keys.DONE]) or store.check([keys.ABORT]):
                return False
            time.sleep(self.poll_s)
        print(f"parcae agent {self.worker}: no restart asked within {self.restart_wait_s:.0f} s; leaving",
              file=sys.stderr, flush=True)  # fmt: skip
        return False


def _worker_command(worker: int, host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "trainer.runtime.worker", "--id", str(worker), "--host", host, "--port", str(port)]


# ---------------------------------------------------------------------------------------- the driver's side


@dataclass(frozen=True)
class RemoteJob:
    """How `trainer.control.run.run_job` drives a job whose instances are elsewhere: the coordinator listens on `port`
    (all interfaces) and the agents reach it at `host`; `token` is the job's (required: the port is reachable from other
    machines); `instances(store)` builds the driver's `AgentInstances` on the coordinator's store, and
    `fleet(store)`, where the provider runs a live fleet, its `trainer.providers.fleet.Fleet` (an `AgentInstances`
    too) instead."""

    host: str
    port: int
    token: str
    instances: Callable[[Any], AgentInstances]
    fleet: Callable[[Any], AgentInstances] | None = None


class AgentInstances(NoticeDeadlines):
    """The driver's view (`trainer.control.run`) of instances whose worker processes agents run: the same calls as
    `trainer.providers.local.LocalProcessProvider`, with the cloud (`cloud`, an `InstanceProvider`:
    `trainer.providers.aws`'s spot instances) starting and reclaiming instances and the store (`store`, the
    coordinator's) telling how their processes ended.

    An instance whose worker ended for good (any code but a checkpoint-restart's) is handed back to the cloud at
    once (`cloud.kill`): a spot instance costs money until terminated. `preempt(ids, notice_s)` passes a SIGTERM
    to the workers through their agents (a trace replay's or a spot request's notice) and reclaims what still runs
    at the deadline; the cloud's own notices (`cloud.interruptions()`, when it has them) are passed the same way."""

    def __init__(
        self, cloud: InstanceProvider, store: Any, *, alive_every_s: float = 2.0, refresh_s: float = 0.05,
        interruptions_every_s: float = 5.0,
    ) -> None:  # fmt: skip
        self.cloud, self.store = cloud, store
        self.alive_every_s, self.refresh_s, self.interruptions_every_s = alive_every_s, refresh_s, interruptions_every_s
        self.incarnation: dict[int, int] = {}
        self.exit_history: dict[int, list[int]] = {}
        self.reclaimed: list[tuple[int, float]] = []
        self.notices: list[
            Any
        ] = []  # the cloud's interruption notices passed on (trainer.providers.aws.InterruptionNotice)
        self._codes: dict[int, int] = {}  # current process's exit code, once known
        self._released: set[int] = set()
        self._reclaim_at: dict[int, float] = {}
        self._refreshed = self._asked_alive = self._asked_interruptions = 0.0

    # -- starting -------------------------------------------------------------------------------------------
    def start(self, n: int) -> list[int]:
        return self._started(self.cloud.start(n))

    def start_ids(self, ids: Iterable[int], next_id: int) -> list[int]:
        ids = list(ids)
        running = sorted(w for w in ids if w in self.incarnation and self.exitcode(w) is None)
        if running:
            raise ValueError(f"instances {running} are already running")
        start_ids = getattr(self.cloud, "start_ids", None)
        if start_ids is None:
            raise TypeError(f"{type(self.cloud).__name__} cannot start given instance ids (a resumed job needs it)")
        return self._started(start_ids(ids, next_id))

    def _started(self, ids: list[int]) -> list[int]:
        for w in ids:
            if w in self.incarnation:  # a resumed job may start an id again: its old reports are not this one's
                raise ValueError(f"instance {w} was started before by this job")
            self.incarnation[w] = 0
        return ids

    def restart(self, ids: Iterable[int]) -> None:
        """Ask the agents of `ids` for a fresh worker process each (theirs ended for a checkpoint-restart)."""
        for w in ids:
            code = self.exitcode(w)
            if code != EXIT_RESTART:
                raise RuntimeError(f"instance {w}: its process has not ended for a restart (exit code {code})")
            self.exit_history.setdefault(w, []).append(code)
            k = self.incarnation[w] + 1
            self.incarnation[w] = k
            self._codes.pop(w, None)
            self.store.set(keys.agent_start(w, k), "1")

    # -- reclaiming -----------------------------------------------------------------------------------------
    def signal(self, ids: Iterable[int], signum: int) -> list[int]:
        reached = []
        for w in ids:
            if w in self.incarnation and self.exitcode(w) is None:
                n = int(self.store.add(keys.agent_signals(w), 1))
                self.store.set(keys.agent_signal(w, n), str(int(signum)))
                reached.append(w)
        return reached

    def kill(self, ids: Iterable[int]) -> None:
        ids = [w for w in ids if w in self.incarnation and w not in self._released]
        if not ids:
            return
        self.cloud.kill(ids)
        self._released.update(ids)
        self.refresh(force=True)
        for w in ids:
            self._codes.setdefault(w, KILLED)

    # -- what became of them ----------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Read new exit reports; every `alive_every_s`, ask the cloud which instances are gone."""
        now = time.monotonic()
        if not force and now - self._refreshed < self.refresh_s:
            return
        self._refreshed = now
        for w, k in self.incarnation.items():
            if w not in self._codes and self.store.check([keys.agent_exit(w, k)]):
                self._codes[w] = int(self.store.get(keys.agent_exit(w, k)))
        if now - self._asked_alive >= self.alive_every_s:
            self._asked_alive = now
            alive = self.cloud.alive()
            for w in self.incarnation:
                reported = self.store.check([keys.agent_exit(w, self.incarnation[w])])
                if w not in alive and w not in self._codes and not reported:
                    self._codes[w] = KILLED
                    self._released.add(w)

    def poll(self) -> None:
        """Reclaim expired notices (killed ones go to `reclaimed`), pass on the cloud's notices, hand back the
        instances whose workers ended for good."""
        self.refresh()
        now = time.monotonic()
        self._reclaim_due()
        done = [w for w, c in self._codes.items() if c != EXIT_RESTART and w not in self._released]
        if done:
            self.cloud.kill(done)
            self._released.update(done)
        interruptions = getattr(self.cloud, "interruptions", None)
        if interruptions is not None and now - self._asked_interruptions >= self.interruptions_every_s:
            self._asked_interruptions = now
            for notice in interruptions():
                w = getattr(notice, "worker", None)
                if w is not None and self.signal([w], _signal.SIGTERM):
                    self.notices.append(notice)

    def exitcode(self, w: int) -> int | None:
        if w not in self.incarnation:
            raise KeyError(f"instance {w} was not started by this job")
        return self._codes.get(w)

    def exitcodes(self) -> dict[int, int | None]:
        self.refresh()
        return {w: self._codes.get(w) for w in self.incarnation}

    def alive(self) -> set[int]:
        self.poll()
        return {w for w in self.incarnation if w not in self._codes}

    def stop(self) -> None:
        """Hand every instance back to the cloud (`cloud.stop()` when it has one, else `kill`)."""
        stop = getattr(self.cloud, "stop", None)
        if stop is not None:
            stop()
        else:
            self.cloud.kill([w for w in self.incarnation if w not in self._released])
        self._released.update(self.incarnation)


# --------------------------------------------------------------------------------------------------- the CLI


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m trainer.providers.agent",
        description="Run one instance's parcae worker processes for a job driven from another machine.",
    )
    p.add_argument("--id", type=int, required=True, help="this instance's worker id (the driver gave it)")
    p.add_argument("--host", required=True, help="the coordinator's store host, as this instance reaches it")
    p.add_argument("--port", type=int, required=True, help="the coordinator's store port")
    p.add_argument(
        "--imds",
        action="store_true",
        help="watch EC2's instance metadata for a spot interruption notice and pass it on to the worker "
        "as SIGTERM (endpoint: $AWS_EC2_METADATA_SERVICE_ENDPOINT, else AWS's link-local one)",
    )
    p.add_argument("--imds-poll-s", type=float, default=5.0, help="seconds between IMDS polls (AWS advises 5)")
    a = p.parse_args(argv)
    agent = InstanceAgent(a.id, a.host, a.port, os.environ.get("PARCAE_TOKEN"))
    agent.install()
    if a.imds:
        from trainer.providers.imds import imds_watcher

        imds_watcher(lambda: agent.notify(_signal.SIGTERM), poll_s=a.imds_poll_s, who=f"parcae agent {a.id}").start()
    try:
        return agent.run()
    except (RuntimeError, OSError) as exc:  # the store: unreachable, or gone (the driver ended)
        print(f"parcae agent {a.id}: the job's store at {a.host}:{a.port}: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
