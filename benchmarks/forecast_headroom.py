"""Headroom on a test trace: how far below persistence could forecasters of our kind get, with hindsight?

The goal for p3 is a mean MAE <= 0.8 x the reference ARIMA's, which lies below persistence's. This puts the
shipped LightGBM (trained without the test trace) beside forecasters that are *allowed to cheat*, on the same
origins, so that the distance to the goal can be read as "what our features and anchor could express at best":

* ``lightgbm, first half seen`` / ``first half only``: trained on the corpus plus the trace's first half, or
  on that half alone, scored on the origins of its second half: what training data like this trace would buy;
* ``lightgbm, trace seen``: trained on the corpus plus the whole trace, scored on it (in-sample);
* ``best recovery window per step``: for each step h the one of persistence and "back to the maximum of the
  last w intervals" (w in 3..60) with the lowest MAE on the trace itself.

Rows are MAE over h = 1..horizon, as a ratio to persistence's on the same origins. None of these numbers may
be used to choose anything: they are hindsight bounds, here to say what the goal would take.

    python benchmarks/forecast_headroom.py [--trace p3] [--horizon 12]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting import DEFAULT_START, LightGbmForecaster, load_trace, training_corpus  # noqa: E402

WINDOWS = (3, 6, 12, 30, 60)


def truth_at(n: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
    return n[origins[:, None] + np.arange(1, horizon + 1)[None, :]].astype(np.float64)


def lgbm_points(model: LightGbmForecaster, table: pd.DataFrame, origins: np.ndarray, horizon: int) -> np.ndarray:
    return np.stack([f.point for f in model.predict_many(table, origins, horizon)])


def head(table: pd.DataFrame, rows: int) -> pd.DataFrame:
    out = table.iloc[:rows].reset_index(drop=True)
    out.attrs = dict(table.attrs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="p3")
    p.add_argument("--horizon", type=int, default=12)
    args = p.parse_args(argv)
    H = args.horizon
    test = load_trace(args.trace)
    corpus = list(training_corpus(exclude=[args.trace]).values())
    n = test["available"].to_numpy(dtype=np.int64)
    every = np.arange(DEFAULT_START, len(n) - H)
    half = len(n) // 2
    second = every[every > half]  # origins whose features and targets are all after the seen half's end
    print(
        f"{args.trace}: {len(every)} origins (second half: {len(second)}), horizon {H}, corpus {len(corpus)} traces",
        flush=True,
    )

    def ratio(pred: np.ndarray, origins: np.ndarray) -> tuple[float, float, float]:
        truth = truth_at(n, origins, H)
        mae = np.abs(truth - pred).mean()
        base = np.abs(truth - n[origins][:, None]).mean()
        return float(mae), float(base), float(mae / base)

    rows: list[tuple[str, str, tuple[float, float, float]]] = []
    shipped = LightGbmForecaster(horizon_max=H).fit(corpus)
    rows.append(("lightgbm, trace unseen (shipped)", "all", ratio(lgbm_points(shipped, test, every, H), every)))
    rows.append(("lightgbm, trace unseen (shipped)", "2nd half", ratio(lgbm_points(shipped, test, second, H), second)))
    # the seen half ends at row `half`: its last training targets are rows <= half
    halfway = LightGbmForecaster(horizon_max=H).fit([*corpus, head(test, half + 1)])
    rows.append(("lightgbm, first half seen", "2nd half", ratio(lgbm_points(halfway, test, second, H), second)))
    # the same half as the only training data (the corpus's rows outnumber it 30 to 1 above); one trace, so
    # the tails stay uncalibrated, which the point forecast does not use
    alone = LightGbmForecaster(horizon_max=H).fit([head(test, half + 1)])
    rows.append(("lightgbm, first half only", "2nd half", ratio(lgbm_points(alone, test, second, H), second)))
    seen = LightGbmForecaster(horizon_max=H).fit([*corpus, test])
    rows.append(("lightgbm, trace seen (in-sample)", "all", ratio(lgbm_points(seen, test, every, H), every)))
    truth = truth_at(n, every, H)
    experts = {0: n.astype(np.float64)}
    experts.update({w: pd.Series(n).rolling(w, min_periods=1).max().to_numpy() for w in WINDOWS})
    best = np.empty((len(every), H))
    for h in range(H):
        errs = {w: np.abs(truth[:, h] - e[every]).mean() for w, e in experts.items()}
        best[:, h] = experts[min(errs, key=errs.get)][every]
    rows.append(("best recovery window per step (hindsight)", "all", ratio(best, every)))

    print(f"\n{'forecaster':44s} {'origins':>9s} {'MAE':>7s} {'persistence':>12s} {'ratio':>7s}")
    for name, where, (mae, base, r) in rows:
        print(f"{name:44s} {where:>9s} {mae:7.3f} {base:12.3f} {r:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
