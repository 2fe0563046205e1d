"""Throughput of a (D x P) strategy: the profiled tables, their feasibility rules, and an analytic fallback.

This module owns the answer to "how many samples/s does D data-parallel replicas x P pipeline stages train
at, and is that strategy allowed at all?" (parcae-reference §A.2, §A.5, §E). Two sources feed it:

* the reference's profiled tables (`cost.py`, §E.2), bundled as ``liveput/data/throughput/<model>.json``
  together with the per-model P/D limits of §A.5; lookups are exact, with no interpolation (§E.1);
* an analytic 1F1B pipeline estimator (§E.5) for models, batches or clusters without a table.

Both produce a :class:`ThroughputProfile`; the optimizer only ever sees that. A strategy that is not in
the table or breaks a limit raises :class:`InfeasibleStrategy` instead of the reference's silent zero.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from liveput.model_spec import ModelSpec, load_model_spec
from liveput.network import P3_P2P, GiB, P2PTable

__all__ = [
    "InfeasibleStrategy",
    "Strategy",
    "ThroughputProfile",
    "estimate_profile",
    "load_profile",
    "max_global_batch",
    "profile_names",
    "simulate_1f1b",
]

#: A training strategy (D, P): D data-parallel replicas of a P-stage pipeline; (0, 0) is idle. The one definition.
Strategy = tuple[int, int]

#: Relative tolerance under which two throughputs count as a tie in :meth:`ThroughputProfile.best`.
TIE_RTOL = 1e-9

#: Most micro-batches per replica and iteration that :func:`estimate_profile` simulates: the 1F1B simulation is
#: linear in them (about 7 s for gpt-1.5b's 4096 on 2 cores) and unbounded they exhaust the memory.
MAX_MICRO_BATCHES = 4096


class InfeasibleStrategy(ValueError):
    """A (D, P) the profile cannot run: not measured, or outside the model's limits."""


def strategy_key(strategy: Sequence[int]) -> str:
    """(D, P) as "DxP", the form data keys strategies by (profiles' tables, report and table columns); (0, 0) is
    "0x0". The inverse of `parse_strategy`."""
    d, p = strategy
    return f"{int(d)}x{int(p)}"


def strategy_text(strategy: Sequence[int] | None) -> str:
    """(D, P) as a person reads it: "DxP", "idle" for (0, 0) (no instance trains), "-" when unknown."""
    if not strategy:
        return "-"
    return "idle" if not strategy[0] or not strategy[1] else strategy_key(strategy)


def parse_strategy(text: str) -> Strategy:
    """ "DxP" (`strategy_key`) as (D, P)."""
    try:
        d, p = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"bad strategy key {text!r}: expected 'DxP', e.g. '4x8'") from None
    return d, p


def _fmt_set(values: Iterable[int]) -> str:
    return "{" + _fmt_ints(values) + "}"


@dataclass(frozen=True)
class ThroughputProfile:
    """Iteration time per (D, P) for one model at one global batch, plus the strategies it may use.

    ``iteration_ms[(d, p)]`` is the time of one training iteration over ``global_batch`` samples, so
    throughput = ``global_batch * 1000 / iteration_ms`` samples/s (the reference's convention, §E.1, even
    where D does not divide GBS/micro and the runtime actually trains a slightly larger batch, §A.2).
    A strategy is feasible only if it is in the table *and* within the limits: ``min_p <= P <= max_p``,
    P not in ``excluded_p``, D not in ``excluded_d``. Limits encode memory and partitioning constraints
    the table cannot (§A.5). ``max_p=None`` means the largest P in the table.

    The table is copied into a read-only mapping, so a profile is immutable and hashable and can key
    caches.
    """

    model: str
    global_batch: int
    micro_batch: int
    iteration_ms: Mapping[Strategy, float] = field(compare=False, hash=False)
    min_p: int = 1
    max_p: int | None = None
    excluded_p: frozenset[int] = frozenset()
    excluded_d: frozenset[int] = frozenset()
    source: str = ""
    _table: tuple[tuple[Strategy, float], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        items: list[tuple[Strategy, float]] = []
        for (d, p), ms in self.iteration_ms.items():
            d, p, ms = int(d), int(p), float(ms)
            if d < 1 or p < 1:
                raise ValueError(f"{self.model}: strategy {d}x{p} must have D >= 1 and P >= 1")
            if not (math.isfinite(ms) and ms > 0):
                raise ValueError(f"{self.model}: iteration time of {d}x{p} must be a positive number of ms, got {ms}")
            items.append(((d, p), ms))
        items.sort(key=lambda kv: (kv[0][1], kv[0][0]))
        if self.global_batch < 1 or self.micro_batch < 1:
            raise ValueError(f"{self.model}: global_batch and micro_batch must be >= 1")
        max_p = self.max_p
        if max_p is None:
            max_p = max((p for (_, p), _ in items), default=self.min_p)
        if self.min_p < 1 or max_p < self.min_p:
            raise ValueError(f"{self.model}: need 1 <= min_p <= max_p, got min_p={self.min_p}, max_p={max_p}")
        set_ = object.__setattr__
        set_(self, "max_p", int(max_p))
        set_(self, "min_p", int(self.min_p))
        set_(self, "excluded_p", frozenset(int(x) for x in self.excluded_p))
        set_(self, "excluded_d", frozenset(int(x) for x in self.excluded_d))
        set_(self, "iteration_ms", MappingProxyType(dict(items)))
        set_(self, "_table", tuple(items))

    # ----------------------------------------------------------------------------------------- queries

    def _violation(self, d: int, p: int) -> str | None:
        """Why (d, p) is infeasible, or None when it is feasible."""
        assert self.max_p is not None  # __post_init__ set it
        if not self.min_p <= p <= self.max_p:
            return f"P={p} is outside [{self.min_p}, {self.max_p}]"
        if p in self.excluded_p:
            return f"P={p} is excluded (excluded P: {_fmt_set(self.excluded_p)})"
        if d in self.excluded_d:
            return f"D={d} is excluded (excluded D: {_fmt_set(self.excluded_d)})"
        if (d, p) not in self.iteration_ms:
            measured = sorted(dd for dd, pp in self.iteration_ms if pp == p)
            have = f"for P={p} the table has D in {_fmt_set(measured)}" if measured else f"the table has no P={p} entry"
            return f"{d}x{p} is not in the table ({have})"
        return None

    def is_feasible(self, d: int, p: int) -> bool:
        """True when (d, p) is measured and within the model's limits."""
        return self._violation(d, p) is None

    def throughput(self, d: int, p: int) -> float:
        """Samples/s of (d, p); raises :class:`InfeasibleStrategy` rather than returning a silent zero."""
        why = self._violation(d, p)
        if why is not None:
            raise InfeasibleStrategy(
                f"{self.model} (GBS {self.global_batch}) cannot run D={d} x P={p}: {why}. "
                f"Feasible: {self.describe_limits()}."
            )
        return self.global_batch * 1000.0 / self.iteration_ms[(d, p)]

    def describe_limits(self) -> str:
        """The feasible range in words, for error messages."""
        parts = [f"P in [{self.min_p}, {self.max_p}]"]
        if self.excluded_p:
            parts.append(f"P not in {_fmt_set(self.excluded_p)}")
        if self.excluded_d:
            parts.append(f"D not in {_fmt_set(self.excluded_d)}")
        n = len(_strategies(self, None))
        parts.append(f"{n} feasible strategies" + (f" ({_strategies_summary(self)})" if n else ""))
        return ", ".join(parts)

    def strategies(self, max_instances: int | None = None) -> tuple[Strategy, ...]:
        """Feasible (d, p) using at most ``max_instances`` instances, sorted by (p, d)."""
        return _strategies(self, max_instances)

    def best(self, n: int) -> Strategy | None:
        """Throughput-optimal feasible strategy on ``n`` instances, or None if none fits.

        Ties (equal within ``TIE_RTOL``) go to fewer stages, then fewer instances: fewer stages means
        less pipeline state to migrate and fewer p2p hops. The reference kept the first found instead
        (D outer, P inner, §E.1); the two rules pick equally fast strategies.
        """
        return _best(self, n)

    def as_arrays(self, max_instances: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(d, p, throughput) as read-only numpy arrays in :meth:`strategies` order, for vectorised search."""
        return _arrays(self, max_instances)

    # ------------------------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used by the bundled tables (``iteration_ms`` keys are ``"DxP"``)."""
        return {
            "model": self.model,
            "global_batch": self.global_batch,
            "micro_batch": self.micro_batch,
            "source": self.source,
            "constraints": {
                "min_p": self.min_p,
                "max_p": self.max_p,
                "excluded_p": sorted(self.excluded_p),
                "excluded_d": sorted(self.excluded_d),
            },
            "iteration_ms": {strategy_key((d, p)): ms for (d, p), ms in self._table},
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """Serialise (and write to ``path`` if given); :meth:`from_json` reads it back."""
        text = json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ThroughputProfile:
        """Build from the JSON form; constraints are optional (no limits beyond the table)."""
        missing = [k for k in ("model", "global_batch", "micro_batch", "iteration_ms") if k not in data]
        if missing:
            raise ValueError(f"throughput profile is missing {', '.join(missing)}")
        c = data.get("constraints", {})
        return cls(
            model=str(data["model"]),
            global_batch=int(data["global_batch"]),
            micro_batch=int(data["micro_batch"]),
            iteration_ms={parse_strategy(k): float(v) for k, v in data["iteration_ms"].items()},
            min_p=int(c.get("min_p", 1)),
            max_p=None if c.get("max_p") is None else int(c["max_p"]),
            excluded_p=frozenset(int(x) for x in c.get("excluded_p", ())),
            excluded_d=frozenset(int(x) for x in c.get("excluded_d", ())),
            source=str(data.get("source", "")),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ThroughputProfile:
        """Load a profile written by :meth:`to_json` (e.g. one the trainer measured)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON throughput profile ({exc})") from None
        return cls.from_dict(data)


# Module-level caches keyed by the (hashable, immutable) profile; bounded so estimates don't pile up.


@lru_cache(maxsize=4096)
def _strategies(profile: ThroughputProfile, max_instances: int | None) -> tuple[Strategy, ...]:
    return tuple(
        (d, p)
        for (d, p), _ in profile._table
        if (max_instances is None or d * p <= max_instances) and profile.is_feasible(d, p)
    )


def _fmt_ints(values: Iterable[int]) -> str:
    """Sorted ints as compact ranges: 1-5, 7, 9-10."""
    out: list[tuple[int, int]] = []
    for v in sorted(values):
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


@lru_cache(maxsize=256)
def _strategies_summary(profile: ThroughputProfile) -> str:
    """Feasible strategies grouped by runs of P with the same D set, e.g. 'P=11-16: D 1-2'."""
    by_p: dict[int, frozenset[int]] = {}
    for d, p in _strategies(profile, None):
        by_p[p] = by_p.get(p, frozenset()) | {d}
    groups: list[tuple[list[int], frozenset[int]]] = []
    for p, ds in sorted(by_p.items()):
        if groups and groups[-1][1] == ds and groups[-1][0][-1] == p - 1:
            groups[-1][0].append(p)
        else:
            groups.append(([p], ds))
    return "; ".join(f"P={_fmt_ints(ps)}: D {_fmt_ints(ds)}" for ps, ds in groups)


@lru_cache(maxsize=4096)
def _best(profile: ThroughputProfile, n: int) -> Strategy | None:
    cands = [(s, profile.throughput(*s)) for s in _strategies(profile, n)]
    if not cands:
        return None
    top = max(t for _, t in cands)
    ties = [s for s, t in cands if t >= top * (1.0 - TIE_RTOL)]
    return min(ties, key=lambda s: (s[1], s[0] * s[1]))


@lru_cache(maxsize=4096)
def _arrays(profile: ThroughputProfile, max_instances: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    strats = _strategies(profile, max_instances)
    d = np.array([s[0] for s in strats], dtype=np.int64)
    p = np.array([s[1] for s in strats], dtype=np.int64)
    thr = np.array([profile.throughput(*s) for s in strats], dtype=np.float64)
    for a in (d, p, thr):
        a.flags.writeable = False
    return d, p, thr


# ------------------------------------------------------------------------------------ bundled tables


def _table_dir() -> Traversable:
    return resources.files("liveput").joinpath("data/throughput")


@cache
def profile_names() -> tuple[str, ...]:
    """Models with a bundled profiled table."""
    return tuple(sorted(f.name[: -len(".json")] for f in _table_dir().iterdir() if f.name.endswith(".json")))


@cache
def _bundled(model: str) -> ThroughputProfile:
    return ThroughputProfile.from_dict(json.loads(_table_dir().joinpath(f"{model}.json").read_text(encoding="utf-8")))


def max_global_batch(model: str) -> int:
    """The largest global batch :func:`load_profile` takes for ``model``: MAX_MICRO_BATCHES micro-batches (the
    bundled table's own global batch is always allowed: it is read, not estimated)."""
    return max(MAX_MICRO_BATCHES * load_model_spec(model).micro_batch, _bundled(model).global_batch)


@lru_cache(maxsize=64)
def load_profile(model: str, global_batch: int | None = None, *, max_instances: int = 32) -> ThroughputProfile:
    """The bundled profiled table of ``model``.

    The reference used a table only at exactly its global batch (§E.1). For another ``global_batch`` this
    returns the analytic estimate (:func:`estimate_profile`, up to ``max_instances`` instances) under the
    table's P/D limits, and says so in ``source``. Unknown models raise ``KeyError`` naming the known ones.
    """
    if model not in profile_names():
        raise KeyError(
            f"no throughput table for model {model!r}; known: {', '.join(profile_names())}. "
            "For another model, measure a profile (ThroughputProfile.from_json) or use estimate_profile()."
        )
    table = _bundled(model)
    if global_batch is None or global_batch == table.global_batch:
        return table
    est = estimate_profile(load_model_spec(model), global_batch, max_instances, min_p=table.min_p, max_p=table.max_p)
    return replace(
        table,
        global_batch=global_batch,
        micro_batch=est.micro_batch,
        iteration_ms=est.iteration_ms,
        source=(
            f"ANALYTIC ESTIMATE, not a measurement: the profiled table is for GBS {table.global_batch} only, "
            f"GBS {global_batch} was requested; P/D limits taken from the table. {est.source}"
        ),
    )


# --------------------------------------------------------------------------- analytic 1F1B estimator


def _stage_order(s: int, p: int, n_micro: int) -> list[tuple[str, int]]:
    """1F1B task order of stage ``s``: warm-up forwards, then alternate F/B, then drain the backwards.

    Stage s keeps at most ``p - s`` micro-batches in flight (forwarded, not yet backwarded).
    """
    warm = min(p - s - 1, n_micro)
    order: list[tuple[str, int]] = [("F", m) for m in range(warm)]
    for i in range(n_micro - warm):
        order += [("F", warm + i), ("B", i)]
    order += [("B", m) for m in range(n_micro - warm, n_micro)]
    return order


@lru_cache(maxsize=4096)
def _stage_finish_ms(fwd: tuple[float, ...], bwd: tuple[float, ...], n_micro: int, edge_ms: float) -> tuple[float, ...]:
    """Time each stage finishes its last task under the 1F1B schedule (pure; cached by value)."""
    p = len(fwd)
    orders = [_stage_order(s, p, n_micro) for s in range(p)]
    pos = [0] * p  # next task per stage
    free = [0.0] * p  # when each stage becomes idle
    done_f = [[math.nan] * n_micro for _ in range(p)]
    done_b = [[math.nan] * n_micro for _ in range(p)]
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, m = orders[s][pos[s]]
                if kind == "F":
                    dep = 0.0 if s == 0 else done_f[s - 1][m] + edge_ms
                else:  # last stage: after its own F; others: after the next stage's B
                    dep = done_f[s][m] if s == p - 1 else done_b[s + 1][m] + edge_ms
                if math.isnan(dep):
                    break
                end = max(free[s], dep) + (fwd[s] if kind == "F" else bwd[s])
                (done_f if kind == "F" else done_b)[s][m] = end
                free[s] = end
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for a 1F1B order; guard against an infinite loop
            raise RuntimeError("1F1B schedule deadlocked")
    return tuple(free)


def simulate_1f1b(
    stage_fwd_ms: Sequence[float],
    stage_bwd_ms: Sequence[float],
    n_micro: int,
    p2p_ms_per_edge: float = 0.0,
    stage_tail_ms: Sequence[float] | None = None,
) -> float:
    """Makespan (ms) of one 1F1B pipeline iteration over ``n_micro`` micro-batches (§E.5).

    Each stage runs its tasks one at a time in 1F1B order; F(m, s) waits for F(m, s-1), B(m, s) for
    B(m, s+1) (the last stage for its own F(m)); every cross-stage edge costs ``p2p_ms_per_edge``.
    ``stage_tail_ms`` (gradient all-reduce + optimizer step) is added to each stage's finish before the
    max, so the slowest stage including its tail sets the iteration time.
    """
    if len(stage_fwd_ms) != len(stage_bwd_ms) or not stage_fwd_ms:
        raise ValueError("need one forward and one backward time per stage (at least one stage)")
    if n_micro < 1:
        raise ValueError(f"n_micro must be >= 1, got {n_micro}")
    fwd = tuple(float(x) for x in stage_fwd_ms)
    bwd = tuple(float(x) for x in stage_bwd_ms)
    finish = _stage_finish_ms(fwd, bwd, int(n_micro), float(p2p_ms_per_edge))
    tail = [0.0] * len(finish) if stage_tail_ms is None else [float(x) for x in stage_tail_ms]
    if len(tail) != len(finish):
        raise ValueError("stage_tail_ms needs one value per stage")
    return max(f + t for f, t in zip(finish, tail))


@dataclass(frozen=True)
class _StagePlan:
    """Per-stage compute (ms per micro-batch), optimizer step (ms) and parameters of a P-stage cut."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    opt: tuple[float, ...]
    params: tuple[int, ...]


def _stage_plan(spec: ModelSpec, p: int, memory_gib: float, recompute: bool) -> _StagePlan | None:
    """Stage costs for P stages under the memory model (`ModelSpec.stage_memory`), or None when some stage
    cannot fit; a stage that recomputes its activations pays one extra forward in backward."""
    memory = spec.stage_memory(p, memory_gib * GiB, recompute)
    if memory is None:
        return None
    cuts = spec.partition(p)
    fwd, bwd, opt, params = [], [], [], []
    for s in range(p):
        layers = spec.layers[cuts[s] : cuts[s + 1]]
        f = sum(layer.fwd_ms for layer in layers)
        fwd.append(f)
        bwd.append(sum(layer.bwd_ms for layer in layers) + (f if memory[s].recompute else 0.0))
        opt.append(sum(layer.opt_ms for layer in layers))
        params.append(sum(layer.params for layer in layers))
    return _StagePlan(tuple(fwd), tuple(bwd), tuple(opt), tuple(params))


def estimate_profile(
    spec: ModelSpec,
    global_batch: int,
    max_instances: int,
    *,
    p2p: P2PTable = P3_P2P,
    memory_gib: float = 15.5,
    min_p: int = 1,
    max_p: int | None = None,
    recompute: bool = True,
) -> ThroughputProfile:
    """Analytic throughput profile of ``spec`` for every (D, P) with D*P <= ``max_instances`` (§E.5).

    For each P the model is cut with the cost model's partition (``spec.partition``); a D x P iteration
    runs ``n_micro = ceil(GBS / micro / D)`` micro-batches through :func:`simulate_1f1b`, each cross-stage
    edge sending ``micro * seq_len * hidden * 4`` bytes (0 without seq_len/hidden), then each stage adds
    the ring all-reduce of its fp16 gradients (2 B/param) across D and its optimizer step. Strategies
    that do not fit ``memory_gib`` (see :func:`_stage_plan`) are left out of the table.

    Throughput is ``micro * D * n_micro`` samples per iteration; the stored ``iteration_ms`` is scaled to
    ``global_batch`` samples so that :meth:`ThroughputProfile.throughput` returns exactly that.
    """
    if global_batch < 1 or max_instances < 1:
        raise ValueError("global_batch and max_instances must be >= 1")
    if global_batch > MAX_MICRO_BATCHES * spec.micro_batch:
        raise ValueError(
            f"{spec.name}: global_batch {global_batch} is more than the {MAX_MICRO_BATCHES} micro-batches of "
            f"{spec.micro_batch} the estimate simulates; use a global batch <= {MAX_MICRO_BATCHES * spec.micro_batch}"
        )
    if not any(layer.fwd_ms or layer.bwd_ms for layer in spec.layers):
        raise ValueError(f"{spec.name}: the layer spec has no forward/backward times; profile them first")
    micro = spec.micro_batch
    edge_ms = p2p.ms(spec.boundary_bytes)
    top_p = spec.n_layers if spec.n_layers == 1 else spec.n_layers - 1
    hi = min(top_p, max_instances, max_p if max_p is not None else top_p)
    table: dict[Strategy, float] = {}
    for p in range(max(min_p, 1), hi + 1):
        plan = _stage_plan(spec, p, memory_gib, recompute)
        if plan is None:
            continue
        for d in range(1, max_instances // p + 1):
            n_micro = math.ceil(global_batch / micro / d)
            tail = [p2p.allreduce_ms(2 * n, d) + o for n, o in zip(plan.params, plan.opt)]
            ms = simulate_1f1b(plan.fwd, plan.bwd, n_micro, edge_ms, tail)
            table[(d, p)] = ms * global_batch / (micro * d * n_micro)
    return ThroughputProfile(
        model=spec.name,
        global_batch=global_batch,
        micro_batch=micro,
        iteration_ms=table,
        min_p=max(min_p, 1),
        max_p=max_p if max_p is not None else max((p for _, p in table), default=max(min_p, 1)),
        source=(
            f"analytic 1F1B estimate (parcae-reference §E.5) from the {spec.name} layer spec; "
            f"memory {memory_gib} GiB/instance, recompute {'on' if recompute else 'off'}, p2p: {p2p.source}"
        ),
    )
