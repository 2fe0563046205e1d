"""A small CNN on scikit-learn's handwritten digits (8x8 images, 10 classes), as a parcae training spec.

Copy this file to train your own model: a spec is an ordered list of named layer factories, a batch function of the
step, a loss that is a SUM over rows, and an optimiser per layer. Train it under a replayed trace with

    parcae train --model examples/digits_cnn.py:spec --trace p3 --workers 4 --steps 200

(`--model-args '{"channels": 16, "dtype": "float64"}'` changes its arguments).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import parcae


def digits(dtype: torch.dtype) -> torch.utils.data.TensorDataset:
    """The 1,797 digits bundled with scikit-learn (no download), pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=dtype).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    return torch.utils.data.TensorDataset(images, torch.tensor(data.target, dtype=torch.long))


def spec(channels: int = 8, batch_size: int = 32, lr: float = 1e-2, dtype: str = "float32",
         seed: int = 0, autocast: str | None = None, fused: bool = False) -> parcae.TrainSpec:  # fmt: skip
    """Conv -> conv + pool -> hidden -> classes: four layers, so pipelines of up to four stages. `fused`: torch's
    fused AdamW (one kernel a step; what a GPU job would pick)."""
    dt = getattr(torch, dtype)

    def conv(c_in: int, c_out: int, pool: bool) -> nn.Module:
        layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()]
        return nn.Sequential(*layers, *([nn.MaxPool2d(2)] if pool else [])).to(dt)

    return parcae.TrainSpec(
        layers=[
            parcae.Layer("conv1", lambda: conv(1, channels, pool=False)),
            parcae.Layer("conv2", lambda: conv(channels, 2 * channels, pool=True)),  # -> (2C, 4, 4)
            parcae.Layer("hidden", lambda: nn.Sequential(nn.Flatten(), nn.Linear(32 * channels, 64), nn.ReLU()).to(dt)),
            parcae.Layer("classes", lambda: nn.Linear(64, 10).to(dt)),
        ],
        batch=parcae.StepSampler(digits(dt), batch_size, seed=seed),
        loss=lambda logits, labels: F.cross_entropy(logits, labels, reduction="sum"),
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr, fused=True if fused else None),
        autocast=autocast,  # e.g. "bfloat16": mixed precision (parameters stay in `dtype`); "float16" scales the loss
    )
