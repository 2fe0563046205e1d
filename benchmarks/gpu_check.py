"""The GPU check: train the built-in GPT, the Llama-shaped spec and the digits CNN (with a fused AdamW, and under
float16 autocast with its loss scale) on CUDA under every migration kind, beside the same steps on the CPU, and print
one table.

For each model: one job on `--workers` local worker processes (default: as many as there are GPUs, at least 4, so
that with one GPU several workers share it through staged gloo) with `--device cuda`, making an intra-stage,
an inter-stage and a pipeline migration, a preemption with notice, a kill without notice and a checkpoint-restart;
then the same job with `--device cpu`. The table shows samples/s per strategy (steps / train_s of its epochs), the
pause per migration kind, and the largest relative difference of the GPU run's loss curve from the CPU run's. First,
on CUDA, the staging copy before a gloo send: pageable against page-locked memory, side by side.

Not a test: on a machine without CUDA it says so and exits 0 (or give `--device cpu` to check the script itself).

    python benchmarks/gpu_check.py [--device cuda|cpu] [--workers N] [--steps 24]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trainer import (  # noqa: E402
    CheckpointConfig,
    ControlPlaneConfig,
    JobConfig,
    ProviderConfig,
    Schedule,
    TrainConfig,
    check_job,
    host_copy,
    model_config,
    run_job,
)

#: intra-stage at 3, inter-stage under notice at 6, pipeline at 9 and 12, a kill at 15, a checkpoint-restart at 18
EVENTS = [
    {"step": 3, "kind": "plan", "strategy": [1, 2]},
    {"step": 6, "kind": "preempt", "instances": [1], "notice": True},
    {"step": 6, "kind": "add", "workers": 1},
    {"step": 6, "kind": "plan", "strategy": [2, 2]},
    {"step": 9, "kind": "plan", "strategy": [1, 3]},
    {"step": 12, "kind": "plan", "strategy": [2, 2]},
    {"step": 15, "kind": "kill", "instances": [0]},
    {"step": 18, "kind": "checkpoint-restart", "strategy": [1, 2]},
]
#: the built-in GPT, the Llama-shaped spec, a user's spec with torch's fused AdamW (its `step` lives on the GPU), and
#: the same under float16 autocast
DIGITS = f"{Path(__file__).resolve().parents[1] / 'examples' / 'digits_cnn.py'}:spec"
MODELS: list[tuple[str, dict[str, Any]]] = [
    ("tiny-gpt", {}),
    ("tiny-llama", {}),
    (DIGITS, {"fused": True, "batch_size": 16}),
    (DIGITS, {"autocast": "float16", "batch_size": 16}),  # as on a V100: the loss scale moved through every kind
]


def job(model: str, args: dict[str, Any], device: str, workers: int, steps: int, out: Path) -> dict[str, Any]:
    config = JobConfig(out_dir=str(out), model=model_config(model, **args),
                       train=TrainConfig(steps=steps, global_batch=16, device=device),
                       checkpoint=CheckpointConfig(every=0), control=ControlPlaneConfig(timeout_s=280),
                       provider=ProviderConfig(start_method="forkserver", max_processes=workers + 1))  # fmt: skip
    config = check_job(config, batch_given=True)
    t0 = time.monotonic()
    result = run_job(config, Schedule(workers=workers, strategy=(2, 2), events=list(EVENTS)))
    result["wall_s"] = time.monotonic() - t0
    return result


def rows(model: str, gpu: dict[str, Any], cpu: dict[str, Any]) -> list[str]:
    per_strategy: dict[str, list[float]] = defaultdict(list)
    for span in gpu["epochs"]:
        if span.get("train_s"):
            steps = span["end_step"] - span["start_step"]
            d, p = span["strategy"]
            per_strategy[f"{d}x{p}"].append(16 * steps / span["train_s"])
    pauses: dict[str, list[float]] = defaultdict(list)
    for r in gpu["reconfigurations"]:
        pauses[r["kind"] if r["notice"] else f"{r['kind']} (kill)"].append(r["pause_s"])
    diff = max(abs(a - b) / abs(b) for a, b in zip(gpu["loss"], cpu["loss"], strict=True))
    out = [
        f"{model}: {gpu['wall_s']:.0f} s (CPU run {cpu['wall_s']:.0f} s); loss curve vs CPU: max rel diff {diff:.1e}"
    ]
    out += [
        f"  {s:<6} {statistics.median(v):10.1f} samples/s ({len(v)} epochs)" for s, v in sorted(per_strategy.items())
    ]
    out += [f"  pause  {k:<28} {1000 * statistics.median(v):8.0f} ms ({len(v)})" for k, v in sorted(pauses.items())]
    return out


def staging(sizes_mib: tuple[int, ...] = (1, 16, 128), repeats: int = 10) -> list[str]:
    """The copy a GPU worker makes before gloo sends a tensor: into pageable memory (`.to("cpu")`, as before
    2026-12-05) against `host_copy` (page-locked up to 256 MiB), medians of `repeats`, side by side."""
    out = ["staging GPU -> host (medians): size, pageable ms, pinned ms, pageable / pinned"]
    for mib in sizes_mib:
        t = torch.randn(mib << 18, device="cuda")  # float32: 4 bytes each
        expected = t.cpu()
        times: dict[str, list[float]] = {"pageable": [], "pinned": []}
        for _ in range(repeats):
            for name in ("pageable", "pinned"):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                staged = t.to("cpu") if name == "pageable" else host_copy(t)
                times[name].append(1000 * (time.perf_counter() - t0))
                assert torch.equal(staged, expected)
        a, b = statistics.median(times["pageable"]), statistics.median(times["pinned"])
        out.append(f"  {mib:4d} MiB {a:10.2f} {b:10.2f} {a / b:8.2f}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="the device checked (default cuda)")
    ap.add_argument("--workers", type=int, help="worker processes (default: the GPUs, at least 4)")
    ap.add_argument("--steps", type=int, default=24, help="steps per job (default 24; the events need 20)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this machine (torch.cuda.is_available() is False): nothing checked")
        return 0
    gpus = torch.cuda.device_count() if a.device == "cuda" else 0
    workers = a.workers or max(4, gpus)
    print(f"gpu_check: {a.device} ({gpus} GPU(s): {[torch.cuda.get_device_name(i) for i in range(gpus)]}), "
          f"{workers} workers, {a.steps} steps, torch {torch.__version__}")  # fmt: skip
    if a.device == "cuda":
        print("\n".join(staging()))
    for model, args in MODELS:
        if model == "tiny-llama" and importlib.util.find_spec("transformers") is None:
            print(f"{model}: skipped (pip install 'parcae[hf]')")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            gpu = job(model, args, a.device, workers, a.steps, Path(tmp) / "gpu")
            cpu = job(model, args, "cpu", workers, a.steps, Path(tmp) / "cpu")
        print("\n".join(rows(model + (f" {args}" if args else ""), gpu, cpu)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
