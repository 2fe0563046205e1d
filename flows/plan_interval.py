"""Plan: forecast the next K intervals of the job's availability and choose its next strategy (D x P).

    champion forecaster (MLflow registry) --+
                                            +--forecast_next_intervals--plan_next_interval--> plan
    the trace's past up to at_interval -----+                                |
                                                        log_plan_run (MLflow run in ``plans``) + Prefect report
                                                                             |
                                        hand_plan_to_coordinator (with ``coordinator``: the running job applies
                                        the decision at its next interval boundary)

Scheduled every 60 s, one interval, with ``running_jobs``: it plans for every job running now that registered
for handed plans (``parcae train --accept-plans``, the train flow's ``accept_plans``: its MLflow run's tags say
where its coordinator, token file, fleet history and profile are), from that job's own fleet history, hands each
its plan, and logs each plan run tied to the job's training run; with no such job it plans nothing and says so.

Without ``running_jobs`` (by hand): ``trace`` is the job's own fleet trace and
``at_interval`` its latest interval (the default); ``state`` is where the running job is. A local job replaying
a trace on N processes plans with ``capacity=N`` (the trace scaled to its fleet) and ``profile`` (its measured
runtime profile, ``parcae profile``), and ``coordinator``/``job`` name it: a job started with a
`trainer.control.planning.HandedPlanner` takes the plan (its host:port is in the train flow's log). The result (the plan
dict plus ``mlflow_run_id`` and ``handed``) is persisted as JSON, so a coordinator can also read it with
``run_deployment("plan-interval/...").state.result()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from prefect import flow, get_run_logger

if TYPE_CHECKING:
    import pandas as pd

from liveput import DEFAULT_INTERVAL_S, DEFAULT_LOOK_AHEAD, JobState
from parcae import settings
from tasks.forecaster import champion_forecaster
from tasks.plan import fleet_history, forecast_next_intervals, hand_plan_to_coordinator, plan_next_interval
from tasks.plan import running_jobs as find_running_jobs
from tasks.traces import load_availability_trace
from tasks.tracking import log_plan_run, publish_plan_report
from trainer import HandPlanError, RuntimeProfile

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
    running_jobs: bool = False,
) -> dict[str, Any]:
    """Plan the ``look_ahead`` intervals after ``at_interval`` (default: the trace's last) from ``state``; with
    ``coordinator`` (HOST:PORT of job ``job``'s coordinator), hand the decision to that running job, with the
    job's token read from ``token_file`` (its ``OUT_DIR/token``; default ``$PARCAE_TOKEN``).

    With ``running_jobs``, plan instead for every job running now that takes handed plans (`plan_running_jobs`):
    each from its own fleet history, its current strategy and its runtime profile (else ``profile``)."""
    # fail fast, all at once; locals(): the flow's arguments, nothing else is bound yet
    settings.check_all(*settings.flow_checks("plan-interval", locals()), settings.check_tracking)
    if running_jobs:
        return plan_running_jobs(look_ahead, profile)
    forecaster, training_run_id = champion_forecaster()
    history = load_availability_trace(trace, at_interval, interval_s)
    forecast = forecast_next_intervals(forecaster, history, look_ahead, capacity)
    plan = plan_next_interval(model, forecast, state, interval_s, profile)
    run_id = log_plan_run(plan, forecast, history, training_run_id)
    publish_plan_report(plan, run_id)
    handed = hand_plan_to_coordinator(plan, coordinator, job, token_file=token_file) if coordinator else None
    return {**plan, "mlflow_run_id": run_id, "handed": handed}


def plan_running_jobs(look_ahead: int, profile: str | None) -> dict[str, Any]:
    """One plan per running job that takes handed plans (`tasks.plan.running_jobs`), with the champion forecaster
    (loaded only when there is a job: an idle minute says nothing about the registry), handed to it and logged as a
    plan run tied to its training run. A job that cannot be planned for (no fleet history or step yet, no runtime
    profile, its coordinator gone) is skipped, and the result says why; with no running job, nothing is planned
    and the result says so."""
    logger = get_run_logger()
    jobs = find_running_jobs()
    if not jobs:
        logger.info("no running job takes handed plans: nothing planned")
        return {"jobs": [], "note": "no running job takes handed plans: nothing planned"}
    forecaster, forecaster_run = champion_forecaster()
    out = []
    for job in jobs:
        where = {"job": job["job"], "training_run_id": job["run_id"]}
        try:
            if job["current"] is None:
                raise ValueError("it has trained no step yet")
            job_profile = job["profile"] or profile
            if job_profile is None:
                raise ValueError("it has no runtime profile (parcae train --profile) and the flow was given none")
            history = cast("pd.DataFrame", fleet_history(job))
            forecast = forecast_next_intervals(forecaster, history, look_ahead)
            model = RuntimeProfile.load(job_profile).throughput.model
            plan = plan_next_interval(model, forecast, JobState(job["current"]), history.attrs["interval_s"],
                                      job_profile)  # fmt: skip
            handed = hand_plan_to_coordinator(plan, job["coordinator"], job["job"], token_file=job["token_file"])
        except (ValueError, HandPlanError) as exc:  # this job's problem, not the others'
            logger.warning("job %s (run %s): not planned: %s", job["job"], job["run_id"], exc)
            out.append({**where, "planned": False, "reason": str(exc)})
            continue
        run_id = log_plan_run(plan, forecast, history, forecaster_run, job_run_id=job["run_id"])
        publish_plan_report(plan, run_id)
        out.append({**where, "planned": True, "decision": plan["decision"], "mlflow_run_id": run_id,
                    "handed": handed})  # fmt: skip
    return {"jobs": out}
