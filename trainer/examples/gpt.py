"""The built-in example network: a small GPT (nanoGPT-style) over the bundled character corpus, written against
the same public contract as a user's model (`trainer.runtime.trainspec.TrainSpec`).

Owns: the network maths — `Embedding` (token + position), `Block` (pre-LN causal self-attention + MLP), `Head`
(final LayerNorm + Linear to logits) — their deterministic initialisation, the corpus batch of a step and the token
cross-entropy. The registered shapes ("tiny-gpt", "small-gpt") are in `trainer.config`. Must not touch:
torch.distributed, processes, files; parallelism is applied from outside (`trainer.runtime.pipeline`), as in
torchtitan.

There is no dropout (it would make runs depend on RNG streams per stage) and no weight tying between embed and head
(it would couple the first and last layer across stages).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.config import TrainConfig
from trainer.corpus import corpus
from trainer.runtime.trainspec import Layer, TrainSpec, stable_seed
from trainer.runtime.warm_start import warm_start

INIT_STD = 0.02


class Embedding(nn.Module):
    """Token + learned position embeddings: ids (B, T) -> activations (B, T, C)."""

    def __init__(self, cfg: GptShape) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        out: torch.Tensor = self.wte(idx) + self.wpe(pos)  # (nn.Module calls are typed Any)
        return out


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GptShape) -> None:
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
        out: torch.Tensor = self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return out


class MLP(nn.Module):
    def __init__(self, cfg: GptShape) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.c_proj(F.gelu(self.c_fc(x)))
        return out


class Block(nn.Module):
    """One transformer block: x + attn(ln(x)), then x + mlp(ln(x)); (B, T, C) -> (B, T, C)."""

    def __init__(self, cfg: GptShape) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        out: torch.Tensor = x + self.mlp(self.ln_2(x))
        return out


class Head(nn.Module):
    """Final LayerNorm + projection to logits (B, T, vocab). The loss is left to the caller (the pipeline)."""

    def __init__(self, cfg: GptShape) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(self.ln_f(x))
        return out


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


def build_layer(cfg: GptShape, index: int) -> nn.Module:
    """Layer `index` of the global list (embed, blocks, head), initialised from torch's generator as parcae seeded
    it for this layer (`torch.initial_seed()`), so the weights do not depend on the stage that builds the layer."""
    if index == 0:
        layer: nn.Module = Embedding(cfg)
    elif index == cfg.n_layer + 1:
        layer = Head(cfg)
    else:
        layer = Block(cfg)
    _init_weights(layer, torch.Generator().manual_seed(torch.initial_seed()), cfg.n_layer)
    # drawn in float32 then cast, so a float64 model starts from exactly the float32 model's weights
    return layer.to(getattr(torch, cfg.dtype))


def global_batch(step: int, cfg: TrainConfig, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-character targets of `step`, each (global_batch, block_size), from (cfg.seed, step) alone."""
    tokens = corpus().tokens
    gen = torch.Generator().manual_seed(stable_seed("batch", cfg.seed, step))
    starts = torch.randint(0, len(tokens) - block_size - 1, (cfg.global_batch,), generator=gen)
    offsets = torch.arange(block_size)
    x = tokens[starts[:, None] + offsets]
    y = tokens[starts[:, None] + offsets + 1]
    return x, y


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The SUM over rows of each row's mean token cross-entropy (parcae divides by the global batch)."""
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    return total / targets.shape[1]


DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class GptShape:
    """The network's shape. `dtype` "float64" makes runs that differ only in summation order (other D) agree to
    ~1e-12 rather than ~1e-5 (Adam's first steps amplify float32 rounding in near-zero gradients); the equivalence
    tests use it."""

    n_layer: int
    n_embd: int
    n_head: int
    block_size: int
    vocab_size: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.n_layer, self.n_embd, self.n_head, self.block_size) < 1:
            raise ValueError(f"model dimensions must be positive: {self}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")


def spec(
    n_layer: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    block_size: int = 32,
    vocab_size: int | None = None,
    dtype: str = "float32",
    init: str | None = None,
    *,
    train: TrainConfig,
) -> TrainSpec:
    """The GPT as a training spec: embed, `n_layer` blocks, head; the corpus batch of `train.global_batch` rows
    drawn from (train.seed, step); AdamW with the job's learning rate, betas and weight decay. `init`: a warm start
    from what `parcae export` wrote of an earlier job of this shape, or its checkpoint folder (`warm_start`)."""
    cfg = GptShape(n_layer, n_embd, n_head, block_size, corpus().vocab_size if vocab_size is None else vocab_size,
                   dtype)  # fmt: skip
    names = ["embed", *(f"block.{i}" for i in range(n_layer)), "head"]

    def optimizer(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=train.lr, betas=train.betas, weight_decay=train.weight_decay)

    gpt = TrainSpec(
        layers=[Layer(name, functools.partial(build_layer, cfg, i)) for i, name in enumerate(names)],
        batch=lambda step: global_batch(step, train, block_size),
        loss=token_loss,
        optimizer=optimizer,
    )
    return gpt if init is None else warm_start(gpt, init)
