"""Live-migration planning: reconfiguration epochs, who trains what, and which layers move from whom to whom.

Owns: `Epoch` (the plan every process of one epoch follows; it crosses process boundaries as JSON), the choice of
the next epoch's assignment (`next_epoch`), the migration kind, the transfer plan (`plan_transfers`) and the byte
accounting. Must not touch: processes, stores, process groups, tensors in flight — these are pure functions of
plain data (plus, in `layer_sizes`, building the model's layers once to count their state), so the coordinator's
dry run, the tests and the workers all compute the same plan.

The three kinds (reference §D.1; names from `liveput.migration.MigrationKind`, one word per concept):

* **intra-stage** — P unchanged and every stage keeps >= d surviving replicas: survivors keep their stage, extra
  replicas go to standby, nothing moves;
* **inter-stage** — P unchanged but some stage is short: survivors keep their stage and idle instances (then
  spare replicas of other stages) fill the holes, receiving the stage's layers from a surviving holder;
* **pipeline** — P changes: the layers are re-cut (`trainer.runtime.pipeline.partition`); each new stage's first
  replica is the survivor that already holds the most of its layers (`liveput.migration.assign_stages`, an optimal
  matching), the other slots go to the free instances holding most of the stage; every slot fetches only what it
  lacks.

Unlike the reference, which fetches into each stage's replica 0 and then broadcasts to the other replicas, every
new holder of a layer fetches it directly from an old holder, with sources chosen to balance bytes sent; an old
holder under a preemption notice is used only when no staying holder has the layer (the "last copy" case).

After a preemption *without* notice (a kill), `plan_recovery` plans the epoch that replaces the broken one from
the survivors alone: the lost workers cannot send, so it is a live migration only if every layer still has a
surviving holder; otherwise it returns None and the job falls back to a **checkpoint-restart** (`restart_epoch`:
every process restarted, every layer loaded from the latest complete checkpoint, the steps since it recomputed).

A migration is *committed* when the first step of its epoch is applied (`trainer.runtime.worker`): until then every old
holder keeps the state of the epoch it migrates from (its `base`). A death during the hand-off therefore rolls the
migration back — the broken epoch is abandoned, nothing of it installed — and `plan_recovery(base, ...,
departing=..., number=...)` plans the replacement from the base epoch's holders (those under a notice still send).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from liveput import MigrationKind, Trigger, assign_stages, migration_kind, overlap_params
from trainer.config import ConfigError, ModelConfig, TrainConfig
from trainer.runtime.pipeline import StageLayout, partition

Role = tuple[int, int]  # (stage, replica)


class PlanError(ValueError):
    """A reconfiguration that cannot be carried out (too few instances, P above the layer count, lost layers)."""


class Transfer(NamedTuple):
    """Layer `layer` (global index) is copied from worker `src` (an old holder) to worker `dst` (a new holder)."""

    layer: int
    src: int
    dst: int


@dataclass(frozen=True)
class Epoch:
    """One reconfiguration epoch: a D x P strategy, who runs which (stage, replica), from which step.

    An `Epoch` is to a training run what a `WorkerGroup` is to torchelastic's agent: the set of processes that
    train together until the next reconfiguration. Epoch `number` n uses the process groups on
    `PrefixStore(f"epoch{n}")` — or, when it was `prepared` (published ahead as preparation p, its groups formed by
    its members while the old epoch trained), on `PrefixStore(f"prep{p}")`; epoch n+1 replaces it at the boundary
    before `start_step`.

    What changes at a migration: everything here. In particular a worker's **rank is not stable across epochs**
    (rank = stage * D + replica of *this* epoch); its stable identity is the worker id. `transfers` says which
    layers the new holders fetch from old holders at the boundary; `preempted` lists the workers that leave at it
    (after sending what `transfers` asks of them); `previous` the members of the epoch it replaces that are still
    alive, who must all arrive at the boundary before the state moves; `lost` the members that died without notice
    (`notice` is then False). A `checkpoint-restart` epoch moves nothing between workers: its members are fresh
    processes that load `restore_step`'s checkpoint. `base` is the epoch whose layout the transfers are planned
    from: the previous one, except after a migration that was rolled back (a death during its hand-off), when the
    replacement is planned from the abandoned epoch's own base.
    """

    number: int
    start_step: int
    D: int
    P: int
    bounds: tuple[int, ...]
    assignment: Mapping[int, Role]  # worker id -> (stage, replica)
    kind: MigrationKind
    transfers: tuple[Transfer, ...] = ()
    preempted: tuple[int, ...] = ()
    previous: tuple[int, ...] = ()
    notice: bool = True
    bytes_planned: int = 0
    lost: tuple[int, ...] = ()  # members of the previous epoch that died without notice
    restore_step: int | None = None  # checkpoint-restart: the checkpoint every member loads (0: the initial weights)
    steps_lost: int = 0  # checkpoint-restart: committed steps thrown away and recomputed
    base: int | None = None  # the epoch whose holders' state it is planned from (None: number - 1)
    prepared: int | None = None  # the preparation whose groups, formed ahead while training, it uses (None: none)

    def __post_init__(self) -> None:
        StageLayout(self.D, self.P, tuple(self.bounds))  # validates the geometry
        roles = sorted(self.assignment.values())
        if roles != [(s, r) for s in range(self.P) for r in range(self.D)]:
            raise ValueError(f"epoch {self.number}: assignment {dict(self.assignment)} must fill {self.D}x{self.P}")

    @property
    def strategy(self) -> StageLayout:
        return StageLayout(self.D, self.P, tuple(self.bounds))

    @property
    def base_number(self) -> int:
        """The number of the epoch whose state this one is planned from."""
        return self.number - 1 if self.base is None else self.base

    @property
    def members(self) -> tuple[int, ...]:
        return tuple(sorted(self.assignment))

    def rank(self, worker: int) -> int:
        stage, replica = self.assignment[worker]
        return self.strategy.rank(stage, replica)

    def layers(self, stage: int) -> range:
        return range(self.bounds[stage], self.bounds[stage + 1])

    def layers_of(self, worker: int) -> range:
        """The layers `worker` holds in this epoch (empty if it has no role)."""
        role = self.assignment.get(worker)
        return self.layers(role[0]) if role else range(0)

    @property
    def joined(self) -> tuple[int, ...]:
        """Its members that were not members of the epoch it replaces (instances added, standbys taken in)."""
        return () if self.kind is MigrationKind.START else tuple(w for w in self.members if w not in self.previous)

    @property
    def trigger(self) -> Trigger | None:
        """What made it, in the cost model's vocabulary (`liveput.Trigger`, which prices each differently): members
        lost without notice (a kill), else members preempted with notice, else instances added, else a planned
        re-shape; None for the job's first epoch."""
        if self.kind is MigrationKind.START:
            return None
        if self.lost:
            return Trigger.KILL
        if self.preempted:
            return Trigger.NOTICE
        return Trigger.ADDITION if self.joined else Trigger.PLANNED

    @property
    def group_prefix(self) -> str:
        """The store prefix its process groups form on: its own, or its preparation's (formed before the boundary)."""
        return f"epoch{self.number}" if self.prepared is None else f"prep{self.prepared}"

    @property
    def transfer_prefix(self) -> str:
        """The store prefix of the group its transfers use."""
        return f"xfer{self.number}" if self.prepared is None else f"prep{self.prepared}/xfer"

    @property
    def transfer_parties(self) -> tuple[int, ...]:
        """Workers that send or receive at this epoch's boundary, in id order (their rank in the transfer group)."""
        return tuple(sorted({t.src for t in self.transfers} | {t.dst for t in self.transfers}))

    def to_json(self) -> str:
        return json.dumps(
            {
                "number": self.number, "start_step": self.start_step, "strategy": [self.D, self.P],
                "bounds": list(self.bounds), "assignment": {str(w): list(r) for w, r in self.assignment.items()},
                "kind": self.kind.value, "transfers": [list(t) for t in self.transfers],
                "preempted": list(self.preempted), "previous": list(self.previous), "notice": self.notice,
                "bytes_planned": self.bytes_planned, "lost": list(self.lost), "restore_step": self.restore_step,
                "steps_lost": self.steps_lost, "base": self.base, "prepared": self.prepared,
            }, sort_keys=True,
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str | bytes) -> Epoch:
        d: dict[str, Any] = json.loads(text)
        return cls(
            number=d["number"], start_step=d["start_step"], D=d["strategy"][0], P=d["strategy"][1],
            bounds=tuple(d["bounds"]), assignment={int(w): (r[0], r[1]) for w, r in d["assignment"].items()},
            kind=MigrationKind(d["kind"]), transfers=tuple(Transfer(*t) for t in d["transfers"]),
            preempted=tuple(d["preempted"]), previous=tuple(d["previous"]), notice=d["notice"],
            bytes_planned=d["bytes_planned"], lost=tuple(d.get("lost", ())), restore_step=d.get("restore_step"),
            steps_lost=d.get("steps_lost", 0), base=d.get("base"), prepared=d.get("prepared"),
        )  # fmt: skip


# ------------------------------------------------------------------------------------------- layer sizes


@dataclass(frozen=True)
class LayerSizes:
    """Per layer (global index): parameter count, and bytes of its `layer_state` before and after the first step
    (parameters only, then with AdamW's exp_avg, exp_avg_sq and step)."""

    params: tuple[int, ...]
    fresh_bytes: tuple[int, ...]
    trained_bytes: tuple[int, ...]
    costs: tuple[float, ...] = ()  # the spec's per-layer cost hints (`Layer.cost`) or the job's stage costs, if given
    cut_source: str = "parameter counts"  # what `cut` balances, in words (MLflow's ``stage_cut`` param)

    @property
    def cut(self) -> tuple[float, ...]:
        """What the stage cut balances (`trainer.runtime.pipeline.partition`): the job's costs or the spec's hints,
        else parameter counts."""
        return self.costs or tuple(float(p) for p in self.params)

    def cut_by(self, costs: Sequence[float]) -> LayerSizes:
        """These sizes with the stage cut balancing `costs` (`TrainConfig.stage_costs`, one per layer; empty: as
        they are). A count that is not the model's raises `ConfigError` naming the field."""
        if not costs:
            return self
        if len(costs) != len(self.params):
            raise ConfigError(
                f"train.stage_costs: {len(costs)} costs for a model of {len(self.params)} layers; "
                "give one per layer, or measure this model's profile (`parcae profile --model ...`)"
            )
        return dataclasses.replace(self, costs=tuple(float(c) for c in costs), cut_source="train.stage_costs")

    def state_bytes(self, start_step: int) -> tuple[int, ...]:
        """Bytes per layer of a migration at the boundary before `start_step`."""
        return self.trained_bytes if start_step > 0 else self.fresh_bytes


def state_bytes(state: Mapping[str, Any]) -> int:
    """Tensor bytes of a `layer_state` (or of a dict of them): what a transfer moves, pickling overhead excluded."""
    total = 0
    for v in state.values():
        total += state_bytes(v) if isinstance(v, Mapping) else v.numel() * v.element_size()
    return total


def job_layer_sizes(model: ModelConfig, train: TrainConfig) -> LayerSizes:
    """`layer_sizes` with the job's stage cut (`TrainConfig.stage_costs`, when it gives them)."""
    return layer_sizes(model).cut_by(train.stage_costs)


@functools.lru_cache(maxsize=8)
def layer_sizes(model: ModelConfig) -> LayerSizes:
    """Measured by building each layer and taking one optimiser step on zero gradients (the shapes are what count)."""
    import torch

    from trainer.runtime.model import build_layer, n_layers, spec_of
    from trainer.runtime.pipeline import layer_state, make_optimizer

    spec = spec_of(model)
    params, fresh, trained = [], [], []
    for i in range(n_layers(model)):
        layer = build_layer(model, i)
        opt = make_optimizer(layer, spec)
        params.append(sum(p.numel() for p in layer.parameters()))
        fresh.append(state_bytes(layer_state(layer, opt)))
        for p in layer.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        trained.append(state_bytes(layer_state(layer, opt)))
    hints = tuple(float(layer.cost) for layer in spec.layers if layer.cost is not None)
    if len(hints) != len(params):
        return LayerSizes(tuple(params), tuple(fresh), tuple(trained))
    return LayerSizes(tuple(params), tuple(fresh), tuple(trained), hints, "the spec's cost hints")


# ------------------------------------------------------------------------------------------- planning


def first_epoch(
    D: int,
    P: int,
    workers: Sequence[int],
    layers: int | Sequence[float],
    global_batch: int | None = None,
    *,
    restore_step: int = 0,
    assignment: Mapping[int, Role] | None = None,
) -> Epoch:
    """Epoch 1: the first D*P workers in id order, worker i -> rank i (or the given `assignment`); the rest stand by.

    It starts at step 0 from the initial weights, or — a job resumed from its checkpoint of `restore_step` > 0 —
    at that step as a checkpoint-restart epoch (every member loads the checkpoint into this cut). `layers`: the
    per-layer parameter counts the stages are balanced by (`trainer.runtime.pipeline.partition`; a count: the even
    cut)."""
    check_strategy(D, P, len(workers), _count(layers), global_batch)
    strategy = StageLayout(D, P, partition(layers, P))
    if assignment is None:
        assignment = {w: strategy.coords(r) for r, w in enumerate(sorted(workers)[: D * P])}
    elif not set(assignment) <= set(workers):
        raise PlanError(f"assignment names workers {sorted(set(assignment) - set(workers))} that are not given")
    if restore_step:
        return Epoch(1, restore_step, D, P, strategy.bounds, dict(assignment), MigrationKind.CHECKPOINT_RESTART,
                     restore_step=restore_step)  # fmt: skip
    return Epoch(1, 0, D, P, strategy.bounds, dict(assignment), MigrationKind.START)


def _count(layers: int | Sequence[float]) -> int:
    return layers if isinstance(layers, int) else len(layers)


def check_strategy(D: int, P: int, available: int, n_layers: int, global_batch: int | None = None) -> None:
    """Raise `PlanError` unless D x P can run on `available` instances with `n_layers` layers."""
    if D < 1 or P < 1:
        raise PlanError(f"strategy {D}x{P}: D and P must be >= 1")
    if n_layers < P:
        raise PlanError(f"strategy {D}x{P}: P={P} exceeds the model's {n_layers} layers (a stage needs one)")
    if global_batch is not None and global_batch < D:
        raise PlanError(f"strategy {D}x{P}: D={D} replicas exceed global_batch={global_batch}")
    if available < D * P:
        raise PlanError(f"strategy {D}x{P} needs {D * P} instances, only {available} are alive")


def classify(current: Epoch, d: int, p: int, survivors: Iterable[int]) -> MigrationKind:
    """The migration kind from `current` to d x p when `survivors` (old members and others) remain: the rule is
    `liveput.migration_kind`'s."""
    alive = set(survivors)
    per_stage = [sum(1 for w, (s, _) in current.assignment.items() if s == k and w in alive) for k in range(current.P)]
    return migration_kind(current.P, p, short=min(per_stage) < d)


def assign(current: Epoch, d: int, p: int, survivors: Iterable[int], layer_params: Sequence[int],
           costs: Sequence[float] | None = None) -> dict[int, Role]:  # fmt: skip
    """The next assignment worker -> (stage, replica) on `survivors`, moving the least state.

    Same P: survivors keep their stage (lowest old replicas first), holes are filled by idle instances, then by
    spare replicas of other stages (they hold nothing of the short stage either way). New P: see the module
    docstring. Deterministic: ties go to the lowest worker id.
    """
    alive = sorted(set(survivors))
    check_strategy(d, p, len(alive), len(layer_params))
    bounds = partition(layer_params if costs is None else costs, p)
    new: dict[int, Role] = {}

    def old_replicas(stage: int) -> list[int]:
        ws = [w for w in alive if w in current.assignment and current.assignment[w][0] == stage]
        return sorted(ws, key=lambda w: current.assignment[w][1])

    if p == current.P:
        for k in range(p):
            for r, w in enumerate(old_replicas(k)[:d]):
                new[w] = (k, r)
        free = sorted((w for w in alive if w not in new), key=lambda w: (w in current.assignment, w))
        for k in range(p):
            for r in range(sum(1 for s, _ in new.values() if s == k), d):
                new[free.pop(0)] = (k, r)
        return new

    survivors_per_stage = [len(old_replicas(k)) for k in range(current.P)]
    chosen, _ = assign_stages(layer_params, current.bounds, bounds, survivors_per_stage)
    for j, s in enumerate(chosen):
        if s is not None:
            w = next(w for w in old_replicas(s) if w not in new)
            new[w] = (j, 0)

    def overlap(w: int, j: int) -> int:
        if w not in current.assignment:
            return 0
        held = current.layers_of(w)
        return overlap_params(layer_params, (held.start, held.stop), (bounds[j], bounds[j + 1]))

    for j in range(p):
        taken = {r for s, r in new.values() if s == j}
        for r in (r for r in range(d) if r not in taken):
            w = max((w for w in alive if w not in new), key=lambda w: (overlap(w, j), -w))
            new[w] = (j, r)
    # replica 0 must exist in every stage: renumber each stage's replicas 0..d-1 keeping the primary first
    out: dict[int, Role] = {}
    for j in range(p):
        ws = sorted((w for w, (s, _) in new.items() if s == j), key=lambda w: new[w][1])
        out.update({w: (j, r) for r, w in enumerate(ws)})
    return out


def plan_transfers(
    current: Epoch,
    assignment: Mapping[int, Role],
    bounds: Sequence[int],
    layer_bytes: Sequence[int],
    departing: Iterable[int] = (),
    lost: Iterable[int] = (),
) -> list[Transfer]:
    """Every (layer, src, dst) the new holders need, each from an old holder of the layer.

    A worker fetches the layers of its new stage it did not hold in `current`. Sources are the old holders
    (members of `current`; `departing` ones are under a notice and still able to send; `lost` ones died and are
    never used), chosen per layer by (departing last, least bytes sent so far, lowest id). Intra-stage migrations
    yield no transfer. `PlanError` if a layer has no usable holder.
    """
    gone = set(departing)
    dead = set(lost)
    holders: dict[int, list[int]] = defaultdict(list)
    for w in sorted(set(current.assignment) - dead):
        for layer in current.layers_of(w):
            holders[layer].append(w)
    load: dict[int, int] = defaultdict(int)
    transfers = []
    for dst in sorted(assignment):
        if dst in gone or dst in dead:
            raise PlanError(f"worker {dst} is preempted but assigned a role in the next epoch")
        stage = assignment[dst][0]
        have = set(current.layers_of(dst))
        for layer in range(bounds[stage], bounds[stage + 1]):
            if layer in have:
                continue
            candidates = [w for w in holders[layer] if w != dst]
            if not candidates:
                raise PlanError(f"layer {layer} has no live holder in epoch {current.number} to copy it from")
            src = min(candidates, key=lambda w: (w in gone, load[w], w))
            load[src] += layer_bytes[layer]
            transfers.append(Transfer(layer, src, dst))
    return transfers


def bytes_moved(transfers: Iterable[Transfer], layer_bytes: Sequence[int]) -> int:
    """Tensor bytes the transfers send in all."""
    return sum(layer_bytes[t.layer] for t in transfers)


def next_epoch(
    current: Epoch,
    step: int,
    alive: Iterable[int],
    sizes: LayerSizes,
    strategy: tuple[int, int] | None = None,
    preempt: Iterable[int] = (),
    global_batch: int | None = None,
    lost: Iterable[int] = (),
    force: bool = False,
    number: int | None = None,
) -> Epoch | None:
    """The epoch that replaces `current` at the boundary before `step`, or None if nothing has to change.

    `alive` are the instances up to the boundary (joined and not yet gone, including those now preempted with
    notice: they stay until they have handed off their layers). `lost` workers died without notice: they are
    neither survivors nor sources (the epoch has `notice=False`). Without a `strategy` the current D x P is kept
    if the survivors allow it, else D shrinks to what they allow (P is kept). With `force`, an unchanged
    assignment still yields a new epoch (fresh groups after a broken one). `number`: the new epoch's number when it
    is not `current.number + 1` (a replacement planned from the base of an abandoned epoch); its `base` is then
    `current.number`.
    """
    preempted = set(preempt)
    dead = set(lost)
    alive_set = set(alive) - dead
    unknown = sorted(preempted - alive_set)
    if unknown:
        raise PlanError(f"cannot preempt workers {unknown}: they are not alive")
    survivors = sorted(alive_set - preempted)
    n_layers = len(sizes.params)
    if strategy is None:
        d, p = current.D, current.P
        if d * p > len(survivors):
            d = len(survivors) // p
            if d < 1:
                raise PlanError(
                    f"only {len(survivors)} instances survive, fewer than the P={p} stages; plan a smaller P"
                )
    else:
        d, p = strategy
    check_strategy(d, p, len(survivors), n_layers, global_batch)
    new = assign(current, d, p, survivors, sizes.params, sizes.cut)
    if (d, p) == (current.D, current.P) and new == dict(current.assignment) and not (dead or force):
        return None
    bounds = partition(sizes.cut, p)
    layer_bytes = sizes.state_bytes(step)
    transfers = plan_transfers(current, new, bounds, layer_bytes, departing=preempted, lost=dead)
    n = current.number + 1 if number is None else number
    return Epoch(
        number=n, start_step=step, D=d, P=p, bounds=bounds, assignment=new,
        kind=classify(current, d, p, survivors), transfers=tuple(transfers),
        preempted=tuple(sorted(preempted)), previous=tuple(w for w in current.members if w not in dead),
        notice=not dead, bytes_planned=bytes_moved(transfers, layer_bytes),
        lost=tuple(sorted(dead & set(current.members))), base=None if n == current.number + 1 else current.number,
    )  # fmt: skip


def recovery_strategy(
    current: Epoch, survivors: int, n_layers: int, global_batch: int | None = None
) -> tuple[int, int]:
    """The D x P to continue with after losing instances: keep P (the layer cut) and as many replicas as survive,
    else one pipeline of as many stages as survivors."""
    if survivors < 1:
        raise PlanError("no instance survives")
    if survivors >= current.P:
        d = min(current.D, survivors // current.P)
        return (min(d, global_batch) if global_batch else d), current.P
    return 1, min(survivors, n_layers)


def plan_recovery(
    current: Epoch,
    step: int,
    alive: Iterable[int],
    lost: Iterable[int],
    sizes: LayerSizes,
    global_batch: int | None = None,
    strategy: tuple[int, int] | None = None,
    *,
    departing: Iterable[int] = (),
    number: int | None = None,
) -> Epoch | None:
    """The live migration that replaces `current`, broken by the death of `lost`, before `step` (the abandoned
    step, redone): from the survivors only, with `notice=False` when a member of `current` was lost. None if some
    layer has no surviving holder or the survivors cannot form a strategy — then only a checkpoint-restart can
    continue the job.

    After a rolled-back migration `current` is the abandoned epoch's base and `number` the replacement's number;
    `departing` are holders under a notice (the abandoned epoch's preempted workers, still alive): they send what
    only they hold and get no role. `strategy` is tried first (the abandoned epoch's), then the default
    (`recovery_strategy`)."""
    dead = set(lost)
    gone = set(departing) - dead
    alive_set = set(alive) | gone
    survivors = sorted(alive_set - dead - gone)
    n_layers = len(sizes.params)
    options = [strategy] if strategy is not None else []
    with contextlib.suppress(PlanError):  # no default for these survivors: only `strategy` is tried
        options.append(recovery_strategy(current, len(survivors), n_layers, global_batch))
    for d, p in dict.fromkeys(options):
        try:
            return next_epoch(current, step, sorted(alive_set - dead), sizes, (d, p), sorted(gone), global_batch,
                              lost=dead, force=True, number=number)  # fmt: skip
        except PlanError:
            continue
    return None


def restart_epoch(
    current: Epoch,
    restore_step: int,
    alive: Iterable[int],
    layers: int | Sequence[float],
    strategy: tuple[int, int] | None = None,
    global_batch: int | None = None,
    previous: Iterable[int] = (),
    lost: Iterable[int] = (),
    steps_lost: int = 0,
) -> Epoch:
    """A checkpoint-restart epoch: fresh processes on `alive` (ids in order, rank = position, like `first_epoch`)
    load checkpoint `restore_step` into `strategy` (default: the current D x P if the instances allow it, else
    `recovery_strategy`) and train on from it. `previous`: the old members that reached the boundary (their
    arrival times start the pause); `lost`: members that died without notice."""
    ws = sorted(set(alive))
    if strategy is None:
        if len(ws) >= current.D * current.P:
            strategy = (current.D, current.P)
        else:
            strategy = recovery_strategy(current, len(ws), _count(layers), global_batch)
    D, P = strategy
    check_strategy(D, P, len(ws), _count(layers), global_batch)
    st = StageLayout(D, P, partition(layers, P))
    assignment = {w: st.coords(r) for r, w in enumerate(ws[: D * P])}
    dead = tuple(sorted(set(lost)))
    return Epoch(
        number=current.number + 1, start_step=restore_step, D=D, P=P, bounds=st.bounds, assignment=assignment,
        kind=MigrationKind.CHECKPOINT_RESTART, previous=tuple(sorted(previous)), notice=not dead, lost=dead,
        restore_step=restore_step, steps_lost=steps_lost,
    )  # fmt: skip
