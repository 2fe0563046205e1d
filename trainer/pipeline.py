"""Hybrid data x pipeline parallel execution (D x P) over torch.distributed (gloo), one training step at a time.

Owns: the strategy's geometry (`Strategy`: which global rank runs which stage of which replica, and which layers a
stage holds), process groups of a reconfiguration epoch (`init_epoch` / `close_epoch`), the per-rank training
state (`StageContext`: the rank's `Stage`, one optimiser per layer), the training step (`train_step`) and the unit
that migrations move (`layer_state` / `load_layer_state`).
Must not touch: the model's maths (`trainer.model`), the data (`trainer.data`), files (`trainer.checkpoint`),
the choice of strategy (the coordinator).

Design choices
--------------
* **GPipe** (all forwards of a step, then all backwards): the simplest schedule to make *exactly* equivalent to
  single-process training — every micro-batch sees the same weights and gradients are only accumulated — and a
  step ends with no activation in flight, so a migration can interrupt cleanly at any step boundary. Its memory
  cost (all micro-batches' activations alive at once) is not the constraint for these CPU models.
* **Hand-written send/recv** rather than `torch.distributed.pipelining`: a migration rebuilds stages and process
  groups with arbitrary layer ranges while the global batch stays fixed (uneven replica shards included);
  `PipelineStage` and its schedules assume a static world, a fixed number of micro-batches of one shape and
  scale gradients by 1/n_microbatches. A dozen lines of p2p keep the step readable and under our control.
* **Loss scaling**: the last stage computes sum of token cross-entropies / (global_batch * block_size) per
  micro-batch, so gradients summed over micro-batches and over replicas (all-reduce SUM in each stage's
  data-parallel group) are exactly the gradient of the mean loss over the global batch, whatever D, P or the split.
* **One AdamW per layer**: a layer's parameters and optimiser state are extracted and installed together
  (`layer_state`), which is mathematically identical to one AdamW over all parameters (Adam is element-wise).
* **Process groups: a fresh default group per epoch** from `PrefixStore(f"epoch{n}", store)` (stack.md §4e, way 4),
  plus one data-parallel group per stage made with `new_group(ranks, use_local_synchronization=True)` (only that
  stage's replicas take part; each rank joins exactly one, so there is no cross-stage ordering to get wrong).
  `new_group` alone is not enough across epochs: it can only select among the ranks of an existing world, while
  a migration renumbers ranks and may admit a newly started process, and a world with a dead peer cannot be
  reused. Re-initialising on a new prefix gives each epoch clean keys in the coordinator-hosted store.
  `close_epoch` must be called at a step boundary: `destroy_process_group` blocks while an op is pending.
* Global ranks within an epoch are `stage * D + replica` (as in the reference); they are **not** stable across
  epochs — a worker's identity is the coordinator's business, its rank is the epoch's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from trainer.config import ModelConfig, TrainConfig
from trainer.data import global_batch, micro_sizes, shard
from trainer.model import Stage, build_layer, layer_names, param_dtype

LayerState = dict[str, torch.Tensor]


def partition(n_layers: int, P: int) -> tuple[int, ...]:
    """Even contiguous cut of `n_layers` into `P` stages: the P+1 boundaries (sizes differ by at most one)."""
    if not 1 <= P <= n_layers:
        raise ValueError(f"cannot cut {n_layers} layers into P={P} non-empty stages")
    return tuple(k * n_layers // P for k in range(P + 1))


@dataclass(frozen=True)
class Strategy:
    """A D x P strategy for one epoch: D replicas of a P-stage pipeline; stage k holds layers [bounds[k], bounds[k+1]).

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
    def even(cls, D: int, P: int, cfg: ModelConfig) -> Strategy:
        return cls(D, P, partition(cfg.n_layers_total, P))

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


@dataclass(frozen=True)
class EpochGroups:
    """The process groups a rank uses in one epoch. `dp` is None when the stage has a single replica."""

    epoch: int
    rank: int
    dp: dist.ProcessGroup | None


def init_epoch(
    store: dist.Store, epoch: int, strategy: Strategy, rank: int, timeout: timedelta
) -> EpochGroups:
    """Join epoch `epoch`: a fresh default gloo group on `PrefixStore(f"epoch{epoch}")`, then this stage's DP group."""
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"epoch{epoch}", store),
        rank=rank,
        world_size=strategy.world_size,
        timeout=timeout,
    )
    stage, _ = strategy.coords(rank)
    dp = None
    if strategy.D > 1:
        dp = dist.new_group(ranks=strategy.stage_ranks(stage), timeout=timeout, use_local_synchronization=True)
    return EpochGroups(epoch=epoch, rank=rank, dp=dp)


def close_epoch() -> None:
    """Leave the current epoch (all its groups). Only at a step boundary: destroy blocks on a pending op."""
    if dist.is_initialized():
        dist.destroy_process_group()


def make_optimizer(layer: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimiser of one layer; every layer gets the same hyper-parameters."""
    return torch.optim.AdamW(layer.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def layer_state(layer: nn.Module, optimizer: torch.optim.Optimizer) -> LayerState:
    """A snapshot of one layer: "param/<name>" and "<state key>/<name>" (exp_avg, exp_avg_sq, step) tensors.

    Cloned, so it stays valid while training continues. Before the first step the optimiser has no state and only
    parameters are included.
    """
    out: LayerState = {}
    for name, p in layer.named_parameters():
        out[f"param/{name}"] = p.detach().clone()
        for key, value in optimizer.state.get(p, {}).items():
            out[f"{key}/{name}"] = value.detach().clone() if torch.is_tensor(value) else torch.tensor(value)
    return out


def load_layer_state(layer: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, torch.Tensor]) -> None:
    """Install a `layer_state` snapshot into `layer` (in place) and its `optimizer` (replacing its state).

    Parameters are copied into the existing tensors so the optimiser's references stay valid.
    """
    params = dict(layer.named_parameters())
    owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
    if owned != {id(p) for p in params.values()}:
        raise ValueError("optimizer does not own exactly this layer's parameters")
    expected = {f"param/{n}" for n in params}
    missing = expected - state.keys()
    unknown = {k for k in state if k.split("/", 1)[-1] not in params}
    if missing or unknown:
        raise ValueError(f"layer state does not match the layer: missing {sorted(missing)}, unknown {sorted(unknown)}")
    opt_keys = {k.split("/", 1)[0] for k in state} - {"param"}
    with torch.no_grad():
        for name, p in params.items():
            src = state[f"param/{name}"]
            if src.shape != p.shape or src.dtype != p.dtype:
                raise ValueError(
                    f"parameter {name}: state has {tuple(src.shape)} {src.dtype}, layer has {tuple(p.shape)} {p.dtype}"
                )
            p.copy_(src)
            optimizer.state.pop(p, None)
            if opt_keys:
                absent = [k for k in opt_keys if f"{k}/{name}" not in state]
                if absent:
                    raise ValueError(f"parameter {name}: optimizer state lacks {absent}")
                optimizer.state[p] = {k: state[f"{k}/{name}"].clone() for k in opt_keys}


@dataclass
class StageContext:
    """Everything one rank needs to train: its place in the strategy, its layers and their optimisers, its groups.

    Changes at a migration: `strategy`, `stage`, `replica`, `module` (rebuilt for the new range) and `groups`;
    the layer modules and their optimisers are kept (or moved via `layer_state`) by global index.
    """

    model: ModelConfig
    train: TrainConfig
    strategy: Strategy
    stage: int
    replica: int
    module: Stage
    optimizers: dict[int, torch.optim.Optimizer]  # by global layer index
    groups: EpochGroups | None = None
    names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        all_names = layer_names(self.model)
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

    def layer_states(self) -> dict[str, LayerState]:
        """Snapshots of this rank's layers, by layer name."""
        return {
            name: layer_state(self.module.layer(i), self.optimizers[i])
            for name, i in zip(self.names, self.module.indices, strict=True)
        }

    def load_layer_states(self, states: Mapping[str, LayerState]) -> None:
        """Install this rank's layers from `states` (by name; other layers in `states` are ignored)."""
        missing = [n for n in self.names if n not in states]
        if missing:
            raise KeyError(f"no state for layers {missing} of stage {self.stage}")
        for name, i in zip(self.names, self.module.indices, strict=True):
            load_layer_state(self.module.layer(i), self.optimizers[i], states[name])


def build_context(
    model: ModelConfig,
    train: TrainConfig,
    strategy: Strategy,
    rank: int = 0,
    groups: EpochGroups | None = None,
) -> StageContext:
    """The rank's context with freshly initialised layers (deterministic from the model seed)."""
    stage, replica = strategy.coords(rank)
    indices = strategy.layers(stage)
    if indices.stop > model.n_layers_total:
        raise ValueError(f"strategy bounds {strategy.bounds} exceed the model's {model.n_layers_total} layers")
    if stage == strategy.P - 1 and indices.stop != model.n_layers_total:
        raise ValueError(f"the last stage must end at layer {model.n_layers_total}, bounds are {strategy.bounds}")
    layers = [build_layer(model, i) for i in indices]
    module = Stage(layers, indices.start, indices.stop)
    optimizers = {i: make_optimizer(module.layer(i), train) for i in indices}
    return StageContext(model, train, strategy, stage, replica, module, optimizers, groups)


def micro_loss(logits: torch.Tensor, targets: torch.Tensor, global_batch_size: int) -> torch.Tensor:
    """This micro-batch's share of the global mean loss: sum of token cross-entropies / (global_batch * T)."""
    total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    return total / (global_batch_size * targets.shape[1])


def _all_reduce_grads(params: list[nn.Parameter], group: dist.ProcessGroup) -> None:
    # One flat all-reduce per stage: gloo's per-op latency (~1 ms) dominates for small layers. Replicas run the same
    # graph, so they agree on which parameters have a gradient; the others stay None (AdamW skips them).
    params = [p for p in params if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()


def train_step(ctx: StageContext, step: int) -> float:
    """One GPipe step of the global batch `step` on this rank; returns the global mean loss (on every rank)."""
    B, T, C = ctx.train.global_batch, ctx.model.block_size, ctx.model.n_embd
    D, dtype = ctx.strategy.D, param_dtype(ctx.model)
    x, y = global_batch(step, ctx.train, T)
    micro = shard(x, y, ctx.replica, D, ctx.train.micro_batch)
    sizes = micro_sizes(B, ctx.replica, D, ctx.train.micro_batch)
    for opt in ctx.optimizers.values():
        opt.zero_grad(set_to_none=True)

    # Forward, every micro-batch: receive activations (or take token ids), run the stage, send on (or score).
    inputs, outputs, sends = [], [], []
    loss = torch.zeros((), dtype=dtype)
    for (xm, ym), m in zip(micro, sizes, strict=True):
        if ctx.is_first:
            inp = xm
        else:
            inp = torch.empty(m, T, C, dtype=dtype)
            dist.recv(inp, src=ctx.prev_rank)
            inp.requires_grad_()
        out = ctx.module(inp)
        if ctx.is_last:
            out = micro_loss(out, ym, B)
            loss += out.detach()
        else:
            sends.append(dist.isend(out.detach(), dst=ctx.next_rank))
        inputs.append(inp)
        outputs.append(out)
    for work in sends:
        work.wait()

    # Backward, in reverse: gradients of the outputs come from the next stage (or the loss), go to the previous.
    sends = []
    for inp, out, m in reversed(list(zip(inputs, outputs, sizes, strict=True))):
        if ctx.is_last:
            out.backward()
        else:
            grad = torch.empty(m, T, C, dtype=dtype)
            dist.recv(grad, src=ctx.next_rank)
            out.backward(grad)
        if not ctx.is_first:
            sends.append(dist.isend(inp.grad, dst=ctx.prev_rank))
    for work in sends:
        work.wait()

    # Data parallel: sum gradients over this stage's replicas, then every layer's own optimiser steps.
    if ctx.groups is not None and ctx.groups.dp is not None:
        _all_reduce_grads(list(ctx.module.parameters()), ctx.groups.dp)
    for opt in ctx.optimizers.values():
        opt.step()

    # The loss lives on the last stage, split over replicas; non-last ranks add zero.
    if ctx.groups is not None:
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    return float(loss)
