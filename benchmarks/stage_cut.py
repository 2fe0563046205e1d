"""The stage cut by measured per-layer time against the cut by parameter count, side by side (issue 14, point 3).

A cut by parameter count balances memory, not time: where a model's parameters and its compute disagree, one
stage does most of the work and the pipeline runs at its pace. The default model (`spec` below) is such a model:
three convolutions over 32x32 images (few parameters, most of the time), then three linear layers (most of the
parameters, little time).

For each P (`--p`): the layer times are measured once (`trainer.observe.layer_times`, as `parcae profile` does);
then, `--repeats` times, one job per cut (the order alternating between repeats, so drift on a shared machine hits
both), each `--steps` steps at 1 x P ending with a plan to 1 x 1, so that its first epoch's span is measured
(`Coordinator.epoch_spans`: last member ready to first member at the next boundary; the steps, no start-up). The
table shows the cuts, ms per step (median over the repeats), their ratio, the ratio the layer times predict (the
slowest stage's summed time) and whether both cuts trained the same losses (D = 1: they must, bit for bit).

    python benchmarks/stage_cut.py [--model MODULE:FUNCTION|FILE.py:FUNCTION] [--model-args JSON] [--p 2 --p 3]
                                   [--steps 12] [--repeats 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import parcae  # noqa: E402

ROWS = 16  # the global batch


def spec(channels: int = 64, width: int = 512, image: int = 32) -> parcae.TrainSpec:
    """Conv x 3 (image x image, `channels` wide) -> pool -> linear x 3 (`width` wide): parameters and time apart."""

    def conv(c_in: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c_in, channels, 3, padding=1), nn.ReLU())

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(step)
        return torch.randn(ROWS, 3, image, image, generator=g), torch.randint(0, 10, (ROWS,), generator=g)

    flat = channels * (image // 8) ** 2
    return parcae.TrainSpec(
        layers=[
            parcae.Layer("conv1", lambda: conv(3)),
            parcae.Layer("conv2", lambda: conv(channels)),
            parcae.Layer("conv3", lambda: conv(channels)),
            parcae.Layer(
                "fc1", lambda: nn.Sequential(nn.MaxPool2d(8), nn.Flatten(), nn.Linear(flat, width), nn.ReLU())
            ),
            parcae.Layer("fc2", lambda: nn.Sequential(nn.Linear(width, width), nn.ReLU())),
            parcae.Layer("head", lambda: nn.Linear(width, 10)),
        ],
        batch=batch,
        loss=lambda logits, labels: F.cross_entropy(logits, labels, reduction="sum"),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
    )


def run_one(model: Any, train: Any, p: int, steps: int, out: Path) -> dict[str, Any]:
    from trainer import ControlPlaneConfig, JobConfig, Schedule
    from trainer.control.run import run_job

    job = JobConfig(out_dir=str(out), model=model, train=train, control=ControlPlaneConfig(timeout_s=600))
    events = [{"step": steps, "kind": "plan", "strategy": [1, 1]}]
    result = run_job(job, Schedule(workers=p, strategy=(1, p), events=events))
    first = result["epochs"][0]
    return {"ms_per_step": 1e3 * first["train_s"] / steps, "bounds": first["bounds"], "loss": result["loss"]}


def slowest(times: tuple[float, ...], bounds: list[int]) -> float:
    return max(sum(times[a:b]) for a, b in zip(bounds, bounds[1:]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=f"{Path(__file__).resolve()}:spec")
    ap.add_argument("--model-args", default="{}")
    ap.add_argument("--p", type=int, action="append")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    from trainer import TrainConfig, check_job, model_config
    from trainer.config import JobConfig
    from trainer.observe.layer_times import layer_times

    model = model_config(a.model, **json.loads(a.model_args))
    train = check_job(JobConfig(model=model, train=TrainConfig(steps=a.steps + 1)), batch_given=False).train
    times = layer_times(model, train)
    print("ms per layer (forward + backward of one micro-batch): " + ", ".join(f"{t:.2f}" for t in times))
    rows = []
    for p in a.p or [2, 3]:
        runs: dict[str, list[dict[str, Any]]] = {"params": [], "time": []}
        for r in range(a.repeats):
            order = ["params", "time"] if r % 2 == 0 else ["time", "params"]
            for cut in order:
                cfg = train if cut == "params" else TrainConfig(**{**vars(train), "stage_costs": times})
                with tempfile.TemporaryDirectory(prefix="stage-cut-") as tmp:
                    runs[cut].append(run_one(model, cfg, p, a.steps, Path(tmp) / "job"))
        ms = {cut: statistics.median(x["ms_per_step"] for x in v) for cut, v in runs.items()}
        bounds = {cut: v[0]["bounds"] for cut, v in runs.items()}
        same = all(x["loss"] == runs["params"][0]["loss"] for v in runs.values() for x in v)
        rows.append({"P": p, "bounds_params": bounds["params"], "bounds_time": bounds["time"],
                     "ms_params": ms["params"], "ms_time": ms["time"], "ratio": ms["params"] / ms["time"],
                     "predicted": slowest(times, bounds["params"]) / slowest(times, bounds["time"]),
                     "same_losses": same})  # fmt: skip
    head = f"{'P':>2}  {'cut by parameters':<18} {'cut by time':<18} {'ms/step':>8} {'ms/step':>8} {'ratio':>6} " \
           f"{'predicted':>9}  same losses"  # fmt: skip
    print(head)
    for r in rows:
        print(f"{r['P']:>2}  {str(r['bounds_params']):<18} {str(r['bounds_time']):<18} {r['ms_params']:>8.1f} "
              f"{r['ms_time']:>8.1f} {r['ratio']:>6.2f} {r['predicted']:>9.2f}  {r['same_losses']}")  # fmt: skip
    print(
        f"ms/step: median of {a.repeats} jobs of {a.steps} steps at 1 x P (cut by parameters, then by time); "
        "ratio: parameters / time"
    )
    if a.json:
        a.json.write_text(json.dumps({"layer_ms": list(times), "rows": rows}, indent=2))
    return 0 if all(r["same_losses"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
