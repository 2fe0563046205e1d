"""A preparation: what one worker does for a prepared epoch before its boundary, while the old epoch trains.

Owns: `Prepared`, the state of one worker's preparation (its groups, formed by a helper thread; the layers built
for it; what its sources send ahead — their layers' state as of the boundary before, then that step's gradients —
and what its receivers got, installed and stepped), and the two helper-thread bodies that move that state:
`Prepared.send_ahead` (a source's sender) and `Prepared.receive_ahead` (a receiver's).
Must not touch: when a preparation starts or is taken (the worker's watcher, `_send_ahead`, `_take_prepared`, at
the boundary `_transfer`), the message format (`trainer.runtime.handoff`), the store (abort reasons come in as a
callable).

Where to look next: `docs/worker.md` (background preparation, in order), `trainer.control.coordinator.prepare`
(what publishes one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.runtime import handoff, wire
from trainer.runtime.migration import Epoch
from trainer.runtime.pipeline import (
    EpochGroups,
    HeldLayers,
    LayerState,
    StageContext,
    StepAbandoned,
    apply_step,
    load_layer_state,
)

POLL_MIN_S, POLL_MAX_S = 0.001, 0.02  # (the worker's: a helper checks its abort reason as often as it would)


@dataclass
class Prepared:
    """Worker `me`'s preparation of `epoch` (`trainer.runtime.keys.prepare`): the process groups its helper thread
    forms while the old epoch trains — the transfer group if this worker sends or receives, the epoch's groups if it
    is a member — and the state that moves ahead of the boundary. `names`: the job's layer names; `lr()`: the
    learning rate of the step before the boundary (`handoff.catch_up_lr`; the spec's schedule is the user's code:
    asked where a failure only leaves the step to the boundary); `device`: where received layers live."""

    epoch: Epoch
    me: int
    names: Sequence[str]
    device: torch.device
    lr: Callable[[], float | None]
    thread: threading.Thread | None = None
    xfer: Any = None  # a gloo process group
    groups: EpochGroups | None = None
    error: BaseException | None = None
    store: Any = None  # the helper's own store client (kept while its groups live)
    built: HeldLayers | None = None  # a standby member's layers of the epoch, built ahead (`Worker._prebuild`)
    # a member's layers that the epoch's transfers fill, built hollow beside training (`Worker._build_ahead`)
    hollow: HeldLayers | None = None
    ahead_error: str | None = None  # why building or installing ahead failed (the boundary did it instead)
    build_lock: threading.Lock = field(default_factory=threading.Lock)  # held while building or installing ahead
    ahead_taken: bool = False  # the boundary took what was built ahead: a build or install not yet started is not done
    # the layers (by name) whose state that came ahead is installed already, in which module (`install_ahead`)
    installed: dict[str, torch.nn.Module] = field(default_factory=dict)
    overtaken: bool = False  # a newer preparation replaced it: its helpers give up
    # the state sent ahead (`Worker._send_ahead`, `receive_ahead`): what each source sends during the step before the
    # epoch's boundary, and what each receiver got, by (src, dst) pair (None: the source sends it at the boundary)
    sender: threading.Thread | None = None
    xfer_ahead: Any = None  # the transfer group, for the sender (which drops it when done: see `_take_prepared`)
    ahead_out: list[tuple[tuple[int, int], torch.Tensor, int]] | None = None  # (pair, packed state, state bytes)
    ahead_in: dict[tuple[int, int], handoff.Received] | None = None
    # then the last step's gradients of what went ahead, sent as soon as that step reduced them (`pack_grads`):
    # packed by (src, dst) pair (None: they follow at the boundary), and what each receiver got
    grads_out: list[tuple[tuple[int, int], torch.Tensor | None]] | None = None
    grads_ready: threading.Event = field(default_factory=threading.Event)  # grads_out is set
    grads_in: dict[tuple[int, int], handoff.Received] | None = None
    # the helper's receiving ended: everything sent ahead arrived (`grads_in` set), or it failed (`receive_error`)
    received: threading.Event = field(default_factory=threading.Event)
    # the layers (by name) whose step is applied already, ahead of the boundary (`step_ahead`)
    stepped: dict[str, torch.nn.Module] = field(default_factory=dict)
    receiving: bool = False  # the receiving is claimed (by the helper, or by the main thread at the boundary)
    send_error: BaseException | None = None
    receive_error: BaseException | None = None

    # -- a receiver's layers ---------------------------------------------------------------------------------
    def install_ahead(self, layers: HeldLayers) -> None:
        """Install the states that came ahead (`ahead_in`) into the layers built for them, before the boundary: the
        catch-up there then only applies the step (`pipeline.apply_step`). Into modules nothing trains (built ahead,
        not yet part of a stage), so a helper thread may do it beside training. A failure leaves the rest to the
        boundary (which installs a layer whole) and is named in the epoch's record."""
        index = {name: i for i, name in enumerate(self.names)}
        try:
            for early in (self.ahead_in or {}).values():
                for name, state in (early or {}).items():
                    held = layers.get(index[name])
                    if held is not None and name not in self.installed:
                        load_layer_state(held[0], held[1], state)
                        self.installed[name] = held[0]
        except Exception as exc:  # noqa: BLE001 — e.g. out of memory: the boundary installs the rest itself
            self.ahead_error = f"installing ahead: {type(exc).__name__}: {exc}"

    def step_ahead(self, layers: HeldLayers) -> None:
        """Apply the step whose gradients came ahead (`grads_in`) to the layers whose state is installed ahead, before
        the boundary (under `build_lock`, as `install_ahead`). Speculative: the source's step may still be refused;
        the boundary's go from the source (`Worker._transfer`) is what makes the layers count, and an abandoned
        migration drops them. A failure leaves the step to the boundary."""
        index = {name: i for i, name in enumerate(self.names)}
        try:
            lr = self.lr()
            for grads in (self.grads_in or {}).values():
                for name, g in (grads or {}).items():
                    held = layers.get(index[name])
                    if held is not None and self.installed.get(name) is held[0] and name not in self.stepped:
                        apply_step(held[0], held[1], g, lr)
                        self.stepped[name] = held[0]
        except Exception as exc:  # noqa: BLE001 — the boundary applies the step instead (from the installed state
            self.ahead_error = f"stepping ahead: {type(exc).__name__}: {exc}"  # only if untouched: see catch_up)
            self.stepped.clear()
            self.installed.clear()

    # -- a source's sender -----------------------------------------------------------------------------------
    def pack_grads(self, ctx: StageContext) -> None:
        """(`train_step`'s `reduced`, on the main thread) The step's final gradients and buffers of the layers sent
        ahead, packed (a copy: the update and the next forwards change them) for the sender thread, which sends
        them while the step commits and applies — the boundary then waits for no transfer."""
        if self.grads_ready.is_set() or self.ahead_out is None:
            return
        layers = dict(handoff.pairs(self.epoch))
        self.grads_out = [(pair, wire.pack(handoff.step_grads(ctx, self.names, layers[pair])))
                          for pair, _, _ in self.ahead_out]  # fmt: skip
        self.grads_ready.set()

    def send_ahead(self, abort: Callable[[], str | None]) -> None:
        """(A helper thread) Send what `Worker._send_ahead` packed (`ahead_out`), once the transfer group has formed,
        then the step's gradients once `pack_grads` packed them. `abort`: why to stop waiting on peers (None: wait)."""
        e = self.epoch
        groups = None
        try:
            while self.xfer_ahead is None:
                if self.error is not None:
                    raise self.error
                reason = abort()
                if reason:
                    raise StepAbandoned(reason)
                time.sleep(POLL_MIN_S)
            groups = EpochGroups(epoch=e.number, rank=e.transfer_parties.index(self.me), world=self.xfer_ahead,
                                 dp=None, abort=abort)  # fmt: skip
            self.xfer_ahead = None  # `groups` holds it (released with this thread's frame, off the main thread)
            assert self.ahead_out is not None
            for (_, dst), data, _ in self.ahead_out:
                handoff.send_one(groups, e, dst, data)
            # then the step's gradients, as soon as it has reduced them (`pack_grads`; None: at the boundary)
            while not self.grads_ready.wait(POLL_MAX_S):
                reason = abort()
                if reason:
                    raise StepAbandoned(reason)
            assert self.grads_out is not None
            for (_, dst), grads in self.grads_out:
                if grads is None:
                    handoff.send_empty(groups, e, dst)
                else:
                    handoff.send_one(groups, e, dst, grads)
            groups.waiter.close()
        except BaseException as exc:  # noqa: BLE001 — the boundary finds out
            if groups is not None:
                groups.abandon()
            self.send_error = exc

    # -- a receiver's helper ---------------------------------------------------------------------------------
    def receive_ahead(self, xfer: Any, abort: Callable[[], str | None]) -> None:
        """(The preparation's helper thread) Receive, in the pairs' global order, what each source sends this worker
        ahead of the epoch's boundary (None for a source that sends at the boundary instead) and install it in the
        layers built ahead; then the gradients of the source's last step, and apply that step to them: at the
        boundary only the source's go is left."""
        e = self.epoch
        groups = EpochGroups(epoch=e.number, rank=e.transfer_parties.index(self.me), world=xfer, dp=None, abort=abort)
        try:
            got: dict[tuple[int, int], dict[str, LayerState] | None] = {
                (src, dst): handoff.receive_one(groups, e, self.me, src, self.names, self.device, ahead=True)
                for (src, dst), _ in handoff.pairs(e) if dst == self.me
            }  # fmt: skip
            self.ahead_in = got
            with self.build_lock:  # into the layers built ahead, by this helper or a standby's main thread
                if not self.ahead_taken:
                    self.install_ahead(self.hollow or self.built or {})
            grads = handoff.receive_grads(groups, e, self.me, got, self.names, self.device)
            with self.build_lock:
                self.grads_in = grads
                if not self.ahead_taken:
                    self.step_ahead(self.hollow or self.built or {})
            groups.waiter.close()
        except BaseException as exc:  # noqa: BLE001 — the boundary finds out
            groups.abandon()
            self.receive_error = exc
        finally:
            self.received.set()
