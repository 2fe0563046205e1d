"""A job's timeline, step by step: instances alive, D x P and throughput, and the figure that shows them with a
marker per reconfiguration — the story of a live-migrating job in one picture.

Owns: `StepTimeline` (an observer that keeps (alive, D*P, samples/s) per step, the throughput over a window of step
intervals on the driver's clock, so a reconfiguration's pause shows as a dip) and `timeline_figure`. Used by the
MLflow run (`timeline.png`) and by `parcae train --plot`. Must not touch: MLflow, the job.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from trainer.observe.observer import JobObserver, StepInfo

#: Colours of the reconfiguration markers on the timeline, by kind (`liveput.migration.MigrationKind` values).
KIND_COLOURS: Final = {
    "intra-stage": "tab:green",
    "inter-stage": "tab:orange",
    "pipeline": "tab:red",
    "checkpoint-restart": "tab:purple",
    "start": "tab:gray",
    "none": "tab:olive",
}


def _number(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def number(value: Any) -> float | None:
    """`value` as a float, or None where it is none (a missing or non-numeric field of a record)."""
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


#: The fewest step intervals a rate is measured over: the driver can see the first steps at once (it polls), and a
#: rate over one such interval is a spike of hundreds of thousands of samples/s that flattens every chart.
MIN_INTERVALS: Final = 3


#: What the timeline keeps of a step: (instances alive, D*P, samples/s or None, P).
Sample = tuple[int, int, float | None, int]


class StepTimeline(JobObserver):
    """(alive, D*P, samples/s, P) of each step the driver saw; samples/s is None until `MIN_INTERVALS` step intervals
    (or the whole window, if it is shorter) were seen."""

    def __init__(self, throughput_window: int = 10) -> None:
        if throughput_window < 1:
            raise ValueError(f"throughput_window must be >= 1 step interval, got {throughput_window}")
        self.steps: dict[int, Sample] = {}
        self.checkpoints: list[int] = []  # the steps of the complete checkpoints
        self._times: deque[float] = deque(maxlen=throughput_window + 1)
        self._global_batch = 0

    def on_start(self, info: Mapping[str, Any]) -> None:
        self._global_batch = int(info.get("global_batch") or 0)

    def on_step(self, step: StepInfo) -> None:
        self.add(step, self._global_batch)

    def on_checkpoint(self, step: int, directory: Path) -> None:
        self.checkpoints.append(int(step))

    def add(self, step: StepInfo, global_batch: int) -> float | None:
        """Record `step`; its samples/s over the window (None: not yet two steps, or no global batch)."""
        times = self._times
        times.append(step.time)
        sps = None
        enough = min(MIN_INTERVALS, self._times.maxlen - 1 if self._times.maxlen else 1) + 1
        if global_batch and len(times) >= enough and times[-1] > times[0]:
            sps = global_batch * (len(times) - 1) / (times[-1] - times[0])
        d, p = step.strategy
        self.steps[step.step] = (step.alive, d * p, sps, p)
        return sps

    def figure(
        self, records: Sequence[Mapping[str, Any]], title: str = "", plans: Sequence[Mapping[str, Any]] = ()
    ) -> Figure:
        return timeline_figure(self.steps, records, title, plans, self.checkpoints)


def expected_available(details: Mapping[str, Any]) -> float | None:
    """The instances a liveput plan's forecast expects in its first interval: the instances alive before it plus
    the expected arrivals less departures (its "intervals"[0]: prev_available, events [n_in, n_out, prob]); None for
    a plan without a forecast (the rule, a handed plan)."""
    intervals = details.get("intervals") if isinstance(details, Mapping) else None
    if not intervals or not isinstance(intervals[0], Mapping) or number(intervals[0].get("prev_available")) is None:
        return None
    first = intervals[0]
    events = first.get("events") or []
    return float(first["prev_available"]) + sum(float(prob) * (float(n_in) - float(n_out))
                                                for n_in, n_out, prob in events)  # fmt: skip


def timeline_figure(
    steps: Mapping[int, Sample],
    records: Sequence[Mapping[str, Any]],
    title: str = "",
    plans: Sequence[Mapping[str, Any]] = (),
    checkpoints: Sequence[int] = (),
) -> Figure:
    """The job's timeline. Top: instances alive, D x P (instances used) and P (stages) against step, the D x P
    each plan decided from its step on (`plans`: records with "step" and "decision"), so a change of D against P and
    a plan the job did not follow both show, and the instances each plan's forecast expected in its interval
    (circles: "forecast_n", or `expected_available` of its "details"). Bottom: throughput (samples/s). A marker per
    reconfiguration, coloured by kind: dashed for a planned one or a preemption with notice, dotted for a kill
    without notice; a triangle on the step axis per complete checkpoint (`checkpoints`: their steps), where a
    restart would resume. The legend sits beside the axes, not on the data. `steps`: step -> (alive, D*P,
    samples/s, P)."""
    fig = Figure(figsize=(11, 6), layout="constrained")
    FigureCanvasAgg(fig)
    avail, thr = fig.subplots(2, 1, sharex=True)
    xs = sorted(steps)
    avail.fill_between(xs, [steps[s][0] for s in xs], step="post", color="tab:blue", alpha=0.25,
                       label="alive instances")  # fmt: skip
    avail.step(xs, [steps[s][1] for s in xs], where="post", color="black", lw=1.4, label="D x P (instances used)")
    avail.step(xs, [steps[s][3] for s in xs], where="post", color="tab:brown", lw=1.2, ls="-.", label="P (stages)")
    planned = sorted((int(p["step"]), int(p["decision"][0]) * int(p["decision"][1])) for p in plans
                     if number(p.get("step")) is not None and p.get("decision"))  # fmt: skip
    if planned and xs:
        px = [s for s, _ in planned] + [xs[-1]]
        avail.step(px, [v for _, v in planned] + [planned[-1][1]], where="post", color="tab:gray", lw=1.0, ls="--",
                   label="D x P planned")  # fmt: skip
    forecasts = [(int(p["step"]), n) for p in plans if number(p.get("step")) is not None
                 for n in [p["forecast_n"] if "forecast_n" in p else expected_available(p.get("details") or {})]
                 if n is not None]  # fmt: skip
    if forecasts:
        avail.plot([s for s, _ in forecasts], [n for _, n in forecasts], ls="none", marker="o", mfc="none", ms=6,
                   color="tab:gray", label="forecast N (next interval)")  # fmt: skip
    if checkpoints:
        avail.plot(sorted(checkpoints), [0] * len(checkpoints), ls="none", marker="^", ms=7, color="tab:purple",
                   clip_on=False, zorder=3, label="checkpoint")  # fmt: skip
    avail.yaxis.set_major_locator(MaxNLocator(integer=True))
    thr.xaxis.set_major_locator(MaxNLocator(integer=True))
    tx = [s for s in xs if steps[s][2] is not None]
    thr.plot(tx, [steps[s][2] for s in tx], color="tab:blue", lw=1.2, label="samples/s")
    seen: set[str] = set()
    for rec in records:
        kind, at = str(rec.get("kind", "unknown")), number(rec.get("step"))
        if at is None:
            continue
        killed = bool(rec.get("lost")) and not rec.get("notice")
        label = f"{kind}{' (kill, no notice)' if killed else ''}"
        colour = KIND_COLOURS.get(kind, "tab:brown")
        for ax in (avail, thr):
            ax.axvline(at, color=colour, ls=":" if killed else "--", lw=1.6 if killed else 1.0,
                       label=None if (label in seen or ax is thr) else label)  # fmt: skip
        seen.add(label)
    avail.set_ylabel("instances")
    avail.set_ylim(bottom=0)
    avail.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    thr.set_ylabel("samples/s")
    thr.set_xlabel("step")
    thr.set_ylim(bottom=0)
    for ax in (avail, thr):
        ax.grid(alpha=0.3)
    fig.suptitle(title or "availability, strategy and throughput")
    return fig
