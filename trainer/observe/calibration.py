"""Calibration of liveput's cost model on measured migrations: pure functions of plain data, tested on synthetic
measurements.

Owns: `Migration` (one measured reconfiguration, as the fits see it), the fits (`fit_line`, `fit_group_costs`,
`fit_p2p`, `fit_build_ms`), `p2p_table`, `predict_time` / `predict_ms` and `calibrate` (every constant's source is
written to `CostConstants.source`; `calibrate`'s docstring says how each is obtained), and the split of lead time from
downtime (`split_lead_down`, `fit_slowdown`: the same schedule measured unprepared and prepared). Must not touch: the
cost formulas (`liveput.migration.CostModel`: the calibration inverts them, it never changes them), the job that
measures (`trainer.control.measure`), the profile's file format (`trainer.observe.profile`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from liveput import (
    CostConstants,
    CostModel,
    MiB,
    MigrationKind,
    MigrationTime,
    ModelSpec,
    P2PTable,
    Strategy,
    healthy_missing,
)
from trainer.observe.profile import ProfileError

INTRA = MigrationKind.INTRA_STAGE.value
INTER = MigrationKind.INTER_STAGE.value
PIPELINE = MigrationKind.PIPELINE.value
RESTART = MigrationKind.CHECKPOINT_RESTART.value


@dataclass(frozen=True)
class Migration:
    """One measured reconfiguration, as the calibration sees it (times in ms).

    role: "main" (a visit migration), "preempt" (the prologue's, overlapping the added instance's start: reported,
    not fitted), "add" (the added instance's: rendezvous and its transfer), "restart" (the checkpoint-restart).
    survivors: per stage of `src`, the replicas that stay (inter-stage). transfer_bytes: the busiest transfer
    party's bytes (sent + received); transfer_ms: the slowest new member's transfer phase (None: no transfer).
    join_ms: for the add, its process's start-to-join time. prepared: the runtime prepared it in the background
    (its pause is then the downtime only).
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
    prepared: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch, "step": self.step, "kind": self.kind, "from": list(self.src), "to": list(self.dst),
            "role": self.role, "add": self.add, "pause_ms": self.pause_ms, "hold_ms": self.hold_ms,
            "join_ms": self.join_ms, "transfer_ms": self.transfer_ms, "transfer_bytes": self.transfer_bytes,
            "bytes_moved": self.bytes_moved, "survivors": list(self.survivors), "phases_ms": dict(self.phases_ms),
            "prepared": self.prepared,
        }  # fmt: skip


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


def predict_time(cost: CostModel, m: Migration) -> MigrationTime:
    """What the cost model charges for the measured migration `m`: its full cost, and the lead time and downtime it
    splits that into for a runtime that prepares it (a checkpoint-restart is never prepared: all downtime)."""
    d, p = m.dst
    if m.kind == INTRA:
        return cost.intra_stage_time(d, p)
    if m.kind == INTER:
        return cost.refill_time(d, p, m.survivors or (m.src[0],) * p, m.add)
    if m.kind == PIPELINE:
        return cost.pipeline_time(d, p, _missing_params(cost.spec, m.src, m.dst), m.add, old_p=m.src[1])
    if m.kind == RESTART:
        full = cost.checkpoint_restart_ms(d, p, add=True, save=True)
        return MigrationTime(full, down_ms=full)
    raise ProfileError(f"epoch {m.epoch}: no cost formula for a {m.kind!r} migration")


def predict_ms(cost: CostModel, m: Migration) -> float:
    """What the cost model charges for the measured migration `m` when nothing is prepared (the reference's)."""
    return predict_time(cost, m).full_ms


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
              source: str = "trainer.observe.profile") -> tuple[CostConstants, dict[str, Any]]:  # fmt: skip
    """`CostConstants` (group_mode "groups") under which `CostModel(spec, ·)` reproduces the measured pauses, and
    the report: per constant its value and source, per migration the measured pause next to the model's.


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

    """
    intra = [(_groups(*m.dst), m.pause_ms) for m in migrations if "group costs" in _uses(m)]
    base, per_group, group_how = fit_group_costs(intra)
    # (`_uses` names "p2p" and "rendezvous_ms" only for migrations that measured them: the None checks restate it)
    xfers = [(m.transfer_bytes, m.transfer_ms) for m in migrations if "p2p" in _uses(m) and m.transfer_ms is not None]
    lat, ms_per_byte, p2p_how = fit_p2p(xfers)
    joins = [m.join_ms for m in migrations if "rendezvous_ms" in _uses(m) and m.join_ms is not None]
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
    sources: dict[str, str | dict[str, str]] = {
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
            "group_base_ms": base,
            "group_remove_ms": per_group,
            "group_add_ms": per_group,
            "p2p_latency_ms": lat,
            "p2p_mib_per_s": mib_s,
            "rendezvous_ms": rendezvous,
            "build_ms": {str(p): v for p, v in build.items()},
            "checkpoint_ms": ckpt,
        },  # fmt: skip
        "sources": sources,
        "points": {
            "intra": intra,
            "transfers": xfers,
            "build_residuals": {str(p): v for p, v in residuals.items()},
            "joins_ms": joins,
            "checkpoint_residuals": ckpts,
        },  # fmt: skip
    }
    return constants, report


# ------------------------------------------------------------------------------------------------ lead and downtime


def trigger_kind(m: Migration) -> str:
    """How the split report names `m`: the prologue's preemption is the noticed one ("notice"), its add the
    "addition"; the visit's migrations are planned re-shapes, named by kind."""
    return {"preempt": "notice", "add": "addition"}.get(m.role, m.kind)


SPLIT_FIELDS = ("full_ms", "down_ms", "lead_ms", "model_full_ms", "model_lead_ms", "model_down_ms")


def split_lead_down(cost: CostModel, full: Sequence[Migration], prepared: Sequence[Migration]) -> dict[str, Any]:
    """Lead time and downtime per migration kind and trigger, measured on one schedule run twice: with nothing prepared
    (`full`: each pause is the whole cost) and prepared in the background (`prepared`: each pause is the downtime). What
    preparation took off the boundary is the lead time (the full pause minus the downtime, at least 0; 0 for a migration
    the runtime did not prepare, whose two pauses differ by noise only). Beside each, the model's split of the same move
    (`predict_time`, under `cost`): the check of the decomposition `liveput.migration` writes down. The two runs pair by
    epoch (one schedule, the same epochs)."""
    by_epoch = {m.epoch: m for m in prepared}
    rows: list[dict[str, Any]] = []
    for m in full:
        q = by_epoch.get(m.epoch)
        if q is None or (q.kind, q.dst) != (m.kind, m.dst):
            raise ProfileError(f"epoch {m.epoch} ({m.kind} to {m.dst[0]}x{m.dst[1]}) is not in the prepared run: "
                               "the two runs did not follow the same schedule")  # fmt: skip
        t = predict_time(cost, m)
        rows.append({"epoch": m.epoch, "kind": trigger_kind(m), "from": list(m.src), "to": list(m.dst),
                     "prepared": q.prepared, "full_ms": m.pause_ms, "down_ms": q.pause_ms,
                     "lead_ms": max(0.0, m.pause_ms - q.pause_ms) if q.prepared else 0.0, "model_full_ms": t.full_ms,
                     "model_lead_ms": t.lead_ms, "model_down_ms": t.down_ms})  # fmt: skip
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(r)
    kinds = {
        k: {"count": len(rs), "prepared": sum(1 for r in rs if r["prepared"]),
            **{f: statistics.median(r[f] for r in rs) for f in SPLIT_FIELDS}}
        for k, rs in by_kind.items()
    }  # fmt: skip
    return {"rows": rows, "kinds": kinds}


def fit_slowdown(pairs: Sequence[tuple[float, float]]) -> tuple[float | None, str]:
    """The old strategy's slowdown while a preparation runs beside it (`liveput.Preparation.slowdown`), from
    `pairs` of (ms an epoch's last step took with nothing prepared, ms longer it took with the next epoch prepared
    beside it: `trainer.control.measure.slowdown_pairs`): the median of extra / step (a preparation runs during one
    step), clamped to [0, 1].
    Returns the value and how it was obtained (with the quartiles: two runs on a shared machine are noisy); None
    and why when no epoch had a preparation beside it (a one-step epoch is prepared before it starts)."""
    ratios = sorted(extra / step for step, extra in pairs if step > 0)
    if not ratios:
        return None, ("not measured: no epoch trained both with and without a preparation beside it (give each "
                      "strategy two steps or more: --steps-per-strategy)")  # fmt: skip
    med = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [med, med, med]
    how = (f"median over {len(ratios)} epochs of (their last step's time with the next epoch prepared beside it "
           f"- without) / that step without: {med:.3f} (quartiles {q[0]:.3f} / {q[2]:.3f})")  # fmt: skip
    if not 0.0 <= med <= 1.0:
        how += ", clamped to [0, 1]"
    return min(1.0, max(0.0, med)), how
