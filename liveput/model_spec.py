"""Per-layer model specifications and the cost model's stage partition.

A model is an ordered list of layers (embedding, blocks, head) so that it can be cut into any number of
pipeline stages. The migration cost model needs, for each (P), which layers each stage holds and how many
parameters that is; the analytic pipeline estimator needs per-layer compute times. Values are the
reference's (`cost_cfg.py get_model_layer_costs`, `model.py ModelSpec.build`, parcae-reference §E.4).
This module is pure data and arithmetic: no I/O beyond reading the bundled JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from typing import Any


@dataclass(frozen=True)
class Layer:
    """One partitionable unit. Times are per micro-batch, in milliseconds."""

    name: str
    params: int
    fwd_ms: float = 0.0
    bwd_ms: float = 0.0
    opt_ms: float = 0.0
    act_bytes: int = 0


@dataclass(frozen=True)
class ModelSpec:
    """A model as an ordered list of layers plus its optimizer.

    ``optim_states`` counts fp32 tensors per parameter that the optimizer keeps (Adam: m and v = 2, SGD
    with momentum: 1). A stage's migratable state is ``params * (1 + optim_states) * 4`` bytes
    (§D.2: 12 B/param for Adam).
    """

    name: str
    layers: tuple[Layer, ...]
    optim_states: int = 2
    micro_batch: int = 1
    seq_len: int = 0
    hidden: int = 0
    source: str = ""

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @cached_property
    def layer_params(self) -> tuple[int, ...]:
        return tuple(layer.params for layer in self.layers)

    @property
    def total_params(self) -> int:
        return sum(self.layer_params)

    @property
    def bytes_per_param(self) -> int:
        """fp32 weights plus optimizer moments: what a migration moves per parameter."""
        return 4 * (1 + self.optim_states)

    def partition(self, p: int) -> tuple[int, ...]:
        """Cut points ``c`` of the cost model's uniform partition: stage s holds layers ``c[s]:c[s+1]``.

        The reference rule (§E.4): chunk = (L-1)//p; stage 0 gets chunk+1 layers (the embedding rides
        along with the first chunk), the others chunk, and the remainder (L-1) % p goes one layer each
        to stages -2, -3, ... (the last stage already carries the head).
        """
        return _partition(self.n_layers, p)

    def stage_params(self, p: int) -> tuple[int, ...]:
        """Parameters held by each stage of the p-stage partition."""
        return _stage_params(self.layer_params, p)

    def stage_bytes(self, p: int) -> tuple[int, ...]:
        """Migratable state (weights + optimizer moments) of each stage, in bytes."""
        return tuple(n * self.bytes_per_param for n in self.stage_params(p))

    @property
    def boundary_bytes(self) -> int:
        """One micro-batch's activations at a layer boundary (fp32): what a stage sends on, and what a
        recomputing stage keeps per layer and micro-batch in flight (0 without seq_len/hidden)."""
        return self.micro_batch * self.seq_len * self.hidden * 4

    def stage_memory(self, p: int, limit_bytes: float, recompute: bool = True) -> tuple[StageMemory, ...] | None:
        """What each stage of the p-stage cut holds while it trains under 1F1B, or None if a stage cannot fit.

        A stage holds its state (``params * bytes_per_param``: fp32 weights + optimizer moments; gradients and
        fp16 copies are ignored, as in the reference) plus the activations of the ``P - s`` micro-batches 1F1B
        keeps in flight (``Layer.act_bytes`` summed over the stage). If that overflows ``limit_bytes`` and
        ``recompute`` is on, the stage checkpoints: it keeps only each layer's input (`boundary_bytes`) per
        in-flight micro-batch plus one layer's full activations (the reference's "recompute when (P - stage) *
        acts > 15.5 GiB", §E.5). Otherwise it is infeasible.
        """
        cuts = self.partition(p)
        out = []
        for s in range(p):
            layers = self.layers[cuts[s] : cuts[s + 1]]
            state = sum(layer.params for layer in layers) * self.bytes_per_param
            in_flight = p - s
            acts = in_flight * sum(layer.act_bytes for layer in layers)
            recomputed = state + acts > limit_bytes
            if recomputed:
                acts = in_flight * len(layers) * self.boundary_bytes + max(layer.act_bytes for layer in layers)
                if not recompute or state + acts > limit_bytes:
                    return None
            out.append(StageMemory(state, acts, recomputed))
        return tuple(out)


@dataclass(frozen=True)
class StageMemory:
    """Bytes one pipeline stage holds while it trains (`ModelSpec.stage_memory`)."""

    state_bytes: int
    activation_bytes: int
    recompute: bool  # the stage checkpoints its activations (and pays one more forward in backward)

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes


@cache
def _partition(n_layers: int, p: int) -> tuple[int, ...]:
    if not 1 <= p <= n_layers - 1 and not (p == 1 and n_layers >= 1):
        raise ValueError(f"cannot cut {n_layers} layers into {p} stages (1 <= P <= {max(n_layers - 1, 1)})")
    if p == 1:
        return (0, n_layers)
    chunk, rem = divmod(n_layers - 1, p)
    sizes = [chunk] * p
    sizes[0] += 1
    for i in range(rem):
        sizes[-2 - i] += 1
    cuts = [0]
    for size in sizes:
        cuts.append(cuts[-1] + size)
    return tuple(cuts)


@cache
def _stage_params(layer_params: tuple[int, ...], p: int) -> tuple[int, ...]:
    cuts = _partition(len(layer_params), p)
    return tuple(sum(layer_params[cuts[s] : cuts[s + 1]]) for s in range(p))


def _build(entry: dict[str, Any]) -> ModelSpec:
    """Expand the compact JSON form: first layer, ``repeat`` x block, then the last layers."""
    layers: list[Layer] = []
    for item in entry["layers"]:
        count = int(item.get("repeat", 1))
        base = {k: v for k, v in item.items() if k not in ("repeat",)}
        for i in range(count):
            name = base["name"] if count == 1 else f"{base['name']}.{i}"
            layers.append(
                Layer(
                    name=name,
                    params=int(round(float(base["params"]))),
                    fwd_ms=float(base.get("fwd_ms", 0.0)),
                    bwd_ms=float(base.get("bwd_ms", 0.0)),
                    opt_ms=float(base.get("opt_ms", 0.0)),
                    act_bytes=int(base.get("act_bytes", 0)),
                )
            )
    return ModelSpec(
        name=entry["name"],
        layers=tuple(layers),
        optim_states=int(entry.get("optim_states", 2)),
        micro_batch=int(entry.get("micro_batch", 1)),
        seq_len=int(entry.get("seq_len", 0)),
        hidden=int(entry.get("hidden", 0)),
        source=entry.get("source", ""),
    )


@cache
def _registry() -> dict[str, ModelSpec]:
    text = resources.files("liveput").joinpath("data/models.json").read_text()
    return {entry["name"]: _build(entry) for entry in json.loads(text)["models"]}


def model_names() -> list[str]:
    return sorted(_registry())


def load_model_spec(name: str) -> ModelSpec:
    """The bundled spec of ``name``; an unknown name lists the known ones."""
    try:
        return _registry()[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(model_names())}") from None
