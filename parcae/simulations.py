"""The simulator's policy comparison in MLflow: log one ``parcae simulate``, rebuild it with `mlflow.search_runs`.

Owns: how a comparison (``liveput.simulator.simulate``'s results) is laid out as MLflow runs, and reading it back
(:func:`comparison_from_mlflow` gives the same rows and columns, in the same order, as
``liveput.simulator.comparison_table``). Must not touch: simulating (``liveput.simulator``), where the store is
(``tracking`` decides), printing (``parcae.cli``).

Layout (experiment "simulations"):
  parent run   one per comparison; its run id is the comparison id. params trace, model, start_hour, end_hour,
               first_interval, last_interval, look_ahead, interval_s, migrations (how migrations were priced:
               prepared, with which notice, or a full stop), forecaster, policies (comma-separated, in order);
               tags ``parcae.comparison`` (its own id), ``parcae.role`` = comparison, the caller's tags (the CLI
               adds ``parcae.command``); artifacts comparison.json (the table) and the timeline plot
               when the caller made one.
  policy runs  one per policy, nested (``mlflow.parentRunId``), named after the policy. The parent's params plus
               policy and forecaster (the one the policy reads: the given name for ``parcae``, ``oracle`` for
               ``parcae-oracle``, ``none`` otherwise); metrics samples, throughput (samples/s), instance_hours,
               cost_usd, usd_per_M_samples, migration_s, planner_ms (median decision time, planners only),
               ideal_samples and vs_ideal (when the ideal bound is known), migrations/<kind> (expected
               migrations of each kind); tags ``parcae.comparison``, ``parcae.role`` = policy, ``parcae.order``
               (position in the table); artifact timeline.csv (the per-interval timeline).
A metric whose value is undefined (no samples, so no $/M samples; no planner) is not logged, and reads back as None.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import tracking as _tracking  # log_comparison's ``tracking`` parameter is the store, not this

import pandas as pd

from liveput import PolicyResult

if TYPE_CHECKING:
    from mlflow import MlflowClient

#: Experiment of the comparisons (``parcae simulate --mlflow``).
SIMULATIONS_EXPERIMENT: Final = "simulations"
#: Its description in the MLflow UI.
SIMULATIONS_DESCRIPTION: Final = (
    "One parent run per `parcae simulate` comparison (trace, model, segment) and a child run per policy: samples "
    "trained, their ratio to ideal, cost and migrations."
)
#: The simulations experiment's saved view (`tracking.views`): a comparison's policies side by side, as columns.
SIMULATIONS_VIEW: Final = _tracking.RunsView(
    params=("policy", "trace", "model", "start_hour", "end_hour"),
    metrics=("vs_ideal", "samples", "cost_usd", "usd_per_M_samples", "migration_s"),
)
COMPARISON_TAG: Final = "parcae.comparison"
ROLE_TAG: Final = "parcae.role"
ORDER_TAG: Final = "parcae.order"
MIGRATION_PREFIX: Final = "migrations/"
#: Scalar metrics of a policy run: name -> PolicyResult attribute.
SCALAR_METRICS: Final = {
    "samples": "samples",
    "throughput": "throughput",
    "instance_hours": "instance_hours",
    "cost_usd": "cost_usd",
    "usd_per_M_samples": "cost_per_million_samples",
    "migration_s": "migration_s",
    "planner_ms": "decision_ms_median",
}


class ComparisonNotFound(LookupError):
    """No comparison with that id in the store; the message says how to list or log one."""


@dataclass(frozen=True)
class LoggedComparison:
    """A comparison read back: the parent run's params and the policies in table order."""

    comparison_id: str
    params: dict[str, str]
    policies: dict[str, PolicyResult] = field(repr=False)  # read back; timelines stay in the runs' artifacts
    run_ids: dict[str, str] = field(default_factory=dict)  # policy -> its MLflow run
    ideal_samples: float | None = None


def _forecaster_of(policy: str, forecaster: str) -> str:
    return {"parcae": forecaster, "parcae-oracle": "oracle"}.get(policy, "none")


def _client(target: str | os.PathLike[str] | None) -> MlflowClient:
    """A client for the store (a URI or a store folder; None: the ``tracking`` package's default), checked reachable.

    Also points ``mlflow`` at it (as ``tracking.connect`` does) when it points elsewhere, because
    ``mlflow.search_runs`` reads the global URI.
    """
    import mlflow
    from mlflow import MlflowClient

    uri = _tracking.resolve_uri(target)
    db = _tracking.sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    _tracking.check_reachable(uri)
    if mlflow.get_tracking_uri() != uri:  # usually it already is: $MLFLOW_TRACKING_URI, which set_tracking_uri rewrites
        mlflow.set_tracking_uri(uri)
    return MlflowClient(uri)


def policy_metrics(result: PolicyResult, ideal_samples: float | None) -> dict[str, float]:
    """The metrics of one policy's run; undefined values (None, NaN) are left out."""
    out: dict[str, float] = {}
    for name, attr in SCALAR_METRICS.items():
        value = getattr(result, attr)
        if value is not None and math.isfinite(float(value)):
            out[name] = float(value)
    if ideal_samples:
        out["ideal_samples"] = float(ideal_samples)
        out["vs_ideal"] = float(result.samples) / float(ideal_samples)
    for kind, value in result.migrations.items():
        out[f"{MIGRATION_PREFIX}{kind}"] = float(value)
    return out


def _finish(client: MlflowClient, run_id: str, log: Any) -> None:
    """Run ``log()`` for an open run, then FINISHED; FAILED (and re-raise) if it fails."""
    try:
        log()
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")


def log_comparison(
    results: Mapping[str, PolicyResult],
    *,
    trace: str,
    model: str,
    window: tuple[float, float],
    look_ahead: int,
    interval_s: float,
    forecaster: str = "persistence",
    migrations: str = "",
    ideal_samples: float | None = None,
    plot: str | os.PathLike[str] | None = None,
    tracking: str | os.PathLike[str] | None = None,
    tags: Mapping[str, Any] | None = None,
) -> str:
    """Log ``results`` (``liveput.simulator.simulate``'s, in table order) and return the comparison id.

    ``window`` is (start hour, end hour) of the simulated window; ``migrations`` how migrations were priced
    (`liveput.Preparation.describe`); ``ideal_samples`` the ideal bound's samples when
    the caller computed it without running ``ideal`` (default: the ``ideal`` result's, if any); ``plot`` an image
    logged on the parent run; ``tracking`` a URI or store folder (None: the ``tracking`` package's default); ``tags``
    go on every run. Raises ``tracking.TrackingError`` if the store does not answer.
    """
    from mlflow.entities import Metric

    if not results:
        raise ValueError("no policy results to log")
    if plot is not None and not Path(plot).is_file():
        raise ValueError(f"plot {os.fspath(plot)!r} is not a file")
    if ideal_samples is None and "ideal" in results and results["ideal"].samples > 0:
        ideal_samples = results["ideal"].samples
    client = _client(tracking)
    exp = _ensure_experiment(client)
    timelines = [r.timeline for r in results.values() if len(r.timeline)]
    first = int(timelines[0]["interval"].iloc[0]) if timelines else None
    last = int(timelines[0]["interval"].iloc[-1]) if timelines else None
    common = {
        "trace": trace, "model": model, "start_hour": f"{window[0]:.4f}", "end_hour": f"{window[1]:.4f}",
        "first_interval": first, "last_interval": last, "look_ahead": look_ahead, "interval_s": f"{interval_s:g}",
    }  # fmt: skip
    if migrations:
        common["migrations"] = migrations
    extra = dict(tags or {})
    hours = f"{window[0]:.2f}-{window[1]:.2f}h"
    parent: str = client.create_run(exp, run_name=f"{trace} {hours} {model} K={look_ahead}").info.run_id

    def log_parent_and_children() -> None:
        _tracking.log_batched(
            client, parent,
            params={**common, "forecaster": forecaster, "policies": ",".join(results)},
            tags={**extra, COMPARISON_TAG: parent, ROLE_TAG: "comparison"},
        )  # fmt: skip
        table = []
        for order, (name, result) in enumerate(results.items()):
            run_id = client.create_run(
                exp, run_name=name,
                tags={**{k: _tracking.clip(v, _tracking.MAX_TAG_LENGTH) for k, v in extra.items()},
                      "mlflow.parentRunId": parent, COMPARISON_TAG: parent, ROLE_TAG: "policy", ORDER_TAG: str(order)},
            ).info.run_id  # fmt: skip
            metrics = policy_metrics(result, ideal_samples)
            now = int(time.time() * 1000)

            def log_child(
                run_id: str = run_id,
                name: str = name,
                result: Any = result,
                metrics: dict[str, float] = metrics,
                now: int = now,
            ) -> None:
                _tracking.log_batched(
                    client, run_id,
                    params={**common, "policy": name, "forecaster": _forecaster_of(name, forecaster)},
                    metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
                )  # fmt: skip
                client.log_text(run_id, result.timeline.to_csv(index=False), "timeline.csv")

            _finish(client, run_id, log_child)
            table.append({"policy": name, **metrics})
        client.log_dict(parent, {"comparison_id": parent, "params": common, "policies": table}, "comparison.json")
        if plot is not None:
            client.log_artifact(parent, os.fspath(plot))

    _finish(client, parent, log_parent_and_children)
    return parent


def _ensure_experiment(client: MlflowClient) -> str:
    return _tracking.ensure_experiment(client, SIMULATIONS_EXPERIMENT, SIMULATIONS_DESCRIPTION, SIMULATIONS_VIEW)


def _value(row: pd.Series, column: str) -> float | None:
    value = row.get(column)
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def load_comparison(comparison_id: str, tracking: str | os.PathLike[str] | None = None) -> LoggedComparison:
    """The comparison ``comparison_id`` read back with `mlflow.search_runs`; ComparisonNotFound if it is not there."""
    import mlflow

    client = _client(tracking)
    uri = client.tracking_uri
    if "'" in comparison_id or not comparison_id.strip():
        raise ComparisonNotFound(f"{comparison_id!r} is not a comparison id (run `parcae simulations` to list them)")
    runs = mlflow.search_runs(
        experiment_names=[SIMULATIONS_EXPERIMENT],
        filter_string=f"tags.`{COMPARISON_TAG}` = '{comparison_id}'",
        output_format="pandas",
    )
    if runs.empty or not (runs[f"tags.{ROLE_TAG}"] == "policy").any():
        raise ComparisonNotFound(
            f"no comparison {comparison_id!r} in experiment {SIMULATIONS_EXPERIMENT!r} of {uri!r}; run "
            f"`parcae simulations` to list the logged ones, or `parcae simulate --mlflow` to log one"
        )
    parent = runs[runs[f"tags.{ROLE_TAG}"] == "comparison"]
    params = {}
    if len(parent):
        row = parent.iloc[0]
        params = {
            c[len("params."):]: row[c] for c in runs.columns if c.startswith("params.") and isinstance(row[c], str)
        }  # fmt: skip
    children = runs[runs[f"tags.{ROLE_TAG}"] == "policy"].copy()
    children["_order"] = children[f"tags.{ORDER_TAG}"].astype(int)
    children = children.sort_values("_order")
    policies: dict[str, PolicyResult] = {}
    run_ids: dict[str, str] = {}
    ideal = None
    for _, row in children.iterrows():
        kinds = sorted(c for c in runs.columns if c.startswith(f"metrics.{MIGRATION_PREFIX}"))
        migrations = {
            c[len(f"metrics.{MIGRATION_PREFIX}"):]: v for c in kinds if (v := _value(row, c)) is not None
        }  # fmt: skip
        name = row["params.policy"]
        run_ids[name] = row["run_id"]
        policies[name] = PolicyResult(
            policy=name,
            samples=_value(row, "metrics.samples") or 0.0,
            throughput=_value(row, "metrics.throughput") or 0.0,
            instance_hours=_value(row, "metrics.instance_hours") or 0.0,
            cost_usd=_value(row, "metrics.cost_usd") or 0.0,
            cost_per_million_samples=_value(row, "metrics.usd_per_M_samples"),
            migration_s=_value(row, "metrics.migration_s") or 0.0,
            decision_ms_median=_value(row, "metrics.planner_ms"),
            migrations=migrations,
            timeline=pd.DataFrame(),
        )
        ideal = ideal if ideal is not None else _value(row, "metrics.ideal_samples")
    return LoggedComparison(
        comparison_id=comparison_id, params=params, policies=policies, run_ids=run_ids, ideal_samples=ideal
    )


def comparison_from_mlflow(
    comparison_id: str, tracking: str | os.PathLike[str] | None = None, reference: str | None = "ideal"
) -> pd.DataFrame:
    """``liveput.simulator.comparison_table`` rebuilt from the store: same rows, columns and order."""
    from liveput import comparison_table

    logged = load_comparison(comparison_id, tracking)
    return comparison_table(logged.policies, reference)


def list_comparisons(tracking: str | os.PathLike[str] | None = None, max_results: int = 20) -> pd.DataFrame:
    """The latest comparisons, newest first: id, start time, trace, window, model, K and policies."""
    import mlflow

    _client(tracking)
    runs = mlflow.search_runs(
        experiment_names=[SIMULATIONS_EXPERIMENT],
        filter_string=f"tags.`{ROLE_TAG}` = 'comparison'",
        order_by=["attributes.start_time DESC"],
        max_results=max_results,
        output_format="pandas",
    )
    columns = ["comparison", "started", "trace", "hours", "model", "K", "policies"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame(
        {
            "comparison": runs["run_id"],
            "started": runs["start_time"].dt.strftime("%Y-%m-%d %H:%M:%S"),
            "trace": runs["params.trace"],
            "hours": runs["params.start_hour"].astype(float).map("{:.2f}".format)
            + "-"
            + runs["params.end_hour"].astype(float).map("{:.2f}".format),
            "model": runs["params.model"],
            "K": runs["params.look_ahead"],
            "policies": runs["params.policies"],
        }
    )[columns]


__all__ = [
    "COMPARISON_TAG",
    "ComparisonNotFound",
    "LoggedComparison",
    "SIMULATIONS_EXPERIMENT",
    "SIMULATIONS_VIEW",
    "comparison_from_mlflow",
    "list_comparisons",
    "load_comparison",
    "log_comparison",
    "policy_metrics",
]
