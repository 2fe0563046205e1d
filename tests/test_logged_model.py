"""The trained model as an MLflow logged model (`trainer.observe.logged_model`): a checkpoint of a spec given as a
file — its own layer classes, tuple activations — is a model that `mlflow.pytorch.load_model` loads in a fresh
interpreter where neither parcae nor that file can be imported, and that computes what the spec's layers loaded
with the checkpoint compute. Into a temporary SQLite store (``MLFLOW_TRACKING_URI``), never ``mlruns/``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import tracking

import mlflow.pytorch  # noqa: E402  (after tracking: telemetry off)
import pytest
import torch
from _mlflow import temporary_mlflow_store
from mlflow import MlflowClient  # noqa: E402

from trainer import (
    CheckpointConfig,
    JobConfig,
    ModelConfig,
    StageLayout,
    TrainConfig,
    build_context,
    checkpoint,
    export_state_dict,
    train_step,
)
from trainer.observe.logged_model import log_trained_model
from trainer.observe.tracking import MlflowJobObserver
from trainer.runtime.checkpoint_mirror import mirror_for
from trainer.runtime.export import trained_model

ROOT = Path(__file__).resolve().parents[1]
SPEC = f"{ROOT / 'tests' / '_tuple_model.py'}:spec"  # a file: imported under a name no other process has


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    yield from temporary_mlflow_store(tmp_path_factory)


def test_a_checkpoint_of_a_spec_file_is_a_model_that_loads_without_parcae_or_the_file(store, tmp_path):
    model, train = ModelConfig(SPEC, {"routed": True}), TrainConfig(global_batch=24)
    ctx = build_context(model, train, StageLayout.even(1, 1, model))
    for s in range(2):
        train_step(ctx, s)
    states = ctx.layer_states()
    checkpoint.save(checkpoint.shard_path(tmp_path / "ckpt", 2), states, step=2, config=model, job="job")
    exported = export_state_dict(tmp_path / "ckpt")
    module = trained_model(exported, train)
    assert module.names == list(states) and not module.training  # in eval() mode, as inference wants it
    for name, state in states.items():  # the checkpoint's parameters, not the factories' fresh ones
        for key in (k for k in state if k.startswith("param/")):
            assert torch.equal(module.layer(name).get_parameter(key.removeprefix("param/")), state[key])

    client = MlflowClient(tracking.tracking_uri())
    exp = client.create_experiment("logged-models")
    run = client.create_run(exp).info.run_id
    model_id = log_trained_model(client, exp, run, "model", exported, train, {"loss": 0.5, "accuracy": 0.75})
    logged = client.get_logged_model(model_id)
    assert (logged.name, logged.source_run_id, str(logged.status)) == ("model", run, "READY")
    assert logged.params == {"step": "2", "model": SPEC, "job": "job", "val_loss": "0.5", "val_accuracy": "0.75"}

    x = ctx.spec.batch(5)[0]  # rows it never trained on
    torch.save({"x": x, "y": module(x).detach()}, tmp_path / "io.pt")
    load = textwrap.dedent(f"""
        import sys
        sys.modules.update(dict.fromkeys(["parcae", "trainer", "_tuple_model"], None))  # none of them importable
        import mlflow.pytorch, torch
        io = torch.load("io.pt")
        loaded = mlflow.pytorch.load_model("models:/{model_id}")
        assert type(loaded).__name__ == "SpecModel" and torch.equal(loaded(io["x"]), io["y"]), "another output"
        print("loaded", type(loaded.layers[0]).__module__)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"MLFLOW_DISABLE_TELEMETRY": "true",
                                                                       "DO_NOT_TRACK": "true"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", load], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("loaded parcae_spec_"), done.stdout  # the spec file's class, pickled by value


def test_a_checkpoint_that_lacks_a_layer_s_parameter_is_not_a_model(tmp_path):
    model, train = ModelConfig(SPEC, {}), TrainConfig(global_batch=24)
    states = build_context(model, train, StageLayout.even(1, 1, model)).layer_states()
    checkpoint.save(checkpoint.shard_path(tmp_path, 0), states, step=0, config=model, job="job")
    exported = export_state_dict(tmp_path)
    del exported.state["head.out.bias"]
    with pytest.raises(checkpoint.CheckpointError, match=r"step 0 lacks \['head.out.bias'\]"):
        trained_model(exported, train)


def test_the_run_logs_its_final_layers_and_a_best_checkpoint_only_its_checkpoint_uri_holds(store, tmp_path):
    """The driver's observer at the job's end: "model" from the final layers on this disk, "best" from the job's
    checkpoint URI, where the instances that wrote it (sharing no disk with the driver) copied it."""
    model, train = ModelConfig(SPEC, {}), TrainConfig(global_batch=24)
    ctx = build_context(model, train, StageLayout.even(1, 1, model))
    local, layers, durable = tmp_path / "job" / "checkpoints", tmp_path / "job" / "layers", tmp_path / "durable"
    steps = {}
    for s in range(1, 5):
        train_step(ctx, s - 1)
        steps[s] = ctx.layer_states()
    checkpoint.save(checkpoint.shard_path(local, 2), steps[2], step=2, config=model, job="job")
    mirror_for(f"file://{durable}").upload_step(local, 2)
    for f in checkpoint.step_files(local, 2):  # the driver's disk never held it
        f.unlink()
    checkpoint.save(checkpoint.shard_path(layers, 4), steps[4], step=4, config=model, job="job")
    job = JobConfig(out_dir=str(tmp_path / "job"), model=model, train=train,
                    checkpoint=CheckpointConfig(uri=f"file://{durable}"))  # fmt: skip
    obs = MlflowJobObserver(experiment="a-job", flush_every_s=0.1)
    obs.on_start({"job": "job", "model": SPEC, "workers": 1, "strategy": (1, 1), "steps": 4, "global_batch": 24,
                  "checkpoint_dir": str(local), "config": job.to_dict()})  # fmt: skip
    obs.on_end(
        {
            "layers": str(layers),
            "first_step": 0,
            "loss": [1.0] * 4,
            "reconfigurations": [],
            "validation": [{"step": 2, "loss": 0.25}, {"step": 4, "loss": 0.5}],
            "best_checkpoint": {"step": 2},
        }
    )
    assert obs.closed and set(obs.models) == {"model", "best"}
    client = MlflowClient(tracking.tracking_uri())
    for name, step in (("model", 4), ("best", 2)):
        logged = client.get_logged_model(obs.models[name])
        assert (logged.params["step"], logged.params["val_loss"], logged.source_run_id) == (
            str(step), "0.5" if step == 4 else "0.25", obs.run_id)  # fmt: skip
        loaded = mlflow.pytorch.load_model(logged.artifact_location)  # (models:/ reads MLflow's global tracking URI)
        assert torch.equal(loaded.layer("head").out.weight, steps[step]["head"]["param/out.weight"])
