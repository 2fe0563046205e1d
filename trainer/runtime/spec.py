"""The wire between the coordinator and its workers: the job's spec and the words of a boundary decision.

Owns: `JobSpec` (what every worker needs besides its id, published once under `job/spec`) and the values a
boundary decision takes (`HOLD`/`TRAIN` for the boundary, `APPLY`/`ABORT` for a step's commit). Must not touch:
decisions (the coordinator makes them), training (the worker). The keys themselves are `trainer.runtime.keys`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer.config import ModelConfig, TrainConfig

HOLD, TRAIN = "hold", "train"
APPLY, ABORT = "apply", "abort"


@dataclass(frozen=True)
class JobSpec:
    """What every worker of the job needs besides its id: published once under `job/spec`. Never changes.

    `layers_dir` receives the final parameters (one shard per stage); `checkpoint_dir` the periodic checkpoints
    (every `checkpoint_every` steps, 0 = never) and the on-demand checkpoint of a checkpoint-restart.
    """

    model: ModelConfig
    train: TrainConfig
    steps: int
    job: str
    layers_dir: str
    pg_timeout_s: float
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    hb_interval_s: float = 0.1
    # the grace a preemption notice gives (a worker's SIGTERM: deadline = signal + grace): GCP's 30 s by default,
    # AWS gives 120 s. The worker reports it; the driver decides the hand-off before it and the provider enforces it
    notice_grace_s: float = 30.0
    # the job's settings as a whole (`JobConfig.to_dict`), recorded in every checkpoint it writes
    settings: Mapping[str, Any] = field(default_factory=dict)
    # the model's `trainer.runtime.model.model_fingerprint` where the coordinator runs: a worker whose code builds
    # other layers (another version of the spec on its machine) refuses to join
    fingerprint: str = ""
    # where every worker copies the shards it writes (`trainer.runtime.checkpoint_mirror`), and fetches the ones a
    # restore needs that its own disk does not hold; None: the checkpoint folder must be shared by every instance
    checkpoint_uri: str | None = None
    # with a checkpoint URI: the newest shards a worker keeps on its own disk (0: all; the URI holds the copies)
    checkpoint_keep: int = 0

    def to_json(self) -> str:
        return json.dumps({
            "model": self.model.to_dict(), "train": {**vars(self.train), "betas": list(self.train.betas)},
            "steps": self.steps, "job": self.job, "layers_dir": self.layers_dir, "pg_timeout_s": self.pg_timeout_s,
            "checkpoint_dir": self.checkpoint_dir, "checkpoint_every": self.checkpoint_every,
            "hb_interval_s": self.hb_interval_s, "notice_grace_s": self.notice_grace_s,
            "settings": dict(self.settings), "fingerprint": self.fingerprint,
            "checkpoint_uri": self.checkpoint_uri, "checkpoint_keep": self.checkpoint_keep,
        })  # fmt: skip

    @classmethod
    def from_json(cls, text: str | bytes) -> JobSpec:
        d = json.loads(text)
        train = {**d["train"], "betas": tuple(d["train"]["betas"])}
        return cls(ModelConfig.from_dict(d["model"]), TrainConfig(**train), d["steps"], d["job"], d["layers_dir"],
                   d["pg_timeout_s"], d["checkpoint_dir"], d["checkpoint_every"], d["hb_interval_s"],
                   d.get("notice_grace_s", 30.0), d.get("settings", {}), d.get("fingerprint", ""),
                   d.get("checkpoint_uri"), d.get("checkpoint_keep", 0))  # fmt: skip
