"""Training data: the per-step global batch over the bundled corpus (`trainer.corpus`), and its split.

Owns: `global_batch(step, cfg)` and the split of a global batch into replicas and micro-batches.
Must not touch: models, processes, torch.distributed.

The invariant the elastic trainer rests on: **the global batch of a step depends only on (seed, step)**, never on
D or P, and `shard` partitions it exactly (every sequence lands in exactly one micro-batch of one replica).
Hence any D x P strategy — and any sequence of strategies across migrations — sees the same data.
"""

from __future__ import annotations

import hashlib

import torch

from trainer.config import TrainConfig
from trainer.corpus import corpus


def step_seed(seed: int, step: int) -> int:
    """A stable 63-bit seed for (seed, step); Python's hash() is salted per process, so it is not used."""
    digest = hashlib.sha256(f"batch:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def global_batch(step: int, cfg: TrainConfig, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-character targets of `step`, each (global_batch, block_size), from (cfg.seed, step) alone."""
    tokens = corpus().tokens
    gen = torch.Generator().manual_seed(step_seed(cfg.seed, step))
    starts = torch.randint(0, len(tokens) - block_size - 1, (cfg.global_batch,), generator=gen)
    offsets = torch.arange(block_size)
    x = tokens[starts[:, None] + offsets]
    y = tokens[starts[:, None] + offsets + 1]
    return x, y


def replica_rows(global_batch_size: int, replica: int, n_replicas: int) -> range:
    """Rows of the global batch that `replica` trains on.

    Uneven splits are supported (D need not divide the global batch): replica r gets rows
    [r*B//D, (r+1)*B//D), i.e. floor or ceil of B/D each. The loss is normalised by the global batch
    (`trainer.runtime.pipeline.micro_loss`), not per replica, so uneven shards still sum to the exact global gradient.
    """
    if not 0 <= replica < n_replicas:
        raise ValueError(f"replica {replica} out of range for {n_replicas} replicas")
    if n_replicas > global_batch_size:
        raise ValueError(
            f"D={n_replicas} replicas exceed global_batch={global_batch_size}: some replica would get no sequence"
        )
    return range(replica * global_batch_size // n_replicas, (replica + 1) * global_batch_size // n_replicas)


def micro_sizes(global_batch_size: int, replica: int, n_replicas: int, micro_batch: int) -> list[int]:
    """Sizes of the micro-batches of `replica`: all `micro_batch` except possibly a smaller last one.

    Every stage of a pipeline computes this independently, so a receiving stage knows each activation's shape
    without it being sent.
    """
    n = len(replica_rows(global_batch_size, replica, n_replicas))
    return [min(micro_batch, n - i) for i in range(0, n, micro_batch)]


def shard(
    x: torch.Tensor, y: torch.Tensor, replica: int, n_replicas: int, micro_batch: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The micro-batches (x, y) of `replica` out of the global batch (x, y); see `replica_rows`."""
    rows = replica_rows(len(x), replica, n_replicas)
    xs, ys = x[rows.start : rows.stop], y[rows.start : rows.stop]
    return list(zip(torch.split(xs, micro_batch), torch.split(ys, micro_batch), strict=True))
