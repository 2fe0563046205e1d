"""Tests of trainer.runtime.checkpoint: layer-keyed round trips into another cut, atomic writes, safe loads, errors.

(Resuming a distributed 2x2 run from a single-process checkpoint is in tests/test_trainer_pipeline.py.)
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from _trainer_fixtures import _one_thread  # noqa: F401  (autouse fixtures)

from trainer.config import TrainConfig, model_config
from trainer.runtime import checkpoint
from trainer.runtime.checkpoint import CheckpointError
from trainer.runtime.model import Stage, build_layer, layer_names, spec_of
from trainer.runtime.pipeline import (
    StageLayout,
    build_context,
    layer_state,
    load_layer_state,
    make_optimizer,
    train_step,
)

CFG = model_config("tiny-gpt")
TRAIN = TrainConfig()
JOB = "job-a"


@pytest.fixture(scope="module")
def trained() -> dict[str, dict[str, torch.Tensor]]:
    """Layer states after 2 single-process steps (parameters and Adam state)."""
    ctx = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    for s in range(2):
        train_step(ctx, s)
    return ctx.layer_states()


def assert_states_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys(), name
        assert all(torch.equal(a[name][k], b[name][k]) for k in a[name]), name


def test_round_trip_into_another_cut(trained, tmp_path):
    whole = checkpoint.save(checkpoint.shard_path(tmp_path, 2), trained, step=2, config=CFG, job=JOB)
    assert whole.name == "step00000002.pt"
    ckpt = checkpoint.load(whole, config=CFG, job=JOB)
    assert (ckpt.step, ckpt.job, ckpt.config) == (2, JOB, CFG)
    assert_states_equal(ckpt.layers, trained)

    # install into a P=3 cut (layers built by each stage from scratch), then write one shard per stage
    strategy = StageLayout.even(1, 3, CFG)
    names = layer_names(CFG)
    for stage in range(3):
        idx = strategy.layers(stage)
        stage_mod = Stage([build_layer(CFG, i) for i in idx], idx.start, idx.stop)
        opts = {i: make_optimizer(stage_mod.layer(i), spec_of(CFG, TRAIN)) for i in idx}
        for i in idx:
            load_layer_state(stage_mod.layer(i), opts[i], ckpt.layers[names[i]])
        shard = {names[i]: layer_state(stage_mod.layer(i), opts[i]) for i in idx}
        checkpoint.save(checkpoint.shard_path(tmp_path / "cut", 2, stage), shard, step=2, config=CFG, job=JOB)

    shards = checkpoint.find_shards(tmp_path / "cut", 2)
    assert [p.name for p in shards] == [f"step00000002.stage{k}.pt" for k in range(3)]
    merged = checkpoint.load(shards, config=CFG, job=JOB)
    assert_states_equal(merged.layers, trained)

    # and back into one process, where training continues exactly as without the detour
    a = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    a.load_layer_states(trained)
    b = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    b.load_layer_states(merged.layers)
    assert train_step(a, 2) == train_step(b, 2)
    assert_states_equal(a.layer_states(), b.layer_states())


def test_partial_and_inconsistent_shard_sets(trained, tmp_path):
    first = {n: trained[n] for n in ["embed", "block.0", "block.1"]}
    rest = {n: trained[n] for n in ["block.2", "block.3", "head"]}
    p0 = checkpoint.save(tmp_path / "a.pt", first, step=2, config=CFG, job=JOB)
    missing = r"a\.pt: incomplete checkpoint, missing layers \['block.2', 'block.3', 'head'\]"
    with pytest.raises(CheckpointError, match=missing):
        checkpoint.load(p0, config=CFG, job=JOB)
    assert set(checkpoint.load(p0, config=CFG, job=JOB, complete=False).layers) == set(first)
    p1 = checkpoint.save(tmp_path / "b.pt", rest, step=3, config=CFG, job=JOB)
    with pytest.raises(CheckpointError, match=r"b\.pt: step 3 but .*a\.pt has step 2"):
        checkpoint.load([p0, p1], config=CFG, job=JOB)
    p2 = checkpoint.save(tmp_path / "c.pt", {"block.1": trained["block.1"]}, step=2, config=CFG, job=JOB)
    with pytest.raises(CheckpointError, match=r"c\.pt: layer 'block.1' is also in .*a\.pt"):
        checkpoint.load([p0, p2], config=CFG, job=JOB, complete=False)
    with pytest.raises(ValueError, match=r"\['block.9'\] are not layers of model 'tiny-gpt'"):
        checkpoint.save(tmp_path / "d.pt", {"block.9": trained["block.1"]}, step=2, config=CFG, job=JOB)


def test_other_job_or_other_model_config_is_refused(trained, tmp_path):
    path = checkpoint.save(tmp_path / "ck.pt", trained, step=2, config=CFG, job=JOB)
    with pytest.raises(CheckpointError, match=r"ck\.pt: checkpoint of job 'job-a', expected job 'job-b'"):
        checkpoint.load(path, config=CFG, job="job-b")
    other_seed = r"ck\.pt: checkpoint of another model config \(seed: file has 0, expected 7\)"
    with pytest.raises(CheckpointError, match=other_seed):
        checkpoint.load(path, config=model_config(seed=7), job=JOB)
    with pytest.raises(CheckpointError, match=r"args.n_layer: file has 4, expected 2"):
        checkpoint.load(path, config=model_config(n_layer=2), job=JOB)


def test_unreadable_files_are_refused_with_their_name(trained, tmp_path):
    with pytest.raises(CheckpointError, match=r"missing\.pt: no such checkpoint file"):
        checkpoint.load(tmp_path / "missing.pt", config=CFG, job=JOB)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a zip archive at all")
    with pytest.raises(CheckpointError, match=r"garbage\.pt: not a readable checkpoint"):
        checkpoint.load(garbage, config=CFG, job=JOB)
    good = checkpoint.save(tmp_path / "good.pt", trained, step=2, config=CFG, job=JOB)
    torn = tmp_path / "torn.pt"
    torn.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"torn\.pt: not a readable checkpoint"):
        checkpoint.load(torn, config=CFG, job=JOB)
    other = tmp_path / "other.pt"
    torch.save({"model": {}}, other)
    with pytest.raises(CheckpointError, match=r"other\.pt: not a trainer checkpoint"):
        checkpoint.load(other, config=CFG, job=JOB)


class _Payload:
    """Unpickling this would run code (touch a marker file); weights_only must refuse it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_load_is_weights_only(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"format": 1, "layers": {}, "step": 0, "config": CFG.to_dict(), "job": JOB, "x": _Payload(marker)}, evil)
    with pytest.raises(CheckpointError, match=r"evil\.pt: not a readable checkpoint"):
        checkpoint.load(evil, config=CFG, job=JOB, complete=False)
    assert not marker.exists()


def test_a_crash_mid_write_leaves_the_previous_checkpoint_intact(trained, tmp_path, monkeypatch):
    path = checkpoint.shard_path(tmp_path, 2)
    checkpoint.save(path, trained, step=2, config=CFG, job=JOB)
    before = path.read_bytes()

    real_save = torch.save

    def crash_after_half(obj, f):
        buf = io.BytesIO()
        real_save(obj, buf)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint.torch, "save", crash_after_half)
    newer = {n: {k: v + 1 for k, v in s.items()} for n, s in trained.items()}
    with pytest.raises(OSError, match="simulated"):
        checkpoint.save(path, newer, step=2, config=CFG, job=JOB)
    monkeypatch.undo()

    assert path.read_bytes() == before
    # the temporary file is gone; the shard and its hash record are the old ones
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, checkpoint.record_path(path).name]
    assert_states_equal(checkpoint.load(path, config=CFG, job=JOB).layers, trained)


def test_find_shards_ignores_temporary_files(trained, tmp_path):
    p = checkpoint.save(checkpoint.shard_path(tmp_path, 5, 0), {"embed": trained["embed"]}, step=5, config=CFG, job=JOB)
    (tmp_path / f".{checkpoint.shard_path(tmp_path, 5, 1).name}.tmp-abc").write_bytes(b"partial")
    (tmp_path / "step00000050.pt").write_bytes(b"another step")
    assert checkpoint.find_shards(tmp_path, 5) == [p]
