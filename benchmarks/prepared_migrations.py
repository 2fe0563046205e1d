"""Migrations off the critical path, simulated: parcae against `ideal` with migrations prepared in the background.

For each model and each of the p3 trace's one-hour segments (those of the Parcae reference) and the whole trace, the
trace-driven simulator runs `parcae` (persistence forecasts, as shipped) beside `ideal` under each migration setting
(`liveput.Preparation`), all in one run:

    full stop   the reference's model: every migration stops training for its whole cost (`--full-stop`)
    AWS 120 s   planned re-shapes, additions and noticed preemptions prepared, AWS's two-minute notice
    GCP 30 s    the same with GCP's 30 s notice
    no notice   every preemption a kill; planned re-shapes and additions still prepared

and, to say where the gain comes from, one trigger prepared at a time under AWS's notice (`planned only`, `addition
only`, `notice only`). Each cell is samples trained / ideal's.

    python benchmarks/prepared_migrations.py [--models gpt-1.5b,bert] [--segments "lh 8-9"] [--json OUT.json]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.policy_comparison import SEGMENTS, p3_arguments  # noqa: E402  (the reference's p3 segments)
from forecasting import load_trace  # noqa: E402
from liveput import FULL_STOP, CostModel, Preparation, SimulationConfig, Trigger, load_profile, simulate  # noqa: E402

SETTINGS = {
    "full stop": FULL_STOP,
    "AWS 120 s": Preparation(notice_s=120.0),
    "GCP 30 s": Preparation(notice_s=30.0),
    "no notice": Preparation(notice_s=0.0),
    "planned only": Preparation(triggers=frozenset({Trigger.PLANNED})),
    "addition only": Preparation(triggers=frozenset({Trigger.ADDITION})),
    "notice only": Preparation(triggers=frozenset({Trigger.NOTICE})),
}
GOAL = 0.95


def main() -> None:
    args = p3_arguments(__doc__.splitlines()[0]).parse_args()
    wanted = [s.strip() for s in args.segments.split(",")]
    trace = load_trace("p3")
    out: dict = {}
    for model in args.models.split(","):
        profile = load_profile(model)
        config = SimulationConfig(model=model, look_ahead=args.look_ahead)
        print(f"\n## {model} (K={args.look_ahead}) — parcae's samples / ideal's; * = below {GOAL}")
        print(f"{'segment':<12} " + " ".join(f"{name:>13}" for name in SETTINGS) + "   secs")
        for seg in wanted:
            a, b = SEGMENTS[seg]
            t0 = time.perf_counter()
            ideal = simulate(trace, ["ideal"], config, first_interval=a, last_interval=b, profile=profile)
            best = ideal["ideal"].samples
            row: dict[str, float] = {}
            for name, prep in SETTINGS.items():
                cost = CostModel.reference(model, prep)
                res = simulate(trace, ["parcae"], config, first_interval=a, last_interval=b, profile=profile,
                               cost=cost)  # fmt: skip
                row[name] = res["parcae"].samples / best if best > 0 else float("nan")
            cells = " ".join(f"{v:>12.3f}{'*' if v < GOAL else ' '}" for v in row.values())
            print(f"{seg:<12} {cells} {time.perf_counter() - t0:6.1f}", flush=True)
            out.setdefault(model, {})[seg] = {"ideal_samples": best, "ratio_to_ideal": row}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"settings": {k: v.describe() for k, v in SETTINGS.items()}, **out},
                                        indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
