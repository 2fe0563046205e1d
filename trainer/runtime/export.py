"""A checkpoint as one plain state dict, for use outside parcae.

Owns: `export_state_dict` (the newest intact checkpoint of a folder — periodic checkpoints or a job's final
`layers/` —, a given step's or the best-scored one, merged into one state dict keyed ``"<layer name>.<parameter>"``),
`export_from_uri` (the same from a checkpoint URI), `write_state_dict` (``.pt`` with torch, ``.safetensors``
with the safetensors library) and `trained_model` (a checkpoint loaded into the spec's own layers, as one
`SpecModel`). Must not touch: training, processes. The keys load into a module whose children are
named like the spec's layers (an ``nn.ModuleDict`` of layers whose names have no dots; a GPT's "block.0" into an
``nn.ModuleList`` attribute ``block``); the optimiser state stays in parcae's per-layer checkpoints.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from trainer.config import ModelConfig, TrainConfig
from trainer.runtime import checkpoint
from trainer.runtime.checkpoint_mirror import mirror_for
from trainer.runtime.spec_model import SpecModel


@dataclass(frozen=True)
class Exported:
    """What was exported: the state dict, and the model, job and step it is of (and its held-out scores, if the job
    recorded them beside it)."""

    state: dict[str, torch.Tensor]
    config: ModelConfig
    job: str
    step: int
    held_out: checkpoint.HeldOut | None = None

    @property
    def model(self) -> str:
        return self.config.name

    @property
    def val_loss(self) -> float | None:
        return None if self.held_out is None else self.held_out.loss


def export_state_dict(directory: str | os.PathLike[str], step: int | None = None, *, best: bool = False) -> Exported:
    """The parameters and persistent buffers of the checkpoint of `step` (default: the newest intact one; with
    `best`, the intact one with the best held-out score recorded beside it, `checkpoint.best_validated`) in
    `directory`."""
    d = Path(directory)
    if not d.is_dir():
        raise checkpoint.CheckpointError(f"{d}: no such folder; give a job's checkpoints/ or layers/ folder")
    if best:
        step = _best_step(step, lambda: checkpoint.best_validated(d), f"{d}: no intact checkpoint")[0]
    steps = [step] if step is not None else checkpoint.checkpoint_steps(d)
    verdicts = [checkpoint.verify_step(d, s) for s in steps]
    found = next((v for v in verdicts if v.intact), None)
    if found is None:
        why = "; ".join(map(str, verdicts)) or "no checkpoint files"
        raise checkpoint.CheckpointError(f"{d}: no intact checkpoint to export ({why})")
    try:
        config, job, at = checkpoint.describe(found.files[0])
    except ValueError as exc:  # a checkpoint whose model config this parcae cannot read (ConfigError)
        raise checkpoint.CheckpointError(f"{found.files[0]}: {exc}") from None
    ckpt = checkpoint.load(list(found.files), config=config, job=job)
    from trainer.runtime.model import layer_names

    state = {
        f"{name}.{key.split('/', 1)[1]}": tensor
        for name in layer_names(config)
        for key, tensor in ckpt.layers[name].items()
        if key.startswith(("param/", "buffer/"))  # a module's state_dict: parameters and persistent buffers
    }
    return Exported(state=state, config=config, job=job, step=at, held_out=checkpoint.held_out(d, job=job).get(at))


def export_from_uri(uri: str, step: int | None = None, *, best: bool = False) -> Exported:
    """`export_state_dict` of a checkpoint URI (a job's `--checkpoint-uri`: ``s3://bucket/prefix`` or
    ``file:///path``, where instances that share no disk keep their checkpoints): the complete checkpoint of `step`
    (default: the newest; with `best`, the best-scored one, `CheckpointMirror.best_validated`) is downloaded into a
    temporary folder, verified and read there. Raises what the backend raises (no credentials, no bucket)."""
    mirror = mirror_for(uri)
    val: checkpoint.HeldOut | None = None
    if best:  # (a complete step: `best_validated` looks only at those)
        at, val = _best_step(step, mirror.best_validated, f"{uri}: no complete checkpoint there")
    else:
        complete = mirror.steps()
        if step is None and not complete:
            raise checkpoint.CheckpointError(f"{uri}: no complete checkpoint there (a step's manifest is written last)")
        if step is not None and step not in complete:
            shown = ", ".join(map(str, complete[:8])) or "none"
            raise checkpoint.CheckpointError(f"{uri}: no complete checkpoint of step {step} there (complete: "
                                             f"{shown}); give one of those")  # fmt: skip
        at = complete[0] if step is None else step
    with tempfile.TemporaryDirectory(prefix="parcae-export-") as tmp:
        mirror.download_step(at, Path(tmp))
        exported = export_state_dict(tmp, at)
    return replace(exported, held_out=val if best else mirror.held_out(job=exported.job).get(at))


def _best_step(
    step: int | None, best_of: Callable[[], tuple[int, checkpoint.HeldOut] | None], none_there: str
) -> tuple[int, checkpoint.HeldOut]:  # fmt: skip
    """The best-scored checkpoint's (step, held-out scores), `best_of()`'s; refused with a `step` too, and where
    nothing is scored (`none_there` begins the message: where, and what was looked at)."""
    if step is not None:
        raise ValueError("give a step or ask for the best checkpoint, not both")
    found = best_of()
    if found is None:
        raise checkpoint.CheckpointError(
            f"{none_there} has a held-out loss beside it (a job whose spec has a `validation` records one for each "
            "checkpoint it scores); export the newest, or give its step"
        )
    return found


def write_state_dict(state: dict[str, torch.Tensor], out: str | os.PathLike[str]) -> Path:
    """Write `state` as ``.pt`` (torch.save) or ``.safetensors`` (needs the safetensors package)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ValueError(f"{path}: writing .safetensors needs the safetensors package (pip install "
                             "safetensors), or write a .pt file") from None  # fmt: skip
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    elif path.suffix == ".pt":
        torch.save(state, path)
    else:
        raise ValueError(f"{path}: give a .pt or .safetensors file name")
    return path


def exported_state(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A layer's state as `export_state_dict` keys it below the layer's name: its `state_dict` (parameters and
    persistent buffers) less the `_extra_state` entries a module may add (not tensors of its own)."""
    return {k: v for k, v in layer.state_dict().items() if not k.endswith("_extra_state")}


def trained_model(exported: Exported, train: TrainConfig | None = None) -> SpecModel:
    """The spec's layers, built by its own factories and loaded with `exported`'s parameters and persistent buffers
    (every one of each layer's, or `CheckpointError` names what is missing): the trained model as one module.
    `train`: the job's (a spec that reads it, as the built-in GPTs do)."""
    from trainer.runtime.model import build_layer, layer_names

    names = layer_names(exported.config)
    layers = []
    for i, name in enumerate(names):  # built and loaded one at a time: a layer's fresh weights live only until here
        layer = build_layer(exported.config, i, train)
        wanted = list(exported_state(layer))
        missing = [f"{name}.{k}" for k in wanted if f"{name}.{k}" not in exported.state]
        if missing:
            raise checkpoint.CheckpointError(
                f"the checkpoint of step {exported.step} lacks {missing[:3]} of the spec's layers; was it written by "
                "another version of the spec?"
            )
        # assigned, not copied: the checkpoint's tensors, mapped from its files (`checkpoint.load`), become the layer's
        layer.load_state_dict({k: exported.state[f"{name}.{k}"] for k in wanted}, strict=False, assign=True)
        layers.append(layer)
    return SpecModel(names, layers).eval()
