"""Where does `parcae-oracle` lose samples that the reference's truth mode does not?

Two views, per GPT-1.5B segment of the p3 trace (K = 8):

1. **Decomposition** of the shipped oracle's gap to `ideal`, interval by interval, as fractions of
   ideal's samples: running a slower strategy than ideal's (``strategy``), and the pause of each
   reconfiguration by what started it — the segment's start, a pipeline migration (P changes), a
   same-depth migration (intra/inter-stage), or leftover time carried from an earlier interval.
2. **Reference-rules ladder**: the same planner and accounting, but with the migration costs priced by the
   reference's documented rules (parcae-reference §D.2, §I.6, §I.8), put back one at a time, cumulatively:
   ``start-bug`` (a start from nothing fetches only the last stage, the overwrite bug), ``greedy`` (the
   reference's stage-by-stage greedy instead of our optimal assignment), ``overwrite`` (missing parameters
   overwritten by the last stage's on every repartition, §I.6), ``add-type`` (a rendezvous whenever
   d*p > D*P - n_out, counting preempted idle instances, §I.8), ``idle-intra`` (staying put while only idle
   instances are preempted is charged an intra-stage migration, §I.8) and ``mc30`` (the reference's
   Monte Carlo with n_sim = 30: the planner picks among noisy cost estimates and is then charged the same
   estimates — the winner's curse — mean and spread over seeds). The step ``exact`` re-prices our own
   rules with this script's sampler (a check that it agrees with `liveput.scenarios`).

Reference-rule costs are expectations over which instances are preempted, estimated with
``--draws`` seeded draws per scenario key (common random numbers; 2000 draws: ~0.5% noise per key).
This is a diagnostic; it changes nothing in the planner.

    python benchmarks/oracle_gap.py [--segments "ll 10-11"] [--draws 2000] [--seeds 3] [--timeline] [--json OUT.json]

All four segments take about 6 minutes on 2 cores (hl and hh about 3 each: reference rules are priced by
sampling every scenario key).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting import DEFAULT_INTERVAL_S, load_trace  # noqa: E402
from liveput import (  # noqa: E402
    DEFAULT_LOOK_AHEAD,
    KINDS,
    CostModel,
    MigrationKind,
    Outcome,
    ParcaePolicy,
    ScenarioStore,
    SimulationConfig,
    assign_stages,
    events_of,
    instance_price,
    load_profile,
    oracle_forecast,
    run_policy,
    simulate,
    stage_overlap,
)

SEGMENTS = {
    "hl 1.5-2.5": (90, 149, 0.933),
    "hh 5.5-6.5": (330, 389, 0.938),
    "lh 8-9": (480, 539, 0.925),
    "ll 10-11": (600, 659, 0.982),
}  # reference truth / Ideal, parcae-reference §G.3


@dataclass(frozen=True)
class Rules:
    """Which of the reference's cost rules are in force (False = ours)."""

    start_bug: bool = False
    greedy: bool = False
    overwrite: bool = False
    add_type: bool = False
    idle_intra: bool = False
    mc: int = 0  # 0: expectation (``draws``); n: n seeded Monte Carlo draws as the reference
    seed: int = 0


LADDER = [
    ("exact", Rules()),
    ("+start-bug", Rules(start_bug=True)),
    ("+greedy", Rules(start_bug=True, greedy=True)),
    ("+overwrite", Rules(start_bug=True, greedy=True, overwrite=True)),
    ("+add-type", Rules(start_bug=True, greedy=True, overwrite=True, add_type=True)),
    ("+idle-intra", Rules(start_bug=True, greedy=True, overwrite=True, add_type=True, idle_intra=True)),
]


def greedy_missing(layer_params, old_cuts, new_cuts, survivors, overwrite: bool) -> int:
    """The reference's repartition: each new stage in turn takes the surviving replica it overlaps most."""
    so = stage_overlap(tuple(layer_params), tuple(old_cuts), tuple(new_cuts))
    left = {s: int(survivors[s]) for s in so.demand}
    total = last = 0
    for j, ov in enumerate(so.overlap):
        best, gain = -1, 0
        for s, o in ov.items():
            if left[s] > 0 and o > gain:
                best, gain = s, o
        if best >= 0:
            left[best] -= 1
        last = so.size[j] - gain
        total += last
    return last if overwrite else total


@cache
def _missing(layer_params, old_cuts, new_cuts, survivors, greedy: bool, overwrite: bool) -> int:
    if greedy:
        return greedy_missing(layer_params, old_cuts, new_cuts, survivors, overwrite)
    return assign_stages(layer_params, old_cuts, new_cuts, survivors)[1]


class RuleStore(ScenarioStore):
    """A scenario store whose costs follow `Rules`, estimated over seeded preemption draws."""

    def __init__(self, profile, cost, rules: Rules, draws: int) -> None:
        super().__init__(profile, cost)
        self.rules, self.draws = rules, draws
        self._key_cache: dict[tuple, dict] = {}

    # the optimizer asks bounds for every transition and the exact cost only where they differ: give it exact
    def bounds(self, forecast, current, targets):
        o = self._point(forecast, current, targets)
        return o.reach, o.cost_ms, o.cost_ms

    def pair(self, forecast, current, target):
        o = self._point(forecast, current, [target])
        return float(o.reach[0]), float(o.cost_ms[0]), o.kind[0]

    def outcome(self, n, current, n_in, n_out, targets):
        return self._outcome(max(n, current[0] * current[1]), current, n_in, n_out, targets)

    def _point(self, forecast, current, targets):
        ((n_in, n_out, _),) = forecast.events
        return self._outcome(max(forecast.prev_available, current[0] * current[1]), current, n_in, n_out, targets)

    def _outcome(self, n, current, n_in, n_out, targets):
        table = self._key(n, current, n_in, n_out)
        reach = np.array([1.0 if t in table else 0.0 for t in targets])
        cost = np.array([table[t][0] if t in table else 0.0 for t in targets])
        kind = np.array([table[t][1] if t in table else np.zeros(len(KINDS)) for t in targets]).reshape(
            len(targets), len(KINDS)
        )
        return Outcome(tuple(targets), reach, cost, kind)

    def _key(self, n, current, n_in, n_out) -> dict:
        key = (n, current, n_in, n_out)
        hit = self._key_cache.get(key)
        if hit is not None:
            return hit
        r, cm, spec = self.rules, self.cost, self.cost.spec
        D, P = current
        alive = n + n_in - n_out
        targets = self.profile.strategies(alive)
        # survivor vectors per stage and active losses, with their weights
        if D * P == 0 or n_out == 0:
            vectors = {(tuple([D] * P), 0): 1.0}
        else:
            m = r.mc or self.draws
            rng = np.random.default_rng([zlib.crc32(repr(key).encode()), r.seed])
            ids = np.argsort(rng.random((m, n)), axis=1)[:, :n_out]
            vectors: dict = {}
            for row in ids:
                act = row[row < D * P]
                surv = np.full(P, D) - np.bincount(act % P, minlength=P)
                v = (tuple(int(x) for x in surv), len(act))
                vectors[v] = vectors.get(v, 0.0) + 1.0 / m
        out = {}
        for d, p in targets:
            cost, kind = 0.0, np.zeros(len(KINDS))
            for (surv, k), w in vectors.items():
                lost = n_out if r.add_type else k
                add = d * p > D * P - lost
                if D * P == 0:
                    miss = spec.stage_params(p)[-1] if r.start_bug else spec.total_params
                    c, kd = cm.pipeline_ms(d, p, miss, True), MigrationKind.START
                elif p == P:
                    if min(surv) >= d:
                        free = d == D and (n_out == 0 if r.idle_intra else k == 0)
                        c, kd = (
                            (0.0, MigrationKind.NONE) if free else (cm.intra_stage_ms(d, P), MigrationKind.INTRA_STAGE)
                        )
                    else:
                        c, kd = cm.inter_stage_ms(d, P, surv, add), MigrationKind.INTER_STAGE
                else:
                    old, new = spec.partition(P), spec.partition(p)
                    miss = _missing(spec.layer_params, old, new, surv, r.greedy, r.overwrite)
                    c, kd = cm.pipeline_ms(d, p, miss, add), MigrationKind.PIPELINE
                cost += w * c
                kind[KINDS.index(kd)] += w
            out[(d, p)] = (cost, kind)
        self._key_cache[key] = out
        return out


def decompose(oracle, ideal, profile) -> dict[str, float]:
    """Gap to ideal by cause, as fractions of ideal's samples."""
    o, i = oracle.timeline, ideal.timeline
    total = float(i["samples"].sum())
    parts = dict.fromkeys(["strategy", "start", "pipeline", "same-depth", "carry"], 0.0)
    prev_p = 0
    for (_, ro), (_, ri) in zip(o.iterrows(), i.iterrows()):
        thr_o = profile.throughput(int(ro.d), int(ro.p)) if ro.p else 0.0
        parts["strategy"] += (float(ri.samples) - thr_o * DEFAULT_INTERVAL_S) / total
        lost = thr_o * DEFAULT_INTERVAL_S - float(ro.samples)
        if ro.cost_ms > 0:
            cause = "start" if prev_p == 0 else ("pipeline" if ro.p != prev_p else "same-depth")
        else:
            cause = "carry"
        parts[cause] += lost / total
        prev_p = int(ro.p)
    return parts


def with_reference_cost(tl, events, ref_store):
    """The shipped oracle's timeline plus what the reference's rules charge for the same transitions."""
    by_interval = {e.interval: e for e in events}
    prev, ref = (0, 0), []
    for _, r in tl.iterrows():
        e, target = by_interval[int(r.interval)], (int(r.d), int(r.p))
        c = 0.0
        if target != (0, 0):
            c = float(
                ref_store.outcome(max(e.prev_available, prev[0] * prev[1]), prev, e.n_in, e.n_out, [target]).cost_ms[0]
            )
        ref.append(c)
        prev = target
    out = tl[["interval", "available", "n_in", "n_out", "strategy", "samples", "pause_s", "cost_ms"]].copy()
    out["ref_rules_cost_ms"] = ref
    return out


def run_oracle(trace, store, a, b, profile, cost):
    events = events_of(trace)
    index = {e.interval: k for k, e in enumerate(events)}
    pol = ParcaePolicy(profile, cost, oracle_forecast, DEFAULT_LOOK_AHEAD, DEFAULT_INTERVAL_S, "parcae-oracle", store)
    return run_policy(pol, events, index[a], index[b] + 1, price_per_hour=instance_price("p3.2xlarge").spot_per_hour)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", default=",".join(SEGMENTS), help="comma-separated segment names")
    ap.add_argument("--draws", type=int, default=2000, help="preemption draws per scenario key for the expectation")
    ap.add_argument("--seeds", type=int, default=3, help="Monte Carlo seeds for the n_sim = 30 step (0: skip it)")
    ap.add_argument("--timeline", action="store_true", help="also print the shipped oracle's per-interval table")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trace = load_trace("p3")
    out: dict = {}
    for seg in [s.strip() for s in args.segments.split(",")]:
        a, b, ref = SEGMENTS[seg]
        t0 = time.perf_counter()
        res = simulate(trace, ["ideal", "parcae-oracle"], SimulationConfig(), first_interval=a, last_interval=b)
        ideal, oracle = res["ideal"], res["parcae-oracle"]
        profile, cost = load_profile("gpt-1.5b"), CostModel.reference("gpt-1.5b")
        parts = decompose(oracle, ideal, profile)
        row = {"ideal": ideal.samples, "oracle": oracle.samples / ideal.samples, "reference_truth": ref, "gap": parts}
        if args.timeline:
            print(
                with_reference_cost(
                    oracle.timeline, events_of(trace), RuleStore(profile, cost, LADDER[-1][1], args.draws)
                ).to_string(index=False)
            )
        ladder = {}
        for name, rules in LADDER:
            ladder[name] = (
                run_oracle(trace, RuleStore(profile, cost, rules, args.draws), a, b, profile, cost).samples
                / ideal.samples
            )
        if args.seeds:
            full = LADDER[-1][1]
            mc = [
                run_oracle(
                    trace, RuleStore(profile, cost, replace(full, mc=30, seed=s), args.draws), a, b, profile, cost
                ).samples
                / ideal.samples
                for s in range(args.seeds)
            ]
            ladder["+mc30 (mean)"], ladder["+mc30 (min..max)"] = float(np.mean(mc)), (min(mc), max(mc))
        row["ladder"] = ladder
        out[seg] = row
        print(
            f"\n## {seg}: ideal {ideal.samples:,.0f} samples; oracle {row['oracle']:.3f}, reference truth {ref:.3f} "
            f"({time.perf_counter() - t0:.0f} s)"
        )
        print(
            "gap to ideal by cause (fraction of ideal): "
            + ", ".join(f"{k} {v:.4f}" for k, v in parts.items())
            + f"  (sum {sum(parts.values()):.4f})"
        )
        print(f"{'reference rules, cumulative':<28} {'oracle/ideal':>12} {'step':>8} {'ref truth':>10}")
        prev = row["oracle"]
        for name, v in ladder.items():
            if isinstance(v, tuple):
                print(f"{name:<28} {v[0]:>6.3f}..{v[1]:.3f}")
                continue
            print(f"{name:<28} {v:>12.3f} {v - prev:>+8.3f} {ref:>10.3f}")
            prev = v
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=list))


if __name__ == "__main__":
    main()
