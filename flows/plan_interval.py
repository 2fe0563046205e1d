"""Plan: forecast the next K intervals of the job's availability and choose its next strategy (D x P).

    champion forecaster (MLflow registry) --+
                                            +--forecast_next_intervals--plan_next_interval--> plan
    the trace's past up to at_interval -----+                                |
                                                        log_plan_run (MLflow run in ``plans``) + Prefect report
                                                                             |
                                                      hand_plan_to_coordinator  (NOT WIRED: a later slice)

Scheduled every 60 s, one interval. In production ``trace`` is the job's own fleet trace and
``at_interval`` its latest interval (the default); ``state`` is where the running job is. The result (the
plan dict plus ``mlflow_run_id``) is persisted as JSON, so a coordinator can read it with
``run_deployment("plan-interval/...").state.result()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect import flow

from forecasting.traces import DEFAULT_INTERVAL_S
from liveput.optimizer import JobState
from tasks.forecaster import champion_forecaster
from tasks.plan import forecast_next_intervals, plan_next_interval
from tasks.tracking import log_plan_run, publish_plan_report
from tasks.traces import load_availability_trace


def hand_plan_to_coordinator(plan: Mapping[str, Any], coordinator: str) -> None:
    """Hook: hand the plan to the running job's coordinator at ``coordinator``. Not wired yet.

    The trainer's coordinator (`trainer.coordinator`) has no endpoint for external plans yet; until it
    does, asking for a hand-over fails loudly rather than dropping the plan silently.
    """
    raise NotImplementedError(
        f"handing plans to a running coordinator ({coordinator!r}) is not wired yet; "
        "run plan_interval without `coordinator` and read the plan from the flow result or MLflow"
    )


@flow(
    name="plan-interval",
    flow_run_name="plan-{model}-{trace}",
    persist_result=True,
    result_serializer="json",
    timeout_seconds=300,
)
def plan_interval(
    model: str = "gpt-1.5b",
    trace: str = "p3",
    at_interval: int | None = None,
    look_ahead: int = 8,
    state: JobState = JobState(),
    interval_s: float = DEFAULT_INTERVAL_S,
    coordinator: str | None = None,
) -> dict[str, Any]:
    """Plan the ``look_ahead`` intervals after ``at_interval`` (default: the trace's last) from ``state``."""
    forecaster, training_run_id = champion_forecaster()
    history = load_availability_trace(trace, at_interval, interval_s)
    forecast = forecast_next_intervals(forecaster, history, look_ahead)
    plan = plan_next_interval(model, forecast, state, interval_s)
    run_id = log_plan_run(plan, forecast, history, training_run_id)
    publish_plan_report(plan, run_id)
    if coordinator is not None:
        hand_plan_to_coordinator(plan, coordinator)
    return {**plan, "mlflow_run_id": run_id}
