"""Which device a worker trains on.

Owns: `device_type` and `resolve_device` of a job's `train.device` (one of `trainer.config.DEVICES`: "cpu"; "cuda":
one GPU per worker where there are enough, shared in turn where there are not; "auto": CUDA where it exists, else
the CPU). Must not touch: training, process groups.

Process groups stay gloo: tensors a collective or a send needs are staged through page-locked host memory
(`trainer.runtime.pipeline.host_copy`), so several workers may share one GPU. A worker's GPU is
`PARCAE_DEVICE_INDEX` when the environment gives it (a host's agent, one per slot), else its worker id modulo the
GPUs it sees.
"""

from __future__ import annotations

import os

import torch

from trainer.config import DEVICES

DEVICE_INDEX_ENV = "PARCAE_DEVICE_INDEX"


class DeviceError(ValueError):
    """A device the job asks for that this machine does not have."""


def device_type(kind: str) -> str:
    """The kind of device ("cpu" or "cuda") a job's `train.device` asks for, without checking that this machine has
    it (`resolve_device` does, where a worker starts)."""
    if kind == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return kind


def resolve_device(kind: str, worker_id: int) -> torch.device:
    """The torch device of worker `worker_id` for the job's `train.device`."""
    if kind not in DEVICES:
        raise DeviceError(f"train.device: must be one of {', '.join(DEVICES)}, got {kind!r}")
    if device_type(kind) == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError("train.device: cuda, but this machine has no CUDA device (torch.cuda.is_available() is "
                          "False); use auto or cpu, or a machine with a GPU")  # fmt: skip
    count = torch.cuda.device_count()
    given = os.environ.get(DEVICE_INDEX_ENV)
    index = int(given) if given is not None and given.isdigit() else worker_id % count
    if index >= count:
        raise DeviceError(f"{DEVICE_INDEX_ENV}={index} but this machine has {count} CUDA device(s); on --hosts it is "
                          "the instance's slot: give --slots at most the GPUs of each host")  # fmt: skip
    return torch.device("cuda", index)
