"""Schedules from traces and chaos: an availability trace (or a seeded storm) turned into a local job's events.

Owns: `trace_strategy` (the replay's fixed D x P rule), `trace_schedule` / `trace_events` / `LocalTraceProvider`
(a trace compressed in time: one trace interval becomes `interval_seconds` of wall time, i.e. `steps_per_interval`
steps; the trace scaled to the workers; a drop becomes preemptions, a seeded share of them without notice, a rise
`add`s, a plan follows every change unless a live planner decides) and `chaos_schedule` (random events every
prefix of which the coordinator can carry out). Must not touch: processes, the store, training. The format of the
events is `trainer.control.events`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd

from trainer.control.events import Event, Schedule


def trace_strategy(n: int, n_layers: int = 6, global_batch: int = 16) -> tuple[int, int]:
    """The D x P a trace schedule plans for `n` live instances: two stages once there are two instances (so
    changes exercise pipeline, inter- and intra-stage migrations), as many replicas as fit."""
    p = 2 if n >= 2 and n_layers >= 2 else 1
    return max(1, min(n // p, global_batch)), p


def _trace_table(trace: str | pd.DataFrame, workers: int) -> pd.DataFrame:
    from forecasting import load_trace, scale_trace

    df = load_trace(trace) if isinstance(trace, str) else trace
    return scale_trace(df, workers)


def trace_schedule(
    trace: str | pd.DataFrame,
    workers: int,
    steps: int,
    steps_per_interval: int,
    seed: int = 0,
    *,
    kill_fraction: float = 0.5,
    start_interval: int = 0,
    strategy_for: Callable[[int], tuple[int, int]] | None = None,
    plans: bool = True,
) -> Schedule:
    """Turn `trace` (a name for `forecasting.traces.load_trace`, or its table) into a local job's schedule.

    The trace is scaled to `workers` instances; interval `start_interval + i`'s change takes effect at the boundary
    before step `(i + 1) * steps_per_interval` (intervals whose step is not < `steps` are dropped). A rise adds
    instances; a drop preempts randomly chosen live instances (seeded), each without notice (`kill`) with
    probability `kill_fraction`. At least one instance always stays (a drop to zero keeps one). Every change is
    followed by a plan for the new count (`strategy_for`, default `trace_strategy`) — unless `plans` is False: the
    schedule of a job whose live planner (`trainer.control.planning`) decides the strategy at every interval boundary
    carries the availability changes only.
    """
    if steps_per_interval < 1:
        raise ValueError(f"steps_per_interval must be >= 1, got {steps_per_interval}")
    if not 0.0 <= kill_fraction <= 1.0:
        raise ValueError(f"kill_fraction must be in [0, 1], got {kill_fraction}")
    pick = strategy_for or trace_strategy
    df = _trace_table(trace, workers)
    if not 0 <= start_interval < len(df):
        raise ValueError(f"start_interval {start_interval} outside the trace's {len(df)} intervals")
    rows = df.iloc[start_interval:].reset_index(drop=True)
    rng = random.Random(seed)
    n0 = int(min(max(1, rows["prev_available"].iloc[0]), workers))
    alive = list(range(n0))
    next_id = n0
    strategy = pick(n0)
    events: list[dict[str, Any]] = []
    covered = 0
    for i, available in enumerate(rows["available"]):
        step = (i + 1) * steps_per_interval
        if step >= steps:
            break
        covered = i + 1
        target = int(min(max(1, available), workers))
        if target == len(alive):
            continue
        if target > len(alive):
            n = target - len(alive)
            events.append({"step": step, "kind": "add", "workers": n})
            alive += list(range(next_id, next_id + n))
            next_id += n
        else:
            victims = sorted(rng.sample(alive, len(alive) - target))
            killed = [w for w in victims if rng.random() < kill_fraction]
            noticed = [w for w in victims if w not in killed]
            if noticed:
                events.append({"step": step, "kind": "preempt", "instances": noticed, "notice": True})
            if killed:
                events.append({"step": step, "kind": "kill", "instances": killed})
            alive = [w for w in alive if w not in victims]
        new = pick(len(alive))
        if plans and new != strategy:
            # a plan at the boundary must fit the instances alive *before* this step's kills
            fits = new[0] * new[1] <= len(alive) + sum(len(e["instances"]) for e in events
                                                       if e["step"] == step and e["kind"] == "kill")  # fmt: skip
            if fits:
                events.append({"step": step, "kind": "plan", "strategy": list(new)})
            strategy = new
    return Schedule(
        workers=n0, strategy=pick(n0), events=events, intervals=covered, steps_per_interval=steps_per_interval
    )


def trace_events(
    trace: str | pd.DataFrame, workers: int, steps: int, steps_per_interval: int, seed: int = 0, **kw: Any
) -> Sequence[Event | Mapping[str, Any]]:
    """The events of `trace_schedule` (start the job with `trace_schedule(...).workers` instances)."""
    return trace_schedule(trace, workers, steps, steps_per_interval, seed, **kw).events


class LocalTraceProvider:
    """A trace replayed on local processes, compressed in time: one trace interval lasts `interval_seconds`.

    `schedule(steps, step_seconds)` converts the wall-clock compression into steps (`steps_per_interval =
    round(interval_seconds / step_seconds)`, at least 1) and returns the `Schedule` for `run_job`, which runs
    it on a `LocalProcessProvider`.
    """

    def __init__(
        self, trace: str | pd.DataFrame = "p3", workers: int = 4, interval_seconds: float = 2.0, seed: int = 0,
        *, kill_fraction: float = 0.5, start_interval: int = 0,
    ) -> None:  # fmt: skip
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds}")
        self.trace, self.workers, self.interval_seconds, self.seed = trace, workers, interval_seconds, seed
        self.kill_fraction, self.start_interval = kill_fraction, start_interval

    def steps_per_interval(self, step_seconds: float) -> int:
        return max(1, round(self.interval_seconds / step_seconds))

    def schedule(self, steps: int, step_seconds: float = 0.1, *, plans: bool = True) -> Schedule:
        """The schedule (`trace_schedule`); `plans=False` for a job with a live planner (availability only)."""
        return trace_schedule(
            self.trace, self.workers, steps, self.steps_per_interval(step_seconds), self.seed,
            kill_fraction=self.kill_fraction, start_interval=self.start_interval, plans=plans,
        )  # fmt: skip


def chaos_schedule(
    workers: int,
    steps: int,
    n_events: int,
    seed: int = 0,
    *,
    model: Any = None,
    train: Any = None,
    max_workers: int = 5,
    max_restarts: int = 1,
    kinds: tuple[str, ...] = ("plan", "preempt", "kill", "add"),
) -> Schedule:
    """A seeded random schedule of `n_events` events (plans, preemptions with notice, kills, additions) that the
    coordinator can carry out: every prefix passes `check_schedule`, at most `max_workers` instances are alive at
    once and at most `max_restarts` kills lose a layer's last holder (a checkpoint-restart, seconds each).

    Events fall on steps 1..steps-2, at most two per step. Raises ValueError if the steps are too few to place them.
    """
    from liveput import MigrationKind
    from trainer.config import TrainConfig, model_config
    from trainer.control.dry_run import ScheduleError, check_schedule
    from trainer.control.events import EventError, group_events, parse_events
    from trainer.runtime.model import n_layers as layer_count

    model = model or model_config("tiny-gpt")
    train = train or TrainConfig()
    n_layers = layer_count(model)
    rng = random.Random(seed)
    strategy = trace_strategy(workers, n_layers, train.global_batch)
    events: list[dict[str, Any]] = []
    alive = list(range(workers))
    next_id = workers

    def dry_run(candidate: list[dict[str, Any]]) -> list[Any] | None:
        try:
            epochs = check_schedule(model, train, workers, strategy, steps, group_events(parse_events(candidate)))
        except (ScheduleError, EventError):
            return None
        return epochs if sum(e.kind is MigrationKind.CHECKPOINT_RESTART for e in epochs) <= max_restarts else None

    for step in range(1, steps - 1):
        if len(events) >= n_events:
            break
        remaining_steps = steps - 1 - step
        need = n_events - len(events)
        per_step = 2 if need > remaining_steps else rng.choice((1, 1, 2))
        for _ in range(per_step):
            if len(events) >= n_events:
                break
            for _try in range(8):
                kind = rng.choice(kinds)
                if kind == "add":
                    if len(alive) >= max_workers:
                        continue
                    e: dict[str, Any] = {"step": step, "kind": "add", "workers": 1}
                elif kind in ("preempt", "kill"):
                    taken = {w for x in events if x["step"] == step for w in x.get("instances", ())}
                    pool = [w for w in alive if w not in taken]
                    if len(alive) < 2 or not pool:
                        continue
                    e = {"step": step, "kind": kind, "instances": [rng.choice(pool)]}
                    if kind == "preempt":
                        e["notice"] = True
                else:
                    if any(x["step"] == step and x["kind"] == "plan" for x in events):
                        continue
                    n = len(alive)
                    so_far = dry_run(events)
                    assert so_far is not None, "every event placed so far passed the dry run"
                    last = so_far[-1]  # the strategy in force: a plan must change it
                    options = [(d, p) for p in range(1, min(n, n_layers) + 1) for d in range(1, n // p + 1)
                               if d <= train.global_batch and (d, p) != (last.D, last.P)]  # fmt: skip
                    if not options:
                        continue
                    e = {"step": step, "kind": "plan", "strategy": list(rng.choice(options))}
                if dry_run(events + [e]) is not None:
                    events.append(e)
                    if kind == "add":
                        alive.append(next_id)
                        next_id += 1
                    elif kind in ("preempt", "kill"):
                        alive.remove(e["instances"][0])
                    break
    if len(events) < n_events:
        raise ValueError(f"placed only {len(events)} of {n_events} events in {steps} steps; give more steps")
    return Schedule(workers=workers, strategy=strategy, events=events)
