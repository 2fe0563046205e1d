"""Pipeline: the end-to-end demo — collect traces, retrain the forecaster, train under a local spot market.

    bundled (and shared) traces --load_training_corpus--> corpus           (the collection step of the demo)
    corpus + held-out trace --train_forecaster--> forecaster run, registry version, champion if it beats
                                                  persistence (else persistence itself is the champion, and the
                                                  run says so) --> Prefect report
    train (subflow): a live fleet under the local market, whose capacity follows the trace (the job never reads
                     it), re-planned every interval by the liveput planner on the measured runtime profile, from
                     the fleet's own history and the champion's forecasts
    --> where to look: the `mlflow ui` and `prefect server` commands

On AWS the collection step is the ``collect-traces`` flow (EC2 -> the trace store); the demo has no cloud, so the
bundled traces are its collected data. `make demo` runs this flow on an ephemeral Prefect API (no server) with
the local MLflow store under ``mlruns/``.

The demo's settings (small-gpt on a fleet of up to 3, the market following p3 from interval 49, one interval every
2 s) put the job under a stretch of p3 where the capacity drops from 3 to 2 and to 1 and comes back, with reclaims
with and without notice: the job trains as soon as two instances have joined, migrates several times (each kind
that the planner's choices call for), checkpoints every 20 steps, and the whole run takes a few minutes on 2 cores
(the runtime profile is measured once and cached under ``runs/``). small-gpt rather than tiny-gpt: its steps are
compute-bound, so two replicas beat one even on 2 cores and the planner's choices (2x1 while two instances live,
1x1 on one, from the rule's starting 1x2) exercise every live migration kind; tiny-gpt's steps are so short that
D=1 and D=2 trade places with the machine's load.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import tracking

from prefect import flow, get_run_logger

from flows.train import train
from liveput import DEFAULT_INTERVAL_S
from parcae import settings
from tasks.forecaster import train_forecaster
from tasks.traces import load_availability_trace, load_training_corpus
from tasks.tracking import publish_training_report
from trainer import TrainConfig, config_default

#: The live migration kinds (`liveput.migration.MigrationKind`) the demo's replay is chosen to exercise.
LIVE_KINDS = ("intra-stage", "inter-stage", "pipeline")
#: A LightGBM small enough to train in seconds (the demo's "small, fast settings").
SMALL_FORECASTER = {"n_estimators": 60, "num_leaves": 15, "learning_rate": 0.1, "min_child_samples": 20, "seed": 0}


def where_to_look(uri: str) -> str:
    """The commands that show what a pipeline run left: the MLflow UI on its store, the Prefect UI on its API."""
    home = os.environ.get("PREFECT_HOME") or "~/.prefect"
    api = os.environ.get("PREFECT_API_URL")
    if uri.startswith(("http://", "https://")):
        mlflow_line = f"  MLflow:  open {uri} (experiments training, plans, forecaster)"
    else:
        mlflow_line = (f"  MLflow:  .venv/bin/mlflow ui --workers 1 --backend-store-uri {uri}\n"
                       "           then open http://127.0.0.1:5000 "
                       "(experiments training, plans, forecaster)")  # fmt: skip
    if api:
        prefect_line = f"  Prefect: open {api.removesuffix('/api')} (flow runs pipeline and train, their artifacts)"
    else:
        prefect_line = (f"  Prefect: PREFECT_HOME={home} .venv/bin/prefect server start --host 127.0.0.1 "
                        "--port 4200\n"
                        "           then open http://127.0.0.1:4200 "
                        "(flow runs pipeline and train, their artifacts)")  # fmt: skip
    return "Where to look:\n" + mlflow_line + "\n" + prefect_line


@flow(name="pipeline", flow_run_name="pipeline-{trace}", persist_result=True, result_serializer="json")
def pipeline(
    trace: str = "p3",
    train_traces: list[str] | None = None,
    horizon: int = 4,
    forecaster_params: dict[str, Any] | None = None,
    model: str = "small-gpt",
    workers: int = 3,
    steps: int = 120,
    interval_seconds: float = 2.0,
    step_seconds: float = 0.1,
    start_interval: int = 49,
    checkpoint_every: int = 20,
    profile: str | None = None,
    out_dir: str | None = None,
    seed: int = config_default(TrainConfig, "seed"),
) -> dict[str, Any]:
    """Collect (load the traces but ``trace``), retrain the forecaster (``forecaster_params``, default
    `SMALL_FORECASTER`, backtested on ``trace`` at ``horizon``), then run the ``train`` flow on ``trace`` with the
    liveput planner (look-ahead ``horizon``). ``out_dir``: the job's folder (default ``runs/pipeline-<time>``)."""
    arguments = dict(locals())  # the flow's arguments: nothing else is bound yet
    uri = tracking.tracking_uri()
    settings.check_all(*settings.flow_checks("pipeline", arguments), lambda: settings.check_tracking(uri))
    logger = get_run_logger()
    corpus = load_training_corpus(train_traces, exclude=[trace], interval_s=DEFAULT_INTERVAL_S)
    logger.info("collected %d traces: %s", len(corpus), ", ".join(corpus))
    evaluation = load_availability_trace(trace, interval_s=DEFAULT_INTERVAL_S)
    params = dict(SMALL_FORECASTER if forecaster_params is None else forecaster_params)
    outcome = train_forecaster(corpus, (trace, evaluation), horizon, params, True).to_dict()
    publish_training_report(outcome)
    logger.info("forecaster version %s: %s", outcome["version"], outcome["reason"])
    job = train(
        model=model, workers=workers, fleet=workers, min_instances=min(2, workers), provider="market", steps=steps,
        trace=trace,
        interval_seconds=interval_seconds, step_seconds=step_seconds, start_interval=start_interval,
        planner="liveput", profile=profile,
        look_ahead=horizon, checkpoint_every=checkpoint_every,
        out_dir=out_dir or f"runs/pipeline-{time.strftime('%Y%m%d-%H%M%S')}", resume=False, seed=seed,
    )  # fmt: skip
    look = where_to_look(uri)
    logger.info("%s", look)
    return {"collected": list(corpus), "forecaster": outcome, "train": job, "where_to_look": look}


def main() -> int:
    """``python -m flows.pipeline``: run the demo pipeline, then print its summary and where to look."""
    uri = tracking.tracking_uri()
    try:  # the flow checks these too; here they fail before Prefect starts, without a traceback
        settings.check_all(lambda: settings.check_trace("p3"), lambda: settings.check_tracking(uri))
    except settings.SettingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    state = pipeline(return_state=True)
    if not state.is_completed():
        print(f"error: the pipeline ended {state.name}: {state.message}", file=sys.stderr)
        return 1
    result = state.result()
    job = result["train"]
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(job["migrations"].items())) or "none"
    print(f"\nPipeline done in {time.monotonic() - t0:.0f} s.")
    print(f"  forecaster: version {result['forecaster']['version']}, {result['forecaster']['reason']}")
    print(f"  training:   {job['steps']} steps, loss {job['loss_first']:.3f} -> {job['loss_last']:.3f}; "
          f"migrations: {kinds}; plans: {job['plans']} ({job['forecast']})")  # fmt: skip
    print(f"              checkpoints in {job['checkpoint_dir']}; MLflow run {job['mlflow_run_id']}")
    for name, uri in job.get("mlflow_models", {}).items():  # the trained model, as MLflow loads it
        print(f"              {name}: mlflow.pytorch.load_model({uri!r})")
    missing = [k for k in LIVE_KINDS if k not in job["migrations"]]
    if missing:
        print(f"  note: no {', no '.join(missing)} migration in this run: the liveput planner chose only "
              f"{', '.join(sorted(set(job['decisions'])))} on the runtime profile measured here ({job['profile']}); "
              "which kinds a run produces follows from those choices and from when the market's capacity "
              "changed")  # fmt: skip
    print(result["where_to_look"])
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
