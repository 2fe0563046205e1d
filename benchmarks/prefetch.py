"""A step's rows loaded while the step before trains (`TrainSpec.prefetch`) against loaded before each step.

The model (`spec` below) is what prefetching is for: its batch function decodes PNG images (Pillow, which releases
the GIL while it decodes), so loading a step's rows costs time of its own; with `prefetch` the next step's rows are
decoded in a helper thread while this one trains. For each world (`--workers`: 1 x 1 on one worker, D x 1 on D),
`--repeats` pairs of jobs alternate the two (drift on a shared machine hits both); each trains `--steps` steps and
its first epoch's span is measured (`Coordinator.epoch_spans`: last member ready to first member at the next
boundary). The table shows samples/s with prefetch off and on (medians), their ratio, the load time of one replica's
rows measured alone, and whether both trained the same losses (they must, bit for bit: the rows are the same).

A worker trains on one thread (`torch.set_num_threads(1)`), so with one worker on a 2-core machine the decoding has
a core of its own, as on a GPU machine the CPU decodes while the GPU computes; with as many workers as cores, the
helper threads share the cores with training and little is gained.

    python benchmarks/prefetch.py [--workers 1 --workers 2] [--steps 16] [--repeats 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import parcae  # noqa: E402

ROWS = 32  # the global batch


class PNGs(torch.utils.data.Dataset):
    """`n` seeded `size` x `size` RGB images, stored PNG-encoded and decoded on every read (what an image dataset
    on disk costs), with a label each."""

    def __init__(self, n: int = 256, size: int = 128, seed: int = 0) -> None:
        from PIL import Image

        rng = np.random.default_rng(seed)
        self.encoded = []
        for _ in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, format="PNG")
            self.encoded.append(buf.getvalue())
        self.labels = rng.integers(0, 10, n)

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        pixels = np.asarray(Image.open(io.BytesIO(self.encoded[i])).convert("RGB"), dtype=np.float32) / 255.0
        return torch.from_numpy(pixels).permute(2, 0, 1), torch.tensor(int(self.labels[i]))


def spec(prefetch: bool = True, channels: int = 16, size: int = 128) -> parcae.TrainSpec:
    """A patchify stem (4 x 4 patches) -> conv with pooling -> linear: a small image classifier over decoded PNGs,
    light enough that decoding its rows is a good part of a step (as on a GPU, which computes faster than a CPU
    decodes)."""
    return parcae.TrainSpec(
        layers=[
            parcae.Layer("stem", lambda: nn.Sequential(nn.Conv2d(3, channels, 4, stride=4), nn.ReLU())),
            parcae.Layer(
                "conv", lambda: nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4))
            ),
            parcae.Layer("head", lambda: nn.Sequential(nn.Flatten(), nn.Linear(channels * (size // 16) ** 2, 10))),
        ],
        batch=parcae.StepSampler(PNGs(size=size), ROWS, seed=0),
        loss=lambda logits, labels: F.cross_entropy(logits, labels, reduction="sum"),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        prefetch=prefetch,
    )


def run_one(prefetch: bool, workers: int, steps: int, out: Path) -> dict[str, Any]:
    from trainer import ControlPlaneConfig, JobConfig, Schedule, TrainConfig, check_job, model_config
    from trainer.control.run import run_job

    model = model_config(f"{Path(__file__).resolve()}:spec", prefetch=prefetch)
    job = JobConfig(out_dir=str(out), model=model, train=TrainConfig(steps=steps + 1),
                    control=ControlPlaneConfig(timeout_s=600))  # fmt: skip
    job = check_job(job, batch_given=False)
    events = [{"step": steps, "kind": "plan", "strategy": [1, 1]}] if workers > 1 else []
    result = run_job(job, Schedule(workers=workers, strategy=(workers, 1), events=events))
    first = result["epochs"][0]
    train_s = first["train_s"] if workers > 1 else result["throughput"]["train_s"]
    return {"samples_per_s": ROWS * steps / train_s, "loss": result["loss"][:steps]}


def load_ms(workers: int, repeats: int = 5) -> float:
    """One replica's rows of a step, decoded alone on this thread (median ms)."""
    from trainer.runtime.data import batch_rows, replica_rows

    sampler = spec().batch
    times = []
    for step in range(repeats):
        t0 = time.perf_counter()
        batch_rows(sampler, step, replica_rows(ROWS, 0, workers))
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, action="append", help="worlds to measure (default: 1 and 2)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for workers in a.workers or [1, 2]:
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for r in range(a.repeats):
            for prefetch in (False, True) if r % 2 == 0 else (True, False):
                with tempfile.TemporaryDirectory(prefix="prefetch-") as tmp:
                    runs[prefetch].append(run_one(prefetch, workers, a.steps, Path(tmp) / "job"))
        sps = {k: statistics.median(x["samples_per_s"] for x in v) for k, v in runs.items()}
        same = all(x["loss"] == runs[False][0]["loss"] for v in runs.values() for x in v)
        rows.append({"workers": workers, "off": sps[False], "on": sps[True], "ratio": sps[True] / sps[False],
                     "load_ms": load_ms(workers), "same_losses": same})  # fmt: skip
    print(f"{'world':<7} {'off samples/s':>13} {'on samples/s':>13} {'on/off':>7} {'load ms':>8}  same losses")
    for r in rows:
        print(f"{r['workers']}x1{'':<4} {r['off']:>13.1f} {r['on']:>13.1f} {r['ratio']:>7.2f} {r['load_ms']:>8.1f}  "
              f"{r['same_losses']}")  # fmt: skip
    print(f"samples/s: median of {a.repeats} jobs of {a.steps} steps each way, alternated; load ms: one replica's "
          "rows of a step decoded alone, on one thread")  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["same_losses"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
