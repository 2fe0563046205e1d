"""Plan: forecast the next K intervals of the job's availability and choose its next strategy (D x P).

    champion forecaster (MLflow registry) --+
                                            +--forecast_next_intervals--plan_next_interval--> plan
    the trace's past up to at_interval -----+                                |
                                                        log_plan_run (MLflow run in ``plans``) + Prefect report
                                                                             |
                                        hand_plan_to_coordinator (with ``coordinator``: the running job applies
                                        the decision at its next interval boundary)

Scheduled every 60 s, one interval. In production ``trace`` is the job's own fleet trace and
``at_interval`` its latest interval (the default); ``state`` is where the running job is. A local job replaying
a trace on N processes plans with ``capacity=N`` (the trace scaled to its fleet) and ``profile`` (its measured
runtime profile, ``parcae profile``), and ``coordinator``/``job`` name it: a job started with a
`trainer.control.planning.HandedPlanner` takes the plan (its host:port is in the train flow's log). The result (the plan
dict plus ``mlflow_run_id`` and ``handed``) is persisted as JSON, so a coordinator can also read it with
``run_deployment("plan-interval/...").state.result()``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from liveput import DEFAULT_INTERVAL_S, DEFAULT_LOOK_AHEAD, JobState
from parcae import settings
from tasks.forecaster import champion_forecaster
from tasks.plan import forecast_next_intervals, hand_plan_to_coordinator, plan_next_interval
from tasks.traces import load_availability_trace
from tasks.tracking import log_plan_run, publish_plan_report

#: The flow's default ``state``: a job not running yet (one value, built once: JobState is frozen).
NOT_RUNNING = JobState()


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
    look_ahead: int = DEFAULT_LOOK_AHEAD,
    state: JobState = NOT_RUNNING,
    interval_s: float = DEFAULT_INTERVAL_S,
    coordinator: str | None = None,
    job: str = "job",
    profile: str | None = None,
    capacity: int | None = None,
    token_file: str | None = None,
) -> dict[str, Any]:
    """Plan the ``look_ahead`` intervals after ``at_interval`` (default: the trace's last) from ``state``; with
    ``coordinator`` (HOST:PORT of job ``job``'s coordinator), hand the decision to that running job, with the
    job's token read from ``token_file`` (its ``OUT_DIR/token``; default ``$PARCAE_TOKEN``)."""
    # fail fast, all at once; locals(): the flow's arguments, nothing else is bound yet
    settings.check_all(*settings.flow_checks("plan-interval", locals()), settings.check_tracking)
    forecaster, training_run_id = champion_forecaster()
    history = load_availability_trace(trace, at_interval, interval_s)
    forecast = forecast_next_intervals(forecaster, history, look_ahead, capacity)
    plan = plan_next_interval(model, forecast, state, interval_s, profile)
    run_id = log_plan_run(plan, forecast, history, training_run_id)
    publish_plan_report(plan, run_id)
    handed = hand_plan_to_coordinator(plan, coordinator, job, token_file=token_file) if coordinator else None
    return {**plan, "mlflow_run_id": run_id, "handed": handed}
