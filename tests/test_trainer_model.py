"""Tests of trainer.config, trainer.runtime.data, trainer.runtime.model and the example GPT (single process, no
torch.distributed)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _trainer_fixtures import _one_thread  # noqa: F401  (autouse fixtures)

from trainer.config import MODELS, ModelConfig, TrainConfig, UnknownModelError, model_config
from trainer.corpus import corpus
from trainer.examples.gpt import Block, Embedding, Head, global_batch
from trainer.runtime.data import replica_rows, shard
from trainer.runtime.model import Stage, build_layer, build_layers, layer_names, n_layers
from trainer.runtime.pipeline import StageLayout, build_context, train_step
from trainer.runtime.trainspec import SpecError

CFG = model_config("tiny-gpt")


# ------------------------------------------------------------------------------------------------ config


def test_registry_defaults_and_unknown_names():
    assert CFG.name == "tiny-gpt"
    assert CFG.args == {"n_layer": 4, "n_embd": 64, "n_head": 4, "block_size": 32}
    assert corpus().vocab_size == len(corpus().chars)
    assert ModelConfig() == CFG
    assert model_config("tiny-gpt", seed=3).seed == 3
    assert set(MODELS) >= {"tiny-gpt"}
    with pytest.raises(UnknownModelError, match=r"unknown model 'gpt-9'.*known models: .*tiny-gpt"):
        model_config("gpt-9")
    with pytest.raises(UnknownModelError, match="gpt-9"):
        ModelConfig(name="gpt-9")
    with pytest.raises(SpecError, match="divisible by n_head"):
        layer_names(model_config(n_embd=66))
    t = TrainConfig()
    assert (t.global_batch, t.micro_batch, t.lr, t.seed) == (16, 2, 3e-3, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.lr = 1.0  # frozen
    assert ModelConfig.from_dict(CFG.to_dict()) == CFG


# -------------------------------------------------------------------------------------------------- data


def test_corpus_is_the_sorted_pydoc_topics():
    from pydoc_data.topics import topics

    c = corpus()
    text = "".join(topics[k] for k in sorted(topics))
    assert len(c.tokens) == len(text) and c.chars == "".join(sorted(set(text)))
    assert c.decode(c.tokens[:200]) == text[:200]
    assert torch.equal(c.encode(text[:50]), c.tokens[:50])


def test_global_batch_depends_only_on_seed_and_step():
    t = TrainConfig()
    x, y = global_batch(5, t, 32)
    assert x.shape == y.shape == (16, 32) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # next-character targets
    x2, _ = global_batch(5, TrainConfig(micro_batch=4, lr=1e-3), 32)  # other knobs do not matter
    assert torch.equal(x, x2)
    assert not torch.equal(x, global_batch(6, t, 32)[0])
    assert not torch.equal(x, global_batch(5, TrainConfig(seed=1), 32)[0])


@pytest.mark.parametrize("D", [1, 2, 3, 4, 5, 16])
def test_shard_partitions_the_global_batch_exactly(D):
    x, y = global_batch(0, TrainConfig(), 32)
    rows = []
    for r in range(D):
        micro = shard(x, y, r, D, 2)
        n = len(replica_rows(16, r, D))
        assert [len(m[0]) for m in micro] == [min(2, n - i) for i in range(0, n, 2)]  # all full but maybe the last
        assert all(1 <= len(xm) <= 2 for xm, _ in micro)
        rows += [xm for xm, _ in micro]
        assert len(replica_rows(16, r, D)) in (16 // D, -(-16 // D))  # floor or ceil
    assert torch.equal(torch.cat(rows), x)  # every sequence once, in order


def test_shard_errors():
    x, y = global_batch(0, TrainConfig(), 32)
    with pytest.raises(ValueError, match="D=17 replicas exceed global_batch=16"):
        shard(x, y, 0, 17, 2)
    with pytest.raises(ValueError, match="replica 2 out of range"):
        shard(x, y, 2, 2, 2)


# ------------------------------------------------------------------------------------------------- model


def test_layer_names_and_types():
    assert layer_names(CFG) == ["embed", "block.0", "block.1", "block.2", "block.3", "head"]
    assert n_layers(CFG) == 6
    layers = build_layers(CFG)
    assert [type(layer) for layer in layers] == [Embedding, Block, Block, Block, Block, Head]
    with pytest.raises(IndexError):
        build_layer(CFG, 6)


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_layer_init_is_per_layer_and_independent_of_the_stage_cut():
    full = build_layers(CFG)
    # another cut, built in another order, after the global RNG was disturbed
    torch.manual_seed(1234)
    torch.rand(100)
    tail = build_layers(CFG, 3, 6)
    head_first = [build_layer(CFG, i) for i in (2, 1, 0)][::-1]
    for i, layer in enumerate(head_first + tail):
        assert _same(layer, full[i]), layer_names(CFG)[i]
    # layers of the same type are not copies of each other; another seed gives other weights
    assert not _same(full[1], full[2])
    assert not _same(full[1], build_layer(model_config(seed=1), 1))


def test_stage_slices_compose_to_the_whole_model():
    layers = build_layers(CFG)
    x, _ = global_batch(0, TrainConfig(), 32)
    whole = Stage(layers, 0, 6)(x[:2])
    parts = Stage(layers[3:], 3, 6)(Stage(layers[:3], 0, 3)(x[:2]))
    assert whole.shape == (2, 32, corpus().vocab_size)
    assert torch.equal(whole, parts)
    s = Stage(layers[1:3], 1, 3)
    assert s.indices == range(1, 3) and s.layer(2) is layers[2]
    with pytest.raises(IndexError):
        s.layer(0)
    with pytest.raises(ValueError, match=r"Stage \[0, 3\) needs 3 layers, got 2"):
        Stage(layers[:2], 0, 3)


def test_single_process_training_reduces_the_loss():
    ctx = build_context(CFG, TrainConfig(), StageLayout.even(1, 1, CFG))
    losses = [train_step(ctx, s) for s in range(20)]
    assert losses[0] == pytest.approx(torch.log(torch.tensor(float(corpus().vocab_size))).item(), rel=0.05)
    assert sum(losses[-5:]) / 5 < 0.8 * losses[0]
