"""Tests of live migration: the schedule format, the pure migration planning, the coordinator's checks, and the key
property — a job live-migrated through every kind of reconfiguration (intra-stage, inter-stage, pipeline, an added
instance, preemptions with notice) ends with the same parameters and loss curve as one uninterrupted process.

The equivalence job runs in float64 (see tests/test_trainer_pipeline.py: other D reorders gradient sums, which Adam
amplifies in float32). It uses 5 worker processes (4 initial + 1 added) and reconfigures 6 times in 10 steps.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest
import torch
from _jobs import EVERY_MIGRATION, coordinator, run_job
from _reference import uninterrupted
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)

from liveput.migration import MigrationKind, Trigger
from trainer.config import TrainConfig, UnknownModelError, model_config
from trainer.control.coordinator import Coordinator
from trainer.control.driver import JobError
from trainer.control.dry_run import ScheduleError, check_schedule
from trainer.control.events import Event, EventError, EventGroup, group_events, load_events, parse_events
from trainer.control.run import parameters_checksum
from trainer.runtime import checkpoint
from trainer.runtime.migration import (
    Epoch,
    PlanError,
    Transfer,
    assign,
    bytes_moved,
    classify,
    first_epoch,
    layer_sizes,
    next_epoch,
    plan_transfers,
    state_bytes,
)
from trainer.runtime.model import layer_names, n_layers
from trainer.runtime.pipeline import StageLayout, build_context, train_step
from trainer.runtime.worker import EXIT_PREEMPTED, EXIT_TOKEN, TokenError, Worker, WorkerSpec, process_main

CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()
N = n_layers(CFG)  # 6: embed, 4 blocks, head
STEPS = 10

SCHEDULE = EVERY_MIGRATION  # every kind of live migration (tests/_jobs.py)


@pytest.fixture(autouse=True)
def _no_orphans_here(_no_orphans):
    yield


# ---------------------------------------------------------------------------------------------------- events


def test_parse_events_sorts_and_groups():
    evs = parse_events(SCHEDULE, "s.json")
    assert [e.step for e in evs] == [2, 3, 4, 4, 6, 8, 8, 9]
    assert evs[0] == Event(2, "plan", strategy=(1, 2))
    assert evs[1] == Event(3, "preempt", instances=(2,), notice=True)
    assert parse_events([e.to_dict() for e in evs]) == evs
    groups = group_events(evs)
    assert groups[2] == EventGroup(4, strategy=(2, 2), add=1)
    assert groups[4] == EventGroup(8, strategy=(1, 2), preempt=(0,))
    with pytest.raises(EventError, match="step 4: 2 plans"):
        group_events(parse_events([{"step": 4, "kind": "plan", "strategy": [1, 1]}] * 2))


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"step": 2}, r"event 1: field 'kind': missing"),
        (
            {"step": 2, "kind": "move"},
            r"event 1: field 'kind': expected one of plan, add, preempt, kill, checkpoint-restart, got 'move'",
        ),
        ({"kind": "plan", "strategy": [1, 1]}, r"event 1: field 'step': missing"),
        ({"step": 0, "kind": "add", "workers": 1}, r"event 1: field 'step': expected an integer >= 1"),
        ({"step": "3", "kind": "add", "workers": 1}, r"event 1: field 'step'"),
        ({"step": 3, "kind": "plan"}, r"event 1: field 'strategy': missing"),
        ({"step": 3, "kind": "plan", "strategy": [2]}, r"event 1: field 'strategy': expected \[D, P\]"),
        ({"step": 3, "kind": "plan", "strategy": [0, 2]}, r"event 1: field 'strategy'"),
        ({"step": 3, "kind": "add", "workers": 0}, r"event 1: field 'workers': expected an integer >= 1"),
        ({"step": 3, "kind": "add", "workers": True}, r"event 1: field 'workers'"),
        ({"step": 3, "kind": "preempt", "instances": []}, r"event 1: field 'instances': expected a non-empty list"),
        ({"step": 3, "kind": "preempt", "instances": [1, 1]}, r"event 1: field 'instances': worker ids repeat"),
        ({"step": 3, "kind": "preempt", "instances": [1], "notice": "yes"}, r"event 1: field 'notice'"),
        ({"step": 3, "kind": "kill", "instances": [1], "notice": True}, r"event 1: field 'notice': a kill has no"),
        ({"step": 3, "kind": "checkpoint-restart", "strategy": [0, 1]}, r"event 1: field 'strategy'"),
        ({"step": 3, "kind": "checkpoint-restart", "workers": 1}, r"event 1: field 'workers': not a field"),
        ({"step": 3, "kind": "add", "workers": 1, "strategy": [1, 1]}, r"event 1: field 'strategy': not a field"),
        ([3, "plan"], r"event 1: expected an object"),
    ],
)
def test_event_errors_name_the_source_index_and_field(raw, match):
    with pytest.raises(EventError, match=r"^sched\.json: " + match):
        parse_events([{"step": 1, "kind": "add", "workers": 1}, raw], "sched.json")


def test_load_events_file_errors(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(SCHEDULE))
    assert len(load_events(good)) == len(SCHEDULE)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"step": 1, "kind": "add", "workers": 1},\n {"step": 2,}]')
    with pytest.raises(EventError, match=r"bad\.json: not valid JSON: .* line 2"):
        load_events(bad)
    with pytest.raises(EventError, match=r"missing\.json: cannot read"):
        load_events(tmp_path / "missing.json")
    obj = tmp_path / "obj.json"
    obj.write_text('{"step": 1}')
    with pytest.raises(EventError, match=r"obj\.json: expected a JSON list of events, got dict"):
        load_events(obj)


# ------------------------------------------------------------------------------------------------ migration


SIZES = layer_sizes(CFG)
BYTES = SIZES.trained_bytes


def epoch_of(D: int, P: int, assignment: dict[int, tuple[int, int]], number: int = 1) -> Epoch:
    return Epoch(number, 0, D, P, StageLayout.even(D, P, CFG).bounds, assignment, MigrationKind.START)


def test_layer_sizes_match_real_layer_states():
    ctx = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    fresh = ctx.layer_states()
    assert [state_bytes(fresh[n]) for n in layer_names(CFG)] == list(SIZES.fresh_bytes)
    train_step(ctx, 0)
    trained = ctx.layer_states()
    assert [state_bytes(trained[n]) for n in layer_names(CFG)] == list(SIZES.trained_bytes)
    # float64 params + exp_avg + exp_avg_sq = 24 B/param, plus a 4-byte step per parameter tensor
    assert SIZES.trained_bytes[1] > 24 * SIZES.params[1] and SIZES.fresh_bytes[1] == 8 * SIZES.params[1]


def test_first_epoch_and_json_round_trip():
    e = first_epoch(2, 2, [5, 0, 3, 1, 4], N)
    assert e.assignment == {0: (0, 0), 1: (0, 1), 3: (1, 0), 4: (1, 1)}
    assert e.bounds == (0, 3, 6) and e.rank(3) == 2 and e.layers_of(4) == range(3, 6) and e.layers_of(5) == range(0)
    assert Epoch.from_json(e.to_json()) == e
    assert e.trigger is None and e.joined == ()  # the start: nothing made it
    with pytest.raises(PlanError, match="needs 6 instances, only 5 are alive"):
        first_epoch(2, 3, range(5), N)
    with pytest.raises(PlanError, match="P=7 exceeds the model's 6 layers"):
        first_epoch(1, 7, range(8), N)
    with pytest.raises(ValueError, match="must fill 2x2"):
        Epoch(1, 0, 2, 2, (0, 3, 6), {0: (0, 0), 1: (0, 1), 2: (1, 0)}, MigrationKind.START)


def test_intra_stage_keeps_survivors_on_their_stage_and_moves_nothing():
    cur = epoch_of(2, 2, {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)})
    new = next_epoch(cur, 5, range(4), SIZES, strategy=(1, 2))
    assert new.kind is MigrationKind.INTRA_STAGE and new.transfers == () and new.bytes_planned == 0
    assert new.assignment == {0: (0, 0), 2: (1, 0)} and new.previous == (0, 1, 2, 3) and new.number == 2
    assert new.trigger is Trigger.PLANNED and new.joined == ()
    # a preemption that leaves every stage >= d replicas is intra-stage as well (the spare replica takes over)
    new = next_epoch(cur, 5, range(4), SIZES, strategy=(1, 2), preempt=[0])
    assert new.kind is MigrationKind.INTRA_STAGE and new.assignment == {1: (0, 0), 2: (1, 0)} and not new.transfers
    assert new.trigger is Trigger.NOTICE
    assert classify(cur, 1, 2, [1, 2]) is MigrationKind.INTRA_STAGE


def test_inter_stage_refills_short_stages_from_the_last_copy_under_notice():
    cur = epoch_of(1, 2, {0: (0, 0), 2: (1, 0)})
    # worker 2 holds the only copy of stage 1; idle worker 1 (lowest idle id) replaces it and fetches from 2
    new = next_epoch(cur, 3, [0, 1, 2, 3], SIZES, preempt=[2])
    assert new.kind is MigrationKind.INTER_STAGE and new.assignment == {0: (0, 0), 1: (1, 0)}
    assert new.transfers == tuple(Transfer(i, 2, 1) for i in range(3, 6))
    assert (new.trigger, new.joined) == (Trigger.NOTICE, (1,))  # a preemption first, whoever replaces it
    assert new.bytes_planned == sum(BYTES[3:6]) == bytes_moved(new.transfers, BYTES)
    # growing D: the new replicas fetch from the holders; idle instances are used before spare replicas
    new = next_epoch(cur, 3, [0, 1, 2, 3, 4], SIZES, strategy=(2, 2))
    assert new.kind is MigrationKind.INTER_STAGE
    assert new.assignment == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    assert (new.trigger, new.joined) == (Trigger.ADDITION, (1, 3))
    after_kill = next_epoch(new, 4, [0, 1, 2, 3], SIZES, strategy=(1, 2), lost=[3])
    assert (after_kill.trigger, after_kill.lost) == (Trigger.KILL, (3,))
    want = [Transfer(i, 0, 1) for i in range(3)] + [Transfer(i, 2, 3) for i in range(3, 6)]
    assert sorted(new.transfers) == sorted(want)


def test_sources_prefer_staying_holders_and_balance_load():
    cur = epoch_of(2, 1, {0: (0, 0), 1: (0, 1)})
    # two new replicas fetch every layer: the two holders share the bytes, the departing one is not used
    new_assignment = {0: (0, 0), 2: (0, 1), 3: (0, 2)}
    t = plan_transfers(cur, new_assignment, (0, N), BYTES, departing=[1])
    assert {x.src for x in t} == {0} and len(t) == 2 * N
    t = plan_transfers(cur, {0: (0, 0), 1: (0, 1), 2: (0, 2), 3: (0, 3)}, (0, N), BYTES)
    sent = {w: bytes_moved([x for x in t if x.src == w], BYTES) for w in (0, 1)}
    assert len(t) == 2 * N and abs(sent[0] - sent[1]) <= max(BYTES)


def test_pipeline_migration_uses_the_optimal_stage_assignment():
    cur = epoch_of(2, 2, {0: (0, 0), 3: (0, 1), 1: (1, 0), 4: (1, 1)})
    # 2 -> 3 stages (0,3,6) -> (0,2,4,6): both replicas of old stage 0 serve new stages 0 and 1, stage 2 comes from
    # old stage 1; only block.2 (layer 3) moves
    new = next_epoch(cur, 6, [0, 1, 3, 4], SIZES, strategy=(1, 3))
    assert new.kind is MigrationKind.PIPELINE and new.bounds == (0, 2, 4, 6)
    assert new.assignment == {0: (0, 0), 3: (1, 0), 1: (2, 0)}
    assert new.transfers == (Transfer(3, 1, 3),)
    # 3 -> 2 stages after a preemption: the preempted worker 0 holds the last copy of layers 0-1 and sends them
    new2 = next_epoch(new, 8, [0, 1, 3, 4], SIZES, strategy=(1, 2), preempt=[0])
    assert new2.assignment == {3: (0, 0), 1: (1, 0)}
    assert sorted(new2.transfers) == [Transfer(0, 0, 3), Transfer(1, 0, 3), Transfer(3, 3, 1)]
    # assign() on its own: a P change with every layer held once
    assert assign(cur, 1, 1, [0, 1, 3, 4], SIZES.params) in ({0: (0, 0)}, {1: (0, 0)})


def test_next_epoch_defaults_and_errors():
    cur = epoch_of(2, 2, {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)})
    assert next_epoch(cur, 4, range(5), SIZES) is None  # an add without a plan: the newcomer stands by
    assert next_epoch(cur, 4, range(5), SIZES, preempt=[4]) is None  # a standby instance leaves: nothing moves
    shrunk = next_epoch(cur, 4, range(4), SIZES, preempt=[3])  # no plan: keep P, D shrinks to what survives
    assert (shrunk.D, shrunk.P, shrunk.kind) == (1, 2, MigrationKind.INTRA_STAGE)
    with pytest.raises(PlanError, match=r"cannot preempt workers \[7\]"):
        next_epoch(cur, 4, range(4), SIZES, preempt=[7])
    with pytest.raises(PlanError, match="only 1 instances survive, fewer than the P=2"):
        next_epoch(cur, 4, range(4), SIZES, preempt=[0, 1, 2])
    with pytest.raises(PlanError, match="needs 4 instances, only 3 are alive"):
        next_epoch(cur, 4, range(4), SIZES, strategy=(2, 2), preempt=[1])
    with pytest.raises(PlanError, match="D=17 replicas exceed global_batch=16"):
        next_epoch(cur, 4, range(20), SIZES, strategy=(17, 1), global_batch=16)


# ----------------------------------------------------------------------------------------- schedule checks


def test_check_schedule_dry_run():
    epochs = check_schedule(CFG, TRAIN, 4, (2, 2), STEPS, group_events(parse_events(SCHEDULE)))
    kinds = [e.kind.value for e in epochs]
    assert kinds == ["start", "intra-stage", "inter-stage", "inter-stage", "pipeline", "pipeline", "pipeline"]
    assert [e.start_step for e in epochs] == [0, 2, 3, 4, 6, 8, 9]


@pytest.mark.parametrize(
    "workers, strategy, events, match",
    [
        (4, (3, 2), [], r"initial strategy: strategy 3x2 needs 6 instances, only 4 are alive"),
        (8, (1, 7), [], r"initial strategy: strategy 1x7: P=7 exceeds the model's 6 layers"),
        (4, (2, 2), [{"step": 3, "kind": "preempt", "instances": [1]}, {"step": 5, "kind": "plan", "strategy": [2, 2]}],
         r"event at step 5: strategy 2x2 needs 4 instances, only 3 are alive"),
        (4, (2, 2), [{"step": 3, "kind": "preempt", "instances": [9]}], r"step 3: cannot preempt workers \[9\]"),
        (4, (2, 2), [{"step": STEPS, "kind": "plan", "strategy": [1, 1]}], r"step 10: outside the job's boundaries"),
        (2, (1, 2), [{"step": 3, "kind": "kill", "instances": [0, 1]}], r"step 3: the kill leaves no instance"),
        (4, (2, 2), [{"step": 3, "kind": "kill", "instances": [1]}, {"step": 3, "kind": "preempt", "instances": [1]}],
         r"step 3: worker 1 is preempted twice"),
    ],
)  # fmt: skip
def test_run_job_rejects_impossible_jobs_before_anything_runs(tmp_path, workers, strategy, events, match):
    out = tmp_path / "job"
    with pytest.raises((ScheduleError, EventError), match=match):
        run_job(CFG, TRAIN, workers, strategy, STEPS, events, out)
    assert not out.exists()  # nothing started, nothing written


def test_run_job_refuses_an_out_dir_with_an_earlier_checkpoint(tmp_path):
    (tmp_path / "job" / "layers").mkdir(parents=True)
    (tmp_path / "job" / "layers" / "step00000003.stage0.pt").write_bytes(b"")
    with pytest.raises(ScheduleError, match="already holds files"):
        run_job(CFG, TRAIN, 2, (1, 2), 3, [], tmp_path / "job")


def test_run_job_rejects_an_unknown_model(tmp_path):
    with pytest.raises(UnknownModelError, match="unknown model 'huge-gpt'"):
        run_job("huge-gpt", TRAIN, 2, (1, 1), 3, [], tmp_path / "job")
    assert not (tmp_path / "job").exists()


# ------------------------------------------------------------------------------------------- coordinator


def _coordinator(tmp_path: Path, **kw) -> Coordinator:
    return coordinator(CFG, TRAIN, STEPS, str(tmp_path), **kw)


def test_a_coordinator_without_a_given_token_makes_one(tmp_path):
    c = _coordinator(tmp_path)
    assert len(c.token) >= 32
    w = Worker(WorkerSpec(7, "127.0.0.1", c.port, token=None, store_timeout_s=5))
    with pytest.raises(TokenError, match="requires a token and none was given"):
        w.join()


def test_boundary_is_decided_once(tmp_path):
    c = _coordinator(tmp_path)
    # a worker passed boundary 4 already: a late claim (a live notice) lands on the next free boundary
    assert c.store.compare_set("ctl/boundary/4", "", "train") == b"train"
    assert c.claim(4) == 5
    assert c.store.compare_set("ctl/boundary/5", "", "train") == b"hold"  # a worker reaching 5 now waits


def test_a_prepared_epoch_s_boundary_names_its_preparation_and_another_decision_does_not(tmp_path):
    """The boundary of a prepared epoch reads "epoch:{n}:{p}": its parties hold preparation p's epoch already and
    skip reading it (a round trip in the pause); an epoch that differs from what was prepared is named alone."""
    c = _coordinator(tmp_path)
    c.store.append("ctl/joined", "0,1,2,3,")  # as four workers registering would
    c.start((2, 2), [0, 1, 2, 3])
    prepared = c.prepare(4, (1, 2))
    assert prepared is not None and prepared.prepared == 1
    epoch = c.reconfigure(4, (1, 2))
    assert epoch == prepared
    assert c.store.get("ctl/boundary/4") == f"epoch:{epoch.number}:1".encode()
    assert c.prepare(6, (1, 4)) is not None
    other = c.reconfigure(6, (2, 2))  # not what was prepared
    assert other is not None and other.prepared is None
    assert c.store.get("ctl/boundary/6") == f"epoch:{other.number}".encode()


def test_a_pause_is_split_along_the_member_ready_last():
    """`critical_s`: consecutive parts ending at the last-ready member's milestones, clipped to the pause's start,
    summing to the pause; a joiner has no last step; a member without milestones gives no split."""
    start = 100.0
    arrive = {0: 100.0, 1: 100.004}  # old members' last step ends: 1 finished 4 ms after 0
    ready = {0: 100.006, 1: 100.010, 2: 100.009}
    at1 = {"boundary": 100.005, "ahead": 100.005, "hand_off": 100.0075, "groups": 100.008}
    got = Coordinator._critical(start, arrive, ready, {1: {"at": at1}})
    assert got["critical_worker"] == 1 and got["critical_joined"] is False
    parts = got["critical_s"]
    assert list(parts) == ["last_step", "reach", "ahead", "hand_off", "groups", "install"]
    assert [round(v * 1e4, 6) for v in parts.values()] == [40, 10, 0, 25, 5, 20]  # in 0.1 ms
    assert sum(parts.values()) == pytest.approx(ready[1] - start)
    # a joiner (no arrival) that was waiting at the boundary before the pause began: those parts are 0
    joiner = {"boundary": 99.8, "ahead": 100.007, "hand_off": 100.008, "groups": 100.0085}
    got = Coordinator._critical(start, arrive, {**ready, 2: 100.011}, {2: {"at": joiner}})
    assert got["critical_worker"] == 2 and got["critical_joined"] is True
    assert got["critical_s"]["last_step"] == 0 and got["critical_s"]["reach"] == 0
    assert got["critical_s"]["ahead"] == pytest.approx(0.007)
    assert sum(got["critical_s"].values()) == pytest.approx(0.011)
    # ready, but no milestones recorded (e.g. a first epoch): no split, still who was last
    assert Coordinator._critical(start, arrive, ready, {}) == {"critical_s": None, "critical_worker": 1,
                                                               "critical_joined": False}  # fmt: skip
    assert Coordinator._critical(start, arrive, {}, {})["critical_s"] is None  # nobody ready


def test_worker_with_a_wrong_or_missing_token_is_refused(tmp_path):
    c = _coordinator(tmp_path, token="s3cret")
    # in this process: no token at all
    w = Worker(WorkerSpec(7, "127.0.0.1", c.port, token=None, store_timeout_s=5))
    with pytest.raises(TokenError, match="requires a token and none was given"):
        w.join()
    # a spawned worker with the wrong token exits with EXIT_TOKEN; it cannot even write why into the sealed store
    p = mp.get_context("spawn").Process(target=process_main, args=(WorkerSpec(8, "127.0.0.1", c.port, "guess"),),
                                        name="parcae-worker-8", daemon=True)  # fmt: skip
    p.start()
    try:
        p.join(timeout=60)
        assert p.exitcode == EXIT_TOKEN
        assert c.message("rejected", 8) is None
        assert c.joined() == set()  # neither registered
    finally:
        if p.is_alive():
            p.kill()
            p.join()


# ------------------------------------------------------------------------------------------- equivalence


def test_migrated_job_trains_the_same_run_as_one_uninterrupted_process(tmp_path, capsys):
    ref_losses, ref_layers = uninterrupted(CFG, TRAIN, STEPS)

    t0 = time.monotonic()
    result = run_job(CFG, TRAIN, 4, (2, 2), STEPS, SCHEDULE, tmp_path / "job", timeout_s=80)
    wall = time.monotonic() - t0

    reconf = result["reconfigurations"]
    assert [r["kind"] for r in reconf] == ["intra-stage", "inter-stage", "inter-stage", "pipeline", "pipeline",
                                           "pipeline"]  # fmt: skip
    assert [r["step"] for r in reconf] == [2, 3, 4, 6, 8, 9]
    # each that comes two steps or more after the previous one was published a step ahead and its groups formed while
    # the old epoch trained (control.prepare's default); one a step after its predecessor has no step to prepare in
    assert [r["prepared"] for r in reconf] == [True, False, False, True, True, False]
    prepared = [e for e in result["events"] if e.get("event") == "prepare"]
    assert [e["step"] for e in prepared] == [2, 6, 8]
    assert all(r["steps_lost"] == 0 and r["notice"] and r["pause_s"] > r["hold_s"] >= 0 for r in reconf)
    assert all(r["spread_s"] >= 0 for r in reconf)  # every old member arrived: how far apart their last steps ended
    # where each pause went, along the member ready last: consecutive parts that add up to it
    for r in reconf:
        parts = r["critical_s"]
        assert list(parts) == ["last_step", "reach", "ahead", "hand_off", "groups", "install"]
        assert min(parts.values()) >= 0
        assert sum(parts.values()) == pytest.approx(r["pause_s"], abs=1e-9)
    assert reconf[0]["critical_joined"] is False  # an intra-stage migration: every new member is an old one
    assert [r["bytes_moved"] for r in reconf] == [r["bytes_planned"] for r in reconf]
    assert reconf[0]["bytes_moved"] == 0 and all(r["bytes_moved"] > 0 for r in reconf[1:])
    # a member keeps the modules of the layers it holds: it builds exactly the layers it receives, none again
    assert [sum(r["layers_built"].values()) for r in reconf] == [r["transfers"] for r in reconf]

    # nothing lost, nothing applied twice: same loss curve, same parameters and optimiser state
    assert result["loss"] == pytest.approx(ref_losses, rel=1e-5)
    shards = checkpoint.find_shards(result["layers"], STEPS)
    final = checkpoint.load(shards, config=CFG, job="job")
    assert final.layers.keys() == ref_layers.keys()
    for name, want in ref_layers.items():
        got = final.layers[name]
        assert got.keys() == want.keys(), name
        for key in want:
            assert torch.allclose(got[key], want[key], rtol=1e-5, atol=1e-9), f"{name} {key}"
    assert result["final_checksum"] == parameters_checksum(final.layers, layer_names(CFG))

    # the processes' lives: preempted workers handed off and exited 13, the added worker joined and trained
    assert result["exit_codes"] == {0: EXIT_PREEMPTED, 1: 0, 2: EXIT_PREEMPTED, 3: 0, 4: 0}
    assert result["states"][2] == ["JOINING@-", "STANDBY@-", "TRAINING@0", "MIGRATING@2", "TRAINING@2",
                                   "MIGRATING@3", "PREEMPTED@-"]  # fmt: skip
    assert result["states"][4][:4] == ["JOINING@-", "STANDBY@-", "MIGRATING@4", "TRAINING@4"]
    assert result["states"][4][-1] == "DONE@10"

    with capsys.disabled():
        print(f"\nmigration equivalence job: {wall:.1f} s wall")
        for r in reconf:
            print(
                f"  step {r['step']}: {r['kind']:<12} -> {r['strategy'][0]}x{r['strategy'][1]} "
                f"preempted={r['preempted']} pause={r['pause_s'] * 1e3:.0f} ms (hold {r['hold_s'] * 1e3:.0f} ms) "
                f"bytes={r['bytes_moved']} phases_ms={ {k: round(v * 1e3) for k, v in r['phases_s'].items()} } "
                f"layers={r['layers_built']} caught_up={r['layers_caught_up']}"
            )


def test_a_job_that_cannot_start_in_time_fails_cleanly(tmp_path):
    with pytest.raises(JobError, match="did not join within"):
        run_job(CFG, TRAIN, 2, (1, 2), 3, [], tmp_path / "job", timeout_s=0.5, start_method="spawn")  # cold
    # the autouse fixture checks that no worker process is left
