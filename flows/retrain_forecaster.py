"""Retrain: fit a forecaster on the corpus, backtest it on a held-out trace, register it, promote if better.

    training corpus (all distinct traces but eval_trace, --+
      and the live fleets' histories in the trace store)   |
                                                           +--train_forecaster--> MLflow run + registry version
    eval_trace --------------------------------------------+     (champion alias if it beats persistence and
                                                                   the current champion) --> Prefect report

Scheduled hourly. The result (`TrainOutcome.to_dict`: run id, version, promoted, reason, metrics) is
persisted as JSON so other processes can read it (`run_deployment(...).state.result()`).
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from forecasting import trace_store_root
from liveput import DEFAULT_INTERVAL_S
from parcae import settings
from tasks.forecaster import train_forecaster
from tasks.traces import load_availability_trace, load_training_corpus
from tasks.tracking import publish_training_report


@flow(
    name="retrain-forecaster",
    flow_run_name="retrain-{eval_trace}-h{horizon}",
    persist_result=True,
    result_serializer="json",
)
def retrain_forecaster(
    eval_trace: str = "p3",
    horizon: int = 12,
    train_traces: list[str] | None = None,
    forecaster_params: dict[str, Any] | None = None,
    plots: bool = True,
    interval_s: float = DEFAULT_INTERVAL_S,
    trace_store: str | None = None,
) -> dict[str, Any]:
    """Train on ``train_traces`` (default: every known trace) and the live fleets' histories in ``trace_store``
    (default: ``$PARCAE_TRACE_STORE``, else ``./trace-store``, where parcae's fleet jobs record them), evaluate on
    ``eval_trace`` at ``horizon``.

    ``forecaster_params``: `LightGbmForecaster` arguments (e.g. a small ``n_estimators``).
    """
    settings.check_all(*settings.flow_checks("retrain-forecaster", locals()))  # locals(): the flow's arguments
    store = trace_store_root(trace_store)
    corpus = load_training_corpus(train_traces, exclude=[eval_trace], interval_s=interval_s, store=store)
    evaluation = load_availability_trace(eval_trace, interval_s=interval_s)
    outcome = train_forecaster(corpus, (eval_trace, evaluation), horizon, forecaster_params, plots).to_dict()
    publish_training_report(outcome)
    return outcome
