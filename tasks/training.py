"""Tasks that produce training: the runtime profile a planner plans with, the job's live planner, the job itself.

Wrappers over `trainer.observe.profile` (measure or load the runtime's throughput per D x P and its migration costs),
`trainer.control.planning.make_planner` (rule, liveput, handed planners) and `trainer.control.run.train` (a local
elastic job replaying a trace, logged to MLflow by `trainer.observe.tracking.MlflowJobObserver`). The Prefect side of a
running job — a progress artifact, one markdown artifact per plan, a link to the MLflow run — is
`PrefectJobObserver`, an observer like any other; the MLflow run file (``<out_dir>/mlflow-run.json``) is how a re-run
of the flow finds its run.

No retries and no task timeout on `train_job`: a training job is long, restarting one blindly would throw its work
away, and the trainer has its own deadline (``timeout_s``, none unless given) after which it stops every worker
process. A job killed with its driver is continued by running the flow again with ``resume=True`` (the latest
checkpoint, the same MLflow run: its id is kept in ``<out_dir>/mlflow-run.json``, next to the checkpoints).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import tracking

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from forecasting import Forecaster, skill_gated
from liveput import strategy_key, strategy_text
from tasks.tracking import artifact_key, run_markdown
from trainer import JobConfig, JobObserver, ObserverList, PlanInfo, ProgressLog, StepInfo, fleet_text

__all__ = [
    "RUN_FILE",
    "PrefectJobObserver",
    "TrainedRun",
    "previous_run",
    "runtime_profile",
    "train_job",
    "training_planner",
]

#: Where a job's MLflow run is recorded, next to its checkpoints, so that a resumed job reopens the same run.
RUN_FILE: Final = "mlflow-run.json"


# ------------------------------------------------------------------------------------------------ profile


@task(name="runtime-profile", persist_result=False)
def runtime_profile(model: str, workers: int, path: str | None = None, model_args: dict[str, Any] | None = None,
                    device: str = "cpu") -> tuple[Any, str]:  # fmt: skip
    """The runtime profile (`trainer.observe.profile.RuntimeProfile`) and where it came from: loaded from ``path``
    (default ``runs/profile-<model>-<workers>.json``, ``-cuda`` at the end on a GPU), or measured now on
    ``device`` and cached there (`trainer.control.measure.cached_profile`)."""
    from trainer import cached_profile

    logger = get_run_logger()
    profile, origin = cached_profile(model, workers, path, progress=logger.info, model_args=model_args,
                                     device=device)  # fmt: skip
    logger.info("runtime profile of %s on %d processes: %s", model, workers, origin)
    return profile, origin


# ------------------------------------------------------------------------------------------------ planner


@task(name="training-planner", persist_result=False)
def training_planner(
    config: JobConfig, profile: Any, forecaster: Forecaster | None, forecaster_run: str | None = None
) -> tuple[Any, str]:
    """The live planner of the job ``config`` describes and the forecasts it plans with, in a sentence for the
    run's tags and the report (`trainer.job_planner`; None where the job has no planner).

    For ``liveput`` the sentence says where ``forecaster`` came from: the champion (``forecaster_run`` is the MLflow
    run that trained it) or, without one, the registry's fallback, persistence (`forecasting.registry.load_champion`).
    """
    from trainer import handed_in, job_planner, planned_interval_s, plans_stand_s

    planner, what = job_planner(config, profile=profile, forecaster=forecaster)
    kind, trace, plan = config.planning.planner, config.availability.trace, config.planning
    if kind == "liveput" and forecaster is not None:
        name = str(getattr(forecaster, "name", type(forecaster).__name__))
        if forecaster_run:
            origin = f"the champion forecaster, trained in MLflow run {forecaster_run}"
        else:
            origin = "no champion forecaster in the MLflow registry; persistence is the fallback"
        past = f"{trace}'s past" if trace is not None else "the fleet's own history"
        gate = (
            ""
            if skill_gated(forecaster) is forecaster  # persistence: the gate would only copy it
            else ", behind the online skill gate (its point forecast where it has beaten persistence on that past)"
        )
        what = (f"{name} ({origin}) on {past}{gate}; persistence where it cannot forecast (said in each "
                "decision's details)")  # fmt: skip
        stands = plans_stand_s(config)
        if stands is not None:
            what = handed_in(stands, what)
    horizon = f"; look-ahead {plan.look_ahead} x {planned_interval_s(config):g} s" if kind == "liveput" else ""
    get_run_logger().info("%s planner%s; forecasts: %s", kind, horizon, what)
    return planner, what


# ------------------------------------------------------------------------------------------------ MLflow run file


def previous_run(out_dir: str | Path) -> dict[str, Any] | None:
    """What ``<out_dir>/mlflow-run.json`` says about the job that ran there (run_id, tracking_uri, status), or None."""
    path = Path(out_dir) / RUN_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable ({exc}); delete it to start the job's tracking afresh") from None
    if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
        raise ValueError(f'{path}: expected {{"run_id": ..., "tracking_uri": ...}}; delete it or fix it')
    return data


def _write_run_file(out_dir: Path, run_id: str, uri: str, status: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps({"run_id": run_id, "tracking_uri": uri, "status": status}, indent=2) + "\n")
    tmp.replace(out_dir / RUN_FILE)


# ------------------------------------------------------------------------------------------------ Prefect side


class PrefectJobObserver(JobObserver):
    """The Prefect side of a running job: the MLflow run's id written next to the checkpoints and linked from a
    markdown artifact as soon as the run exists, a progress artifact (updated every 5% of the steps), a markdown
    artifact for the first plan and for each plan that changes the strategy (key ``plan-<job>``: a plan that keeps
    it adds no card to the flow run's Artifacts tab), and at the end one table of every plan (``plans-<job>``).

    The hooks run on the driver's thread, which is the task's, so Prefect's run context is there. Each artifact is
    one API call (a few ms) and happens at most ~20 + (one per interval) times per job.
    """

    def __init__(self, mlflow: Any, out_dir: Path, key: str, steps: int) -> None:
        self.mlflow, self.out_dir, self.key, self.steps = mlflow, out_dir, key, steps
        self.run_id: str | None = None
        self._progress: Any = None
        self._shown = -1.0
        self._planned = False
        self.log = ProgressLog(every_s=60.0)

    def _run_known(self) -> None:
        run_id = getattr(self.mlflow, "run_id", None)
        if run_id is None or run_id == self.run_id:
            return
        self.run_id = run_id
        _write_run_file(self.out_dir, run_id, self.mlflow.uri, "RUNNING")
        create_markdown_artifact(
            markdown=f"## Training run\n\n{run_markdown(self.mlflow.uri, run_id)}\n\nCheckpoints: `{self.out_dir}`",
            key=f"training-run-{self.key}",
            description="The MLflow run of the training job",
        )

    def on_start(self, info: Mapping[str, Any]) -> None:
        self._run_known()
        self.log.start(info)
        resumed = info.get("resumed_from")
        self._progress = create_progress_artifact(
            progress=100.0 * (resumed or 0) / max(1, self.steps),
            key=f"training-progress-{self.key}",
            description=f"steps trained of {self.steps}",
        )
        get_run_logger().info(
            "job %r started: %s workers on %s, coordinator %s:%s (hand plans there with the plan-interval flow's "
            "`coordinator` and `token_file` %s)%s", info.get("job"), info.get("workers"), info.get("strategy"),
            info.get("host"), info.get("port"), info.get("token_file"),
            f"; resumed from step {resumed}" if resumed else "",
        )  # fmt: skip

    def on_step(self, step: StepInfo) -> None:
        self._run_known()
        done = 100.0 * (step.step + 1) / max(1, self.steps)
        if self._progress is not None and done - self._shown >= 5.0:
            self._shown = done
            update_progress_artifact(self._progress, min(done, 100.0))
        if (line := self.log.line(step)) is not None:  # the run's log says the job is alive (every minute)
            get_run_logger().info(line)

    def on_fleet(self, event: Mapping[str, Any]) -> None:
        get_run_logger().info(fleet_text(event))  # why a live fleet's job is not training (yet)

    def on_plan(self, plan: PlanInfo) -> None:
        first, self._planned = not self._planned, True
        if not first and tuple(plan.decision) == tuple(plan.current):
            return  # kept: the table at the end lists it
        d = plan.details
        forecast = d.get("forecast")
        lines = [
            f"## Interval {plan.interval} (step {plan.step}): {strategy_text(plan.decision)}",
            "",
            f"Planner `{plan.planner}`, {plan.alive} instances alive, from {strategy_text(plan.current)}; "
            f"decided in {1000 * plan.decision_s:.1f} ms.",
        ]
        if d.get("expected_samples") is not None:
            lines.append(f"Expected samples over the look-ahead: {float(d['expected_samples']):,.0f}.")
        if forecast:
            lines.append(f"Forecast: {forecast}.")
        if self.run_id:
            lines += ["", run_markdown(self.mlflow.uri, self.run_id)]
        create_markdown_artifact(markdown="\n".join(lines), key=f"plan-{self.key}",
                                 description="The training job's latest live plan")  # fmt: skip

    def on_checkpoint(self, step: int, directory: Path) -> None:
        self._run_known()

    def on_end(self, result: Mapping[str, Any]) -> None:
        if self._progress is not None:
            update_progress_artifact(self._progress, 100.0)
        plans = result.get("plans") or []
        if plans:
            rows = [{"interval": p["interval"], "step": p["step"], "alive": p["alive"],
                     "from": strategy_key(p["current"]), "decision": strategy_key(p["decision"]),
                     "planner": p["planner"], "expected_samples": p["details"].get("expected_samples")}
                    for p in plans]  # fmt: skip
            create_table_artifact(table=rows, key=f"plans-{self.key}", description="Every plan of the training job")


# ------------------------------------------------------------------------------------------------ the job


@dataclass(frozen=True)
class TrainedRun:
    """What `train_job` returns: the trainer's report and where the job's records are."""

    report: dict[str, Any]
    run_id: str | None
    tracking_uri: str
    out_dir: str
    resumed_run: bool  # the MLflow run was reopened (a resumed job)
    key: str = "job"  # the job's Prefect artifact keys end with it (`artifact_key` of its model and trace)
    models: dict[str, str] = field(default_factory=dict)  # the run's logged models: "model", "best" -> model id


@task(name="train-job", persist_result=False)
def train_job(
    config: JobConfig,
    *,
    planner: Any,
    tags: Mapping[str, Any],
    experiment: str = tracking.TRAINING_EXPERIMENT,
) -> TrainedRun:
    """Run the job (`trainer.control.run.train`) with the MLflow observer and the Prefect one; returns its `TrainedRun`.

    The instances are those of ``config.provider`` (`trainer.providers`: on AWS, EC2 spot instances with a fresh
    job token in SSM, each worker run by the instance agent). The job token is made inside the task, so that it is
    never a task result or parameter.

    With ``config.checkpoint.resume`` the job continues from the latest checkpoint in its out_dir (if any) and the
    MLflow run named in ``out_dir/mlflow-run.json`` is reopened, which records the interruption on it.
    """
    from trainer import MlflowJobObserver, train

    out = Path(config.out_dir)
    uri = tracking.tracking_uri()
    before = previous_run(out) if config.checkpoint.resume else None
    reopen = before["run_id"] if before else None
    model = config.model.name
    trace = config.availability.trace or (f"{config.provider.name}-fleet" if config.fleet.live else "job")
    run_name = f"train-{model}-{trace}-{time.strftime('%Y%m%d-%H%M%S')}"
    mlflow_obs = MlflowJobObserver(experiment=experiment, run_name=run_name, tags=tags, run_id=reopen, tracking=uri)
    key = artifact_key(f"{model}-{trace}", empty="job")
    prefect_obs = PrefectJobObserver(mlflow_obs, out, key, config.steps)
    observers = ObserverList([mlflow_obs, prefect_obs])
    report = train(config, observer=observers, planner=planner)
    run_id = mlflow_obs.run_id  # on_end (in train) has ended the run and stopped its logging thread
    if run_id is not None:
        _write_run_file(out, run_id, uri, "FINISHED")
    return TrainedRun(report, run_id, uri, str(out.resolve()), reopen is not None, key, dict(mlflow_obs.models))
