"""A migration's state hand-off on the wire: which (source, receiver) pairs, in which order, what each message holds,
and how a receiver catches a layer up from a state that came a step early.

Owns: the pairs' one global order (`pairs`), a message (`send_one`, `send_empty`, `receive_one`: its length, then
the packed layers — a length of 0 is an empty message: "nothing ahead", or a go), the states and gradients a source
packs (`live_states`, `step_grads`), the gradients after the early states (`receive_grads`), the catch-up
(`catch_up_layers`, `catch_up_lr`).
Must not touch: when each message is sent (the worker's `_transfer` at the boundary; a preparation's helpers before
it: `trainer.runtime.preparation`), the process groups' formation, the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from trainer.runtime import wire
from trainer.runtime.migration import Epoch
from trainer.runtime.model import layer_names, spec_of
from trainer.runtime.pipeline import (
    EpochGroups,
    HeldLayers,
    LayerState,
    StageContext,
    apply_step,
    catch_up,
    fresh_layers,
    hollow_layers,
    host_empty,
    layer_state,
    layer_step,
)
from trainer.runtime.spec import JobSpec

#: What a receiver gets from one source: the layers of the pair by name (None: an empty message)
Received = dict[str, LayerState] | None


def pairs(epoch: Epoch) -> list[tuple[tuple[int, int], list[int]]]:
    """`epoch`'s transfers as (src, dst) pairs with their layers, in the one global order every party follows
    (blocking sends cannot deadlock)."""
    out: dict[tuple[int, int], list[int]] = {}
    for t in epoch.transfers:
        out.setdefault((t.src, t.dst), []).append(t.layer)
    return sorted(out.items())


def live_states(ctx: StageContext, names: Sequence[str], layers: Sequence[int]) -> dict[str, LayerState]:
    """The states of `layers` as the live tensors, by name: for `wire.pack`, which copies them once, straight into
    the buffer sent."""
    return {names[i]: layer_state(ctx.module.layer(i), ctx.optimizers[i], copy=False) for i in layers}


def step_grads(ctx: StageContext, names: Sequence[str], layers: Sequence[int]) -> dict[str, LayerState]:
    """The last step's final gradients and buffers of `layers`, by name: what a receiver holding their state as of
    the boundary before that step needs to apply it (`catch_up_layers`)."""
    return {names[i]: layer_step(ctx.module.layer(i), ctx.scaled) for i in layers}


def send_one(groups: EpochGroups, epoch: Epoch, dst: int, data: torch.Tensor) -> None:
    """One message to worker `dst`: its length, then the packed buffer (`receive_one`)."""
    rank = epoch.transfer_parties.index(dst)
    size = torch.tensor([data.numel()], dtype=torch.int64)  # kept alive until its send is waited on
    groups.wait(groups.send(size, rank))
    groups.wait(groups.send(data, rank))


def send_empty(groups: EpochGroups, epoch: Epoch, dst: int) -> None:
    """An empty message to worker `dst` (a length of 0): nothing came ahead, or — at the boundary, after what
    did — the go (the step whose gradients went ahead is committed)."""
    groups.wait(groups.send(torch.zeros(1, dtype=torch.int64), epoch.transfer_parties.index(dst)))


def receive_one(
    groups: EpochGroups, epoch: Epoch, me: int, src: int, names: Sequence[str], device: torch.device,
    ahead: bool = False,
) -> Received:  # fmt: skip
    """One message of `src`'s to worker `me`: the layers of the pair, by name (None for an empty message, which
    only a phase ahead of the boundary may be: `ahead`). A message holding other layers is refused."""
    parties = epoch.transfer_parties
    size = torch.zeros(1, dtype=torch.int64)
    groups.recv(size, parties.index(src))
    if ahead and int(size.item()) == 0:
        return None
    data = host_empty((int(size.item()),), torch.uint8, device)  # pinned for a GPU: installed there
    groups.recv(data, parties.index(src))
    got = wire.unpack(data)
    want = {names[t.layer] for t in epoch.transfers if t.src == src and t.dst == me}
    if set(got) != want:
        raise RuntimeError(f"worker {me}: expected layers {sorted(want)} from {src}, got {sorted(got)}")
    return got


def receive_grads(
    groups: EpochGroups, epoch: Epoch, me: int, early: Mapping[tuple[int, int], Received], names: Sequence[str],
    device: torch.device,
) -> dict[tuple[int, int], Received]:  # fmt: skip
    """After the states sent ahead (`early`), in the same order: each such source's gradients of its last step
    (None: they follow at the boundary)."""
    return {(src, dst): receive_one(groups, epoch, me, src, names, device, ahead=True)
            for (src, dst), state in early.items() if state is not None}  # fmt: skip


def catch_up_lr(job: JobSpec, epoch: Epoch) -> float | None:
    """The learning rate of the step before `epoch`'s boundary: the one a catch-up applies."""
    spec = spec_of(job.model, job.train)
    return spec.lr(epoch.start_step - 1) if spec.lr is not None else None


def catch_up_layers(
    job: JobSpec, epoch: Epoch, device: torch.device, early: Mapping[str, LayerState],
    grads: Mapping[str, LayerState], ahead: HeldLayers, installed: Mapping[str, torch.nn.Module] | None = None,
    stepped: Mapping[str, torch.nn.Module] | None = None,
) -> dict[int, tuple[torch.nn.Module, torch.optim.Optimizer]]:  # fmt: skip
    """The layers whose state as of the boundary before `epoch`'s came ahead (`early`), brought to this boundary
    with the step's gradients (in the modules built `ahead` where there are, else built now: hollow, as the state
    fills them, where the layer allows it). A layer whose early state is `installed` in its module already only
    takes the step; one `stepped` ahead is caught up already. Bit for bit the source's state now."""
    installed, stepped = installed or {}, stepped or {}
    index = {name: i for i, name in enumerate(layer_names(job.model))}
    wanted = [index[name] for name in early]
    layers = {i: ahead[i] for i in wanted if i in ahead}
    layers.update(hollow_layers(job.model, job.train, [i for i in wanted if i not in layers], device))
    layers.update(fresh_layers(job.model, job.train, [i for i in wanted if i not in layers], device))
    lr = catch_up_lr(job, epoch)
    for name, state in early.items():
        layer, optimizer = layers[index[name]]
        if stepped.get(name) is layer:
            continue
        if installed.get(name) is layer:
            apply_step(layer, optimizer, grads[name], lr)
        else:
            catch_up(layer, optimizer, state, grads[name], lr)
    return layers
