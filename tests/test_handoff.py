"""A migration's messages (`trainer.runtime.handoff`) between the ranks of a real gloo transfer group: what one
message carries, the empty message ("nothing came ahead", or the go), a message holding other layers than the
pair's, and the pairs' one order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
from torch.distributed import HashStore

from trainer.config import TrainConfig, model_config
from trainer.runtime import handoff, wire
from trainer.runtime.migration import Epoch, first_epoch, layer_sizes, next_epoch
from trainer.runtime.model import layer_names
from trainer.runtime.pipeline import EpochGroups, fresh_layers, gloo_group, layer_state

CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()
SIZES = layer_sizes(CFG)
NAMES = layer_names(CFG)
CPU = torch.device("cpu")


def _recut() -> Epoch:
    """1x2 on workers 0 and 1, re-cut into 1x3 with worker 2 joining: layers move from 0 and 1 to 2 (and between
    0 and 1)."""
    start = first_epoch(1, 2, [0, 1], SIZES.cut, TRAIN.global_batch)
    new = next_epoch(start, 3, [0, 1, 2], SIZES, strategy=(1, 3))
    assert new is not None and new.transfers
    return new


def _parties(epoch: Epoch, work: dict[int, Callable[[EpochGroups], Any]]) -> dict[int, Any]:
    """Run `work[w]` on worker w's end of the epoch's transfer group (every party joins it; one thread each)."""
    store, parties = HashStore(), epoch.transfer_parties
    results: dict[int, Any] = {}

    def party(w: int) -> None:
        rank = parties.index(w)
        pg = gloo_group(store, "xfer-test", rank, len(parties), timedelta(seconds=30))
        groups = EpochGroups(epoch=epoch.number, rank=rank, world=pg, dp=None)
        try:
            results[w] = work[w](groups) if w in work else None
        except Exception as exc:  # noqa: BLE001 — the test reads it
            results[w] = exc
        finally:
            groups.waiter.close()

    threads = [threading.Thread(target=party, args=(w,)) for w in parties]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a party of the transfer group hung"
    return results


def _states(layers: list[int]) -> dict[str, dict[str, torch.Tensor]]:
    return {NAMES[i]: layer_state(m, o) for i, (m, o) in fresh_layers(CFG, TRAIN, layers).items()}


def test_the_pairs_come_in_one_order_with_their_layers():
    epoch = _recut()
    got = handoff.pairs(epoch)
    assert [pair for pair, _ in got] == sorted({(t.src, t.dst) for t in epoch.transfers})
    assert sorted((i, s, d) for (s, d), layers in got for i in layers) == sorted(
        (t.layer, t.src, t.dst) for t in epoch.transfers
    )


def test_a_message_carries_the_pair_s_layers_and_an_empty_one_says_nothing_came():
    epoch = _recut()
    (src, dst), layers = handoff.pairs(epoch)[0]
    sent = _states(layers)
    got = _parties(epoch, {
        src: lambda g: (handoff.send_empty(g, epoch, dst), handoff.send_one(g, epoch, dst, wire.pack(sent))),
        dst: lambda g: (handoff.receive_one(g, epoch, dst, src, NAMES, CPU, ahead=True),
                        handoff.receive_one(g, epoch, dst, src, NAMES, CPU)),
    })  # fmt: skip
    assert not isinstance(got[dst], Exception), got[dst]
    nothing, layers_got = got[dst]
    assert nothing is None  # ahead of the boundary, a length of 0 is "nothing ahead"
    assert set(layers_got) == {NAMES[i] for i in layers}
    for name, state in sent.items():
        assert set(layers_got[name]) == set(state)
        for key, t in state.items():
            assert torch.equal(layers_got[name][key], t), (name, key)


def test_a_message_holding_other_layers_than_the_pair_s_is_refused():
    epoch = _recut()
    (src, dst), layers = handoff.pairs(epoch)[0]
    other = next(i for i in range(len(NAMES)) if i not in layers)
    got = _parties(epoch, {
        src: lambda g: handoff.send_one(g, epoch, dst, wire.pack(_states([other]))),
        dst: lambda g: handoff.receive_one(g, epoch, dst, src, NAMES, CPU),
    })  # fmt: skip
    assert isinstance(got[dst], RuntimeError)
    assert f"expected layers {sorted(NAMES[i] for i in layers)} from {src}" in str(got[dst])


@pytest.mark.parametrize("ahead", [False, True])
def test_gradients_come_only_from_the_sources_whose_state_came_ahead(ahead):
    epoch = _recut()
    (src, dst), layers = handoff.pairs(epoch)[0]
    early = {(src, dst): _states(layers) if ahead else None}
    grads = {NAMES[i]: {"grad/w": torch.ones(2)} for i in layers}
    got = _parties(epoch, {
        src: lambda g: handoff.send_one(g, epoch, dst, wire.pack(grads)) if ahead else None,
        dst: lambda g: handoff.receive_grads(g, epoch, dst, early, NAMES, CPU),
    })  # fmt: skip
    assert not isinstance(got[dst], Exception), got[dst]
    if ahead:
        assert set(got[dst]) == {(src, dst)} and set(got[dst][(src, dst)]) == set(grads)
    else:
        assert got[dst] == {}  # nothing came ahead from it: its gradients follow at the boundary
