"""Ablation: how much of parcae-oracle's distance to the reference's truth mode is the repartition bug?

The reference's repartition cost overwrote the running sum of missing parameters with the last new
stage's (`total_params_need = num_params`, parcae-reference §D.2, §I.6), so a pipeline migration — and
the start of a segment, a repartition from nothing — only paid for the last stage's layers. We sum them.
This script runs `parcae-oracle` on the four GPT-1.5B segments twice in one process: as shipped, and with
that bug put back where no instance is preempted (repartitions of a healthy cluster and segment starts;
repartitions under preemption keep the sum, so the ablation is partial). It prints both ratios to `ideal`
beside the reference's truth mode. This is a diagnostic, not a mode of the planner.
`benchmarks/oracle_gap.py` puts the bug back everywhere (repartitions under preemption too) together with
the reference's other cost rules, one at a time, and closes the gap to within 0.001.

    python benchmarks/ablation_reference_bug.py
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle_gap import greedy_missing  # noqa: E402  (the reference's repartition, shared with the full ablation)

import liveput.scenarios as scenarios  # noqa: E402
from forecasting import load_trace  # noqa: E402
from liveput import SimulationConfig, simulate  # noqa: E402

SEGMENTS = {
    "hl 1.5-2.5": (90, 149, 0.933),
    "hh 5.5-6.5": (330, 389, 0.938),
    "lh 8-9": (480, 539, 0.925),
    "ll 10-11": (600, 659, 0.982),
}


def _last_stage_missing(layer_params, old_cuts, new_cuts, replicas):
    """The reference's value: what the last new stage lacks under its stage-by-stage greedy, every old stage
    healthy (`replicas` copies each)."""
    return greedy_missing(layer_params, old_cuts, new_cuts, [replicas] * (len(old_cuts) - 1), overwrite=True)


@contextmanager
def reference_bug():
    saved_missing, saved_start = scenarios.healthy_missing, scenarios.ScenarioStore._start
    saved_upper = scenarios.ScenarioStore._upper

    def upper(self, current, targets, kmax, base):
        # the planner's upper bounds assume the sum; with the bug back, use a bound that always holds
        return np.full(len(targets), 1e12)

    def start(self, d, p, kmax):
        probs = np.zeros((kmax + 1, len(scenarios.KINDS)))
        probs[:, scenarios.KINDS.index(scenarios.MigrationKind.START)] = 1.0
        last = self.cost.spec.stage_params(p)[-1]
        return probs, np.full(kmax + 1, self._pipeline_ms(d, p, last, True))

    scenarios.healthy_missing = _last_stage_missing
    scenarios.ScenarioStore._start = start
    scenarios.ScenarioStore._upper = upper
    scenarios._STATIC.clear()
    try:
        yield
    finally:
        scenarios.healthy_missing, scenarios.ScenarioStore._start = saved_missing, saved_start
        scenarios.ScenarioStore._upper = saved_upper
        scenarios._STATIC.clear()


def run() -> dict[str, float]:
    trace = load_trace("p3")
    out = {}
    for seg, (a, b, _) in SEGMENTS.items():
        res = simulate(trace, ["ideal", "parcae-oracle"], SimulationConfig(), first_interval=a, last_interval=b)
        out[seg] = res["parcae-oracle"].samples / res["ideal"].samples
    return out


def main() -> None:
    fixed = run()
    with reference_bug():
        buggy = run()
    print(f"{'segment':<12} {'oracle (sum, shipped)':>22} {'oracle (reference bug)':>23} {'reference truth':>16}")
    for seg, (_, _, ref) in SEGMENTS.items():
        print(f"{seg:<12} {fixed[seg]:>22.3f} {buggy[seg]:>23.3f} {ref:>16.3f}")


if __name__ == "__main__":
    main()
