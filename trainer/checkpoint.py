"""Checkpoints keyed by layer name, so that they load into any D x P.

Owns: the file format, atomic writing, safe loading and validation. Must not touch: processes, process groups,
optimiser construction (it stores and returns `trainer.pipeline.layer_state` snapshots; installing them is
`StageContext.load_layer_states`).

Format: one file holds `{"format": 1, "layers": {name: layer_state}, "step": s, "config": ModelConfig as a dict,
"job": job_id}`. A checkpoint is **one file or several shard files**: a single process writes one file with every
layer; a distributed job lets one replica of each stage write a shard with that stage's layers (no gather through a
single rank). `load` merges the files, checks they agree on job, config and step, that no layer appears twice and,
by default, that every layer of the model is present — so a checkpoint whose shards were not all written is
refused rather than half-loaded.

A running job writes one such sharded checkpoint every `checkpoint_every` steps (`trainer.worker`); the
coordinator knows which are complete, a checkpoint-restart loads the latest complete one into any cut, and
`remove_after` clears the files of the abandoned run past it.

Each file is written atomically: to a temporary file in the same directory (same file system), flushed and
fsync'ed, then `os.replace`d over the target, so a reader sees the old file or the new one, never a partial one.
Temporary files of a crashed writer are removed on error and are named `.<name>.tmp-*` so `find_shards` never
picks them up. Files are read with `torch.load(weights_only=True)`: a checkpoint is data, never code.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.config import ModelConfig
from trainer.model import layer_names

FORMAT = 1
LayerState = dict[str, torch.Tensor]


class CheckpointError(Exception):
    """A checkpoint that cannot be used: unreadable, of another job or model, incomplete or inconsistent."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded (possibly merged) checkpoint: every layer's state by name, at the start of step `step`."""

    step: int
    job: str
    config: ModelConfig
    layers: dict[str, LayerState]


def save(
    path: str | os.PathLike[str],
    layers: Mapping[str, LayerState],
    *,
    step: int,
    config: ModelConfig,
    job: str,
) -> Path:
    """Write `layers` (all of them or one stage's shard) atomically to `path`; returns the path."""
    path = Path(path)
    known = set(layer_names(config))
    unknown = sorted(set(layers) - known)
    if unknown:
        raise ValueError(f"layers {unknown} are not layers of model {config.name!r}")
    payload = {
        "format": FORMAT,
        "layers": {name: dict(state) for name, state in layers.items()},
        "step": int(step),
        "config": config.to_dict(),
        "job": str(job),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _read(path: Path) -> dict:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    except Exception as e:  # a truncated zip, garbage, or a pickle that is not plain data
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from e
    fields = {"layers", "step", "config", "job"}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not fields <= data.keys():
        raise CheckpointError(f"{path}: not a trainer checkpoint (format {FORMAT} with layers, step, config, job)")
    return data


def load(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    config: ModelConfig,
    job: str,
    complete: bool = True,
) -> Checkpoint:
    """Read and merge checkpoint file(s), refusing another job, another model config, a step mismatch between
    shards, a layer in two shards, or (with `complete`) a missing layer."""
    paths = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    if not paths:
        raise CheckpointError("no checkpoint files given")
    expected = config.to_dict()
    layers: dict[str, LayerState] = {}
    origin: dict[str, Path] = {}
    step: int | None = None
    for path in paths:
        data = _read(path)
        if data["job"] != job:
            raise CheckpointError(f"{path}: checkpoint of job {data['job']!r}, expected job {job!r}")
        if data["config"] != expected:
            diff = {
                k: (data["config"].get(k), expected.get(k))
                for k in sorted(expected.keys() | data["config"].keys())
                if data["config"].get(k) != expected.get(k)
            }
            detail = ", ".join(f"{k}: file has {a!r}, expected {b!r}" for k, (a, b) in diff.items())
            raise CheckpointError(f"{path}: checkpoint of another model config ({detail})")
        if step is None:
            step = data["step"]
        elif data["step"] != step:
            raise CheckpointError(f"{path}: step {data['step']} but {paths[0]} has step {step}")
        for name, state in data["layers"].items():
            if name in layers:
                raise CheckpointError(f"{path}: layer {name!r} is also in {origin[name]}")
            layers[name], origin[name] = state, path
    if complete:
        missing = [n for n in layer_names(config) if n not in layers]
        if missing:
            raise CheckpointError(f"{', '.join(map(str, paths))}: incomplete checkpoint, missing layers {missing}")
    assert step is not None
    return Checkpoint(step=step, job=job, config=config, layers=layers)


def shard_path(directory: str | os.PathLike[str], step: int, stage: int | None = None) -> Path:
    """Conventional file name: `step{s}.pt` for a whole checkpoint, `step{s}.stage{k}.pt` for a stage's shard."""
    suffix = "" if stage is None else f".stage{stage}"
    return Path(directory) / f"step{step:08d}{suffix}.pt"


def find_shards(directory: str | os.PathLike[str], step: int) -> list[Path]:
    """The finished files of the checkpoint at `step` in `directory` (temporary files are hidden dot-files)."""
    d = Path(directory)
    whole = d / f"step{step:08d}.pt"
    return ([whole] if whole.is_file() else []) + sorted(
        d.glob(f"step{step:08d}.stage*.pt"), key=lambda p: int(p.name.split(".stage")[1].removesuffix(".pt"))
    )


def _step_of(path: Path) -> int | None:
    name = path.name
    if not name.startswith("step") or not name.endswith(".pt"):
        return None
    digits = name[4:].split(".", 1)[0]
    return int(digits) if digits.isdigit() else None


def remove_after(directory: str | os.PathLike[str], step: int) -> list[Path]:
    """Delete the checkpoint files (whole or shards) of steps after `step`; returns what was removed.

    A checkpoint-restart from `step` calls it before the restarted job writes again: files of later steps are
    an incomplete checkpoint of the abandoned run, and a shard of another cut left next to the new ones would make
    the later checkpoint ambiguous (`load` refuses a layer in two shards).
    """
    d = Path(directory)
    removed = []
    if d.is_dir():
        for p in sorted(d.glob("step*.pt")):
            s = _step_of(p)
            if s is not None and s > step:
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed
