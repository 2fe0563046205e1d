"""The uninterrupted run that a job's losses and parameters are compared with: one process, D = 1, P = 1, trained
once per (model, train) in a test session and extended when a longer run is asked for.

A run of n steps is the first n steps of any longer one (the data, the learning rate and the optimiser's update
depend on the step, not on the run's length), so one run serves every test of the session on the same model and
settings — on tiny-gpt in float64 a step costs ~90 ms on one thread here, and the suite asked for the same few
hundred steps again in test after test. One intra-op thread, whoever calls: the value does not depend on the
caller's thread setting (which the workers compared with do not share either)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.config import ModelConfig, TrainConfig
from trainer.runtime.pipeline import StageContext, StageLayout, build_context, train_step


@dataclass
class _Run:
    ctx: StageContext
    losses: list[float] = field(default_factory=list)
    states: dict[int, dict[str, Any]] = field(default_factory=dict)  # layer states after n steps, by n


_RUNS: dict[tuple[ModelConfig, TrainConfig], _Run] = {}


def _fresh(model: ModelConfig, train: TrainConfig) -> _Run:
    return _Run(build_context(model, train, StageLayout.even(1, 1, model)))


def _train_to(run: _Run, steps: int) -> None:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        while len(run.losses) < steps:
            run.losses.append(train_step(run.ctx, len(run.losses)))
    finally:
        torch.set_num_threads(old)


def _run(model: ModelConfig, train: TrainConfig) -> _Run:
    key = (model, train)
    if key not in _RUNS:
        _RUNS[key] = _fresh(model, train)
    return _RUNS[key]


def uninterrupted_losses(model: ModelConfig, train: TrainConfig, steps: int) -> list[float]:
    """The losses of the first `steps` steps of one uninterrupted process."""
    run = _run(model, train)
    _train_to(run, steps)
    return run.losses[:steps]


def uninterrupted(model: ModelConfig, train: TrainConfig, steps: int) -> tuple[list[float], dict[str, Any]]:
    """The losses of one uninterrupted process's first `steps` steps, and its layer states after them."""
    run = _run(model, train)
    if steps not in run.states:
        if len(run.losses) > steps:  # past it already (a longer run was asked for first): run it again, aside
            aside = _fresh(model, train)
            _train_to(aside, steps)
            run.states[steps] = aside.ctx.layer_states()
        else:
            _train_to(run, steps)
            run.states[steps] = run.ctx.layer_states()
    return run.losses[:steps], run.states[steps]
