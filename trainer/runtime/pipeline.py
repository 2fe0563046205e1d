"""Hybrid data x pipeline parallel execution (D x P) over torch.distributed (gloo), one training step at a time.

Owns: the strategy's geometry (`StageLayout`: which global rank runs which stage of which replica, and which layers a
stage holds), process groups of a reconfiguration epoch (`init_epoch` / `close_epoch`), the per-rank training
state (`StageContext`: the rank's `Stage`, one optimiser per layer), the training step (`train_step`), the held-out
pass (`validate`: the step's forward alone, `stage_forward`) and the unit that migrations move (`layer_state` /
`load_layer_state`).
Must not touch: the model's maths (`trainer.runtime.model`), the data (`trainer.runtime.data`), files
(`trainer.runtime.checkpoint`), the choice of strategy (the coordinator).

Design choices
--------------
* **GPipe or 1F1B within a step** (`schedule_order`, `TrainConfig.schedule`): GPipe runs all forwards, then all
  backwards; 1F1B interleaves them after a warm-up, so at most P - stage micro-batches' activations are alive
  instead of all of them. Both are *exactly* equivalent to single-process training — every micro-batch sees the
  same weights and gradients are only accumulated — and a step ends with no activation in flight, so a migration
  can interrupt cleanly at any step boundary.
* **Hand-written send/recv** rather than `torch.distributed.pipelining`: a migration rebuilds stages and process
  groups with arbitrary layer ranges while the global batch stays fixed (uneven replica shards included);
  `PipelineStage` and its schedules assume a static world, a fixed number of micro-batches of one shape and
  scale gradients by 1/n_microbatches. A dozen lines of p2p keep the step readable and under our control.
* **Loss normalisation**: the last stage divides each micro-batch's summed loss by the global batch, so gradients
  summed over micro-batches and over replicas (all-reduce SUM in each stage's data-parallel group) are exactly the
  gradient of the mean loss over the global batch, whatever D, P or the split. (float16's loss *scale*, a factor
  undone after the reduction, is `trainer.runtime.loss_scale`'s.)
* **One AdamW per layer**: a layer's parameters and optimiser state are extracted and installed together
  (`layer_state`), which is mathematically identical to one AdamW over all parameters (Adam is element-wise).
* **Process groups: standalone gloo groups per epoch**, `ProcessGroupGloo` objects built on
  `PrefixStore(f"epoch{n}")` (the world: every rank of the epoch) and `PrefixStore(f"epoch{n}/dp{stage}")` (a
  stage's data-parallel replicas), never registered as torch's default group. A migration renumbers ranks and may
  admit a newly started process, and a world with a dead peer cannot be reused, so each epoch gets clean groups.
  They are not the default group because the default group cannot be replaced while one of its ops is pending
  (`destroy_process_group` blocks until the op times out, stack.md §4e): after a peer dies, the survivors simply
  *abandon* the epoch's groups (`EpochGroups.abandon`: kept referenced, never destroyed) and build the next ones.
* **Failure detection inside a step** (stack.md §4e, way 3): every op is issued asynchronously and waited on by a
  helper thread (`_Waiter`; gloo's send/recv only complete inside `Work.wait()`, and `wait(timeout)` cancels the
  op, so the training thread cannot poll `is_completed()` for them). The training thread wakes every
  `check_s` to ask `EpochGroups.abort` whether the epoch was declared broken (the coordinator's flag in the store,
  set when a heartbeat stops). A broken epoch or a failed op raises `StepAbandoned`.
* **A step is applied all or nothing**: the optimisers step only after every collective of the step completed
  (the loss all-reduce now precedes them) *and* `commit()` agreed. Completion of a collective is not atomic across
  ranks — a peer that dies inside the last all-reduce can leave one survivor with the result and another with an
  error — so the worker's `commit` asks the store for a once-only decision per (epoch, step) (apply iff every rank
  finished; abort once the epoch is declared broken). Every survivor therefore holds the state after the same
  number of steps, and the abandoned step is redone in the next epoch.
* Global ranks within an epoch are `stage * D + replica` (as in the reference); they are **not** stable across
  epochs — a worker's identity is the coordinator's business, its rank is the epoch's.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.distributed_c10d import PrefixStore, ProcessGroupGloo, Store

from trainer.config import SCHEDULES, ModelConfig, TrainConfig
from trainer.runtime import loss_scale
from trainer.runtime.data import Prefetcher, batch_rows, replica_part, replica_rows, replica_share, shard, unloaded
from trainer.runtime.model import Stage, build_layer, hollow_layer, n_layers, persistent_buffers, spec_of
from trainer.runtime.spec_model import run_layer
from trainer.runtime.trainspec import TrainSpec, leaves, rebuild, seeded_build, to_device
from trainer.runtime.trainspec import rows as rows_of
from trainer.runtime.validation import Validation, metric_sum

LayerState = dict[str, torch.Tensor]


def partition(layers: int | Sequence[float], P: int) -> tuple[int, ...]:
    """The contiguous cut of the layers into `P` non-empty stages: the P+1 boundaries. `layers` as a count: the
    even cut (sizes differ by at most one); as per-layer costs (parameter counts, by default): the cut whose
    costliest stage costs least, ties to the one with the smallest sum of squared stage costs, then to the
    earliest boundaries. A pure function: the coordinator and a dry run compute the same cut."""
    n = layers if isinstance(layers, int) else len(layers)
    if not 1 <= P <= n:
        raise ValueError(f"cannot cut {n} layers into P={P} non-empty stages")
    if isinstance(layers, int):
        return tuple(k * n // P for k in range(P + 1))
    return _balanced_cut(tuple(float(c) for c in layers), P)


@functools.lru_cache(maxsize=256)
def _balanced_cut(costs: tuple[float, ...], P: int) -> tuple[int, ...]:
    # best[k][i]: the best (max, sum of squares, bounds) cut of layers [0, i) into k stages; O(P * n^2)
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = (float("inf"), float("inf"), ())
    best: list[list[tuple[float, float, tuple[int, ...]]]] = [[inf] * (n + 1) for _ in range(P + 1)]
    best[0][0] = (0.0, 0.0, (0,))
    for k in range(1, P + 1):
        for i in range(k, n - (P - k) + 1):
            for j in range(k - 1, i):
                top, squares, bounds = best[k - 1][j]
                if top == float("inf"):
                    continue
                stage = prefix[i] - prefix[j]
                cand = (max(top, stage), squares + stage * stage, (*bounds, i))
                if cand < best[k][i]:
                    best[k][i] = cand
    return best[P][n][2]


@dataclass(frozen=True)
class StageLayout:
    """The geometry of a strategy (D, P) (`liveput.Strategy`) for one epoch: D replicas of a P-stage pipeline; stage k
    holds layers [bounds[k], bounds[k+1]).

    Rank `stage * D + replica`; the data-parallel group of a stage is its D replicas, the pipeline of a replica
    is its P stages.
    """

    D: int
    P: int
    bounds: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.D < 1 or self.P < 1:
            raise ValueError(f"D and P must be >= 1, got D={self.D}, P={self.P}")
        b = self.bounds
        if len(b) != self.P + 1 or b[0] != 0 or any(lo >= hi for lo, hi in zip(b, b[1:])):
            raise ValueError(f"bounds {b} must be P+1={self.P + 1} strictly increasing boundaries starting at 0")

    @classmethod
    def even(cls, D: int, P: int, cfg: ModelConfig) -> StageLayout:
        """D x P with the layers cut evenly by count."""
        return cls(D, P, partition(n_layers(cfg), P))

    @property
    def world_size(self) -> int:
        return self.D * self.P

    def rank(self, stage: int, replica: int) -> int:
        return stage * self.D + replica

    def coords(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of `rank`."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world size {self.world_size}")
        return divmod(rank, self.D)

    def layers(self, stage: int) -> range:
        """Global layer indices held by `stage`."""
        return range(self.bounds[stage], self.bounds[stage + 1])

    def stage_ranks(self, stage: int) -> list[int]:
        """The data-parallel group of `stage`: its replicas' ranks."""
        return [self.rank(stage, r) for r in range(self.D)]


class StepAbandoned(RuntimeError):
    """The step in flight was given up with nothing applied: a peer failed (a gloo error), the epoch was declared
    broken (`EpochGroups.abort`), or the commit decided "abort". Parameters and optimiser state are exactly as
    before the step; the epoch's groups must not be used again (`EpochGroups.abandon`)."""


# Groups and waiter threads of abandoned epochs. Never destroyed: a gloo group's destructor joins its threads, which
# block in a pending op until the group's timeout. Referenced here until the process exits (os._exit).
_GRAVEYARD: list[object] = []


class _Waiter:
    """A daemon thread that blocks in `Work.wait()` on behalf of the training thread, one op at a time.

    The training thread sleeps on a condition with a timeout, so it wakes at once when the op completes and every
    `check_s` otherwise, to look at the abort flag. Hand-off costs ~0.1-0.2 ms per op (measured, 2 ranks).
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._work: object | None = None
        self._done = False
        self._error: BaseException | None = None
        self._closed = False
        self.stuck = False  # set when the training thread gave up on an op: the thread may block until timeout
        threading.Thread(target=self._run, name="parcae-waiter", daemon=True).start()

    def close(self) -> None:
        """Let the thread end (it is idle: no op pending)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._work is None and not self._closed:
                    self._cv.wait()
                if self._work is None:
                    return
                work = self._work
            error = None
            try:
                work.wait()  # type: ignore[attr-defined]
            except BaseException as e:  # noqa: BLE001 — handed to the training thread
                error = e
            with self._cv:
                self._work, self._done, self._error = None, True, error
                self._cv.notify_all()

    def wait(self, work: object, check: Callable[[], None], check_s: float) -> None:
        """Block until `work` completed; `check()` is called every `check_s` and may raise (`StepAbandoned`)."""
        if self.stuck:
            raise StepAbandoned("this epoch's groups were abandoned")
        with self._cv:
            self._work, self._done, self._error = work, False, None
            self._cv.notify_all()
            while not self._done:
                if not self._cv.wait(check_s):
                    try:
                        check()
                    except BaseException:
                        self.stuck = True
                        raise
            error = self._error
        if error is not None:
            self.stuck = True
            raise StepAbandoned(f"a collective failed: {error}") from error


@dataclass
class EpochGroups:
    """The process groups a rank uses in one epoch, and how it waits on them.

    `world` holds every rank of the epoch (rank = stage * D + replica), `dp` the stage's replicas (rank = replica;
    None when D = 1). `abort()` returns a reason when the epoch has been declared broken (e.g. the coordinator's
    flag in the store), else None; it is asked every `check_s` while an op is pending.
    """

    epoch: int
    rank: int
    world: dist.ProcessGroup | None  # None once `close_epoch` released it, and in a stand-in for groups never formed
    dp: dist.ProcessGroup | None
    abort: Callable[[], str | None] | None = None
    check_s: float = 0.02
    waiter: _Waiter = field(default_factory=_Waiter)
    abandoned: bool = False

    def _check(self) -> None:
        reason = self.abort() if self.abort is not None else None
        if reason:
            raise StepAbandoned(f"epoch {self.epoch} aborted: {reason}")

    def wait(self, work: object) -> None:
        """Wait for one op, abandoning the step if it fails or the epoch is declared broken meanwhile."""
        self.waiter.wait(work, self._check, self.check_s)

    def _issue(self, op: Callable[[], object]) -> object:
        # gloo may fail an op as it is issued (a pair it already knows is closed): that is a broken epoch too
        if self.abandoned or self.waiter.stuck:
            raise StepAbandoned(f"epoch {self.epoch}: its groups were abandoned")
        try:
            return op()
        except RuntimeError as e:
            self.waiter.stuck = True
            raise StepAbandoned(f"epoch {self.epoch}: issuing an op failed: {e}") from e

    def _live(self, group: dist.ProcessGroup | None) -> dist.ProcessGroup:
        assert group is not None, f"epoch {self.epoch}: its groups were closed"
        return group

    def send(self, tensor: torch.Tensor, dst: int) -> object:
        """Start sending `tensor` to world rank `dst`; the caller keeps `tensor` alive until `wait`."""
        return self._issue(lambda: self._live(self.world).send([tensor], dst, 0))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        """Receive into `tensor` from world rank `src` (waits)."""
        self.wait(self._issue(lambda: self._live(self.world).recv([tensor], src, 0)))

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup | None) -> object:
        """Start a sum all-reduce of `tensor` in place over `group` (`world` or `dp`)."""
        return self._issue(lambda: self._live(group).allreduce([tensor]))

    def abandon(self) -> None:
        """Give the groups up after a `StepAbandoned`: keep them referenced (never destroyed) and never use them."""
        if not self.abandoned:
            self.abandoned = True
            _GRAVEYARD.append((self.world, self.dp, self.waiter))


def gloo_address(coordinator: str) -> str | None:
    """The address this host's gloo groups listen on when the job's coordinator is `coordinator`: the one this host
    reaches the coordinator from (its route's source address). None — gloo's own choice, the address the host's
    name resolves to — when the coordinator is on loopback (every peer is here) or `GLOO_SOCKET_IFNAME` names the
    interface. Why: many images map the host name to 127.0.1.1 in /etc/hosts, and peers on other hosts told to
    connect there fail (`Gloo connectFullMesh failed`)."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    family, _, _, _, where = socket.getaddrinfo(coordinator, 9, type=socket.SOCK_DGRAM)[0]
    if ipaddress.ip_address(where[0]).is_loopback:
        return None
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(where)  # sends nothing: the kernel picks the route, and so the source address
        local = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(local).is_loopback else local


def gloo_group(
    store: Store, prefix: str, rank: int, size: int, timeout: timedelta, address: str | None = None
) -> dist.ProcessGroup:
    """A standalone gloo group of `size` ranks (this one `rank`) that rendezvous on `PrefixStore(prefix, store)`,
    listening on `address` (`gloo_address`; None: gloo's default device)."""
    if address is None:
        group = ProcessGroupGloo(PrefixStore(prefix, store), rank, size, timeout)
    else:  # the options form is how torch itself gives gloo a device (distributed_c10d, GLOO_SOCKET_IFNAME)
        options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # absent from the stubs
        options._timeout = timeout
        options._devices = [ProcessGroupGloo.create_device(hostname=address)]
        group = ProcessGroupGloo(PrefixStore(prefix, store), rank, size, options)
    # torch's stubs class gloo's group as a bare `Backend`; its binding has ProcessGroup's send, recv and allreduce
    return cast(dist.ProcessGroup, group)


def init_epoch(
    store: Store,
    epoch: int,
    strategy: StageLayout,
    rank: int,
    timeout: timedelta,
    abort: Callable[[], str | None] | None = None,
    check_s: float = 0.02,
    prefix: str | None = None,
    address: str | None = None,
) -> EpochGroups:
    """Join epoch `epoch`: its world group on `PrefixStore(prefix)` (default f"epoch{epoch}"), then this stage's DP
    group, both listening on `address` (`gloo_group`).

    Blocks until every rank of the epoch (resp. of the stage) has joined, or `timeout`.
    """
    prefix = f"epoch{epoch}" if prefix is None else prefix
    world = gloo_group(store, prefix, rank, strategy.world_size, timeout, address)
    stage, replica = strategy.coords(rank)
    dp = None
    if strategy.D > 1:
        dp = gloo_group(store, f"{prefix}/dp{stage}", replica, strategy.D, timeout, address)
    return EpochGroups(epoch=epoch, rank=rank, world=world, dp=dp, abort=abort, check_s=check_s)


def close_epoch(groups: EpochGroups | None = None, *, background: bool = False) -> None:
    """Leave an epoch at a step boundary (no op pending). Dropping the last reference to `groups` releases them;
    a default group some caller initialised itself is destroyed. Abandoned groups are never released.

    `background`: release them in a helper thread. Destroying a gloo group takes ~20 ms (its device threads wind
    down) with the GIL released: at a migration's boundary that is pure pause, so the next epoch need not wait."""
    if groups is not None and not groups.abandoned:
        released = [g for g in (groups.world, groups.dp) if g is not None]
        groups.world = groups.dp = None
        groups.waiter.close()
        if background and released:
            threading.Thread(target=released.clear, name="parcae-release", daemon=True).start()
        del released
    if dist.is_initialized():
        dist.destroy_process_group()


def make_optimizer(layer: nn.Module, spec: TrainSpec) -> torch.optim.Optimizer:
    """The optimiser of one layer: the spec's, over that layer's parameters only (its state moves with the layer).

    A layer without parameters (an activation, a pooling, a reshape) has nothing to optimise: torch's optimisers
    refuse an empty parameter list, so it gets an empty one of its own and the spec's is not asked."""
    params = list(layer.parameters())
    if not params:
        opt: torch.optim.Optimizer = torch.optim.SGD([{"params": []}], lr=0.0)
    else:
        opt = spec.optimizer(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"the spec's optimizer returned a {type(opt).__name__}, not a torch.optim.Optimizer")
    if spec.scaling is not None:  # every layer carries the job's loss scale, so every move of a layer moves it
        loss_scale.attach(opt, spec.scaling.start())
    return opt


def layer_state(layer: nn.Module, optimizer: torch.optim.Optimizer, *, copy: bool = True) -> LayerState:
    """A snapshot of one layer: "param/<name>" and "<state key>/<name>" (exp_avg, exp_avg_sq, step) tensors, and
    "buffer/<name>" for its persistent buffers (e.g. BatchNorm's running statistics, which training changes too),
    and the job's loss scale where it scales its loss (`trainer.runtime.loss_scale`).

    Cloned to host memory, so it stays valid while training continues. `copy=False`: the live tensors themselves
    (detached, on their device), for a reader that copies them before training goes on (`trainer.runtime.wire.pack`
    at a boundary). Before the first step the optimiser has no state and only parameters are included.
    """
    out: LayerState = {}

    def snap(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", copy=True) if copy else t.detach()  # host memory: sent, checkpointed, compared

    for name, p in layer.named_parameters():
        out[f"param/{name}"] = snap(p)
        for key, value in optimizer.state.get(p, {}).items():
            if value is None:  # e.g. SGD's momentum_buffer without momentum: nothing to move
                continue
            out[f"{key}/{name}"] = snap(value) if torch.is_tensor(value) else torch.tensor(value)
    for name, b in persistent_buffers(layer).items():
        out[f"buffer/{name}"] = snap(b)
    scale = loss_scale.scale_of(optimizer)
    if scale is not None:
        out.update(loss_scale.to_state(scale))
    return out


def state_on(key: str, value: torch.Tensor, param: torch.Tensor, group: Mapping[str, Any]) -> torch.Tensor:
    """A copy of optimiser state `key` of `param` where its optimiser keeps it, as torch's own
    `Optimizer.load_state_dict` places it: a tensor on the parameter's device, but Adam's `step` on the host unless
    the parameter group is `fused` or `capturable` (then float32, on the device: a fused AdamW on a GPU refuses a
    host `step`)."""
    if key == "step":
        if group.get("fused") or group.get("capturable"):
            return value.to(dtype=torch.float32, device=param.device, copy=True)
        return value.clone()
    return value.to(param.device, copy=True)


def layer_step(layer: nn.Module, scaled: loss_scale.LossScale | None = None) -> LayerState:
    """What the last step did to `layer` besides the optimiser's arithmetic: the gradients it applied, as
    "grad/<name>" (reduced, normalised and clipped: what the optimiser consumed; a parameter without one is left
    out), the persistent buffers its forwards left, as "buffer/<name>", and, where the job scales its loss, the
    scale after the step (`scaled`; its overflows in a row say whether the step was skipped). Live tensors, for a
    reader that copies them before the next step (`trainer.runtime.wire.pack`)."""
    out = {f"grad/{name}": p.grad.detach() for name, p in layer.named_parameters() if p.grad is not None}
    out.update({f"buffer/{name}": b.detach() for name, b in persistent_buffers(layer).items()})
    if scaled is not None:
        out.update(loss_scale.to_state(scaled))
    return out


def catch_up(
    layer: nn.Module, optimizer: torch.optim.Optimizer, state: LayerState, grads: LayerState, lr: float | None
) -> None:
    """Bring a layer from its state at boundary s to boundary s + 1 without training step s: install `state`, then
    apply the step's update with the gradients its holder applied (`layer_step`) at the step's learning rate, and
    take the buffers the step left. The same optimiser on the same values gives, bit for bit, the holder's state at
    s + 1 — which is what lets a migration send a layer's state during step s instead of at the boundary."""
    load_layer_state(layer, optimizer, state)
    apply_step(layer, optimizer, grads, lr)


def apply_step(layer: nn.Module, optimizer: torch.optim.Optimizer, grads: LayerState, lr: float | None) -> None:
    """The second half of `catch_up`, for a layer whose state as of boundary s is installed already (ahead of the
    boundary): step s's update with its holder's gradients at the step's learning rate, and the buffers it left
    (a step skipped for an overflow: only the buffers and the loss scale it left)."""
    _copy_buffers(layer, grads)
    after = loss_scale.install(optimizer, grads, "the step's gradients")
    if after is not None and after.skipped:
        return
    for name, p in layer.named_parameters():
        g = grads.get(f"grad/{name}")
        p.grad = None if g is None else g.to(p.device).view_as(p)
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _copy_buffers(
    layer: nn.Module, state: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor] | None = None
) -> None:
    """Copy the "buffer/<name>" tensors of `state` into `layer`'s persistent buffers (`buffers`, when the caller
    has them already; every one must be in `state`)."""
    with torch.no_grad():
        for name, b in (persistent_buffers(layer) if buffers is None else buffers).items():
            src = state.get(f"buffer/{name}")
            if src is None:
                raise ValueError(f"buffer {name}: the state lacks it")
            _check_like("buffer", name, src, b)
            b.copy_(src)


def _check_like(what: str, name: str, src: torch.Tensor, dst: torch.Tensor) -> None:
    """A state's tensor must have the shape and dtype of the layer's tensor it is copied into (a copy would broadcast
    or cast silently)."""
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError(
            f"{what} {name}: state has {tuple(src.shape)} {src.dtype}, layer has {tuple(dst.shape)} {dst.dtype}"
        )


def load_layer_state(layer: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, torch.Tensor]) -> None:
    """Install a `layer_state` snapshot into `layer` (in place) and its `optimizer` (replacing its state).

    Parameters and buffers are copied into the existing tensors so the optimiser's references stay valid.
    """
    params = dict(layer.named_parameters())
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}  # (where its state goes: `state_on`)
    if group_of.keys() != {id(p) for p in params.values()}:
        raise ValueError("optimizer does not own exactly this layer's parameters")
    loss_scale.install(optimizer, state, "layer state")
    state = {k: v for k, v in state.items() if k not in loss_scale.STATE_KEYS}
    buffers = persistent_buffers(layer)
    expected = {f"param/{n}" for n in params} | {f"buffer/{n}" for n in buffers}
    missing = expected - state.keys()
    unknown = {k for k in state
               if k.split("/", 1)[-1] not in (buffers if k.startswith("buffer/") else params)}  # fmt: skip
    if missing or unknown:
        raise ValueError(f"layer state does not match the layer: missing {sorted(missing)}, unknown {sorted(unknown)}")
    opt_keys = {k.split("/", 1)[0] for k in state} - {"param", "buffer"}
    _copy_buffers(layer, state, buffers)
    with torch.no_grad():
        for name, p in params.items():
            src = state[f"param/{name}"]
            _check_like("parameter", name, src, p)
            p.copy_(src)
            optimizer.state.pop(p, None)
            # A parameter no step has given a gradient yet (unused in the forward, or only on some steps) has no
            # optimiser state at its holder: it gets none here either. One with part of its state is refused.
            present = [k for k in opt_keys if f"{k}/{name}" in state]
            if present and len(present) < len(opt_keys):
                raise ValueError(f"parameter {name}: optimizer state lacks {sorted(set(opt_keys) - set(present))}")
            if present:
                optimizer.state[p] = {k: state_on(k, state[f"{k}/{name}"], p, group_of[id(p)]) for k in opt_keys}


@dataclass
class StageContext:
    """Everything one rank needs to train: its place in the strategy, its layers and their optimisers, its groups.

    Changes at a migration: `strategy`, `stage`, `replica`, `module` (rebuilt for the new range) and `groups`;
    the layer modules and their optimisers are kept (or moved via `layer_state`) by global index.
    """

    model: ModelConfig
    train: TrainConfig
    strategy: StageLayout
    stage: int
    replica: int
    module: Stage
    optimizers: dict[int, torch.optim.Optimizer]  # by global layer index
    groups: EpochGroups | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    names: list[str] = field(init=False)
    spec: TrainSpec = field(init=False)
    #: what the last step did to the loss scale (None: no step yet, or the job does not scale): a migration's
    #: source sends it with the step's gradients (`layer_step`)
    scaled: loss_scale.LossScale | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.spec = spec_of(self.model, self.train)
        all_names = self.spec.names
        self.names = [all_names[i] for i in self.module.indices]
        if self.groups is None and self.strategy.world_size != 1:
            raise ValueError(f"a {self.strategy.D}x{self.strategy.P} strategy needs process groups")

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.strategy.P - 1

    @property
    def prev_rank(self) -> int | None:
        """Global rank of the previous stage of this replica (activations come from it)."""
        return None if self.is_first else self.strategy.rank(self.stage - 1, self.replica)

    @property
    def next_rank(self) -> int | None:
        """Global rank of the next stage of this replica (gradients come from it)."""
        return None if self.is_last else self.strategy.rank(self.stage + 1, self.replica)

    def held_scale(self) -> loss_scale.LossScale | None:
        """The job's loss scale as this rank's layers hold it (None: the job scales none). Every layer carries it
        (`make_optimizer`), so layers that came by different paths must hold the same one."""
        held = {loss_scale.scale_of(opt) for opt in self.optimizers.values()}
        if len(held) != 1:
            raise RuntimeError(f"stage {self.stage}'s layers hold different loss scales: {sorted(map(str, held))}")
        return held.pop()

    def layer_states(self) -> dict[str, LayerState]:
        """Snapshots of this rank's layers, by layer name."""
        return {
            name: layer_state(self.module.layer(i), self.optimizers[i])
            for name, i in zip(self.names, self.module.indices, strict=True)
        }

    def load_layer_states(self, states: Mapping[str, LayerState], names: Sequence[str] | None = None) -> None:
        """Install this rank's layers `names` (default: all of them) from `states` (by name; other layers in
        `states` are ignored)."""
        wanted = self.names if names is None else names
        missing = [n for n in wanted if n not in states]
        if missing:
            raise KeyError(f"no state for layers {missing} of stage {self.stage}")
        for name, i in zip(self.names, self.module.indices, strict=True):
            if name in wanted:
                load_layer_state(self.module.layer(i), self.optimizers[i], states[name])


#: A layer module and its optimiser, by global layer index: what a stage is made of, and what a migration keeps.
HeldLayers = Mapping[int, tuple[nn.Module, torch.optim.Optimizer]]


def fresh_layers(
    model: ModelConfig, train: TrainConfig, indices: Sequence[int], device: torch.device | str = "cpu"
) -> dict[int, tuple[nn.Module, torch.optim.Optimizer]]:
    """Layers `indices`, freshly initialised (each from its own seed, on the host, then moved to `device`), each with
    its optimiser. Seeding goes through the process's global generator: build on the thread that trains, or where
    nothing trains."""
    spec = spec_of(model, train)
    dev = torch.device(device)
    out = {}
    for i in indices:
        layer = build_layer(model, i, train).to(dev)
        out[i] = (layer, make_optimizer(layer, spec))
    return out


def hollow_layers(
    model: ModelConfig, train: TrainConfig, indices: Sequence[int], device: torch.device | str = "cpu"
) -> dict[int, tuple[nn.Module, torch.optim.Optimizer]]:
    """Layers `indices` with storage but no values (`model.hollow_layer`), each with its optimiser: for layers whose
    whole state a migration installs. Touches no generator, so a helper thread may build them beside training.
    A layer that cannot be built so is left out (build it with `fresh_layers`)."""
    spec = spec_of(model, train)
    dev = torch.device(device)
    out = {}
    for i in indices:
        layer = hollow_layer(model, i, train, dev)
        if layer is not None:
            out[i] = (layer, make_optimizer(layer, spec))
    return out


def build_context(
    model: ModelConfig,
    train: TrainConfig,
    strategy: StageLayout,
    rank: int = 0,
    groups: EpochGroups | None = None,
    device: torch.device | str = "cpu",
    held: HeldLayers | None = None,
) -> StageContext:
    """The rank's context: the layers of `held` that its stage holds as they are (a migration keeps its modules and
    optimisers: nothing is copied), the others freshly initialised (deterministic from the model seed) on `device`."""
    stage, replica = strategy.coords(rank)
    indices = strategy.layers(stage)
    total = n_layers(model)
    if indices.stop > total:
        raise ValueError(f"strategy bounds {strategy.bounds} exceed the model's {total} layers")
    if stage == strategy.P - 1 and indices.stop != total:
        raise ValueError(f"the last stage must end at layer {total}, bounds are {strategy.bounds}")
    have = {i: held[i] for i in indices if held is not None and i in held}
    have.update(fresh_layers(model, train, [i for i in indices if i not in have], device))
    module = Stage([have[i][0] for i in indices], indices.start, indices.stop)
    optimizers = {i: have[i][1] for i in indices}
    return StageContext(model, train, strategy, stage, replica, module, optimizers, groups, torch.device(device))


def parameters_checksum(layers: Mapping[str, Mapping[str, torch.Tensor]], names: Sequence[str]) -> str:
    """sha256 over the parameter tensors of `names` (in that order, then parameter name); optimiser state excluded."""
    h = hashlib.sha256()
    for name in names:
        for key in sorted(k for k in layers[name] if k.startswith("param/")):
            t = layers[name][key].detach().contiguous()
            h.update(f"{name}/{key}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # its bytes: numpy has no bfloat16
    return h.hexdigest()


def micro_loss(spec: TrainSpec, outputs: Any, targets: Any, global_batch_size: int) -> torch.Tensor:
    """This micro-batch's share of the global mean loss: the spec's SUM over its rows / the global batch (the
    "rows" normalizer; with "count", `train_step` divides by the global count once it is known)."""
    return spec.loss(outputs, targets) / global_batch_size


Signature = tuple[tuple[tuple[int, ...], torch.dtype], ...]


def _signature(tree: Any) -> Signature:
    return tuple((tuple(t.shape), t.dtype) for t in leaves(tree))


@functools.lru_cache(maxsize=256)
def _boundary(model: ModelConfig, train: TrainConfig, first: int, inputs: Signature, tuple_in: bool,
              ) -> tuple[Signature, bool] | None:  # fmt: skip
    """What layer `first` receives for a micro-batch whose inputs have signature `inputs`: the shapes and dtypes of
    the output of layers [0, first), computed on `meta` tensors (no memory, no compute), and whether it is a tuple;
    None where a shape depends on the data (an op that cannot run on `meta`, such as `nonzero`). The sender and the
    receiver of a boundary derive it alike: a derived activation needs no header, the others are preceded by one
    (`stage_forward`)."""
    spec = spec_of(model, train)
    if spec.autocast is not None:  # meta tensors do not autocast: the activations' dtypes come in a header
        return None
    x: Any = tuple(torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in inputs)
    if not tuple_in:
        x = x[0]
    try:
        with torch.no_grad():
            for i in range(first):
                x = run_layer(seeded_build(spec, model.seed, i, "meta"), x)
    except Exception:  # noqa: BLE001 — data-dependent shapes: both ends fall back to a header, never a guess
        return None
    return _signature(x), isinstance(x, tuple)


def _derived(ctx: StageContext, layer: int, xm: Any) -> tuple[Signature, bool] | None:
    """What crosses the boundary before `layer` for a micro-batch of inputs `xm`, derived from the spec (`_boundary`)
    where both of its ends load the data: two stages, the first and the last. A middle stage loads no data (only the
    first stage needs the inputs, only the last the targets, as in Megatron-LM and DeepSpeed): with three stages or
    more every boundary is preceded by a header (None)."""
    if ctx.strategy.P != 2:
        return None
    return _boundary(ctx.model, ctx.train, layer, _signature(xm), isinstance(xm, tuple))


def _empty_like_boundary(sig: Signature, is_tuple: bool, device: torch.device) -> Any:
    return rebuild((None,) if is_tuple else None, [host_empty(shape, dtype, device) for shape, dtype in sig])


#: The largest buffer staged in page-locked memory. torch keeps freed pinned blocks for reuse, each rounded up to a
#: power of two: a few activation- or gradient-sized buffers per worker, not a copy of a large model's whole state.
PIN_MAX_BYTES = 256 << 20


def pinned(nbytes: int, device: torch.device) -> bool:
    """Whether a host buffer of `nbytes` for a tensor on `device` is page-locked (see `host_copy`)."""
    return device.type == "cuda" and nbytes <= PIN_MAX_BYTES


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` in host memory, where gloo sends and reduces it: `t` itself when it is there (contiguous); from a GPU, a
    copy in page-locked (pinned) memory up to `PIN_MAX_BYTES`, which the GPU writes directly — a copy to pageable
    memory goes through a driver buffer first. The copy is synchronous: the tensor is complete when gloo reads it."""
    if t.device.type == "cpu":
        return t.contiguous()
    return host_empty(t.shape, t.dtype, t.device).copy_(t)


def host_empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer in host memory that gloo receives into, for a tensor that goes on to `device`: page-locked as
    `host_copy`'s."""
    nbytes = math.prod(shape) * dtype.itemsize
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=pinned(nbytes, device))


#: The dtypes an activation header can name, by code, and the header's fixed length (int64 slots).
HEADER_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
                 torch.int8, torch.uint8, torch.bool)  # fmt: skip
HEADER_LEN = 64


def _header(tree: Any) -> torch.Tensor:
    """[n tensors, is a tuple, then per tensor: dtype code, ndim, *shape], zero-padded to `HEADER_LEN`."""
    out = [len(leaves(tree)), int(isinstance(tree, tuple))]
    for t in leaves(tree):
        if t.dtype not in HEADER_DTYPES:
            raise ValueError(f"an activation of dtype {t.dtype} cannot be described in a header; use one of "
                             f"{', '.join(str(d) for d in HEADER_DTYPES)}")  # fmt: skip
        out += [HEADER_DTYPES.index(t.dtype), t.dim(), *t.shape]
    if len(out) > HEADER_LEN:
        raise ValueError(f"an activation of {len(leaves(tree))} tensors is too large for a {HEADER_LEN}-slot header")
    return torch.tensor(out + [0] * (HEADER_LEN - len(out)), dtype=torch.int64)


def _from_header(header: torch.Tensor) -> tuple[Signature, bool]:
    h = [int(v) for v in header]
    n, is_tuple, i, sig = h[0], bool(h[1]), 2, []
    for _ in range(n):
        dtype, ndim = HEADER_DTYPES[h[i]], h[i + 1]
        sig.append((tuple(h[i + 2 : i + 2 + ndim]), dtype))
        i += 2 + ndim
    return tuple(sig), is_tuple


def differentiable(tree: Any) -> list[torch.Tensor]:
    """The tensors of an activation that carry gradients between stages (the floating-point ones)."""
    return [t for t in leaves(tree) if t.is_floating_point()]


def _flat_grads(params: list[nn.Parameter], replicated: bool) -> list[tuple[list[nn.Parameter], torch.Tensor]]:
    """The gradients of `params` in one flat tensor per dtype (a stage may mix them: a float32 head beside bfloat16
    blocks), for one all-reduce each — gloo's per-op latency, ~1 ms, dominates for small layers. Alone, only the
    parameters that have one (the others stay None: the optimiser skips them). `replicated` (for a reduce over the
    stage's replicas, whose buffers must be the same size): every parameter, zeros where it has none, then a 1 for each
    that has one — replicas may disagree on which do (a data-dependent branch, as a mixture of experts routes,
    reached by one replica's rows only); summed, that tail says which some replica gave a gradient, as one process
    training the whole batch would have."""
    by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
    for p in params:
        if replicated or p.grad is not None:
            by_dtype.setdefault(p.dtype, []).append(p)
    out = []
    for dtype, group in by_dtype.items():
        parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group]
        if replicated:
            parts.append(torch.tensor([float(p.grad is not None) for p in group], dtype=dtype, device=group[0].device))
        out.append((group, torch.cat(parts)))
    return out


def _unflatten_grads(params: list[nn.Parameter], flat: torch.Tensor, had: torch.Tensor | None = None) -> None:
    """Give each of `params` its slice of `flat` as its gradient; with `had` (`_flat_grads`' tail, reduced), None
    to those no replica gave one."""
    given = None if had is None else had.tolist()  # (one read of the counts, not one per parameter from a GPU)
    offset = 0
    for i, p in enumerate(params):
        p.grad = None if given is not None and not given[i] > 0 else flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()


def schedule_order(schedule: str, stage: int, P: int, M: int) -> list[tuple[str, int]]:
    """The order in which `stage` of a P-stage pipeline runs the forward ("F", m) and backward ("B", m) of its M
    micro-batches. GPipe: every forward, then every backward in reverse. 1F1B: P - 1 - stage warm-up forwards,
    then one forward and one backward in turn, then the remaining backwards — at most P - stage micro-batches'
    activations alive at once instead of M (the memory a GPU pipeline needs). Every stage derives its order alike,
    so sends and receives between neighbours pair up in order."""
    if schedule == "gpipe":
        return [("F", m) for m in range(M)] + [("B", m) for m in reversed(range(M))]
    if schedule != "1f1b":
        raise ValueError(f"unknown pipeline schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    warm = min(P - 1 - stage, M)
    order = [("F", m) for m in range(warm)]
    for i in range(M - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", m) for m in range(M - warm, M)]


def _autocast(spec: TrainSpec, dev: torch.device) -> torch.autocast:
    return torch.autocast(
        dev.type, dtype=getattr(torch, spec.autocast or "bfloat16"), enabled=spec.autocast is not None
    )


def stage_forward(
    ctx: StageContext, xm: Any, ym: Any, sends: list[tuple[object, torch.Tensor]], autocast: torch.autocast,
    divide_by: int, score: Callable[[Any, Any], None] | None = None,
) -> tuple[Any, Any, float]:  # fmt: skip
    """One micro-batch through this rank's stage: receive its activations (or take the batch's inputs `xm`), run the
    stage, send on (the sends left pending in `sends`) or, on the last stage, score it against `ym`. Returns (the
    stage's input, its output — on the last stage the micro-batch's loss: the spec's sum divided by `divide_by`, or
    with normalizer "count" the sum —, the items the loss counted: 0.0 unless "count"). A receiver knows each
    activation's shapes from the spec alone where it can (`_derived`), else from a header. With gradients enabled,
    the received activations' floating-point tensors require them. `score(outputs, targets)`: told the last layer's
    outputs of the micro-batch before the loss (validation's metrics)."""
    g, dev, spec = ctx.groups, ctx.device, ctx.spec
    if ctx.is_first:
        inp = to_device(xm, dev)
    else:
        assert g is not None and ctx.prev_rank is not None  # a later stage: P > 1, so the rank has groups
        derived = _derived(ctx, ctx.module.first, xm)
        if derived is None:
            header = torch.empty(HEADER_LEN, dtype=torch.int64)
            g.recv(header, ctx.prev_rank)
            derived = _from_header(header)
        staged = _empty_like_boundary(*derived, dev)  # in host memory: gloo sends and receives there
        for t in leaves(staged):
            g.recv(t, ctx.prev_rank)
        inp = to_device(staged, dev)
        if torch.is_grad_enabled():
            for t in differentiable(inp):
                t.requires_grad_()
    n = 0.0
    with autocast:
        out = ctx.module(inp)
        if ctx.is_last:
            ym = to_device(ym, dev)
            if score is not None:
                score(out, ym)
            if spec.normalizer == "count":
                out, counted = spec.loss(out, ym)
                n = float(counted)
            else:
                out = micro_loss(spec, out, ym, divide_by)
    if not ctx.is_last:
        assert g is not None and ctx.next_rank is not None  # an earlier stage: P > 1, so the rank has groups
        derived = _derived(ctx, ctx.module.last, xm)
        if derived is None:
            header = _header(out)
            sends.append((g.send(header, ctx.next_rank), header))
        elif derived != (_signature(out), isinstance(out, tuple)):
            raise ValueError(f"the output of layer {ctx.module.last - 1} is {_signature(out)}, but its shapes "
                             f"derived on meta tensors are {derived[0]}: a shape that depends on the data must "
                             "come from an op without a meta kernel (e.g. nonzero)")  # fmt: skip
        for t in leaves(out):
            act = host_copy(t.detach())
            sends.append((g.send(act, ctx.next_rank), act))
    return inp, out, n


def train_step(
    ctx: StageContext,
    step: int,
    commit: Callable[[], bool] | None = None,
    reduced: Callable[[], None] | None = None,
    rows: Prefetcher | None = None,
) -> float:
    """One step of the global batch `step` on this rank (GPipe or 1F1B, `TrainConfig.schedule`); returns the
    global mean loss (on every rank). Either schedule only accumulates gradients, so both train the same run.

    Nothing is applied unless every op of the step completed and `commit()` (if given) returned True; otherwise
    `StepAbandoned` is raised with parameters and optimiser state untouched (see the module docstring).
    `reduced()` (if given) is called once the gradients the optimiser will apply are final (reduced, normalised,
    clipped) and the step's forwards have left their buffers, before the commit: a migration's source sends them
    from there (`trainer.runtime.worker`), beside the commit and the update. `rows`: where this replica's rows come
    from, the next step's loaded while this one trains (default: loaded now).
    """
    spec, B, D, dev = ctx.spec, ctx.train.global_batch, ctx.strategy.D, ctx.device
    g = ctx.groups
    scaling, scale = spec.scaling, ctx.held_scale()  # float16's loss scale (`trainer.runtime.loss_scale`)
    if (scaling is None) != (scale is None):
        raise RuntimeError(f"step {step}: the spec {'scales' if scaling else 'does not scale'} its loss, and the "
                           f"layers {'hold no' if scale is None else 'hold a'} loss scale")  # fmt: skip
    # this replica's rows of the step's global batch (only those loaded, where the batch function can: `RowBatch`)
    mine, mb = replica_rows(B, ctx.replica, D), ctx.train.micro_batch
    if ctx.is_first or ctx.is_last:  # the inputs, the targets: a middle stage loads nothing (its inputs' shapes
        x, y = rows.load(step, mine) if rows is not None else batch_rows(spec.batch, step, mine)  # come in headers)
        micro = shard(x, y, 0, 1, mb)
    else:
        micro = unloaded(mine, mb)
    for opt in ctx.optimizers.values():
        opt.zero_grad(set_to_none=True)
    inputs: dict[int, Any] = {}
    outputs: dict[int, Any] = {}
    sends: list[tuple[object, torch.Tensor]] = []  # every send stays pending (and its tensor alive) to the end
    loss = torch.zeros((), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)  # the items the loss counted (normalizer "count")
    autocast = _autocast(spec, dev)

    def forward(m: int) -> None:
        nonlocal loss, count
        xm, ym = micro[m]
        inputs[m], outputs[m], n = stage_forward(ctx, xm, ym, sends, autocast, B)
        if ctx.is_last:
            loss += outputs[m].detach().to("cpu", torch.float64)
            count += n

    def backward(m: int) -> None:
        # gradients of the outputs come from the next stage (or the loss), go to the previous; every floating-point
        # tensor of an activation carries one (zeros where the stage did not use it)
        inp, out = inputs.pop(m), outputs.pop(m)
        if ctx.is_last:
            (out if scale is None else out * scale.value).backward()
        else:
            assert g is not None and ctx.next_rank is not None
            outs, grads = [], []
            for t in differentiable(out):
                grad = host_empty(t.shape, t.dtype, dev)
                g.recv(grad, ctx.next_rank)
                if t.requires_grad:
                    outs.append(t)
                    grads.append(grad.to(dev))
            if outs:
                torch.autograd.backward(outs, grads)
        if not ctx.is_first:
            assert g is not None and ctx.prev_rank is not None
            for t in differentiable(inp):
                grad = host_copy(t.grad if t.grad is not None else torch.zeros_like(t))
                sends.append((g.send(grad, ctx.prev_rank), grad))

    for phase, m in schedule_order(ctx.train.schedule, ctx.stage, ctx.strategy.P, len(micro)):
        (forward if phase == "F" else backward)(m)
    for work, _ in sends:
        assert g is not None  # only a rank with a neighbour sends
        g.wait(work)

    # Data parallel: sum gradients over this stage's replicas. The loss lives on the last stage, split over
    # replicas (non-last ranks add zero); its all-reduce over the world is the step's last collective.
    # With normalizer "count" the loss and the gradients are sums until the global count is known: then divided.
    # With a loss scale, the step's last collective also says whether any rank's gradients overflowed (they hold an
    # Inf or a NaN: then so would the reduced ones), and checks that every rank scaled by the same scale.
    replicated = g is not None and g.dp is not None
    flats = _flat_grads(list(ctx.module.parameters()), replicated)
    overflow = scale is not None and not all(bool(torch.isfinite(flat).all()) for _, flat in flats)
    totals = torch.tensor([0.0, 0.0, float(overflow), 0.0 if scale is None else scale.value], dtype=torch.float64)
    totals[0], totals[1] = loss, count
    if g is not None:
        pending = []
        # the gradients in host memory, where gloo reduces them (the same tensors on the CPU)
        staged = [host_copy(flat) for _, flat in flats] if replicated else []
        pending += [g.all_reduce(t, g.dp) for t in staged]
        pending.append(g.all_reduce(totals, g.world))
        for work in pending:
            g.wait(work)
        for (_, flat), t in zip(flats, staged, strict=False):  # (none staged without replicas)
            if t is not flat:
                flat.copy_(t)
    # with replicas, each buffer's tail counts the replicas that gave each parameter a gradient
    grads = [(ps, flat[: -len(ps)], flat[-len(ps) :]) if replicated else (ps, flat, None) for ps, flat in flats]
    loss = totals[0]
    n = float(totals[1])
    if spec.normalizer == "count":
        if not n > 0:
            raise ValueError(f"step {step}: the loss counted {n} items over the global batch; a step needs some")
        loss = loss / n
    skipped = False
    if scaling is not None and scale is not None:
        world = ctx.strategy.world_size
        if not math.isclose(float(totals[3]), world * scale.value, rel_tol=1e-9):
            raise RuntimeError(f"step {step}: the ranks scale the loss differently (this one by {scale.value:g}; the "
                               f"{world} ranks' scales add up to {float(totals[3]):g})")  # fmt: skip
        ctx.scaled = scaling.after(scale, float(totals[2]) > 0, step)
        skipped = ctx.scaled.skipped
    if skipped:  # an overflow somewhere: no rank updates anything (the buffers the forwards left aside)
        grads = []
        for p in ctx.module.parameters():
            p.grad = None
    for _, flat, _ in grads:
        if scale is not None:
            flat.mul_(1.0 / scale.value)  # (a power of two, by default: exact)
        if spec.normalizer == "count":
            flat.div_(n)
    clip = spec.clip_grad_norm
    if clip is not None and not skipped:
        # the global norm needs the reduced gradients of every stage: replica 0 of each stage adds its square sum
        sq = torch.zeros((), dtype=torch.float64)
        if ctx.replica == 0:
            for _, flat, _ in grads:
                sq += flat.to(torch.float64).square().sum().to("cpu")
        if g is not None:
            g.wait(g.all_reduce(sq, g.world))
        norm = float(sq.sqrt())
        if norm > clip:
            for _, flat, _ in grads:
                flat.mul_(clip / (norm + 1e-6))
    for ps, flat, had in grads:
        _unflatten_grads(ps, flat, had)
    if reduced is not None:
        reduced()

    # Only now — every op done, and the step committed everywhere — does anything change.
    if commit is not None and not commit():
        raise StepAbandoned(f"step {step}: the commit was refused (the epoch broke before every rank finished)")
    if ctx.scaled is not None:
        for opt in ctx.optimizers.values():
            loss_scale.attach(opt, ctx.scaled)
    if skipped:
        return float(loss)
    lr = spec.lr(step) if spec.lr is not None else None
    for opt in ctx.optimizers.values():
        if lr is not None:
            for group in opt.param_groups:
                group["lr"] = lr
        opt.step()
    return float(loss)


def validate(ctx: StageContext, validation: Validation) -> dict[str, float]:
    """The held-out loss ("loss") and `validation.metrics` of the parameters this rank's epoch holds now (on every
    rank): every batch of `validation` forward only through the strategy's stages and replicas (each replica its
    rows, in micro-batches; a middle stage loads none where the batches give their sizes), the layers in `eval()`
    mode, the last stages' sums and counts added over the world in one all-reduce. No parameter, optimiser state or
    loss scale changes; a broken epoch raises `StepAbandoned` (the boundary is scored again in the next one)."""
    spec, g, mb, D = ctx.spec, ctx.groups, ctx.train.micro_batch, ctx.strategy.D
    names = list(validation.metrics)
    # the loss summed over the rows, the rows (or the count), then each metric's sum
    total = torch.zeros(2 + len(names), dtype=torch.float64)
    autocast = _autocast(spec, ctx.device)

    def score(out: Any, ym: Any) -> None:
        for k, name in enumerate(names):
            total[2 + k] += metric_sum(validation.metrics[name](out, ym), name)

    was = ctx.module.training
    ctx.module.eval()
    try:
        with torch.no_grad():
            for i in range(validation.batches):
                sends: list[tuple[object, torch.Tensor]] = []
                micro: list[tuple[Any, Any]] = []
                known = None if ctx.is_first or ctx.is_last else replica_share(validation.batch, i, ctx.replica, D)
                if known is not None:  # a middle stage loads nothing where the batch's size tells its micro-batches
                    micro = unloaded(known, mb)
                elif (part := replica_part(validation.batch, i, ctx.replica, D)) is not None:
                    micro = shard(*part, 0, 1, mb)
                for xm, ym in micro:
                    _, out, n = stage_forward(ctx, xm, ym, sends, autocast, 1, score if names else None)
                    if ctx.is_last:
                        total[0] += out.to("cpu", torch.float64)
                        total[1] += n if spec.normalizer == "count" else rows_of(ym)
                for work, _ in sends:  # a batch's activations are released before the next is run
                    assert g is not None  # only a rank with a neighbour sends
                    g.wait(work)
            if g is not None:
                g.wait(g.all_reduce(total, g.world))
    finally:
        ctx.module.train(was)
    if not float(total[1]) > 0:
        raise ValueError(f"validation counted {float(total[1])} items over its {validation.batches} batches; give it "
                         "batches with rows (with normalizer 'count': items the loss counts)")  # fmt: skip
    means = (total / total[1]).tolist()
    return {"loss": means[0], **{name: means[2 + k] for k, name in enumerate(names)}}
