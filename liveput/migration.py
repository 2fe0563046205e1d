"""Migration cost model: what it costs, in milliseconds, to move a running job from (D, P) to (d, p).

Three live-migration kinds (parcae-reference §D.1–D.2):

- **intra-stage**: P unchanged and every stage keeps at least d survivors; nothing moves, only the
  communicators are rebuilt;
- **inter-stage**: P unchanged but some stage is short; spare instances receive that stage's weights and
  optimizer state point to point from a surviving replica;
- **pipeline**: p != P; the layers are repartitioned, each new stage goes to the survivor that already
  holds most of its layers and fetches only the layers it lacks, then replicas are broadcast.

Plus the restart terms they share (rendezvous, communicator rebuild, process restart, building the
pipeline) and the reactive baseline's checkpoint restart. Every constant lives in `CostConstants` with its
source so that costs measured by the trainer can replace the reference's V100 numbers. Pure functions only;
the expectation over *which* instances are preempted lives in `liveput.scenarios`.

Each move also has a `MigrationTime`: its **lead time** (work a runtime can do in the background while the old
strategy keeps training), the part of it that needs the new instances (**join**), and its **downtime** (the stop
at the switch). `Preparation` says which triggers (`Trigger`: a planned re-shape, an addition, a preemption with
notice; never a kill) are prepared, and `CostModel.effective_ms` turns a time into the training it costs. The
reference's model, where every move is a full stop, is `FULL_STOP`, the default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cache
from types import MappingProxyType
from typing import Any, Final

from liveput.model_spec import ModelSpec, load_model_spec
from liveput.network import P3_P2P, GiB, P2PTable

#: Bytes of a parameter's gradient (fp32): what a receiver still needs at the switch to catch up (`MigrationTime`).
GRADIENT_BYTES: Final = 4

#: How long before a preemption each cloud warns (AWS's spot interruption notice, GCP's preemption notice).
CLOUD_NOTICE_S: Mapping[str, float] = MappingProxyType({"aws": 120.0, "gcp": 30.0})


class MigrationKind(str, Enum):
    NONE = "none"
    INTRA_STAGE = "intra-stage"
    INTER_STAGE = "inter-stage"
    PIPELINE = "pipeline"
    START = "start"  # from no running strategy: load every stage's state
    CHECKPOINT_RESTART = "checkpoint-restart"


def migration_kind(old_p: int, new_p: int, short: bool) -> MigrationKind:
    """The live-migration kind of moving a P = ``old_p`` pipeline to ``new_p`` stages (§D.1): a new P repartitions
    the layers; the same P is inter-stage when some stage is ``short`` (keeps fewer surviving replicas than the
    target's D), else intra-stage. The trainer's migrations and the scenario expectations both classify here."""
    if new_p != old_p:
        return MigrationKind.PIPELINE
    return MigrationKind.INTER_STAGE if short else MigrationKind.INTRA_STAGE


class Trigger(str, Enum):
    """What made a migration happen, which decides how much of it a runtime can prepare."""

    PLANNED = "planned"  # the planner chose a new shape, nothing was lost: prepared one interval ahead
    ADDITION = "addition"  # the target needs instances that have just arrived: prepared while the old shape trains
    NOTICE = "notice"  # active instances are preempted with the cloud's notice: prepared during the grace period
    KILL = "kill"  # active instances went without notice: nothing could be prepared, a full stop


#: Report order of the triggers (the scenario store's and the simulator's columns).
TRIGGERS: tuple[Trigger, ...] = (Trigger.PLANNED, Trigger.ADDITION, Trigger.NOTICE, Trigger.KILL)


@dataclass(frozen=True)
class Preparation:
    """Which migrations a runtime prepares in the background, and what that costs the strategy still training.

    ``triggers``: the prepared ones (a kill never is); ``notice_s``: how long a preemption notice comes before
    the instance goes (`CLOUD_NOTICE_S`; 0 = no notice: every preemption is a kill); ``slowdown``: the fraction of
    its throughput the old strategy loses while a preparation runs beside it (transfers share its links,
    communicator builds its CPU). 0.1 is an *assumption*, as Bamboo's overhead is: the reference measured no such
    number; `parcae profile` is where this runtime's own value is to come from.
    """

    triggers: frozenset[Trigger] = frozenset({Trigger.PLANNED, Trigger.ADDITION, Trigger.NOTICE})
    notice_s: float = CLOUD_NOTICE_S["aws"]
    slowdown: float = 0.1

    def __post_init__(self) -> None:
        if Trigger.KILL in self.triggers:
            raise ValueError("a kill without notice cannot be prepared: leave Trigger.KILL out of the triggers")
        if not (math.isfinite(self.notice_s) and self.notice_s >= 0):
            raise ValueError(f"notice_s must be >= 0 seconds, got {self.notice_s!r}")
        if not 0.0 <= self.slowdown <= 1.0:
            raise ValueError(f"slowdown must be in [0, 1], got {self.slowdown!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.triggers)

    def prepares(self, trigger: Trigger) -> bool:
        """Whether a migration of ``trigger`` is prepared (a notice only when there is one)."""
        return trigger in self.triggers and (trigger is not Trigger.NOTICE or self.notice_s > 0)

    def describe(self) -> str:
        if not self.enabled:
            return "full stop (the reference's model: every migration stops training for its whole cost)"
        kinds = ", ".join(t.value for t in TRIGGERS if t in self.triggers)
        notice = f"{self.notice_s:g} s notice" if self.notice_s > 0 else "no notice"
        return f"prepared in the background ({kinds}; {notice}; old strategy {self.slowdown:.0%} slower meanwhile)"


#: The reference's model: every migration is a full stop, whatever triggered it.
FULL_STOP: Final = Preparation(triggers=frozenset(), notice_s=0.0, slowdown=0.0)


@dataclass(frozen=True)
class MigrationTime:
    """One move's time, split for a runtime that prepares it (all ms).

    ``full_ms`` is the reference's cost: the stop when nothing is prepared. With preparation, ``lead_ms`` runs in
    the background (``join_ms`` of it needs the new instances, so it cannot start before they arrive) and
    ``down_ms`` is the stop at the switch. ``lead_ms + down_ms`` exceeds ``full_ms`` by the catch-up (below).
    """

    full_ms: float
    lead_ms: float = 0.0
    join_ms: float = 0.0
    down_ms: float = 0.0


@dataclass(frozen=True)
class CostConstants:
    """Every constant of the cost model, in milliseconds unless named otherwise.

    Defaults are the reference's profiled V100 values (`cost.py CostModel`, `monte_carlo.py`, §D.2); the
    per-model factories below fill in the model-specific ones. ``group_mode`` selects how communicator
    rebuild time scales: ``"groups"`` (GPT: per process group, d + p + 1 + d*p groups), ``"instances"``
    (VGG: per instance d*p) or ``"replicas"`` (BERT/ResNet: a step function of d).
    """

    rendezvous_ms: float = 6600.0
    extra_restart_ms: float = 0.0
    proc_ms: float = 30.0
    group_base_ms: float = 35.0
    group_mode: str = "replicas"
    group_add_ms: float = 500.0
    group_remove_ms: float = 39.3
    replica_steps: tuple[tuple[int, float], ...] = ((12, 2000.0), (6, 1500.0), (0, 1000.0))
    replica_add_factor: float = 1.5
    build_ms: Mapping[int, float] = field(default_factory=dict)
    checkpoint_ms: float = 14000.0
    p2p: P2PTable = P3_P2P
    memory_gib: float | None = None  # an instance's memory for training state (None: unknown, nothing built beside)
    source: str = "Parcae reference cost.py / monte_carlo.py at efedee7 (parcae-reference §D.2, §H)"

    def build(self, p: int) -> float:
        """Time to build a p-stage pipeline engine (profiled per P; an unprofiled P is an error)."""
        try:
            return self.build_ms[p]
        except KeyError:
            raise ValueError(
                f"no pipeline build cost profiled for P={p} (known: {sorted(self.build_ms)}); "
                "exclude that P in the throughput profile or measure it"
            ) from None


def gpt15b_build_ms(p2p: P2PTable = P3_P2P) -> dict[int, float]:
    """gpt-1.5b build time: broadcast the 50257x1024 embedding plus 430 ms per block of a stage."""
    emb = p2p.ms(50257 * 1024 * 4)
    return {p: emb + 430.0 * math.ceil(48 / p) for p in range(1, 49)}


#: A V100's memory for training state, as the reference's throughput estimate counts it (§E.5).
REFERENCE_MEMORY_GIB: Final = 15.5


def reference_constants(model: str) -> CostConstants:
    """The reference's constants for one of its five models (on its V100s: `REFERENCE_MEMORY_GIB` each)."""
    return replace(_reference_constants(model), memory_gib=REFERENCE_MEMORY_GIB)


def _reference_constants(model: str) -> CostConstants:
    if model == "gpt-1.5b":
        return CostConstants(proc_ms=240.0, group_mode="groups", group_remove_ms=39.3, build_ms=gpt15b_build_ms())
    if model == "gpt-6.7b":
        build = {12: 7961, 13: 6911, 14: 6926, 15: 7002, 16: 7195, 18: 4734, 20: 5245, 22: 4818, 24: 4798, 26: 4932}
        return CostConstants(
            proc_ms=240.0,
            extra_restart_ms=2000.0,
            group_mode="groups",
            group_remove_ms=115.6,
            build_ms={k: float(v) for k, v in build.items()},
        )
    if model == "bert":
        build = {2: 1752, 3: 1123, 4: 1095, 5: 854, 6: 860, 7: 767, 8: 754, 10: 633, 12: 626, 14: 505, 16: 531}
        return CostConstants(build_ms={k: float(v) for k, v in build.items()})
    if model == "resnet152":
        build = {2: 110, 4: 90, 6: 133, 8: 135, 10: 120, 12: 55, 14: 120, 16: 125}
        return CostConstants(extra_restart_ms=3360.374, build_ms={k: float(v) for k, v in build.items()})
    if model == "vgg19":
        build = {2: 110, 3: 94, 4: 90, 5: 105, 6: 133, 7: 90, 8: 120, 9: 106}
        return CostConstants(
            extra_restart_ms=2000.0,
            group_mode="instances",
            group_add_ms=440.0,
            group_remove_ms=340.0,
            build_ms={k: float(v) for k, v in build.items()},
        )
    raise KeyError(f"no reference migration constants for model {model!r}; pass measured CostConstants")


@dataclass(frozen=True)
class CostModel:
    """Migration costs of one model under one set of constants."""

    spec: ModelSpec
    constants: CostConstants
    preparation: Preparation = FULL_STOP

    @classmethod
    def reference(cls, model: str, preparation: Preparation = FULL_STOP) -> CostModel:
        return cls(load_model_spec(model), reference_constants(model), preparation)

    def with_constants(self, **changes: Any) -> CostModel:
        return replace(self, constants=replace(self.constants, **changes))

    def prepared(self, preparation: Preparation) -> CostModel:
        """The same model under another `Preparation` (`FULL_STOP` for the reference's)."""
        return replace(self, preparation=preparation)

    # -- restart terms ---------------------------------------------------------------------------------
    def comm_groups_ms(self, d: int, p: int, add: bool) -> float:
        """Rebuilding communicators; joining new instances (``add``) is the expensive case."""
        c = self.constants
        if c.group_mode == "groups":
            groups = d + p + 1 + d * p
            g = (c.group_add_ms if add else c.group_remove_ms) * groups
        elif c.group_mode == "instances":
            g = (c.group_add_ms if add else c.group_remove_ms) * d * p
        else:
            g = next(ms for min_d, ms in c.replica_steps if d >= min_d)
            if add:
                g *= c.replica_add_factor
        return c.group_base_ms + g

    def restart_ms(self, d: int, p: int, add: bool) -> float:
        """Restart of the training engine at (d, p); ``add`` means new instances must rendezvous."""
        c = self.constants
        rdzv = (c.rendezvous_ms + c.extra_restart_ms) if add else 0.0
        return rdzv + self.comm_groups_ms(d, p, add) + c.proc_ms + c.build(p)

    def concurrent_restart_ms(self, d: int, p: int) -> float:
        """Extra cost when a new migration starts while the previous one is still running."""
        return self.restart_ms(d, p, add=False)

    # -- the three migration kinds ---------------------------------------------------------------------
    def intra_stage_ms(self, d: int, p: int) -> float:
        return self.comm_groups_ms(d, p, add=False) + self.constants.proc_ms

    def stage_transfer_ms(self, p: int) -> tuple[float, ...]:
        """p2p time to copy each stage's weights and optimizer state to one instance."""
        return tuple(self.constants.p2p.ms(b) for b in self.spec.stage_bytes(p))

    def inter_stage_ms(self, d: int, p: int, survivors: Sequence[int], add: bool) -> float:
        """Refill short stages from surviving replicas (``survivors[s]`` = live instances of stage s).

        Stages transfer in parallel (the max), except those that lost every replica — and the last stage
        down to one replica — which are restored one after another from the instance that took the
        preempted holders' hand-off during the notice period (the reference's serial Z term).
        """
        return self.refill_time(d, p, survivors, add).full_ms

    def refill_time(self, d: int, p: int, survivors: Sequence[int], add: bool) -> MigrationTime:
        """`inter_stage_ms` with its lead time and downtime: an intra-stage migration when no stage is short."""
        moved = self.refill_ms(d, p, survivors)
        return self.intra_stage_time(d, p) if moved is None else self.inter_stage_time(d, p, moved, add)

    def refill_ms(self, d: int, p: int, survivors: Sequence[int]) -> float | None:
        """The transfers of an inter-stage refill (`inter_stage_ms`): the slowest parallel one or the serial chain,
        whichever is longer; None when no stage is short (nothing moves)."""
        need = [max(d - c, 0) for c in survivors]
        if not any(need):
            return None
        t = self.stage_transfer_ms(p)
        parallel = max(t[s] for s in range(p) if need[s] > 0)
        serial = sum(t[s] for s in range(p) if survivors[s] == 0 or (s == p - 1 and survivors[s] == 1 and d >= 2))
        return max(parallel, serial)

    def pipeline_ms(self, d: int, p: int, missing_params: int, add: bool) -> float:
        """Repartition into p stages: fetch the missing layers, broadcast to the other replicas, restart.

        ``missing_params`` is the sum over new stages of the parameters their new owner lacks. The
        reference overwrote this sum with the last stage's value (`total_params_need = num_params`),
        underestimating pipeline migration; we sum it.
        """
        c = self.constants
        fetch = c.p2p.ms(missing_params * self.spec.bytes_per_param)
        broadcast = max(self.stage_transfer_ms(p)) if d > 1 else 0.0
        return fetch + broadcast + self.restart_ms(d, p, add)

    def start_ms(self, d: int, p: int) -> float:
        """Starting (d, p) with no running strategy: every layer's state is loaded, then broadcast."""
        return self.pipeline_ms(d, p, self.spec.total_params, add=True)

    # -- lead time and downtime (a runtime that prepares migrations) ---------------------------------------
    # Where each reference term goes (§D.2), and why:
    #   rendezvous_ms, extra_restart_ms  lead, join: new instances join the world as they arrive, while the old
    #                                    strategy trains; they cannot before they exist
    #   comm_groups_ms                   lead: the next epoch's communicators form beside the running ones (with
    #                                    new instances in them: join)
    #   state transfers (inter-stage     lead: the state as of a boundary is sent during the next step; the
    #   refill, pipeline fetch and       receiver then needs that step's gradients (the catch-up, downtime:
    #   broadcast)                       GRADIENT_BYTES of each parameter's bytes_per_param) to reach its peers'
    #                                    state exactly at the switch
    #   build(p)                         lead for an inter-stage refill (only the receivers build a stage, and they
    #                                    hold none, so memory is free for it); for a pipeline re-cut the survivors
    #                                    build their new stage beside the old one they train: lead when both fit
    #                                    the instance's memory (`builds_beside`), else downtime
    #   proc_ms                          downtime: the process switches engines at the boundary
    #   checkpoint_ms, a start           no preparation: nothing trains while they run
    def intra_stage_time(self, d: int, p: int) -> MigrationTime:
        groups = self.comm_groups_ms(d, p, add=False)
        return MigrationTime(self.intra_stage_ms(d, p), lead_ms=groups, down_ms=self.constants.proc_ms)

    def inter_stage_time(self, d: int, p: int, moved_ms: float, add: bool) -> MigrationTime:
        """An inter-stage refill whose transfers take ``moved_ms`` (the slowest parallel or the serial chain)."""
        return self._restart_time(moved_ms + self.restart_ms(d, p, add), d, p, add, moved_ms, build_ahead=True)

    def pipeline_time(self, d: int, p: int, missing_params: int, add: bool, old_p: int | None = None) -> MigrationTime:
        """A re-cut into p stages from ``old_p`` (None: unknown — the build stays in the downtime)."""
        c = self.constants
        moved = c.p2p.ms(missing_params * self.spec.bytes_per_param)
        moved += max(self.stage_transfer_ms(p)) if d > 1 else 0.0
        ahead = old_p is not None and self.builds_beside(old_p, p, missing_params)
        return self._restart_time(self.pipeline_ms(d, p, missing_params, add), d, p, add, moved, build_ahead=ahead)

    def builds_beside(self, old_p: int, p: int, missing_params: int) -> bool:
        """Whether every survivor can build what it lacks of its p-stage stage while it still trains its ``old_p``
        one (it keeps the layers it holds: layers are built, and move, one by one): the largest old stage's
        training footprint plus the most one survivor can lack — all ``missing_params``, at most the largest new
        stage — fit the instance's memory (`CostConstants.memory_gib`; unknown: no). The worst pairing, since any
        survivor may take any stage."""
        limit = self.constants.memory_gib
        if limit is None:
            return False
        held = _old_footprint(self.spec, limit * GiB, old_p)
        lacks = min(missing_params, max(self.spec.stage_params(p))) * self.spec.bytes_per_param
        return held is not None and held + lacks <= limit * GiB

    def _restart_time(
        self, full_ms: float, d: int, p: int, add: bool, moved_ms: float, build_ahead: bool
    ) -> MigrationTime:
        c = self.constants
        join = c.rendezvous_ms + c.extra_restart_ms + self.comm_groups_ms(d, p, add=True) if add else 0.0
        groups = 0.0 if add else self.comm_groups_ms(d, p, add=False)
        build = c.build(p)
        catch_up = moved_ms * GRADIENT_BYTES / self.spec.bytes_per_param
        lead = join + groups + moved_ms + (build if build_ahead else 0.0)
        down = c.proc_ms + catch_up + (0.0 if build_ahead else build)
        return MigrationTime(full_ms, lead, join, down)

    def effective_ms(self, time: MigrationTime, trigger: Trigger, old_over_new: float, standbys: bool = False) -> float:
        """What a move costs the job, in ms of the target strategy's throughput, under this model's `Preparation`.

        Unprepared (a kill, a start, or a trigger the preparation leaves out): the full stop. A noticed preemption:
        the grace period hides the lead, the old strategy training through it ``slowdown`` slower — all of it when
        the instances the target adds are ``standbys`` (alive when the notice came), else all but their join,
        which waits for them to arrive; what it cannot hide is paid stopped. A planned re-shape
        or an addition: the old strategy trains (``slowdown`` slower) through the whole lead, then the switch
        stops; ``old_over_new`` (the old strategy's throughput over the target's) prices that lead. Never more
        than the full stop (a runtime can always not prepare), so the full cost stays an upper bound.
        """
        prep = self.preparation
        if not prep.prepares(trigger):
            return time.full_ms
        if trigger is Trigger.NOTICE:
            waits = 0.0 if standbys else time.join_ms
            ahead = time.lead_ms - waits
            hidden = min(ahead, 1000.0 * prep.notice_s)
            paid = time.down_ms + waits + (ahead - hidden) + prep.slowdown * hidden * old_over_new
        else:
            kept = min(1.0, (1.0 - prep.slowdown) * old_over_new)
            paid = time.down_ms + time.lead_ms * (1.0 - kept)
        return min(time.full_ms, paid)

    def trigger(self, preempted: bool, add: bool) -> Trigger:
        """The trigger of a move that lost active instances (``preempted``) or needs new ones (``add``)."""
        if preempted:
            return Trigger.NOTICE if self.preparation.notice_s > 0 else Trigger.KILL
        return Trigger.ADDITION if add else Trigger.PLANNED

    def checkpoint_restart_ms(self, d: int, p: int, add: bool, save: bool = True) -> float:
        """The reactive baseline (§H): checkpoint save + load, a serialised reload of every stage, restart."""
        ckpt = self.constants.checkpoint_ms if save else 0.0
        return self.restart_ms(d, p, add) + ckpt + sum(self.stage_transfer_ms(p))


@cache
def _old_footprint(spec: ModelSpec, limit_bytes: float, p: int) -> int | None:
    """The largest training footprint of a p-stage cut's stages (None: it does not fit at all)."""
    memory = spec.stage_memory(p, limit_bytes)
    return None if memory is None else max(m.total_bytes for m in memory)


def overlap_params(layer_params: Sequence[int], a: tuple[int, int], b: tuple[int, int]) -> int:
    """Parameters in the layers shared by the half-open layer ranges ``a`` and ``b``."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return sum(layer_params[lo:hi]) if hi > lo else 0


@dataclass(frozen=True)
class StageOverlap:
    """How the stages of a new partition overlap those of the old one.

    New stage j overlaps the contiguous old stages ``ranges[j]`` (``overlap[j][s]`` parameters in
    common) and two consecutive new stages share at most one old stage, the last of ``ranges[j]``
    (``carries[j]``, or -1): that chain structure is what makes the optimal assignment, and its
    expectation over preemptions, a small dynamic program. ``demand[s]`` is how many new stages could
    use a replica of old stage s.
    """

    ranges: tuple[tuple[int, ...], ...]
    overlap: tuple[dict[int, int], ...]
    size: tuple[int, ...]
    demand: dict[int, int]
    carries: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.size)

    def carry(self, j: int) -> int:
        """The old stage new stage j shares with new stage j+1, or -1."""
        return self.carries[j] if 0 <= j < len(self.carries) else -1


@cache
def stage_overlap(layer_params: tuple[int, ...], old_cuts: tuple[int, ...], new_cuts: tuple[int, ...]) -> StageOverlap:
    prefix = [0]
    for n in layer_params:
        prefix.append(prefix[-1] + n)
    n_old = len(old_cuts) - 1
    ranges, overlap = [], []
    s = 0
    for j in range(len(new_cuts) - 1):
        lo, hi = new_cuts[j], new_cuts[j + 1]
        while old_cuts[s + 1] <= lo:
            s += 1
        ov, t = {}, s
        while t < n_old and old_cuts[t] < hi:
            ov[t] = prefix[min(hi, old_cuts[t + 1])] - prefix[max(lo, old_cuts[t])]
            t += 1
        ranges.append(tuple(ov))
        overlap.append(ov)
    demand: dict[int, int] = {}
    for rng in ranges:
        for t in rng:
            demand[t] = demand.get(t, 0) + 1
    size = tuple(prefix[new_cuts[j + 1]] - prefix[new_cuts[j]] for j in range(len(new_cuts) - 1))
    carries = tuple(
        ranges[j][-1] if j + 1 < len(ranges) and ranges[j][-1] == ranges[j + 1][0] else -1 for j in range(len(ranges))
    )
    return StageOverlap(tuple(ranges), tuple(overlap), size, demand, carries)


def advance_assignment(
    so: StageOverlap, j: int, best: dict[int, int], capacity: Mapping[int, int]
) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
    """One step of the assignment DP: extend new stages 0..j-1 with new stage j.

    ``best[u]`` is the largest overlap reachable for stages < j having used u replicas of the old
    stage they share with j (``so.carry(j-1)``). Returns the same table for stages <= j (keyed by the
    replicas of ``so.carry(j)`` used) and, per new key, the (previous key, old stage chosen or -1)
    that achieved it, for backtracking.
    """
    cin = so.carries[j - 1] if j > 0 else -1
    cout = so.carries[j]
    ov = so.overlap[j]
    out: dict[int, int] = {}
    arg: dict[int, tuple[int, int]] = {}
    for u, val in best.items():
        keep = u if cout == cin else 0  # replicas of the outgoing boundary stage already used
        if cout < 0:
            keep = 0
        # option: no overlapping replica
        if val > out.get(keep, -1):
            out[keep], arg[keep] = val, (u, -1)
        for s, gain in ov.items():
            used = u if s == cin else 0
            if used + 1 > capacity.get(s, 0):
                continue
            nu = (keep + 1) if s == cout else keep
            v = val + gain
            if v > out.get(nu, -1):
                out[nu], arg[nu] = v, (u, s)
    return out, arg


@cache
def healthy_missing(
    layer_params: tuple[int, ...], old_cuts: tuple[int, ...], new_cuts: tuple[int, ...], replicas: int
) -> int:
    """Parameters a repartition must fetch when all ``replicas`` of every old stage are alive.

    Pure partition geometry (no preemption in it), so it is cached for the process.
    """
    so = stage_overlap(layer_params, old_cuts, new_cuts)
    if replicas >= max(so.demand.values()):  # every new stage gets its best overlapping replica
        return so.total - sum(max(ov.values()) for ov in so.overlap)
    caps = {s: min(replicas, dem) for s, dem in so.demand.items()}
    best: dict[int, int] = {0: 0}
    for j in range(len(so.ranges)):
        best, _ = advance_assignment(so, j, best, caps)
    return so.total - max(best.values())


def assign_stages(
    layer_params: Sequence[int],
    old_cuts: Sequence[int],
    new_cuts: Sequence[int],
    survivors: Sequence[int],
) -> tuple[list[int | None], int]:
    """Map each new stage to a surviving old-stage replica so that the least state has to move.

    An optimal assignment (max total overlap, each surviving replica used at most once), not the
    reference's greedy stage-by-stage choice, which moves up to twice as much on deep repartitions.
    A new stage left without an overlapping replica is served by an instance holding none of its
    layers (an idle survivor or a new instance) and fetches everything. Returns the old stage chosen
    per new stage (None for "none held") and the total missing parameters.
    """
    so = stage_overlap(tuple(layer_params), tuple(old_cuts), tuple(new_cuts))
    capacity = {s: min(int(c), so.demand.get(s, 0)) for s, c in enumerate(survivors)}
    best: dict[int, int] = {0: 0}
    args = []
    for j in range(len(so.ranges)):
        best, arg = advance_assignment(so, j, best, capacity)
        args.append(arg)
    u = max(best, key=lambda k: (best[k], -k))
    matched = best[u]
    chosen: list[int | None] = [None] * len(so.ranges)
    for j in range(len(so.ranges) - 1, -1, -1):
        u, s = args[j][u]
        chosen[j] = s if s >= 0 else None
    return chosen, so.total - matched
