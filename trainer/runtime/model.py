"""The model protocol: what the runtime needs of a network, and the dispatch to the family a config names.

Owns: `ModelFamily` (a module with `layer_names(cfg)`, `build_layer(cfg, index)` and `loss(outputs, targets, B)`),
`family(cfg)` (the family registered for `cfg.name` in `trainer.config.MODELS`), the per-layer seed and dtype, and
`Stage`, which runs a contiguous slice of the layer list. Must not touch: torch.distributed, optimisers, data,
files. The example family is `trainer.runtime.gpt`; a new one is a module with those three functions, registered with
`trainer.config.register_model`.

Layer i of the list has global index i and name `layer_names(cfg)[i]`; it is initialised from its own generator
seeded by (cfg.seed, i), so its initial weights are the same whichever stage builds it. The loss of a micro-batch
is its share of the global batch's mean (its rows' sum / the global batch size B), so any split of the global batch
sums to the same total.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Protocol

import torch
import torch.nn as nn

from trainer.config import MODELS, ModelConfig, UnknownModelError


class ModelFamily(Protocol):
    """A network the runtime can cut into stages, seed per layer, checkpoint per layer and migrate per layer."""

    def layer_names(self, cfg: ModelConfig) -> list[str]: ...

    def build_layer(self, cfg: ModelConfig, index: int) -> nn.Module: ...

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, global_batch_size: int) -> torch.Tensor: ...


def family(cfg: ModelConfig) -> ModelFamily | ModuleType:
    """The family module registered for `cfg.name` (imported on first use)."""
    entry = MODELS.get(cfg.name)
    if entry is None:
        raise UnknownModelError(f"unknown model {cfg.name!r}; known models: {', '.join(sorted(MODELS))}")
    return importlib.import_module(entry.family)


def layer_names(cfg: ModelConfig) -> list[str]:
    """Names of the layers in global order; checkpoints and migrations key layers by these."""
    return list(family(cfg).layer_names(cfg))


def param_dtype(cfg: ModelConfig) -> torch.dtype:
    """The torch dtype of parameters and activations."""
    dtype: torch.dtype = getattr(torch, cfg.dtype)  # one of trainer.config.DTYPES (ModelConfig checks)
    return dtype


def layer_seed(seed: int, index: int) -> int:
    """Stable seed of layer `index` (independent of process, stage cut and build order)."""
    digest = hashlib.sha256(f"layer:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def build_layer(cfg: ModelConfig, index: int) -> nn.Module:
    """Layer `index` of the global list, initialised from its own generator."""
    if not 0 <= index < cfg.n_layers_total:
        raise IndexError(f"layer index {index} out of range for {cfg.n_layers_total} layers")
    return family(cfg).build_layer(cfg, index)


def build_layers(cfg: ModelConfig, first: int = 0, last: int | None = None) -> list[nn.Module]:
    """Layers [first, last) of the global list (all of them by default)."""
    last = cfg.n_layers_total if last is None else last
    return [build_layer(cfg, i) for i in range(first, last)]


def loss(cfg: ModelConfig, outputs: torch.Tensor, targets: torch.Tensor, global_batch_size: int) -> torch.Tensor:
    """The family's loss of a micro-batch: its share of the global batch's mean loss."""
    return family(cfg).loss(outputs, targets, global_batch_size)


class Stage(nn.Module):
    """A contiguous slice of the layer list, global indices [first, last), run in order.

    The first stage takes token ids, the others activations (B, T, C); the last stage returns logits. A `Stage` is
    rebuilt at every migration that changes its range; the layer modules themselves (and their optimisers) are what
    is kept or moved.
    """

    def __init__(self, layers: Sequence[nn.Module], first: int, last: int) -> None:
        super().__init__()
        if last - first != len(layers) or first < 0:
            raise ValueError(f"Stage [{first}, {last}) needs {last - first} layers, got {len(layers)}")
        self.layers = nn.ModuleList(layers)
        self.first, self.last = first, last

    @property
    def indices(self) -> range:
        return range(self.first, self.last)

    def layer(self, index: int) -> nn.Module:
        """The layer with global index `index`."""
        if index not in self.indices:
            raise IndexError(f"layer {index} is not in this stage [{self.first}, {self.last})")
        return self.layers[index - self.first]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x
