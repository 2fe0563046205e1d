"""A warm start: a spec whose layers begin from trained parameters (another job's) instead of their seeded init.

Owns: `warm_start` (a `TrainSpec` whose layer factories load their parameters and persistent buffers from a state dict
keyed ``"<layer name>.<key>"`` — what `parcae export` writes, ``.pt`` or ``.safetensors`` — or from a folder of
parcae checkpoints, its newest intact one) and the check of that source against the spec. Must not touch: optimiser
state (a warm start begins with fresh optimisers, as fine-tuning does), processes, the store.

Why a change to the spec and not a job setting: a layer's initial weights are its factory's, in whichever process
builds it, at the job's start and at a restart from nothing alike; a factory that loads them keeps that one rule, and
the job's identity (the spec's arguments, e.g. ``--model-args '{"init": "model.pt"}'``) names the source.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn

from trainer.runtime.checkpoint import CheckpointError
from trainer.runtime.export import export_state_dict, exported_state
from trainer.runtime.trainspec import SpecError, TrainSpec

_FIX = "give the state dict `parcae export` wrote for a job of this spec (or its checkpoint folder)"


def warm_start(spec: TrainSpec, source: str | os.PathLike[str], *, strict: bool = True) -> TrainSpec:
    """`spec` with each layer's initial parameters and persistent buffers taken from `source`: a ``.pt`` or
    ``.safetensors`` state dict keyed ``"<layer name>.<key>"`` (`parcae export`), or a folder of parcae checkpoints
    (its newest intact one). Checked here, against the layers built on the meta device: every tensor of the source
    must be of its layer's shape and dtype; with `strict` (as torch's `load_state_dict`), every tensor of the spec's
    layers must be in the source and every one of the source in a layer; `strict=False` lets what the source lacks (a
    new layer) keep its seeded init, and leaves out what no layer holds. Read in every process that builds a layer,
    so `source` must be readable there; a ``.pt`` is mapped, not read whole."""
    where = str(source)
    state = _load(where)
    wanted: dict[str, torch.Tensor] = {}  # every tensor of the spec's layers, as `parcae export` keys it
    for layer in spec.layers:
        with torch.device("meta"):
            wanted.update({f"{layer.name}.{k}": t for k, t in exported_state(layer.build()).items()})
    for key, t in wanted.items():
        got = state.get(key)
        if got is not None and (got.shape != t.shape or got.dtype != t.dtype):
            raise SpecError(f"warm start from {where}: {key} is {tuple(got.shape)} {got.dtype} there, the layer's is "
                            f"{tuple(t.shape)} {t.dtype}; {_FIX}")  # fmt: skip
    unknown, missing = sorted(set(state) - set(wanted)), [k for k in wanted if k not in state]
    if unknown and strict:
        raise SpecError(f"warm start from {where}: {_some(unknown)} belong to no layer of the spec (its layers: "
                        f"{', '.join(layer.name for layer in spec.layers)}); {_FIX}, or warm_start(..., strict=False) "
                        "to leave them out")  # fmt: skip
    if missing and strict:
        raise SpecError(f"warm start from {where}: it lacks {_some(missing)} of the spec's tensors; {_FIX}, or "
                        "warm_start(..., strict=False) to let the layers it lacks keep their seeded init")  # fmt: skip
    layers = [replace(layer, build=functools.partial(_loaded, layer.build, layer.name, where)) for layer in spec.layers]
    return replace(spec, layers=layers)


def _some(keys: list[str]) -> str:
    return f"{keys[:3]}{f' and {len(keys) - 3} more' if len(keys) > 3 else ''}"


def _loaded(build: Callable[[], nn.Module], name: str, where: str) -> nn.Module:
    """(A layer's factory) `build()`, then the source's tensors of layer `name` copied in — on the layer's own device
    and dtype. Built on the meta device (a layer a migration fills, `hollow_layer`), it has no values to set."""
    module = build()
    own = exported_state(module)
    if any(t.is_meta for t in own.values()):
        return module
    state = _load(where)
    given = {k: state[f"{name}.{k}"] for k in own if f"{name}.{k}" in state}
    if given:
        module.load_state_dict(given, strict=False)
    return module


def _load(where: str) -> Mapping[str, torch.Tensor]:
    """The source's state dict, read once per process and version of the file (`_cached`)."""
    path = Path(where)
    try:
        stat = path.stat()
    except OSError as e:
        raise SpecError(f"warm start from {where}: {e.strerror or e}; {_FIX}") from None
    return _cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _cached(path: str, mtime_ns: int, size: int) -> Mapping[str, torch.Tensor]:
    p = Path(path)
    if p.is_dir():
        try:
            return export_state_dict(p).state
        except CheckpointError as exc:
            raise SpecError(f"warm start from {path}: {exc}") from None
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(p))
        else:
            state = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 — a user's file: whatever it is, say so with its name
        raise SpecError(f"warm start from {path}: not a readable state dict ({type(exc).__name__}: {exc}); "
                        f"{_FIX}") from None  # fmt: skip
    if not isinstance(state, dict) or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise SpecError(f"warm start from {path}: not a state dict of named tensors; {_FIX}")
    return state
