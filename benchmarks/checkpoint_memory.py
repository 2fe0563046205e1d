"""The memory a checkpoint costs its reader: read into memory against mapped from the file, side by side.

Every checkpoint load (`trainer.runtime.checkpoint.load`: a worker's restore, the driver's final layers and resume
check, `parcae export`, the logged model in MLflow) maps its shards (`torch.load(mmap=True)`): the tensors' pages
come from the file as they are touched, and the page cache can drop them. Read instead, a shard's every tensor —
the optimiser state too, which the driver's model and `parcae export` never use — sits in the process's own
(anonymous) memory. That matters where the driver runs on a small machine and the model is large.

The benchmark trains a GPT of `--n-embd` x `--n-layer` (57 M parameters by default) for two steps on one worker
(its final layers: one shard of parameters and AdamW state), then runs each reader in a fresh process and samples its
anonymous memory (`RssAnon`, /proc/self/status) every 5 ms: the interpreter with torch, parcae and MLflow imported
(the floor), then `torch.load` of the shard, `parcae export` and the logged model's build and save (`trained_model`,
`mlflow.pytorch.save_model`), each as the code is (mapped) and with `torch.load`'s `mmap` dropped (read, as every
load was until 2026-12-06). Linux only.

    python benchmarks/checkpoint_memory.py [--n-embd 768] [--n-layer 8] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# run in a fresh interpreter: sample RssAnon from a thread, do the work, print the peak in MB
_SAMPLER = """
import sys, threading, time
sys.path.insert(0, {repo!r})
peak = [0]
def sample():
    while True:
        with open("/proc/self/status") as f:
            peak[0] = max(peak[0], *(int(l.split()[1]) for l in f if l.startswith("RssAnon:")))
        time.sleep(0.005)
threading.Thread(target=sample, daemon=True).start()
import torch, mlflow.pytorch, tempfile
from trainer.runtime.export import export_state_dict, trained_model, write_state_dict
time.sleep(0.05)
{work}
time.sleep(0.05)
print(peak[0] / 1024)
"""

READERS = {
    "torch.load of the shard": "data = torch.load({shard!r}, weights_only=True, mmap=True)",
    "parcae export": "write_state_dict(export_state_dict({layers!r}).state, {out!r})",
    "logged model": "m = trained_model(export_state_dict({layers!r}))\n"
    "with tempfile.TemporaryDirectory() as t: mlflow.pytorch.save_model(m, t + '/m', serialization_format='pickle')",
}
# the same work reading the shard, as every load did before 2026-12-06: torch.load without its mmap
_READ = "_load = torch.load\ntorch.load = lambda *a, mmap=None, **k: _load(*a, **k)\n"


def peak_mb(work: str) -> float:
    code = _SAMPLER.format(repo=str(REPO), work=work)
    env = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="parcae-ckpt-mem-") as tmp:
        out = Path(tmp) / "job"
        model_args = json.dumps({"n_embd": args.n_embd, "n_layer": args.n_layer, "n_head": 8})
        subprocess.run([sys.executable, "-m", "parcae.cli", "train", "--model", "tiny-gpt", "--model-args",
                        model_args, "--workers", "1", "--steps", "2", "--global-batch", "4", "--checkpoint-every",
                        "0", "--out-dir", str(out)], cwd=REPO, check=True, capture_output=True)  # fmt: skip
        (shard,) = sorted((out / "layers").glob("*.pt"))
        size = shard.stat().st_size / 1e6
        fields = {"shard": str(shard), "layers": str(out / "layers"), "out": str(Path(tmp) / "model.pt")}
        floor = peak_mb("pass")
        peaks = {name: (peak_mb(_READ + work.format(**fields)), peak_mb(work.format(**fields)))
                 for name, work in READERS.items()}  # fmt: skip
    print(
        f"tiny-gpt {args.n_embd} x {args.n_layer}: final layers in one shard of {size:.0f} MB (parameters and "
        f"AdamW state); peak anonymous memory (RssAnon) above the {floor:.0f} MB of the imports alone"
    )
    print(f"{'reader':<26}{'read':>10}{'mapped':>10}{'read / mapped':>15}")
    for name, (read, mapped) in peaks.items():
        r, m = read - floor, mapped - floor
        print(f"{name:<26}{r:>7.0f} MB{m:>7.0f} MB{(read / mapped):>14.1f}x")
    print("(the ratio is of the whole peaks, the imports included)")
    if args.json:
        rows = {name: {"read_mb": r, "mapped_mb": m} for name, (r, m) in peaks.items()}
        args.json.write_text(json.dumps({"shard_mb": size, "floor_mb": floor, "peak_rss_anon_mb": rows}, indent=2))


if __name__ == "__main__":
    main()
