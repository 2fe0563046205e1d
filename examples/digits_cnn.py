"""A small CNN on scikit-learn's handwritten digits (8x8 images, 10 classes), as a parcae training spec.

Copy this file to train your own model: a spec is an ordered list of named layer factories, a batch function of the
step, a loss that is a SUM over rows, and an optimiser per layer. Train it under a replayed trace with

    parcae train --model examples/digits_cnn.py:spec --trace p3 --workers 4 --steps 200

(`--model-args '{"channels": 16, "dtype": "float64"}'` changes its arguments). The last `holdout` digits are not
trained on: their mean loss is measured every `validate_every` steps and at the end (MLflow's `val_loss`); with
`patience`, the job stops early once that loss — or the score `monitor` names, e.g. `{"patience": 3, "monitor":
"accuracy", "mode": "max"}` — has not improved for `patience` measurements in a row.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import parcae


def digits(dtype: torch.dtype, holdout: int) -> tuple[TensorDataset, TensorDataset]:
    """The 1,797 digits bundled with scikit-learn (no download), pixels scaled to [0, 1]: (the first 1,797 -
    `holdout` to train on, the last `holdout` to validate on)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=dtype).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    labels = torch.tensor(data.target, dtype=torch.long)
    cut = len(labels) - holdout
    return TensorDataset(images[:cut], labels[:cut]), TensorDataset(images[cut:], labels[cut:])


def correct(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The digits classified right, of these rows (the validation's "accuracy": parcae divides by the rows)."""
    return (logits.argmax(1) == labels).sum()


def spec(channels: int = 8, batch_size: int = 32, lr: float = 1e-2, dtype: str = "float32",
         seed: int = 0, autocast: str | None = None, fused: bool = False, holdout: int = 297,
         validate_every: int = 50, patience: int | None = None, min_delta: float = 0.0, monitor: str = "loss",
         mode: str = "min", init: str | None = None) -> parcae.TrainSpec:  # fmt: skip
    """Conv -> conv + pool -> hidden -> classes: four layers, so pipelines of up to four stages. `fused`: torch's
    fused AdamW (one kernel a step; what a GPU job would pick). `holdout`: the digits kept for validation (0: none);
    `patience`, `min_delta`, `monitor`, `mode`: stop early (`parcae.Validation`; None: train every step). `init`: a
    warm start, from what `parcae export` wrote of an earlier job (or its checkpoint folder; `parcae.warm_start`)."""
    if not 0 <= holdout < 1797:
        raise ValueError(f"holdout {holdout!r}: keep between 0 and 1,796 of the 1,797 digits for validation")
    dt = getattr(torch, dtype)
    train, held_out = digits(dt, holdout)

    def conv(c_in: int, c_out: int, pool: bool) -> nn.Module:
        layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()]
        return nn.Sequential(*layers, *([nn.MaxPool2d(2)] if pool else [])).to(dt)

    trained = parcae.TrainSpec(
        layers=[
            parcae.Layer("conv1", lambda: conv(1, channels, pool=False)),
            parcae.Layer("conv2", lambda: conv(channels, 2 * channels, pool=True)),  # -> (2C, 4, 4)
            parcae.Layer("hidden", lambda: nn.Sequential(nn.Flatten(), nn.Linear(32 * channels, 64), nn.ReLU()).to(dt)),
            parcae.Layer("classes", lambda: nn.Linear(64, 10).to(dt)),
        ],
        batch=parcae.StepSampler(train, batch_size, seed=seed),
        loss=lambda logits, labels: F.cross_entropy(logits, labels, reduction="sum"),
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr, fused=True if fused else None),
        autocast=autocast,  # e.g. "bfloat16": mixed precision (parameters stay in `dtype`); "float16" scales the loss
        # the held-out digits in order, 128 a batch, scored every `validate_every` steps and at the end: the loss,
        # and the share of digits classified right (a metric is a SUM over the rows, as the loss)
        validation=parcae.Validation.over(
            held_out,
            128,
            every=validate_every,
            metrics={"accuracy": correct},
            patience=patience,
            min_delta=min_delta,
            monitor=monitor,
            mode=mode,
        )
        if holdout
        else None,
    )
    return trained if init is None else parcae.warm_start(trained, init)
