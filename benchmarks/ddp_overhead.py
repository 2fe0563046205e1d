"""Throughput of our elastic trainer at D x 1 with no events versus plain `DistributedDataParallel`, side by side.

Issue requirement: "with D x 1 and no events, samples/s >= 0.9 x plain DistributedDataParallel on the same processes
and batch". For each D (`--d`, default 1 2 4) and each repeat, both sides run in turn (the order alternates between
repeats, so drift on a shared machine hits both), and the table shows medians over `--repeats`:

  ours  `trainer.control.run.run_job(JobConfig(...), Schedule(workers=D, strategy=(D, 1)))`: D spawned
        worker processes, the coordinator, heartbeats, per-step boundary and commit decisions in the store, the
        GPipe step with one flat gradient all-reduce per stage and the loss all-reduce.
  DDP   D spawned processes, gloo `init_process_group` (explicit timeout) on a TCPStore the parent hosts, the same
        network (`trainer.build_layers` chained in order, same seed, same dtype) wrapped in
        `torch.nn.parallel.DistributedDataParallel`, the same global batch of each step
        (the spec's `batch(step)`, `shard` into the replica's rows and micro-batches of `micro_batch`),
        gradients accumulated over the micro-batches under `no_sync()` (one bucketed all-reduce per step, on the last
        micro-batch), the spec's optimiser over all parameters, `torch.set_num_threads(1)` per process as
        `trainer.runtime.worker.process_main` does. The loss is scaled as ours (the spec's sum over rows /
        global_batch, times D because DDP averages gradients over replicas), so both sides train the same run: the
        table's last column is the largest relative difference of their loss curves (float32: small but not zero,
        summation orders differ).

What is timed (both sides, the same span):
  steady  the goal metric. Steps `--warmup`..S-1, i.e. excluding process start-up (spawn, `import torch`), group
          formation, model construction, the first `--warmup` steps and the end of the job. Ours: the wall times
          at which steps warmup-1 and S-1 were committed, i.e. their loss keys appeared in the coordinator's store
          (`StepClock`: an observer whose thread blocks on those keys; ~1 ms resolution). DDP: rank 0's clock
          after a barrier that follows step warmup-1 and one that follows step S-1.
  whole   what `run_job` reports as `throughput.samples_per_s`: S * global_batch / train_s, where train_s runs from
          the first epoch's publication (every worker process started, imported torch and joined) to every worker
          having exited after its last step (group formation, model build, warm-up and the final shard write
          included). DDP: from every process having imported torch, built a first optimiser and loaded the corpus
          (the one-off costs our workers pay while joining; they then wait on the store) to every process having
          exited, after rank 0 saved the final state dict.

    python benchmarks/ddp_overhead.py [--d 1 --d 2 --d 4] [--model tiny-gpt|MODULE:FUNCTION] [--model-args JSON]
                                      [--steps 30] [--warmup 5]
                                      [--repeats 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from trainer import (  # noqa: E402  # noqa: E402  # noqa: E402
    CheckpointConfig,
    ControlPlaneConfig,
    JobConfig,
    JobObserver,  # noqa: E402
    ModelConfig,
    Schedule,  # noqa: E402
    Stage,
    TrainConfig,
    build_layers,  # noqa: E402
    check_job,
    load_spec,
    micro_loss,  # noqa: E402
    model_config,
    run_job,  # noqa: E402
    shard,
)

GOAL = 0.9
PG_TIMEOUT_S = 60.0
POLL_S = 0.005  # as the driver's


# -------------------------------------------------------------------------------------------------------- ours
class StepClock(JobObserver):
    """Times when steps `first` and `last` are committed, to the millisecond.

    The driver feeds observers at most every `trainer.control.run.OBSERVE_S` (0.1 s), batching steps, so `StepInfo.time`
    is too coarse for a span of a second or two. Instead, at `on_start` (whose info names the coordinator's store),
    a thread of ours, with its own TCPStore client, blocks in `wait` on the keys `loss/{first}` and `loss/{last}`,
    which the last stage's replica 0 sets as soon as it has applied that step (`trainer.runtime.worker`), and notes the
    wall time each appears. A blocking wait, not a poll: it adds no load to the workers' store while they train.
    """

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.seen: dict[int, float] = {}
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    def on_start(self, info: Mapping[str, Any]) -> None:
        self._thread = threading.Thread(target=self._watch, args=(info["host"], int(info["port"])),
                                        name="step-clock", daemon=True)  # fmt: skip
        self._thread.start()

    def _watch(self, host: str, port: int) -> None:
        try:
            store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=600))
            for s in (self.first, self.last):
                store.wait([f"loss/{s}"])
                self.seen[s] = time.time()
        except Exception as e:  # noqa: BLE001 — reported by `span`
            self.error = f"{type(e).__name__}: {e}"

    def span(self) -> float:
        """Seconds from step `first` committed to step `last` committed."""
        if self._thread is not None:
            self._thread.join(timeout=5)
        if set(self.seen) != {self.first, self.last}:
            raise RuntimeError(f"the step clock saw steps {sorted(self.seen)} of {self.first, self.last}: {self.error}")
        return self.seen[self.last] - self.seen[self.first]


def run_ours(model: ModelConfig, train: TrainConfig, d: int, steps: int, warmup: int, out: Path) -> dict[str, Any]:
    clock = StepClock(warmup - 1, steps - 1)
    job = JobConfig(
        out_dir=str(out),
        model=model,
        train=dataclasses.replace(train, steps=steps),
        checkpoint=CheckpointConfig(every=0),
        control=ControlPlaneConfig(timeout_s=600, pg_timeout_s=PG_TIMEOUT_S),
    )
    result = run_job(job, Schedule(workers=d, strategy=(d, 1)), observer=clock)
    return {
        "steady_samples_per_s": (steps - warmup) * train.global_batch / clock.span(),
        "whole_samples_per_s": result["throughput"]["samples_per_s"],
        "loss": result["loss"],
    }


# --------------------------------------------------------------------------------------------------------- DDP
def _ddp_rank(rank: int, world: int, port: int, model: ModelConfig, train: TrainConfig, steps: int, warmup: int,
              out: str) -> None:  # fmt: skip
    """One DDP process: wait for the go, form the group, train `steps` steps, report times and losses."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=PG_TIMEOUT_S))
    try:
        # one-off costs paid before the span, as our workers do while joining (`trainer.runtime.worker.Worker.join`):
        # the first optimiser of a process imports torch._dynamo (~1 s), the corpus loads on first use
        spec = load_spec(model, train)  # imports the spec's module (the GPT's corpus) once, as our workers do
        spec.optimizer(nn.Linear(1, 1).parameters())
        store.add("ready", 1)
        store.wait(["go"])
        dist.init_process_group("gloo", store=dist.PrefixStore("ddp", store), rank=rank, world_size=world,
                                timeout=timedelta(seconds=PG_TIMEOUT_S))  # fmt: skip
        layers = build_layers(model)  # every layer, in order, as one stage (`nn.Sequential` cannot spread a tuple)
        net = DistributedDataParallel(Stage(layers, 0, len(layers)))
        opt = spec.optimizer(net.parameters())  # one optimiser over every layer (Adam is element-wise: the same run)
        losses = torch.zeros(steps, dtype=torch.float64)
        t_a = t_b = 0.0
        for step in range(steps):
            x, y = spec.batch(step)
            micro = shard(x, y, rank, world, train.micro_batch)
            opt.zero_grad(set_to_none=True)
            for i, (xm, ym) in enumerate(micro):
                loss = micro_loss(spec, net(xm), ym, train.global_batch)
                losses[step] += float(loss.detach())
                if i < len(micro) - 1:
                    with net.no_sync():  # accumulate locally; all-reduce only with the last micro-batch
                        (loss * world).backward()
                else:
                    (loss * world).backward()
            opt.step()
            if step == warmup - 1:
                dist.barrier()
                t_a = time.time()
        dist.barrier()
        t_b = time.time()
        if rank == 0:  # the job's result on disk, as our workers write their final shards
            torch.save(net.module.state_dict(), os.path.join(out, "final.pt"))
        dist.all_reduce(losses)  # after the span: the global loss of each step
        if rank == 0:
            store.set("result", json.dumps({"t_a": t_a, "t_b": t_b, "loss": losses.tolist()}))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 — reported to the parent, which raises it
        store.set(f"error/{rank}", traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # as our workers: skip interpreter finalisation


def run_ddp(model: ModelConfig, train: TrainConfig, d: int, steps: int, warmup: int, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=PG_TIMEOUT_S))  # fmt: skip
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_ddp_rank, args=(r, d, store.port, model, train, steps, warmup, str(out)),
                         name=f"ddp-rank-{r}", daemon=True) for r in range(d)]  # fmt: skip
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 600

        def wait(cond, what: str) -> None:
            while not cond():
                failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if failed:
                    r = failed[0]
                    msg = store.get(f"error/{r}").decode() if store.check([f"error/{r}"]) else "(no message)"
                    raise RuntimeError(f"DDP rank {r} exited with code {procs[r].exitcode}: {msg}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"DDP baseline: timed out waiting for {what}")
                time.sleep(POLL_S)

        wait(lambda: store.add("ready", 0) >= d, "every process to start")
        t0 = time.time()
        store.set("go", "1")
        wait(lambda: all(p.exitcode is not None for p in procs), "every process to end")
        t1 = time.time()
        wait(lambda: all(p.exitcode == 0 for p in procs), "every process to succeed")
        res = json.loads(store.get("result"))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    return {
        "steady_samples_per_s": (steps - warmup) * train.global_batch / (res["t_b"] - res["t_a"]),
        "whole_samples_per_s": steps * train.global_batch / (t1 - t0),
        "loss": res["loss"],
    }


# ------------------------------------------------------------------------------------------------------- table
def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def measure(model: ModelConfig, train: TrainConfig, ds: list[int], steps: int, warmup: int, repeats: int,
            tmp: Path) -> dict[int, dict[str, Any]]:  # fmt: skip
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {d: {"ours": [], "ddp": []} for d in ds}
    for rep in range(repeats):
        for d in ds:
            order = ("ours", "ddp") if rep % 2 == 0 else ("ddp", "ours")
            for side in order:
                fn = run_ours if side == "ours" else run_ddp
                t0 = time.monotonic()
                r = fn(model, train, d, steps, warmup, tmp / f"{side}-d{d}-r{rep}")
                r["wall_s"] = time.monotonic() - t0
                runs[d][side].append(r)
                print(f"  repeat {rep + 1}/{repeats}, D={d}, {side:>4}: steady {r['steady_samples_per_s']:8.1f} "
                      f"samples/s, whole {r['whole_samples_per_s']:8.1f} samples/s ({r['wall_s']:.1f} s wall)",
                      file=sys.stderr, flush=True)  # fmt: skip
    out: dict[int, dict[str, Any]] = {}
    for d, sides in runs.items():
        med = {side: {k: statistics.median(r[k] for r in rs) for k in ("steady_samples_per_s", "whole_samples_per_s")}
               for side, rs in sides.items()}  # fmt: skip
        out[d] = {
            "ours": med["ours"],
            "ddp": med["ddp"],
            "ratio_steady": med["ours"]["steady_samples_per_s"] / med["ddp"]["steady_samples_per_s"],
            "ratio_whole": med["ours"]["whole_samples_per_s"] / med["ddp"]["whole_samples_per_s"],
            # each repeat ran the two sides back to back: their ratio is less exposed to slow drift in load
            "paired_ratios": [
                o["steady_samples_per_s"] / p["steady_samples_per_s"]
                for o, p in zip(sides["ours"], sides["ddp"], strict=True)
            ],  # fmt: skip
            "loss_max_rel_diff": max(
                max_rel_diff(o["loss"], p["loss"]) for o, p in zip(sides["ours"], sides["ddp"], strict=True)
            ),  # fmt: skip
            "samples": {
                side: [{k: r[k] for k in ("steady_samples_per_s", "whole_samples_per_s", "wall_s")} for r in rs]
                for side, rs in sides.items()
            },  # fmt: skip
        }
    return out


def table(res: dict[int, dict[str, Any]]) -> str:
    lines = [f"{'D':>2} {'ours samples/s':>15} {'DDP samples/s':>14} {'ratio':>6}  {'goal':<9}{'paired ratios':>14}"
             f"{'ours whole':>11} {'DDP whole':>10} {'ratio':>6} {'loss rel diff':>14}", "-" * 110]  # fmt: skip
    for d, r in res.items():
        goal = "met" if r["ratio_steady"] >= GOAL else "NOT met"
        paired = f"{min(r['paired_ratios']):.2f}-{max(r['paired_ratios']):.2f}"
        lines.append(f"{d:>2} {r['ours']['steady_samples_per_s']:>15.1f} {r['ddp']['steady_samples_per_s']:>14.1f} "
                     f"{r['ratio_steady']:>6.2f}  {goal:<9}{paired:>14}{r['ours']['whole_samples_per_s']:>11.1f} "
                     f"{r['ddp']['whole_samples_per_s']:>10.1f} {r['ratio_whole']:>6.2f} "
                     f"{r['loss_max_rel_diff']:>14.1e}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", type=int, action="append", help="data-parallel degree D (repeatable; default 1 2 4)")
    ap.add_argument("--model", default="tiny-gpt", help="a registered model or module:function returning a "
                    "parcae.TrainSpec (default tiny-gpt)")  # fmt: skip
    ap.add_argument("--model-args", default="{}", metavar="JSON", help="the model function's keyword arguments")
    ap.add_argument("--dtype", choices=("float32", "float64"), help="the built-in GPTs' dtype (both sides)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    ap.add_argument("--warmup", type=int, default=5, help="first steps left out of the steady span (default 5)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side per D; the table shows medians")
    ap.add_argument("--json", metavar="OUT", help="write the medians, ratios and every run's numbers here")
    a = ap.parse_args(argv)
    ds = a.d or [1, 2, 4]
    args = {**json.loads(a.model_args), **({"dtype": a.dtype} if a.dtype else {})}
    model = model_config(a.model, **args)
    # the spec's own rows per step (the built-in GPTs': TrainConfig's default)
    train = check_job(JobConfig(model=model, train=TrainConfig(steps=a.steps)), batch_given=False).train
    if not 1 <= a.warmup < a.steps:
        ap.error(f"--warmup must be in [1, --steps), got {a.warmup} with --steps {a.steps}")
    if any(not 1 <= d <= train.global_batch for d in ds):
        ap.error(f"--d must be in [1, global_batch={train.global_batch}], got {ds}")
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(model, train, ds, a.steps, a.warmup, a.repeats, Path(tmp))
    wall = time.monotonic() - t0
    shown = f"{a.model} {json.dumps(args)}" if args else a.model
    print(f"{shown}, D x 1, no events: {a.steps} steps (steady span: steps {a.warmup}..{a.steps - 1}), "
          f"global batch {train.global_batch}, micro-batch {train.micro_batch}, 1 torch thread per process; "
          f"medians of {a.repeats} runs per side; {wall:.1f} s wall")  # fmt: skip
    print(table(res))
    print(f"  goal: ours >= {GOAL} x DDP samples/s in the steady span (ratio of the medians; 'paired ratios': the "
          "range of ours / DDP within each repeat, which ran them back to back)")  # fmt: skip
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"  load average at the end: {load:.1f} on {os.cpu_count()} CPUs (a loaded machine widens the spread)")
    if a.json:
        out = {"model": a.model, "model_args": args, "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats,
               "global_batch": train.global_batch, "micro_batch": train.micro_batch, "goal_ratio": GOAL,
               "wall_s": wall, "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
               "by_d": {str(d): r for d, r in res.items()}}  # fmt: skip
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
