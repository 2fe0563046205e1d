"""Tasks that produce records: MLflow runs of plans, and Prefect artifacts that point at them (plans, forecaster
trainings, training jobs).

MLflow is reached through `tracking` (the one place that decides the store), with an explicit
`MlflowClient` rather than MLflow's global active run, so nothing here depends on what else runs in the
process. One plan is one run of the ``plans`` experiment, logged in one go by `tracking.log_run`
(parameters, the metrics of `tracking.plan_metrics`, the forecast and the plan as JSON artifacts), with
tags that tie it to the Prefect flow run and to the training run of the forecaster that made the forecast.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import tracking  # first: it switches MLflow's telemetry off before MLflow is imported

import pandas as pd
from mlflow.exceptions import MlflowException  # noqa: E402
from prefect import runtime, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from forecasting import Forecast
from liveput import strategy_key, strategy_text

__all__ = [
    "PLANS_EXPERIMENT",
    "artifact_key",
    "log_plan_run",
    "publish_plan_report",
    "publish_train_report",
    "publish_training_report",
    "run_markdown",
    "store_unavailable",
    "train_summary",
]

PLANS_EXPERIMENT: Final = tracking.PLANS_EXPERIMENT
#: Tag holding the Prefect flow run that produced an MLflow run.
FLOW_RUN_TAG: Final = "prefect.flow_run_id"
#: Tag on a plan run of the plan-interval flow: the MLflow run that trained the forecaster behind the plan (not the
#: training job's run, `trainer.observe.tracking.TRAINING_RUN_TAG`, which tags the plans a running job makes).
FORECASTER_RUN_TAG: Final = "parcae.forecaster_run_id"
#: Where `mlflow ui` listens by default; used for links when the store is a local SQLite file.
LOCAL_UI: Final = "http://127.0.0.1:5000"
_TRANSIENT_CODES: Final = frozenset({"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "RESOURCE_EXHAUSTED"})


def store_unavailable(exc: BaseException) -> bool:
    """Whether an exception says the tracking store is unreachable or busy (worth a retry), not a bug."""
    if isinstance(exc, tracking.TrackingError):
        return True
    return isinstance(exc, MlflowException) and exc.error_code in _TRANSIENT_CODES


def artifact_key(text: str, empty: str = "") -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from a model or trace name; ``empty`` when
    nothing is left."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or empty


def run_markdown(uri: str, run_id: str, experiment_id: str | None = None) -> str:
    """Markdown pointing at an MLflow run of the store at ``uri``: a UI link, and for a local store how to open the
    UI. Pure (no store call), so a training job's observer can write it from the driver's thread."""
    # the UI's "Machine learning" view: without it a browser last left in the GenAI view opens the run's traces
    view = "?workflowType=machine_learning"
    path = (f"experiments/{experiment_id}/runs/{run_id}" if experiment_id else f"runs/{run_id}") + view
    if uri.startswith(("http://", "https://")):
        return f"[MLflow run `{run_id}`]({uri.rstrip('/')}/#/{path})"
    return (
        f"MLflow run `{run_id}` in `{uri}`: [open it]({LOCAL_UI}/#/{path}) "
        f"once `mlflow ui --workers 1 --backend-store-uri {uri}` runs"
    )


def _run_link(client: Any, run_id: str) -> str:
    """`run_markdown` for a run of ``client``'s store, linking into its experiment."""
    return run_markdown(client.tracking_uri, run_id, client.get_run(run_id).info.experiment_id)


@task(name="log-plan-run", persist_result=False)
def log_plan_run(
    plan: Mapping[str, Any],
    forecast: Forecast,
    history: pd.DataFrame,
    training_run_id: str | None = None,
    experiment: str = PLANS_EXPERIMENT,
    job_run_id: str | None = None,
) -> str:
    """Log one plan as an MLflow run of ``experiment``; returns the run id.

    ``history`` is the past the forecast was made from (its name and last interval are the run's trace
    and interval); ``training_run_id`` is the forecaster's training run, ``job_run_id`` the training run of the
    job the plan is for (`trainer.TRAINING_RUN_TAG`, as the job's own plan runs; `trainer.DECIDED_BY_TAG` says
    "plan-interval"). A run whose logging fails is marked FAILED, so a half-logged plan is never FINISHED.
    """
    from trainer import DECIDED_BY_TAG, TRAINING_RUN_TAG

    client = tracking.connect()
    exp_id = tracking.experiment_id(experiment)
    trace, origin = str(history.attrs.get("name", "")), int(history["interval"].iloc[-1])
    tags = {"trace": trace, "decision": strategy_key(plan["decision"])}
    for key, value in (
        (FLOW_RUN_TAG, runtime.flow_run.id),
        ("prefect.flow_run_name", runtime.flow_run.name),
        ("prefect.deployment", runtime.deployment.name),
        (FORECASTER_RUN_TAG, training_run_id),
        (TRAINING_RUN_TAG, job_run_id),
        (DECIDED_BY_TAG, "plan-interval"),
    ):
        if value:
            tags[key] = str(value)
    params = {
        "model": plan["model"],
        "look_ahead": plan["look_ahead"],
        "interval": origin,
        "interval_s": plan["interval_s"],
        "trace": trace,
        "current_strategy": strategy_key(plan["state"]["strategy"]),
        "current_migrating": plan["state"]["migrating"],
        "forecaster": forecast.model,
    }
    return tracking.log_run(
        client, exp_id, run_name=f"plan-{plan['model']}-{trace}-i{origin}", tags=tags, params=params,
        metrics=tracking.plan_metrics(plan), dicts={"forecast.json": forecast.to_dict(), "plan.json": dict(plan)},
    )  # fmt: skip


@task(name="publish-plan-report", persist_result=False)
def publish_plan_report(plan: Mapping[str, Any], run_id: str) -> str:
    """A Prefect markdown artifact (key ``plan-<model>``): the decision, the K steps, the MLflow run."""
    rows = [
        f"| {j} | {strategy_text(s['strategy'])} | {'yes' if s['migrating'] else 'no'} "
        f"| {s['expected_samples']:,.0f} "
        f"| {s['expected_cost_ms']:,.0f} | {s['reach']:.3f} |"
        for j, s in enumerate(plan["steps"], start=1)
    ]
    markdown = "\n".join(
        [
            f"## Plan for {plan['model']}: run {strategy_text(plan['decision'])} next",
            "",
            f"From {strategy_text(plan['state']['strategy'])}"
            f"{' (migrating)' if plan['state']['migrating'] else ''}; "
            f"{plan['expected_samples']:,.0f} expected samples over {plan['look_ahead']} intervals of "
            f"{plan['interval_s']:g} s; decided in {plan['decision_ms']:.1f} ms.",
            "",
            "| step | strategy (D x P) | migrating | expected samples | expected cost (ms) | reach |",
            "|---:|---|---|---:|---:|---:|",
            *rows,
            "",
            _run_link(tracking.connect(), run_id),
        ]
    )
    artifact = create_markdown_artifact(
        markdown=markdown, key=f"plan-{artifact_key(plan['model'])}", description="The latest liveput plan"
    )
    return str(artifact)


@task(name="publish-training-report", persist_result=False)
def publish_training_report(outcome: Mapping[str, Any]) -> str:
    """Prefect artifacts of a training run: the promotion decision (markdown), MAE by horizon (table)."""
    metrics = outcome["metrics"]
    horizons = sorted(int(k[len("mae_h") :]) for k in metrics if re.fullmatch(r"mae_h\d+", k))
    create_table_artifact(
        table=[
            {"horizon": h, "mae": metrics[f"mae_h{h}"], "persistence_mae": metrics.get(f"persistence_mae_h{h}")}
            for h in horizons
        ],
        key="forecaster-mae-by-horizon",
        description="Backtest MAE of the newly trained forecaster and of persistence, per horizon",
    )
    verdict = "promoted to champion" if outcome["promoted"] else "not promoted"
    markdown = "\n".join(
        [
            f"## Forecaster version {outcome['version']}: {verdict}",
            "",
            outcome["reason"],
            "",
            _run_link(tracking.connect(), outcome["run_id"]),
        ]
    )
    artifact = create_markdown_artifact(
        markdown=markdown, key="forecaster-training", description="The latest forecaster training and promotion"
    )
    return str(artifact)


def train_summary(trained: Any, *, planner: str, forecast: str, profile: str) -> dict[str, Any]:
    """The train flow's JSON result from a `tasks.training.TrainedRun`: steps, loss, migrations and their pauses
    per kind, plans, the checkpoint folder and the MLflow run."""
    report = trained.report
    loss = report["loss"]
    kinds: dict[str, int] = {}
    pauses: dict[str, float] = {}
    for rec in report["reconfigurations"]:
        kind = str(rec["kind"])
        kinds[kind] = kinds.get(kind, 0) + 1
        pauses[kind] = pauses.get(kind, 0.0) + float(rec.get("pause_s") or 0.0)
    first = int(report.get("first_step") or 0)
    return {
        "steps": first + len(loss),
        "first_step": first,
        "resumed_from": report.get("resumed_from"),
        "loss_first": float(loss[0]) if loss else None,
        "loss_last": float(loss[-1]) if loss else None,
        # a spec with `validation`: the final layers' held-out loss (every scored boundary's: MLflow's val_loss)
        "val_loss_last": float(report["validation"][-1]["loss"]) if report.get("validation") else None,
        "best_checkpoint": report.get("best_checkpoint"),  # {"step", "val_loss", "monitor", ...}: kept by retention
        "stopped_early": report.get("stopped_early"),  # {"step", "best_step", ...}: the held-out loss stopped it
        "samples_per_s": float(report["throughput"]["samples_per_s"]),
        "migrations": kinds,
        "pause_s": pauses,
        "steps_lost": sum(int(r.get("steps_lost") or 0) for r in report["reconfigurations"]),
        "plans": len(report.get("plans") or []),
        "decisions": [strategy_key(p["decision"]) for p in report.get("plans") or []],
        "planner": planner,
        "forecast": forecast,
        "profile": profile,
        "out_dir": trained.out_dir,
        "checkpoint_dir": str(Path(trained.out_dir) / "checkpoints"),
        "checkpoint_uri": report.get("checkpoint_uri"),  # {"uri", "uploaded", "errors"} with a --checkpoint-uri
        "fleet_cost": report.get("fleet_cost"),  # a live fleet's: instance-hours and dollars (`trainer.fleet_cost`)
        "mlflow_run_id": trained.run_id,
        "mlflow_resumed_run": trained.resumed_run,
        # the trained model as MLflow logged models of the run ("model": the final layers; "best"): their URIs
        "mlflow_models": {name: f"models:/{model_id}" for name, model_id in trained.models.items()},
        "tracking_uri": trained.tracking_uri,
        "final_checksum": report["final_checksum"],
        "wall_s": float(report["wall_s"]),
    }


def _uri_lines(copies: dict[str, Any] | None) -> list[str]:
    """The summary's lines on the checkpoint URI: the steps it holds, and each copy that failed."""
    if not copies:
        return []
    lines = ["", f"Copied to `{copies['uri']}`: the checkpoints of steps {copies['uploaded'] or 'none'}."]
    if copies["errors"]:
        n = len(copies["errors"])
        lines += ["", f"**{n} cop{'y' if n == 1 else 'ies'} failed** (what the URI lacks is in the checkpoint folder):"]
        lines += [f"- {e}" for e in copies["errors"]]
    return lines


@task(name="publish-train-report", persist_result=False)
def publish_train_report(trained: Any, *, planner: str, forecast: str, profile: str) -> dict[str, Any]:
    """A Prefect markdown artifact (key ``training-summary-<model>-<trace>``, the job's other artifact keys' ending:
    each job of that model and trace is a new version of it, no longer of one key for every job) of a finished
    training job; returns `train_summary`."""
    from trainer import fleet_cost_text, score_text

    s = train_summary(trained, planner=planner, forecast=forecast, profile=profile)
    rows = [f"| {kind} | {n} | {s['pause_s'][kind]:.2f} |" for kind, n in sorted(s["migrations"].items())]
    resumed = f" (resumed from step {s['resumed_from']})" if s["resumed_from"] is not None else ""
    run = s["mlflow_run_id"]
    link = _run_link(tracking.connect(), run) if run else "no MLflow run (the store could not be used; see the log)"
    markdown = "\n".join(
        [
            f"## Training: {s['steps']} steps{resumed}, loss {s['loss_first']:.4f} -> {s['loss_last']:.4f}"
            + (f", validation loss {s['val_loss_last']:.4f}" if s["val_loss_last"] is not None else "")
            + (
                f" (best checkpoint: step {b['step']}, {score_text(b['monitor'], b['value'], b['val_loss'])})"
                if (b := s["best_checkpoint"])
                else ""
            )
            + (f"; stopped early at step {e['step']} (patience {e['patience']})" if (e := s["stopped_early"]) else ""),
            "",
            f"{s['samples_per_s']:.1f} samples/s; {s['plans']} plans by `{s['planner']}` "
            f"({', '.join(s['decisions']) or 'none'}); forecasts: {s['forecast']}; runtime profile: {s['profile']}.",
            "",
            "| migration kind | count | total pause (s) |",
            "|---|---:|---:|",
            *rows,
            "",
            f"Steps lost to checkpoint-restarts: {s['steps_lost']}. Checkpoints: `{s['checkpoint_dir']}`.",
            *(["", f"{fleet_cost_text(s['fleet_cost'])}."] if s["fleet_cost"] else []),
            *_uri_lines(s["checkpoint_uri"]),
            *(
                [
                    f"MLflow models: {', '.join(f'`{n}` `{u}`' for n, u in s['mlflow_models'].items())} "
                    "(`mlflow.pytorch.load_model`)."
                ]
                if s["mlflow_models"]
                else []
            ),
            "",
            link,
        ]
    )
    create_markdown_artifact(markdown=markdown, key=f"training-summary-{trained.key}",
                             description="The training job's summary")  # fmt: skip
    return s
