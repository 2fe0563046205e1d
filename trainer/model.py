"""A small GPT (nanoGPT-style) expressed as an ordered list of layers, the unit that stages own and migrations move.

Owns: the network maths — `Embedding` (token + position), `Block` (pre-LN causal self-attention + MLP),
`Head` (final LayerNorm + Linear to logits; the loss is computed by the caller) — their names, their
deterministic initialisation, and `Stage`, which runs a contiguous slice of the list.
Must not touch: torch.distributed, optimisers, data, files. Parallelism is applied from outside
(`trainer.pipeline`), as in torchtitan.

Layer i of the list has global index i and name `layer_names(cfg)[i]`: "embed", "block.0", ..., "head".
Layer i is initialised from its own generator seeded by (cfg.seed, i), so its initial weights are the same
whichever stage builds it. There is no dropout (it would make runs depend on RNG streams per stage) and no weight
tying between embed and head (it would couple the first and last layer across stages).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.config import ModelConfig

INIT_STD = 0.02


def layer_names(cfg: ModelConfig) -> list[str]:
    """Names of the layers in global order; checkpoints and migrations key layers by these."""
    return ["embed", *(f"block.{i}" for i in range(cfg.n_layer)), "head"]


def param_dtype(cfg: ModelConfig) -> torch.dtype:
    """The torch dtype of parameters and activations."""
    return getattr(torch, cfg.dtype)


def layer_seed(seed: int, index: int) -> int:
    """Stable seed of layer `index` (independent of process, stage cut and build order)."""
    digest = hashlib.sha256(f"layer:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class Embedding(nn.Module):
    """Token + learned position embeddings: ids (B, T) -> activations (B, T, C)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.wte(idx) + self.wpe(pos)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        # No bias on q, k, v: a key bias only adds a per-query constant to the scores, which softmax ignores, so its
        # gradient is zero in exact arithmetic and rounding noise in practice. Adam would turn that noise into
        # lr-sized updates that differ with the summation order, i.e. with D x P.
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """One transformer block: x + attn(ln(x)), then x + mlp(ln(x)); (B, T, C) -> (B, T, C)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Head(nn.Module):
    """Final LayerNorm + projection to logits (B, T, vocab). The loss is left to the caller (the pipeline)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


@torch.no_grad()
def _init_weights(layer: nn.Module, gen: torch.Generator, n_layer: int) -> None:
    """nanoGPT's init, drawn from `gen` in module order (deterministic per layer)."""
    for name, module in layer.named_modules():
        if isinstance(module, nn.Linear):
            # residual projections scaled by 1/sqrt(2*n_layer), per GPT-2
            std = INIT_STD / math.sqrt(2 * n_layer) if name.endswith("c_proj") else INIT_STD
            nn.init.normal_(module.weight, 0.0, std, generator=gen)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, INIT_STD, generator=gen)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def build_layer(cfg: ModelConfig, index: int) -> nn.Module:
    """Layer `index` of the global list, initialised from its own generator."""
    if not 0 <= index < cfg.n_layers_total:
        raise IndexError(f"layer index {index} out of range for {cfg.n_layers_total} layers")
    if index == 0:
        layer: nn.Module = Embedding(cfg)
    elif index == cfg.n_layers_total - 1:
        layer = Head(cfg)
    else:
        layer = Block(cfg)
    _init_weights(layer, torch.Generator().manual_seed(layer_seed(cfg.seed, index)), cfg.n_layer)
    # drawn in float32 then cast, so a float64 model starts from exactly the float32 model's weights
    return layer.to(param_dtype(cfg))


def build_layers(cfg: ModelConfig, first: int = 0, last: int | None = None) -> list[nn.Module]:
    """Layers [first, last) of the global list (all of them by default)."""
    last = cfg.n_layers_total if last is None else last
    return [build_layer(cfg, i) for i in range(first, last)]


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
