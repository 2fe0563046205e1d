"""float16 mixed precision's loss scaling (`trainer.runtime.loss_scale`): gradients that float16 would round to zero
survive, an overflowing step is skipped by every rank and the scale backs off (and grows after good steps), a model
whose gradients are NaN whatever the scale stops the job, and the scale moves with the layers through every
migration kind and a checkpoint-restart, so a job under migrations scales as an uninterrupted run does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from _jobs import EVERY_MIGRATION, run_job
from _trainer_fixtures import StepScales, _no_orphans, _one_thread, warm_starts  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from parcae import LossScaling
from parcae.cli import app
from trainer import (
    LossScaleError,
    ModelConfig,
    SpecError,
    StageLayout,
    TrainConfig,
    build_context,
    checkpoint,
    load_spec,
    train_step,
)
from trainer.runtime import loss_scale
from trainer.runtime.pipeline import layer_state, load_layer_state, make_optimizer

pytestmark = pytest.mark.usefixtures("warm_starts")  # workers fork warm: `_trainer_fixtures.warm_worker_starts`

sys.path.insert(0, str(Path(__file__).parent))  # where `_fp16_model` is, for this process and its workers
TRAIN = TrainConfig(global_batch=16)
OFTEN = {"init_scale": 2.0**24, "growth_interval": 2}  # starts far too high, then grows every two good steps


def context(**args):
    model = ModelConfig("_fp16_model:spec", args=args)
    return build_context(model, TRAIN, StageLayout.even(1, 1, model))


def first_layer_grad(**args) -> torch.Tensor:
    ctx = context(**args)
    train_step(ctx, 0)
    return ctx.module.layer(0)[0].weight.grad.clone()


def test_the_loss_scale_keeps_the_gradients_float16_would_round_to_zero():
    exact = first_layer_grad(weight=1e-6, autocast=None)  # float32 throughout
    plain = first_layer_grad(weight=1e-6, scaling=None)  # float16 autocast, no scale
    scaled = first_layer_grad(weight=1e-6)  # float16 autocast, "auto": LossScaling()
    assert exact.count_nonzero() > 0 and plain.count_nonzero() == 0  # every element rounded to zero
    assert (scaled - exact).norm() < 1e-2 * exact.norm()
    assert load_spec(ModelConfig("_fp16_model:spec")).scaling == LossScaling()  # the default under float16
    assert load_spec(ModelConfig("_fp16_model:spec", args={"autocast": "bfloat16"})).scaling is None


def test_an_overflowing_step_is_skipped_and_the_scale_backs_off_then_grows():
    ctx = context(scaling=OFTEN)
    outcomes = []
    for step in range(12):
        before = [p.detach().clone() for p in ctx.module.parameters()]
        scale = ctx.held_scale()
        train_step(ctx, step)
        out = ctx.scaled
        unchanged = all(torch.equal(a, b) for a, b in zip(before, ctx.module.parameters(), strict=True))
        assert unchanged == out.skipped, step  # a skipped step changes no parameter; an applied one does
        if out.skipped:
            assert out == loss_scale.LossScale(scale.value / 2, 0, scale.overflows + 1), step
        elif scale.good_steps == 1:  # the second good step in a row: the scale grows
            assert out == loss_scale.LossScale(scale.value * 2), step
        else:
            assert out == loss_scale.LossScale(scale.value, scale.good_steps + 1), step
        assert ctx.held_scale() == out
        outcomes.append(out.skipped)
    assert outcomes[0] and not all(outcomes) and outcomes.count(True) >= 5  # 2**24 is too high; it finds its level


def test_a_static_scale_stays_and_still_skips_an_overflowing_step():
    ctx = context(scaling={"init_scale": 2.0**24, "dynamic": False})
    train_step(ctx, 0)
    assert ctx.scaled == loss_scale.LossScale(2.0**24, 0, 1) and ctx.scaled.skipped
    rule = LossScaling(init_scale=8.0, dynamic=False)
    now = loss_scale.LossScale(8.0, 0, loss_scale.STATIC_OVERFLOWS - 2)
    assert rule.after(now, False, 5) == loss_scale.LossScale(8.0) and not rule.after(now, False, 5).skipped  # reset
    now = rule.after(now, True, 5)
    with pytest.raises(LossScaleError, match=r"step 6 overflowed at the static loss scale 8, 16 steps in a row"):
        rule.after(now, True, 6)


def test_gradients_that_are_nan_whatever_the_scale_stop_at_the_floor():
    ctx = context(nan_grads=True, scaling={"init_scale": 4.0})
    assert all(isinstance(train_step(ctx, s), float) for s in range(2))  # 4 -> 2 -> 1 (the loss itself is finite)
    with pytest.raises(LossScaleError, match=r"the gradients of step 2 overflowed at loss scale 1, the floor "
                                             r"\(min_scale 1\): they are not finite whatever the scale"):  # fmt: skip
        train_step(ctx, 2)


def test_a_job_whose_gradients_are_nan_stops_with_one_line(tmp_path, _no_orphans):
    res = CliRunner().invoke(app, ["train", "--model", "_fp16_model:spec", "--model-args",
                                   json.dumps({"nan_grads": True, "scaling": {"init_scale": 4.0}}), "--workers", "2",
                                   "--steps", "6", "--out-dir", str(tmp_path / "run")])  # fmt: skip
    assert res.exit_code == 1, res.output
    assert "error: the job failed: " in res.output and "at step 2: the gradients of step 2 overflowed" in res.output
    assert "Traceback" not in res.output


def test_a_layer_state_carries_the_scale_and_a_state_of_another_job_is_refused():
    spec = load_spec(ModelConfig("_fp16_model:spec"))
    plain = load_spec(ModelConfig("_fp16_model:spec", args={"scaling": None}))
    layer = spec.layers[0].build()
    scaled_opt, plain_opt = make_optimizer(layer, spec), make_optimizer(layer, plain)
    loss_scale.attach(scaled_opt, loss_scale.LossScale(512.0, 3))
    state = layer_state(layer, scaled_opt)
    assert float(state["amp/scale"]) == 512.0 and int(state["amp/good_steps"]) == 3 and int(state["amp/overflows"]) == 0
    other = make_optimizer(layer, spec)
    load_layer_state(layer, other, state)
    assert loss_scale.scale_of(other) == loss_scale.LossScale(512.0, 3)
    with pytest.raises(ValueError, match="it holds a loss scale, and the job scales none"):
        load_layer_state(layer, plain_opt, state)
    with pytest.raises(ValueError, match="it lacks the loss scale the job's float16 training keeps"):
        load_layer_state(layer, other, layer_state(layer, plain_opt))


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"init_scale": 0.0}, "init_scale 0.0 must be a positive finite number"),
        ({"growth_factor": 1.0}, "growth_factor 1.0 must be above 1"),
        ({"backoff_factor": 1.5}, "backoff_factor 1.5 must be between 0 and 1"),
        ({"growth_interval": 0}, "growth_interval 0 must be a whole number of steps, at least 1"),
        ({"init_scale": 2.0, "min_scale": 4.0}, "min_scale 4.0 must not exceed init_scale 2.0"),
        ("always", "loss_scaling 'always'; give a parcae.LossScaling, None or \"auto\""),
    ],
)
def test_a_bad_loss_scaling_is_one_message(scaling, message):
    with pytest.raises(SpecError, match=f"'_fp16_model:spec': (loss_scaling: )?{message}"):
        load_spec(ModelConfig("_fp16_model:spec", args={"scaling": scaling}))


def test_the_scale_moves_with_the_layers_through_every_migration_and_a_restart(tmp_path, _no_orphans):
    """Every kind of live migration (prepared ahead where it can be: the catch-up applies or skips the step its
    source did), a kill and a checkpoint-restart, on a scale that overflows and grows every few steps: the job skips
    the steps an uninterrupted run skips and ends on its scale (a rank with another scale would stop the job)."""
    model, steps, kill = ModelConfig("_fp16_model:spec", args={"scaling": OFTEN}), 13, 10
    schedule = [*EVERY_MIGRATION, {"step": kill, "kind": "kill", "instances": [3]},
                {"step": 11, "kind": "checkpoint-restart", "strategy": [1, 2]}]  # fmt: skip
    observer = StepScales()  # step -> (scale, skipped), as the driver reports it
    result = run_job(model, TRAIN, 4, (1, 1), steps, schedule, tmp_path / "job", checkpoint_every=2, timeout_s=90,
                     observer=observer)  # fmt: skip
    kinds = {r["kind"] for r in result["reconfigurations"]}
    assert kinds == {"intra-stage", "inter-stage", "pipeline", "checkpoint-restart"}, kinds
    ref = context(scaling=OFTEN)
    want, losses = {}, []
    for step in range(steps):
        losses.append(train_step(ref, step))
        want[step] = (ref.scaled.value, ref.scaled.skipped)
    assert any(s for _, s in want.values()) and not all(s for _, s in want.values())
    assert result["loss_scale"] == {"final": ref.held_scale().value,
                                    "skipped_steps": [s for s, (_, skip) in want.items() if skip]}  # fmt: skip
    assert observer.seen == want  # the same steps skipped, on the same scale, under every strategy the job went through
    # Up to the killed step the strategies are the schedule's, whatever the timing: the uninterrupted run's losses.
    # The step the kill lands in may complete on every rank first (the kill comes after the step starts, before the
    # next boundary): then it is applied at D=3, whose micro-batches group the rows otherwise, and under float16
    # autocast a last-bit difference in a float32 weight can round its float16 copy one unit apart. Measured: the
    # schedule with step 10 run whole at D=3 ends 4.5e-5 from the uninterrupted run; within float16's unit roundoff.
    assert result["loss"][: kill + 1] == pytest.approx(losses[: kill + 1], rel=1e-5)
    assert result["loss"][kill + 1 :] == pytest.approx(losses[kill + 1 :], rel=2.0**-11)
    final = checkpoint.load(checkpoint.find_shards(result["layers"], steps), config=model, job="job")
    held = {loss_scale.from_state(state) for state in final.layers.values()}
    assert held == {ref.held_scale()}, held


def test_resuming_with_another_loss_scaling_is_one_line(tmp_path, _no_orphans):
    """A spec edited between a job and its resume (the fingerprint sees layers, not the loss scaling): the
    checkpoint holds a scale for a spec that no longer scales, and the job says which setting to give back."""
    mine = tmp_path / "mine.py"
    source = (f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom _fp16_model import spec as base\n"
              "def spec():\n    return base(scaling={scaling})\n")  # fmt: skip
    mine.write_text(source.format(scaling=OFTEN))
    args = ["train", "--model", f"{mine}:spec", "--workers", "2", "--checkpoint-every", "2", "--out-dir",
            str(tmp_path / "run")]  # fmt: skip
    first = CliRunner().invoke(app, [*args, "--steps", "3"])
    assert first.exit_code == 0, first.output
    assert "loss scale 2.09715e+06 at the end; 3 of 3 steps skipped for an overflow" in first.output  # 2**24 / 8
    mine.write_text(source.format(scaling="None"))
    res = CliRunner().invoke(app, [*args, "--steps", "5", "--resume"])
    assert res.exit_code == 1, res.output
    assert "the checkpoint of step 3 holds a loss scale, and the spec does not scale its loss" in res.output
    assert "give the spec the `loss_scaling` it was trained with" in res.output and "Traceback" not in res.output


def test_a_step_s_loss_value_carries_its_scale_and_skip():
    from trainer.runtime.keys import StepLoss

    for value in (
        StepLoss(1.5),
        StepLoss(0.25, 65536.0, True),
        StepLoss(0.25, 1024.0, False),
        StepLoss(1.5, val={"loss": 0.75}),
        StepLoss(0.25, 2048.0, True, {"loss": 1.25, "accuracy": 0.5, "top_5": 0.875}),
    ):  # (and a boundary's held-out scores: the loss, and a validation's metrics)
        assert StepLoss.parse(value.value().encode()) == value
    with pytest.raises(ValueError, match="holds 2 fields"):
        StepLoss.parse(b"0.5 1024.0")
    with pytest.raises(ValueError, match="held-out scores lack the loss"):
        StepLoss.parse(b"0.5 val.accuracy=0.5")
