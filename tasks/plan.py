"""Tasks that produce forecasts of the next intervals, the liveput plan over them, and a plan handed to a job.

Wrappers over a `forecasting.forecast.Forecaster`, `liveput.plan_interval` and `trainer.control.planning.hand_plan`,
and the running jobs that take handed plans (their MLflow runs' registration, their fleets' histories). No
retries: forecasting and planning are pure computations on local data, so a failure is a bug or a bad input; and a
plan is for the coming interval, so handing it over again later would apply a stale one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import pandas as pd
from prefect import runtime, task

from forecasting import Forecast, Forecaster
from liveput import DEFAULT_INTERVAL_S, CostModel, IntervalForecast, JobState, load_profile, plan_interval

__all__ = ["fleet_history", "forecast_next_intervals", "hand_plan_to_coordinator", "plan_next_interval", "running_jobs"]


@task(name="forecast-next-intervals", persist_result=False)
def forecast_next_intervals(
    forecaster: Forecaster, history: pd.DataFrame, look_ahead: int, capacity: int | None = None
) -> Forecast:
    """The forecast of the ``look_ahead`` intervals after the last one of ``history``; with ``capacity``, of the
    history rescaled to that many instances (`forecasting.traces.scale_trace`: a trace replayed on a job's fleet).
    A learned forecaster predicts behind the online skill gate (`forecasting.skill_gated`), as the in-job planner
    does: its point forecast only where it has beaten persistence on this history."""
    from forecasting import scale_trace, skill_gated

    if capacity is not None:
        history = scale_trace(history, capacity)
    return skill_gated(forecaster).predict(history, look_ahead)


@task(name="plan-next-interval", persist_result=False)
def plan_next_interval(
    model: str, forecast: Forecast, state: JobState, interval_s: float, profile: str | None = None
) -> dict[str, Any]:
    """The K-step liveput plan (K = the forecast's horizon) as JSON-able data; ``decision`` is the next strategy.

    ``profile``: a runtime profile (`trainer.observe.profile.RuntimeProfile` JSON, ``parcae profile``) to plan with the
    job's measured throughput and migration costs instead of ``model``'s bundled ones; it must be of ``model``.
    The dict is `Plan.to_dict()` plus ``model``, ``look_ahead``, ``interval_s`` and the ``state`` planned from.
    """
    held = state.strategy[0] * state.strategy[1]
    if held > forecast.last_available:
        raise ValueError(
            f"state {state.strategy[0]}x{state.strategy[1]} runs on {held} instances but only "
            f"{forecast.last_available} are available at the forecast's origin"
        )
    if profile is not None:
        from trainer import RuntimeProfile

        measured = RuntimeProfile.load(profile)
        if measured.throughput.model != model:
            raise ValueError(f"runtime profile {profile} is of model {measured.throughput.model!r}, not {model!r}; "
                             f"pass model={measured.throughput.model!r}")  # fmt: skip
        throughput, cost = measured.throughput, measured.cost_model()
    else:
        throughput, cost = load_profile(model), CostModel.reference(model)
    result = plan_interval(IntervalForecast.from_forecast(forecast), state, throughput, cost, interval_s=interval_s)
    current = {**asdict(state), "strategy": list(state.strategy)}
    return {"model": model, "look_ahead": forecast.horizon, "interval_s": interval_s, "state": current,
            **result.to_dict()}  # fmt: skip


def _address(coordinator: str) -> tuple[str, int]:
    host, sep, port = coordinator.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"coordinator must be HOST:PORT (the job's coordinator, e.g. 127.0.0.1:29500), "
                         f"got {coordinator!r}")  # fmt: skip
    return host.strip("[]"), int(port)


@task(name="hand-plan-to-coordinator", persist_result=False)
def hand_plan_to_coordinator(
    plan: Mapping[str, Any],
    coordinator: str,
    job: str = "job",
    timeout_s: float = 10.0,
    token_file: str | None = None,
) -> dict[str, Any]:
    """Hand the plan's decision to the running job ``job`` whose coordinator listens at ``coordinator`` (HOST:PORT);
    the job's `trainer.control.planning.HandedPlanner` applies it from its next interval boundary. The job's token
    (every coordinator wants one) is read from ``token_file`` (the job's ``OUT_DIR/token``), else ``$PARCAE_TOKEN`` —
    never a flow parameter itself: those are shown in the UI.

    A refusal (unreachable, wrong job or token, a job that takes no handed plans or has ended, a strategy its model
    cannot run) raises `trainer.control.planning.HandPlanError` saying which; a (0, 0) decision (stop) is refused here:
    a handed plan never stops a job.
    """
    from trainer import TOKEN_ENV, HandPlanError, hand_plan, read_token_file

    host, port = _address(coordinator)
    d, p = (int(v) for v in plan["decision"])
    if (d, p) == (0, 0):
        raise HandPlanError(f"the plan's decision is 0x0 (do not run): a handed plan never stops job {job!r}; "
                            "it was not handed in")  # fmt: skip
    run_id = runtime.flow_run.id
    source = f"prefect flow run {runtime.flow_run.name} ({run_id})" if run_id else "outside a Prefect flow run"
    token = read_token_file(token_file) if token_file else os.environ.get(TOKEN_ENV)
    hand_plan(host, port, (d, p), job=job, token=token, source=source, timeout_s=timeout_s)
    return {"coordinator": f"{host}:{port}", "job": job, "strategy": [d, p], "source": source}


# ------------------------------------------------------------------------------------------------ running jobs


@task(name="running-jobs", persist_result=False)
def running_jobs() -> list[dict[str, Any]]:
    """The jobs running now that take handed plans: the RUNNING training runs registered with
    `trainer.ACCEPTS_PLANS_TAG` (a job started with ``accept_plans``), newest first — each as its run id, job name,
    coordinator, token file, wall-clock interval, runtime profile, fleet history (trace store and tag) and the
    strategy it trains now (its latest ``dp_D`` / ``dp_P``; None before its first step)."""
    import tracking

    from trainer import ACCEPTS_PLANS_TAG

    client = tracking.connect()
    exp = client.get_experiment_by_name(tracking.TRAINING_EXPERIMENT)
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], f"attributes.status = 'RUNNING' and tags.`{ACCEPTS_PLANS_TAG}` = "
                              "'true'", order_by=["attributes.start_time DESC"])  # fmt: skip
    out = []
    for run in runs:
        t, m = run.data.tags, run.data.metrics
        current = (int(m["dp_D"]), int(m["dp_P"])) if "dp_D" in m and "dp_P" in m else None
        out.append({"run_id": run.info.run_id, "job": t.get("parcae.job", "job"),
                    "coordinator": t.get("parcae.coordinator"), "token_file": t.get("parcae.token_file"),
                    "interval_seconds": float(t.get("parcae.interval_seconds", DEFAULT_INTERVAL_S)),
                    "profile": t.get("parcae.profile_path"), "trace_store": t.get("parcae.trace_store"),
                    "fleet_tag": t.get("parcae.fleet_tag"), "current": current})  # fmt: skip
    return out


@task(name="fleet-history", persist_result=False)
def fleet_history(job: Mapping[str, Any]) -> pd.DataFrame:
    """A running job's own history (`forecasting.TraceStore.fleet_histories`: the alive count per interval its
    driver recorded), as a canonical table; ValueError when it has none yet."""
    from forecasting import FLEET, TraceStore

    if not job.get("trace_store") or not job.get("fleet_tag"):
        raise ValueError(f"job {job['job']!r} records no fleet history (it runs no live fleet)")
    histories = TraceStore(job["trace_store"]).fleet_histories(min_intervals=1)
    name = f"{FLEET}{job['fleet_tag']}"
    if name not in histories:
        raise ValueError(f"job {job['job']!r} has no interval in {job['trace_store']} yet")
    return histories[name]
