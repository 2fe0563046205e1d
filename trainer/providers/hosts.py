"""Hosts: a job's instances on machines you already have (a lab cluster, reserved VMs), reached with OpenSSH.

Owns: `SshHosts` (the `InstanceProvider` that starts an instance agent on a host over ssh and reclaims it) and
`hosts_job` (a `trainer.providers.agent.RemoteJob` on them). Must not touch: the job's control plane, the agent's
protocol (`trainer.providers.agent`), what a worker does.

Each instance is one `python -m trainer.providers.agent --id N --host H --port P` on a host, started by the `ssh` client
(BatchMode: keys or an agent, never a password prompt). The remote shell prints its PID, reads the job token from
stdin (never argv: `ps` on the host) and `exec`s the agent, so that PID is the agent's; the agent's and its
worker's output go to ssh's stderr, which is ours (stdout is a pipe nobody reads after the PID). A host takes up to
`slots` instances at once; `start` fills the least busy host first, in its lowest free slot, and the slot is the
GPU that instance's worker trains on there (`PARCAE_DEVICE_INDEX`). `kill` SIGKILLs the agent's children (the worker)
and the agent on the host (`pkill -P`, `kill`), then the local ssh client. An instance is alive while its ssh client
runs (the client ends when the agent does). The hosts need this project installed at `workdir` with `python`, and
the coordinator's port reachable (the token guards against mis-wiring; keep the port on a private network).
"""

from __future__ import annotations

import contextlib
import secrets
import shlex
import subprocess
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from trainer.providers.agent import AgentInstances, RemoteJob
from trainer.providers.instances import NumberedInstances
from trainer.runtime.devices import DEVICE_INDEX_ENV

SSH = ("ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new")


class HostsError(RuntimeError):
    """A host could not be reached, or refused the agent."""


class SshHosts(NumberedInstances):
    """Instances are instance agents on `hosts` (ssh destinations, `user@name` allowed), `slots` per host.

    `coordinator_host`/`coordinator_port`: the coordinator as the hosts reach it; `token`: the job's; `python`,
    `workdir`: the interpreter and the project checkout on every host; `ssh`: the client's argv before the host
    (default: OpenSSH in BatchMode)."""

    def __init__(
        self, hosts: Sequence[str], coordinator_host: str, coordinator_port: int, token: str, *, slots: int = 1,
        python: str = "python3", workdir: str = ".", ssh: Sequence[str] = SSH, start_timeout_s: float = 30.0,
    ) -> None:  # fmt: skip
        hosts = [h.strip() for h in hosts]
        if not hosts or any(not h or h.startswith("-") or any(c.isspace() for c in h) for h in hosts):
            raise ValueError(f"hosts: expected ssh destinations such as 'gpu1' or 'me@10.0.0.7', got {hosts!r}")
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"hosts: {sorted({h for h in hosts if hosts.count(h) > 1})} listed twice; use slots")
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
        if not token:
            raise ValueError("a job on other hosts needs a token")
        self.hosts, self.slots = list(hosts), slots
        self.coordinator_host, self.coordinator_port, self.token = coordinator_host, int(coordinator_port), token
        self.python, self.workdir, self.ssh = python, workdir, list(ssh)
        self.start_timeout_s = start_timeout_s
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.host_of: dict[int, str] = {}
        self.slot_of: dict[int, int] = {}  # the slot (and GPU index) an instance holds on its host
        self.pid_of: dict[int, int] = {}  # the agent's PID on its host
        super().__init__()

    def remote_command(self, worker: int, slot: int = 0) -> str:
        """The shell command run on the host for instance `worker` in the host's `slot` (0 .. slots-1), which is
        also the GPU its worker trains on there (`PARCAE_DEVICE_INDEX`, with --device cuda)."""
        q = shlex.quote
        return (f"cd {q(self.workdir)} && echo $$ && IFS= read -r PARCAE_TOKEN && export PARCAE_TOKEN && "
                f"export {DEVICE_INDEX_ENV}={int(slot)} && "
                f"exec {q(self.python)} -m trainer.providers.agent --id {int(worker)} "
                f"--host {q(self.coordinator_host)} "
                f"--port {self.coordinator_port} 1>&2")  # fmt: skip

    # -- InstanceProvider ------------------------------------------------------------------------------------
    # start(n), start_ids(ids, next_id): `NumberedInstances`, over `_launch`

    def _taken(self, ids: list[int]) -> str | None:
        running = [w for w in ids if w in self.procs and self.procs[w].poll() is None]
        return f"instances {running} are already running" if running else None

    def _launch(self, ids: list[int]) -> None:
        started: list[int] = []
        try:
            for w in ids:
                host, slot = self._free_slot()
                proc = subprocess.Popen([*self.ssh, host, self.remote_command(w, slot)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, start_new_session=True)  # fmt: skip
                self.procs[w], self.host_of[w], self.slot_of[w] = proc, host, slot
                started.append(w)
                self.pid_of[w] = self._handshake(w, proc, host)
        except BaseException:
            self.kill(started)
            raise

    def _free_slot(self) -> tuple[str, int]:
        """The least busy host, and its lowest slot that no running instance holds."""
        held: dict[str, set[int]] = {h: set() for h in self.hosts}
        for w, p in self.procs.items():
            if p.poll() is None:
                held[self.host_of[w]].add(self.slot_of[w])
        host = min(self.hosts, key=lambda h: len(held[h]))
        if len(held[host]) >= self.slots:
            raise HostsError(f"every host runs {self.slots} instance(s) already ({', '.join(self.hosts)}); add hosts "
                             "or slots")  # fmt: skip
        return host, min(set(range(self.slots)) - held[host])

    def _handshake(self, w: int, proc: subprocess.Popen[bytes], host: str) -> int:
        """Read the remote PID, send the token; HostsError if ssh fails first."""
        out: list[bytes] = []
        stdout, stdin = proc.stdout, proc.stdin
        assert stdout is not None and stdin is not None  # `_launch` pipes both
        reader = threading.Thread(target=lambda: out.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        line = out[0].strip() if out else b""
        if not line.isdigit():
            code = proc.poll()
            if code is None and out:  # the pipe closed (EOF): ssh is exiting; its status follows in a moment
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = proc.wait(timeout=5)
            why = f"ssh exited with {code}" if code is not None else f"no answer within {self.start_timeout_s:.0f} s"
            raise HostsError(
                f"instance {w} on {host}: ssh did not start the agent ({why}); "
                f"check `{' '.join(self.ssh)} {host} true` and the workdir {self.workdir!r}"
            )
        stdin.write(self.token.encode() + b"\n")
        stdin.close()
        return int(line)

    def preempt(self, ids: Iterable[int], notice_s: float) -> None:
        raise NotImplementedError("hosts are not reclaimed with notice; AgentInstances gives notice itself")

    def kill(self, ids: Iterable[int]) -> None:
        for w in ids:
            proc = self.procs.get(w)
            if proc is None or proc.poll() is not None:
                continue
            pid = self.pid_of.get(w)
            if pid is not None:
                subprocess.run([*self.ssh, self.host_of[w], f"pkill -KILL -P {pid}; kill -KILL {pid}"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=self.start_timeout_s)  # fmt: skip
            proc.kill()
            proc.wait(timeout=10)

    def alive(self) -> set[int]:
        return {w for w, p in self.procs.items() if p.poll() is None}

    def stop(self) -> None:
        self.kill(list(self.procs))


def hosts_job(hosts: Sequence[str], coordinator_host: str, coordinator_port: int, **kw: Any) -> RemoteJob:
    """A `trainer.providers.agent.RemoteJob` on `hosts` (`SshHosts(**kw)`, checked now, before any coordinator starts)
    with a fresh token."""
    token = secrets.token_urlsafe(32)
    cloud = SshHosts(hosts, coordinator_host, coordinator_port, token, **kw)
    return RemoteJob(host=coordinator_host, port=int(coordinator_port), token=token,
                     instances=lambda store: AgentInstances(cloud, store))  # fmt: skip
