"""Trace-driven simulator: replay a spot trace interval by interval and compare policies side by side.

Availability comes from `forecasting.traces` (the canonical per-interval table); each policy of
`liveput.policies` decides and is charged interval by interval with the true events, so a misprediction
costs real migration time (§B.3). The output per policy is what a user compares: samples trained, mean
throughput, instance-hours and dollars, cost per million samples, migrations of each kind, time spent
migrating, and a per-interval timeline (N, strategy, throughput) as a DataFrame and a plot.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from liveput.horizon import DEFAULT_INTERVAL_S, DEFAULT_LOOK_AHEAD
from liveput.migration import CostModel
from liveput.policies import BambooConstants, IntervalEvent, ParcaePolicy, Policy, make_policy, trained_forecast
from liveput.prices import instance_price, usd_per_million_samples
from liveput.scenarios import ScenarioStore
from liveput.throughput import ThroughputProfile, load_profile, strategy_key


@dataclass(frozen=True)
class SimulationConfig:
    """What to simulate: the model, planner look-ahead K, interval T and the instance type for prices."""

    model: str = "gpt-1.5b"
    look_ahead: int = DEFAULT_LOOK_AHEAD
    interval_s: float = DEFAULT_INTERVAL_S
    instance_type: str = "p3.2xlarge"
    global_batch: int | None = None
    bamboo: BambooConstants = BambooConstants()


@dataclass(frozen=True)
class PolicyResult:
    """One policy's run over the window."""

    policy: str
    samples: float
    throughput: float
    instance_hours: float
    cost_usd: float
    cost_per_million_samples: float | None
    migrations: dict[str, float]
    migration_s: float
    decision_ms_median: float | None
    timeline: pd.DataFrame = field(repr=False)

    def summary(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "throughput": self.throughput,
            "instance_hours": self.instance_hours,
            "cost_usd": self.cost_usd,
            "cost_per_million_samples": self.cost_per_million_samples,
            "migrations": self.migrations,
            "migration_s": self.migration_s,
            "decision_ms_median": self.decision_ms_median,
        }


def events_of(trace: pd.DataFrame) -> list[IntervalEvent]:
    """The trace's rows as events, in interval order."""
    return [
        IntervalEvent(int(r.interval), int(r.prev_available), int(r.n_in), int(r.n_out))
        for r in trace[["interval", "prev_available", "n_in", "n_out"]].itertuples(index=False)
    ]


def run_policy(
    policy: Policy,
    events: Sequence[IntervalEvent],
    start: int,
    stop: int,
    *,
    price_per_hour: float,
    on_step: Callable[[], None] | None = None,
) -> PolicyResult:
    """Replay events[start:stop] (indices into ``events``); the policy may see events[:i] as history."""
    policy.reset()
    T = policy.T
    rows = []
    migrations: dict[str, float] = defaultdict(float)
    for i in range(start, stop):
        ev = events[i]
        r = policy.step(ev, events[:i], events[i:], first=(i == start))
        for kind, prob in r.kinds.items():
            migrations[kind] += prob
        rows.append(
            {
                "interval": ev.interval,
                "available": ev.available,
                "n_in": ev.n_in,
                "n_out": ev.n_out,
                "d": r.strategy[0],
                "p": r.strategy[1],
                "strategy": strategy_key(r.strategy),
                "instances": r.instances,
                "samples": r.samples,
                "throughput": r.samples / T,
                "pause_s": r.pause_s,
                "migrating": r.migrating,
                "kinds": ", ".join(sorted(kind for kind, prob in r.kinds.items() if prob > 0)),
                "cost_ms": r.cost_ms,
            }
        )
        if on_step:
            on_step()
    tl = pd.DataFrame(rows)
    samples = float(tl["samples"].sum()) if len(tl) else 0.0
    hours = float(tl["instances"].sum()) * T / 3600.0 if len(tl) else 0.0
    cost = hours * price_per_hour
    decision = None
    if isinstance(policy, ParcaePolicy) and policy.decision_s:
        decision = 1000.0 * statistics.median(policy.decision_s)
    return PolicyResult(
        policy=policy.name,
        samples=samples,
        throughput=samples / (len(tl) * T) if len(tl) else 0.0,
        instance_hours=hours,
        cost_usd=cost,
        cost_per_million_samples=usd_per_million_samples(cost, samples),
        migrations={k: round(v, 3) for k, v in sorted(migrations.items())},
        migration_s=float(tl["pause_s"].sum()) if len(tl) else 0.0,
        decision_ms_median=decision,
        timeline=tl,
    )


def simulate(
    trace: pd.DataFrame,
    policies: Sequence[str],
    config: SimulationConfig = SimulationConfig(),
    *,
    first_interval: int | None = None,
    last_interval: int | None = None,
    profile: ThroughputProfile | None = None,
    cost: CostModel | None = None,
    forecaster: Any = None,
    on_step: Callable[[], None] | None = None,
) -> dict[str, PolicyResult]:
    """Run each policy over the trace's intervals [first_interval, last_interval] (inclusive).

    The whole trace before the window is history the forecasters may read (the reference let its
    predictor see the real past at the start of a segment). Each window starts from no running strategy.
    ``forecaster`` (a fitted `forecasting.forecast.Forecaster`) drives the ``parcae`` policy; without it
    ``parcae`` uses persistence.
    """
    profile = profile or load_profile(config.model, config.global_batch)
    cost = cost or CostModel.reference(config.model)
    events = events_of(trace)
    index = {e.interval: i for i, e in enumerate(events)}
    for name, value in (("first_interval", first_interval), ("last_interval", last_interval)):
        if value is not None and value not in index:
            raise ValueError(
                f"{name}={value} is not in the trace (intervals {events[0].interval}..{events[-1].interval})"
            )
    start = index[first_interval] if first_interval is not None else 0
    stop = index[last_interval] + 1 if last_interval is not None else len(events)
    if stop <= start:
        raise ValueError(f"empty window: intervals {first_interval}..{last_interval}")
    price = instance_price(config.instance_type)
    capacity = int(trace["capacity"].max())
    store = ScenarioStore(profile, cost)  # shared: parcae and the oracle ask many of the same keys
    results = {}
    for name in policies:
        fc = trained_forecast(forecaster, trace) if forecaster is not None and name == "parcae" else None
        pol = make_policy(
            name,
            profile,
            cost,
            look_ahead=config.look_ahead,
            interval_s=config.interval_s,
            capacity=capacity,
            store=store,
            bamboo=config.bamboo,
            forecaster=fc,
        )
        rate = price.spot_per_hour if pol.spot else price.on_demand_per_hour
        results[name] = run_policy(pol, events, start, stop, price_per_hour=rate, on_step=on_step)
    return results


def comparison_table(results: dict[str, PolicyResult], reference: str | None = "ideal") -> pd.DataFrame:
    """One row per policy; ``vs_<reference>`` is samples relative to that policy."""
    rows = []
    base = results[reference].samples if reference in results and results[reference].samples > 0 else None
    for name, r in results.items():
        row = {
            "policy": name,
            "samples": r.samples,
            "throughput": r.throughput,
            "instance_hours": r.instance_hours,
            "cost_usd": r.cost_usd,
            "usd_per_M_samples": r.cost_per_million_samples,
            "migration_s": r.migration_s,
            "migrations": ", ".join(f"{k} {v:g}" for k, v in r.migrations.items()) or "-",
        }
        if base:
            row[f"vs_{reference}"] = r.samples / base
        rows.append(row)
    return pd.DataFrame(rows)


def plot_timeline(
    results: dict[str, PolicyResult], path: str | Path, title: str = "", interval_s: float = DEFAULT_INTERVAL_S
) -> Path:
    """Availability, throughput and pipeline depth per interval, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax_n, ax_t, ax_p) = plt.subplots(3, 1, figsize=(11, 8), sharex=True, constrained_layout=True)
    any_tl = next(iter(results.values())).timeline
    ax_n.step(any_tl["interval"], any_tl["available"], where="post", color="black", label="available N")
    for name, r in results.items():
        if name in ("ideal", "on-demand"):
            continue
        ax_n.step(
            r.timeline["interval"], r.timeline["d"] * r.timeline["p"], where="post", alpha=0.7, label=f"{name} D*P"
        )
    ax_n.set_ylabel("instances")
    ax_n.legend(loc="lower left", fontsize=8, ncol=3)
    for name, r in results.items():
        ax_t.plot(r.timeline["interval"], r.timeline["throughput"], label=name, lw=1.2)
        ax_p.step(r.timeline["interval"], r.timeline["p"], where="post", label=name, alpha=0.8)
    ax_t.set_ylabel("samples/s")
    ax_t.legend(loc="lower left", fontsize=8, ncol=3)
    ax_p.set_ylabel("pipeline stages P")
    ax_p.set_xlabel(f"interval ({interval_s:g} s each)")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline_mermaid(
    results: dict[str, PolicyResult], policy: str, against: str, title: str = "", interval_s: float = DEFAULT_INTERVAL_S
) -> str:
    """The timeline as Markdown: two Mermaid charts and a caption, for a page that holds text only (a README, an
    issue: GitHub draws Mermaid) where a PNG would be a committed binary that drifts from the code.

    Chart one: the available instances (bars), `policy`'s D x P and its pipeline depth P (lines); chart two: the
    throughput of `policy` and of `against`. The caption names the intervals where `policy` migrated."""
    ours, theirs = results[policy].timeline, results[against].timeline
    minutes = len(ours) * interval_s / 60.0
    top = int(max(ours["available"].max(), (ours["d"] * ours["p"]).max()))
    rate = float(max(ours["throughput"].max(), theirs["throughput"].max()))

    def series(values: Any, digits: int = 0) -> str:
        return "[" + ", ".join(f"{float(v):.{digits}f}" if digits else str(int(v)) for v in values) + "]"

    def chart(heading: str, y_axis: str, colours: str, lines: list[str]) -> list[str]:
        return [
            "```mermaid",
            "---",
            "config:",
            "  themeVariables:",
            "    xyChart:",
            f'      plotColorPalette: "{colours}"',
            "---",
            "xychart-beta",
            f'    title "{heading}"',
            f'    x-axis "minute" 0 --> {minutes:g}',
            f"    y-axis {y_axis}",
            *(f"    {line}" for line in lines),
            "```",
        ]

    migrations = [
        f"{int(row.interval) - int(ours['interval'].iloc[0])} ({row.kinds})"
        for row in ours.itertuples(index=False)
        if row.kinds and row.kinds != "start"
    ]
    caption = (
        f"{title + '. ' if title else ''}{policy} migrated at minute "
        + (", ".join(migrations) if migrations else "none")
        + f"; {against}'s migrations: {_count(results[against].migrations)}."
    )
    return "\n".join(
        [
            *chart(
                f"Available instances (grey), {policy}'s D x P (blue) and its P (orange)",
                f'"instances" 0 --> {top + 1}',
                "#c8c8c8, #1f77b4, #ff7f0e",
                [
                    f"bar {series(ours['available'])}",
                    f"line {series(ours['d'] * ours['p'])}",
                    f"line {series(ours['p'])}",
                ],
            ),
            "",
            *chart(  # `against` first, so that `policy` is drawn over it
                f"Throughput: {policy} (blue) and {against} (red), samples/s",
                f'"samples/s" 0 --> {10 * math.ceil(rate / 10)}',
                "#d62728, #1f77b4",
                [f"line {series(theirs['throughput'], 1)}", f"line {series(ours['throughput'], 1)}"],
            ),
            "",
            caption,
            "",
        ]
    )


def _count(migrations: dict[str, float]) -> str:
    shown = [f"{k} {v:g}" for k, v in migrations.items() if k != "start" and v > 0]
    return ", ".join(shown) if shown else "none"
