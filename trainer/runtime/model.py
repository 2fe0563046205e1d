"""The model as the runtime sees it: a job's `TrainSpec`, its layers built per layer, and the `Stage` that runs a
contiguous slice of them.

Owns: `spec_of` (the spec of a `ModelConfig`, loaded once per process), the per-layer build (seeded by
`trainer.runtime.trainspec.layer_seed`), the layer list's names and length, and `Stage`. Must not touch:
torch.distributed, optimisers, data, files.

Layer i of the list has global index i and name `spec.layers[i].name`; it is built with torch's generator seeded by
(cfg.seed, i), so its initial weights are the same whichever stage builds it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn

from trainer.config import ModelConfig, TrainConfig
from trainer.runtime.spec_model import run_layer
from trainer.runtime.trainspec import TrainSpec, fingerprint, load_spec, seeded_build


def spec_of(cfg: ModelConfig, train: TrainConfig | None = None) -> TrainSpec:
    """The job's training spec (`trainer.runtime.trainspec.load_spec`, cached per process)."""
    return load_spec(cfg, train)


def layer_names(cfg: ModelConfig) -> list[str]:
    """Names of the layers in global order; checkpoints and migrations key layers by these."""
    return spec_of(cfg).names


def n_layers(cfg: ModelConfig) -> int:
    """Layers in the ordered list the pipeline cuts."""
    return len(spec_of(cfg).layers)


@functools.lru_cache(maxsize=16)
def model_fingerprint(cfg: ModelConfig) -> str:
    """The spec's fingerprint (layer names, shapes, dtypes): part of a job's identity, checked by workers and
    checkpoints."""
    return fingerprint(spec_of(cfg))


def build_layer(cfg: ModelConfig, index: int, train: TrainConfig | None = None) -> nn.Module:
    """Layer `index` of the global list, initialised from its own seed."""
    spec = spec_of(cfg, train)
    if not 0 <= index < len(spec.layers):
        raise IndexError(f"layer index {index} out of range for {len(spec.layers)} layers")
    return seeded_build(spec, cfg.seed, index)


def persistent_buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    """The buffers of `module` that are part of its state (its `state_dict` less its parameters: e.g. BatchNorm's
    running statistics), by name, live. A non-persistent buffer is not: its factory alone gives its values."""
    params = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    return {name: t for name, t in module.state_dict(keep_vars=True).items()
            if name not in params and torch.is_tensor(t) and not name.endswith("_extra_state")}  # fmt: skip


def hollow_layer(
    cfg: ModelConfig, index: int, train: TrainConfig | None = None, device: torch.device | str = "cpu"
) -> nn.Module | None:
    """Layer `index` with its storage on `device` but no initial values, for a layer whose state a migration installs
    anyway: the random init would be thrown away. It is built on the meta device, which draws from no generator and
    is a per-thread setting, so a helper thread can build it beside training (`build_layer` seeds the process's
    generator: only the training thread may call it).

    None for a layer with non-persistent buffers (not part of its state: only its factory gives them their values)
    or with tied parameters (`Module.to_empty` would untie them)."""
    spec = spec_of(cfg, train)
    with torch.device("meta"):
        module = spec.layers[index].build()
    if {name for name, _ in module.named_buffers()} - set(persistent_buffers(module)):
        return None
    if len(list(module.parameters())) != len(list(module.named_parameters(remove_duplicate=False))):
        return None
    return module.to_empty(device=device)


def build_layers(cfg: ModelConfig, first: int = 0, last: int | None = None) -> list[nn.Module]:
    """Layers [first, last) of the global list (all of them by default)."""
    last = n_layers(cfg) if last is None else last
    return [build_layer(cfg, i) for i in range(first, last)]


class Stage(nn.Module):
    """A contiguous slice of the layer list, global indices [first, last), run in order.

    The first stage takes the batch's inputs, the others the previous stage's activations (a tensor or a tuple);
    the last stage returns the outputs the loss scores. A `Stage` is rebuilt at every migration that changes its
    range; the layer modules themselves (and their optimisers) are what is kept or moved.
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

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = run_layer(layer, x)
        return x
