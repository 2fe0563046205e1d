"""A warm start (`parcae.warm_start`): a spec's layers begin from another job's trained parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
from _jobs import run_job
from _trainer_fixtures import _no_orphans  # noqa: F401  (fixture)

import parcae
from trainer import ModelConfig, StageLayout, TrainConfig, build_context, export_state_dict, spec_of, train_step
from trainer.runtime.trainspec import SpecError, seeded_build

ROOT = Path(__file__).resolve().parents[1]
DIGITS = f"{ROOT / 'examples' / 'digits_cnn.py'}:spec"


def _spec(width: int = 4) -> parcae.TrainSpec:
    return parcae.TrainSpec(
        layers=[
            parcae.Layer("block.0", lambda: nn.Linear(3, width)),
            parcae.Layer("head", lambda: nn.Linear(width, 2)),
        ],  # fmt: skip
        batch=lambda step: (torch.ones(4, 3), torch.zeros(4, 2)),
        loss=lambda out, y: ((out - y) ** 2).sum(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
    )


def _seeded(spec: parcae.TrainSpec, seed: int) -> dict[str, torch.Tensor]:
    """`spec`'s layers built from `seed`, as `parcae export` keys their state."""
    return {f"{layer.name}.{k}": v for i, layer in enumerate(spec.layers)
            for k, v in seeded_build(spec, seed, i).state_dict().items()}  # fmt: skip


def _saved(tmp_path: Path, name: str, seed: int = 7, drop: str | None = None, add: str | None = None) -> Path:
    """The state dict of `_spec()`'s layers built from another seed, as `parcae export` keys it."""
    state = _seeded(_spec(), seed)
    state.pop(drop, None)
    if add:
        state[add] = torch.zeros(1)
    path = tmp_path / name
    torch.save(state, path)
    return path


def test_the_layers_begin_from_the_source_and_a_hollow_build_stays_hollow(tmp_path):
    source = torch.load(_saved(tmp_path, "init.pt"))
    spec = parcae.warm_start(_spec(), tmp_path / "init.pt")
    for i, layer in enumerate(spec.layers):
        built = seeded_build(spec, 0, i)  # whatever the seed: the source's values
        for k, v in built.state_dict().items():
            assert torch.equal(v, source[f"{layer.name}.{k}"]), (layer.name, k)
        with torch.device("meta"):
            assert all(p.is_meta for p in layer.build().parameters())  # (a hollow build: shapes only)
    fresh = seeded_build(_spec(), 0, 1)
    assert not torch.equal(fresh.weight, source["head.weight"])  # (the seeded init is another)


def test_strict_false_keeps_the_seeded_init_where_the_source_has_nothing(tmp_path):
    source = _saved(tmp_path, "part.pt", drop="head.bias", add="old_head.weight")
    spec = parcae.warm_start(_spec(), source, strict=False)
    saved, fresh = torch.load(source), seeded_build(_spec(), 0, 1)
    head = seeded_build(spec, 0, 1)
    assert torch.equal(head.weight, saved["head.weight"]) and torch.equal(head.bias, fresh.bias)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda d: _saved(d, "a.pt", drop="head.bias"),
            r"it lacks \[.head\.bias.\] of the spec.s tensors.*strict=False",
        ),
        (lambda d: _saved(d, "a.pt", add="old_head.weight"), r"\['old_head\.weight'\] belong to no layer"),
        (lambda d: d / "none.pt", r"none\.pt: No such file"),
        (lambda d: (d / "junk.pt").write_bytes(b"junk") and d / "junk.pt", r"junk\.pt: not a readable state dict"),
        (lambda d: torch.save([1, 2], d / "list.pt") or d / "list.pt", r"not a state dict of named tensors"),
        (lambda d: d, r"no intact checkpoint"),  # a folder without checkpoints
    ],
    ids=["missing", "unknown", "no-file", "not-torch", "not-a-dict", "empty-folder"],
)
def test_a_source_that_does_not_fit_the_spec_names_the_file_and_the_fix(tmp_path, make, match):
    with pytest.raises(SpecError, match=match):
        parcae.warm_start(_spec(), make(tmp_path))


def test_a_source_of_other_shapes_is_refused_even_when_not_strict(tmp_path):
    with pytest.raises(SpecError, match=r"block\.0\.weight is \(4, 3\) torch\.float32 there, the layer's is \(5, 3\)"):
        parcae.warm_start(_spec(width=5), _saved(tmp_path, "a.pt"), strict=False)


def test_a_job_warm_started_from_an_export_scores_its_source_s_model_and_migrates_like_one_process(
    tmp_path, _no_orphans
):
    """Job A trains the digits CNN; `parcae export` writes its layers; job B starts from them (`init`): B's first
    held-out scores are A's last, bit for bit, and B's losses through an inter-stage and a pipeline migration are one
    process's; A's checkpoint folder serves as the source too."""
    args = {"dtype": "float64", "validate_every": 3, "batch_size": 16, "lr": 0.05}
    a = run_job(ModelConfig(DIGITS, args=args), TrainConfig(), 1, (1, 1), 6, [], tmp_path / "a")
    init = tmp_path / "a.pt"
    torch.save(export_state_dict(tmp_path / "a" / "layers").state, init)
    model, train, steps = ModelConfig(DIGITS, args={**args, "init": str(init)}), TrainConfig(), 6
    schedule = [{"step": 2, "kind": "plan", "strategy": [2, 1]}, {"step": 4, "kind": "plan", "strategy": [1, 2]}]
    b = run_job(model, train, 2, (1, 1), steps, schedule, tmp_path / "b")
    assert [r["kind"] for r in b["reconfigurations"]] == ["inter-stage", "pipeline"]
    assert b["validation"][0] == {**a["validation"][-1], "step": 0}
    ref = build_context(model, train, StageLayout.even(1, 1, model))
    assert b["loss"] == pytest.approx([train_step(ref, s) for s in range(steps)], rel=1e-12)
    assert b["loss"][0] != pytest.approx(a["loss"][0], rel=1e-3)  # (a fresh start's first loss is A's first)
    base = spec_of(ModelConfig(DIGITS, args=args))
    from_folder, from_file = parcae.warm_start(base, tmp_path / "a" / "layers"), parcae.warm_start(base, init)
    for i in range(len(base.layers)):
        want = seeded_build(from_file, 0, i).state_dict()
        assert all(torch.equal(v, want[k]) for k, v in seeded_build(from_folder, 0, i).state_dict().items())


def test_the_built_in_gpts_take_init(tmp_path):
    """`--model-args '{"init": ...}'` warm-starts tiny-gpt and small-gpt as it does a user's spec."""
    state = _seeded(spec_of(ModelConfig("tiny-gpt"), TrainConfig()), 5)
    torch.save(state, tmp_path / "gpt.pt")
    warm = spec_of(ModelConfig("tiny-gpt", {"init": str(tmp_path / "gpt.pt")}), TrainConfig())
    head = seeded_build(warm, 0, len(warm.layers) - 1).state_dict()
    assert head.keys() and all(torch.equal(v, state[f"head.{k}"]) for k, v in head.items())
    with pytest.raises(SpecError, match=r"embed\.wte\.weight is \(\d+, 64\) .* the layer's is \(\d+, 128\)"):
        spec_of(ModelConfig("small-gpt", {"init": str(tmp_path / "gpt.pt")}), TrainConfig())
