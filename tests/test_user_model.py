"""A user's own model through parcae: the `TrainSpec` contract, its checks, the data helpers, and equivalence — a
CNN that is not ours (examples/digits_cnn.py) and a tuple-activation model (tests/_tuple_model.py) train the same
run under every kind of migration as one uninterrupted process."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from _jobs import EVERY_MIGRATION, run_job
from _trainer_fixtures import _no_orphans, _one_thread, warm_starts  # noqa: F401  (fixtures)
from typer.testing import CliRunner

import parcae
from parcae.cli import app
from trainer import (
    JobConfig,
    JobObserver,
    Layer,
    ModelConfig,
    Patience,
    SpecError,
    StageLayout,
    StepSampler,
    TrainConfig,
    TrainSpec,
    UnknownModelError,
    build_context,
    check_job,
    check_spec,
    checkpoint,
    fingerprint,
    load_spec,
    train_step,
    validate,
)
from trainer.observe.observer import RecordingObserver
from trainer.observe.tracking import start_params
from trainer.runtime.validation import Monitor

ROOT = Path(__file__).resolve().parent.parent
DIGITS = f"{ROOT / 'examples' / 'digits_cnn.py'}:spec"
ARGS = '{"dtype": "float64", "validate_every": 3}'

# every kind: intra-stage, inter-stage under notice (the victim holds its stage's last copy), an addition, pipeline
# migrations (P 2 -> 3 -> 2 under a preemption, then 3 replicas), a kill without notice, a checkpoint-restart
EVERY_KIND = [
    *EVERY_MIGRATION,
    {"step": 10, "kind": "kill", "instances": [3]},
    {"step": 11, "kind": "checkpoint-restart", "strategy": [1, 2]},
]
KINDS = ["intra-stage", "inter-stage", "inter-stage", "pipeline", "pipeline", "pipeline", "intra-stage",
         "checkpoint-restart"]  # fmt: skip


def uninterrupted(model: ModelConfig, train: TrainConfig, steps: int) -> tuple[list[float], dict]:
    ref = build_context(model, train, StageLayout.even(1, 1, model))
    return [train_step(ref, s) for s in range(steps)], ref.layer_states()


def validated(model: ModelConfig, train: TrainConfig, steps: int) -> list[dict]:
    """One process's held-out losses of the job's scored boundaries (`run_job`'s "validation")."""
    ref = build_context(model, train, StageLayout.even(1, 1, model))
    held_out, out = ref.spec.validation, []
    assert held_out is not None
    for s in range(steps + 1):
        if held_out.due(s, steps):
            scores = validate(ref, held_out)
            out.append({"step": s, "loss": scores.pop("loss"), **({"metrics": scores} if scores else {})})
        if s < steps:
            train_step(ref, s)
    return out


def assert_same_parameters(layers_dir: str | Path, steps: int, model: ModelConfig, want: dict, rtol: float) -> None:
    final = checkpoint.load(checkpoint.find_shards(layers_dir, steps), config=model, job="job")
    assert final.layers.keys() == want.keys()
    for name, state in want.items():
        for key in (k for k in state if k.startswith("param/")):
            assert torch.allclose(final.layers[name][key], state[key], rtol=rtol, atol=1e-12), f"{name} {key}"


# ------------------------------------------------------------------------------------------------ equivalence


def test_a_users_cnn_trains_the_same_run_through_parcae_train_under_every_migration_kind(
    tmp_path, _no_orphans, warm_starts
):
    steps, out = 13, tmp_path / "run"
    events = tmp_path / "events.json"
    events.write_text(json.dumps(EVERY_KIND))
    res = CliRunner().invoke(app, ["train", "--model", DIGITS, "--model-args", ARGS, "--events",
                                   str(events), "--workers", "4", "--steps", str(steps), "--out-dir", str(out),
                                   "--json", str(tmp_path / "report.json"), "--no-prepare", "--checkpoint-every",
                                   "3", "--keep-checkpoints", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["kind"] for r in report["reconfigurations"]] == KINDS
    assert not any(r["prepared"] for r in report["reconfigurations"])  # every group formed at its boundary
    assert [r["notice"] for r in report["reconfigurations"]][-2:] == [False, True]

    model = ModelConfig(DIGITS, args=json.loads(ARGS))
    losses, layers = uninterrupted(model, TrainConfig(global_batch=32), steps)  # the spec's 32 rows, found by parcae
    assert report["loss"] == pytest.approx(losses, rel=1e-6)
    # the held-out digits scored every 3 steps and at the end, through every kind, as one process scores them
    want = validated(model, TrainConfig(global_batch=32), steps)
    assert [v["step"] for v in report["validation"]] == [0, 3, 6, 9, 12, 13] == [v["step"] for v in want]
    assert [v["loss"] for v in report["validation"]] == pytest.approx([v["loss"] for v in want], rel=1e-6)
    # and its metric, the share of held-out digits classified right (a count over 297: equal, not close)
    assert [v["metrics"] for v in report["validation"]] == [v["metrics"] for v in want]
    accuracy = want[-1]["metrics"]["accuracy"]
    assert f"validation loss {want[-1]['loss']:.4f}, accuracy {accuracy:.4f} after 13 steps (6 validations)" in (
        res.output)  # fmt: skip
    assert_same_parameters(out / "layers", steps, model, layers, rtol=1e-6)
    # the checkpoints of steps 3, 6, 9 and 12 were scored: the best-scored one is kept beside the newest, and named
    scored = {v["step"]: v["loss"] for v in report["validation"] if v["step"] in (3, 6, 9, 12)}
    best = min(scored, key=lambda s: (scored[s], s))
    held = pytest.approx(scored[best], rel=1e-12)
    assert report["best_checkpoint"] == {"step": best, "val_loss": held, "monitor": "loss", "mode": "min",
                                         "value": held}  # fmt: skip
    assert checkpoint.checkpoint_steps(out / "checkpoints") == sorted({12, best}, reverse=True)
    assert f"best checkpoint: step {best}, validation loss {scored[best]:.4f} (parcae export " in res.output
    res = CliRunner().invoke(app, ["export", str(out / "checkpoints"), "--best", "--out", str(tmp_path / "best.pt")])
    assert res.exit_code == 0 and f"step {best}, validation loss {scored[best]:.4f})" in res.output, res.output

    # parcae export: one state dict that loads into the user's own modules, outside parcae
    res = CliRunner().invoke(app, ["export", str(out / "layers"), "--out", str(tmp_path / "model.pt")])
    assert res.exit_code == 0 and "8 tensors" in res.output and "step 13" in res.output, res.output
    spec = load_spec(model)
    mine = nn.ModuleDict({layer.name: layer.build() for layer in spec.layers})
    mine.load_state_dict(torch.load(tmp_path / "model.pt"), strict=True)
    for name, state in layers.items():
        for key in (k for k in state if k.startswith("param/")):
            got = mine.get_submodule(name).get_parameter(key.removeprefix("param/"))
            assert torch.allclose(got, state[key], rtol=1e-6, atol=1e-12), f"{name} {key}"


def test_tuple_activations_with_an_integer_mask_migrate_like_tensors(tmp_path, _no_orphans):
    sys.path.insert(0, str(Path(__file__).parent))  # where `_tuple_model` is, for this process and its workers
    # with a layer that has no parameters (no optimiser to make, nothing but its place to move), a parameter that
    # never gets a gradient (no optimiser state to move) and an expert that a replica's rows may not reach
    model = ModelConfig("_tuple_model:spec", {"gate": True, "unused": True, "routed": True})
    train, steps = TrainConfig(global_batch=24), 9
    schedule = [{"step": 2, "kind": "plan", "strategy": [1, 3]},
                {"step": 4, "kind": "preempt", "instances": [1, 2], "notice": True},  # one of them holds a stage
                {"step": 4, "kind": "plan", "strategy": [1, 2]},
                {"step": 6, "kind": "plan", "strategy": [2, 1]},
                {"step": 7, "kind": "kill", "instances": [3]}]  # fmt: skip
    started: list[dict] = []
    observer = type("Starts", (JobObserver,), {"on_start": lambda self, info: started.append(dict(info))})()
    result = run_job(model, train, 4, (2, 2), steps, schedule, tmp_path / "job", timeout_s=80, observer=observer)
    # what MLflow records of the spec (start_params): its args and its fingerprint, to tell runs of two specs apart
    params = start_params(started[0])
    assert params["model"] == "_tuple_model:spec" and params["model_fingerprint"] == fingerprint(load_spec(model))[:16]
    kinds = [(r["kind"], r["notice"]) for r in result["reconfigurations"]]
    assert kinds[0] == ("pipeline", True) and len(kinds) >= 3 and not kinds[-1][1], kinds  # the kill: no notice
    assert len(load_spec(model).layers) == 6 and result["layers"]
    assert result["reconfigurations"][1]["step"] == 4 and result["reconfigurations"][1]["preempted"], kinds
    losses, layers = uninterrupted(model, train, steps)
    assert result["loss"] == pytest.approx(losses, rel=1e-6)
    assert_same_parameters(result["layers"], steps, model, layers, rtol=1e-6)


def test_a_held_out_batch_with_fewer_rows_than_replicas_is_scored_through_pipeline_migrations(tmp_path, _no_orphans):
    """Validation batches of 2 and 5 rows over 3 replicas (one replica scores no row of the first), tuple activations
    forward only through 3 stages, and a pipeline migration each way: the held-out losses of one process."""
    sys.path.insert(0, str(Path(__file__).parent))  # where `_tuple_model` is, for this process and its workers
    model = ModelConfig("_tuple_model:spec", {"held_out": 2, "frozen_steps": 1})  # (and a learning-rate schedule)
    train, steps = TrainConfig(global_batch=24), 6
    schedule = [{"step": 2, "kind": "plan", "strategy": [1, 3]}, {"step": 5, "kind": "plan", "strategy": [3, 1]}]
    seen = RecordingObserver()
    result = run_job(model, train, 3, (3, 1), steps, schedule, tmp_path / "job", timeout_s=80, observer=seen,
                     checkpoint_every=2)  # fmt: skip
    assert [r["kind"] for r in result["reconfigurations"]] == ["pipeline", "pipeline"]
    want = validated(model, train, steps)
    assert [v["step"] for v in result["validation"]] == [0, 2, 4, 6] == [v["step"] for v in want]
    assert [v["loss"] for v in result["validation"]] == pytest.approx([v["loss"] for v in want], rel=1e-9)
    # the checkpoints of steps 2 and 4 each hold their held-out loss beside them (what retention keeps the best by)
    scored = {v["step"]: v["loss"] for v in result["validation"] if v["step"] in (2, 4)}
    assert checkpoint.val_losses(tmp_path / "job" / "checkpoints", job="job") == scored
    best = min(scored, key=lambda s: (scored[s], s))
    assert result["best_checkpoint"] == {"step": best, "val_loss": scored[best], "monitor": "loss", "mode": "min",
                                         "value": scored[best]}  # fmt: skip
    # the observers had each before the step that starts from it, the final layers' last
    order = [(h, a if h == "validation" else a.step) for h, a in seen.calls if h in ("validation", "step")]
    assert [s for h, s in order if h == "validation"] == [(v["step"], v["loss"]) for v in result["validation"]]
    assert order.index(("validation", (2, result["validation"][1]["loss"]))) == order.index(("step", 2)) - 1
    assert order[-1] == ("validation", (6, result["validation"][-1]["loss"]))
    assert [step.lr for step in seen.of("step")] == [0.0] + [0.05] * 5  # each step's rate, as the spec gives it


def test_a_data_function_that_fails_while_the_job_trains_is_one_line_naming_it(tmp_path, _no_orphans, warm_starts):
    """A validation batch the check before the job does not load raises in the workers: the job stops with one line
    naming the function, its argument, the error and the user's line — no traceback."""
    sys.path.insert(0, str(Path(__file__).parent))
    args = json.dumps({"held_out": 2, "held_out_fails": True})
    res = CliRunner().invoke(app, ["train", "--model", "_tuple_model:spec", "--model-args", args, "--workers", "1",
                                   "--steps", "2", "--out-dir", str(tmp_path / "run")])  # fmt: skip
    assert res.exit_code == 1, res.output
    assert re.search(r"validation\.batch\(1\) raised FileNotFoundError: held-out shard 1 at .*_tuple_model\.py:\d+ "
                     r"in held_out_batch; fix the validation\.batch function", res.output), res.output  # fmt: skip
    assert "Traceback" not in res.output


def test_the_best_scored_checkpoint_outlives_the_retention_of_a_resumed_job(tmp_path, _no_orphans):
    """A learning rate high enough that the held-out loss goes up and down: the first run's best checkpoint (step 4)
    is kept beside the newest through a resume whose driver never scored it (it reads the loss kept beside it), and
    the resume point — the first run's final layers — gets its loss too."""
    model = ModelConfig(DIGITS, args={"dtype": "float64", "validate_every": 2, "lr": 0.1, "batch_size": 16})
    train, out, ckpt = TrainConfig(global_batch=16), tmp_path / "job", tmp_path / "job" / "checkpoints"
    settings = {"checkpoint_every": 2, "keep_checkpoints": 2, "timeout_s": 80}
    first = run_job(model, train, 2, (2, 1), 6, [], out, **settings)
    again = run_job(model, train, 2, (1, 2), 10, [], out, resume=True, **settings)
    scored = {v["step"]: v["loss"] for v in first["validation"] + again["validation"] if v["step"] in (2, 4, 6, 8)}
    want = {v["step"]: v["loss"] for v in validated(model, train, 10)}
    assert scored == pytest.approx({s: want[s] for s in (2, 4, 6, 8)}, rel=1e-9)
    assert min(scored, key=scored.__getitem__) == 4, scored  # (one process's losses: 2.344, 2.309, 2.319, 2.324)
    assert again["resumed_from"] == 6
    assert again["best_checkpoint"] == {"step": 4, "val_loss": scored[4], "monitor": "loss", "mode": "min",
                                        "value": scored[4]}  # fmt: skip
    assert checkpoint.checkpoint_steps(ckpt) == [8, 6, 4]  # the newest two, and the best
    assert checkpoint.val_losses(ckpt, job="job") == {s: scored[s] for s in (4, 6, 8)}


@pytest.mark.parametrize(("monitor", "mode", "stops_at"), [("loss", "min", 8), ("accuracy", "max", 10)])
def test_the_held_out_scores_stop_the_job_at_one_process_s_boundary_through_a_joiner_and_a_restart(
    tmp_path, _no_orphans, monitor, mode, stops_at
):
    """`Validation(patience=4)`: the job ends at the scored boundary where one process's held-out loss (or accuracy,
    higher being better) has not improved on the best for four scorings — although a joiner came in (it was not there
    to count), a kill made the job restart from the checkpoint of step 4 (boundary 4 scored again, counted once), and
    an addition is scheduled after that boundary (never reached: the driver does not wait for it)."""
    model = ModelConfig(DIGITS, args={"dtype": "float64", "validate_every": 2, "lr": 0.1, "batch_size": 16,
                                      "patience": 4, "monitor": monitor, "mode": mode})  # fmt: skip
    train, steps = TrainConfig(global_batch=16), 16
    want, count = [], Patience()

    def watched(v):
        return v["loss"] if monitor == "loss" else v["metrics"][monitor]

    def count_score(v):  # lower is better, as Patience counts
        return watched(v) if mode == "min" else -watched(v)

    for v in validated(model, train, steps):
        want.append(v)
        count = count.after(v["step"], count_score(v), patience=4)
        if count.stop_at is not None:
            break
    stop = count.stop_at
    # (one process's: the loss up, down and up again — lowest at 0; the accuracy highest at 2 and 4, equal)
    assert stop == stops_at, want
    events = [{"step": 3, "kind": "add", "workers": 1}, {"step": 3, "kind": "plan", "strategy": [1, 3]},
              {"step": 5, "kind": "kill", "instances": [0]}, {"step": 14, "kind": "add", "workers": 1}]  # fmt: skip
    result = run_job(model, train, 2, (1, 2), steps, events, tmp_path / "job", checkpoint_every=2, timeout_s=120)
    assert [r["kind"] for r in result["reconfigurations"]] == ["pipeline", "checkpoint-restart"]
    best = pytest.approx(count.best if mode == "min" else -count.best, rel=1e-9)
    assert result["stopped_early"] == {"step": stop, "best_step": count.best_step, "patience": 4, "min_delta": 0.0,
                                       "monitor": monitor, "mode": mode, "best": best}  # fmt: skip
    assert [v["step"] for v in result["validation"]] == [v["step"] for v in want]
    assert [v["loss"] for v in result["validation"]] == pytest.approx([v["loss"] for v in want], rel=1e-9)
    # the best checkpoint by the same score in the same direction (a checkpoint every 2 steps, each scored)
    kept = {v["step"]: v for v in want if v["step"] > 0}
    top = min(kept, key=lambda s: (count_score(kept[s]), s))
    assert result["best_checkpoint"] == {"step": top, "val_loss": pytest.approx(kept[top]["loss"], rel=1e-9),
                                         "monitor": monitor, "mode": mode,
                                         "value": pytest.approx(watched(kept[top]), rel=1e-9)}  # fmt: skip
    losses, layers = uninterrupted(model, train, stop)
    assert result["loss"] == pytest.approx(losses, rel=1e-9)  # the steps before the boundary, and none after
    assert_same_parameters(tmp_path / "job" / "layers", stop, model, layers, rtol=1e-9)  # its final layers
    assert set(result["exit_codes"].values()) <= {0, -9}


def test_the_early_stopping_count_waits_for_patience_scorings_without_a_real_improvement():
    count = Patience()
    for step, loss in [(0, 3.0), (2, 2.5), (4, 2.45)]:
        count = count.after(step, loss, patience=2, min_delta=0.1)
    # 2.45 is no improvement on 2.5 by more than 0.1: one scoring waited
    assert (count.best, count.best_step, count.waited, count.stop_at, count.at) == (2.5, 2, 1, None, 4)
    assert count.after(6, 2.35, patience=2, min_delta=0.1) == Patience(at=6, best=2.35, best_step=6)  # 0.15 lower
    count = count.after(6, 2.6, patience=2, min_delta=0.1)  # a second without: the job stops at 6
    assert (count.best, count.best_step, count.waited, count.stop_at, count.at) == (2.5, 2, 2, 6, 6)
    assert count.after(6, 1.0, patience=2) is count  # a boundary scored again after a failure: counted once
    assert Patience().after(0, math.nan, patience=1).stop_at == 0  # a loss that is not a number is no improvement
    assert Patience.from_json(count.to_json()) == count and Patience.from_json(Patience().to_json()) == Patience()
    # a resumed job: the best kept beside its checkpoints before the resume point, counted from there
    assert Patience.since({2: 2.5, 4: 2.2, 6: 2.3, 8: 2.1}, before=8) == Patience(at=7, best=2.2, best_step=4)


def test_early_stopping_watches_the_monitored_score_in_its_direction_and_a_checkpoint_keeps_every_score(tmp_path):
    acc = parcae.Validation(HELD, metrics={"accuracy": lambda o, y: (o.argmax(1) == y).sum()}, patience=2,
                            monitor="accuracy", mode="max")  # fmt: skip
    scores = {"loss": 2.0, "accuracy": 0.75}
    assert acc.score(scores) == -0.75 and acc.value(acc.score(scores)) == 0.75  # lower is better, as Patience counts
    assert parcae.Validation(HELD).score(scores) == 2.0
    assert acc.problems() == []
    assert parcae.Validation(HELD, monitor="accuracy").problems() == [
        "monitor 'accuracy' is neither 'loss' nor one of the metrics []; name the score that early stopping and the "
        "best checkpoint go by"
    ]
    assert "mode 'best' must be 'min'" in parcae.Validation(HELD, mode="best").problems()[0]
    assert "monitor ['accuracy'] is neither" in parcae.Validation(HELD, monitor=["accuracy"]).problems()[0]  # type: ignore[arg-type]
    # beside a checkpoint: its held-out loss and metrics, which a resumed job's count is seeded from
    checkpoint.write_held_out(tmp_path, 4, checkpoint.HeldOut(scores, acc.watched), job="job")
    checkpoint.write_held_out(tmp_path, 6, checkpoint.HeldOut({"loss": 2.1}), job="job")  # (the loss alone)
    assert checkpoint.held_out(tmp_path, job="job") == {4: checkpoint.HeldOut(scores, Monitor("accuracy", "max")),
                                                        6: checkpoint.HeldOut({"loss": 2.1})}  # fmt: skip
    assert checkpoint.val_losses(tmp_path, job="job") == {4: 2.0, 6: 2.1}


def test_a_job_told_not_to_validate_scores_nothing(tmp_path, _no_orphans):
    """`TrainConfig(validate=False)` (a runtime profile's job, which measures training) skips the validation."""
    sys.path.insert(0, str(Path(__file__).parent))
    model = ModelConfig("_tuple_model:spec", {"held_out": 2})
    result = run_job(model, TrainConfig(global_batch=24, validate=False), 1, (1, 1), 3, [], tmp_path / "job",
                     timeout_s=60)  # fmt: skip
    assert len(result["loss"]) == 3 and "validation" not in result


def test_validation_scores_the_held_out_rows_in_eval_mode_and_changes_nothing():
    """One process: the mean loss over every held-out row with BatchNorm on its running statistics (a training-mode
    forward would use the batch's and move the statistics), the layers back in training mode after, no state
    changed."""
    sys.path.insert(0, str(Path(__file__).parent))
    import _buffered_model as buffered

    held = buffered.data(99)
    batches = [(held[0][:10], held[1][:10]), (held[0][10:], held[1][10:])]
    model = ModelConfig("_buffered_model:spec")
    ctx = build_context(model, TrainConfig(global_batch=buffered.ROWS, micro_batch=4), StageLayout.even(1, 1, model))
    for s in range(3):
        train_step(ctx, s)
    before = {name: {k: v.clone() for k, v in state.items()} for name, state in ctx.layer_states().items()}
    got = validate(ctx, parcae.Validation(lambda i: batches[i], batches=2))["loss"]
    assert ctx.module.training
    after = ctx.layer_states()
    for name, state in before.items():
        for key, value in state.items():
            assert torch.equal(after[name][key], value), f"{name} {key}"
    net = nn.Sequential(*(ctx.module.layers)).eval()
    with torch.no_grad():
        want = nn.functional.cross_entropy(net(held[0]), held[1], reduction="sum").item() / len(held[1])
    assert got == pytest.approx(want, rel=1e-6)


def test_a_bfloat16_layer_among_float64_ones_trains_and_migrates(tmp_path, _no_orphans):
    """A stage holding two dtypes reduces one buffer per dtype (one buffer made the bfloat16 gradients float64, which
    torch refused to assign), and bfloat16 parameters are checksummed by their bytes (numpy has no bfloat16)."""
    sys.path.insert(0, str(Path(__file__).parent))
    model, train, steps = ModelConfig("_tuple_model:spec", {"half": True}), TrainConfig(global_batch=24), 8
    schedule = [{"step": 2, "kind": "plan", "strategy": [2, 2]},
                {"step": 4, "kind": "plan", "strategy": [1, 3]},
                {"step": 6, "kind": "checkpoint-restart", "strategy": [3, 1]}]  # fmt: skip
    result = run_job(model, train, 4, (1, 2), steps, schedule, tmp_path / "job", checkpoint_every=2, timeout_s=80)
    assert [r["kind"] for r in result["reconfigurations"]] == ["inter-stage", "pipeline", "checkpoint-restart"]
    assert len(result["final_checksum"]) == 64
    losses, layers = uninterrupted(model, train, steps)
    # bfloat16 sums in another order under another D: close to one process, not equal
    assert result["loss"] == pytest.approx(losses, rel=1e-2)
    assert {n: {k: v.dtype for k, v in st.items() if k.startswith("param/")} for n, st in layers.items()}[
        "block.1"] == {"param/lin.weight": torch.bfloat16, "param/lin.bias": torch.bfloat16}  # fmt: skip


# ------------------------------------------------------------------------------------------------ the contract


def test_the_contract_is_parcaes_face_and_the_gpts_are_specs_of_it():
    assert parcae.TrainSpec is TrainSpec and parcae.Layer is Layer and parcae.StepSampler is StepSampler
    spec = load_spec(ModelConfig("tiny-gpt"), TrainConfig(global_batch=8))
    assert isinstance(spec, TrainSpec) and spec.names == ["embed", "block.0", "block.1", "block.2", "block.3", "head"]
    assert check_spec(spec, "tiny-gpt", stages=6).global_batch == 8


def test_check_job_takes_the_global_batch_from_the_spec_unless_one_is_given(tmp_path):
    config = JobConfig(out_dir=str(tmp_path), model=ModelConfig(DIGITS, args={"batch_size": 20}))
    assert check_job(config, batch_given=False).train.global_batch == 20
    with pytest.raises(SpecError, match=r"batch\(\) returns 20 rows but train.global_batch is 16; set --global-batch"):
        check_job(config)


def test_model_names_and_args_are_checked_as_config():
    assert ModelConfig("mypkg.train:spec").args == {}
    with pytest.raises(UnknownModelError, match=r"unknown model 'gpt-9'.*or give module:function"):
        ModelConfig("gpt-9")
    with pytest.raises(ValueError, match=r"model.args: must be plain JSON data"):
        ModelConfig("mypkg.train:spec", args={"f": object()})
    assert ModelConfig("tiny-gpt") == ModelConfig("tiny-gpt", args={"n_layer": 4})  # registered args are defaults
    assert hash(ModelConfig("tiny-gpt")) == hash(ModelConfig("tiny-gpt", args={"n_embd": 64}))


def _spec(**change) -> TrainSpec:
    fields = {
        "layers": [Layer("a", lambda: nn.Linear(4, 4)), Layer("b", lambda: nn.Linear(4, 2))],
        "batch": lambda step: (torch.ones(6, 4), torch.zeros(6, dtype=torch.long)),
        "loss": lambda out, y: nn.functional.cross_entropy(out, y, reduction="sum"),
        "optimizer": lambda params: torch.optim.SGD(params, lr=0.1),
    }
    return TrainSpec(**{**fields, **change})


shared = nn.Linear(4, 4)
HELD = lambda i: (torch.ones(3, 4), torch.tensor([0, 1, 1]))  # noqa: E731  (a validation batch)
varying_rows = lambda step: (torch.ones(6 + step, 4), torch.zeros(6 + step, dtype=torch.long))  # noqa: E731


@pytest.mark.parametrize("spec, stages, match", [
    (_spec(layers=[]), 1, r"the spec has no layers; give at least one parcae.Layer"),
    (_spec(), 3, r"2 layers cannot be cut into P=3 stages; give at least 3 layers"),
    (_spec(layers=[Layer("a", lambda: nn.Linear(4, 4)), Layer("a", lambda: nn.Linear(4, 2))]), 1,
     r"two layers are named 'a'; give every layer its own name"),
    (_spec(layers=[Layer("a", lambda: nn.Linear(4, 4)), Layer("b", nn.Linear(4, 2))]), 1,
     r"layer 'b': its factory returned a Tensor|layer 'b': its factory raised"),
    (_spec(layers=[Layer("a", lambda: shared), Layer("b", lambda: nn.Linear(4, 2))]), 1,
     r"layer 'a': its factory returns the same module each call; build a new one inside the factory"),
    (_spec(layers=[Layer("a", lambda: nn.Linear(4, 4)), Layer("b", lambda: nn.Sequential(nn.Linear(4, 4), shared))]),
     1, r"layers? .*share a parameter|same module each call"),
    (_spec(layers=[Layer("a", lambda: nn.Linear(4, 3)), Layer("b", lambda: nn.Linear(4, 2))]), 1,
     r"layer 'b' cannot take the output of layer 'a' \(\(2, 3\) float32\).*make each layer accept"),
    (_spec(batch=varying_rows), 1, r"the same rows for inputs and targets at every step \(batch\(0\) inputs: 6 rows"),
    (_spec(batch=lambda s: (torch.ones(6, 4), torch.zeros(5, dtype=torch.long))), 1,
     r"batch\(0\) targets: 5 rows"),
    (_spec(batch=lambda s: torch.ones(6, 4)), 1, r"batch\(0\) must return \(inputs, targets\)"),
    (_spec(loss=lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")), 1,
     r"loss must return a floating-point scalar \(the SUM over the rows\), got \(2,\); use reduction='sum'"),
    (_spec(layers=[Layer("a b", lambda: nn.Linear(4, 4))]), 1, r"has the name 'a b'; use letters"),
    (_spec(loss=lambda out, y: nn.functional.cross_entropy(out, y)), 1,  # a mean: the result would depend on D x P
     r"the loss must be a SUM over the rows it is given .* on two rows it is [0-9.]+, on each alone [0-9.]+ and "
     r"[0-9.]+; use reduction='sum'"),
    (_spec(loss=lambda out, y: nn.functional.cross_entropy(out, y, reduction="sum") + 1.0), 1,  # once per call
     r"the loss must be a SUM over the rows"),
    (_spec(normalizer="count", loss=lambda out, y: (nn.functional.cross_entropy(out, y, reduction="sum"),
                                                     torch.tensor(1.0))), 1, r"the count must be a SUM over the rows"),
    (_spec(layers=[Layer("a", lambda: nn.LazyLinear(4)), Layer("b", lambda: nn.Linear(4, 2))]), 1,
     r"layer 'a' has lazy parameters.*give their sizes \(nn.Linear\(in, out\)\)"),
    (_spec(validation=lambda i: (torch.ones(3, 4), torch.zeros(3, dtype=torch.long))), 1,
     r"validation is a function; give a parcae.Validation\(batch=..., batches=..., every=...\)"),
    (_spec(validation=parcae.Validation(lambda i: None, every=0)), 1, r"validation: every 0 must be an integer >= 1"),
    (_spec(validation=parcae.Validation(lambda i: (torch.ones(3, 4), torch.zeros(2, dtype=torch.long)))), 1,
     r"validation.batch\(0\) has 3 rows of inputs and 2 of targets; give both the same rows"),
    (_spec(validation=parcae.Validation(lambda i: (torch.ones(0, 4), torch.zeros(0, dtype=torch.long)))), 1,
     r"validation.batch\(0\) has no rows; give every validation batch at least one"),
    (_spec(validation=parcae.Validation(lambda i: [][i], batches=2)), 1,
     r"validation.batch\(0\) raised IndexError: .*fix the validation.batch function"),
    (_spec(validation=parcae.Validation(lambda i: (torch.ones(3, 5), torch.zeros(3, dtype=torch.long)))), 1,
     r"layer 'a' cannot take the output of validation.batch\(0\)'s inputs \(\(2, 5\) float32\)"),
    (_spec(validation=parcae.Validation(HELD, metrics={"loss": lambda o, y: 0.0})), 1,
     r"validation: metric name 'loss' must be letters, digits and '_' \(not 'loss', the loss's own\)"),
    (_spec(validation=parcae.Validation(HELD, metrics={"hit rate": lambda o, y: 0.0})), 1, r"metric name 'hit rate'"),
    (_spec(validation=parcae.Validation(HELD, metrics={"acc": 0.5})), 1, r"metric 'acc' is a float, not callable"),
    (_spec(validation=parcae.Validation(HELD, patience=0)), 1, r"validation: patience 0 must be an integer >= 1 .*or "
     r"None to train every step"),
    (_spec(validation=parcae.Validation(HELD, patience=2, min_delta=-0.1)), 1,
     r"validation: min_delta -0.1 must be a finite number >= 0"),
    (_spec(validation=parcae.Validation(HELD, metrics={"acc": lambda o, y: (o.argmax(1) == y).float().mean()})), 1,
     r"validation metric 'acc' must be a SUM over the rows .*: on two rows it is 0\.5, on each alone 0 and 1; "
     r"return \.sum\(\), not \.mean\(\)"),
    (_spec(validation=parcae.Validation(HELD, metrics={"acc": lambda o, y: o.argmax(1) == y})), 1,
     r"validation metric 'acc' returned a tensor of shape \(2,\); return one number: its sum over the rows"),
    (_spec(validation=parcae.Validation(HELD, metrics={"acc": lambda o, y: o.nope})), 1,
     r"validation metric 'acc' raised AttributeError: .*make it a function of \(outputs, targets\)"),
])  # fmt: skip
def test_a_bad_spec_is_one_message_naming_the_layer_and_the_fix(spec, stages, match):
    with pytest.raises(SpecError, match=match):
        check_spec(spec, "model 'mine'", stages=stages)


def test_the_sum_check_of_a_large_output_is_skipped_with_a_warning(monkeypatch, caplog):
    from trainer.runtime import trainspec

    mean = _spec(loss=lambda out, y: nn.functional.cross_entropy(out, y))
    monkeypatch.setattr(trainspec, "SUM_CHECK_MAX_BYTES", 16)  # two rows of two float32 outputs: 16 bytes, checked
    with pytest.raises(SpecError, match="must be a SUM"):
        check_spec(mean, "model 'mine'")
    monkeypatch.setattr(trainspec, "SUM_CHECK_MAX_BYTES", 15)
    with caplog.at_level("WARNING", logger="trainer.runtime.trainspec"):
        assert check_spec(mean, "model 'mine'").global_batch == 6
    assert "model 'mine': the check that the loss is a sum over rows is skipped" in caplog.text
    # the metrics' check likewise (made up on two rows of validation.batch(0) too)
    mean_metric = _spec(validation=parcae.Validation(HELD, metrics={"acc": lambda o, y: (o.argmax(1) == y).float()
                                                                    .mean()}))  # fmt: skip
    with caplog.at_level("WARNING", logger="trainer.runtime.trainspec"):
        check_spec(mean_metric, "model 'mine'", stages=1)
    assert "model 'mine': the check of the validation metrics is skipped" in caplog.text
    monkeypatch.setattr(trainspec, "SUM_CHECK_MAX_BYTES", 16)
    with pytest.raises(SpecError, match="validation metric 'acc' must be a SUM"):
        check_spec(mean_metric, "model 'mine'", stages=1)


def test_a_tied_weight_between_two_factories_is_refused():
    emb = nn.Embedding(10, 4)

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = emb.weight  # tied to the embedding

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h @ self.weight.T

    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = emb

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.emb(x)

    spec = _spec(layers=[Layer("embed", Embed), Layer("head", Head)],
                 batch=lambda s: (torch.zeros(6, dtype=torch.long), torch.zeros(6, dtype=torch.long)))  # fmt: skip
    with pytest.raises(SpecError, match=r"layers 'embed' and 'head' share a parameter \(tied weights\); untie them"):
        check_spec(spec, "model 'mine'")


@pytest.mark.parametrize("name, match", [
    ("no_such_module_xyz:spec", r"cannot import module 'no_such_module_xyz'.*PYTHONPATH"),
    ("json:no_such_function", r"module 'json' has no 'no_such_function'; define it"),
    ("json:__doc__", r"is a str, not a function"),
    ("json:dumps", r"json:dumps returned a str, not a parcae.TrainSpec|calling json:dumps"),
    ("missing/file.py:spec", r"no such file 'missing/file.py'"),
])  # fmt: skip
def test_a_spec_that_does_not_load_names_the_fix(name, match):
    with pytest.raises(SpecError, match=match):
        load_spec(ModelConfig(name))


def test_two_threads_loading_one_spec_file_both_get_its_spec(tmp_path):
    """Two jobs of one process load the same spec file at once (two fleet jobs in threads): the second waits for the
    file to have run, where it was handed the half-run module and failed with "has no 'spec'"."""
    import threading

    from trainer import load_spec

    slow = tmp_path / "slow_spec.py"
    slow.write_text("import time\ntime.sleep(0.5)  # a spec file that takes its time to import (torch, data)\n"
                    "from _paced import spec\n")  # fmt: skip
    model = ModelConfig(f"{slow}:spec", {"pace_s": 0.0})
    got: dict[int, object] = {}

    def load(i: int) -> None:
        try:
            got[i] = load_spec(model, TrainConfig(global_batch=8))
        except Exception as exc:  # noqa: BLE001 - the assertion below reports it
            got[i] = exc

    threads = [threading.Thread(target=load, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.1)  # the second starts while the first runs the file
    for t in threads:
        t.join(60)
    assert all(not isinstance(v, Exception) for v in got.values()) and len(got) == 2, got


def test_a_spec_s_package_is_found_in_the_folder_the_job_runs_in(tmp_path, monkeypatch, _no_orphans):
    pkg = tmp_path / "mypkg_in_cwd"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("import torch.nn as nn\n\ndef block():\n    return nn.Linear(4, 4)\n")
    (pkg / "train.py").write_text(
        "import torch, torch.nn as nn\nimport parcae\nfrom .layers import block  # a relative import: a package\n\n"
        "def spec():\n    return parcae.TrainSpec(layers=[parcae.Layer('a', block), parcae.Layer('b', block)],\n"
        "        batch=lambda step: (torch.ones(4, 4) * step, torch.zeros(4, 4)),\n"
        "        loss=lambda out, y: ((out - y) ** 2).sum(),\n"
        "        optimizer=lambda params: torch.optim.SGD(params, lr=0.01))\n")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    # the CLI's process and its workers (other processes) import it from there, as `python -m` would
    res = CliRunner().invoke(app, ["train", "--model", "mypkg_in_cwd.train:spec", "--workers", "2", "--steps", "3",
                                   "--out-dir", str(tmp_path / "job")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "mypkg_in_cwd.train:spec: 3 steps" in res.output


def test_bad_model_args_name_the_option():
    with pytest.raises(SpecError, match=r"calling .*digits_cnn.py:spec\(\*\*\{'width': 3\}\) failed.*--model-args"):
        load_spec(ModelConfig(DIGITS, args={"width": 3}))


def test_parcae_train_answers_a_bad_spec_before_starting(tmp_path):
    res = CliRunner().invoke(app, ["train", "--model", "no_such_module_xyz:spec", "--out-dir", str(tmp_path / "r")])
    assert res.exit_code == 2 and "cannot import module 'no_such_module_xyz'" in res.output
    res = CliRunner().invoke(app, ["train", "--model", DIGITS, "--model-args", "[1]", "--out-dir", str(tmp_path)])
    assert res.exit_code == 2 and "--model-args: expected a JSON object" in res.output


def test_a_checkpoint_of_another_spec_is_refused(tmp_path):
    src = tmp_path / "mine.py"
    write = lambda width: src.write_text(  # noqa: E731
        "import torch, torch.nn as nn\nimport parcae\n"
        f"def spec():\n    return parcae.TrainSpec(layers=[parcae.Layer('a', lambda: nn.Linear(4, {width}))],\n"
        f"        batch=lambda s: (torch.ones(2, 4), torch.ones(2, {width})),\n"
        "        loss=lambda o, y: ((o - y) ** 2).sum(), optimizer=lambda p: torch.optim.SGD(p, lr=0.1))\n"
    )
    write(3)
    model = ModelConfig(f"{src}:spec")
    ctx = build_context(model, TrainConfig(global_batch=2), StageLayout.even(1, 1, model))
    path = checkpoint.save(tmp_path / "ck.pt", ctx.layer_states(), step=1, config=model, job="job")
    write(5)  # the spec's code changed under the same name: its layers have other shapes
    from trainer.runtime import model as runtime_model
    from trainer.runtime import trainspec

    for name in [n for n in sys.modules if n.startswith("parcae_spec_")]:
        del sys.modules[name]
    trainspec.clear_cache()
    runtime_model.model_fingerprint.cache_clear()
    with pytest.raises(checkpoint.ForeignCheckpointError, match=r"checkpoint of another spec.*the spec's code changed"):
        checkpoint.load(path, config=model, job="job")


# ------------------------------------------------------------------------------------------------ data helpers


def test_export_names_what_is_wrong(tmp_path):
    res = CliRunner().invoke(app, ["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "m.pt")])
    assert res.exit_code == 2 and "no such folder" in res.output
    res = CliRunner().invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "m.bin")])
    assert res.exit_code == 2 and "must end in .pt or .safetensors" in res.output
    res = CliRunner().invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "m.pt")])
    assert res.exit_code == 2 and "no intact checkpoint to export" in res.output


def test_step_sampler_uses_every_item_once_per_epoch_whatever_the_split():
    data = torch.utils.data.TensorDataset(torch.arange(10.0), torch.arange(10))
    sampler = StepSampler(data, batch_size=4, seed=3)
    rows = [i for step in range(5) for i in sampler.indices(step)]  # 20 rows: two epochs of 10
    assert sorted(rows[:10]) == sorted(rows[10:]) == list(range(10)) and rows[:10] != rows[10:]
    x, y = sampler(1)
    assert x.shape == (4,) and torch.equal(x.long(), y) and sampler.indices(1) == StepSampler(data, 4, 3).indices(1)
    assert StepSampler(data, 4, seed=4).indices(0) != sampler.indices(0)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        StepSampler(data, 0)


def test_a_replica_loads_only_its_rows_where_the_batch_function_can():
    """`StepSampler.rows` loads a slice of a step's batch alone (`RowBatch`), equal to that slice of the whole
    batch; a plain batch function is called whole and cut."""
    from trainer.runtime.data import RowBatch, batch_rows, replica_rows

    class Counted(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.loads = 0

        def __len__(self) -> int:
            return 10

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            self.loads += 1  # (an image decoded, a record read)
            return torch.full((3,), float(i)), torch.tensor(i)

    data = Counted()
    sampler = StepSampler(data, batch_size=6, seed=1)
    assert isinstance(sampler, RowBatch) and not isinstance(lambda step: (None, None), RowBatch)
    for step in range(3):
        whole = sampler(step)
        for replica in range(3):
            data.loads = 0
            part = batch_rows(sampler, step, replica_rows(6, replica, 3))
            assert data.loads == 2  # its two rows, not the six of the global batch
            assert all(torch.equal(a, b[2 * replica : 2 * replica + 2]) for a, b in zip(part, whole, strict=True))
    plain = lambda step: (torch.arange(6.0) + step, torch.arange(6))  # noqa: E731
    x, y = batch_rows(plain, 2, range(4, 6))
    assert torch.equal(x, torch.tensor([6.0, 7.0])) and torch.equal(y, torch.tensor([4, 5]))
    with pytest.raises(ValueError, match=r"rows \[4, 7\) are not within a batch of 6"):
        sampler.rows(0, 4, 7)
    short = lambda step: (torch.arange(5.0), torch.arange(6))  # noqa: E731  (a step's inputs one row short)
    with pytest.raises(SpecError, match=r"^batch\(3\) gave 1 and 2 rows where rows \[4, 6\) of its batch were "
                       r"wanted: every step's batch holds the global batch's rows \(train.global_batch\), inputs and "
                       r"targets alike$"):  # fmt: skip
        batch_rows(short, 3, range(4, 6))


_LOGGED_SPEC = """
import os
import torch, torch.nn as nn
import parcae

def spec(log):
    X = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    Y = X.sum(1, keepdim=True)

    def batch(step):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {step}\\n")
        rows = torch.arange(step * 8, step * 8 + 8) % 64
        return X[rows], Y[rows]

    class HeldOut(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            with open(log, "a") as f:
                f.write(f"{os.getpid()} held-out\\n")
            return -X[i], -Y[i]

    return parcae.TrainSpec(
        validation=parcae.Validation.over(HeldOut(), batch_size=8, every=2),
        layers=[*(parcae.Layer(f"block.{i}", lambda: nn.Sequential(nn.Linear(4, 4), nn.Tanh())) for i in range(3)),
                parcae.Layer("head", lambda: nn.Linear(4, 1))],
        batch=batch,
        loss=lambda out, y: nn.functional.mse_loss(out, y, reduction="sum"),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
    )
"""


def test_a_middle_stage_loads_no_data(tmp_path, _no_orphans):
    """On three stages the first loads a step's inputs and the last its targets; the middle one loads nothing (its
    inputs' shapes come in headers, as Megatron-LM's and DeepSpeed's middle stages load no data), nor held-out
    batches whose sizes are known; the job trains and scores as one process does."""
    log, file = tmp_path / "loads", tmp_path / "logged.py"
    file.write_text(_LOGGED_SPEC)
    model, train, steps = ModelConfig(f"{file}:spec", args={"log": str(log)}), TrainConfig(global_batch=8), 4
    result = run_job(model, train, 3, (1, 3), steps, [], tmp_path / "job", timeout_s=60)
    ctx = build_context(model, train, StageLayout.even(1, 1, model))
    assert result["loss"] == pytest.approx([train_step(ctx, step) for step in range(steps)], rel=1e-5)
    assert [v["loss"] for v in result["validation"]] == pytest.approx(
        [v["loss"] for v in validated(model, train, steps)], rel=1e-5)  # fmt: skip
    loads = [line.split() for line in log.read_text().splitlines()]
    mine = str(os.getpid())  # (the spec's checks and the one-process run)
    workers = {pid for pid, what in loads if pid != mine and what not in ("0", "1", "held-out")}
    assert len(workers) == 2, loads  # of the three stages' processes
    assert {pid for pid, what in loads if pid != mine and what == "held-out"} == workers


def test_the_next_step_s_rows_are_loaded_while_this_one_trains_and_never_twice_at_once():
    """`Prefetcher`: a step's rows come ahead (loaded in a helper thread during the step before), equal to loading
    them then; other rows (a migration changed the replica's share) are loaded now, after the unwanted load ahead
    ended; the batch function's error is raised where its rows were wanted; nothing is loaded past the last step."""
    import threading

    from trainer.runtime.data import Prefetcher, batch_rows

    calls: list[tuple[int, str]] = []
    busy = threading.Lock()

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert busy.acquire(blocking=False), "the batch function was called twice at once"
        try:
            time.sleep(0.02)  # (decoding)
            calls.append((step, threading.current_thread().name))
            if step == 4:
                raise OSError("image 17 is truncated")
            return torch.arange(6.0) + step, torch.arange(6) * step
        finally:
            busy.release()

    rows = Prefetcher(batch, steps=6)
    try:
        for step, share in [(0, range(0, 3)), (1, range(0, 3)), (2, range(3, 6)), (3, range(3, 6))]:
            got = rows.load(step, share)
            want = batch_rows(lambda s: (torch.arange(6.0) + s, torch.arange(6) * s), step, share)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert rows.hits == 2  # steps 1 and 3 came ahead; step 2 wanted other rows than the ones loaded ahead
        ahead = [step for step, thread in calls if thread.startswith("parcae-prefetch")]
        now = [step for step, thread in calls if not thread.startswith("parcae-prefetch")]
        assert now == [0, 2] and ahead == [1, 2, 3, 4][: len(ahead)] and ahead[:3] == [1, 2, 3]
        # loaded ahead, raised where it is wanted: one line naming the function, the step and the user's line
        with pytest.raises(SpecError, match=r"^batch\(4\) raised OSError: image 17 is truncated at .*test_user_model"
                           r"\.py:\d+ in batch; fix the batch function$") as raised:  # fmt: skip
            rows.load(4, range(3, 6))
        assert isinstance(raised.value.__cause__, OSError)
        rows.load(5, range(3, 6))  # the last step: nothing after it is loaded
        time.sleep(0.05)
        assert max(step for step, _ in calls) == 5
    finally:
        rows.close()


# ------------------------------------------------------------------------------------------------ 1F1B


@pytest.mark.parametrize("P, M", [(1, 3), (3, 2), (3, 5), (4, 8)])
def test_1f1b_runs_each_micro_batch_once_and_keeps_fewer_activations(P, M):
    from trainer.runtime.pipeline import schedule_order

    for stage in range(P):
        for schedule in ("gpipe", "1f1b"):
            order = schedule_order(schedule, stage, P, M)
            assert sorted(order) == sorted([("F", m) for m in range(M)] + [("B", m) for m in range(M)])
            assert all(order.index(("F", m)) < order.index(("B", m)) for m in range(M))
        alive = peak = 0
        for phase, _ in schedule_order("1f1b", stage, P, M):
            alive += 1 if phase == "F" else -1
            peak = max(peak, alive)
        assert peak == min(P - stage, M)  # GPipe's peak is M


def test_a_1f1b_job_trains_the_same_run_as_gpipe_across_migrations(tmp_path, _no_orphans):
    model = ModelConfig(DIGITS, args={"dtype": "float64", "batch_size": 24})
    train, steps = TrainConfig(global_batch=24, micro_batch=4, schedule="1f1b"), 6
    schedule = [{"step": 2, "kind": "plan", "strategy": [1, 4]},
                {"step": 4, "kind": "preempt", "instances": [3], "notice": True},
                {"step": 4, "kind": "plan", "strategy": [1, 3]}]  # fmt: skip
    result = run_job(model, train, 4, (2, 2), steps, schedule, tmp_path / "job", timeout_s=80)
    assert [r["kind"] for r in result["reconfigurations"]] == ["pipeline", "pipeline"]
    losses, layers = uninterrupted(model, TrainConfig(global_batch=24, micro_batch=4), steps)  # GPipe, one process
    assert result["loss"] == pytest.approx(losses, rel=1e-6)
    assert_same_parameters(result["layers"], steps, model, layers, rtol=1e-6)


def test_an_installed_package_registers_a_model_name_by_entry_point(tmp_path, monkeypatch):
    """A package that declares `[project.entry-points."parcae.models"] digits = "..."` makes `--model digits` work:
    here a dist-info folder on sys.path stands for the installed package."""
    dist = tmp_path / "mymodels-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mymodels\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[parcae.models]\ndigits-cnn = {DIGITS}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = load_spec(ModelConfig("digits-cnn", args={"batch_size": 8}))
    assert spec.names == ["conv1", "conv2", "hidden", "classes"]
    with pytest.raises(UnknownModelError, match=r"known models: .*digits-cnn"):
        ModelConfig("digits-cnm")


@pytest.mark.parametrize("example, args, rows", [
    # torch's fused AdamW; the held-out digits scored at 0, 2, 4, 6 and 7
    ("digits_cnn.py", {"dtype": "float64", "batch_size": 12, "fused": True, "validate_every": 2}, 12),
    ("token_lm.py", {"dtype": "float64", "batch_size": 12, "tokens": str(ROOT / "README.md"), "validate_every": 2}, 12),
    pytest.param("llama.py", {"dtype": "float64", "layers": 3, "block_size": 16}, 8, marks=pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None, reason="parcae[hf] (transformers) is not installed")),
])  # fmt: skip
def test_every_example_migrates_and_checkpoint_restarts_to_the_same_run(tmp_path, _no_orphans, example, args, rows):
    model, train, steps = (
        ModelConfig(f"{ROOT / 'examples' / example}:spec", args=args),
        TrainConfig(global_batch=rows),
        7,
    )
    schedule = [{"step": 2, "kind": "plan", "strategy": [1, 3]},
                {"step": 3, "kind": "preempt", "instances": [0], "notice": True},
                {"step": 4, "kind": "plan", "strategy": [1, 2]},
                {"step": 5, "kind": "checkpoint-restart", "strategy": [2, 1]}]  # fmt: skip
    result = run_job(model, train, 4, (2, 2), steps, schedule, tmp_path / "job", timeout_s=80)
    kinds = [r["kind"] for r in result["reconfigurations"]]
    assert kinds[0] == "pipeline" and kinds[-1] == "checkpoint-restart", kinds
    losses, layers = uninterrupted(model, train, steps)
    assert result["loss"] == pytest.approx(losses, rel=1e-6)
    assert_same_parameters(result["layers"], steps, model, layers, rtol=1e-6)
    if args.get("validate_every"):  # prepared migrations, a preemption and a restart: the same held-out losses
        want = validated(model, train, steps)
        assert [v["step"] for v in result["validation"]] == [0, 2, 4, 6, 7] == [v["step"] for v in want]
        assert [v["loss"] for v in result["validation"]] == pytest.approx([v["loss"] for v in want], rel=1e-6)
        assert [v.get("metrics") for v in result["validation"]] == [pytest.approx(v.get("metrics"), rel=1e-9)
                                                                      for v in want]  # fmt: skip


def test_dropout_is_refused_unless_the_spec_accepts_inexact_runs():
    layers = [Layer("a", lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))), Layer("b", lambda: nn.Linear(4, 2))]
    with pytest.raises(SpecError, match=r"layer 'a' has dropout p=0.1 \(Dropout '1'\).*TrainSpec\(exact=False\)"):
        check_spec(_spec(layers=layers), "model 'mine'")
    attention = [Layer("a", lambda: nn.TransformerEncoderLayer(4, 2, 8, dropout=0.2, batch_first=True)),
                 Layer("b", lambda: nn.Linear(4, 2))]  # fmt: skip
    with pytest.raises(SpecError, match=r"layer 'a' has dropout p=0.2"):
        check_spec(_spec(layers=attention), "model 'mine'")
    assert check_spec(_spec(layers=layers, exact=False), "model 'mine'").global_batch == 6


def test_a_loss_normalised_by_a_count_is_the_global_token_mean_whatever_the_split(tmp_path, _no_orphans):
    sys.path.insert(0, str(Path(__file__).parent))  # where `_padded_model` is, for this process and its workers
    import _padded_model as padded

    model, train, steps = ModelConfig("_padded_model:spec"), TrainConfig(global_batch=padded.ROWS, micro_batch=2), 6
    losses, layers = uninterrupted(model, train, steps)
    # step 0, computed by hand on one module: the mean over the real tokens of the whole global batch
    net = nn.Sequential(*(layer for layer in build_context(model, train, StageLayout.even(1, 1, model)).module.layers))
    x, y = padded.data(0)
    total, n = padded.loss(net(x), y)
    assert losses[0] == pytest.approx(float(total.detach() / n), rel=1e-12)
    schedule = [{"step": 2, "kind": "plan", "strategy": [3, 1]},  # 12 rows over 3 replicas: uneven token counts
                {"step": 4, "kind": "plan", "strategy": [1, 3]}]  # fmt: skip
    result = run_job(model, train, 3, (1, 3), steps, schedule, tmp_path / "job", timeout_s=80)
    assert result["loss"] == pytest.approx(losses, rel=1e-9)
    assert_same_parameters(result["layers"], steps, model, layers, rtol=1e-9)


def test_a_prepared_hand_off_sends_the_state_a_step_early_and_trains_the_same_run_bit_for_bit(tmp_path, _no_orphans):
    """Prepared re-cuts (published a step ahead): each source sends its layers' state as of the boundary before
    during that step, and at the boundary only the step's gradients, which the receivers apply themselves; the
    standby that joins has built its layers while it stood by, the survivors theirs beside their training. D = 1
    throughout: the same parameters, bit for bit."""
    sys.path.insert(0, str(Path(__file__).parent))  # where `_paced_model` is, for this process and its workers
    from trainer.runtime.pipeline import parameters_checksum

    model, train, steps = ModelConfig("_paced_model:spec"), TrainConfig(global_batch=8, micro_batch=4), 10
    losses, layers = uninterrupted(model, train, steps)
    # worker 2 joins, the layers are re-cut over three; and back, one of them leaves
    schedule = [{"step": 4, "kind": "plan", "strategy": [1, 3]}, {"step": 7, "kind": "plan", "strategy": [1, 2]}]
    result = run_job(model, train, 3, (1, 2), steps, schedule, tmp_path / "job", timeout_s=80)
    reconf = result["reconfigurations"]
    assert [(r["step"], r["kind"], r["prepared"]) for r in reconf] == [(4, "pipeline", True), (7, "pipeline", True)]
    # every transferred layer went ahead (a step of ~0.1 s leaves time to see the preparation), the joiner built its
    # layers ahead, and nothing else was built
    assert [r["layers_caught_up"] for r in reconf] == [r["transfers"] for r in reconf]
    assert [sum(r["layers_built"].values()) for r in reconf] == [r["transfers"] for r in reconf]
    # the joiner built its layers while it stood by, the survivors of the second re-cut beside their last step (hollow:
    # the state fills them); none was built at a boundary
    assert [r["layers_built"]["built"] for r in reconf] == [0, 0]
    assert reconf[1]["layers_built"]["built_ahead"] > 0 and not any(r["build_ahead_errors"] for r in reconf)
    # and the state that came ahead was installed before the boundary too, and the step's gradients came as soon as
    # the sources had reduced them: the receivers applied the step before the boundary as well (there, only a go)
    assert [r["layers_installed_ahead"] for r in reconf] == [r["transfers"] for r in reconf]
    assert [r["layers_grads_ahead"] for r in reconf] == [r["transfers"] for r in reconf]
    assert result["loss"] == losses
    assert result["final_checksum"] == parameters_checksum(layers, list(layers))


def test_a_model_s_buffers_move_with_its_layers_and_are_exported(tmp_path, _no_orphans):
    """BatchNorm's running statistics change at every training forward. Re-cuts (D = 1) move them with the layers'
    parameters, so the final layers hold the uninterrupted run's statistics, bit for bit — not those of a layer
    rebuilt from its seed — and `parcae export` writes them where the module's state_dict has them."""
    sys.path.insert(0, str(Path(__file__).parent))  # where `_buffered_model` is, for this process and its workers
    import _buffered_model as buffered

    model, train, steps = ModelConfig("_buffered_model:spec"), TrainConfig(global_batch=buffered.ROWS, micro_batch=4), 8
    losses, layers = uninterrupted(model, train, steps)
    schedule = [{"step": 3, "kind": "plan", "strategy": [1, 3]}, {"step": 4, "kind": "plan", "strategy": [1, 2]},
                {"step": 6, "kind": "plan", "strategy": [1, 3]}]  # fmt: skip
    result = run_job(model, train, 3, (1, 2), steps, schedule, tmp_path / "job", timeout_s=80)
    assert [r["kind"] for r in result["reconfigurations"]] == ["pipeline"] * 3
    assert all(r["transfers"] > 0 for r in result["reconfigurations"])
    assert result["loss"] == losses
    final = checkpoint.load(checkpoint.find_shards(result["layers"], steps), config=model, job="job")
    assert final.layers.keys() == layers.keys()
    for name, want in layers.items():
        assert final.layers[name].keys() == want.keys(), name
        assert all(torch.equal(final.layers[name][k], want[k]) for k in want), name
    assert layers["norm"]["buffer/norm.num_batches_tracked"] == steps * buffered.ROWS // train.micro_batch
    res = CliRunner().invoke(app, ["export", str(result["layers"]), "--out", str(tmp_path / "model.pt")])
    assert res.exit_code == 0, res.output
    exported = torch.load(tmp_path / "model.pt", weights_only=True)
    norm = buffered.Norm()
    norm.load_state_dict({k.removeprefix("norm."): v for k, v in exported.items() if k.startswith("norm.")})
    assert torch.equal(norm.norm.running_var, layers["norm"]["buffer/norm.running_var"])


def test_activations_whose_shape_depends_on_the_data_travel_with_a_header(tmp_path, _no_orphans):
    sys.path.insert(0, str(Path(__file__).parent))  # where `_ragged_model` is, for this process and its workers
    from trainer.runtime.pipeline import _boundary, _from_header, _header, _signature

    model, train, steps = ModelConfig("_ragged_model:spec"), TrainConfig(global_batch=12, micro_batch=3), 6
    x = torch.zeros(3, 10, dtype=torch.long)
    assert _boundary(model, train, 1, _signature(x), False) is None  # nonzero has no meta kernel: a header
    act = (torch.zeros(3, 7, 8, dtype=torch.float64), torch.zeros(3, 7, dtype=torch.long))
    assert _from_header(_header(act)) == (_signature(act), True)
    losses, layers = uninterrupted(model, train, steps)
    schedule = [{"step": 2, "kind": "plan", "strategy": [1, 3]}, {"step": 4, "kind": "plan", "strategy": [2, 1]}]
    result = run_job(model, train, 3, (1, 2), steps, schedule, tmp_path / "job", timeout_s=80)
    assert result["loss"] == pytest.approx(losses, rel=1e-9)
    assert_same_parameters(result["layers"], steps, model, layers, rtol=1e-9)


def test_a_spec_function_that_fails_on_its_data_is_one_message():
    lm = f"{ROOT / 'examples' / 'token_lm.py'}:spec"
    with pytest.raises(
        SpecError,
        match=r"token_lm.py:spec\(\*\*\{'tokens': 'no/such/tokens.bin'\}\) raised "
        r"FileNotFoundError",
    ):
        load_spec(ModelConfig(lm, args={"tokens": "no/such/tokens.bin"}))


def test_cost_hints_decide_the_stage_cut_when_every_layer_has_one():
    sys.path.insert(0, str(Path(__file__).parent))
    from trainer.runtime.migration import first_epoch, layer_sizes

    plain = layer_sizes(ModelConfig("_tuple_model:spec"))
    assert plain.cut == tuple(float(p) for p in plain.params)  # no hints: parameter counts
    hinted = layer_sizes(ModelConfig("_tuple_model:spec", args={"costs": [1, 1, 1, 1, 9]}))
    assert hinted.cut == (1.0, 1.0, 1.0, 1.0, 9.0)
    assert first_epoch(1, 2, [0, 1], hinted.cut).bounds == (0, 4, 5)  # the costly head alone on its stage
    assert first_epoch(1, 2, [0, 1], plain.cut).bounds != (0, 4, 5)
    with pytest.raises(SpecError, match=r"layers \['b'\] have no cost while others do; give every layer a cost"):
        check_spec(_spec(layers=[Layer("a", lambda: nn.Linear(4, 4), 2.0), Layer("b", lambda: nn.Linear(4, 2))]),
                   "model 'mine'")  # fmt: skip


def test_a_device_this_machine_lacks_is_refused_before_the_job_starts(tmp_path, monkeypatch):
    from trainer.runtime.devices import resolve_device

    assert resolve_device("cpu", 3).type == "cpu"
    with pytest.raises(ValueError, match=r"train.device: must be auto, cpu or cuda, got 'gpu'"):
        TrainConfig(device="gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", 0).type == "cpu"  # auto: CUDA where it exists, else the CPU
    res = CliRunner().invoke(app, ["train", "--device", "cuda", "--workers", "1", "--steps", "2", "--out-dir",
                                   str(tmp_path / "run")])  # fmt: skip
    assert res.exit_code == 2 and "--device: cuda, but this machine has no CUDA device" in res.output, res.output


def test_bf16_autocast_trains_across_stages_close_to_one_process(tmp_path, _no_orphans):
    """Mixed precision: the forward and the loss under torch.autocast(bfloat16); parameters, gradients and AdamW
    stay float32, and activations cross stages in bfloat16 (their dtypes in a header: meta tensors do not autocast).
    Not bit-exact (bfloat16 kernels may round differently per micro-batch size): within 2 % of one process."""
    model, train, steps = ModelConfig(DIGITS, args={"autocast": "bfloat16"}), TrainConfig(global_batch=32), 6
    schedule = [{"step": 2, "kind": "plan", "strategy": [1, 3]}, {"step": 4, "kind": "plan", "strategy": [2, 2]}]
    result = run_job(model, train, 4, (1, 2), steps, schedule, tmp_path / "job", timeout_s=80)
    losses, _ = uninterrupted(model, train, steps)
    assert result["loss"] == pytest.approx(losses, rel=2e-2)
    fp32, _ = uninterrupted(ModelConfig(DIGITS), train, steps)
    assert result["loss"] != pytest.approx(fp32, rel=1e-7)  # autocast did change the arithmetic


def test_a_learning_rate_schedule_of_the_step_is_set_before_each_update():
    sys.path.insert(0, str(Path(__file__).parent))  # where `_tuple_model` is
    model = ModelConfig("_tuple_model:spec", args={"frozen_steps": 2})  # lr 0 for steps 0 and 1, then 0.05
    ctx = build_context(model, TrainConfig(global_batch=24), StageLayout.even(1, 1, model))
    before = [p.detach().clone() for p in ctx.module.parameters()]
    train_step(ctx, 0)
    train_step(ctx, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, ctx.module.parameters(), strict=True))  # lr 0: no change
    train_step(ctx, 2)
    assert all(g["lr"] == 0.05 for opt in ctx.optimizers.values() for g in opt.param_groups)
    assert not all(torch.equal(a, b) for a, b in zip(before, ctx.module.parameters(), strict=True))


def test_a_model_config_of_an_older_parcae_is_named_not_a_traceback():
    with pytest.raises(ValueError, match=r"model: unknown fields \['n_embd', 'n_layer'\].*start the job afresh"):
        ModelConfig.from_dict({"name": "tiny-gpt", "n_layer": 4, "n_embd": 64, "seed": 0})
