"""The hand-off's byte layout (trainer.runtime.wire): every dtype and shape round-trips bit for bit, and a buffer
that is not one is refused with a message, never read out of bounds."""

from __future__ import annotations

import json

import pytest
import torch

from trainer.runtime.wire import WireError, pack, unpack


def _bundle() -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return {
        "h.0": {"param/w": torch.randn(3, 5, generator=g), "exp_avg/w": torch.randn(3, 5, generator=g),
                "step/w": torch.tensor(7.0)},
        "h.1": {"param/b": torch.randn(4, generator=g).to(torch.bfloat16), "mask": torch.tensor([True, False]),
                "ids": torch.arange(5, dtype=torch.int64), "half": torch.randn(3, generator=g).half(),
                "empty": torch.zeros(0, 4), "t": torch.randn(2, 3, generator=g).t()},  # non-contiguous
        "relu": {},  # a layer without parameters or buffers: no tensor, still a layer that is sent
    }  # fmt: skip


def test_every_tensor_round_trips_exactly():
    bundle = _bundle()
    got = unpack(pack(bundle))
    assert list(got) == list(bundle)
    for layer, state in bundle.items():
        assert got[layer].keys() == state.keys()
        for key, t in state.items():
            assert got[layer][key].dtype == t.dtype and got[layer][key].shape == t.shape, (layer, key)
            assert torch.equal(got[layer][key], t), (layer, key)


def test_the_buffer_is_a_copy_taken_when_packed():
    bundle = _bundle()
    data = pack(bundle)
    bundle["h.0"]["param/w"].add_(1.0)  # training goes on after the pack
    assert not torch.equal(unpack(data)["h.0"]["param/w"], bundle["h.0"]["param/w"])


@pytest.mark.parametrize("cut", [0, 5, 20, -20])  # -20: into the last tensor, past its padding
def test_a_truncated_buffer_is_refused(cut):
    data = pack(_bundle())
    with pytest.raises(WireError):
        unpack(data[:cut] if cut >= 0 else data[:cut])


def _index(tensors: list[list[object]]) -> bytes:
    return json.dumps({"layers": ["h.0"], "tensors": tensors}).encode()


def test_a_forged_index_is_refused():
    head = _index([["h.0", "param/w", "torch.float32", [1000, 1000], 0, 4_000_000]])
    data = torch.zeros(64 + len(head), dtype=torch.uint8)
    data[:8] = torch.tensor([len(head)], dtype=torch.int64).view(torch.uint8)
    data[8 : 8 + len(head)] = torch.tensor(list(head), dtype=torch.uint8)
    with pytest.raises(WireError, match="do not fit"):
        unpack(data)
    head = _index([["h.0", "param/w", "torch.qint8", [1], 0, 1]])
    data[:8] = torch.tensor([len(head)], dtype=torch.int64).view(torch.uint8)
    data[8 : 8 + len(head)] = torch.tensor(list(head), dtype=torch.uint8)
    with pytest.raises(WireError, match="malformed"):
        unpack(data[: 8 + len(head) + 16])
    for head in (json.dumps([]).encode(), json.dumps({"tensors": []}).encode(), b"{"):  # not the index's form
        data[:8] = torch.tensor([len(head)], dtype=torch.int64).view(torch.uint8)
        data[8 : 8 + len(head)] = torch.tensor(list(head), dtype=torch.uint8)
        with pytest.raises(WireError, match="unreadable index"):
            unpack(data[: 8 + len(head) + 16])


def test_a_tensor_is_staged_for_gloo_without_a_copy_on_the_host_and_pinned_from_a_gpu():
    from trainer.runtime.pipeline import PIN_MAX_BYTES, host_copy, host_empty, pinned

    t = torch.arange(12.0).reshape(3, 4)
    assert host_copy(t) is t  # the host's own tensor: nothing copied
    strided = t.t()
    assert host_copy(strided).is_contiguous() and torch.equal(host_copy(strided), strided)
    assert not host_empty((5,), torch.uint8, torch.device("cpu")).is_pinned()
    assert not pack({"a": {"w": t}}).is_pinned()
    gpu = torch.device("cuda", 0)  # (a device object: no GPU needed to ask)
    assert pinned(4096, gpu) and pinned(PIN_MAX_BYTES, gpu) and not pinned(PIN_MAX_BYTES + 1, gpu)
    assert not pinned(4096, torch.device("cpu"))  # a CPU worker's tensors are already where gloo reads them
    if torch.cuda.is_available():  # (only where a GPU is: the staging a GPU worker's sends go through)
        on_gpu = t.to("cuda")
        staged = host_copy(on_gpu)
        assert staged.device.type == "cpu" and staged.is_pinned() and torch.equal(staged, t)
        assert host_empty((5,), torch.uint8, on_gpu.device).is_pinned()
        assert pack({"a": {"w": on_gpu}}).is_pinned()
