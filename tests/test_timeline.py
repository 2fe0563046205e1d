"""The job's timeline (`trainer.StepTimeline`): what `parcae train --plot` and the MLflow run's timeline.png draw."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer import StepInfo, StepTimeline


def step(n: int, t: float, alive: int = 4, strategy: tuple[int, int] = (2, 2)) -> StepInfo:
    return StepInfo(step=n, loss=1.0, strategy=strategy, alive=alive, time=t)


def test_the_rate_waits_for_three_step_intervals_so_a_burst_at_the_start_is_no_spike() -> None:
    timeline = StepTimeline(throughput_window=10)
    timeline.on_start({"global_batch": 16})
    # the driver saw steps 0 and 1 at once (it polls), then one step every 0.1 s
    for n, t in enumerate([0.0, 0.0, 0.1, 0.2, 0.3, 0.4]):
        timeline.on_step(step(n, t))
    rates = {n: v[2] for n, v in timeline.steps.items()}
    assert rates[0] is rates[1] is rates[2] is None  # one interval of 0 s would be an infinite rate
    assert rates[3] == pytest.approx(16 * 3 / 0.2) and rates[5] == pytest.approx(16 * 5 / 0.4)
    assert timeline.steps[5][:2] == (4, 4) and timeline.steps[5][3] == 2  # alive, D*P, ..., P


def test_the_rate_is_over_the_window_and_a_pause_shows_as_a_dip() -> None:
    timeline = StepTimeline(throughput_window=3)
    times = [0.1 * n for n in range(8)] + [0.7 + 2.0 + 0.1 * n for n in range(4)]  # a 2 s pause before step 8
    for n, t in enumerate(times):
        timeline.add(step(n, t, strategy=(2, 2) if n < 8 else (1, 2)), global_batch=8)
    rate = {n: v[2] for n, v in timeline.steps.items()}
    assert rate[7] == pytest.approx(8 / 0.1) and rate[8] < rate[7] / 5 and rate[11] > rate[8]
    assert timeline.steps[8][1] == 2  # D*P after the migration


def test_the_figure_marks_each_reconfiguration_by_kind_a_kill_apart_and_shows_p_and_the_plans() -> None:
    timeline = StepTimeline()
    timeline.on_start({"global_batch": 8})
    for n in range(12):
        timeline.on_step(step(n, 0.1 * n, strategy=(1, 2) if n < 5 else (2, 1)))  # D x P stays 2: P shows it
        if n in (4, 8):
            timeline.on_checkpoint(n, Path("ckpt"))
    records = [{"kind": "pipeline", "step": 5, "notice": False, "lost": []},
               {"kind": "intra-stage", "step": 9, "notice": False, "lost": [1]}]  # fmt: skip
    forecast = {"intervals": [{"prev_available": 3, "events": [[0, 0, 0.5], [0, 1, 0.3], [1, 0, 0.2]]}]}
    plans = [{"step": 5, "decision": [2, 1], "details": forecast}, {"step": 9, "decision": [2, 2], "details": {}}]
    fig = timeline.figure(records, title="t", plans=plans)
    avail = fig.axes[0]
    labels = [t.get_text() for t in avail.get_legend().get_texts()]
    assert labels == ["alive instances", "D x P (instances used)", "P (stages)", "D x P planned",
                      "forecast N (next interval)", "checkpoint", "pipeline",
                      "intra-stage (kill, no notice)"]  # fmt: skip
    lines = {line.get_label(): line for line in avail.lines}
    assert list(lines["P (stages)"].get_ydata()) == [2] * 5 + [1] * 7
    assert list(lines["D x P planned"].get_ydata()) == [2, 4, 4]  # a plan the job did not follow (4 > 2 used)
    assert list(lines["checkpoint"].get_xdata()) == [4, 8]
    # the forecast's expected instances for the plan's interval: 3 + 0.3 * (-1) + 0.2 * (+1); a rule plan has none
    assert list(lines["forecast N (next interval)"].get_xdata()) == [5]
    assert list(lines["forecast N (next interval)"].get_ydata()) == pytest.approx([2.9])
    assert lines["pipeline"].get_linestyle() == "--" and lines["intra-stage (kill, no notice)"].get_linestyle() == ":"
    with pytest.raises(ValueError, match="throughput_window"):
        StepTimeline(throughput_window=0)
