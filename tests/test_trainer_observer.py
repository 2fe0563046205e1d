"""Tests of job observers (`trainer.observe.observer`) as the driver (`trainer.control.run`) calls them on a real job:
every committed step once and in order (the steps a checkpoint-restart recomputes again, after its record), every
reconfiguration once when its record is complete, every complete checkpoint, then `on_end` — and an observer that raises
never fails the job, while an interrupt stops it and is reported to the others (`on_error`) before it propagates."""

from __future__ import annotations

import logging

import pytest
from _jobs import run_job
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)

from trainer.config import TrainConfig, model_config
from trainer.control.driver import JobError
from trainer.observe.observer import JobObserver, ObserverList, RecordingObserver, StepInfo

CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()
STEPS = 10

# 2x2 on workers 0-3; a plan to 1x2 at 2 (intra-stage: 1 and 3 stand by); an added instance at 3 (stands by); a
# preemption with notice of worker 0 at 4 (inter-stage: worker 1 takes stage 0 from it); a kill of worker 2, the only
# holder of stage 1, during step 7 (checkpoint-restart from the checkpoint of step 6: step 6 is recomputed).
EVENTS = [
    {"step": 2, "kind": "plan", "strategy": [1, 2]},
    {"step": 3, "kind": "add", "workers": 1},
    {"step": 4, "kind": "preempt", "instances": [0]},
    {"step": 7, "kind": "kill", "instances": [2]},
]


@pytest.fixture(autouse=True)
def _no_orphans_here(_no_orphans):
    yield


class Raising(JobObserver):
    """An observer with a bug in one hook."""

    def __init__(self, hook: str) -> None:
        self.hook = hook
        self.calls = 0

    def _call(self, hook: str) -> None:
        if hook == self.hook:
            self.calls += 1
            raise RuntimeError(f"observer bug in {hook}")

    def on_start(self, info):
        self._call("on_start")

    def on_step(self, step):
        self._call("on_step")


def test_an_observer_sees_every_step_reconfiguration_and_checkpoint_once(tmp_path, caplog):
    rec = RecordingObserver()
    bad_start, bad_step = Raising("on_start"), Raising("on_step")
    with caplog.at_level(logging.ERROR, logger="trainer.observe.observer"):
        result = run_job(CFG, TRAIN, 4, (2, 2), STEPS, EVENTS, tmp_path / "job", checkpoint_every=3,
                         observer=ObserverList([bad_start, bad_step, rec]), timeout_s=90)  # fmt: skip
    # the raising observers were called once each, logged and dropped; the job and the others went on
    assert bad_start.calls == 1 and bad_step.calls == 1
    assert sum("is dropped for the rest of the job" in r.getMessage() for r in caplog.records) == 2

    hooks = [h for h, _ in rec.calls]
    assert hooks[0] == "start" and hooks[-1] == "end" and "error" not in hooks
    info = rec.calls[0][1]
    assert {k: info[k] for k in ("job", "model", "workers", "strategy", "steps", "global_batch", "resumed_from")} == {
        "job": "job", "model": "tiny-gpt", "workers": 4, "strategy": (2, 2), "steps": STEPS, "global_batch": 16,
        "resumed_from": None}  # fmt: skip
    assert info["checkpoint_dir"] == str(tmp_path / "job" / "checkpoints")
    assert rec.calls[-1][1] is result

    # every reconfiguration once, in order, with its final record
    records = rec.of("reconfiguration")
    assert records == result["reconfigurations"]
    assert [r["trigger"] for r in records] == ["planned", "notice", "kill"]
    assert [(r["kind"], r["notice"], r["step"]) for r in records] == [
        ("intra-stage", True, 2),
        ("inter-stage", True, 4),
        ("checkpoint-restart", False, 6),
    ]
    restore = records[2]["restore_step"]
    assert restore == 6 and records[2]["steps_lost"] >= 1

    # every committed step once in order; those the restart recomputes again, after its record
    steps: list[StepInfo] = rec.of("step")
    seq = [s.step for s in steps]
    drop = next(i for i in range(1, len(seq)) if seq[i] <= seq[i - 1])
    before, after = seq[:drop], seq[drop:]
    assert before == list(range(len(before))) and len(before) >= restore + records[2]["steps_lost"]
    assert after == list(range(restore, STEPS))
    restart_at = next(i for i, (h, a) in enumerate(rec.calls) if h == "reconfiguration" and a["epoch"] == 4)
    step_calls = [i for i, (h, _) in enumerate(rec.calls) if h == "step"]
    assert step_calls[drop - 1] < restart_at < step_calls[drop]
    # a live migration's record comes after the steps before its boundary, before the steps from it
    for r in records[:2]:
        at = next(i for i, (h, a) in enumerate(rec.calls) if h == "reconfiguration" and a["epoch"] == r["epoch"])
        assert step_calls[r["step"] - 1] < at < step_calls[r["step"]]
    # losses and strategies as the job trained them
    assert [s.loss for s in steps[drop:]] == result["loss"][restore:]
    assert [s.loss for s in steps[:drop]] == pytest.approx(result["loss"][: len(before)], rel=1e-12)
    assert [s.strategy for s in steps[:drop]] == [(2, 2)] * 2 + [(1, 2)] * (len(before) - 2)
    assert all(s.strategy == (1, 2) for s in steps[drop:])
    # the instances alive while each step trained (not when it was reported): 4, the added one from step 3, worker
    # 0 gone from step 4; the steps the restart redoes, without the killed worker 2
    alive_then = {0: 4, 1: 4, 2: 4, 3: 5, 4: 4, 5: 4, 6: 4, 7: 4}
    assert [s.alive for s in steps[:drop]] == [alive_then[s.step] for s in steps[:drop]]
    assert all(s.alive == 3 for s in steps[drop:])

    # the periodic checkpoints (the restart rewinds to 6 and writes 9 anew)
    assert rec.of("checkpoint") == [(3, tmp_path / "job" / "checkpoints"), (6, tmp_path / "job" / "checkpoints"),
                                    (9, tmp_path / "job" / "checkpoints")]  # fmt: skip


class Interrupt(JobObserver):
    def on_step(self, step):
        if step.step == 1:
            raise KeyboardInterrupt


def test_an_interrupt_stops_the_job_and_is_reported(tmp_path):
    rec = RecordingObserver()
    with pytest.raises(KeyboardInterrupt):
        run_job(CFG, TRAIN, 2, (1, 2), 40, [], tmp_path / "job", observer=ObserverList([Interrupt(), rec]),
                timeout_s=60)  # fmt: skip
    hooks = [h for h, _ in rec.calls]
    assert hooks[0] == "start" and hooks[-1] == "error" and "end" not in hooks
    assert isinstance(rec.calls[-1][1], KeyboardInterrupt)
    assert [s.step for s in rec.of("step")] == [0]  # the interrupt came in the middle of delivering step 1


def test_a_failed_job_is_reported_to_the_observer(tmp_path):
    rec = RecordingObserver()
    with pytest.raises(JobError, match="timed out"):
        run_job(CFG, TRAIN, 2, (1, 2), 200, [], tmp_path / "job", observer=rec, timeout_s=1.0)  # fmt: skip
    hooks = [h for h, _ in rec.calls]
    assert hooks[-1] == "error" and "end" not in hooks
    assert isinstance(rec.calls[-1][1], JobError) and "timed out" in str(rec.calls[-1][1])
