"""Configuration of the elastic trainer: one frozen dataclass per component, defaults in one place.

Owns: `ModelConfig` (what network is trained), `TrainConfig` (how: batch, optimiser, seed) and the registry of
known model names. Must not touch: torch, processes, files — configs cross process boundaries (they are
pickled to spawned workers and stored in checkpoints as plain dicts), so they stay plain data.

Neither config changes at a migration: the global batch, micro-batch size and seed are fixed for the whole
job, which is what makes every D x P strategy compute the same training run (see `trainer.pipeline`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


class UnknownModelError(ValueError):
    """A model name that is not in `MODELS`."""


# Known model shapes. "tiny-gpt" is the CPU demo network (~0.2 M parameters, 6 layers in all);
# "small-gpt" is a larger one for benchmarks that want stages with visible compute.
MODELS: dict[str, dict[str, int]] = {
    "tiny-gpt": {"n_layer": 4, "n_embd": 64, "n_head": 4, "block_size": 32},
    "small-gpt": {"n_layer": 8, "n_embd": 128, "n_head": 4, "block_size": 64},
}


DTYPES = ("float32", "float64")


def _corpus_vocab_size() -> int:
    # Imported lazily: data imports config for the TrainConfig type.
    from trainer.data import corpus

    return corpus().vocab_size


@dataclass(frozen=True)
class ModelConfig:
    """The network: a GPT over the bundled character corpus.

    `vocab_size` defaults to the corpus vocabulary; `seed` fixes every layer's initial weights (each layer from its
    own generator, so the cut into stages does not matter — see `trainer.model.layer_seed`). `dtype` is a torch
    dtype name, kept as a string so configs stay plain data. `model_config(name)` gives a registered shape; the
    constructor takes the fields as given (the name must still be registered).
    """

    name: str = "tiny-gpt"
    vocab_size: int = field(default_factory=_corpus_vocab_size)
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    block_size: int = 32
    seed: int = 0
    # "float64" makes runs that differ only in summation order (other D) agree to ~1e-12 rather than ~1e-5:
    # Adam's first steps amplify float32 rounding in near-zero gradients. Used by the equivalence tests.
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.name not in MODELS:
            raise UnknownModelError(f"unknown model {self.name!r}; known models: {', '.join(sorted(MODELS))}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if min(self.vocab_size, self.n_layer, self.n_embd, self.block_size) < 1:
            raise ValueError(f"model dimensions must be positive: {self}")

    @property
    def n_layers_total(self) -> int:
        """Layers in the ordered list the pipeline cuts: embed + n_layer blocks + head."""
        return self.n_layer + 2

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return cls(**d)


def model_config(name: str = "tiny-gpt", **overrides: Any) -> ModelConfig:
    """The registered shape of `name`, with `overrides` (e.g. seed=3) applied."""
    if name not in MODELS:
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}")
    return ModelConfig(name=name, **{**MODELS[name], **overrides})


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation, independent of D x P.

    `global_batch` sequences per step are split across the D replicas (uneven splits allowed, see
    `trainer.data.shard`) and then into micro-batches of at most `micro_batch` sequences.
    """

    global_batch: int = 16
    micro_batch: int = 2
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    seed: int = 0
    steps: int = 100

    def __post_init__(self) -> None:
        if self.global_batch < 1 or self.micro_batch < 1:
            raise ValueError(f"global_batch and micro_batch must be >= 1, got {self.global_batch}, {self.micro_batch}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
