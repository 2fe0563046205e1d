"""Shared helpers for the liveput tests: a small synthetic model and brute-force oracles.

The synthetic model is small enough that every preemption subset (tests/test_scenarios.py) and every
strategy sequence (tests/test_optimizer.py) can be enumerated, yet its layers have different sizes so
that partitions, overlaps and transfer times are all distinct.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from liveput.migration import CostConstants, CostModel
from liveput.model_spec import Layer, ModelSpec
from liveput.throughput import ThroughputProfile

# 8 layers of different sizes (parameters); 160 M in all, so stage transfers take ~0.1-2 s on the p3 table
SMALL_LAYER_PARAMS: tuple[int, ...] = (
    30_000_000,
    12_000_000,
    20_000_000,
    8_000_000,
    25_000_000,
    15_000_000,
    10_000_000,
    40_000_000,
)

# iteration time (ms) for GBS 64; a handful of (d, p), min_p = 1
SMALL_ITERATION_MS: dict[tuple[int, int], float] = {
    (1, 1): 4000.0,
    (2, 1): 2100.0,
    (3, 1): 1500.0,
    (4, 1): 1200.0,
    (1, 2): 2300.0,
    (2, 2): 1250.0,
    (3, 2): 900.0,
    (1, 3): 1700.0,
    (2, 3): 950.0,
    (1, 4): 1400.0,
    (2, 4): 800.0,
}


def small_spec(layer_params: Sequence[int] = SMALL_LAYER_PARAMS, name: str = "small") -> ModelSpec:
    return ModelSpec(name=name, layers=tuple(Layer(f"l{i}", int(n)) for i, n in enumerate(layer_params)))


def small_profile(iteration_ms: dict[tuple[int, int], float] | None = None, name: str = "small") -> ThroughputProfile:
    return ThroughputProfile(
        model=name,
        global_batch=64,
        micro_batch=1,
        iteration_ms=dict(SMALL_ITERATION_MS if iteration_ms is None else iteration_ms),
        min_p=1,
    )


def small_cost(spec: ModelSpec | None = None, **changes) -> CostModel:
    """Reference-shaped constants ("replicas" groups, 6.6 s rendezvous) with build = 100 ms per stage."""
    constants = CostConstants(build_ms={p: 100.0 * p for p in range(1, 9)}, **changes)
    return CostModel(spec or small_spec(), constants)


# ------------------------------------------------------------------------------- brute-force oracles


def overlap(layer_params: Sequence[int], a: tuple[int, int], b: tuple[int, int]) -> int:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return sum(layer_params[lo:hi]) if hi > lo else 0


def brute_force_min_missing(
    layer_params: Sequence[int], old_cuts: Sequence[int], new_cuts: Sequence[int], survivors: Sequence[int]
) -> int:
    """Minimum total missing parameters over every injective map of new stages to surviving instances.

    A surviving instance of old stage s holds layers old_cuts[s]:old_cuts[s+1]; a new stage may also go
    to an instance that holds nothing (idle survivor or newly added instance), fetching every layer.
    Instances of the same old stage are interchangeable, so an assignment is a choice, per new stage,
    of an old stage (or None) such that old stage s is chosen at most survivors[s] times.
    """
    n_new, n_old = len(new_cuts) - 1, len(old_cuts) - 1
    new_rng = [(new_cuts[j], new_cuts[j + 1]) for j in range(n_new)]
    old_rng = [(old_cuts[s], old_cuts[s + 1]) for s in range(n_old)]
    size = [sum(layer_params[a:b]) for a, b in new_rng]
    # per new stage: None, or an old stage with >= 1 survivor (non-overlapping ones are as good as None
    # but are enumerated anyway: this is the brute force)
    options = [[None] + [s for s in range(n_old) if survivors[s] > 0] for _ in range(n_new)]
    best = None
    for choice in itertools.product(*options):
        used = [0] * n_old
        ok = True
        for s in choice:
            if s is not None:
                used[s] += 1
                if used[s] > survivors[s]:
                    ok = False
                    break
        if not ok:
            continue
        missing = sum(
            size[j] - (overlap(layer_params, new_rng[j], old_rng[s]) if s is not None else 0)
            for j, s in enumerate(choice)
        )
        best = missing if best is None else min(best, missing)
    return best
