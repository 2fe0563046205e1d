"""Tests of fault tolerance: preemptions without notice (kills), periodic checkpoints and checkpoint-restart, and the
key property — a job whose workers are SIGKILLed mid-step, or restarted from a checkpoint, still trains exactly the
run of one uninterrupted process (float64, rtol 1e-5), its lost steps recomputed.

The jobs use the "forkserver" start method (workers forked from a server that imported torch once, ~0.1 s instead
of ~2.5 s of CPU each), so that restarts and added instances do not dominate the suite's time; the benchmark
(`benchmarks/migration_pause.py`) measures restarts with cold "spawn" processes.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _jobs import coordinator, run_job
from _reference import uninterrupted
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)

from liveput.migration import MigrationKind
from trainer.config import TrainConfig, model_config
from trainer.control.dry_run import ScheduleError, check_schedule
from trainer.control.events import EventError, EventGroup, group_events, parse_events
from trainer.control.schedules import chaos_schedule
from trainer.runtime import checkpoint
from trainer.runtime.migration import Epoch, first_epoch, layer_sizes, plan_recovery, restart_epoch
from trainer.runtime.model import n_layers
from trainer.runtime.pipeline import EpochGroups, StageLayout, StepAbandoned, build_context, train_step
from trainer.runtime.worker import EXIT_PREEMPTED

CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()
SIZES = layer_sizes(CFG)
N = n_layers(CFG)


@pytest.fixture(autouse=True)
def _no_orphans_here(_no_orphans):
    yield


def reference(steps: int) -> tuple[list[float], dict]:
    return uninterrupted(CFG, TRAIN, steps)


def assert_same_run(result: dict, steps: int) -> None:
    """Same loss curve, same final parameters and optimiser state as one process; replicas of a stage identical."""
    ref_losses, ref_layers = reference(steps)
    assert result["loss"] == pytest.approx(ref_losses, rel=1e-5)
    final = checkpoint.load(checkpoint.find_shards(result["layers"], steps), config=CFG, job="job")
    for name, want in ref_layers.items():
        got = final.layers[name]
        assert got.keys() == want.keys(), name
        for key in want:
            assert torch.allclose(got[key], want[key], rtol=1e-5, atol=1e-9), f"{name} {key}"
    by_stage: dict[int, set[str]] = {}
    for r in result["replicas"].values():
        by_stage.setdefault(r["stage"], set()).add(r["digest"])
    assert all(len(d) == 1 for d in by_stage.values()), f"replicas diverged: {by_stage}"


# ---------------------------------------------------------------------------------------------------- events


def test_kill_and_checkpoint_restart_events():
    evs = parse_events([
        {"step": 3, "kind": "kill", "instances": [1]},
        {"step": 3, "kind": "preempt", "instances": [2], "notice": False},  # without notice: a kill
        {"step": 3, "kind": "preempt", "instances": [0]},
        {"step": 5, "kind": "checkpoint-restart", "strategy": [1, 2]},
        {"step": 6, "kind": "checkpoint-restart"},
    ])  # fmt: skip
    assert [e.kind for e in evs] == ["kill", "kill", "preempt", "checkpoint-restart", "checkpoint-restart"]
    assert parse_events([e.to_dict() for e in evs]) == evs
    groups = group_events(evs)
    assert groups[0] == EventGroup(3, preempt=(0,), kill=(1, 2))
    assert groups[1] == EventGroup(5, strategy=(1, 2), restart=True)
    assert groups[2] == EventGroup(6, restart=True)
    with pytest.raises(EventError, match="step 5: 2 plans"):
        group_events(parse_events([{"step": 5, "kind": "plan", "strategy": [1, 1]},
                                   {"step": 5, "kind": "checkpoint-restart"}]))  # fmt: skip


# ------------------------------------------------------------------------------------ all-or-nothing steps


def test_train_step_applies_nothing_unless_committed():
    ctx = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    train_step(ctx, 0)
    before = ctx.layer_states()
    with pytest.raises(StepAbandoned, match="commit was refused"):
        train_step(ctx, 1, commit=lambda: False)
    after = ctx.layer_states()
    for name in before:
        assert all(torch.equal(before[name][k], after[name][k]) for k in before[name]), name
    # redoing the step with a commit gives exactly the uninterrupted step
    ref = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
    assert [train_step(ref, s) for s in range(2)][1] == train_step(ctx, 1, commit=lambda: True)


def test_a_pending_op_is_abandoned_when_the_epoch_is_flagged():
    """A peer that is alive but silent (hung): the waiter gives up within ~check_s of the flag, not at the timeout."""
    store = dist.HashStore()
    groups: dict[int, dist.ProcessGroup] = {}

    def make(rank: int) -> None:
        groups[rank] = dist.ProcessGroupGloo(dist.PrefixStore("t", store), rank, 2, timedelta(seconds=20))

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    flag: dict[str, str] = {}
    g = EpochGroups(epoch=1, rank=0, world=groups[0], dp=None, abort=lambda: flag.get("abort"), check_s=0.01)
    threading.Timer(0.2, lambda: flag.__setitem__("abort", "worker 1 is dead")).start()
    t0 = time.monotonic()
    with pytest.raises(StepAbandoned, match="epoch 1 aborted: worker 1 is dead"):
        g.wait(groups[0].recv([torch.empty(3)], 1, 0))  # rank 1 never sends
    assert 0.2 <= time.monotonic() - t0 < 1.0
    g.abandon()
    with pytest.raises(StepAbandoned):  # an abandoned epoch's groups are never used again
        g.wait(groups[0].recv([torch.empty(3)], 1, 0))


# ---------------------------------------------------------------------------------------------- planning


def test_recovery_is_live_while_every_layer_has_a_survivor():
    cur = first_epoch(2, 2, range(5), N)  # workers 0,1 stage 0; 2,3 stage 1; 4 standby
    live = plan_recovery(cur, 3, range(5), [1], SIZES)
    assert live.kind is MigrationKind.INTER_STAGE and not live.notice and live.lost == (1,)
    assert live.assignment == {0: (0, 0), 4: (0, 1), 2: (1, 0), 3: (1, 1)} and live.previous == (0, 2, 3)
    assert {t.src for t in live.transfers} == {0}  # the dead worker is never a source
    shrink = plan_recovery(cur, 3, range(4), [1], SIZES)
    assert (shrink.D, shrink.P, shrink.kind) == (1, 2, MigrationKind.INTRA_STAGE)
    # both holders of stage 1 gone: only a checkpoint-restart can continue
    assert plan_recovery(cur, 3, range(5), [2, 3], SIZES) is None
    r = restart_epoch(cur, 2, [0, 1, 4], N, lost=[2, 3], steps_lost=1)
    assert r.kind is MigrationKind.CHECKPOINT_RESTART and (r.D, r.P) == (1, 2) and r.restore_step == 2
    assert r.assignment == {0: (0, 0), 1: (1, 0)} and not r.notice and r.steps_lost == 1
    assert Epoch.from_json(r.to_json()) == r


def test_check_schedule_plans_kills_like_the_coordinator():
    groups = group_events(parse_events([
        {"step": 2, "kind": "add", "workers": 1},
        {"step": 3, "kind": "kill", "instances": [1]},
        {"step": 5, "kind": "checkpoint-restart", "strategy": [1, 3]},
        {"step": 8, "kind": "kill", "instances": [2]},
    ]))  # fmt: skip
    epochs = check_schedule(CFG, TRAIN, 4, (2, 2), 10, groups)
    assert [(e.kind.value, e.notice) for e in epochs[1:]] == [
        ("inter-stage", False),
        ("checkpoint-restart", True),
        ("checkpoint-restart", False),
    ]
    with pytest.raises(ScheduleError, match=r"step 3: cannot kill workers \[7\]"):
        check_schedule(CFG, TRAIN, 4, (2, 2), 10, group_events(parse_events([{"step": 3, "kind": "kill",
                                                                              "instances": [7]}])))  # fmt: skip


# ------------------------------------------------------------------------------------- control plane


def test_latest_checkpoint_needs_every_stage_and_survives_restarts(tmp_path):
    ckdir = tmp_path / "c"
    c = coordinator(CFG, TRAIN, 10, str(tmp_path / "l"), checkpoint_dir=str(ckdir))
    c.store.append("ctl/joined", "0,1,")
    c.start((1, 2), [0, 1])  # epoch 1: P = 2
    assert c.latest_checkpoint() == 0  # nothing written: the initial weights
    c.store.append("ckpt/written", "3:1:0;3:1:1;6:1:0;")
    assert c.latest_checkpoint() == 3  # step 6 lacks stage 1
    ckdir.mkdir()
    for s, k in [(3, 0), (3, 1), (6, 0), (9, 1)]:
        checkpoint.shard_path(ckdir, s, k).write_bytes(b"x")
    c.store.append("ckpt/written", "6:1:1;")
    assert c.latest_checkpoint() == 6
    # a restart from 3 (say the files of 6 were unreadable) discards 6 and deletes every later file
    epoch = c.publish_restart(3, None, previous=[0, 1])
    assert epoch.kind is MigrationKind.CHECKPOINT_RESTART and epoch.number == 2 and epoch.start_step == 3
    assert c.latest_checkpoint() == 3
    assert sorted(p.name for p in ckdir.iterdir()) == ["step00000003.stage0.pt", "step00000003.stage1.pt"]
    c.store.append("ckpt/written", "6:2:0;6:2:1;")  # rewritten by the restarted epoch
    assert c.latest_checkpoint() == 6


def test_heartbeats_tell_a_dead_worker_from_one_that_ended(tmp_path):
    c = coordinator(CFG, TRAIN, 10, str(tmp_path), hb_timeout_s=0.3)
    c.expect([0, 1])
    for w in (0, 1):  # two registered workers, as `Worker.join` does
        c.store.add(f"hb/{w}", 1)
        c.store.add(f"ctl/joins/{w}", 1)
    c.wait_joined([0, 1], 1.0)
    c.store.set("ctl/final/1", "1")  # worker 1 ended normally; worker 0 falls silent
    deadline = time.monotonic() + 3
    stale: set[int] = set()
    while not stale and time.monotonic() < deadline:
        stale = c.check_heartbeats(every_s=0)
        time.sleep(0.05)
    assert stale == {0}
    c.start((1, 1), [0])
    assert c.declare_dead(stale) and "workers [0]" in c.epoch_broken()


# -------------------------------------------------------------------------------------------- end to end

# 2x2 on workers 0-3, then: an added worker (standby); a kill mid-step of a stage-0 replica (live: the standby
# fetches stage 0 from the survivor, inter-stage, no notice); an on-demand checkpoint-restart into 1x3; a kill of
# the only holder of stage 1 (checkpoint-restart from the periodic checkpoint of step 6: steps 6-7 recomputed).
FAULTS = [
    {"step": 2, "kind": "add", "workers": 1},
    {"step": 3, "kind": "kill", "instances": [1]},
    {"step": 5, "kind": "checkpoint-restart", "strategy": [1, 3]},
    {"step": 8, "kind": "kill", "instances": [2]},
]
FAULT_STEPS = 10


def test_kills_and_restarts_train_the_same_run_as_one_process(tmp_path, capsys):
    t0 = time.monotonic()
    result = run_job(CFG, TRAIN, 4, (2, 2), FAULT_STEPS, FAULTS, tmp_path / "job", checkpoint_every=3,
                     timeout_s=80)  # fmt: skip
    wall = time.monotonic() - t0
    reconf = result["reconfigurations"]
    assert [(r["kind"], r["notice"], r["step"], r["steps_lost"]) for r in reconf] == [
        ("inter-stage", False, 3, 0),
        ("checkpoint-restart", True, 5, 0),
        ("checkpoint-restart", False, 6, 2),
    ]
    assert [r["lost"] for r in reconf] == [[1], [], [2]]
    # what made each, as the cost model prices it: the standby 4 taking the killed worker's place is still a kill
    assert [(r["trigger"], r["joined"]) for r in reconf] == [("kill", [4]), ("planned", []), ("kill", [4])]
    assert [r["restore_step"] for r in reconf] == [None, 5, 6]
    assert reconf[0]["bytes_moved"] == reconf[0]["bytes_planned"] > 0  # the survivor sent stage 0 to worker 4
    assert reconf[1]["bytes_moved"] > 0 and reconf[2]["bytes_moved"] > 0  # loaded from the checkpoints
    # detection is bounded by the heartbeat timeout (1 s) plus polling
    assert all(0 < r["detect_s"] < 3 for r in reconf if not r["notice"])
    assert_same_run(result, FAULT_STEPS)
    # periodic checkpoints at 3, 6, 9 (the restart from 6 deleted the abandoned run's later files, then rewrote 9)
    ckpts = sorted(p.name for p in (tmp_path / "job" / "checkpoints").iterdir())
    assert "step00000003.stage0.pt" in ckpts and "step00000006.stage2.pt" in ckpts
    assert len(checkpoint.find_shards(tmp_path / "job" / "checkpoints", 9)) == 3 and result["latest_checkpoint"] == 9
    # the killed processes died by SIGKILL; survivors restarted (exit 125) and their successors finished
    assert result["exit_codes"][1] == result["exit_codes"][2] == -9
    assert result["states"][0].count("RESTARTING@-") == 2 and result["states"][1][-1] == "TRAINING@0"
    assert "RECOVERING@3" in result["states"][0]
    with capsys.disabled():
        print(f"\nfault job: {wall:.1f} s wall")
        for r in reconf:
            print(
                f"  step {r['step']}: {r['kind']:<18} notice={r['notice']!s:<5} lost={r['lost']} "
                f"pause={r['pause_s'] * 1e3:.0f} ms detect={r['detect_s'] or 0:.2f} s steps_lost={r['steps_lost']}"
            )


@pytest.mark.parametrize("seed", [1, 3])
def test_chaos_thirty_random_events_end_in_the_uninterrupted_model(tmp_path, capsys, seed):
    """30 seeded events (plans, notices, kills, additions) on 4-5 worker processes, 26 steps: ~10-15 s each with
    forkserver workers (~50-65 s with cold spawned ones, mostly process start-up on 2 cores)."""
    steps = 26
    sched = chaos_schedule(4, steps, 30, seed=seed, model=CFG, train=TRAIN)
    counts = sched.counts()
    assert sum(counts.values()) == 30 and all(counts.get(k, 0) >= 3 for k in ("plan", "preempt", "kill", "add"))
    t0 = time.monotonic()
    result = run_job(CFG, TRAIN, sched.workers, sched.strategy, steps, sched.events, tmp_path / "job",
                     checkpoint_every=4, timeout_s=85)  # fmt: skip
    wall = time.monotonic() - t0
    assert_same_run(result, steps)
    kinds = {r["kind"] for r in result["reconfigurations"]}
    assert {"intra-stage", "inter-stage", "pipeline"} <= kinds
    assert any(not r["notice"] for r in result["reconfigurations"])
    killed = [w for e in sched.events if e["kind"] == "kill" for w in e["instances"]]
    assert all(result["exit_codes"][w] == -9 for w in killed)
    assert all(result["exit_codes"][w] in (EXIT_PREEMPTED, -9) for e in sched.events if e["kind"] == "preempt"
               for w in e["instances"])  # fmt: skip
    with capsys.disabled():
        lost = sum(r["steps_lost"] for r in result["reconfigurations"])
        print(
            f"\nchaos job (seed {seed}): {counts} -> {len(result['reconfigurations'])} reconfigurations, "
            f"{lost} steps recomputed, {wall:.1f} s wall"
        )


def test_an_instance_reclaimed_before_it_joins_is_left_out(tmp_path, monkeypatch):
    """An added instance whose process is killed from outside before its worker registers (a spot instance taken
    back while it boots) is dropped at its add: the job goes on without it instead of waiting until its timeout."""
    import trainer.control.run

    class ReclaimedWhileBooting(trainer.control.run.LocalProcessProvider):
        def _spawn(self, w: int) -> None:
            super()._spawn(w)
            if w == 2:
                self.procs[w].kill()  # long before the new process has imported torch and registered

    monkeypatch.setattr(trainer.control.run, "LocalProcessProvider", ReclaimedWhileBooting)
    steps = 6
    events = [{"step": 3, "kind": "add", "workers": 1}, {"step": 3, "kind": "plan", "strategy": [3, 1]}]
    # (a job that waited for it to join would fail at its timeout)
    result = run_job(CFG, TRAIN, 2, (2, 1), steps, events, tmp_path / "job", timeout_s=120)  # fmt: skip
    log = result["events"]
    assert {"event": "lost-before-join", "workers": [2]} in log
    dropped = [e for e in log if e["event"] == "plan-dropped"]
    assert len(dropped) == 1 and dropped[0]["strategy"] == [3, 1] and "only 2 are alive" in dropped[0]["reason"]
    assert result["exit_codes"] == {0: 0, 1: 0, 2: -9}
    assert dropped[0]["instead"] is None and result["reconfigurations"] == []  # 2x1 goes on as it was
    assert_same_run(result, steps)


# ------------------------------------------------------------------------------------- the coordinator's network


def test_the_coordinator_s_host_losing_its_network_for_seconds_loses_nothing(tmp_path, monkeypatch):
    """Every worker reaches the coordinator's store through a relay (`_partition.Partition`); once step 3 has
    trained, the relay holds every byte for 4 s, as when the coordinator's host drops off the network (below the
    10 s heartbeat timeout). The workers wait it out: nobody is declared dead, nothing is recovered or replanned,
    and the run is the uninterrupted one."""
    from _partition import Partition
    from _trainer_fixtures import Cloud, started

    import trainer.control.run as run_module
    from trainer.observe.observer import JobObserver, ObserverList
    from trainer.providers.local import LocalProcessProvider

    relays: list[Partition] = []

    class BehindARelay(LocalProcessProvider):
        def __init__(self, host: str, port: int, *args, **kw) -> None:
            relays.append(Partition(host, port))
            super().__init__("127.0.0.1", relays[-1].port, *args, **kw)

    monkeypatch.setattr(run_module, "LocalProcessProvider", BehindARelay)

    class StepTimes(JobObserver):
        def __init__(self) -> None:
            self.at: list[float] = []

        def on_step(self, step: Any) -> None:
            self.at.append(time.monotonic())

    steps = 12
    cloud, times = Cloud((started(4, range(3)), lambda st: relays[0].silence(4.0))), StepTimes()
    try:
        result = run_job(CFG, TRAIN, 3, (1, 2), steps, [], tmp_path / "job",
                         observer=ObserverList([cloud, times]), timeout_s=120)  # fmt: skip
        cloud.finish()
    finally:
        for r in relays:
            r.close()
    assert cloud.done == [0] and relays[0].connections >= 3 and relays[0].held_s >= 4.0
    assert not [e for e in result["events"] if e.get("event") in ("dead", "recover", "checkpoint-restart")]
    assert result["reconfigurations"] == [] and set(result["exit_codes"].values()) == {0}
    assert max(b - a for a, b in zip(times.at, times.at[1:])) > 3.5  # training did wait for the network
    assert_same_run(result, steps)


@pytest.mark.parametrize("then", ["checkpoint-restart", "plan"])
def test_a_kill_after_its_step_was_applied_then_an_event_at_the_next_boundary(tmp_path, monkeypatch, then):
    """Regression: a kill that lands once its step is applied finds the survivors holding at the next boundary (held
    after every kill); their recovery epoch then begins at that boundary and cannot commit before it is decided. When
    the schedule has an event there, the driver waited for that commit and the job hung (a CI run under load)."""
    from trainer.control import driver as driver_module

    late = driver_module.Driver._kill

    def kill_after_the_step(self, step, victims):
        self.wait(lambda: self.coord.applied(step), f"step {step} to be applied")
        late(self, step, victims)

    monkeypatch.setattr(driver_module.Driver, "_kill", kill_after_the_step)
    steps = 8
    event = ({"step": 4, "kind": "checkpoint-restart", "strategy": [1, 2]} if then == "checkpoint-restart"
             else {"step": 4, "kind": "plan", "strategy": [1, 2]})  # fmt: skip
    result = run_job(CFG, TRAIN, 3, (3, 1), steps, [{"step": 3, "kind": "kill", "instances": [2]}, event],
                     tmp_path / "job", timeout_s=60)  # fmt: skip
    reconf = result["reconfigurations"]
    assert [(r["kind"], r["step"], r["lost"]) for r in reconf][0] == ("intra-stage", 4, [2])  # recovered at 4
    assert reconf[1]["kind"] == ("checkpoint-restart" if then == "checkpoint-restart" else "pipeline")
    assert reconf[1]["step"] == 4 and reconf[1]["notice"] and reconf[1]["lost"] == []  # the kill was counted once
    assert_same_run(result, steps)


def test_a_kill_while_a_reconfiguration_is_prepared_abandons_the_preparation(tmp_path, monkeypatch):
    """A spot instance reclaimed without notice right after the next epoch was published as a preparation (its
    groups forming while the old epoch trains, the dead instance among its members): the recovery overtakes it, the
    preparation is never used, the scheduled plan is decided on top of the recovery, and the run is the uninterrupted
    one (issue 16: a prepared epoch that is overtaken is abandoned cleanly)."""
    from trainer.control import driver as driver_module

    prepare_ahead = driver_module.Driver.prepare_ahead
    killed: list[int] = []

    def prepare_then_reclaim(self, g, added):
        prepare_ahead(self, g, added)
        if not killed and self.coord.log[-1]["event"] == "prepare":
            killed.append(3)
            self.provider.procs[3].kill()  # from outside the job, as a reclaim without notice

    monkeypatch.setattr(driver_module.Driver, "prepare_ahead", prepare_then_reclaim)
    steps = 9
    result = run_job(CFG, TRAIN, 4, (2, 2), steps, [{"step": 5, "kind": "plan", "strategy": [1, 2]}],
                     tmp_path / "job", timeout_s=60)  # fmt: skip
    assert killed == [3] and result["exit_codes"][3] == -9
    log = result["events"]
    prepared = [e for e in log if e["event"] == "prepare"]
    assert [(e["step"], e["strategy"]) for e in prepared] == [(5, [1, 2])]
    used = {e.get("prepared") for e in log if e["event"] == "reconfigure"}
    assert prepared[0]["preparation"] not in used  # overtaken: its groups were left unused
    reconf = result["reconfigurations"]
    recovery = [r for r in reconf if r["source"] == "failure"]
    assert len(recovery) == 1 and recovery[0]["lost"] == [3] and not recovery[0]["prepared"], reconf
    assert recovery[0]["step"] <= 5 and all(not r["prepared"] for r in reconf)
    assert_same_run(result, steps)
