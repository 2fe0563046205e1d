"""Decision quality: what each forecaster's plans train, relative to plans made with the true future.

Forecast error only matters through the plans it leads to. For every forecaster this runs the `parcae`
policy on the p3 trace's four one-hour segments (GPT-1.5B, K = 8) and prints its samples relative to
`parcae-oracle` (the same planner fed the true next K intervals), side by side in one run. Every
forecaster is trained without p3 (leave-one-trace-out on `forecasting.corpus.training_corpus`), so p3 is
never used for fitting or tuning.

    python benchmarks/forecast_decision_quality.py [--forecasters persistence,ets,arima,lightgbm] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting.baselines import ArimaForecaster, EtsForecaster, PersistenceForecaster  # noqa: E402
from forecasting.corpus import training_corpus  # noqa: E402
from forecasting.lgbm import LightGbmForecaster  # noqa: E402
from forecasting.traces import load_trace  # noqa: E402
from liveput.simulator import SimulationConfig, simulate  # noqa: E402

SEGMENTS = {"hl 1.5-2.5": (90, 149), "hh 5.5-6.5": (330, 389), "lh 8-9": (480, 539), "ll 10-11": (600, 659)}
FACTORIES = {
    "persistence": PersistenceForecaster,
    "ets": EtsForecaster,
    "arima": ArimaForecaster,
    "lightgbm": LightGbmForecaster,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forecasters", default="persistence,ets,arima,lightgbm")
    ap.add_argument("--model", default="gpt-1.5b")
    ap.add_argument("--look-ahead", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trace = load_trace("p3")
    corpus = list(training_corpus(exclude=("p3",)).values())
    print(f"training corpus without p3: {len(corpus)} traces")
    names = args.forecasters.split(",")
    fitted = {}
    for name in names:
        t0 = time.perf_counter()
        fitted[name] = FACTORIES[name]().fit(corpus)
        print(f"fitted {name} in {time.perf_counter() - t0:.1f} s", flush=True)
    config = SimulationConfig(model=args.model, look_ahead=args.look_ahead)
    rows = {}
    print(f"\n{'segment':<12} {'oracle':>9} " + " ".join(f"{n:>12}" for n in names) + "   (parcae samples / parcae-oracle samples)")
    for seg, (a, b) in SEGMENTS.items():
        oracle = simulate(trace, ["parcae-oracle"], config, first_interval=a, last_interval=b)["parcae-oracle"].samples
        ratios = {}
        for name in names:
            res = simulate(trace, ["parcae"], config, first_interval=a, last_interval=b, forecaster=fitted[name])
            ratios[name] = res["parcae"].samples / oracle
        rows[seg] = {"oracle_samples": oracle, "ratio_to_oracle": ratios}
        print(f"{seg:<12} {oracle:>9,.0f} " + " ".join(f"{ratios[n]:>12.3f}" for n in names), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
