"""The anchor's rule against its alternatives, on every training trace but p3 (how its constants were chosen).

`forecasting.features` forecasts around an *anchor*: persistence, or recovery towards a recent maximum, chosen
per step ahead from the trace's own past. This scores the anchor alone (no learnt model) and the rules it was
chosen over, side by side, by MAE over h = 1..12 as a ratio to persistence's on the same origins (every origin
from the backtest's first on). p3, the test trace, is left out: choosing on it would be tuning on the test.

* ``shipped``: `features.anchor_rule` (Hedge weights per step, persistence's loss discounted and its prior
  weight raised, weighted median);
* ``one choice for all steps``: the rule it replaced (the expert with the least error over all 12 steps, a
  reverting one only if it beat persistence by 30%);
* ``hard choice per step``: per step, the least-error expert, a reverting one only if it beat persistence by 30%;
* ``weighted mean``: the Hedge weights without discount or prior, their mean instead of the median;
* ``no margin`` / ``prior 1``: the shipped rule without persistence's discount, or without its prior weight.

Needs the traces under ../shared/traces (skips when they are absent).

    python benchmarks/forecast_anchor.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting import DEFAULT_START, features, training_corpus  # noqa: E402

H = features.ANCHOR_STEPS


def hard(loss: np.ndarray, margin: float = 0.3) -> np.ndarray:
    """The least-loss expert, a reverting one only if it beat persistence by ``margin``."""
    scaled = loss.copy()
    scaled[1:] /= 1.0 - margin
    return np.argmin(scaled, axis=0)


def one_choice(n: np.ndarray) -> np.ndarray:
    experts = features.anchor_experts(n)
    total = sum(features.step_losses(n, experts, h, lag=H) for h in range(1, H + 1))
    return np.repeat(experts[hard(total), np.arange(len(n))][:, None], H, axis=1)


def per_step(n: np.ndarray, pick: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    experts = features.anchor_experts(n)
    return np.stack([pick(features.step_losses(n, experts, h), experts) for h in range(1, H + 1)], axis=1)


def weighted_mean(loss: np.ndarray, experts: np.ndarray) -> np.ndarray:
    weight = features.hedge_weights(loss, margin=0.0, prior=1.0)
    return (weight * experts).sum(axis=0) / weight.sum(axis=0)


def median_with(**hedge: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return lambda loss, experts: features.weighted_median(features.hedge_weights(loss, **hedge), experts)


RULES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "shipped": lambda n: features.anchor_rule(n)[0].astype(np.float64),
    "one choice for all steps": one_choice,
    "hard choice per step": lambda n: per_step(n, lambda loss, e: e[hard(loss), np.arange(e.shape[1])]),
    "weighted mean": lambda n: per_step(n, weighted_mean),
    "no margin": lambda n: per_step(n, median_with(margin=0.0)),
    "prior 1": lambda n: per_step(n, median_with(prior=1.0)),
}


def ratios(n: np.ndarray, forecast: np.ndarray) -> tuple[float, float]:
    """(MAE over all steps, MAE one step ahead), each over persistence's, on every backtest origin."""
    origins = np.arange(DEFAULT_START, len(n) - H)
    truth = n[origins[:, None] + np.arange(1, H + 1)[None, :]]
    err = np.abs(truth - forecast[origins]).mean(axis=0)
    base = np.abs(truth - n[origins][:, None]).mean(axis=0)
    return float(err.mean() / base.mean()), float(err[0] / base[0]) if base[0] > 0 else 1.0


def main() -> int:
    corpus = training_corpus(exclude=["p3"])
    if len(corpus) < 2:
        print("skipped: the traces under ../shared/traces are absent (only the bundled ones are here)")
        return 0
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for name, trace in corpus.items():
        n = trace["available"].to_numpy(dtype=np.int64)
        table[name] = {rule: ratios(n, f(n)) for rule, f in RULES.items()}
        print(f"scored {name}", flush=True)
    width = max(map(len, table))
    print(f"\nMAE / persistence's, h = 1..{H} (the anchor alone, p3 left out)")
    print(f"{'trace':{width}s}  " + "  ".join(RULES))
    for name, row in table.items():
        print(f"{name:{width}s}  " + "  ".join(f"{row[r][0]:{len(r)}.3f}" for r in RULES))
    for label, k, agg in (("mean", 0, np.mean), ("worst", 0, np.max), ("mean, h = 1", 1, np.mean)):
        print(
            f"{label:{width}s}  "
            + "  ".join(f"{agg([row[r][k] for row in table.values()]):{len(r)}.3f}" for r in RULES)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
