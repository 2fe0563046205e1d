"""Chaos benchmark: one job through a seeded random schedule of `--events` events (200 by default), and whether it
still ends with the parameters of one uninterrupted process.

The schedule is `trainer.control.schedules.chaos_schedule(workers, steps, n_events, seed)`: plans (a new D x P),
preemptions with notice, kills without notice (SIGKILL mid-step; the survivors detect it through the heartbeat, abandon
the step and regroup live, or — at most once — restart from the latest checkpoint when a layer lost its last holder) and
added instances, at most two per step and at most `--max-workers` instances alive at once. Events of the same step
form one reconfiguration. If `--steps` is not given, the job length starts at about `events / 1.6` steps and grows
until `chaos_schedule` can place every event (it raises a ValueError when the steps are too few).

The model is tiny-gpt in float64, as in the equivalence tests (tests/test_trainer_faults.py): a reconfiguration
changes D, and so the order in which gradients are summed; float64 keeps those differences at ~1e-12 where float32
Adam would amplify them. `--model module:function` (with `--model-args`) puts a user's spec through the same chaos
(e.g. `tests/_fp16_model.py`, whose float16 loss scale must move with its layers through every event).
The reference is one uninterrupted process training the same seed for the same steps
(`trainer.runtime.pipeline.train_step` on a 1 x 1 context, one torch thread as the workers). Reported: whether the job's
`final_checksum` (sha256 of every parameter) equals the reference's — bit-exact equality only holds if every step
summed in the same order — and the largest relative difference of parameters and of the loss curve, with the
verdict of the tests' tolerance (rtol 1e-5, atol 1e-9).

Printed: events by kind, reconfigurations by kind ("(kill)": without notice), the median and p90 pause of each
(the coordinator's `pause_s`), steps lost (recomputed after a checkpoint-restart), the equivalence (for a spec that
scales its loss, also whether every step's scale and skip equal the uninterrupted run's; for a spec that validates,
whether every held-out loss does), and wall time.
Workers start with "forkserver" by default (a warm pool, as the chaos tests: ~0.1 s instead of ~2.5 s of CPU per
added or restarted process); `--start-method spawn` makes every start cold.

    python benchmarks/chaos.py [--events 200] [--workers 4] [--seed 0] [--steps N] [--json OUT.json]
                               [--model MODULE:FUNCTION] [--model-args JSON]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from trainer import (  # noqa: E402  # noqa: E402  # noqa: E402
    START_METHODS,  # noqa: E402
    CheckpointConfig,
    ControlPlaneConfig,
    JobConfig,
    JobObserver,
    ModelConfig,
    Patience,
    ProviderConfig,
    Schedule,  # noqa: E402
    StageLayout,
    StepInfo,
    TrainConfig,
    build_context,
    chaos_schedule,  # noqa: E402
    check_job,
    checkpoint,  # noqa: E402
    layer_names,  # noqa: E402
    model_config,
    parameters_checksum,
    run_job,  # noqa: E402
    spec_of,
    train_step,
    validate,
)

RTOL, ATOL = 1e-5, 1e-9  # the equivalence tests' tolerance


def place(workers: int, n_events: int, seed: int, steps: int | None, max_workers: int, model: ModelConfig,
          train: TrainConfig) -> tuple[Schedule, int]:  # fmt: skip
    """The schedule and the job length: `steps` if given, else the first length (from ~n_events / 1.6, growing by
    ~15 %) on which every event can be placed."""
    if steps is not None:
        return chaos_schedule(workers, steps, n_events, seed, model=model, train=train, max_workers=max_workers), steps
    s = max(8, math.ceil(n_events / 1.6) + 3)
    for _ in range(20):
        try:
            return chaos_schedule(workers, s, n_events, seed, model=model, train=train, max_workers=max_workers), s
        except ValueError:
            s = math.ceil(s * 1.15) + 1
    raise SystemExit(f"could not place {n_events} events in up to {s} steps; give --steps")


def reference(
    model: ModelConfig, train: TrainConfig, steps: int
) -> tuple[list[float], dict[str, Any], list[Any], list[tuple[int, dict[str, float]]]]:
    """One uninterrupted process, one torch thread: its loss curve, final layer states, for a spec that scales its
    loss (float16), each step's (scale after it, skipped), and for a spec that validates, (boundary, held-out loss)
    of each boundary it scores — up to the boundary where its monitored held-out score stops it, for a spec with a
    patience."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ctx = build_context(model, train, StageLayout.even(1, 1, model))
        held_out = ctx.spec.validation
        losses, scales, vals = [], [], []
        count = Patience()
        for s in range(steps + 1):
            if held_out is not None and held_out.due(s, steps):
                vals.append((s, validate(ctx, held_out)))
                if held_out.patience is not None:
                    count = count.after(s, held_out.score(vals[-1][1]), held_out.patience, held_out.min_delta)
            if s == steps or count.stop_at == s:
                break
            losses.append(train_step(ctx, s))
            scales.append(None if ctx.scaled is None else (ctx.scaled.value, ctx.scaled.skipped))
        return losses, ctx.layer_states(), scales, vals
    finally:
        torch.set_num_threads(old)


class Scales(JobObserver):
    """Each step's loss scale and skip, as the driver reports it (a float16 job's)."""

    def __init__(self) -> None:
        self.seen: dict[int, Any] = {}

    def on_step(self, step: StepInfo) -> None:
        self.seen[step.step] = None if step.loss_scale is None else (step.loss_scale, step.skipped)


def compare(result: dict[str, Any], model: ModelConfig, train: TrainConfig, steps: int,
            seen: dict[int, Any]) -> dict[str, Any]:  # fmt: skip
    ref_loss, ref_layers, ref_scales, ref_vals = reference(model, train, steps)
    end = len(ref_loss)  # (sooner than steps where the held-out loss stopped the uninterrupted run)
    stopped = result.get("stopped_early", {}).get("step", steps)
    final = checkpoint.load(checkpoint.find_shards(result["layers"], stopped), config=model, job="job")
    worst, close = 0.0, True
    for name, want in ref_layers.items():
        for key, w in want.items():
            if not key.startswith("param/"):
                continue
            got = final.layers[name][key]
            worst = max(worst, float(((got - w).abs() / w.abs().clamp_min(ATOL)).max()))
            close = close and torch.allclose(got, w, rtol=RTOL, atol=ATOL)
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(result["loss"], ref_loss, strict=True))
    got_vals = [(v["step"], {"loss": v["loss"], **v.get("metrics", {})}) for v in result.get("validation", [])]
    same_points = [(s, sorted(v)) for s, v in got_vals] == [(s, sorted(v)) for s, v in ref_vals]
    val_diff = max((abs(a[1][k] - b[1][k]) / max(abs(b[1][k]), ATOL) for a, b in zip(got_vals, ref_vals, strict=False)
                    for k in b[1] if k in a[1]), default=0.0)  # fmt: skip
    ref_checksum = parameters_checksum(ref_layers, layer_names(model))
    # the best checkpoint: the job's, and the one the uninterrupted run's scores pick among the same checkpoints
    ranked = spec_of(model, train).validation
    kept = set(checkpoint.checkpoint_steps(Path(result["layers"]).parent / "checkpoints"))
    ref_scored = {s: ranked.score(v) for s, v in ref_vals if s in kept} if ranked is not None else {}
    ref_best = min(ref_scored, key=lambda s: (ref_scored[s], s)) if ref_scored else None
    best = (result.get("best_checkpoint") or {}).get("step")
    same_run = close and loss_diff <= RTOL and same_points and val_diff <= RTOL
    same_run = same_run and stopped == end and best == ref_best
    return {
        "checksum": result["final_checksum"],
        "reference_checksum": ref_checksum,
        "checksum_equal": result["final_checksum"] == ref_checksum,
        "params_max_rel_diff": worst,
        "loss_max_rel_diff": loss_diff,
        "within_tolerance": same_run,
        # a spec with a patience: where the job and the uninterrupted run ended (the same boundary?)
        "ended_at": stopped,
        "reference_ended_at": end,
        # a spec that validates: the boundaries and scores (loss, metrics) scored — the same as the uninterrupted
        # run's? — and the held-out scores' largest relative difference
        "validations": len(got_vals),
        "validation_points_equal": same_points,
        "validation_max_rel_diff": val_diff,
        # ... and its best checkpoint (by the validation's monitor), beside the uninterrupted run's pick
        "best_checkpoint": best,
        "reference_best_checkpoint": ref_best,
        # float16: the steps whose loss scale or skip differ from the uninterrupted run's, and the steps it skipped
        "scale_differs_at": [s for s in range(end) if seen.get(s) != ref_scales[s]],
        "skipped_steps": sum(1 for x in ref_scales if x is not None and x[1]),
        "scaled": ref_scales[0] is not None,
    }


def label(record: dict[str, Any]) -> str:
    return record["kind"] if record["notice"] else f"{record['kind']} (kill)"


def pauses(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Pause statistics per kind, over the reconfigurations that completed; an epoch that broke before any member
    was ready (a migration rolled back by a death during its hand-off) has no pause and is counted apart."""
    by: dict[str, list[float]] = {}
    for r in records:
        if r["pause_s"] is not None:
            by.setdefault(label(r), []).append(r["pause_s"])
    return {k: {"n": len(v), "median_s": statistics.median(v), "p90_s": float(np.percentile(v, 90)),
                "max_s": max(v)} for k, v in sorted(by.items())}  # fmt: skip


def report(a: argparse.Namespace, sched: Schedule, steps: int, result: dict[str, Any], eq: dict[str, Any],
           wall: float) -> dict[str, Any]:  # fmt: skip
    recs = result["reconfigurations"]
    return {
        "model": a.model or "tiny-gpt float64", "model_args": json.loads(a.model_args),
        "events": a.events, "workers": a.workers, "seed": a.seed, "steps": steps, "max_workers": a.max_workers,
        "start_method": a.start_method, "initial_strategy": list(sched.strategy),
        "events_by_kind": dict(sorted(sched.counts().items())),
        "reconfigurations": len(recs),
        "reconfigurations_by_kind": dict(sorted(Counter(label(r) for r in recs).items())),
        "pause_by_kind": pauses(recs),
        "rolled_back": sum(r["pause_s"] is None for r in recs),
        "detect_s_median": statistics.median(d) if (d := [r["detect_s"] for r in recs if r.get("detect_s")]) else None,
        "steps_lost": sum(r["steps_lost"] for r in recs),
        "processes": len(result["exit_codes"]),
        "exit_codes": dict(sorted(Counter(str(c) for c in result["exit_codes"].values()).items())),
        "throughput": result["throughput"],
        "equivalence": eq,
        "wall_s": wall,
        "records": recs,
    }  # fmt: skip


def print_report(r: dict[str, Any]) -> None:
    args = f" {json.dumps(r['model_args'])}" if r["model_args"] else ""
    print(f"chaos job: {r['model']}{args}, {r['events']} events (seed {r['seed']}) over {r['steps']} steps, "
          f"{r['workers']} initial workers on {r['initial_strategy'][0]}x{r['initial_strategy'][1]}, at most "
          f"{r['max_workers']} alive, {r['processes']} worker processes ({r['start_method']})")  # fmt: skip
    print(f"wall time: {r['wall_s']:.1f} s in all: placing the schedule {r['schedule_s']:.1f} s, the job "
          f"{r['job_wall_s']:.1f} s, the uninterrupted reference and the comparison "
          f"{r['wall_s'] - r['schedule_s'] - r['job_wall_s']:.1f} s")  # fmt: skip
    print("events by kind:   " + ", ".join(f"{k} {n}" for k, n in r["events_by_kind"].items()))
    print(f"reconfigurations: {r['reconfigurations']}")
    print(f"{'kind':<28} {'n':>4} {'median pause':>13} {'p90 pause':>10} {'max':>8}")
    print("-" * 67)
    for k, p in r["pause_by_kind"].items():
        print(f"{k:<28} {p['n']:>4} {p['median_s'] * 1e3:>10.0f} ms {p['p90_s'] * 1e3:>7.0f} ms "
              f"{p['max_s'] * 1e3:>5.0f} ms")  # fmt: skip
    if r["detect_s_median"] is not None:
        print(f"kill detection (median): {r['detect_s_median'] * 1e3:.0f} ms")
    eq = r["equivalence"]
    print(f"steps lost (recomputed): {r['steps_lost']}")
    print(f"reconfigurations rolled back (a death during the hand-off): {r['rolled_back']}")
    print(f"final checksum {eq['checksum'][:16]} vs uninterrupted run {eq['reference_checksum'][:16]}: "
          f"{'equal' if eq['checksum_equal'] else 'not bit-identical'}; parameters max rel diff "
          f"{eq['params_max_rel_diff']:.1e}, loss max rel diff {eq['loss_max_rel_diff']:.1e} -> "
          f"{'same run' if eq['within_tolerance'] else 'DIFFERENT run'} (rtol {RTOL:g}, atol {ATOL:g})")  # fmt: skip
    if eq["validations"] or not eq["validation_points_equal"]:
        points = "the same boundaries" if eq["validation_points_equal"] else "OTHER boundaries"
        print(f"validation: {eq['validations']} held-out scores (loss, metrics) at {points} as the uninterrupted "
              f"run's, max rel diff {eq['validation_max_rel_diff']:.1e}")  # fmt: skip
    if eq["ended_at"] != r["steps"] or eq["reference_ended_at"] != r["steps"]:  # (a spec with a patience)
        same = "the same boundary" if eq["ended_at"] == eq["reference_ended_at"] else "ANOTHER boundary"
        print(f"stopped early at step {eq['ended_at']} (held-out score; the uninterrupted run at "
              f"{eq['reference_ended_at']}: {same})")  # fmt: skip
    if eq["best_checkpoint"] is not None or eq["reference_best_checkpoint"] is not None:
        same = "the same" if eq["best_checkpoint"] == eq["reference_best_checkpoint"] else "ANOTHER"
        print(f"best checkpoint: step {eq['best_checkpoint']} (the uninterrupted run's scores pick step "
              f"{eq['reference_best_checkpoint']} among the same checkpoints: {same})")  # fmt: skip
    if eq["scaled"]:
        differs = eq["scale_differs_at"]
        same = "every step as the uninterrupted run" if not differs else f"differs at steps {differs[:8]}"
        print(f"loss scale: {same} ({eq['skipped_steps']} steps skipped for an overflow)")
    thr = r["throughput"]
    print(f"exit codes {r['exit_codes']}; {thr['steps_per_s']:.2f} steps/s overall")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200, help="events in the schedule (default 200)")
    ap.add_argument("--workers", type=int, default=4, help="initial worker processes (default 4)")
    ap.add_argument("--max-workers", type=int, default=5, help="most instances alive at once (default 5)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the schedule, the model and the data (default 0)")
    ap.add_argument("--steps", type=int, help="job length (default: the shortest that fits the events)")
    ap.add_argument("--checkpoint-every", type=int, default=10, help="periodic checkpoint period (default 10)")
    ap.add_argument("--start-method", default="forkserver", choices=START_METHODS,
                    help="how worker processes start (default forkserver: warm; spawn: cold)")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=3600.0, help="job timeout in seconds (default 3600)")
    ap.add_argument("--json", metavar="OUT", help="write the summary and every reconfiguration record here")
    ap.add_argument("--model", help="a spec (module:function) instead of tiny-gpt in float64")
    ap.add_argument("--model-args", default="{}", metavar="JSON", help="the spec function's keyword arguments")
    a = ap.parse_args(argv)
    if a.events < 1 or a.workers < 1 or a.max_workers < a.workers:
        ap.error("need --events >= 1, --workers >= 1 and --max-workers >= --workers")
    if a.model is None:
        model = model_config("tiny-gpt", dtype="float64", seed=a.seed)
        rows = TrainConfig().global_batch
    else:
        model = model_config(a.model, seed=a.seed, **json.loads(a.model_args))
        spec_job = check_job(JobConfig(out_dir=".", model=model), batch_given=False)  # the spec's own rows per step
        rows = spec_job.train.global_batch
    t0 = time.monotonic()
    try:
        probe = TrainConfig(seed=a.seed, global_batch=rows)
        sched, steps = place(a.workers, a.events, a.seed, a.steps, a.max_workers, model, probe)
    except ValueError as e:
        ap.error(str(e))
    train = TrainConfig(seed=a.seed, steps=steps, global_batch=rows)
    place_s = time.monotonic() - t0
    print(f"placed {a.events} events in {steps} steps ({place_s:.1f} s); running the job ...", file=sys.stderr,
          flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        job = JobConfig(out_dir=str(Path(tmp) / "job"), model=model, train=dataclasses.replace(train, steps=steps),
                        checkpoint=CheckpointConfig(every=a.checkpoint_every),
                        control=ControlPlaneConfig(timeout_s=a.timeout),
                        provider=ProviderConfig(start_method=a.start_method))  # fmt: skip
        scales = Scales()
        result = run_job(job, sched, observer=scales)
        eq = compare(result, model, train, steps, scales.seen)
        wall = time.monotonic() - t0
    r = report(a, sched, steps, result, eq, wall)
    r["schedule_s"], r["job_wall_s"] = place_s, result["wall_s"]
    print_report(r)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
