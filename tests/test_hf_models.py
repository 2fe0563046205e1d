"""Hugging Face decoders as training specs (parcae[hf]): a Llama-shaped network trains the same run under
migrations as one process, and local weights give exactly the transformers model's logits (Llama and GPT-2)."""

from __future__ import annotations

import pytest
import torch
from _jobs import run_job
from _trainer_fixtures import StepScales, _no_orphans, _one_thread  # noqa: F401  (fixtures)

from trainer import (
    ModelConfig,
    StageLayout,
    TrainConfig,
    build_context,
    check_spec,
    checkpoint,
    load_spec,
    train_step,
    validate,
)

transformers = pytest.importorskip("transformers")

GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 64,
        "bos_token_id": 0, "eos_token_id": 0}  # fmt: skip


def test_a_llama_shaped_spec_trains_the_same_run_under_migrations(tmp_path, _no_orphans):
    # the last 14 of the corpus' windows held out (0.1%: two batches, of 8 and 6), scored every 3 steps
    model = ModelConfig("tiny-llama", {"holdout": 0.001, "validate_every": 3})
    train, steps = TrainConfig(global_batch=8, micro_batch=2), 7
    assert check_spec(load_spec(model, train), "tiny-llama", stages=3).names[1] == "layers.0"
    schedule = [{"step": 2, "kind": "plan", "strategy": [1, 3]},
                {"step": 3, "kind": "preempt", "instances": [0], "notice": True},
                {"step": 5, "kind": "plan", "strategy": [3, 1]}]  # fmt: skip
    result = run_job(model, train, 4, (2, 2), steps, schedule, tmp_path / "job", timeout_s=120)
    assert [r["kind"] for r in result["reconfigurations"]][0] == "pipeline"
    ref = build_context(model, train, StageLayout.even(1, 1, model))
    held_out, losses, vals = ref.spec.validation, [], []
    assert held_out is not None
    for s in range(steps + 1):
        if held_out.due(s, steps):
            vals.append({"step": s, "loss": pytest.approx(validate(ref, held_out)["loss"], rel=1e-4)})
        if s < steps:
            losses.append(train_step(ref, s))
    assert result["loss"] == pytest.approx(losses, rel=1e-4)  # float32: summation orders differ with D
    assert result["validation"] == vals and [v["step"] for v in vals] == [0, 3, 6, 7]
    final = checkpoint.load(checkpoint.find_shards(result["layers"], steps), config=model, job="job")
    for name, state in ref.layer_states().items():
        for key in (k for k in state if k.startswith("param/")):
            assert torch.allclose(final.layers[name][key], state[key], rtol=1e-3, atol=1e-5), f"{name} {key}"


def test_a_llama_shaped_spec_trains_under_float16_autocast_with_its_loss_scale(tmp_path, _no_orphans):
    """As on a V100: the layers under float16 autocast, the loss scaled (the default for float16), through pipeline
    migrations; close to float32, and the scale the same at every step as one process's."""
    model, train, steps = ModelConfig("tiny-llama", {"autocast": "float16"}), TrainConfig(global_batch=8), 6
    ref = build_context(model, train, StageLayout.even(1, 1, model))
    losses, scales = [], []
    for s in range(steps):
        losses.append(train_step(ref, s))
        scales.append((ref.scaled.value, ref.scaled.skipped))
    full = build_context(ModelConfig("tiny-llama"), train, StageLayout.even(1, 1, model))
    assert losses == pytest.approx([train_step(full, s) for s in range(steps)], rel=2e-2)
    observer = StepScales()
    schedule = [{"step": 2, "kind": "plan", "strategy": [1, 3]}, {"step": 4, "kind": "plan", "strategy": [1, 2]}]
    result = run_job(model, train, 3, (1, 2), steps, schedule, tmp_path / "job", timeout_s=120, observer=observer)
    assert [r["kind"] for r in result["reconfigurations"]] == ["pipeline", "pipeline"]
    assert [observer.seen[s] for s in range(steps)] == scales
    assert result["loss"] == pytest.approx(losses, rel=1e-4)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_local_weights_give_the_transformers_models_logits(tmp_path, family):
    from trainer.examples import hf

    config = hf.TINY_LLAMA if family == "llama" else GPT2
    torch.manual_seed(0)
    cls = transformers.LlamaForCausalLM if family == "llama" else transformers.GPT2LMHeadModel
    reference = cls(hf.load_config(config)).eval()
    reference.save_pretrained(tmp_path)  # model.safetensors (GPT-2's tied head is stored once)
    spec = load_spec(ModelConfig("tiny-llama", args={"config": config, "weights": str(tmp_path)}),
                     TrainConfig(global_batch=4))  # fmt: skip
    x, _ = spec.batch(0)
    with torch.no_grad():
        want = reference(x).logits
        h = x
        for layer in spec.layers:
            h = layer.build()(h)
    assert torch.equal(h, want)


def test_a_config_parcae_cannot_cut_is_named():
    from trainer import SpecError

    with pytest.raises(SpecError, match=r"model_type 'bert' is not supported; choose one of llama, gpt2"):
        load_spec(ModelConfig("tiny-llama", args={"config": {"model_type": "bert"}}))
    with pytest.raises(SpecError, match=r"no such config.json; give a local folder or file \(no hub access\)"):
        load_spec(ModelConfig("tiny-llama", args={"config": "meta-llama/Llama-3-8B"}))
