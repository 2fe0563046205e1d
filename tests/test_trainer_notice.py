"""Tests of preemption notices delivered the way clouds deliver them — a SIGTERM to the worker's process, with a grace
period — and of recovery from a death during a migration's hand-off.

A `Cloud` observer plays the cloud from outside the job: once the job has started it watches the coordinator's store
(as any client may) and signals a worker's process (its pid is in the store) when training reaches a given point, as
AWS's spot interruption watcher or GCP's preemption would. Nothing in the schedule announces these signals: the job
learns of them only from the workers. The jobs use "forkserver" workers (fast starts) and float64 (equivalence).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _jobs import coordinator, run_job
from _reference import uninterrupted
from _trainer_fixtures import Action, Cloud, Condition, _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)

from liveput.migration import MigrationKind
from trainer.config import TrainConfig, model_config
from trainer.control.driver import NOTICE_MARGIN_S, notice_margin_s
from trainer.control.planning import RulePlanner
from trainer.providers.local import LocalProcessProvider
from trainer.runtime import checkpoint
from trainer.runtime.migration import Epoch, Transfer, first_epoch, layer_sizes, next_epoch, plan_recovery
from trainer.runtime.model import layer_names, n_layers
from trainer.runtime.pipeline import parameters_checksum
from trainer.runtime.worker import EXIT_PREEMPTED, Notice

CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()
STEPS = 10


@pytest.fixture(autouse=True)
def _no_orphans_here(_no_orphans):
    yield


def reference(steps: int) -> tuple[list[float], dict, str]:
    """Losses, final layer states and parameter checksum of one uninterrupted process."""
    losses, layers = uninterrupted(CFG, TRAIN, steps)
    return losses, layers, parameters_checksum(layers, layer_names(CFG))


def assert_same_run(result: dict, steps: int = STEPS) -> None:
    """Every step once, the loss curve and final parameters and optimiser state of one uninterrupted process."""
    losses, layers, _ = reference(steps)
    assert result["loss"] == pytest.approx(losses, rel=1e-5)
    final = checkpoint.load(checkpoint.find_shards(result["layers"], steps), config=CFG, job="job")
    for name, want in layers.items():
        for key in want:
            assert torch.allclose(final.layers[name][key], want[key], rtol=1e-5, atol=1e-9), f"{name} {key}"


# ---------------------------------------------------------------------------------------------------- the cloud


def started(worker: int, step: int) -> Condition:
    """Worker `worker` has started step `step`."""
    key = f"ctl/at/{worker}"
    return lambda st: st.check([key]) and int(st.get(key)) >= step


def in_state(worker: int, state: str) -> Condition:
    """Worker `worker` has entered `state` (e.g. "MIGRATING@3")."""
    key = f"ctl/states/{worker}"
    return lambda st: st.check([key]) and f"{state};" in st.get(key).decode()


def noticed(worker: int) -> Condition:
    """Worker `worker` has reported its notice to the coordinator."""
    return lambda st: st.check([f"ctl/notice/{worker}"])


def send(worker: int, signum: int) -> Action:
    def act(st: dist.Store) -> None:
        os.kill(int(st.get(f"ctl/worker/{worker}")), signum)

    return act


def job(tmp_path, workers: int, strategy: tuple[int, int], events: list, cloud: Cloud, **kw: Any) -> dict:
    kw.setdefault("timeout_s", 60)
    result = run_job(CFG, TRAIN, workers, strategy, STEPS, events, tmp_path / "job", observer=cloud, **kw)  # fmt: skip
    cloud.finish()
    return result


# ------------------------------------------------------------------------------------ the parts, one by one


def test_a_sigterm_is_noted_without_io_and_wakes_the_waiting_thread():
    old_handler = signal.getsignal(signal.SIGTERM)
    notice = Notice()
    notice.install()
    try:
        assert notice.wait(0.01) is None  # nothing yet
        seen: list[float | None] = []
        t = threading.Thread(target=lambda: seen.append(notice.wait(5.0)))
        t.start()
        before = time.time()
        os.kill(os.getpid(), signal.SIGTERM)  # the process survives: the handler only notes the time
        t.join(timeout=10)
        assert seen and seen[0] is not None and before <= seen[0] <= time.time()
        assert notice.signalled_at is not None
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, old_handler)
        os.close(notice.read_fd)
        os.close(notice.write_fd)


def test_the_local_provider_gives_notice_by_sigterm_and_reclaims_at_the_deadline(tmp_path):
    c = coordinator(CFG, TRAIN, 5, str(tmp_path), notice_grace_s=120.0)
    provider = LocalProcessProvider(c.host, c.port, c.token, start_method="forkserver")
    try:
        assert provider.start_ids([3], next_id=1) == [3] and provider.start(1) == [4]  # ids go on after 3
        c.expect([3, 4])
        c.wait_joined([3, 4], 60)
        sent = time.time()
        provider.preempt([3], notice_s=30.0)  # the cloud's notice: SIGTERM now, SIGKILL in 30 s
        notices: dict[int, float] = {}
        end = time.monotonic() + 10
        while not notices and time.monotonic() < end:
            notices = c.new_notices()
            time.sleep(0.01)
        assert notices.keys() == {3}  # the worker reported it; its deadline is its signal time + the job's grace
        assert sent + 119.0 <= notices[3] <= time.time() + 120.0 and c.notice_at(3) >= sent - 1.0
        assert provider.alive() == {3, 4} and c.new_notices() == {}  # it keeps running; each notice is new once
        provider.preempt([4], notice_s=0.0, notify=False)  # a deadline alone (the notice came another way)
        provider.poll()
        assert provider.exitcode(4) == -signal.SIGKILL and [w for w, _ in provider.reclaimed] == [4]
        assert provider.signal([4], signal.SIGTERM) == []  # nothing left to signal
    finally:
        provider.stop()


def test_a_rolled_back_migration_is_replanned_from_its_base(tmp_path):
    """The coordinator's side of a death during a hand-off, without processes: worker 1 (the only holder of stage 1)
    is preempted with notice, worker 2 is to receive stage 1 and dies first. The migration is sealed uncommitted and
    the replacement is planned from epoch 1: worker 1 still sends its last copy, to the only survivor."""
    sizes = layer_sizes(CFG)
    c = coordinator(CFG, TRAIN, STEPS, str(tmp_path))
    c.store.append("ctl/joined", "0,1,2,")
    base = c.start((1, 2), [0, 1, 2])  # 0: stage 0, 1: stage 1, 2 stands by
    e = c.reconfigure(4, None, preempt=[1], noticed=[1])
    assert e.transfers == tuple(Transfer(i, 1, 2) for i in base.layers(1)) and e.base_number == 1
    assert not c.committed(e) and c.holders() == {0, 1, 2}
    assert c.declare_dead([2]) and c.epoch_broken()  # a receiver died: the migration is broken
    # ... but not epoch 1, where 0 and 1 may still be training: they find out at the boundary
    assert c.store.check(["ctl/e2/abort"]) and not c.store.check(["ctl/e1/abort"])
    assert not c.seal() and c.store.get("ctl/e2/decide/4") == b"abort"  # its first step can no longer apply
    assert c.reporters() == {0, 1}  # the holders of epoch 1's state
    c.store.set("ctl/e1/abandon/0", "4")  # worker 0 was still in epoch 1 at the boundary
    c.store.set("ctl/e2/abandon/1", "4")  # worker 1 was in the hand-off
    assert c.abandoned() == {0: 4, 1: 4}
    r = c.recover(4)
    assert (r.number, r.base_number, r.start_step, r.kind) == (3, 1, 4, MigrationKind.PIPELINE)
    assert (r.D, r.P, dict(r.assignment), r.preempted, r.previous) == (1, 1, {0: (0, 0)}, (1,), (0, 1))
    assert {t.src for t in r.transfers} == {1} and {t.layer for t in r.transfers} == set(base.layers(1))
    assert c.store.get("ctl/e1/next") == c.store.get("ctl/e2/next") == b"3"
    assert Epoch.from_json(r.to_json()) == r
    records = c.records()
    assert records[0]["abandoned"] and records[0]["source"] == "sigterm" and records[0]["noticed"] == [1]
    assert records[1]["source"] == "failure" and not records[1]["abandoned"] and not records[1]["notice"]
    # had the departing holder died too, stage 1 would have no live holder: only a checkpoint-restart can continue
    assert plan_recovery(base, 4, [0], [1, 2], sizes, number=3) is None
    # a migration that is not rolled back is numbered and based as before
    assert next_epoch(base, 4, [0, 1, 2], sizes, preempt=[1]).base is None
    assert first_epoch(1, 2, [0, 1], n_layers(CFG)).base_number == 0


# ------------------------------------------------------------------------------------------------- notices


def test_sigterm_to_the_last_holder_of_a_stage_hands_it_off_and_loses_nothing(tmp_path):
    # 1x2 on workers 0 (stage 0) and 1 (stage 1), worker 2 stands by; worker 1 gets a SIGTERM during step 3
    cloud = Cloud((started(0, 3), send(1, signal.SIGTERM)))
    result = job(tmp_path, 3, (1, 2), [], cloud)
    (r,) = result["reconfigurations"]
    assert (r["kind"], r["notice"], r["source"], r["preempted"], r["noticed"]) == (
        "inter-stage",
        True,
        "sigterm",
        [1],
        [1],
    )
    assert r["step"] >= 4 and r["steps_lost"] == 0 and not r["abandoned"]
    # the 30 s grace leaves steps to spare: the boundary is a step further, and its groups formed while training
    assert r["prepared"] and [e["step"] for e in result["events"] if e["event"] == "prepare"] == [r["step"]]
    assert r["bytes_moved"] == r["bytes_planned"] > 0  # worker 1 sent stage 1, its last copy, to worker 2
    assert r["notice_to_exit_s"] > 0
    assert result["exit_codes"] == {0: 0, 1: EXIT_PREEMPTED, 2: 0}
    assert result["states"][1][-2:] == [f"MIGRATING@{r['step']}", "PREEMPTED@-"]
    assert result["replicas"].keys() == {0, 2}
    assert [e["worker"] for e in result["events"] if e["event"] == "notice"] == [1]
    assert_same_run(result)
    assert result["final_checksum"] == reference(STEPS)[2]  # D = 1 throughout: bit for bit the same parameters


def test_a_scheduled_preemption_signals_the_worker_and_is_not_handled_twice(tmp_path):
    # the driver decides the schedule's preemption of worker 1 at step 3, then the provider gives it notice (SIGTERM):
    # the worker reports that notice like any other, and the driver knows it is already handled
    nothing: Action = lambda st: None  # noqa: E731
    cloud = Cloud((noticed(1), nothing))
    events = [{"step": 3, "kind": "preempt", "instances": [1]}]
    result = job(tmp_path, 3, (1, 2), events, cloud)
    (r,) = result["reconfigurations"]
    assert (r["step"], r["kind"], r["source"], r["preempted"], r["noticed"]) == (3, "inter-stage", "schedule", [1], [])
    assert [e for e in result["events"] if e["event"] in ("notice", "preempt-standby")] == []
    assert result["exit_codes"] == {0: 0, 1: EXIT_PREEMPTED, 2: 0}
    assert result["final_checksum"] == reference(STEPS)[2]


def test_sigterm_to_a_standby_instance_lets_it_leave_at_once(tmp_path):
    cloud = Cloud((started(0, 2), send(2, signal.SIGTERM)))
    result = job(tmp_path, 3, (1, 2), [], cloud)
    assert result["reconfigurations"] == []  # nothing to hand off, no boundary needed
    assert result["exit_codes"] == {0: 0, 1: 0, 2: EXIT_PREEMPTED}
    assert result["states"][2] == ["JOINING@-", "STANDBY@-", "PREEMPTED@-"]
    (left,) = [e for e in result["events"] if e["event"] == "preempt-standby"]
    assert left["workers"] == [2] and left["source"] == "sigterm"
    assert result["final_checksum"] == reference(STEPS)[2]


def test_sigterm_in_a_planned_job_trains_on_to_the_last_interval_boundary_before_its_deadline(tmp_path):
    # 2x2 on 0-3, the rule planner decides every 4 steps; worker 3 gets a SIGTERM during step 1 with 30 s of grace:
    # the boundaries before steps 4 and 8 both come long before its deadline, so it trains on through 4 (the plan
    # there told it leaves at the next) and its preemption is part of the decision at 8 (it used to leave at 4)
    cloud = Cloud((started(0, 1), send(3, signal.SIGTERM)))
    planner = NoticeTelling()
    result = job(tmp_path, 4, (2, 2), [], cloud, planner=planner, steps_per_interval=4, notice_grace_s=30)
    assert [(p["step"], p["alive"], p["decision"]) for p in result["plans"]] == [(4, 4, [2, 2]), (8, 3, [1, 2])]
    # what each interval was decided on: at 4, one instance leaves at the start of the next interval (a plan asked a
    # step ahead, before the driver had the notice, is asked again at the boundary with it)
    assert dict(planner.seen) == {1: (1,), 2: ()} and [i for i, _ in planner.seen] == sorted(i for i, _ in planner.seen)
    (r,) = result["reconfigurations"]
    assert (r["step"], r["source"], r["preempted"], r["noticed"], r["strategy"]) == (8, "sigterm", [3], [3], [1, 2])
    assert any(e["event"] == "notice-folded" and e["boundary"] == 4 for e in result["events"])
    assert result["exit_codes"][3] == EXIT_PREEMPTED
    assert r["steps_lost"] == 0
    assert_same_run(result)


class NoticeTelling(RulePlanner):
    """The rule planner, asking for two intervals of notices and keeping what each request held."""

    notices_ahead = 2

    def __init__(self) -> None:
        self.seen: list[tuple[int, tuple[int, ...]]] = []

    def __call__(self, req):
        self.seen.append((req.interval, req.noticed))
        return super().__call__(req)


def test_a_worker_that_overruns_its_deadline_is_killed_and_the_job_recovers(tmp_path):
    # worker 1 (the only holder of stage 1) gets a notice with 0.5 s of grace, then hangs (SIGSTOP) before it can
    # hand off: the provider kills it at the deadline — well before its heartbeat would time out (3 s) — and the job
    # restarts from the latest checkpoint (its layers had no other holder)
    cloud = Cloud((started(0, 4), send(1, signal.SIGTERM)), (noticed(1), send(1, signal.SIGSTOP)))
    result = job(tmp_path, 3, (1, 2), [], cloud, notice_grace_s=0.5, hb_timeout_s=3.0, checkpoint_every=2)
    assert result["exit_codes"][1] == -signal.SIGKILL
    (dead,) = [e for e in result["events"] if e["event"] == "dead"]
    assert dead["workers"] == [1] and "deadline" in dead["reason"]
    restart = result["reconfigurations"][-1]
    assert (restart["kind"], restart["notice"], restart["lost"]) == ("checkpoint-restart", False, [1])
    # any migration decided for the notice was rolled back: worker 1 never sent its layers
    assert all(r["abandoned"] for r in result["reconfigurations"][:-1])
    assert_same_run(result)


# ------------------------------------------------------------------------------------- death during a hand-off


@pytest.mark.parametrize(
    ("signum", "prepare"),
    [(signal.SIGKILL, False), (signal.SIGSTOP, False), (signal.SIGSTOP, True)],
    ids=["killed", "hung", "hung-prepared"],
)
def test_a_death_during_a_hand_off_rolls_the_migration_back_and_recovers_live(tmp_path, signum, prepare):
    # 1x2 on 0 and 1, workers 2 and 3 stand by; a plan at step 3 to 2x2 makes 2 and 3 fetch a stage each. Worker 3 is
    # killed (its exit is seen at once) or hangs (only its heartbeat tells, after 1 s) as soon as it starts migrating:
    # the transfer group cannot form (unprepared) or was formed ahead and its sends to worker 3 never complete
    # (prepared). Survivors give up when the coordinator flags the epoch — the job's 45 s timeout is shorter than the
    # group timeout (60 s) — and nothing of the migration is installed
    cloud = Cloud((in_state(3, "MIGRATING@3"), send(3, signum)))
    events = [{"step": 3, "kind": "plan", "strategy": [2, 2]}]
    result = job(tmp_path, 4, (1, 2), events, cloud, pg_timeout_s=60, timeout_s=45, hb_timeout_s=1.0,
                 prepare=prepare)  # fmt: skip
    rolled, recovery = result["reconfigurations"]
    assert (rolled["step"], rolled["strategy"], rolled["abandoned"], rolled["prepared"]) == (3, [2, 2], True, prepare)
    if not prepare:
        assert rolled["bytes_moved"] == 0  # no transfer completed
    assert rolled["bytes_moved"] < rolled["bytes_planned"]  # (prepared: worker 2's may have; it is discarded too)
    # planned from the state before the hand-off: 1x2 on 0 and 1 again (2x2 no longer fits), nothing to move
    assert (recovery["step"], recovery["kind"], recovery["source"]) == (3, "intra-stage", "failure")
    assert (recovery["strategy"], recovery["notice"], recovery["steps_lost"]) == ([1, 2], False, 0)
    (dead,) = [e for e in result["events"] if e["event"] == "dead"]
    assert dead["workers"] == [3] and dead["reason"].startswith(
        "its process was killed" if signum == signal.SIGKILL else "heartbeat lost: silent for more than the 1 s"
    )
    assert result["exit_codes"] == {0: 0, 1: 0, 2: 0, 3: -signal.SIGKILL}  # (a hung one is fenced: killed)
    if prepare:  # worker 0 may have entered the epoch (its groups were ready) before it broke: then it rolls back
        states = result["states"][0][3:7]
        assert states[0] == "MIGRATING@3" and "RECOVERING@3" in states[1:3], states
    else:
        assert result["states"][0][3:6] == ["MIGRATING@3", "RECOVERING@3", "MIGRATING@3"]
    assert_same_run(result)
    assert result["final_checksum"] == reference(STEPS)[2]


def test_a_notice_during_a_hand_off_lets_the_migration_finish_then_hands_the_noticed_layers_off(tmp_path):
    # 1x2 on 0 and 1, workers 2 and 3 stand by; a plan at step 3 to 2x2 makes 2 and 3 fetch a stage each. Worker 3
    # gets its spot notice (SIGTERM) as soon as it starts migrating: with grace to spare, the migration in flight
    # is not abandoned; at a later boundary worker 3 hands the stage it has just received off, live, and leaves
    cloud = Cloud((in_state(3, "MIGRATING@3"), send(3, signal.SIGTERM)))
    events = [{"step": 3, "kind": "plan", "strategy": [2, 2]}]
    result = job(tmp_path, 4, (1, 2), events, cloud, notice_grace_s=30.0)
    assert cloud.done == [0]
    planned, handoff = result["reconfigurations"]
    assert (planned["step"], planned["strategy"], planned["abandoned"]) == (3, [2, 2], False)
    assert planned["bytes_moved"] > 0  # the stages reached 2 and 3
    assert handoff["step"] > 3 and handoff["notice"] and handoff["source"] == "sigterm"
    assert handoff["preempted"] == [3] and handoff["steps_lost"] == 0 and handoff["strategy"] == [1, 2]
    assert not [e for e in result["events"] if e["event"] == "dead"]  # nobody died: it left when told
    assert result["exit_codes"][3] == EXIT_PREEMPTED and result["exit_codes"][0] == 0
    assert_same_run(result)


# ------------------------------------------------------------------------------------ the last instance goes silent


def test_the_last_instance_declared_dead_checkpoint_restarts_instead_of_failing(tmp_path):
    # one instance; its worker hangs (SIGSTOP: a stopped process is no evidence of life) at step 4: declared dead
    # at the heartbeat bound and fenced. No instance is left, but this one still exists: the job starts a fresh
    # worker on it from the latest checkpoint (step 4) instead of failing with "no instance survives"
    cloud = Cloud((started(0, 4), send(0, signal.SIGSTOP)))
    result = job(tmp_path, 1, (1, 1), [], cloud, hb_timeout_s=1.0, checkpoint_every=2)
    (dead,) = [e for e in result["events"] if e["event"] == "dead"]
    assert dead["workers"] == [0] and dead["reason"].startswith("heartbeat lost")
    assert [e["workers"] for e in result["events"] if e["event"] == "revive"] == [[0]]
    (restart,) = result["reconfigurations"]
    assert restart["kind"] == "checkpoint-restart" and restart["restore_step"] == 4
    assert result["exit_codes"] == {0: 0}
    assert_same_run(result)


def test_the_notice_margin_covers_two_steps_and_the_longest_hand_off_where_they_take_longer():
    """A noticed member must reach the boundary it leaves at this long before its deadline: small jobs keep the floor;
    a large model's (a GPT-1.5B step of 4 s, a hand-off of 10 s) leaves 18 s — with the floor alone, a boundary
    estimated a step late and a hand-off that outlasts the rest would have it killed mid-hand-off."""
    assert notice_margin_s(step_s=0.1, handoff_s=0.02) == NOTICE_MARGIN_S == 5.0
    assert notice_margin_s(step_s=4.0, handoff_s=10.0) == 18.0
    assert notice_margin_s(step_s=0.5, handoff_s=4.5) == pytest.approx(5.5)
    # a leaving folded into a boundary already keeps it on half the floor, or the hand-off's own need where longer
    assert notice_margin_s(step_s=0.1, handoff_s=0.02, folded=True) == NOTICE_MARGIN_S / 2
    assert notice_margin_s(step_s=0.5, handoff_s=2.0, folded=True) == 3.0
    assert notice_margin_s(step_s=4.0, handoff_s=10.0, folded=True) == 18.0
