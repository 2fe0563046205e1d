"""Tests of trainer.providers.local: the local process provider (start, kill, preempt with notice, heartbeat-detected
death), trace-driven schedules (p3 scaled to the local workers, seeded notices and kills) and a trace-driven job
through `trainer.control.run.train`, the function a `parcae train` command wires."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from _jobs import coordinator, train
from _reference import uninterrupted_losses
from _trainer_fixtures import _no_orphans  # noqa: F401  (autouse fixture)

from trainer.config import TrainConfig, model_config
from trainer.control.dry_run import check_schedule
from trainer.control.events import group_events, parse_events
from trainer.control.run import peak_instances
from trainer.control.schedules import LocalTraceProvider, trace_events, trace_schedule, trace_strategy
from trainer.providers.local import LocalProcessProvider

CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()


@pytest.fixture(autouse=True)
def _no_orphans_here(_no_orphans):
    yield


def test_trace_schedule_is_seeded_scaled_and_runnable():
    s = trace_schedule("p3", 4, 30, 1, seed=0, start_interval=400)
    assert (s.workers, s.strategy) == (4, (2, 2))
    assert s.events == [
        {"step": 5, "kind": "preempt", "instances": [3], "notice": True},
        {"step": 5, "kind": "plan", "strategy": [1, 2]},
        {"step": 9, "kind": "kill", "instances": [1]},
        {"step": 17, "kind": "add", "workers": 1},
    ]
    assert trace_schedule("p3", 4, 30, 1, seed=0, start_interval=400) == s  # deterministic
    other = trace_schedule("p3", 4, 30, 1, seed=2, start_interval=400)
    assert other.events[0] == {"step": 5, "kind": "kill", "instances": [0]}  # the seed picks victims and notices
    assert trace_events("p3", 4, 30, 1, seed=0, start_interval=400) == s.events
    # twice the steps per interval: the same changes, twice as far apart; the job's end cuts the trace
    s2 = trace_schedule("p3", 4, 30, 2, seed=0, start_interval=400)
    assert [e["step"] for e in s2.events] == [10, 10, 18] and s2.intervals == 14
    for sched in (s, other, s2):
        check_schedule(CFG, TRAIN, sched.workers, sched.strategy, 30, group_events(parse_events(sched.events)))
    assert peak_instances(4, group_events(parse_events(s.events))) == 4
    # all notices or none
    assert all(e["kind"] != "kill" for e in trace_events("p3", 4, 30, 1, start_interval=400, kill_fraction=0))
    assert all(e["kind"] != "preempt" for e in trace_events("p3", 4, 30, 1, start_interval=400, kill_fraction=1))
    with pytest.raises(ValueError, match="steps_per_interval"):
        trace_schedule("p3", 4, 30, 0)
    with pytest.raises(ValueError, match="start_interval"):
        trace_schedule("p3", 4, 30, 1, start_interval=10_000)


def test_trace_provider_compresses_time_into_steps():
    p = LocalTraceProvider("p3", workers=4, interval_seconds=0.5, seed=0, start_interval=400)
    assert p.steps_per_interval(0.1) == 5 and p.steps_per_interval(2.0) == 1
    assert p.schedule(30, step_seconds=0.5).events == trace_events("p3", 4, 30, 1, seed=0, start_interval=400)
    assert trace_strategy(1) == (1, 1) and trace_strategy(5) == (2, 2) and trace_strategy(40) == (16, 2)


def test_local_provider_kill_preempt_and_heartbeat_detection(tmp_path):
    c = coordinator(CFG, TRAIN, 5, str(tmp_path), hb_timeout_s=0.5)
    provider = LocalProcessProvider(c.host, c.port, c.token, start_method="forkserver")
    try:
        ids = provider.start(2)
        assert ids == [0, 1] and provider.start(0) == []
        c.expect(ids)
        c.wait_joined(ids, 60)
        assert provider.alive() == {0, 1} and c.check_heartbeats(every_s=0) == set()
        t0 = time.monotonic()
        provider.kill([0])
        assert provider.exitcode(0) == -9 and provider.alive() == {1}
        stale: set[int] = set()
        while not stale and time.monotonic() - t0 < 5:
            stale = c.check_heartbeats(every_s=0)
            time.sleep(0.02)
        assert stale == {0} and 0.5 <= time.monotonic() - t0 < 2.0  # bounded by the heartbeat timeout
        c.stop_monitoring([0])  # (the driver would declare it dead)
        # a hung worker (SIGSTOP, like a partitioned host) falls silent the same way
        os.kill(provider.pid(1), signal.SIGSTOP)
        t0, stale = time.monotonic(), set()
        while not stale and time.monotonic() - t0 < 5:
            stale = c.check_heartbeats(every_s=0)
            time.sleep(0.02)
        assert stale == {1}
        provider.preempt([1], notice_s=0.3)  # nothing tells a standby worker to leave: the notice expires
        time.sleep(0.4)
        assert provider.alive() == set() and provider.exitcode(1) == -9
    finally:
        provider.stop()


def test_train_from_a_trace_writes_the_cli_report(tmp_path):
    steps = 20
    report = train(4, model=CFG, steps=steps, trace="p3", interval_seconds=0.1, step_seconds=0.1, seed=0,
                   start_interval=400, out_dir=tmp_path / "job", json_out=tmp_path / "out.json", checkpoint_every=5,
                   timeout_s=80)  # fmt: skip
    assert json.loads((tmp_path / "out.json").read_text()) == report
    assert set(report) == {"loss", "first_step", "resumed_from", "throughput", "reconfigurations", "plans",
                           "final_checksum", "wall_s"}  # fmt: skip
    assert report["first_step"] == 0 and report["resumed_from"] is None and report["plans"] == []
    assert report["loss"] == pytest.approx(uninterrupted_losses(CFG, TRAIN, steps), rel=1e-5)
    kinds = [(r["kind"], r["notice"], r["step"]) for r in report["reconfigurations"]]
    # the plan at 5 left worker 1 standing by, so its kill at 9 changes nothing; the add at 17 stands by too
    assert kinds == [("intra-stage", True, 5)]
    assert all({"pause_s", "bytes_moved", "steps_lost"} <= r.keys() for r in report["reconfigurations"])
    assert report["throughput"]["steps_per_s"] > 0 and len(report["final_checksum"]) == 64
