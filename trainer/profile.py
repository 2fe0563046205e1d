"""The runtime profile: the trainer's own iteration time per (D, P) and its migration costs, measured in one job and
turned into the liveput planner's inputs (a `ThroughputProfile` and calibrated `CostConstants`).

Owns: `RuntimeProfile` and its JSON form, `measure` (one `trainer.run.run_job` whose scripted schedule visits every
strategy and produces every migration kind), the schedule it runs (`visit_order`, `profile_schedule`), turning the
job's result into measurements (`iteration_times`, `migrations_from_result`) and the calibration of the cost model
(`fit_line`, `fit_group_costs`, `fit_p2p`, `fit_build_ms`, `calibrate`: pure functions of plain data, so they are
tested on synthetic measurements). Must not touch: processes, stores and training (`trainer.run` does that), the
cost formulas themselves (`liveput.migration.CostModel`: the calibration inverts them, it never changes them).

One job, `workers` processes, three parts:

* prologue — start at W x 1 (W = workers, capped at the global batch); at step 2 the last member is preempted with
  notice (W-1 x 1, an intra-stage migration); at step 3 one instance is added and the job moves to the first
  strategy of the visit. The added process is started when the schedule reaches the add, right after the
  preemption's epoch is published, so the time from that publication to the add's epoch being published is the
  start-to-join time of a new instance (`rendezvous_ms`). Its start-up competes for the CPU with training, so the
  prologue's epochs and the preemption's pause are reported but not used for throughput or fits.
* visit — every strategy for `steps_per_strategy` steps, ordered P = 1 first with D descending (each step an
  intra-stage migration with fewer groups), then every larger P with D ascending (pipeline migration into the P,
  then inter-stage migrations as replicas are added); an inter-stage revisit is inserted when no such pair exists,
  and a last pipeline migration returns to the first strategy so that every P is entered by a pipeline migration.
* a checkpoint-restart at the end (every process exits and a fresh one loads the checkpoint), then one step.

The visit runs `rounds` times (default 2; `visit_rounds`), so every strategy is measured in as many epochs.
Iteration time of a strategy: the least over its visit epochs of `train_s / steps` (`Coordinator.epoch_spans`:
last member ready to first member arriving at the next boundary, so no migration pause is in it). The least, not
the median: on a shared machine interference (another job, the Prefect or MLflow process beside the profile) only
ever adds time, and one slowed epoch out of two would otherwise decide near-ties between strategies, which then
decide the planner's choices; every strategy gets at least `rounds` epochs, so none is left to one draw. The first
step after a migration stays in: the store keeps only an epoch's bounds, not per-step times. A check with per-step
timestamps (polling the workers' `ctl/at` keys) found that step within the step-to-step noise on tiny-gpt, except
the job's very first step (~2-3x slower), which falls in the prologue and is never used.

Calibration (group_mode "groups"; every constant's source is written to `CostConstants.source`):

* group_base_ms, group_remove_ms: least squares of the intra-stage pauses against the group count d + p + 1 + d*p
  (>= 2 distinct counts; one count: all of it per group); proc_ms and extra_restart_ms are 0 (not separable from
  the group and build terms here); group_add_ms = group_remove_ms (an added instance joins as standby before its
  epoch, so its groups form like anyone's).
* p2p: a latency floor + bandwidth line through (bytes, transfer phase) of every transfer, bytes being the busiest
  transfer party's (what it sends plus receives, from the planned epochs).
* rendezvous_ms: the added instance's start-to-join time (see the prologue).
* build_ms[p]: each pipeline pause into p minus what the formula charges besides the build (fetch, broadcast,
  groups); a P no pipeline migration measured is interpolated between measured neighbours, or takes the nearest
  measured value outside them, and says so.
* checkpoint_ms: the checkpoint-restart pause minus the restart terms and the serial reload (add=True: every
  process restarts and rejoins).

The cost model cuts stages with the reference's rule (`liveput.model_spec`: the embedding rides with the first
chunk, P <= layers - 1), the trainer cuts them evenly (`trainer.pipeline.partition`), so a profile stops at
P = layers - 1 and the formulas price slightly different stages than the ones measured; the fitted constants
absorb the difference (`measured["fit"]` shows each pause next to the model).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forecasting import jsonio
from liveput import (
    CostConstants,
    CostModel,
    Layer,
    MiB,
    MigrationKind,
    ModelSpec,
    P2PTable,
    Strategy,
    ThroughputProfile,
    healthy_missing,
)

FORMAT = "parcae-runtime-profile"
VERSION = 1
PROLOGUE_PREEMPT_STEP = 2  # the preemption with notice; the add follows one step later
INTRA = MigrationKind.INTRA_STAGE.value
INTER = MigrationKind.INTER_STAGE.value
PIPELINE = MigrationKind.PIPELINE.value
RESTART = MigrationKind.CHECKPOINT_RESTART.value
TOO_FEW = "workers must be >= 2 to measure migrations (an instance must leave and join), got {}"


class ProfileError(ValueError):
    """A profile that cannot be measured or fitted (too few workers, a migration kind missing, a failed job)."""


class ProfileFormatError(ProfileError):
    """A profile file that cannot be read; the message names the file and the field."""


# ------------------------------------------------------------------------------------------------ model spec


@dataclass(frozen=True)
class RuntimeModelSpec(ModelSpec):
    """A `ModelSpec` whose migratable bytes per parameter follow the runtime's dtype (`ModelSpec` assumes fp32):
    weights plus AdamW's two moments, all of `param_bytes` each."""

    param_bytes: int = 4

    @property
    def bytes_per_param(self) -> int:
        return self.param_bytes * (1 + self.optim_states)


def runtime_spec(model: Any, micro_batch: int = 2) -> RuntimeModelSpec:
    """The liveput spec of a trainer model (a `ModelConfig` or a registered name): its layers' parameter counts,
    counted on the layers themselves (`trainer.migration.layer_sizes`)."""
    from trainer.config import model_config
    from trainer.migration import layer_sizes
    from trainer.model import layer_names

    cfg = model_config(model) if isinstance(model, str) else model
    params = layer_sizes(cfg).params
    return RuntimeModelSpec(
        name=cfg.name, layers=tuple(Layer(n, int(p)) for n, p in zip(layer_names(cfg), params)), optim_states=2,
        micro_batch=micro_batch, seq_len=cfg.block_size, hidden=cfg.n_embd,
        source=f"trainer model {cfg.name} ({cfg.dtype}): parameters counted per layer",
        param_bytes=_dtype_bytes(cfg.dtype),
    )  # fmt: skip


def _dtype_bytes(dtype: str) -> int:
    return {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}[dtype]


def max_stages(n_layers: int) -> int:
    """The largest P the cost model can cut `n_layers` into (the reference rule needs P <= layers - 1)."""
    return max(1, n_layers - 1)


# ------------------------------------------------------------------------------------------------ schedule


def feasible_strategies(workers: int, n_layers: int, global_batch: int) -> list[Strategy]:
    """Every (D, P) with D * P <= workers, P <= max_stages(n_layers), D <= global_batch."""
    return [(d, p) for p in range(1, max_stages(n_layers) + 1) for d in range(1, global_batch + 1) if d * p <= workers]


def visit_order(strategies: Iterable[Strategy]) -> list[Strategy]:
    """The order the profile visits `strategies` in, so that the visit also produces every migration kind.

    The smallest P first with D descending (intra-stage migrations with distinct group counts), then each larger P
    with D ascending (a pipeline migration into it, then inter-stage ones). If that has no inter-stage pair, the
    first P group is re-entered one replica up after its descent. If the visit changed P, it ends with a pipeline
    migration back to its first strategy, so that every P is entered by a pipeline migration.
    """
    by_p: dict[int, list[int]] = {}
    for d, p in sorted(set(strategies)):
        by_p.setdefault(p, []).append(d)
    if not by_p:
        raise ProfileError("no strategy to visit")
    ps = sorted(by_p)
    order = [(d, ps[0]) for d in sorted(by_p[ps[0]], reverse=True)]
    for p in ps[1:]:
        order += [(d, p) for d in sorted(by_p[p])]
    if not any(a[1] == b[1] and b[0] > a[0] for a, b in zip(order, order[1:])):
        first = sorted(by_p[ps[0]])
        if len(first) >= 2:
            order.insert(len(first), (first[1], ps[0]))
    if len(ps) > 1 and order[-1] != order[0]:
        order.append(order[0])
    return order


def visit_rounds(order: Sequence[Strategy], rounds: int) -> list[Strategy]:
    """`order` visited `rounds` times in a row; a round that would start where the previous one ended (a visit that
    returns to its first strategy) starts one strategy later, so no plan repeats the strategy in force."""
    if rounds < 1:
        raise ProfileError(f"rounds must be >= 1, got {rounds}")
    out = list(order)
    for _ in range(rounds - 1):
        out += list(order[1:]) if out[-1] == order[0] else list(order)
    return out


@dataclass(frozen=True)
class Schedule:
    """The profile job: where it starts, its events (`trainer.events` format), its length, and where its parts are."""

    initial: Strategy
    events: tuple[dict[str, Any], ...]
    steps: int
    visit: tuple[Strategy, ...]
    main_start: int  # the first step of the visit (the add's step)
    restart_step: int


def profile_schedule(workers: int, visit: Sequence[Strategy], steps_per_strategy: int, global_batch: int) -> Schedule:
    """The prologue (preempt with notice, then add), the visit, a checkpoint-restart, one last step."""
    if workers < 2:
        raise ProfileError(TOO_FEW.format(workers))
    if steps_per_strategy < 1:
        raise ProfileError(f"steps_per_strategy must be >= 1, got {steps_per_strategy}")
    d0 = min(workers, global_batch)
    if tuple(visit[0]) == (d0 - 1, 1):
        raise ProfileError(f"the visit cannot start at {d0 - 1}x1, the strategy the prologue's preemption leaves: the "
                           f"add would change nothing; include {d0}x1 or start elsewhere")  # fmt: skip
    s = PROLOGUE_PREEMPT_STEP
    events: list[dict[str, Any]] = [
        {"step": s, "kind": "preempt", "instances": [d0 - 1], "notice": True},
        {"step": s, "kind": "plan", "strategy": [d0 - 1, 1]},
        {"step": s + 1, "kind": "add", "workers": 1},
        {"step": s + 1, "kind": "plan", "strategy": list(visit[0])},
    ]
    s += 1
    main_start = s
    for strategy in visit[1:]:
        s += steps_per_strategy
        events.append({"step": s, "kind": "plan", "strategy": list(strategy)})
    s += steps_per_strategy
    events.append({"step": s, "kind": "checkpoint-restart"})
    return Schedule((d0, 1), tuple(events), s + 1, tuple(visit), main_start, s)


# ------------------------------------------------------------------------------------------------ measurements


@dataclass(frozen=True)
class Migration:
    """One measured reconfiguration, as the calibration sees it (times in ms).

    role: "main" (a visit migration), "preempt" (the prologue's, overlapping the added instance's start: reported,
    not fitted), "add" (the added instance's: rendezvous and its transfer), "restart" (the checkpoint-restart).
    survivors: per stage of `src`, the replicas that stay (inter-stage). transfer_bytes: the busiest transfer
    party's bytes (sent + received); transfer_ms: the slowest new member's transfer phase (None: no transfer).
    join_ms: for the add, its process's start-to-join time.
    """

    epoch: int
    step: int
    kind: str
    src: Strategy
    dst: Strategy
    pause_ms: float
    role: str = "main"
    add: bool = False
    hold_ms: float = 0.0
    join_ms: float | None = None
    transfer_ms: float | None = None
    transfer_bytes: int = 0
    bytes_moved: int = 0
    survivors: tuple[int, ...] = ()
    phases_ms: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch, "step": self.step, "kind": self.kind, "from": list(self.src), "to": list(self.dst),
            "role": self.role, "add": self.add, "pause_ms": self.pause_ms, "hold_ms": self.hold_ms,
            "join_ms": self.join_ms, "transfer_ms": self.transfer_ms, "transfer_bytes": self.transfer_bytes,
            "bytes_moved": self.bytes_moved, "survivors": list(self.survivors), "phases_ms": dict(self.phases_ms),
        }  # fmt: skip


def iteration_times(epochs: Sequence[Mapping[str, Any]], first_step: int) -> dict[Strategy, list[float]]:
    """ms per step of every epoch that starts at or after `first_step` and has a measured span, by strategy."""
    out: dict[Strategy, list[float]] = {}
    for e in epochs:
        steps = e["end_step"] - e["start_step"]
        if e["start_step"] < first_step or e["train_s"] is None or steps < 1:
            continue
        out.setdefault((int(e["strategy"][0]), int(e["strategy"][1])), []).append(1000.0 * e["train_s"] / steps)
    return out


def _party_bytes(epoch: Any, layer_bytes: Sequence[int]) -> int:
    """Bytes the busiest transfer party of `epoch` sends plus receives."""
    load: dict[int, int] = {}
    for t in epoch.transfers:
        for w in (t.src, t.dst):
            load[w] = load.get(w, 0) + layer_bytes[t.layer]
    return max(load.values(), default=0)


def migrations_from_result(result: Mapping[str, Any], planned: Sequence[Any], schedule: Schedule,
                           state_bytes: Callable[[int], Sequence[int]]) -> list[Migration]:  # fmt: skip
    """The job's reconfiguration records as `Migration`s, checked against the planned epochs (`check_schedule`);
    `state_bytes(step)` gives the bytes per layer of a migration before `step`."""
    by_number = {e.number: e for e in planned}
    spans = {e["epoch"]: e for e in result["epochs"]}
    add_step = schedule.main_start
    out = []
    for r in result["reconfigurations"]:
        n = r["epoch"]
        plan, prev = by_number.get(n), by_number.get(n - 1)
        if plan is None or prev is None or plan.kind.value != r["kind"] or [plan.D, plan.P] != list(r["strategy"]):
            raise ProfileError(f"epoch {n} ({r['kind']} to {r['strategy']}) is not the planned one: the job did not "
                               "follow the profile's schedule")  # fmt: skip
        phases = {k.removesuffix("_s") + "_ms": 1000.0 * v for k, v in r["phases_s"].items()}
        role = "main"
        if r["kind"] == RESTART:
            role = "restart"
        elif r["step"] == add_step:
            role = "add"
        elif r["preempted"]:
            role = "preempt"
        join_ms = None
        if role == "add":
            join_ms = 1000.0 * (spans[n]["decided_at"] - spans[n - 1]["decided_at"])
        survivors = tuple(
            sum(1 for w, (s, _) in prev.assignment.items() if s == k and w not in plan.preempted) for k in range(prev.P)
        )
        xfer = r["phases_s"].get("transfer_s")
        out.append(Migration(
            epoch=n, step=r["step"], kind=r["kind"], src=(prev.D, prev.P), dst=(plan.D, plan.P),
            pause_ms=1000.0 * r["pause_s"], role=role, add=role == "add", hold_ms=1000.0 * r["hold_s"],
            join_ms=join_ms, transfer_ms=1000.0 * xfer if plan.transfers and xfer is not None else None,
            transfer_bytes=_party_bytes(plan, state_bytes(plan.start_step)), bytes_moved=int(r["bytes_moved"]),
            survivors=survivors, phases_ms=phases,
        ))  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------------ fits (pure)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b x; needs >= 2 distinct x."""
    n = len(xs)
    if n != len(ys) or len(set(xs)) < 2:
        raise ProfileError(f"a line needs >= 2 distinct x values, got {sorted(set(xs))}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def _through_origin(xs: Sequence[float], ys: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)


def fit_group_costs(points: Sequence[tuple[int, float]]) -> tuple[float, float, str]:
    """(group_base_ms, group_remove_ms, how) from (group count, intra-stage pause ms) points."""
    if not points:
        raise ProfileError("no intra-stage migration was measured: visit two strategies with the same P, D falling")
    xs, ys = [float(g) for g, _ in points], [float(ms) for _, ms in points]
    if len(set(xs)) >= 2:
        base, per = fit_line(xs, ys)
        how = f"least squares over {len(xs)} intra-stage pauses (group counts {sorted(set(int(x) for x in xs))})"
        if per < 0:
            return statistics.fmean(ys), 0.0, how + "; slope < 0 clamped: a constant pause"
        if base < 0:
            return 0.0, _through_origin(xs, ys), how + "; intercept < 0 clamped: a line through the origin"
        return base, per, how
    per = statistics.fmean(ys) / xs[0]
    return 0.0, per, f"one group count ({int(xs[0])}) in {len(xs)} intra-stage pauses: all of it per group"


def p2p_table(latency_ms: float, ms_per_byte: float, source: str) -> P2PTable:
    """A `P2PTable` of the line latency + bytes * ms_per_byte, at powers of two from 4 B to 1 GiB."""
    return P2PTable(tuple((1 << k, 1000.0 * (latency_ms + ms_per_byte * (1 << k))) for k in range(2, 31)), source)


def fit_p2p(points: Sequence[tuple[int, float]]) -> tuple[float, float, str]:
    """(latency_ms, ms_per_byte, how) from (bytes, transfer ms) points."""
    pts = [(float(b), float(ms)) for b, ms in points if b > 0]
    if not pts:
        raise ProfileError("no transfer was measured: the visit needs an inter-stage or pipeline migration")
    xs, ys = [b for b, _ in pts], [ms for _, ms in pts]
    if len(set(xs)) >= 2:
        lat, per = fit_line(xs, ys)
        how = f"latency + bandwidth line, least squares over {len(pts)} transfers"
        if per > 0 and lat >= 0:
            return lat, per, how
        if per > 0:
            return 0.0, _through_origin(xs, ys), how + "; latency < 0 clamped: through the origin"
        return statistics.fmean(ys), 0.0, how + "; time does not grow with bytes: a constant (their mean)"
    return 0.0, _through_origin(xs, ys), f"one transfer size in {len(pts)} transfers: bandwidth only, no latency"


def fit_build_ms(
    residuals: Mapping[int, Sequence[float]], ps: Iterable[int]
) -> tuple[dict[int, float], dict[int, str]]:
    """build_ms for every P in `ps` from measured residuals per P (median, clamped at 0): unmeasured P are linearly
    interpolated between measured neighbours, or take the nearest measured value outside them. Returns the values
    and, per P, how it was obtained."""
    measured = {p: max(0.0, statistics.median(v)) for p, v in residuals.items() if v}
    if not measured:
        raise ProfileError("no pipeline migration was measured: the visit needs two different P")
    known = sorted(measured)
    build: dict[int, float] = {}
    how: dict[int, str] = {}
    for p in sorted(set(ps) | set(known)):
        if p in measured:
            build[p] = measured[p]
            n = len(residuals[p])
            clamped = " (negative, clamped to 0)" if statistics.median(residuals[p]) < 0 else ""
            how[p] = f"measured: median of {n} pipeline pause{'s' if n > 1 else ''}{clamped}"
            continue
        lo = [q for q in known if q < p]
        hi = [q for q in known if q > p]
        if lo and hi:
            a, b = lo[-1], hi[0]
            build[p] = measured[a] + (measured[b] - measured[a]) * (p - a) / (b - a)
            how[p] = f"interpolated between P={a} and P={b}"
        else:
            q = lo[-1] if lo else hi[0]
            build[p] = measured[q]
            how[p] = f"extrapolated: the value of P={q}, the nearest measured"
    return build, how


def _missing_params(spec: ModelSpec, src: Strategy, dst: Strategy) -> int:
    """Parameters a pipeline migration src -> dst fetches in the cost model's view (every replica alive)."""
    return healthy_missing(spec.layer_params, spec.partition(src[1]), spec.partition(dst[1]), src[0])


def predict_ms(cost: CostModel, m: Migration) -> float:
    """What the cost model charges for the measured migration `m`."""
    d, p = m.dst
    if m.kind == INTRA:
        return cost.intra_stage_ms(d, p)
    if m.kind == INTER:
        return cost.inter_stage_ms(d, p, m.survivors or (m.src[0],) * p, m.add)
    if m.kind == PIPELINE:
        return cost.pipeline_ms(d, p, _missing_params(cost.spec, m.src, m.dst), m.add)
    if m.kind == RESTART:
        return cost.checkpoint_restart_ms(d, p, add=True, save=True)
    raise ProfileError(f"epoch {m.epoch}: no cost formula for a {m.kind!r} migration")


def _groups(d: int, p: int) -> int:
    return d + p + 1 + d * p


def _uses(m: Migration) -> list[str]:
    """What the calibration fits with `m`: the prologue's preemption (an instance starting meanwhile) feeds nothing,
    the add's pipeline or inter-stage pause is not used for build costs (its hold is the join, partly hidden)."""
    uses = []
    if m.role == "main" and m.kind == INTRA:
        uses.append("group costs")
    if m.role == "main" and m.kind == PIPELINE and not m.add:
        uses.append("build_ms")
    if m.role == "add" and m.join_ms is not None:
        uses.append("rendezvous_ms")
    if m.kind == RESTART:
        uses.append("checkpoint_ms")
    if m.role in ("main", "add") and m.transfer_ms is not None and m.transfer_bytes > 0:
        uses.append("p2p")
    return uses


def calibrate(spec: ModelSpec, migrations: Sequence[Migration], ps: Iterable[int],
              source: str = "trainer.profile") -> tuple[CostConstants, dict[str, Any]]:  # fmt: skip
    """`CostConstants` (group_mode "groups") under which `CostModel(spec, ·)` reproduces the measured pauses, and
    the report: per constant its value and source, per migration the measured pause next to the model's."""
    intra = [(_groups(*m.dst), m.pause_ms) for m in migrations if "group costs" in _uses(m)]
    base, per_group, group_how = fit_group_costs(intra)
    xfers = [(m.transfer_bytes, m.transfer_ms) for m in migrations if "p2p" in _uses(m)]
    lat, ms_per_byte, p2p_how = fit_p2p(xfers)
    joins = [m.join_ms for m in migrations if "rendezvous_ms" in _uses(m)]
    if not joins:
        raise ProfileError("no added instance was measured: the profile needs an add to time a new instance's join")
    rendezvous = statistics.median(joins)
    mib_s = 1000.0 / ms_per_byte / MiB if ms_per_byte > 0 else None
    bandwidth = f"{mib_s:.1f} MiB/s" if mib_s is not None else "no bandwidth term"
    p2p = p2p_table(lat, ms_per_byte, f"{source}: {lat:.2f} ms latency + {bandwidth} ({p2p_how})")
    ps = sorted(set(ps))
    zero = CostConstants(rendezvous_ms=rendezvous, extra_restart_ms=0.0, proc_ms=0.0, group_base_ms=base,
                         group_mode="groups", group_add_ms=per_group, group_remove_ms=per_group,
                         build_ms={p: 0.0 for p in ps}, checkpoint_ms=0.0, p2p=p2p, source="")  # fmt: skip
    cost0 = CostModel(spec, zero)
    residuals: dict[int, list[float]] = {}
    for m in migrations:
        if "build_ms" in _uses(m):
            residuals.setdefault(m.dst[1], []).append(m.pause_ms - predict_ms(cost0, m))
    build, build_how = fit_build_ms(residuals, ps)
    cost1 = CostModel(spec, replace(zero, build_ms=build))
    ckpts = [m.pause_ms - predict_ms(cost1, m) for m in migrations if "checkpoint_ms" in _uses(m)]
    if not ckpts:
        raise ProfileError("no checkpoint-restart was measured")
    ckpt = max(0.0, statistics.median(ckpts))
    ckpt_how = f"checkpoint-restart pause minus the restart terms and the serial reload ({len(ckpts)} measured)"
    if statistics.median(ckpts) < 0:
        ckpt_how += "; negative, clamped to 0"
    sources = {
        "group_base_ms": group_how, "group_remove_ms": group_how,
        "group_add_ms": "= group_remove_ms: an added instance joins as standby before its epoch",
        "proc_ms": "0: not separable from group_base_ms", "extra_restart_ms": "0: not separable from rendezvous_ms",
        "p2p": p2p_how, "rendezvous_ms": f"the added instance's start-to-join time ({len(joins)} measured)",
        "build_ms": {str(p): h for p, h in build_how.items()}, "checkpoint_ms": ckpt_how,
    }  # fmt: skip
    text = "; ".join(f"{k}: {v if isinstance(v, str) else ', '.join(f'P={p} {h}' for p, h in v.items())}"
                     for k, v in sources.items())  # fmt: skip
    constants = replace(zero, build_ms=build, checkpoint_ms=ckpt, source=f"{source}: {text}")
    cost = CostModel(spec, constants)
    rows = []
    for m in migrations:
        note = {"preempt": "an added instance was starting meanwhile: not fitted",
                "add": f"the instance's start overlapped training: the job held {m.hold_ms:.0f} ms of its "
                       f"{m.join_ms or 0:.0f} ms join; the model charges all of it"}.get(m.role, "")  # fmt: skip
        rows.append({"epoch": m.epoch, "step": m.step, "kind": m.kind, "from": list(m.src), "to": list(m.dst),
                     "role": m.role, "measured_ms": m.pause_ms, "model_ms": predict_ms(cost, m),
                     "used_for": ", ".join(_uses(m)), "note": note})  # fmt: skip
    report = {
        "rows": rows,
        "constants": {
            "group_base_ms": base, "group_remove_ms": per_group, "group_add_ms": per_group,
            "p2p_latency_ms": lat, "p2p_mib_per_s": mib_s, "rendezvous_ms": rendezvous,
            "build_ms": {str(p): v for p, v in build.items()}, "checkpoint_ms": ckpt,
        },  # fmt: skip
        "sources": sources,
        "points": {"intra": intra, "transfers": xfers, "build_residuals": {str(p): v for p, v in residuals.items()},
                   "joins_ms": joins, "checkpoint_residuals": ckpts},  # fmt: skip
    }
    return constants, report


# ------------------------------------------------------------------------------------------------ the profile


@dataclass(frozen=True)
class RuntimeProfile:
    """What `parcae profile` measured on this machine: the planner's two inputs and the raw measurements behind them.

    `throughput`: iteration ms per (D, P) at the trainer's global batch. `constants`: the cost model's constants,
    calibrated (see the module docstring). `spec`: the runtime model as the cost model sees it. `measured`: the raw
    numbers (per strategy step times, per migration kind pauses / bytes / phases, the fit, the machine). Feed
    `throughput` and `cost_model()` to `liveput.scenarios.ScenarioStore`.
    """

    throughput: ThroughputProfile
    constants: CostConstants
    spec: ModelSpec
    measured: Mapping[str, Any] = field(compare=False)
    created: str = ""
    command: str = ""

    def cost_model(self) -> CostModel:
        return CostModel(self.spec, self.constants)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "created": self.created, "command": self.command,
            "throughput": self.throughput.to_dict(), "constants": _constants_to_dict(self.constants),
            "spec": _spec_to_dict(self.spec), "measured": self.measured,
        }  # fmt: skip

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        text = jsonio.dumps_strict(self.to_dict(), indent=2) + "\n"
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_dict(cls, data: Any, where: str = "<profile>") -> RuntimeProfile:
        r = _Reader(where)
        if not isinstance(data, Mapping):
            raise ProfileFormatError(f"{where}: expected a JSON object (a parcae runtime profile), "
                                     f"got {type(data).__name__}")  # fmt: skip
        fmt = data.get("format")
        if fmt != FORMAT:
            raise ProfileFormatError(f"{where}: field 'format': expected {FORMAT!r}, got {fmt!r} — not a profile "
                                     "written by `parcae profile`")  # fmt: skip
        version = r.get(data, "version", int)
        if version != VERSION:
            raise ProfileFormatError(f"{where}: field 'version': this parcae reads version {VERSION}, got {version}")
        try:
            throughput = ThroughputProfile.from_dict(r.get(data, "throughput", Mapping))
        except (ValueError, TypeError, AttributeError) as e:
            raise ProfileFormatError(f"{where}: field 'throughput': {e}") from None
        return cls(
            throughput=throughput, constants=_constants_from_dict(r, r.get(data, "constants", Mapping)),
            spec=_spec_from_dict(r, r.get(data, "spec", Mapping)), measured=dict(r.get(data, "measured", Mapping)),
            created=str(data.get("created", "")), command=str(data.get("command", "")),
        )  # fmt: skip

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RuntimeProfile:
        """Read a profile written by `to_json`; a missing, malformed or foreign file raises `ProfileFormatError`
        naming the file and the field."""
        p = Path(path)
        try:
            data = jsonio.loads(jsonio.read(p))  # bounded: size, nesting, UTF-8
        except OSError as e:
            raise ProfileFormatError(f"{p}: cannot read the profile ({e.strerror or e})") from None
        except jsonio.JsonSyntaxError as e:
            raise ProfileFormatError(f"{p}: not JSON ({e.reason} at line {e.line} column {e.column})") from None
        except jsonio.JsonInputError as e:  # too large, too deep, not UTF-8
            fix = "expected a runtime profile written by `parcae profile`"
            raise ProfileFormatError(f"{e.at(str(p))}; {fix}") from None
        return cls.from_dict(data, str(p))


class _Reader:
    """Typed field access with errors naming the file and the dotted field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def get(self, d: Mapping[str, Any], key: str, kind: Any, path: str = "") -> Any:
        name = f"{path}.{key}" if path else key
        if key not in d:
            raise ProfileFormatError(f"{self.where}: field {name!r} is missing")
        v = d[key]
        if kind is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        elif kind is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, kind)
        if not ok:
            want = {Mapping: "an object", list: "an array", str: "a string", int: "an integer"}.get(kind, "a number")
            raise ProfileFormatError(f"{self.where}: field {name!r}: expected {want}, got {json.dumps(v)[:60]}")
        return v


_CONST_NUMBERS = ("rendezvous_ms", "extra_restart_ms", "proc_ms", "group_base_ms", "group_add_ms", "group_remove_ms",
                  "replica_add_factor", "checkpoint_ms")  # fmt: skip


def _constants_to_dict(c: CostConstants) -> dict[str, Any]:
    return {
        **{k: getattr(c, k) for k in _CONST_NUMBERS}, "group_mode": c.group_mode,
        "replica_steps": [[int(d), float(ms)] for d, ms in c.replica_steps],
        "build_ms": {str(p): float(ms) for p, ms in sorted(c.build_ms.items())},
        "p2p": {"points": [[int(b), float(us)] for b, us in c.p2p.points], "source": c.p2p.source},
        "source": c.source,
    }  # fmt: skip


def _constants_from_dict(r: _Reader, d: Mapping[str, Any]) -> CostConstants:
    values = {k: float(r.get(d, k, float, "constants")) for k in _CONST_NUMBERS}
    mode = r.get(d, "group_mode", str, "constants")
    if mode not in ("groups", "instances", "replicas"):
        raise ProfileFormatError(f"{r.where}: field 'constants.group_mode': expected groups, instances or replicas, "
                                 f"got {mode!r}")  # fmt: skip
    build: dict[int, float] = {}
    for k, v in r.get(d, "build_ms", Mapping, "constants").items():
        if not k.isdigit() or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProfileFormatError(f"{r.where}: field 'constants.build_ms': expected {{\"P\": ms}}, got "
                                     f"{json.dumps(k)}: {json.dumps(v)}")  # fmt: skip
        build[int(k)] = float(v)
    steps = r.get(d, "replica_steps", list, "constants")
    p2p = r.get(d, "p2p", Mapping, "constants")
    points = r.get(p2p, "points", list, "constants.p2p")
    try:
        replica_steps = tuple((int(a), float(b)) for a, b in steps)
        table = P2PTable(tuple((int(b), float(us)) for b, us in points), str(p2p.get("source", "")))
    except (TypeError, ValueError) as e:
        raise ProfileFormatError(f"{r.where}: field 'constants.replica_steps' or 'constants.p2p.points': {e}") from None
    return CostConstants(**values, group_mode=mode, replica_steps=replica_steps, build_ms=build, p2p=table,
                         source=str(d.get("source", "")))  # fmt: skip


def _spec_to_dict(s: ModelSpec) -> dict[str, Any]:
    return {
        "name": s.name, "optim_states": s.optim_states, "micro_batch": s.micro_batch, "seq_len": s.seq_len,
        "hidden": s.hidden, "param_bytes": getattr(s, "param_bytes", 4), "source": s.source,
        "layers": [{"name": layer.name, "params": layer.params} for layer in s.layers],
    }  # fmt: skip


def _spec_from_dict(r: _Reader, d: Mapping[str, Any]) -> RuntimeModelSpec:
    layers = []
    for i, item in enumerate(r.get(d, "layers", list, "spec")):
        if not isinstance(item, Mapping):
            raise ProfileFormatError(f"{r.where}: field 'spec.layers[{i}]': expected an object {{name, params}}")
        layers.append(Layer(str(r.get(item, "name", str, f"spec.layers[{i}]")),
                            int(r.get(item, "params", int, f"spec.layers[{i}]"))))  # fmt: skip
    if not layers:
        raise ProfileFormatError(f"{r.where}: field 'spec.layers' is empty")
    return RuntimeModelSpec(
        name=r.get(d, "name", str, "spec"), layers=tuple(layers), optim_states=r.get(d, "optim_states", int, "spec"),
        micro_batch=int(d.get("micro_batch", 1)), seq_len=int(d.get("seq_len", 0)), hidden=int(d.get("hidden", 0)),
        source=str(d.get("source", "")), param_bytes=r.get(d, "param_bytes", int, "spec"),
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ measure (I/O)


def machine_info(start_method: str) -> dict[str, Any]:
    import torch

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "cpu_count": os.cpu_count(), "usable_cores": usable, "torch_threads_per_worker": 1,
        "start_method": start_method, "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__,
    }  # fmt: skip


def measure(
    model: str = "tiny-gpt",
    workers: int = 4,
    *,
    steps_per_strategy: int = 6,
    rounds: int = 2,
    strategies: Iterable[Strategy] | None = None,
    seed: int = 0,
    out_dir: str | os.PathLike[str],
    progress: Callable[[str], None] | None = None,
    start_method: str = "spawn",
    timeout_s: float = 300.0,
    command: str = "",
) -> RuntimeProfile:
    """Measure the runtime profile of `model` on `workers` local processes in one job (see the module docstring).

    `strategies`: the (D, P) to visit (default: every feasible one), `rounds` times (`visit_rounds`); `out_dir`: a
    fresh folder for the job's files; `progress(message)` is told what is happening; `start_method`: how worker
    processes start ("spawn" is cold, as a real new instance or restart; "forkserver" is a warm pool and makes
    rendezvous and restarts cheap).
    """
    from trainer.config import TrainConfig, model_config
    from trainer.coordinator import check_schedule
    from trainer.events import group_events, parse_events
    from trainer.migration import layer_sizes
    from trainer.config import CheckpointConfig, ControlPlaneConfig, JobConfig, ProviderConfig
    from trainer.events import Schedule
    from trainer.run import run_job

    if workers < 2:
        raise ProfileError(TOO_FEW.format(workers))
    say = progress or (lambda _msg: None)
    mcfg = model_config(model, seed=seed)
    n_layers = mcfg.n_layers_total
    feasible = feasible_strategies(workers, n_layers, TrainConfig().global_batch)
    if strategies is None:
        chosen = feasible
    else:
        chosen = [(int(d), int(p)) for d, p in strategies]
        bad = [s for s in chosen if s not in feasible]
        if bad:
            d, p = bad[0]
            raise ProfileError(f"strategy {d}x{p} is not feasible on {workers} workers with {n_layers} layers "
                               f"(feasible: {', '.join(f'{a}x{b}' for a, b in feasible)})")  # fmt: skip
    order = visit_rounds(visit_order(chosen), rounds)
    tcfg = TrainConfig(seed=seed)
    sched = profile_schedule(workers, order, steps_per_strategy, tcfg.global_batch)
    tcfg = TrainConfig(seed=seed, steps=sched.steps)
    say(f"profiling {model} on {workers} workers: {len(set(order))} strategies, {sched.steps} steps")
    t0 = time.monotonic()
    job = JobConfig(out_dir=str(out_dir), model=mcfg, train=tcfg, checkpoint=CheckpointConfig(every=0),
                    control=ControlPlaneConfig(timeout_s=timeout_s),
                    provider=ProviderConfig(start_method=start_method, max_processes=workers))  # fmt: skip
    result = run_job(job, Schedule(workers=workers, strategy=sched.initial, events=list(sched.events)))
    wall = time.monotonic() - t0
    say("fitting the cost model")
    planned = check_schedule(mcfg, tcfg, workers, sched.initial, sched.steps, group_events(parse_events(sched.events)))
    sizes = layer_sizes(mcfg)
    migrations = migrations_from_result(result, planned, sched, sizes.state_bytes)
    step_ms = iteration_times(result["epochs"], sched.main_start)
    missing = sorted(set(order) - set(step_ms))
    if missing:
        raise ProfileError(f"no iteration time measured for {', '.join(f'{d}x{p}' for d, p in missing)}")
    spec = runtime_spec(mcfg, tcfg.micro_batch)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    machine = machine_info(start_method)
    label = f"parcae profile {created}: {model}, {workers} workers, {machine['usable_cores']} cores, {start_method}"
    throughput = ThroughputProfile(
        model=model, global_batch=tcfg.global_batch, micro_batch=tcfg.micro_batch,
        iteration_ms={s: min(v) for s, v in step_ms.items()}, min_p=1,
        source=f"{label}: least over the strategy's epochs of ms per step ({rounds} round(s) of the visit, "
               f"{steps_per_strategy} steps each)",
    )  # fmt: skip
    constants, fit = calibrate(spec, migrations, {p for _, p in throughput.iteration_ms}, label)
    measured = {
        "machine": machine,
        "job": {"model": model, "workers": workers, "steps": sched.steps, "steps_per_strategy": steps_per_strategy,
                "rounds": rounds, "seed": seed, "global_batch": tcfg.global_batch, "micro_batch": tcfg.micro_batch,
                "visit": [list(s) for s in order], "events": list(sched.events), "wall_s": wall,
                "loss_first_last": [result["loss"][0], result["loss"][-1]]},  # fmt: skip
        "step_ms": {f"{d}x{p}": v for (d, p), v in sorted(step_ms.items(), key=lambda kv: (kv[0][1], kv[0][0]))},
        "warmup": "the first step after a migration is included (the store keeps epoch bounds only); the prologue, "
                  "with the job's first step, is excluded",
        "epochs": result["epochs"],
        "migrations": [m.to_dict() for m in migrations],
        "fit": fit["rows"],
        "calibration": {k: v for k, v in fit.items() if k != "rows"},
    }  # fmt: skip
    measured = json.loads(json.dumps(measured))  # plain JSON data, as `load` gives it back
    return RuntimeProfile(throughput, constants, spec, measured, created,
                          command or f"trainer.profile.measure({model!r}, {workers}, steps_per_strategy="
                                     f"{steps_per_strategy}, rounds={rounds}, seed={seed}, "
                                     f"start_method={start_method!r})")  # fmt: skip


def profile_path(model: str, workers: int, runs: str | os.PathLike[str] = "runs") -> Path:
    """Where a measured profile of ``model`` on ``workers`` processes is cached: ``runs/profile-<model>-<workers>.json``."""
    return Path(runs) / f"profile-{model}-{workers}.json"


def cached_profile(
    model: str, workers: int, path: str | os.PathLike[str] | None = None, *,
    progress: Callable[[str], None] | None = None,
) -> tuple[RuntimeProfile, str]:  # fmt: skip
    """The runtime profile at ``path`` (default `profile_path`) and where it came from; measured now (one job of
    ``workers`` processes, under a minute for tiny-gpt) and written there when the file does not exist, so the next
    job reuses it. A file that is not a profile raises `ProfileFormatError` naming it."""
    target = Path(path) if path else profile_path(model, workers)
    if target.is_file():
        return RuntimeProfile.load(target), f"loaded {target}"
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".profile-{model}-{workers}-", dir=target.parent))
    try:
        profile = measure(model, workers, out_dir=scratch / "job", progress=progress)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    profile.to_json(target)
    return profile, f"measured now, cached in {target}"
