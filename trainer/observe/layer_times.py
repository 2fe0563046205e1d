"""Per-layer compute time: what a stage cut balanced by measurement needs (a layer's parameter count says little
about its time: an embedding holds many parameters and does almost nothing, a vocabulary head few and much).

Owns: `layer_times` (forward + backward of one micro-batch through each layer, as a pipeline stage runs it, in
this process). Must not touch: the cut itself (`trainer.runtime.pipeline.partition`), the profile's format
(`trainer.observe.profile`), jobs (`trainer.control.measure` calls this before its job and records the result).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from trainer.config import ModelConfig, TrainConfig
from trainer.runtime.data import shard
from trainer.runtime.devices import resolve_device
from trainer.runtime.pipeline import differentiable, micro_loss
from trainer.runtime.spec_model import run_layer
from trainer.runtime.trainspec import leaves, load_spec, seeded_build, to_device


def layer_times(model: ModelConfig, train: TrainConfig, *, repeats: int = 5, threads: int = 1) -> tuple[float, ...]:
    """Milliseconds per layer (median of `repeats` after one warm-up) of the forward and backward of one micro-batch
    of step 0, on the job's device with `threads` CPU threads (a worker's: `trainer.runtime.worker` runs on one).

    Each layer runs as a one-layer stage would: its input detached and requiring grad, its backward driven by the
    gradient its successor produced (the last layer's by the loss), so no layer's time includes another's."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    spec = load_spec(model, train)
    device = resolve_device(train.device, 0)
    x, y = spec.batch(0)
    xm, ym = shard(x, y, 0, 1, train.micro_batch)[0]
    xm, ym = to_device(xm, device), to_device(ym, device)
    layers = [seeded_build(spec, model.seed, i, device) for i in range(len(spec.layers))]
    autocast = torch.autocast(device.type, dtype=getattr(torch, spec.autocast or "bfloat16"),
                              enabled=spec.autocast is not None)  # fmt: skip
    samples: list[list[float]] = [[] for _ in layers]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for round_ in range(repeats + 1):  # round 0 warms up (allocator, kernels, lazy init)
            spent = _one_pass(layers, xm, ym, spec, train.global_batch, device, autocast)
            if round_:
                for i, ms in enumerate(spent):
                    samples[i].append(ms)
    finally:
        torch.set_num_threads(before)
    return tuple(statistics.median(s) for s in samples)


def _one_pass(layers: list[torch.nn.Module], xm: Any, ym: Any, spec: Any, global_batch: int, device: torch.device,
              autocast: Any) -> list[float]:  # fmt: skip
    forward_ms, inputs, outputs = [], [], []
    act = xm
    for i, layer in enumerate(layers):
        inp = act if i == 0 else _detached(act)
        t0 = _now(device)
        with autocast:
            out = run_layer(layer, inp)
            if i == len(layers) - 1:
                out = spec.loss(out, ym)[0] if spec.normalizer == "count" else micro_loss(spec, out, ym, global_batch)
        forward_ms.append(_now(device) - t0)
        inputs.append(inp)
        outputs.append(out)
        act = out
    backward_ms = [0.0] * len(layers)
    for i in reversed(range(len(layers))):
        t0 = _now(device)
        if i == len(layers) - 1:
            outputs[i].backward()
        else:
            pairs = [(o, inp.grad) for o, inp in zip(differentiable(outputs[i]), differentiable(inputs[i + 1]))
                     if o.requires_grad and inp.grad is not None]  # fmt: skip
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        backward_ms[i] = _now(device) - t0
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return [f + b for f, b in zip(forward_ms, backward_ms)]


def _detached(act: Any) -> Any:
    out = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in leaves(act))
    return out if isinstance(act, tuple) else out[0]


def _now(device: torch.device) -> float:
    """Milliseconds on a monotonic clock, after the device has finished what was queued (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1e3
