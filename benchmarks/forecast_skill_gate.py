"""The online skill gate against persistence and the ungated model, on every trace of the corpus left out in turn.

For each trace of the training corpus (`forecasting.training_corpus`: the bundled traces and those under
../shared/traces), LightGBM is fitted on all the others and forecasts the held-out trace from every origin; the
skill gate (`forecasting.skill_gate.gate_choices`) then keeps, per step, the model's point or persistence's from
that trace's own past only. Rows: mean MAE over h = 1..horizon on the backtest's origins (from
`forecasting.DEFAULT_START`), as a ratio to persistence's on the same origins, for the ungated model, the shipped
gate and its variants (window, margin); the last columns are the 10-90% coverage (the gate keeps the model's
quantiles), plain ("inside [q10, q90]") and tie-aware (`forecasting.pit_coverage`: the non-randomised PIT for
counts), and the share of (origin, step) forecasts where the gate kept the model.

The gate's constants are chosen on the traces other than p3 (the test trace); p3 is reported, never used to choose.
Each fit is cached under ``--cache`` (default: a temporary folder), so the variants cost no refit.

    python benchmarks/forecast_skill_gate.py [--horizon 12] [--traces NAME,...] [--cache DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting import DEFAULT_START, LightGbmForecaster, pit_coverage, training_corpus  # noqa: E402
from forecasting.skill_gate import (  # noqa: E402
    GATE_MARGIN,
    GATE_MIN_ORIGINS,
    GATE_WINDOW,
    gate_choices,
    past_forecasts,
    past_points,
)

VARIANTS = {
    "shipped": {},
    "margin 0": {"margin": 0.0},
    "margin 0.05": {"margin": 0.05},
    "margin 0.2": {"margin": 0.2},
    "window 100": {"window": 100},
    "window 400": {"window": 400},
}


def held_out_forecasts(name: str, corpus: dict, horizon: int, cache: Path) -> dict[str, np.ndarray]:
    path = cache / f"{name}-h{horizon}.npz"
    if path.is_file():
        cached = dict(np.load(path))
        if "q50" in cached:  # (a cache of an earlier version of this benchmark has no median: refit)
            return cached
    table = corpus[name]
    model = LightGbmForecaster(horizon_max=max(12, horizon)).fit([t for k, t in corpus.items() if k != name])
    origins = np.arange(0, len(table) - horizon)
    forecasts = past_forecasts(model, table, origins, horizon)
    out = {
        "n": table["available"].to_numpy(dtype=np.float64),
        "points": past_points(forecasts, len(table), origins),
        **{
            f"q{round(q * 100)}": past_points(forecasts, len(table), origins, lambda f, q=q: f.quantiles[q])
            for q in (0.1, 0.5, 0.9)
        },
    }
    np.savez(path, **out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--horizon", type=int, default=12)
    ap.add_argument("--traces", default=None, help="comma-separated names (default: the whole corpus)")
    ap.add_argument("--cache", type=Path, default=None)
    args = ap.parse_args()
    H = args.horizon
    corpus = training_corpus()
    names = args.traces.split(",") if args.traces else list(corpus)
    cache = args.cache or Path(tempfile.mkdtemp(prefix="skill-gate-"))
    cache.mkdir(parents=True, exist_ok=True)
    print(f"corpus: {len(corpus)} traces; held out in turn: {len(names)}; horizon {H}; cache {cache}", flush=True)
    print(f"shipped gate: window {GATE_WINDOW}, margin {GATE_MARGIN}, min_origins {GATE_MIN_ORIGINS}\n")
    header = f"{'trace':32s} {'persist. MAE':>12s} {'lightgbm':>9s} " + " ".join(f"{v:>12s}" for v in VARIANTS)
    print(header + f" {'coverage':>9s} {'pit cov.':>9s} {'model kept':>10s}")
    ratios: dict[str, list[float]] = {k: [] for k in ["lightgbm", *VARIANTS]}
    for name in names:
        d = held_out_forecasts(name, corpus, H, cache)
        n, points = d["n"], d["points"]
        origins = np.arange(DEFAULT_START, len(n) - H)
        truth = n[origins[:, None] + np.arange(1, H + 1)[None, :]]
        last = n[origins][:, None]
        base = float(np.abs(truth - last).mean())
        model = points[origins]
        cells = {"lightgbm": float(np.abs(truth - model).mean())}
        kept = 0.0
        for label, params in VARIANTS.items():
            chosen = gate_choices(n, points, **params)[origins]
            cells[label] = float(np.abs(truth - np.where(chosen, model, last)).mean())
            if label == "shipped":
                kept = float(chosen.mean())
        coverage = float(((truth >= d["q10"][origins]) & (truth <= d["q90"][origins])).mean())
        tie_aware = pit_coverage(truth, {q / 100: d[f"q{q}"][origins] for q in (10, 50, 90)})
        row = f"{name:32s} {base:12.3f} "
        for label, mae in cells.items():
            r = mae / base if base > 0 else 1.0
            if name != "p3":
                ratios[label].append(r)
            row += f"{r:{9 if label == 'lightgbm' else 12}.4f} "
        print(row + f"{coverage:9.3f} {tie_aware:9.3f} {kept:10.3f}", flush=True)
    if any(ratios.values()):
        print(f"\n{'without p3: mean ratio':32s} {'':12s} " + " ".join(
            f"{np.mean(v):{9 if k == 'lightgbm' else 12}.4f}" for k, v in ratios.items()))  # fmt: skip
        print(f"{'without p3: worst ratio':32s} {'':12s} " + " ".join(
            f"{np.max(v):{9 if k == 'lightgbm' else 12}.4f}" for k, v in ratios.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
