"""A test model: the tiny GPT, its steps paced to take at least `pace_s` each (its batch function waits).

Why: a live fleet's market runs on the wall clock (a fall at 10 s, a fleet empty from 6 s to 10 s), so a test's job
must still be training when its market moves. Counted in steps alone, such a job had to be long enough for a machine
twice as fast as this one (a fast CI run once finished before its market emptied), and so ran about twice as long as
it needed here. Paced, a step takes at least `pace_s` wherever it runs, and the steps a scenario needs are its
seconds over `pace_s`. The pacing changes no number: the same layers, seeded weights and batches — the tiny GPT's
losses (`model_config("tiny-gpt", dtype=...)`'s).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from trainer.config import ModelConfig, TrainConfig, model_config
from trainer.examples.gpt import spec as gpt_spec
from trainer.runtime.trainspec import TrainSpec


def spec(pace_s: float = 0.1, dtype: str = "float32", *, train: TrainConfig) -> TrainSpec:
    """The tiny GPT whose every step (in each worker) starts no sooner than `pace_s` after its last one."""
    gpt = gpt_spec(**model_config("tiny-gpt").args, dtype=dtype, train=train)  # the registered shape
    last: dict[str, Any] = {"step": None, "at": 0.0}

    def batch(step: int) -> Any:
        if step != last["step"]:  # (a worker may ask for one step's batch twice: its inputs, its targets)
            wait = last["at"] + pace_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            last["step"], last["at"] = step, time.monotonic()
        return gpt.batch(step)

    return dataclasses.replace(gpt, batch=batch)


def paced_gpt(pace_s: float = 0.1, dtype: str = "float64") -> ModelConfig:
    """The paced tiny GPT as a job's model (a spec file: a worker imports it by its path)."""
    return ModelConfig(name=f"{Path(__file__).resolve()}:spec", args={"pace_s": pace_s, "dtype": dtype})
