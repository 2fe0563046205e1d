"""The example network: a small GPT (nanoGPT-style) as an ordered list of named layers — one
`trainer.runtime.model` family.

Owns: the network maths — `Embedding` (token + position), `Block` (pre-LN causal self-attention + MLP), `Head`
(final LayerNorm + Linear to logits) — their names, their deterministic initialisation and the token
cross-entropy loss. Must not touch: torch.distributed, optimisers, data, files; parallelism is applied from outside
(`trainer.runtime.pipeline`), as in torchtitan. The registered shapes ("tiny-gpt", "small-gpt") are in `trainer.config`.

There is no dropout (it would make runs depend on RNG streams per stage) and no weight tying between embed and head
(it would couple the first and last layer across stages).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.config import ModelConfig
from trainer.runtime.model import layer_seed, param_dtype

INIT_STD = 0.02


def layer_names(cfg: ModelConfig) -> list[str]:
    return ["embed", *(f"block.{i}" for i in range(cfg.n_layer)), "head"]


def loss(logits: torch.Tensor, targets: torch.Tensor, global_batch_size: int) -> torch.Tensor:
    """This micro-batch's share of the global mean loss: sum of token cross-entropies / (global_batch * T)."""
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    return total / (global_batch_size * targets.shape[1])


class Embedding(nn.Module):
    """Token + learned position embeddings: ids (B, T) -> activations (B, T, C)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        out: torch.Tensor = self.wte(idx) + self.wpe(pos)  # (nn.Module calls are typed Any)
        return out


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
        out: torch.Tensor = self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return out


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.c_proj(F.gelu(self.c_fc(x)))
        return out


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
        out: torch.Tensor = x + self.mlp(self.ln_2(x))
        return out


class Head(nn.Module):
    """Final LayerNorm + projection to logits (B, T, vocab). The loss is left to the caller (the pipeline)."""

    def __init__(self, cfg: ModelConfig) -> None:
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


def build_layer(cfg: ModelConfig, index: int) -> nn.Module:
    """Layer `index` of the global list (range-checked by `trainer.runtime.model.build_layer`), initialised from its own
    generator."""
    if index == 0:
        layer: nn.Module = Embedding(cfg)
    elif index == cfg.n_layers_total - 1:
        layer = Head(cfg)
    else:
        layer = Block(cfg)
    _init_weights(layer, torch.Generator().manual_seed(layer_seed(cfg.seed, index)), cfg.n_layer)
    # drawn in float32 then cast, so a float64 model starts from exactly the float32 model's weights
    return layer.to(param_dtype(cfg))
