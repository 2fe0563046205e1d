"""The demo's stretch of p3 (the `pipeline` flow's defaults) produces every live migration kind under the planner's
choices.

`make demo` trains under the local market, whose capacity follows that stretch, and plans with the liveput planner
on a runtime profile it measures on the machine, so which migrations the job makes follows from those choices. This
dry-runs the market's capacity as a replay would deliver it — one change per interval boundary, seven steps an
interval (the wall-clock market is no more deterministic than a cloud) — with the demo's trace, start interval,
instances, steps and look-ahead read from the flow's own defaults, the real planner and the coordinator's own
planning (`trainer.control.dry_run.schedule_state`), for profiles measured by `make demo` on this 2-core
machine, and checks that each of them leads to an intra-stage, an inter-stage and a pipeline migration. Change the
demo's stretch or the planner, and this says whether the demo can still show every kind.
"""

from __future__ import annotations

import dataclasses  # noqa: E402
import inspect  # noqa: E402

import _prefect_home  # noqa: E402,F401 - before prefect: a temporary PREFECT_HOME, telemetry off
import pytest  # noqa: E402

from flows.pipeline import LIVE_KINDS, pipeline  # noqa: E402
from forecasting.baselines import PersistenceForecaster  # noqa: E402
from forecasting.traces import DEFAULT_INTERVAL_S  # noqa: E402
from liveput.migration import CostConstants  # noqa: E402
from liveput.throughput import ThroughputProfile  # noqa: E402
from trainer.config import TrainConfig, model_config  # noqa: E402
from trainer.control.dry_run import check_schedule, schedule_state  # noqa: E402
from trainer.control.events import EventGroup, group_events, parse_events  # noqa: E402
from trainer.control.planning import PlanRequest, make_planner  # noqa: E402
from trainer.control.schedules import LocalTraceProvider, trace_strategy  # noqa: E402
from trainer.observe.calibration import p2p_table  # noqa: E402
from trainer.observe.profile import RuntimeProfile, runtime_spec  # noqa: E402
from trainer.runtime.model import n_layers

DEMO = {k: p.default for k, p in inspect.signature(pipeline.fn).parameters.items()}
INTERVAL_S, STEP_S = 2.0, 0.3  # 7 steps an interval: `make demo` here made 120 steps in 18 intervals of 2 s

#: Iteration ms per D x P of small-gpt on 3 processes, from `make demo` runs here (`runs/profile-small-gpt-3.json`
#: of fresh clones), each strategy's fastest visit. The first is a profile of two rounds. The second is the earlier
#: one-round profile whose median put 1x2 ahead of 2x1 (so the job never changed D at a fixed P), read with the
#: fastest visit instead: 3x1 is then a hair ahead of 2x1, and 2x1 ahead of 1x2.
MEASURED = {
    "2x1 fastest": {(1, 1): 199.6, (2, 1): 122.1, (3, 1): 136.5, (1, 2): 140.0, (1, 3): 158.0},
    "3x1 fastest": {(1, 1): 220.7, (2, 1): 135.9, (3, 1): 135.1, (1, 2): 145.3, (1, 3): 159.4},
}


def demo_profile(iteration_ms: dict[tuple[int, int], float]) -> RuntimeProfile:
    """A small-gpt profile with the given iteration times and the cost constants `make demo` calibrated here."""
    thr = ThroughputProfile("small-gpt", 16, 2, iteration_ms, source="measured by make demo (test input)")
    constants = CostConstants(
        rendezvous_ms=5246.0, proc_ms=0.0, group_base_ms=0.0, group_add_ms=5.7, group_remove_ms=5.7,
        checkpoint_ms=3017.0, group_mode="groups", build_ms={1: 0.0, 2: 0.0, 3: 0.0},
        p2p=p2p_table(40.97, 1.0 / (149.8 * 1024 * 1024) * 1000.0, "measured by make demo (test input)"),
    )  # fmt: skip
    return RuntimeProfile(thr, constants, runtime_spec("small-gpt"), {}, "", "test input")


def dry_run_demo(profile: RuntimeProfile) -> list[tuple[int, str, tuple[int, int]]]:
    """(start step, kind, D x P) of every epoch the demo's job would run: its replay's availability events, the
    liveput planner asked at every interval boundary as the driver asks it (after the boundary's additions and
    preemptions with notice, before its kills), the coordinator planning each step as it would."""
    workers, steps = DEMO["workers"], DEMO["steps"]
    replay = LocalTraceProvider(DEMO["trace"], workers, INTERVAL_S, DEMO["seed"],
                                start_interval=DEMO["start_interval"])  # fmt: skip
    sched = replay.schedule(steps, STEP_S, plans=False)
    spi = sched.steps_per_interval
    planner, _ = make_planner(
        "liveput", profile=profile, forecaster=PersistenceForecaster(), trace=DEMO["trace"], workers=workers,
        start_interval=DEMO["start_interval"], look_ahead=DEMO["horizon"], interval_s=DEFAULT_INTERVAL_S,
        model=DEMO["model"],
    )  # fmt: skip
    model, train = model_config(DEMO["model"]), TrainConfig(steps=steps)
    events = {g.step: g for g in group_events(parse_events(sched.events))}
    strategy = trace_strategy(sched.workers, n_layers(model))
    decided: list[EventGroup] = []
    history = [sched.workers]
    for s in range(spi, steps, spi):
        state = schedule_state(model, train, sched.workers, strategy, steps, decided, s)
        g = events.get(s, EventGroup(step=s))
        alive = (set(state.alive) | set(range(state.next_id, state.next_id + g.add))) - set(g.preempt)
        history.append(len(alive))
        req = PlanRequest(interval=s // spi, step=s, alive=len(alive), current=(state.epoch.D, state.epoch.P),
                          history=tuple(history), n_layers=n_layers(model), global_batch=train.global_batch,
                          handed=None)  # fmt: skip
        decision, _ = planner(req)
        decided.append(dataclasses.replace(g, strategy=tuple(decision)))
    epochs = check_schedule(model, train, sched.workers, strategy, steps, decided)
    return [(e.start_step, e.kind.value, (e.D, e.P)) for e in epochs]


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_the_demo_replay_makes_every_live_migration_kind(name: str) -> None:
    epochs = dry_run_demo(demo_profile(MEASURED[name]))
    kinds = {kind for _, kind, _ in epochs}
    assert set(LIVE_KINDS) <= kinds, epochs
