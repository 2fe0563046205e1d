"""Tests of trainer.runtime.pipeline: geometry, the per-layer migration unit, and the key property — every D x P
strategy (real gloo processes) trains exactly the same run as a single process.

The equivalence is checked in float64 (`ModelConfig.dtype`): another D changes the order in which gradients are
summed, and in float32 Adam's first steps amplify that rounding in near-zero gradients to ~1e-5 in a few weights.
In float32 a pipeline-only split (D=1) changes no summation and must be bit-identical; D>1 is checked loosely.

One pool of 4 spawned workers serves every distributed case: each case is a new *epoch* (a fresh default group on
`PrefixStore(f"epoch{n}")` of a TCPStore hosted by this test process), so the pool also exercises leaving one
epoch and joining the next, as workers will at a migration.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
import threading
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _trainer_fixtures import _one_thread  # noqa: F401  (autouse fixtures)

from trainer.config import ModelConfig, TrainConfig, model_config
from trainer.examples.gpt import global_batch
from trainer.runtime import checkpoint
from trainer.runtime.model import build_layers, hollow_layer, layer_names, n_layers, spec_of
from trainer.runtime.pipeline import (
    StageLayout,
    build_context,
    catch_up,
    hollow_layers,
    layer_state,
    layer_step,
    load_layer_state,
    make_optimizer,
    partition,
    state_on,
    train_step,
)

CFG = model_config("tiny-gpt", dtype="float64")
CFG32 = model_config("tiny-gpt")
TRAIN = TrainConfig()
JOB = "test-job"
STEPS = 4
N_WORKERS = 4
PG_TIMEOUT = timedelta(seconds=30)
JOB_TIMEOUT_S = 45


# ---------------------------------------------------------------------------------------------- geometry


def test_partition_and_strategy():
    assert partition(6, 1) == (0, 6)
    assert partition(6, 2) == (0, 3, 6)
    assert partition(6, 4) == (0, 1, 3, 4, 6)
    with pytest.raises(ValueError, match="P=7"):
        partition(6, 7)
    s = StageLayout.even(2, 3, CFG)
    assert s.world_size == 6 and s.bounds == (0, 2, 4, 6)
    assert [s.coords(r) for r in range(6)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert s.stage_ranks(1) == [2, 3] and s.layers(2) == range(4, 6)
    with pytest.raises(ValueError, match="strictly increasing"):
        StageLayout(1, 2, (0, 3, 3))
    with pytest.raises(ValueError, match="needs process groups"):
        build_context(CFG, TRAIN, s, 0)
    with pytest.raises(ValueError, match="last stage must end"):
        build_context(CFG, TRAIN, StageLayout(1, 1, (0, 5)))


def test_a_cut_by_parameter_counts_balances_the_costliest_stage():
    tiny = (8640, 49792, 49792, 49792, 49792, 6823)  # tiny-gpt: embed, 4 blocks, head
    assert partition(tiny, 4) == (0, 2, 3, 4, 6)  # the even cut (0, 1, 3, 4, 6) puts two blocks on stage 1
    assert partition(tiny, 2) == partition(6, 2) and partition(tiny, 3) == partition(6, 3)
    assert partition([1, 1, 1, 9], 2) == (0, 3, 4) and partition([9, 1, 1, 1], 2) == (0, 1, 4)
    assert partition([0, 0, 0], 3) == (0, 1, 2, 3)  # layers without parameters still get a stage each
    # the optimum over every cut: no other contiguous cut has a cheaper costliest stage
    import itertools

    costs = (5, 3, 8, 1, 1, 7, 2)
    best = min(max(sum(costs[a:b]) for a, b in itertools.pairwise((0, *cut, 7)))
               for cut in itertools.combinations(range(1, 7), 2))  # fmt: skip
    bounds = partition(costs, 3)
    assert max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)) == best
    with pytest.raises(ValueError, match="P=4"):
        partition([1, 2, 3], 4)


# ------------------------------------------------------------------------------------- single-process reference


@dataclass(frozen=True)
class Run:
    losses: list[float]
    layers: dict[str, dict[str, torch.Tensor]]


def reference_run(cfg: ModelConfig, steps: int = STEPS) -> Run:
    """D=1, P=1 with train_step (no torch.distributed)."""
    ctx = build_context(cfg, TRAIN, StageLayout.even(1, 1, cfg))
    losses = [train_step(ctx, s) for s in range(steps)]
    return Run(losses, ctx.layer_states())


@pytest.fixture(scope="module")
def reference() -> Run:
    return reference_run(CFG)


@pytest.fixture(scope="module")
def reference32() -> Run:
    return reference_run(CFG32)


def assert_layers_close(got: dict, want: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].keys() == want[name].keys(), name
        for key in want[name]:
            ok = torch.equal if rtol == atol == 0 else lambda a, b: torch.allclose(a, b, rtol=rtol, atol=atol)
            assert ok(got[name][key], want[name][key]), f"{name} {key}"


def test_micro_batched_per_layer_step_equals_plain_full_batch_adamw(reference):
    """train_step (micro-batches, loss/(B*T), one AdamW per layer) == nanoGPT-style loop with one AdamW."""
    layers = build_layers(CFG)
    assert all(p.dtype == torch.float64 for p in nn.ModuleList(layers).parameters())
    model = nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN.lr, betas=TRAIN.betas, weight_decay=TRAIN.weight_decay)
    losses = []
    for step in range(STEPS):
        x, y = global_batch(step, TRAIN, CFG.args["block_size"])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses == pytest.approx(reference.losses, rel=1e-5)
    for name, layer in zip(layer_names(CFG), layers):
        for pname, p in layer.named_parameters():
            want = reference.layers[name][f"param/{pname}"]
            assert torch.allclose(p.detach(), want, rtol=1e-5, atol=1e-6), f"{name} {pname}"
            state = opt.state[p]
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.allclose(state[key], reference.layers[name][f"{key}/{pname}"], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------- the migration unit


def test_layer_state_round_trip_continues_the_same_run():
    a = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    for s in range(2):
        train_step(a, s)
    states = a.layer_states()
    assert set(states) == set(layer_names(CFG))
    assert {k.split("/")[0] for k in states["block.0"]} == {"param", "exp_avg", "exp_avg_sq", "step"}
    assert float(states["head"]["step/lm_head.weight"]) == 2.0
    # a freshly built context (other init seed) adopts the state and continues bit-identically
    b = build_context(model_config(seed=9, dtype="float64"), TRAIN, StageLayout.even(1, 1, CFG))
    b.load_layer_states(states)
    assert train_step(a, 2) == train_step(b, 2)
    for name, sa in a.layer_states().items():
        sb = b.layer_states()[name]
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name
    # snapshots are copies: training on did not change them
    assert float(states["head"]["step/lm_head.weight"]) == 2.0


def test_optimiser_state_goes_where_torch_would_put_it():
    """As `torch.optim.Optimizer.load_state_dict` places it: Adam's `step` on the host, unless the group is fused or
    capturable (a fused AdamW on a GPU refuses a host `step`: every migration of such a job would fail there); the rest
    on the parameter's device. (A parameter on `meta` stands for a GPU's here.)"""
    param = torch.empty(3, device="meta")
    step, moment = torch.tensor(4.0, dtype=torch.float64), torch.ones(3)
    for group in ({}, {"fused": False, "capturable": False}):
        assert state_on("step", step, param, group).device.type == "cpu"
        assert state_on("exp_avg", moment, param, group).device.type == "meta"
    for group in ({"fused": True}, {"capturable": True}):
        moved = state_on("step", step, param, group)
        assert moved.device.type == "meta" and moved.dtype == torch.float32
    kept = state_on("step", step, torch.empty(3), {})
    assert torch.equal(kept, step) and kept is not step  # a copy: the snapshot stays the sender's


def test_a_context_keeps_the_layers_it_is_handed_and_builds_the_rest_from_their_seeds():
    """What a migration keeps is kept as is (module and optimiser: the same objects, trained state and all); only the
    layers it lacks are built, each from its own seed, and loaded from what was received."""
    a = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    train_step(a, 0)
    twin = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))  # a's state, in other objects
    twin.load_layer_states(a.layer_states())
    kept = {i: (twin.module.layer(i), twin.optimizers[i]) for i in twin.module.indices if i % 2 == 0}
    b = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG), held=kept)
    for i in b.module.indices:
        if i in kept:
            assert b.module.layer(i) is kept[i][0] and b.optimizers[i] is kept[i][1]
        else:
            assert b.module.layer(i) is not twin.module.layer(i)
    fresh = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG)).layer_states()
    states, names = a.layer_states(), b.names
    lacking = [n for n, i in zip(names, b.module.indices, strict=True) if i not in kept]
    for n in lacking:  # built from its seed, as a new context's
        assert all(torch.equal(b.layer_states()[n][k], fresh[n][k]) for k in fresh[n]), n
    b.load_layer_states(states, lacking)
    assert train_step(a, 1) == train_step(b, 1)
    with pytest.raises(KeyError, match="no state for layers"):
        b.load_layer_states({}, lacking[:1])


def test_a_layer_sent_a_step_early_catches_up_bit_for_bit_with_that_step_s_gradients():
    """What lets a migration send state during the step before its boundary: the state as of boundary s plus step
    s's gradients (as the holder applied them), through the same optimiser, is exactly the holder's state at s + 1."""
    a = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    train_step(a, 0)
    before = a.layer_states()  # boundary 1: what is sent during step 1
    train_step(a, 1)
    after = a.layer_states()  # boundary 2: what the holder has
    b = build_context(model_config(seed=9, dtype="float64"), TRAIN, StageLayout.even(1, 1, CFG))  # other init
    spec = spec_of(CFG, TRAIN)
    for name, i in zip(a.names, a.module.indices, strict=True):
        grads = layer_step(a.module.layer(i))
        assert grads and all(k.startswith("grad/") for k in grads)
        catch_up(b.module.layer(i), b.optimizers[i], before[name], grads, spec.lr(1) if spec.lr else None)
    for name, want in after.items():
        got = b.layer_states()[name]
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name
    assert train_step(a, 2) == train_step(b, 2)  # and they train on as one


BUFFERED = ModelConfig("_buffered_model:spec")  # tests/_buffered_model.py: BatchNorm, a constant, tied weights
BUFFERED_TRAIN = TrainConfig(global_batch=24, micro_batch=4)


def test_a_layer_s_state_carries_its_persistent_buffers_and_a_catch_up_takes_the_step_s():
    """BatchNorm's running statistics change at every training forward: a layer's state (what a migration moves and
    a checkpoint holds) carries them with the parameters, and a catch-up takes those the step left. A non-persistent
    buffer is not state: its factory gives it."""
    a = build_context(BUFFERED, BUFFERED_TRAIN, StageLayout.even(1, 1, BUFFERED))
    train_step(a, 0)
    before = a.layer_states()
    stats = {"buffer/norm.running_mean", "buffer/norm.running_var", "buffer/norm.num_batches_tracked"}
    assert {k for k in before["embed"] if k.startswith("buffer/")} == stats
    assert not any(k.startswith("buffer/") for k in before["scaled"])
    train_step(a, 1)
    after = a.layer_states()
    assert not torch.equal(before["embed"]["buffer/norm.running_mean"], after["embed"]["buffer/norm.running_mean"])
    b = build_context(ModelConfig("_buffered_model:spec", seed=5), BUFFERED_TRAIN, StageLayout.even(1, 1, BUFFERED))
    spec = spec_of(BUFFERED, BUFFERED_TRAIN)
    for name, i in zip(a.names, a.module.indices, strict=True):
        catch_up(b.module.layer(i), b.optimizers[i], before[name], layer_step(a.module.layer(i)),
                 spec.lr(1) if spec.lr else None)  # fmt: skip
    for name, want in after.items():
        got = b.layer_states()[name]
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name
    assert train_step(a, 2) == train_step(b, 2)
    # a state without the buffers is refused, naming them
    bare = {k: v for k, v in after["embed"].items() if not k.startswith("buffer/")}
    with pytest.raises(ValueError, match="missing.*buffer/norm.running_mean"):
        load_layer_state(b.module.layer(0), b.optimizers[0], bare)


def test_a_hollow_layer_takes_a_state_touches_no_generator_and_is_refused_where_a_state_cannot_fill_it():
    """What a re-cut's survivor builds beside its training step for the layers it receives: storage, no values."""
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    hollow = hollow_layer(BUFFERED, 0)  # parameters and BatchNorm's statistics: the state fills them all
    assert hollow is not None and torch.equal(rng, torch.get_rng_state())
    real = build_context(BUFFERED, BUFFERED_TRAIN, StageLayout.even(1, 1, BUFFERED))
    train_step(real, 0)
    state = real.layer_states()["embed"]
    load_layer_state(hollow, make_optimizer(hollow, spec_of(BUFFERED)), state)
    assert all(torch.equal(v, state[f"buffer/{k}"] if f"buffer/{k}" in state else state[f"param/{k}"])
               for k, v in hollow.state_dict().items())  # fmt: skip
    assert hollow_layer(BUFFERED, 1) is None  # a non-persistent buffer: only the factory gives its values
    assert hollow_layer(BUFFERED, 2) is None  # tied weights: Module.to_empty would untie them
    # built in a helper thread while this one builds layers from their seeds: the seeded layers are unchanged
    want = [layer_state(m, make_optimizer(m, spec_of(CFG))) for m in build_layers(CFG)]
    stop = threading.Event()

    def build_hollow() -> None:
        while not stop.is_set():
            hollow_layers(CFG, TRAIN, range(n_layers(CFG)))

    helper = threading.Thread(target=build_hollow)
    helper.start()
    try:
        for _ in range(5):
            got = [layer_state(m, make_optimizer(m, spec_of(CFG))) for m in build_layers(CFG)]
            assert all(torch.equal(g[k], w[k]) for g, w in zip(got, want, strict=True) for k in w)
    finally:
        stop.set()
        helper.join()


def test_layer_state_before_the_first_step_and_errors():
    layer, other = build_layers(CFG, 1, 3)
    opt = make_optimizer(layer, spec_of(CFG, TRAIN))
    fresh = layer_state(layer, opt)
    assert {k.split("/")[0] for k in fresh} == {"param"}
    load_layer_state(other, make_optimizer(other, spec_of(CFG, TRAIN)), fresh)
    assert all(torch.equal(a, b) for a, b in zip(layer.parameters(), other.parameters()))
    with pytest.raises(ValueError, match="optimizer does not own"):
        load_layer_state(layer, make_optimizer(other, spec_of(CFG, TRAIN)), fresh)
    head = build_layers(CFG, 5, 6)[0]
    with pytest.raises(ValueError, match="missing"):
        load_layer_state(head, make_optimizer(head, spec_of(CFG, TRAIN)), fresh)
    # a parameter no step gave a gradient has no optimiser state at its holder, and gets none (the others theirs)
    n_embd = CFG.args["n_embd"]
    stepped = {**fresh, "exp_avg/ln_1.weight": torch.ones(n_embd), "exp_avg_sq/ln_1.weight": torch.ones(n_embd)}
    opt = make_optimizer(other, spec_of(CFG, TRAIN))
    load_layer_state(other, opt, stepped)
    with_state = [name for name, p in other.named_parameters() if opt.state.get(p)]
    assert with_state == ["ln_1.weight"] and torch.equal(opt.state[other.ln_1.weight]["exp_avg"], torch.ones(n_embd))
    # one with part of the state the others have is refused
    partial = {**stepped, "exp_avg/ln_1.bias": torch.zeros(n_embd)}
    with pytest.raises(ValueError, match=r"ln_1.bias: optimizer state lacks \['exp_avg_sq'\]"):
        load_layer_state(other, make_optimizer(other, spec_of(CFG, TRAIN)), partial)
    block32 = build_layers(CFG32, 1, 2)[0]
    with pytest.raises(ValueError, match="torch.float64, layer has .* torch.float32"):
        load_layer_state(block32, make_optimizer(block32, spec_of(CFG, TRAIN)), fresh)


# ------------------------------------------------------------------------------------------- worker pool


def _worker(worker_id: int, port: int, jobs: mp.Queue, results: mp.Queue) -> None:
    """A pool worker: for each job (one epoch), join it if it has a rank, train, write its shard, leave."""
    torch.set_num_threads(1)
    from trainer.runtime.pipeline import close_epoch, init_epoch

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=PG_TIMEOUT)
    parent = os.getppid()
    while True:
        try:
            job = jobs.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the test process died without stopping us: do not linger
                os._exit(1)
            continue
        if job is None:
            # skip interpreter finalisation (~1 s per process with torch loaded) once the replies are flushed
            results.close()
            results.join_thread()
            os._exit(0)
        try:
            strategy: StageLayout = job["strategy"]
            groups = init_epoch(store, job["epoch"], strategy, worker_id, PG_TIMEOUT)
            ctx = build_context(job["model"], job["train"], strategy, worker_id, groups)
            if job["resume"]:
                ckpt = checkpoint.load(job["resume"], config=job["model"], job=JOB)
                assert ckpt.step == job["start"], (ckpt.step, job["start"])
                ctx.load_layer_states(ckpt.layers)
            losses = [train_step(ctx, s) for s in range(job["start"], job["stop"])]
            if ctx.replica == 0:
                path = checkpoint.shard_path(job["out"], job["stop"], ctx.stage)
                checkpoint.save(path, ctx.layer_states(), step=job["stop"], config=job["model"], job=JOB)
            digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in ctx.module.parameters()))
            close_epoch(groups)
            results.put((worker_id, "ok", {"losses": losses, "stage": ctx.stage, "digest": digest.hexdigest()}))
        except BaseException:
            results.put((worker_id, "error", traceback.format_exc()))
            return  # the epoch may be broken; the pool is restarted


class Pool:
    """N_WORKERS spawned workers around a TCPStore hosted here; `run` executes one epoch on the first D*P."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.store = dist.TCPStore(
            "127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False, timeout=PG_TIMEOUT
        )
        self.epoch = 0
        self.procs: list = []
        self._start()

    def _start(self) -> None:
        self.results = self.ctx.Queue()
        self.jobs = [self.ctx.Queue() for _ in range(N_WORKERS)]
        env = {"OMP_NUM_THREADS": "1"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.procs = [
                self.ctx.Process(target=_worker, args=(w, self.store.port, self.jobs[w], self.results), daemon=True)
                for w in range(N_WORKERS)
            ]
            for p in self.procs:
                p.start()
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)

    def run(
        self, strategy: StageLayout, out: Path, cfg: ModelConfig = CFG, start: int = 0, stop: int = STEPS, resume=None
    ) -> list[dict]:
        self.epoch += 1
        job = dict(epoch=self.epoch, strategy=strategy, model=cfg, train=TRAIN, start=start, stop=stop,
                   out=str(out), resume=[str(p) for p in resume] if resume else None)  # fmt: skip
        for w in range(strategy.world_size):
            self.jobs[w].put(job)
        replies = {}
        try:
            while len(replies) < strategy.world_size:
                w, status, payload = self.results.get(timeout=JOB_TIMEOUT_S)
                if status != "ok":
                    raise AssertionError(f"worker {w} failed:\n{payload}")
                replies[w] = payload
        except BaseException:
            self.restart()
            raise
        return [replies[w] for w in range(strategy.world_size)]

    def stop(self) -> None:
        for q, p in zip(self.jobs, self.procs):
            if p.is_alive():
                q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    def restart(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._start()


@pytest.fixture(scope="module")
def pool():
    p = Pool()
    try:
        yield p
    finally:
        p.stop()
        assert not any(proc.is_alive() for proc in p.procs)


def assert_same_run(
    replies: list[dict],
    strategy: StageLayout,
    run: Run,
    out: Path,
    cfg: ModelConfig = CFG,
    stop: int = STEPS,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> None:
    for r in replies:  # the loss is all-reduced to every rank
        if rtol == atol == 0:
            assert r["losses"] == run.losses
        else:
            assert r["losses"] == pytest.approx(run.losses, rel=1e-5)
    for stage in range(strategy.P):  # replicas of a stage hold bit-identical parameters
        digests = {replies[strategy.rank(stage, rep)]["digest"] for rep in range(strategy.D)}
        assert len(digests) == 1, f"replicas of stage {stage} diverged"
    shards = checkpoint.find_shards(out, stop)
    assert len(shards) == strategy.P
    got = checkpoint.load(shards, config=cfg, job=JOB)
    assert got.step == stop
    assert_layers_close(got.layers, run.layers, rtol, atol)


@pytest.mark.parametrize(
    "D,P",
    [(2, 1), (1, 2), (2, 2), (3, 1), (1, 4)],
    ids=["D2xP1", "D1xP2", "D2xP2", "D3xP1-uneven-shards", "D1xP4"],
)
def test_every_strategy_trains_the_same_run_as_one_process(pool, reference, tmp_path, D, P):
    strategy = StageLayout.even(D, P, CFG)
    replies = pool.run(strategy, tmp_path)
    assert [r["stage"] for r in replies] == [strategy.coords(w)[0] for w in range(D * P)]
    assert_same_run(replies, strategy, reference, tmp_path)


def test_float32_pipeline_split_is_bit_identical_and_data_parallel_close(pool, reference32, tmp_path):
    strategy = StageLayout.even(1, 2, CFG32)
    assert_same_run(pool.run(strategy, tmp_path / "p", CFG32), strategy, reference32, tmp_path / "p", CFG32,
                    rtol=0, atol=0)  # fmt: skip
    strategy = StageLayout.even(2, 2, CFG32)
    assert_same_run(pool.run(strategy, tmp_path / "dp", CFG32), strategy, reference32, tmp_path / "dp", CFG32,
                    rtol=1e-3, atol=1e-4)  # fmt: skip


def test_resume_from_a_single_process_checkpoint_in_another_cut(pool, reference, tmp_path):
    """Steps 0-1 in one process, checkpoint, steps 2-3 as 2x2 with an uneven cut == 4 uninterrupted steps."""
    ctx = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    first = [train_step(ctx, s) for s in range(2)]
    assert first == pytest.approx(reference.losses[:2], rel=1e-6)
    saved = checkpoint.save(tmp_path / "in" / "whole.pt", ctx.layer_states(), step=2, config=CFG, job=JOB)
    strategy = StageLayout(2, 2, (0, 4, 6))
    replies = pool.run(strategy, tmp_path / "out", start=2, stop=STEPS, resume=[saved])
    assert_same_run(replies, strategy, Run(reference.losses[2:], reference.layers), tmp_path / "out")
