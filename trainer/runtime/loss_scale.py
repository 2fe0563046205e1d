"""Dynamic loss scaling for float16 mixed precision, held by every layer's optimiser so that it moves with the layers.

Owns: `LossScaling` (the rule a spec chooses: torch.amp.GradScaler's, with its defaults, and a floor), `LossScale`
(the job's scale now, and what the last step did to it), where the scale lives (`attach` / `scale_of` / `install`:
beside each layer's optimiser) and its form in a layer's state (`to_state` / `from_state`, under "amp/").
Must not touch: the step itself (`trainer.runtime.pipeline.train_step` scales, checks and skips), process groups.

Why: float16 holds nothing below 6e-8, so under float16 autocast the small gradients of a backward pass round to
zero (a V100, which has no bfloat16, trains in float16). The loss is multiplied by the scale before the backward,
the gradients divided by it before the optimiser; a step whose scaled gradients overflowed anywhere is skipped by
every rank and the scale backs off, and the scale grows after `growth_interval` good steps.

Why not `torch.amp.GradScaler`: it decides per optimiser and per process, while a pipeline's stages and replicas must
skip a step together (FSDP's `ShardedGradScaler` agrees with an all-reduce per optimiser: here a collective per
layer per step; the step's one world all-reduce carries the flag instead), and its state lives in one process,
while here it must move with the layers through migrations, catch-ups and checkpoints: each layer's state carries
the job's scale (the same value in every layer), so every path that moves a layer moves it, and a rank that ends
up with a stale one is refused at its next step (`train_step` checks that every rank holds the same).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import torch

#: A layer state's keys for the loss scale: its value, the good steps since it last changed, the overflowing steps in
#: a row
SCALE_KEY, GOOD_STEPS_KEY, OVERFLOWS_KEY = "amp/scale", "amp/good_steps", "amp/overflows"
STATE_KEYS = (SCALE_KEY, GOOD_STEPS_KEY, OVERFLOWS_KEY)
#: A static scale's overflowing steps in a row that stop the job: as many as the default dynamic rule takes from its
#: start (2**16) to its floor (1)
STATIC_OVERFLOWS = 16


class LossScaleError(FloatingPointError):
    """Every step overflows whatever the scale: the gradients are not finite (a NaN or Inf in the model or data)."""


@dataclass(frozen=True)
class LossScale:
    """The job's loss scale now: its value, the steps since it last changed without an overflow, and the steps in a
    row that overflowed."""

    value: float
    good_steps: int = 0
    overflows: int = 0

    @property
    def skipped(self) -> bool:
        """Whether the step that left this scale skipped its update: it overflowed."""
        return self.overflows > 0


@dataclass(frozen=True)
class LossScaling:
    """How a float16 job scales its loss (`TrainSpec.loss_scaling`; the default for float16 autocast).

    torch.amp.GradScaler's rule and defaults: start at `init_scale`; a step whose gradients hold an Inf or a NaN is
    skipped and the scale multiplied by `backoff_factor`; after `growth_interval` steps without one it is multiplied
    by `growth_factor`. `dynamic=False` keeps `init_scale` (a static scale; an overflowing step is still skipped).
    A step that overflows at or below `min_scale` stops the job (`LossScaleError`): no scale makes its gradients
    finite, and skipping steps forever would train nothing while looking alive (DeepSpeed's `min_loss_scale` rule);
    a static scale stops it at `STATIC_OVERFLOWS` overflowing steps in a row.
    """

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    min_scale: float = 1.0
    dynamic: bool = True

    def problems(self) -> list[str]:
        """What is wrong with the rule, as the fix to make (empty: nothing)."""
        out = []
        for name in ("init_scale", "min_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                out.append(f"{name} {v!r} must be a positive finite number")
        if not isinstance(self.growth_factor, (int, float)) or not self.growth_factor > 1:
            out.append(f"growth_factor {self.growth_factor!r} must be above 1")
        if not isinstance(self.backoff_factor, (int, float)) or not 0 < self.backoff_factor < 1:
            out.append(f"backoff_factor {self.backoff_factor!r} must be between 0 and 1")
        interval = self.growth_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            out.append(f"growth_interval {self.growth_interval!r} must be a whole number of steps, at least 1")
        if not out and self.min_scale > self.init_scale:
            out.append(f"min_scale {self.min_scale!r} must not exceed init_scale {self.init_scale!r}")
        return out

    def start(self) -> LossScale:
        return LossScale(float(self.init_scale))

    def after(self, now: LossScale, overflow: bool, step: int) -> LossScale:
        """The scale after a step that did (or did not) `overflow`: a pure function, so every rank computes the same
        one. Raises `LossScaleError` for an overflow at the floor."""
        fix = "look for a NaN or Inf in the model or the data, or lower the learning rate"
        if overflow:
            n = now.overflows + 1
            if self.dynamic and now.value <= self.min_scale:
                raise LossScaleError(
                    f"the gradients of step {step} overflowed at loss scale {now.value:g}, the floor "
                    f"(min_scale {self.min_scale:g}): they are not finite whatever the scale — {fix}"
                )
            if not self.dynamic and n >= STATIC_OVERFLOWS:
                raise LossScaleError(f"the gradients of step {step} overflowed at the static loss scale {now.value:g}, "
                                     f"{n} steps in a row: {fix}, or lower the scale")  # fmt: skip
            value = max(now.value * self.backoff_factor, self.min_scale) if self.dynamic else now.value
            return LossScale(value, 0, n)
        if self.dynamic and now.good_steps + 1 >= self.growth_interval:
            return LossScale(now.value * self.growth_factor)
        return LossScale(now.value, now.good_steps + 1 if self.dynamic else 0)


# Where the scale lives: beside each layer's optimiser (the pair every migration path carries), without touching
# the optimiser's own state or param groups (what a user's code may read).
_SCALES: weakref.WeakKeyDictionary[torch.optim.Optimizer, LossScale] = weakref.WeakKeyDictionary()


def attach(optimizer: torch.optim.Optimizer, scale: LossScale) -> None:
    _SCALES[optimizer] = scale


def scale_of(optimizer: torch.optim.Optimizer) -> LossScale | None:
    """The loss scale the layer of `optimizer` holds (None: its job does not scale its loss)."""
    return _SCALES.get(optimizer)


def to_state(scale: LossScale) -> dict[str, torch.Tensor]:
    return {SCALE_KEY: torch.tensor(scale.value, dtype=torch.float64),
            GOOD_STEPS_KEY: torch.tensor(scale.good_steps, dtype=torch.int64),
            OVERFLOWS_KEY: torch.tensor(scale.overflows, dtype=torch.int64)}  # fmt: skip


def from_state(state: Mapping[str, torch.Tensor]) -> LossScale | None:
    """The loss scale a layer's state (or a step's, `layer_step`) carries, or None where it carries none."""
    if SCALE_KEY not in state:
        return None
    lacking = [k for k in STATE_KEYS if k not in state]
    if lacking:
        raise ValueError(f"a layer state holds {SCALE_KEY} without {', '.join(lacking)}")
    return LossScale(float(state[SCALE_KEY]), int(state[GOOD_STEPS_KEY]), int(state[OVERFLOWS_KEY]))


def install(optimizer: torch.optim.Optimizer, state: Mapping[str, torch.Tensor], what: str) -> LossScale | None:
    """Attach the loss scale `state` carries to `optimizer`, whose job must scale its loss exactly when `state` holds
    a scale (`what` names the state in the error)."""
    scale = from_state(state)
    if (scale is None) != (scale_of(optimizer) is None):
        raise ValueError(f"{what} does not match the job: " + (
            "it holds a loss scale, and the job scales none" if scale is not None
            else "it lacks the loss scale the job's float16 training keeps"))  # fmt: skip
    if scale is not None:
        attach(optimizer, scale)
    return scale
