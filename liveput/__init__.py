"""liveput: plan the training strategy D x P of a job on spot instances by its liveput (parcae-reference §C).

The package's public face: code outside liveput imports from here only. Map:

- `throughput`  `Strategy` (and its text: `strategy_key`, `strategy_text`), `ThroughputProfile` (samples/s per
                D x P) and the bundled tables;
- `migration`   `MigrationKind`, `migration_kind` (the rule of §D.1), `CostConstants`/`CostModel` (ms per move),
                lead time and downtime (`MigrationTime`, `Preparation`, `Trigger`, `FULL_STOP`) and the stage
                matching the trainer's migration reuses; `model_spec`, `network`: what the costs read;
- `scenarios`   `IntervalForecast`, `persistence_forecast`, `with_noticed` and the `ScenarioStore` of exact
                preemption outcomes;
- `horizon`     the interval T's and the look-ahead K's bounds and defaults (the trace grid's too);
- `optimizer`   the K-interval DP and `plan_interval`, the planning step every planner calls;
- `plan_input`  the JSON document `parcae plan` reads, validated; `plan_plot` its figure (`parcae plan --plot`);
- `policies`, `simulator`, `prices`  the trace-driven comparison of `POLICIES` (a new policy plugs in there);
                `prices` also what instance time cost at a cloud's own spot prices (`spot_usd`).

Must not touch: processes, Prefect, MLflow. The light modules (costs, throughput) load eagerly, so the trainer's
workers import them without scipy or pandas; the planning modules load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from liveput.horizon import DEFAULT_INTERVAL_S, DEFAULT_LOOK_AHEAD, INTERVAL_S_RANGE, MAX_INSTANCES, MAX_LOOK_AHEAD
from liveput.migration import (
    CLOUD_NOTICE_S,
    FULL_STOP,
    TRIGGERS,
    CostConstants,
    CostModel,
    MigrationKind,
    MigrationTime,
    Preparation,
    Trigger,
    assign_stages,
    healthy_missing,
    migration_kind,
    overlap_params,
    stage_overlap,
)
from liveput.model_spec import Layer, ModelSpec, load_model_spec
from liveput.network import P3_P2P, GiB, MiB, P2PTable, p2p_ms
from liveput.prices import InstancePrice, Pool, PriceChanges, instance_price, spot_usd, usd_per_million_samples
from liveput.throughput import (
    MAX_MICRO_BATCHES,
    InfeasibleStrategy,
    Strategy,
    ThroughputProfile,
    estimate_profile,
    load_profile,
    max_global_batch,
    parse_strategy,
    profile_names,
    strategy_key,
    strategy_text,
)

if TYPE_CHECKING:
    from liveput.optimizer import IDLE as IDLE
    from liveput.optimizer import JobState as JobState
    from liveput.optimizer import Plan as Plan
    from liveput.optimizer import PlannerConfig as PlannerConfig
    from liveput.optimizer import PlanStep as PlanStep
    from liveput.optimizer import plan as plan
    from liveput.optimizer import plan_interval as plan_interval
    from liveput.plan_input import MAX_EVENTS_PER_INTERVAL as MAX_EVENTS_PER_INTERVAL
    from liveput.plan_input import PlanInput as PlanInput
    from liveput.plan_input import PlanInputError as PlanInputError
    from liveput.plan_input import parse_plan_input as parse_plan_input
    from liveput.plan_input import plan_of_input as plan_of_input
    from liveput.plan_input import shown as shown
    from liveput.plan_plot import plot_plan as plot_plan
    from liveput.policies import POLICIES as POLICIES
    from liveput.policies import POLICY_NAMES as POLICY_NAMES
    from liveput.policies import BambooConstants as BambooConstants
    from liveput.policies import ParcaePolicy as ParcaePolicy
    from liveput.policies import Policy as Policy
    from liveput.policies import PolicySetup as PolicySetup
    from liveput.policies import make_policy as make_policy
    from liveput.policies import oracle_forecast as oracle_forecast
    from liveput.scenarios import KINDS as KINDS
    from liveput.scenarios import IntervalForecast as IntervalForecast
    from liveput.scenarios import Outcome as Outcome
    from liveput.scenarios import ScenarioStore as ScenarioStore
    from liveput.scenarios import persistence_forecast as persistence_forecast
    from liveput.scenarios import with_noticed as with_noticed
    from liveput.simulator import PolicyResult as PolicyResult
    from liveput.simulator import SimulationConfig as SimulationConfig
    from liveput.simulator import comparison_table as comparison_table
    from liveput.simulator import events_of as events_of
    from liveput.simulator import plot_timeline as plot_timeline
    from liveput.simulator import run_policy as run_policy
    from liveput.simulator import simulate as simulate
    from liveput.simulator import timeline_mermaid as timeline_mermaid


#: The names of the planning modules, loaded on first use (scipy, pandas): name -> module.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("IDLE", "JobState", "Plan", "PlannerConfig", "PlanStep", "plan", "plan_interval"),
                    "liveput.optimizer"),
    **dict.fromkeys(("MAX_EVENTS_PER_INTERVAL", "PlanInput", "PlanInputError", "parse_plan_input", "plan_of_input",
                     "shown"), "liveput.plan_input"),
    "plot_plan": "liveput.plan_plot",
    **dict.fromkeys(("POLICIES", "POLICY_NAMES", "BambooConstants", "ParcaePolicy", "Policy", "PolicySetup",
                     "make_policy", "oracle_forecast"), "liveput.policies"),
    **dict.fromkeys(("KINDS", "IntervalForecast", "Outcome", "ScenarioStore", "persistence_forecast",
                     "with_noticed"), "liveput.scenarios"),
    **dict.fromkeys(("PolicyResult", "SimulationConfig", "comparison_table", "events_of", "plot_timeline",
                     "run_policy", "simulate", "timeline_mermaid"), "liveput.simulator"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'liveput' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_LOOK_AHEAD",
    "INTERVAL_S_RANGE",
    "MAX_INSTANCES",
    "GiB",
    "MAX_LOOK_AHEAD",
    "MAX_MICRO_BATCHES",
    "MiB",
    "P3_P2P",
    "CLOUD_NOTICE_S",
    "FULL_STOP",
    "TRIGGERS",
    "CostConstants",
    "CostModel",
    "MigrationTime",
    "Preparation",
    "Trigger",
    "InfeasibleStrategy",
    "InstancePrice",
    "Layer",
    "MigrationKind",
    "ModelSpec",
    "P2PTable",
    "Pool",
    "PriceChanges",
    "Strategy",
    "ThroughputProfile",
    "assign_stages",
    "estimate_profile",
    "healthy_missing",
    "instance_price",
    "load_model_spec",
    "load_profile",
    "max_global_batch",
    "migration_kind",
    "overlap_params",
    "p2p_ms",
    "parse_strategy",
    "profile_names",
    "spot_usd",
    "stage_overlap",
    "strategy_key",
    "strategy_text",
    "usd_per_million_samples",
    *_LAZY,
]
