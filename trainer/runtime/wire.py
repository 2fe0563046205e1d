"""The byte layout layer states travel in between workers: one flat uint8 buffer, a JSON index at its head.

Owns: `pack` (layer states -> one buffer) and `unpack` (buffer -> layer states, views into it). Must not touch:
process groups (the worker sends the buffer), what a layer's state holds (`trainer.runtime.pipeline.layer_state`).

Why not `torch.save`: pickling into a `BytesIO`, then copying it out twice, cost 40 ms to pack and 25 ms to
unpack the 19.5 MB of small-gpt's state (`python benchmarks/migration_pause.py` spent most of a hand-off there).
Here each tensor is copied once into the buffer, and unpacking copies nothing: installing the state copies it
into the layer anyway. Layout: int64 index length, the index (JSON: {"layers": every layer's name, in order — a
layer without parameters or buffers has no tensor, yet it is sent —, "tensors": a list of [layer, key, dtype,
shape, offset, nbytes]}), zero padding to `ALIGN`, then each tensor's bytes at its offset (from the data start,
aligned too, so that every tensor can be viewed in its own dtype).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import torch

from trainer.runtime.pipeline import LayerState, pinned

ALIGN = 16  # bytes: >= the largest element size (complex128)
_DTYPES = {str(t): t for t in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
                               torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                               torch.bool)}  # fmt: skip


class WireError(ValueError):
    """A buffer that is not a packed set of layer states (truncated, or its index is malformed)."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def pack(bundle: Mapping[str, Mapping[str, torch.Tensor]]) -> torch.Tensor:
    """One uint8 CPU tensor holding a copy of every tensor of `bundle` (layer name -> state key -> tensor, on any
    device; page-locked where one is on a GPU and the buffer is not too large): the bundle may hold live tensors,
    training may change them once this returns."""
    index: list[list[object]] = []
    sources: list[tuple[int, int, torch.Tensor]] = []  # (offset, nbytes, the tensor flattened)
    offset = 0
    for layer, state in bundle.items():
        for key, t in state.items():
            if str(t.dtype) not in _DTYPES:
                raise TypeError(f"layer {layer!r} state {key!r}: dtype {t.dtype} cannot be sent")
            flat = t.detach().reshape(-1)
            nbytes = flat.numel() * flat.element_size()
            index.append([layer, key, str(t.dtype), list(t.shape), offset, nbytes])
            sources.append((offset, nbytes, flat))
            offset = _aligned(offset + nbytes)
    head = json.dumps({"layers": list(bundle), "tensors": index}, separators=(",", ":")).encode()
    start = _aligned(8 + len(head))
    # the padding between tensors is never read; from a GPU, page-locked where not too large (`pipeline.pinned`)
    gpu = next((f.device for _, _, f in sources if f.is_cuda), torch.device("cpu"))
    buf = torch.empty(start + offset, dtype=torch.uint8, pin_memory=pinned(start + offset, gpu))
    buf[:start] = 0
    buf[:8] = torch.tensor([len(head)], dtype=torch.int64).view(torch.uint8)
    buf[8 : 8 + len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    for off, nbytes, flat in sources:
        if nbytes:
            buf[start + off : start + off + nbytes].copy_(flat.view(torch.uint8))
    return buf


def unpack(data: torch.Tensor) -> dict[str, LayerState]:
    """The layer states `pack` wrote into `data` (a uint8 CPU tensor): tensors are views into `data`."""
    size = data.numel()
    if data.dtype != torch.uint8 or data.dim() != 1 or size < 8:
        raise WireError(f"not a packed state: a {tuple(data.shape)} {data.dtype} tensor")
    n = int(data[:8].view(torch.int64).item())
    if not 0 <= n <= size - 8:
        raise WireError(f"index of {n} bytes in a buffer of {size}")
    try:
        head = json.loads(bytes(data[8 : 8 + n].numpy()))
        layers, index = head["layers"], head["tensors"]
    except (UnicodeDecodeError, ValueError, TypeError, KeyError) as e:
        raise WireError(f"unreadable index: {e!r}") from e
    start = _aligned(8 + n)
    try:
        out: dict[str, LayerState] = {str(layer): {} for layer in layers}
        for layer, key, dtype, shape, off, nbytes in index:
            dt = _DTYPES[dtype]
            o = start + int(off)
            if o % ALIGN or o + nbytes > size or nbytes != _numel(shape) * dt.itemsize:
                raise WireError(f"layer {layer!r} state {key!r}: {nbytes} bytes at {off} do not fit {shape} {dtype}")
            out.setdefault(str(layer), {})[str(key)] = data[o : o + nbytes].view(dt).reshape(shape)
    except WireError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise WireError(f"malformed index entry: {e}") from e
    return out


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            raise WireError(f"bad shape {shape}")
        n *= d
    return n
