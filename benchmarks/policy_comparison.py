"""Policy comparison on the p3 trace's four one-hour segments, for every bundled model.

Runs the trace-driven simulator with every policy on the segments the Parcae reference evaluated
(hours 1.5-2.5, 5.5-6.5, 8-9, 10-11) and over the whole trace, and prints, per model and segment, samples trained
relative to `ideal`, side by side with the reference simulator's numbers where parcae-reference §G.3 has them.
A policy that trains nothing on a segment "cannot make progress" there.

    python benchmarks/policy_comparison.py [--models gpt-1.5b,bert] [--look-ahead 8] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting import load_trace  # noqa: E402
from liveput import POLICY_NAMES, SimulationConfig, simulate  # noqa: E402

SEGMENTS = {
    "hl 1.5-2.5": (90, 149),
    "hh 5.5-6.5": (330, 389),
    "lh 8-9": (480, 539),
    "ll 10-11": (600, 659),
    "whole trace": (0, 682),
}
# parcae-reference §G.3 (reference simulator, K = 8): samples of Ideal, Tput-opt, Liveput-truth, Liveput-predict*
REFERENCE = {
    ("gpt-1.5b", "hl 1.5-2.5"): (149502, 124158, 139426, 134765),
    ("gpt-1.5b", "hh 5.5-6.5"): (143547, 107545, 134664, 117121),
    ("gpt-1.5b", "lh 8-9"): (108433, 73255, 100321, 94177),
    ("gpt-1.5b", "ll 10-11"): (103787, 98820, 101891, 99649),
    ("gpt-6.7b", "hl 1.5-2.5"): (38663, 25551, 36347, 35079),
    ("gpt-6.7b", "hh 5.5-6.5"): (36835, 15195, 32665, 27755),
    ("gpt-1.5b", "whole trace"): (1506024, 1171346, 1413651, 1302671),
    ("bert", "whole trace"): (18585498, 16680333, 18039806, 17514715),
    ("resnet152", "whole trace"): (94554282, 86120323, 91909145, 88620726),
    ("vgg19", "whole trace"): (66484452, 58534009, 63316546, 60974047),
}


def p3_arguments(description: str) -> argparse.ArgumentParser:
    """The options of a benchmark over the p3 segments: models, look-ahead, segments, JSON output."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--models", default="gpt-1.5b,gpt-6.7b,bert,resnet152,vgg19")
    ap.add_argument("--look-ahead", type=int, default=8)
    ap.add_argument("--segments", default=",".join(SEGMENTS), help="comma-separated segment names")
    ap.add_argument("--json", type=Path)
    return ap


def main() -> None:
    args = p3_arguments(__doc__.splitlines()[0]).parse_args()
    wanted = [s.strip() for s in args.segments.split(",")]
    trace = load_trace("p3")
    out: dict = {}
    policies = [p for p in POLICY_NAMES if p != "ideal"]
    for model in args.models.split(","):
        print(f"\n## {model} (K={args.look_ahead}) — samples relative to ideal; [ref] = reference simulator")
        header = (
            f"{'segment':<12} {'ideal':>10} " + " ".join(f"{p:>13}" for p in policies) + "  ref-truth ref-tput  secs"
        )
        print(header)
        for seg in wanted:
            a, b = SEGMENTS[seg]
            t0 = time.perf_counter()
            res = simulate(
                trace,
                ["ideal", *policies],
                SimulationConfig(model=model, look_ahead=args.look_ahead),
                first_interval=a,
                last_interval=b,
            )
            ideal = res["ideal"].samples
            ratios = {p: (res[p].samples / ideal if ideal > 0 else float("nan")) for p in policies}
            ref = REFERENCE.get((model, seg))
            ref_txt = f"{ref[2] / ref[0]:>9.3f} {ref[1] / ref[0]:>8.3f}" if ref else f"{'-':>9} {'-':>8}"
            cells = " ".join(f"{ratios[p]:>13.3f}" if res[p].samples > 0 else f"{'no progress':>13}" for p in policies)
            print(f"{seg:<12} {ideal:>10,.0f} {cells}  {ref_txt} {time.perf_counter() - t0:5.1f}", flush=True)
            out.setdefault(model, {})[seg] = {
                "ideal_samples": ideal,
                "ratio_to_ideal": ratios,
                "samples": {p: r.samples for p, r in res.items()},
                "reference": dict(zip(("ideal", "tput_opt", "truth", "predict"), ref)) if ref else None,
            }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
