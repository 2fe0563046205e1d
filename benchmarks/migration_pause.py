"""Training pause of each live-migration kind versus a checkpoint-restart, measured in one job.

One job, one model and one world (small-gpt by default, 4 local worker processes, float32): it starts as 2x2 and
cycles through the reconfigurations below, each at a step boundary chosen in advance (a perfect forecast):

    2x2 -> 1x2   intra-stage    the spare replicas stand by; nothing moves, only groups are rebuilt
    1x2 -> 2x2   inter-stage    the standby instances rejoin as replicas and fetch their stage's layers
    2x2 -> 1x4   pipeline       the layers are re-cut into 4 stages; each worker fetches what it lacks
    1x4 -> 2x2   pipeline       and back
    2x2 -> 2x2   checkpoint-restart, what torchrun does: every worker writes its stage's checkpoint shard at the
                 boundary, every worker process exits, fresh processes start (cold: `spawn`, import torch), join,
                 load the checkpoint and form their groups

The pause of a reconfiguration is the coordinator's `pause_s`: from the first old member finishing its last step
to the last new member being ready for its first step (`trainer.control.coordinator.Coordinator.records`). Each kind is
repeated `--cycles` times; the table shows medians and the ratio checkpoint-restart / kind. Goals: intra-stage
<= 1 s and >= 10x faster than checkpoint-restart; inter-stage and pipeline >= 3x faster.

With `--kill`, a last cycle adds a preemption without notice: a replica is SIGKILLed mid-step, the survivors detect
it through the heartbeat (timeout 1 s), abandon the step and regroup live (reported apart, "kill-recovery").

    python benchmarks/migration_pause.py [--model small-gpt|MODULE:FUNCTION] [--model-args JSON] [--cycles 3]
                                         [--kill] [--json OUT.json]
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

KINDS = ("intra-stage", "inter-stage", "pipeline", "checkpoint-restart")
GAP = 3  # steps between reconfigurations: lets every worker reach steady state (and the pause end be visible)


def schedule(cycles: int, kill: bool, warmup: int = 3) -> tuple[list[dict], int]:
    """The events and the job length."""
    events, s = [], warmup
    for _ in range(cycles):
        events += [
            {"step": s, "kind": "plan", "strategy": [1, 2]},
            {"step": s + GAP, "kind": "plan", "strategy": [2, 2]},
            {"step": s + 2 * GAP, "kind": "plan", "strategy": [1, 4]},
            {"step": s + 3 * GAP, "kind": "plan", "strategy": [2, 2]},
            {"step": s + 4 * GAP, "kind": "checkpoint-restart", "strategy": [2, 2]},
        ]
        s += 5 * GAP
    if kill:
        events.append({"step": s, "kind": "kill", "instances": [3]})
        s += GAP
    return events, s + GAP


def measure(model: str, cycles: int, kill: bool, start_method: str, out: Path,
            model_args: dict | None = None) -> dict:  # fmt: skip
    events, steps = schedule(cycles, kill)
    t0 = time.monotonic()
    job = JobConfig(out_dir=str(out), model=model_config(model, **(model_args or {})), train=TrainConfig(steps=steps),
                    checkpoint=CheckpointConfig(every=0), control=ControlPlaneConfig(timeout_s=900, pg_timeout_s=60),
                    provider=ProviderConfig(start_method=start_method))  # fmt: skip
    job = check_job(job, batch_given=False)  # a spec's own rows per step
    result = run_job(job, Schedule(workers=4, strategy=(2, 2), events=events))
    wall = time.monotonic() - t0
    samples: dict[str, list[float]] = {k: [] for k in (*KINDS, "kill-recovery")}
    for r in result["reconfigurations"]:
        kind = r["kind"] if r["notice"] else "kill-recovery"
        samples[kind].append(r["pause_s"])
    return {
        "samples": samples,
        "records": result["reconfigurations"],
        "wall_s": wall,
        "steps": steps,
        "throughput": result["throughput"],
    }


def table(pause: dict[str, float], samples: dict[str, list[float]]) -> str:
    restart = pause["checkpoint-restart"]
    goals = {"intra-stage": ">= 10x, <= 1 s", "inter-stage": ">= 3x", "pipeline": ">= 3x", "checkpoint-restart": ""}
    lines = [f"{'kind':<20} {'pause (median)':>14} {'n':>3} {'min':>8} {'max':>8} {'restart / kind':>15}  goal",
             "-" * 84]  # fmt: skip
    for kind, p in pause.items():
        xs = samples[kind]
        ratio = restart / p if p > 0 else float("inf")
        lines.append(f"{kind:<20} {p * 1e3:>11.0f} ms {len(xs):>3} {min(xs) * 1e3:>6.0f}ms {max(xs) * 1e3:>6.0f}ms "
                     f"{ratio:>14.1f}x  {goals.get(kind, '')}")  # fmt: skip
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
    ap.add_argument("--json", metavar="OUT", help="write {'pause_s': {...}, ...} here")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        m = measure(a.model, a.cycles, a.kill, a.start_method, Path(tmp) / "job", json.loads(a.model_args))
    samples = m["samples"]
    pause = {k: statistics.median(samples[k]) for k in KINDS}
    extra = {k: statistics.median(v) for k, v in samples.items() if k not in KINDS and v}
    print(f"{a.model}, 4 workers, start method {a.start_method}: {m['steps']} steps, {m['wall_s']:.1f} s wall, "
          f"{m['throughput']['steps_per_s']:.2f} steps/s overall")  # fmt: skip
    print(table({**pause, **extra}, samples))
    restart = pause["checkpoint-restart"]
    checks = {
        "intra-stage <= 1 s": pause["intra-stage"] <= 1.0,
        "intra-stage >= 10x faster than checkpoint-restart": restart >= 10 * pause["intra-stage"],
        "inter-stage >= 3x faster": restart >= 3 * pause["inter-stage"],
        "pipeline >= 3x faster": restart >= 3 * pause["pipeline"],
    }
    for name, ok in checks.items():
        print(f"  [{'met' if ok else 'NOT met'}] {name}")
    if a.json:
        out = {
            "pause_s": pause,
            "extra_pause_s": extra,
            "ratio_to_checkpoint_restart": {k: restart / v for k, v in pause.items()},
            "samples_s": samples,
            "goals_met": checks,
            "model": a.model,
            "workers": 4,
            "start_method": a.start_method,
            "wall_s": m["wall_s"],
            "records": m["records"],
        }
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
