"""A byte-level language model over any file, read as a memory-mapped token file, as a parcae training spec.

Each byte of the file is a token (vocabulary 256), cut into next-token windows (`parcae.TokenWindows`) that
`parcae.StepSampler` visits once per epoch. The layers are an embedding, causal transformer blocks (torch's own
`nn.TransformerEncoderLayer`, dropout off: training must not depend on D x P) and a head. Train it under a replayed
trace with

    parcae train --model examples/token_lm.py:spec --model-args '{"tokens": "README.md"}' --trace p3 --workers 4

A real token file (e.g. uint16 ids from a tokenizer) works the same: give "tokens", "vocab" and "token_dtype".
The file's last `holdout` share of windows is not trained on: its mean loss is measured every `validate_every` steps
and at the end (MLflow's `val_loss`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Subset

import parcae


class Embed(nn.Module):
    def __init__(self, vocab: int, block_size: int, hidden: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, hidden), nn.Embedding(block_size, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


class CausalBlock(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, batch_first=True,
                                                norm_first=True)  # fmt: skip

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(h.shape[1], device=h.device, dtype=h.dtype)
        return self.layer(h, src_mask=mask, is_causal=True)


class Head(nn.Module):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, vocab)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(h))


def spec(tokens: str = "README.md", block_size: int = 32, vocab: int = 256, token_dtype: str = "uint8",
         hidden: int = 64, heads: int = 4, blocks: int = 2, batch_size: int = 16, lr: float = 3e-3,
         dtype: str = "float32", seed: int = 0, holdout: float = 0.1, validate_every: int = 50,
         patience: int | None = None, min_delta: float = 0.0, monitor: str = "loss",
         mode: str = "min") -> parcae.TrainSpec:  # fmt: skip
    windows = parcae.TokenWindows(tokens, block_size, dtype=token_dtype)
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout {holdout!r} must be a share of the windows in [0, 1)")
    held = int(len(windows) * holdout)  # the last windows of the file, validated on, never trained on
    train = Subset(windows, range(len(windows) - held))
    dt = getattr(torch, dtype)

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # a SUM over rows of per-row means
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / targets.shape[1]

    def next_token(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # the same: rows' shares, summed
        return ((logits.argmax(-1) == targets).sum(1).double() / targets.shape[1]).sum()

    # the held-out windows: their loss, and the share of next tokens the model ranks first
    rest = Subset(windows, range(len(train), len(windows)))
    metrics = {"next_token_accuracy": next_token}
    # (`patience`: stop once the held-out loss stops improving — or the score `monitor` names, in its `mode`: e.g.
    # "next_token_accuracy", "max"; the best checkpoint is picked by the same score)
    held_out = (parcae.Validation.over(rest, 64, every=validate_every, metrics=metrics, patience=patience,
                                       min_delta=min_delta, monitor=monitor, mode=mode)
                if held else None)  # fmt: skip
    return parcae.TrainSpec(
        layers=[
            parcae.Layer("embed", lambda: Embed(vocab, block_size, hidden).to(dt)),
            *(parcae.Layer(f"block.{i}", lambda: CausalBlock(hidden, heads).to(dt)) for i in range(blocks)),
            parcae.Layer("head", lambda: Head(hidden, vocab).to(dt)),
        ],  # fmt: skip
        batch=parcae.StepSampler(train, batch_size, seed=seed),
        loss=loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr),
        clip_grad_norm=1.0,
        validation=held_out,
    )
