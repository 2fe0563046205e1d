"""Logging helpers shared by the plan runs (``tasks.tracking``) and the training runs (``trainer.observe.tracking``).

Owns: MLflow's per-call limits and the batching around them (:func:`log_batched`), one complete run in one go
(:func:`log_run`, FAILED if its logging fails), MLflow's run context on a run the client creates
(:func:`context_tags`), the metrics of a liveput plan dict (:func:`plan_metrics`). A strategy's
``"DxP"`` is liveput's (``liveput.strategy_key``). Where the store is: :mod:`tracking.store`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from mlflow import MlflowClient

#: MLflow's limits on one ``log_batch`` call (``mlflow.utils.validation``) and on a param's / tag's value.
MAX_METRICS_PER_BATCH: Final = 1000
MAX_PARAMS_TAGS_PER_BATCH: Final = 100
MAX_PARAM_LENGTH: Final = 6000
MAX_TAG_LENGTH: Final = 8000


def clip(value: Any, limit: int) -> str:
    """``str(value)``, cut to ``limit`` characters (MLflow refuses longer params and tags)."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def context_tags(tags: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``tags`` with MLflow's own run context added (``mlflow.user``, ``mlflow.source.name`` and ``.type``, the git
    commit where there is one), as ``mlflow.start_run`` adds it: a run made with ``MlflowClient.create_run`` has none,
    and the UI shows its "Created by" and "Source" empty. ``tags`` win over the context."""
    from mlflow.tracking.context.registry import resolve_tags

    return {k: str(v) for k, v in resolve_tags(dict(tags or {})).items()}


def log_batched(
    client: MlflowClient,
    run_id: str,
    *,
    metrics: Iterable[Any] = (),
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
) -> None:
    """``log_batch`` within MLflow's limits: ``metrics`` (``mlflow.entities.Metric``) 1000 a call, params and
    tags 100 a call; values are stringified and clipped. Raises what the store raises, after the calls that
    succeeded (so a caller that retries re-sends only what raised — MLflow keeps a duplicate metric point)."""
    from mlflow.entities import Metric, Param, RunTag

    ps = [Param(k, clip(v, MAX_PARAM_LENGTH)) for k, v in (params or {}).items()]
    ts = [RunTag(k, clip(v, MAX_TAG_LENGTH)) for k, v in (tags or {}).items()]
    for i in range(0, len(ps), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=ps[i : i + MAX_PARAMS_TAGS_PER_BATCH])
    for i in range(0, len(ts), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, tags=ts[i : i + MAX_PARAMS_TAGS_PER_BATCH])
    ms: list[Metric] = list(metrics)
    for i in range(0, len(ms), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=ms[i : i + MAX_METRICS_PER_BATCH])


def log_run(
    client: MlflowClient,
    experiment: str,
    *,
    run_name: str,
    tags: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float] | None = None,
    dicts: Mapping[str, Any] | None = None,
) -> str:
    """Log one complete run of experiment id ``experiment`` and return its id: params and metrics (step 0, now),
    then each ``dicts`` entry as a JSON artifact (``{"plan.json": {...}}``), then FINISHED. A run whose logging
    fails is marked FAILED and the error re-raised, so a half-logged run is never FINISHED."""
    from mlflow.entities import Metric

    run_id: str = client.create_run(
        experiment, run_name=run_name, tags={k: clip(v, MAX_TAG_LENGTH) for k, v in context_tags(tags).items()}
    ).info.run_id
    try:
        now = int(time.time() * 1000)
        log_batched(
            client,
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in (metrics or {}).items()],
            params=params,
        )
        for name, content in (dicts or {}).items():
            client.log_dict(run_id, content, name)
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_id


def plan_metrics(plan: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a liveput plan dict (``Plan.to_dict()``, maybe with extra keys): expected_samples,
    decision_ms and, of the first planned interval, reach and expected_cost_ms; keys the dict lacks are left
    out, and with ``look_ahead`` and ``interval_s`` also expected_liveput (expected samples per second)."""
    out: dict[str, float] = {}
    for key in ("expected_samples", "decision_ms"):
        if plan.get(key) is not None:
            out[key] = float(plan[key])
    steps = plan.get("steps") or []
    if steps:
        for key in ("reach", "expected_cost_ms"):
            if steps[0].get(key) is not None:
                out[key] = float(steps[0][key])
    horizon = plan.get("look_ahead", len(steps) or None)
    if "expected_samples" in out and horizon and plan.get("interval_s"):
        out["expected_liveput"] = out["expected_samples"] / (float(horizon) * float(plan["interval_s"]))
    return out
