"""Decision quality: what each forecaster's plans train, relative to plans made with the true future.

Forecast error only matters through the plans it leads to. For every forecaster this runs the `parcae`
policy (GPT-1.5B, K = 8) and prints its samples relative to `parcae-oracle` (the same planner fed the
true next K intervals), side by side in one run.

* ``--segments p3`` (default, the test): the p3 trace's four one-hour segments. Every forecaster is
  trained without p3 (leave-one-trace-out on `forecasting.corpus.training_corpus`), so p3 is never used
  for fitting or tuning.
* ``--segments validation``: how design choices that only matter to the planner (e.g. the per-interval
  law of (n_in, n_out) a `Forecast` derives) are chosen without p3. On each non-p3 trace the planner can
  run on, the two busiest non-overlapping one-hour windows (most intervals with an event; a fixed rule),
  with forecasters trained on the corpus without p3 *and* without that trace. The summary line is the
  oracle-weighted ratio (total samples / total oracle samples).

``point`` is the simulator's built-in persistence (the last N, no uncertainty), for reference.

    python benchmarks/forecast_decision_quality.py [--forecasters point,persistence,ets,arima,lightgbm]
        [--segments p3|validation] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting import FORECASTERS, fit_forecaster, load_trace, training_corpus  # noqa: E402
from liveput import SimulationConfig, simulate  # noqa: E402

SEGMENTS = {"hl 1.5-2.5": (90, 149), "hh 5.5-6.5": (330, 389), "lh 8-9": (480, 539), "ll 10-11": (600, 659)}
#: Non-p3 traces with enough instances for GPT-1.5B (N >= 6) and one-hour windows with events.
VALIDATION_TRACES = (
    "gcp-v100",
    "aws2020-g4dn-us-east-1c",
    "aws2020-g4dn-us-east-1d",
    "aws2020-p2",
    "skypilot-16node-us-east-2b",
)


def busiest_windows(table, k: int = 2, length: int = 60) -> dict[str, tuple[int, int]]:
    """The ``k`` non-overlapping ``length``-interval windows with most event intervals (after a first hour of past)."""
    event = ((table["n_in"].to_numpy() > 0) | (table["n_out"].to_numpy() > 0)).astype(np.int64)
    csum = np.concatenate([[0], np.cumsum(event)])
    score = csum[length:] - csum[:-length]
    picks: list[int] = []
    for i in np.argsort(-score, kind="stable"):
        if i >= length and all(abs(int(i) - j) >= 2 * length for j in picks):
            picks.append(int(i))
        if len(picks) == k:
            break
    interval = table["interval"].to_numpy()
    return {
        f"{int(interval[i])}-{int(interval[i + length - 1])}": (int(interval[i]), int(interval[i + length - 1]))
        for i in sorted(picks)
    }


def fit_all(names: list[str], corpus: list, horizon: int) -> dict:
    fitted = {}
    for name in names:
        if name == "point":
            fitted[name] = None  # the simulator's built-in persistence
            continue
        t0 = time.perf_counter()
        fitted[name] = fit_forecaster(name, corpus, horizon)
        print(f"fitted {name} in {time.perf_counter() - t0:.1f} s", flush=True)
    return fitted


def run_segments(trace, segments: dict, fitted: dict, config: SimulationConfig, label: str = "") -> dict:
    rows = {}
    for seg, (a, b) in segments.items():
        oracle = simulate(trace, ["parcae-oracle"], config, first_interval=a, last_interval=b)["parcae-oracle"].samples
        ratios = {}
        for name, model in fitted.items():
            res = simulate(trace, ["parcae"], config, first_interval=a, last_interval=b, forecaster=model)
            ratios[name] = res["parcae"].samples / oracle if oracle > 0 else float("nan")
        rows[f"{label}{seg}"] = {"oracle_samples": oracle, "ratio_to_oracle": ratios}
        print(f"{label + seg:<36} {oracle:>9,.0f} " + " ".join(f"{ratios[n]:>12.3f}" for n in fitted), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forecasters", default="persistence,ets,arima,lightgbm")
    ap.add_argument("--segments", choices=("p3", "validation"), default="p3")
    ap.add_argument("--model", default="gpt-1.5b")
    ap.add_argument("--look-ahead", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    names = args.forecasters.split(",")
    unknown = [n for n in names if n != "point" and n not in FORECASTERS]
    if unknown:
        ap.error(f"unknown forecaster {unknown[0]!r}; choose from point, {', '.join(FORECASTERS)}")
    config = SimulationConfig(model=args.model, look_ahead=args.look_ahead)
    header = f"\n{'segment':<36} {'oracle':>9} " + " ".join(f"{n:>12}" for n in names)
    if args.segments == "p3":
        trace = load_trace("p3")
        corpus = list(training_corpus(exclude=("p3",)).values())
        print(f"training corpus without p3: {len(corpus)} traces")
        fitted = fit_all(names, corpus, args.look_ahead)
        print(header + "   (parcae samples / parcae-oracle samples)")
        rows = run_segments(trace, SEGMENTS, fitted, config)
    else:
        full = training_corpus(exclude=("p3",))
        rows = {}
        for held in VALIDATION_TRACES:
            print(f"\n{held}: training on {len(full) - 1} traces (without p3 and {held})")
            fitted = fit_all(names, [t for n, t in full.items() if n != held], args.look_ahead)
            print(header)
            rows.update(run_segments(full[held], busiest_windows(full[held]), fitted, config, f"{held} "))
        weight = np.array([r["oracle_samples"] for r in rows.values()])
        summary = {
            n: float(np.sum(weight * [r["ratio_to_oracle"][n] for r in rows.values()]) / weight.sum()) for n in names
        }
        print("oracle-weighted ratio: " + " ".join(f"{n}={v:.4f}" for n, v in summary.items()))
        rows["oracle_weighted"] = summary
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
