"""Run one elastic job end to end on this machine: a coordinator, spawned workers, a scripted event schedule.

Owns: `run_job` (used by the tests and, later, the CLI), the worker processes' lifetime (spawn, watch, reap — none
outlives the call) and the job's result. Must not touch: planning (`trainer.migration`), the control plane's
store layout (`trainer.coordinator`), training (`trainer.worker`).

How a schedule is driven: every event step's boundary is *held* before any worker starts (a scripted schedule is a
perfect forecast), so workers reaching it wait for its decision and each reconfiguration lands exactly at its step.
Events are then decided in order as soon as possible — a preemption with notice or a plan needs nothing from the
workers; an `add` starts the new instances' processes when the schedule reaches it (i.e. right after the previous
reconfiguration is published) and is decided once they have joined, so if they are slower to start than training
is to reach the step, the hold shows up in that migration's pause (as a real scale-up's rendezvous would).
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainer import checkpoint
from trainer.config import ModelConfig, TrainConfig, model_config
from trainer.coordinator import Coordinator, ScheduleError, check_schedule
from trainer.events import Event, group_events, parse_events
from trainer.model import layer_names
from trainer.worker import EXIT_DONE, EXIT_PREEMPTED, WorkerSpec, process_main


class JobError(RuntimeError):
    """A job that started but did not finish: a worker failed, exited unexpectedly or the job timed out."""


class Fleet:
    """The worker processes of one job on this machine, by worker id."""

    def __init__(self, coordinator: Coordinator, token: str | None) -> None:
        self.coordinator = coordinator
        self.token = token
        self.ctx = mp.get_context("spawn")
        self.procs: dict[int, Any] = {}
        self.expected_exit: dict[int, int] = {}  # worker id -> exit code it may end with (13 once preempted)

    def spawn(self, ids: Iterable[int]) -> None:
        c = self.coordinator
        old = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # read when the child imports torch
        try:
            for w in ids:
                spec = WorkerSpec(w, c.host, c.port, self.token)
                p = self.ctx.Process(target=process_main, args=(spec,), name=f"parcae-worker-{w}", daemon=True)
                p.start()
                self.procs[w] = p
                self.expected_exit[w] = EXIT_DONE
        finally:
            os.environ.pop("OMP_NUM_THREADS") if old is None else os.environ.__setitem__("OMP_NUM_THREADS", old)

    def check(self) -> None:
        """Raise `JobError` if a worker ended with anything but its expected exit code."""
        for w, p in self.procs.items():
            code = p.exitcode
            if code is not None and code != self.expected_exit[w]:
                msg = self.coordinator.message("error", w) or self.coordinator.message("rejected", w)
                raise JobError(f"worker {w} exited with code {code}" + (f": {msg}" if msg else " (no message)"))

    def wait(self, ids: Iterable[int], deadline: float) -> None:
        for w in ids:
            while self.procs[w].exitcode is None:
                self.check()
                if time.monotonic() > deadline:
                    raise JobError(f"worker {w} did not finish before the job's timeout")
                time.sleep(0.01)
        self.check()

    def stop(self) -> None:
        """Reap every process; kill those still running (the job failed or timed out)."""
        for p in self.procs.values():
            p.join(timeout=0.5 if p.exitcode is None else 5)
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def parameters_checksum(layers: Mapping[str, Mapping[str, torch.Tensor]], names: Sequence[str]) -> str:
    """sha256 over every parameter tensor (layer order, then parameter name); optimiser state excluded."""
    h = hashlib.sha256()
    for name in names:
        for key in sorted(k for k in layers[name] if k.startswith("param/")):
            t = layers[name][key].detach().contiguous()
            h.update(f"{name}/{key}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.numpy().tobytes())
    return h.hexdigest()


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
) -> dict[str, Any]:
    """Train `steps` steps on `workers` initial instances starting at `strategy` = (D, P), applying `events`.

    Everything is validated before a process starts (unknown model, impossible strategies, bad events, an
    `out_dir` holding an earlier job's checkpoint: `UnknownModelError`, `ScheduleError`, `EventError`); a job that
    starts but fails raises `JobError` with the failing worker's message, and no worker outlives the call.
    `events` are dicts in the `trainer.events` format or `Event`s. Returns::

        {"loss": [loss of each step], "reconfigurations": [one record per migration, see Coordinator.records],
         "final_checksum": sha256 of all parameters, "layers": checkpoint directory (one shard per final stage),
         "events": the coordinator's event log, "states": {worker id: its state transitions},
         "exit_codes": {worker id: code}, "wall_s": seconds}
    """
    t0 = time.monotonic()
    model = model_config(model_cfg) if isinstance(model_cfg, str) else model_cfg
    evs = parse_events(list(events))
    groups = group_events(evs)
    check_schedule(model, train_cfg, workers, tuple(strategy), steps, groups)
    out = Path(out_dir)
    layers_dir = out / "layers"
    if layers_dir.exists() and any(layers_dir.iterdir()):
        raise ScheduleError(f"{layers_dir} already holds files (of an earlier job?); give run_job a fresh out_dir")
    coord = Coordinator(
        model, train_cfg, steps, checkpoint_dir=str(layers_dir), job=job, host=host, token=token,
        require_token=require_token, pg_timeout_s=pg_timeout_s,
    )  # fmt: skip
    fleet = Fleet(coord, token)
    deadline = t0 + timeout_s
    ok = False
    try:
        for g in groups:
            coord.claim(g.step)
        fleet.spawn(range(workers))
        coord.wait_joined(range(workers), deadline - time.monotonic(), fleet.check)
        coord.start(tuple(strategy), list(range(workers)))
        next_id = workers
        for g in groups:
            added = list(range(next_id, next_id + g.add))
            next_id += g.add
            fleet.spawn(added)
            coord.wait_joined(added, deadline - time.monotonic(), fleet.check)
            coord.reconfigure(g.step, g.strategy, g.preempt, added)
            for w in g.preempt:
                fleet.expected_exit[w] = EXIT_PREEMPTED
        fleet.wait(coord.current.members, deadline)  # the final epoch trains to the end and writes its shards
        coord.finish()
        fleet.wait(fleet.procs, deadline)
        shards = checkpoint.find_shards(layers_dir, steps)
        final = checkpoint.load(shards, config=model, job=job)
        result = {
            "loss": coord.losses(),
            "reconfigurations": coord.records(),
            "final_checksum": parameters_checksum(final.layers, layer_names(model)),
            "layers": str(layers_dir),
            "events": coord.log,
            "states": {w: coord.states(w) for w in sorted(fleet.procs)},
            "exit_codes": {w: p.exitcode for w, p in sorted(fleet.procs.items())},
            "wall_s": time.monotonic() - t0,
        }
        ok = True
        return result
    except TimeoutError as e:
        raise JobError(str(e)) from None
    finally:
        if not ok:
            coord.abort("run_job failed")
        fleet.stop()
