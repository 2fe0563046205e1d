"""tracking: the MLflow helpers, on the ground floor (it imports no other parcae package).

Import it before MLflow: importing it switches MLflow's telemetry off (``MLFLOW_DISABLE_TELEMETRY``,
``DO_NOT_TRACK``), which MLflow reads when it is first imported.

- :mod:`tracking.store`: where the store is, the reachability check, experiments;
- :mod:`tracking.runs`: logging within MLflow's limits, one-shot runs, the metrics of a plan;
- :mod:`tracking.views`: the saved view of an experiment's runs table (the columns its runs are compared by).

Users: ``forecasting.registry`` (the forecaster registry), ``trainer.observe.tracking`` (a training job's run),
``tasks.tracking`` (plan runs), ``parcae`` (the CLI's and settings' checks).
"""

from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

from tracking.runs import (  # noqa: E402  (after the telemetry switch)
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_LENGTH,
    clip,
    context_tags,
    log_batched,
    log_run,
    plan_metrics,
)
from tracking.store import (  # noqa: E402
    CHECK_TIMEOUT_S,
    DEFAULT_ROOT,
    DESCRIPTIONS,
    EXPERIMENT_KIND_TAG,
    MODEL_TRAINING_KIND,
    NOTE_TAG,
    PLANS_EXPERIMENT,
    TRAINING_EXPERIMENT,
    VIEWS,
    TrackingError,
    artifact_location,
    check_reachable,
    configure,
    connect,
    ensure_experiment,
    experiment_id,
    resolve_uri,
    short_error,
    sqlite_path,
    tracking_root,
    tracking_uri,
)
from tracking.views import VIEW_ID, RunsView, view_link, view_tag  # noqa: E402

__all__ = [
    "CHECK_TIMEOUT_S",
    "DEFAULT_ROOT",
    "DESCRIPTIONS",
    "EXPERIMENT_KIND_TAG",
    "MAX_METRICS_PER_BATCH",
    "MAX_PARAMS_TAGS_PER_BATCH",
    "MAX_PARAM_LENGTH",
    "MAX_TAG_LENGTH",
    "MODEL_TRAINING_KIND",
    "NOTE_TAG",
    "PLANS_EXPERIMENT",
    "TRAINING_EXPERIMENT",
    "RunsView",
    "TrackingError",
    "VIEWS",
    "VIEW_ID",
    "artifact_location",
    "check_reachable",
    "clip",
    "configure",
    "context_tags",
    "connect",
    "ensure_experiment",
    "experiment_id",
    "log_batched",
    "log_run",
    "plan_metrics",
    "resolve_uri",
    "short_error",
    "sqlite_path",
    "tracking_root",
    "tracking_uri",
    "view_link",
    "view_tag",
]
