"""`parcae.progress.TrainProgress`: what a user sees while `parcae train` runs, fed a synthetic job's hook calls."""

from __future__ import annotations

import io
import json
import re

import pytest
from _trainer_fixtures import warm_starts  # noqa: F401  (a fixture)
from rich.console import Console

from parcae.progress import TrainProgress, format_reconfiguration, migration_label
from trainer.observe.observer import JobObserver, ObserverList, StepInfo

START = {"job": "job", "model": "tiny-gpt", "workers": 4, "strategy": [2, 2], "steps": 10, "global_batch": 16,
         "checkpoint_dir": "ckpt", "resumed_from": None}  # fmt: skip
PIPELINE = {"epoch": 2, "kind": "pipeline", "trigger": "planned", "notice": True, "step": 4, "strategy": [1, 4],
            "preempted": [], "lost": [], "pause_s": 0.1534, "hold_s": 0.0, "detect_s": None,
            "bytes_moved": 1_234_567, "steps_lost": 0, "restore_step": None}  # fmt: skip
KILL = {**PIPELINE, "epoch": 3, "kind": "inter-stage", "trigger": "kill", "notice": False, "step": 7,
        "strategy": [1, 3], "lost": [2], "pause_s": 1.42, "detect_s": 1.05, "bytes_moved": 0}  # fmt: skip
RESTART = {**PIPELINE, "epoch": 4, "kind": "checkpoint-restart", "trigger": "kill", "notice": False, "step": 8,
           "strategy": [1, 2], "lost": [0, 1], "pause_s": 4.2, "steps_lost": 3, "restore_step": 5}  # fmt: skip
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def feed(progress: JobObserver) -> None:
    """A 10-step job: 2x2 on 4 instances, a pipeline migration at step 4, a kill recovered live at step 7."""
    progress.on_start(START)
    t = 1000.0
    for s in range(10):
        if s == 4:
            progress.on_reconfiguration(PIPELINE)
        if s == 7:
            progress.on_reconfiguration(KILL)
        strategy, alive = ((2, 2), 4) if s < 4 else ((1, 4), 4) if s < 7 else ((1, 3), 3)
        progress.on_step(StepInfo(step=s, loss=4.5 - 0.1 * s, strategy=strategy, alive=alive, time=t + s))
    progress.on_end({"loss": [4.5 - 0.1 * s for s in range(10)]})


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=200, highlight=False, color_system=None), buf


def test_terminal_shows_a_bar_with_steps_loss_strategy_alive_and_last_migration():
    con, buf = console(True)
    progress = TrainProgress(con)
    assert progress.live
    feed(progress)
    text = ANSI.sub("", buf.getvalue())
    final = [line for line in text.splitlines() if "10/10" in line]
    assert final, text
    bar = final[-1]
    for want in ("10/10 steps", "loss 3.6000", " 1x3 ", "3 alive", "last: inter-stage (kill)"):
        assert want in bar, (want, bar)
    # the reconfiguration lines were printed above the bar, and the bar stayed (not transient)
    assert format_reconfiguration(PIPELINE) in text and format_reconfiguration(KILL) in text
    assert progress._progress is None and progress.reconfigurations == 2


def test_no_terminal_prints_a_line_per_reconfiguration_and_progress_every_30_s_and_no_bar():
    con, buf = console(False)
    progress = TrainProgress(con, log_every_s=3.0)  # the steps come a second apart: a line every third
    assert not progress.live
    feed(progress)
    text = buf.getvalue()
    assert "\x1b" not in text
    assert text.splitlines() == [
        "step 1/10: loss 4.5000, 2x2, 4 alive", "step 4/10: loss 4.2000, 2x2, 4 alive, 16.0 samples/s",
        format_reconfiguration(PIPELINE), "step 7/10: loss 3.9000, 1x4, 4 alive, 16.0 samples/s",
        format_reconfiguration(KILL), "step 10/10: loss 3.6000, 1x3, 3 alive, 16.0 samples/s",
    ]  # fmt: skip
    # the state is still tracked (the CLI could print it), only not drawn
    state = (progress.steps_done, progress.loss, progress.strategy, progress.alive)
    assert state == (10, pytest.approx(3.6), (1, 3), 3)


def test_reconfiguration_lines_say_what_happened():
    assert format_reconfiguration(PIPELINE) == "step 4: pipeline -> 1x4, planned, pause 0.153 s, 1.23 MB moved"
    kill = "step 7: inter-stage -> 1x3, kill (lost 2), pause 1.420 s, 0.00 MB moved"
    assert format_reconfiguration(KILL) == kill
    line = format_reconfiguration(RESTART)
    assert line.startswith("step 8: checkpoint-restart -> 1x2, kill (lost 0, 1)")
    assert line.endswith("3 steps lost (restored step 5)")
    preempt = {**PIPELINE, "kind": "inter-stage", "trigger": "notice", "preempted": [3]}
    assert ", notice (preempted 3), " in format_reconfiguration(preempt)
    added = {**PIPELINE, "kind": "inter-stage", "trigger": "addition", "joined": [4, 5]}
    assert ", addition (joined 4, 5), " in format_reconfiguration(added)
    # a record from before records had a trigger (an older events file): what it knew then
    older = {k: v for k, v in {**KILL, "preempted": [3]}.items() if k != "trigger"}
    assert ", no notice (lost 2), preempted 3, " in format_reconfiguration(older)
    assert ", notice, " in format_reconfiguration({k: v for k, v in PIPELINE.items() if k != "trigger"})
    assert migration_label(PIPELINE) == "pipeline" and migration_label(KILL) == "inter-stage (kill)"


def test_steps_recomputed_after_a_restart_move_the_count_back():
    con, _ = console(False)
    progress = TrainProgress(con)
    progress.on_start(START)
    for s in range(8):
        progress.on_step(StepInfo(s, 4.0, (2, 2), 4, 0.0))
    progress.on_reconfiguration(RESTART)
    progress.on_step(StepInfo(5, 3.9, (1, 2), 2, 0.0))
    assert progress.steps_done == 6 and progress.alive == 2 and progress.last_migration == "checkpoint-restart (kill)"


def test_a_failed_job_releases_the_terminal_and_keeps_the_last_state():
    con, buf = console(True)
    with pytest.raises(RuntimeError), TrainProgress(con) as progress:
        progress.on_start(START)
        progress.on_step(StepInfo(0, 4.5, (2, 2), 4, 0.0))
        raise RuntimeError("the job failed")
    assert progress._progress is None  # stopped by the context manager
    text = ANSI.sub("", buf.getvalue())
    assert "1/10 steps" in text and "loss 4.5000" in text and "last: none" in text
    progress.on_error(RuntimeError("again"))  # stopping twice is harmless
    assert progress._progress is None


def test_works_behind_the_drivers_observer_list():
    con, buf = console(False)
    progress = TrainProgress(con)  # the 10 steps come within 30 s: one line of progress, at the first
    feed(ObserverList([progress, None]))
    assert progress.steps_done == 10 and len(buf.getvalue().splitlines()) == 3


def test_a_live_fleet_s_waits_are_printed_in_a_log_and_above_the_bar():
    waits = [{"event": "fleet-waiting", "need": 2},
             {"event": "fleet-empty", "reason": "every instance was killed", "step": 7},
             {"event": "fleet-back", "workers": [5, 6], "waited_s": 42.25}]  # fmt: skip
    lines = ["waiting for the fleet: training starts once 2 instances joined",
             "the fleet is empty at step 7: every instance was killed; waiting for capacity",
             "the fleet is back after 42.2 s: workers 5, 6"]  # fmt: skip
    for terminal in (False, True):
        con, buf = console(terminal)
        progress = TrainProgress(con)
        progress.on_fleet(waits[0])
        progress.on_start(START)
        for event in waits[1:]:
            ObserverList([progress]).on_fleet(event)
        progress.stop()
        text = ANSI.sub("", buf.getvalue())
        assert [line for line in text.splitlines() if "fleet" in line] == lines, text


def test_parcae_train_reports_steps_and_each_migration(tmp_path, warm_starts):
    """A real 5-step job on 2 worker processes with two planned migrations, output piped (not a terminal)."""
    from typer.testing import CliRunner

    from parcae.cli import app

    events = tmp_path / "events.json"
    events.write_text(json.dumps([{"step": 2, "kind": "plan", "strategy": [2, 1]},
                                  {"step": 3, "kind": "plan", "strategy": [1, 1]}]))  # fmt: skip
    res = CliRunner().invoke(app, ["train", "--workers", "2", "--steps", "5", "--events", str(events),
                                   "--out-dir", str(tmp_path / "run")])  # fmt: skip
    assert res.exit_code == 0, res.output
    # stderr: one line per reconfiguration as it completed, progress at the first step (no bar: not a terminal)
    steps = [ln for ln in res.output.splitlines() if ln.startswith("step ")]
    assert len(steps) == 3, res.output
    assert steps[0] == "step 1/5: loss 4.6772, 1x2, 2 alive", steps
    assert steps[1].startswith("step 2: pipeline -> 2x1, planned, pause "), steps
    assert steps[2].startswith("step 3: intra-stage -> 1x1, planned, pause "), steps
    assert "\x1b" not in res.output and "5/5" not in res.output
    # stdout: the summary
    assert "tiny-gpt: 5 steps" in res.output
