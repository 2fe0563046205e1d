"""Training pause of each reconfiguration, with background preparation off and on, versus a checkpoint-restart.

One model and one world (small-gpt by default, 4 local worker processes, float32), two jobs in one run: the same
schedule with `control.prepare` off, then on. Each job starts as 2x2 and cycles through the reconfigurations below,
each at a step boundary chosen in advance (a perfect forecast):

    2x2 -> 1x2   intra-stage    the spare replicas stand by; nothing moves, only groups are rebuilt
    1x2 -> 2x2   inter-stage    the standby instances rejoin as replicas and fetch their stage's layers
    2x2 -> 1x4   pipeline       the layers are re-cut into 4 stages; each worker fetches what it lacks
    1x4 -> 2x2   pipeline       and back
    2x2 -> 1x2   notice         one instance is preempted with notice: it hands off, the others regroup
    1x2 -> 2x2   addition       a new instance joins (started ahead) and the job grows back
    2x2 -> 2x2   checkpoint-restart, what torchrun does: every worker writes its stage's checkpoint shard at the
                 boundary, every worker process exits, fresh processes start (cold: `spawn`, import torch), join,
                 load the checkpoint and form their groups

With preparation on, the driver publishes each scheduled reconfiguration a step ahead (`Coordinator.prepare`) and its
members form its process groups while the old strategy trains; the boundary then only moves the state and swaps the
groups. A checkpoint-restart and a kill are not prepared.

The pause of a reconfiguration is the coordinator's `pause_s`: from the first old member finishing its last step
to the last new member being ready for its first step (`trainer.control.coordinator.Coordinator.records`). An
addition's pause leaves out any time the boundary held for the added instance to finish starting (it starts ahead,
as a cloud's boots; where the warm-up steps run faster than it starts, the first addition waits for it: printed
apart). Each kind is repeated `--cycles` times; the tables show medians. Goals (issue 16): with preparation on,
every kind but a kill pauses <= one step time and <= 1/10 of the same kind without preparation.

`--workers 2` runs the same cycle on a world of two (2x1 -> 1x1 -> 2x1 -> 1x2 -> 2x1, a notice, an addition): a
training process per core on a 2-core machine, as each instance of a cluster has its own hardware; with four
workers on two cores a migration's parallel work (the joiner's catch-up beside the old members' last step) queues
for the cores instead.

With `--kill`, a last cycle adds a preemption without notice: a replica is SIGKILLed mid-step, the survivors detect
it through the heartbeat (timeout 1 s), abandon the step and regroup live (reported apart, "kill").

    python benchmarks/migration_pause.py [--model small-gpt|MODULE:FUNCTION] [--model-args JSON] [--cycles 3]
                                         [--workers 4|2] [--kill] [--device cpu|cuda|auto] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer import (  # noqa: E402  # noqa: E402
    CheckpointConfig,
    ControlPlaneConfig,
    JobConfig,
    ProviderConfig,
    Schedule,  # noqa: E402
    TrainConfig,
    check_job,
    model_config,
    run_job,  # noqa: E402
)

KINDS = ("intra-stage", "inter-stage", "pipeline", "notice", "addition", "checkpoint-restart")
GAP = 3  # steps between reconfigurations: lets every worker reach steady state (and the pause end be visible)


def shapes(workers: int) -> tuple[list[int], list[int], list[int]]:
    """The strategies a world of `workers` cycles through: 2 x W/2 (the base), 1 x W/2 (half the replicas stand by)
    and 1 x W (the layers re-cut into W stages)."""
    return [2, workers // 2], [1, workers // 2], [1, workers]


def schedule(cycles: int, kill: bool, warmup: int = 24, workers: int = 4) -> tuple[list[dict], dict[int, str], int]:
    """The events, the kind each reconfiguration step measures, and the job length. `warmup` steps come first: the
    added instance (spawned at the start, beside 4 training processes on 2 cores) needs ~5 s to import torch and
    join, and an addition decided before it joined would hold the boundary for its boot, not its migration."""
    base, half, recut = shapes(workers)
    events: list[dict] = []
    labels: dict[int, str] = {}
    s = warmup
    for c in range(cycles):
        doomed = workers - 1 + c  # the last of the first instances, then the instance the previous cycle added
        cycle = [
            ("intra-stage", [{"kind": "plan", "strategy": half}]),
            ("inter-stage", [{"kind": "plan", "strategy": base}]),
            ("pipeline", [{"kind": "plan", "strategy": recut}]),
            ("pipeline", [{"kind": "plan", "strategy": base}]),
            ("notice", [{"kind": "preempt", "instances": [doomed], "notice": True},
                        {"kind": "plan", "strategy": half}]),
            ("addition", [{"kind": "add", "workers": 1}, {"kind": "plan", "strategy": base}]),
            ("checkpoint-restart", [{"kind": "checkpoint-restart", "strategy": base}]),
        ]  # fmt: skip
        for label, group in cycle:
            events += [{"step": s, **e} for e in group]
            labels[s] = label
            s += GAP
    if kill:
        events.append({"step": s, "kind": "kill", "instances": [workers - 1 + cycles]})
        labels[s] = "kill"
        s += GAP
    return events, labels, s + GAP


def measure(model: str, cycles: int, kill: bool, start_method: str, out: Path, prepare: bool,
            model_args: dict | None = None, device: str = "cpu", workers: int = 4) -> dict:  # fmt: skip
    events, labels, steps = schedule(cycles, kill, workers=workers)
    t0 = time.monotonic()
    job = JobConfig(out_dir=str(out), model=model_config(model, **(model_args or {})),
                    train=TrainConfig(steps=steps, device=device),
                    checkpoint=CheckpointConfig(every=0),
                    control=ControlPlaneConfig(timeout_s=900, pg_timeout_s=60, prepare=prepare),
                    provider=ProviderConfig(start_method=start_method, max_processes=workers + 2))  # fmt: skip
    # (2 more processes: an added instance starts ahead of its event, as a cloud's boots before it joins the job;
    # its pause then measures the joining, not a cold start)
    job = check_job(job, batch_given=False)  # a spec's own rows per step
    result = run_job(job, Schedule(workers=workers, strategy=tuple(shapes(workers)[0]), events=events))
    wall = time.monotonic() - t0
    samples: dict[str, list[float]] = {k: [] for k in (*KINDS, "kill")}
    spreads: dict[str, list[float]] = {k: [] for k in samples}  # the old members' last steps' ends, first to last
    critical: dict[str, list[dict[str, float]]] = {k: [] for k in samples}  # each pause split (`critical_s`)
    prepared: dict[str, list[bool]] = {k: [] for k in samples}
    boots: list[float] = []
    for r in result["reconfigurations"]:
        label = labels.get(r["step"], "kill" if not r["notice"] else r["kind"])
        pause = r["pause_s"]
        if label == "addition":  # the instance starts ahead, as a cloud's boots: a boundary held for it is its boot
            boots.append(r["hold_s"])  # (on a machine where the warm-up steps run faster than it starts)
            pause -= r["hold_s"]
        samples[label].append(pause)
        if r["spread_s"] is not None:
            spreads[label].append(r["spread_s"])
        prepared[label].append(bool(r.get("prepared")))
        if r.get("critical_s"):
            parts = dict(r["critical_s"])
            hold = r["hold_s"] if label == "addition" else 0.0  # left out of its pause (above), so out of its parts
            for part in ("last_step", "reach"):  # (the parts before the boundary was passed hold it)
                taken = min(parts[part], hold)
                parts[part], hold = parts[part] - taken, hold - taken
            critical[label].append({**parts, "joined": float(bool(r["critical_joined"]))})
    # one step's time: the median over epochs of their training time per step (pauses excluded)
    per_step = [e["train_s"] / (e["end_step"] - e["start_step"]) for e in result["epochs"]
                if e["train_s"] is not None and e["end_step"] > e["start_step"]]  # fmt: skip
    return {
        "samples": samples,
        "spreads": spreads,
        "critical": critical,
        "prepared": prepared,
        "boot_s": boots,
        "records": result["reconfigurations"],
        "wall_s": wall,
        "steps": steps,
        "step_s": statistics.median(per_step),
        "throughput": result["throughput"],
    }


def table(off: dict[str, float], on: dict[str, float], step_s: float, samples_on: dict[str, list[float]],
          prepared: dict[str, list[bool]], spread_on: dict[str, float]) -> str:  # fmt: skip
    """The table; `spread_on`: the median spread of the old members' last steps' ends, prepared (part of its pause)."""
    restart = off["checkpoint-restart"]
    lines = [f"{'kind':<20} {'off (median)':>12} {'on (median)':>12} {'on/off':>7} {'spread on':>10} "
             f"{'prepared':>9} {'restart/on':>10}  goal: on <= {step_s * 1e3:.0f} ms (a step) and <= off/10",
             "-" * 119]  # fmt: skip
    for kind in off:
        a, b = off[kind], on.get(kind, float("nan"))
        ratio = b / a if a > 0 else float("inf")
        n_prep = f"{sum(prepared.get(kind, []))}/{len(samples_on.get(kind, []))}"
        met = "" if kind in ("checkpoint-restart", "kill") else ("met" if b <= step_s and b <= a / 10 else "NOT met")
        spread = f"{spread_on[kind] * 1e3:>7.0f} ms" if kind in spread_on else f"{'-':>10}"
        lines.append(f"{kind:<20} {a * 1e3:>9.0f} ms {b * 1e3:>9.0f} ms {ratio:>7.2f} {spread} {n_prep:>9} "
                     f"{restart / b if b > 0 else float('inf'):>9.1f}x  {met}")  # fmt: skip
    return "\n".join(lines)


PARTS = ("last_step", "reach", "ahead", "hand_off", "groups", "install")


def breakdown(critical: dict[str, list[dict[str, float]]]) -> str:
    """Where the prepared pauses went: the median of each part of `critical_s` (`Coordinator.record`), split along
    the member ready last, and how often that member was a joiner."""
    lines = [f"{'kind':<20} " + " ".join(f"{p:>9}" for p in PARTS) + f" {'last: joiner':>13}", "-" * 94]
    for kind, rows in critical.items():
        if not rows or kind in ("checkpoint-restart", "kill"):
            continue
        cells = " ".join(f"{statistics.median(r[p] for r in rows) * 1e3:>6.1f} ms" for p in PARTS)
        lines.append(f"{kind:<20} {cells} {sum(r['joined'] for r in rows):>9.0f}/{len(rows)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small-gpt", help="tiny-gpt, small-gpt (default) or module:function "
                    "returning a parcae.TrainSpec")  # fmt: skip
    ap.add_argument("--model-args", default="{}", metavar="JSON", help="the model function's keyword arguments")
    ap.add_argument("--cycles", type=int, default=3, help="repetitions of each kind (default 3)")
    ap.add_argument("--kill", action="store_true", help="also measure a kill without notice, recovered live")
    ap.add_argument(
        "--start-method",
        default="spawn",
        choices=("spawn", "forkserver"),
        help="how worker processes start: spawn = cold, as a real restart (default); forkserver = warm",
    )
    ap.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda", "auto"),
        help="where the workers train (cuda: the GPUs, shared in turn by the 4 workers where fewer)",
    )
    ap.add_argument("--workers", type=int, default=4, choices=(2, 4),
                    help="the world: 4 (2x2, 1x2, 1x4; default) or 2 (2x1, 1x1, 1x2: a process per core on a "
                    "2-core machine, as each instance of a cluster has its own)")  # fmt: skip
    ap.add_argument("--json", metavar="OUT", help="write {'pause_s': {...}, 'prepared_pause_s': {...}, ...} here")
    a = ap.parse_args(argv)
    runs = {}
    for prepare in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            runs[prepare] = measure(a.model, a.cycles, a.kill, a.start_method, Path(tmp) / "job", prepare,
                                    json.loads(a.model_args), a.device, a.workers)  # fmt: skip
    off, on = runs[False], runs[True]
    pause = {k: statistics.median(v) for k, v in off["samples"].items() if v}
    prepared_pause = {k: statistics.median(v) for k, v in on["samples"].items() if v}
    step_s = statistics.median([off["step_s"], on["step_s"]])
    for prepare, m in runs.items():
        print(f"{a.model}, {a.workers} workers on {a.device}, start method {a.start_method}, "
              f"preparation {'on' if prepare else 'off'}: "
              f"{m['steps']} steps, {m['wall_s']:.1f} s wall, {m['throughput']['steps_per_s']:.2f} steps/s overall, "
              f"a step {m['step_s'] * 1e3:.0f} ms")  # fmt: skip
    spread = {k: statistics.median(v) for k, v in on["spreads"].items() if v}
    print(table(pause, prepared_pause, step_s, on["samples"], on["prepared"], spread))
    print("spread on: how far apart the old members finished their last step (median, prepared): the pause starts at "
          "the first, the new epoch needs the last")  # fmt: skip
    print()
    print("where the prepared pauses went (medians), along the member ready last:")
    print(breakdown(on["critical"]))
    print("last_step: until its last step ended (0 for a joiner); reach: until it passed the boundary (the store "
          "round trips after a step; 0 for a joiner already waiting); ahead: what came ahead (received, installed "
          "and stepped by its preparation's helper); hand_off: the boundary's transfers (a go where the gradients "
          "came ahead); groups: taking its groups; install: its layers, then the ready report")  # fmt: skip
    boots = [b for m in runs.values() for b in m["boot_s"] if b > 0]
    if boots:
        print(f"addition: the boundary held {len(boots)} time(s) for the added instance to finish starting "
              f"(max {max(boots):.1f} s), left out of its pause")  # fmt: skip
    goals = {k: prepared_pause[k] <= step_s and prepared_pause[k] <= pause[k] / 10
             for k in pause if k not in ("checkpoint-restart", "kill")}  # fmt: skip
    if a.json:
        out = {
            "pause_s": pause,
            "prepared_pause_s": prepared_pause,
            "step_s": step_s,
            "samples_s": {"off": off["samples"], "on": on["samples"]},
            "spread_s": {"off": off["spreads"], "on": on["spreads"]},
            "critical_s": {"off": off["critical"], "on": on["critical"]},
            "prepared": on["prepared"],
            "goals_met": goals,
            "model": a.model,
            "workers": a.workers,
            "start_method": a.start_method,
            "wall_s": {"off": off["wall_s"], "on": on["wall_s"]},
            "records": {"off": off["records"], "on": on["records"]},
        }
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
