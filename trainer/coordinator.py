"""The control plane of one elastic job: the store, membership, epochs, step boundaries and the event log.

Owns: a `torch.distributed.TCPStore` hosted here (stack.md §4b: `world_size=None, is_master=True,
wait_for_workers=False`, so it outlives any worker), the job's published spec, the token check's public half,
membership (worker ids that joined, minus those preempted), the current `Epoch`, the decision per step boundary,
and the log of reconfigurations. Must not touch: tensors, process groups, training — workers do that; which
assignment and transfers an epoch has is `trainer.migration`'s pure planning, which the coordinator only calls.

One process hosts it (`trainer.run.run_job` uses its own main thread). Keys in the store:

  job/spec                 JSON: model and train configs, steps, job id, checkpoint dir, PG timeout
  auth/mode, auth/salt, auth/digest
                           "none", or "token" with sha256(salt + token): a worker proves it was given the job's
                           token and refuses to join otherwise (it exits with EXIT_TOKEN and writes ctl/rejected/{id})
  epoch/{n}, epoch/current the epoch blobs (`Epoch.to_json`): every epoch, and the latest one
  ctl/joined               "3,0,1,..." appended by each worker when it registers (JOINING -> STANDBY)
  ctl/worker/{id}          the registered worker's pid
  ctl/boundary/{s}         the decision for the boundary before step s, taken **once** by compare-and-set (as the
                           reference's `/rdzv/global_steps_{step}` CAS, §D.3): the first worker to reach it writes
                           "train"; the coordinator claims it beforehand with "hold" and resolves a hold to
                           "epoch:{n}" (migrate into epoch n) or "train". Every member of an epoch therefore sees
                           the same decision, whatever the timing of a notice.
  ctl/preempt/{id}         the last epoch number a preempted worker takes part in (standby workers exit after it)
  ctl/decided/{s}          when the coordinator resolved a held boundary (wall clock)
  ctl/e{n}/...             per-epoch measurements: arrive/{id} (old member finished its last step), arrived
                           (counter), ready/{id} (new member about to run its first step), phases/{id} (its
                           migration's phase durations, JSON), bytes (sent, counter)
  loss/{s}                 the loss of step s, written by the last stage's replica 0
  ctl/states/{id}          the worker's state transitions, "TRAINING@0;MIGRATING@2;..."
  ctl/error/{id}, ctl/rejected/{id}, ctl/abort, ctl/done

Security: the token guards against mis-wiring (a worker of another job, a stray coordinator), not against an attacker
who can reach the port — TCPStore has no authentication or encryption. Keep the port on a private network.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import secrets
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from liveput.migration import MigrationKind
from trainer.config import ModelConfig, TrainConfig
from trainer.events import EventGroup
from trainer.migration import Epoch, PlanError, first_epoch, layer_sizes, next_epoch

HOLD, TRAIN = "hold", "train"


class ScheduleError(ValueError):
    """A job or event schedule that cannot run; raised before any process starts."""


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except (OSError, ValueError):
            return False


def token_digest(salt: str, token: str) -> str:
    return hashlib.sha256(f"{salt}:{token}".encode()).hexdigest()


@dataclass(frozen=True)
class JobSpec:
    """What every worker of the job needs besides its id: published once under `job/spec`. Never changes."""

    model: ModelConfig
    train: TrainConfig
    steps: int
    job: str
    checkpoint_dir: str
    pg_timeout_s: float

    def to_json(self) -> str:
        return json.dumps({
            "model": self.model.to_dict(), "train": {**vars(self.train), "betas": list(self.train.betas)},
            "steps": self.steps, "job": self.job, "checkpoint_dir": self.checkpoint_dir,
            "pg_timeout_s": self.pg_timeout_s,
        })  # fmt: skip

    @classmethod
    def from_json(cls, text: str | bytes) -> JobSpec:
        d = json.loads(text)
        train = {**d["train"], "betas": tuple(d["train"]["betas"])}
        return cls(ModelConfig.from_dict(d["model"]), TrainConfig(**train), d["steps"], d["job"],
                   d["checkpoint_dir"], d["pg_timeout_s"])  # fmt: skip


def check_schedule(
    model: ModelConfig, train: TrainConfig, workers: int, strategy: tuple[int, int], steps: int,
    groups: Sequence[EventGroup],
) -> list[Epoch]:
    """Dry-run the schedule with the coordinator's own planning: the epochs it will publish, or `ScheduleError`.

    Checks every strategy against the instances alive at its step (initial ones + adds - preemptions), P against
    the layer count, D against the global batch, preempted ids against who is alive, and event steps against the
    job's length.
    """
    if workers < 1:
        raise ScheduleError(f"workers must be >= 1, got {workers}")
    if steps < 1:
        raise ScheduleError(f"steps must be >= 1, got {steps}")
    D, P = strategy
    try:
        epoch = first_epoch(D, P, range(workers), model.n_layers_total, train.global_batch)
    except PlanError as e:
        raise ScheduleError(f"initial strategy: {e}") from None
    sizes = layer_sizes(model)
    alive, next_id, epochs = set(range(workers)), workers, [epoch]
    for g in groups:
        if not 1 <= g.step < steps:
            raise ScheduleError(f"event at step {g.step}: outside the job's boundaries 1..{steps - 1}")
        added = set(range(next_id, next_id + g.add))
        next_id += g.add
        alive |= added
        try:
            new = next_epoch(epoch, g.step, alive, sizes, g.strategy, g.preempt, train.global_batch)
        except PlanError as e:
            raise ScheduleError(f"event at step {g.step}: {e}") from None
        alive -= set(g.preempt)
        if new is not None:
            epoch = new
            epochs.append(new)
    return epochs


class Coordinator:
    """The job's control plane (see the module docstring for the store layout).

    Lifecycle: construct (binds the store, publishes the spec) -> `claim` the boundaries of scripted events ->
    workers join (`wait_joined`) -> `start` (epoch 1) -> `reconfigure` per event -> `finish` -> `records`.
    """

    def __init__(
        self,
        model: ModelConfig,
        train: TrainConfig,
        steps: int,
        *,
        checkpoint_dir: str,
        job: str = "job",
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        require_token: bool | None = None,
        pg_timeout_s: float = 30.0,
        store_timeout_s: float = 60.0,
    ) -> None:
        require = not is_loopback(host) if require_token is None else require_token
        if require and not token:
            raise ValueError(
                f"the coordinator listens on {host!r}, reachable from other hosts: a shared token is required "
                "(workers must present it)"
            )
        self.spec = JobSpec(model, train, steps, job, str(checkpoint_dir), pg_timeout_s)
        self.host = host
        self.store = dist.TCPStore(
            host, port, world_size=None, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=store_timeout_s),
        )  # fmt: skip
        self.port = self.store.port
        if require:
            salt = secrets.token_hex(16)
            assert token is not None
            self.store.set("auth/salt", salt)
            self.store.set("auth/digest", token_digest(salt, token))
            self.store.set("auth/mode", "token")
        else:
            self.store.set("auth/mode", "none")
        self.store.set("job/spec", self.spec.to_json())
        self.sizes = layer_sizes(model)
        self.current: Epoch | None = None
        self.epochs: list[Epoch] = []
        self.preempted: set[int] = set()
        self.log: list[dict[str, Any]] = []
        self._held: set[int] = set()

    # -- membership -------------------------------------------------------------------------------------
    def joined(self) -> set[int]:
        if not self.store.check(["ctl/joined"]):
            return set()
        return {int(w) for w in self.store.get("ctl/joined").decode().split(",") if w}

    def alive(self) -> set[int]:
        """Joined and not preempted (no heartbeats yet: a silently dead worker still counts)."""
        return self.joined() - self.preempted

    def wait_joined(self, ids: Iterable[int], timeout_s: float, check: Any = None) -> None:
        """Block until every id in `ids` registered; `check()` is called while waiting (it may raise)."""
        want = set(ids)
        deadline = time.monotonic() + timeout_s
        while not want <= self.joined():
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers {sorted(want - self.joined())} did not join within {timeout_s:.0f} s")
            time.sleep(0.01)

    # -- step boundaries ---------------------------------------------------------------------------------
    def claim(self, step: int) -> int:
        """Hold the first boundary >= `step` that no worker has passed; workers reaching it wait for its decision.

        Called before workers start, a claim of a scripted step always succeeds at that step; called while they
        train (a live notice), it may land later than asked.
        """
        s = step
        while True:
            v = self.store.compare_set(f"ctl/boundary/{s}", "", HOLD).decode()
            if v == HOLD:
                self._held.add(s)
                return s
            s += 1

    def _resolve(self, step: int, value: str) -> None:
        got = self.store.compare_set(f"ctl/boundary/{step}", HOLD, value).decode()
        if got != value:
            raise RuntimeError(f"boundary {step} was not held (it is {got!r})")
        self.store.set(f"ctl/decided/{step}", repr(time.time()))
        self._held.discard(step)

    # -- epochs ------------------------------------------------------------------------------------------
    def _publish(self, epoch: Epoch) -> None:
        blob = epoch.to_json()
        self.store.set(f"epoch/{epoch.number}", blob)
        self.store.set("epoch/current", blob)
        self.current = epoch
        self.epochs.append(epoch)

    def start(self, strategy: tuple[int, int], workers: Sequence[int]) -> Epoch:
        """Publish epoch 1 (step 0) over `workers` (they must have joined)."""
        epoch = first_epoch(strategy[0], strategy[1], workers, self.spec.model.n_layers_total,
                            self.spec.train.global_batch)  # fmt: skip
        self._publish(epoch)
        self.log.append({"step": 0, "event": "start", "strategy": list(strategy), "workers": sorted(workers)})
        return epoch

    def reconfigure(
        self,
        step: int,
        strategy: tuple[int, int] | None = None,
        preempt: Iterable[int] = (),
        added: Iterable[int] = (),
    ) -> Epoch | None:
        """Decide the boundary before `step` (held beforehand or claimed now): publish the next epoch, or let
        training pass if nothing has to change. Preempted workers are told when their last epoch is."""
        if self.current is None:
            raise RuntimeError("reconfigure before start")
        s = step if step in self._held else self.claim(step)
        preempt = tuple(sorted(preempt))
        epoch = next_epoch(self.current, s, self.alive(), self.sizes, strategy, preempt, self.spec.train.global_batch)
        entry = {"step": s, "event": "reconfigure", "strategy": list(strategy) if strategy else None,
                 "preempt": list(preempt), "added": sorted(added)}  # fmt: skip
        if epoch is not None:
            self._publish(epoch)
        last_epoch = self.current.number
        for w in preempt:
            self.store.set(f"ctl/preempt/{w}", str(last_epoch))
        self.preempted |= set(preempt)
        self._resolve(s, f"epoch:{epoch.number}" if epoch is not None else TRAIN)
        entry["kind"] = epoch.kind.value if epoch is not None else MigrationKind.NONE.value
        self.log.append(entry)
        return epoch

    # -- results -----------------------------------------------------------------------------------------
    def losses(self, steps: int | None = None) -> list[float]:
        n = self.spec.steps if steps is None else steps
        return [float(self.store.get(f"loss/{s}")) for s in range(n)]

    def _times(self, epoch: int, what: str, workers: Iterable[int]) -> list[float]:
        return [float(self.store.get(f"ctl/e{epoch}/{what}/{w}")) for w in workers]

    def records(self) -> list[dict[str, Any]]:
        """One record per reconfiguration (epochs after the first), measured once the job has run past them.

        pause_s: from the first old member finishing the old epoch's last step to the last new member being ready
        for the new epoch's first step (group teardown, transfers, group formation, installs, any hold).
        hold_s: the part of it spent waiting for the coordinator's decision (e.g. an added instance still starting;
        0 when the decision was published before the workers got there). phases_s: the slowest new member's
        transfer, group formation and install times. bytes_moved: tensor bytes the workers actually sent.
        steps_lost: always 0 — a live migration redoes no step.
        """
        out = []
        for e in self.epochs[1:]:
            arrive = self._times(e.number, "arrive", e.previous)
            ready = self._times(e.number, "ready", e.members)
            decided = float(self.store.get(f"ctl/decided/{e.start_step}"))
            phases = [json.loads(self.store.get(f"ctl/e{e.number}/phases/{w}")) for w in e.members]
            out.append({
                "epoch": e.number, "kind": e.kind.value, "notice": e.notice, "step": e.start_step,
                "strategy": [e.D, e.P], "preempted": list(e.preempted),
                "pause_s": max(ready) - min(arrive), "hold_s": max(0.0, decided - min(arrive)),
                "bytes_moved": self.store.add(f"ctl/e{e.number}/bytes", 0), "bytes_planned": e.bytes_planned,
                "transfers": len(e.transfers), "steps_lost": 0,
                "phases_s": {k: max(p.get(k, 0.0) for p in phases) for k in ("transfer_s", "groups_s", "install_s")},
            })  # fmt: skip
        return out

    def states(self, worker: int) -> list[str]:
        """The worker's state transitions, e.g. ["JOINING@-", "STANDBY@-", "TRAINING@0", ...]."""
        key = f"ctl/states/{worker}"
        if not self.store.check([key]):
            return []
        return [s for s in self.store.get(key).decode().split(";") if s]

    def message(self, kind: str, worker: int) -> str | None:
        """A worker's `error` or `rejected` message, if it wrote one."""
        key = f"ctl/{kind}/{worker}"
        return self.store.get(key).decode() if self.store.check([key]) else None

    def finish(self) -> None:
        """Tell standby workers the job is over."""
        self.store.set("ctl/done", "1")

    def abort(self, reason: str) -> None:
        """Tell every worker to stop at its next control check."""
        self.store.set("ctl/abort", reason)
