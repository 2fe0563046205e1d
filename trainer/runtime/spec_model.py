"""A spec's layers as one `nn.Module`, for use outside parcae: inference, an MLflow model.

Owns: `SpecModel` and `run_layer` (how a layer takes an activation, here and in the stages). Must not import
anything of parcae: a logged model pickles this module by value (`trainer.observe.logged_model`), so that loading it
needs torch and the spec's own layer classes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.nn as nn


class SpecModel(nn.Module):
    """The layers of a spec, run in order as parcae's stages run them: an activation that is a tuple is spread over
    the next layer's arguments (the inputs too, over the first layer's). `names[i]` is layer i's name in the spec;
    `layer(name)` finds it (`parcae export`'s keys are ``"<name>.<parameter>"``)."""

    def __init__(self, names: Sequence[str], layers: Sequence[nn.Module]) -> None:
        super().__init__()
        if len(names) != len(layers) or len(set(names)) != len(names):
            raise ValueError(f"{len(names)} unique layer names for {len(layers)} layers, got {list(names)}")
        self.names = list(names)
        self.layers = nn.ModuleList(layers)

    def layer(self, name: str) -> nn.Module:
        return self.layers[self.names.index(name)]

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = run_layer(layer, x)
        return x


def run_layer(layer: nn.Module, x: Any) -> Any:
    """A layer applied to an activation: a tuple is spread over the layer's arguments (here, where a logged model
    pickled by value finds it: the stages run their layers through it too)."""
    return layer(*x) if isinstance(x, tuple) else layer(x)
