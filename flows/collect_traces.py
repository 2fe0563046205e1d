"""Collect: the job's spot fleet and the spot market -> the trace store. Scheduled every 10 minutes.

    EC2 (instances tagged parcae:job=<job_tag>, spot prices, placement scores) --collect_spot_traces--> TraceStore

The store (``$PARCAE_TRACE_STORE`` or ``./trace-store`` unless ``store`` is given) is append-only and
deduplicated, so overlapping or retried rounds are harmless. Credentials and region come from the standard
AWS chain of the worker's environment.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from parcae import settings
from tasks.traces import collect_spot_traces


@flow(name="collect-traces", flow_run_name="collect-{job_tag}")
def collect_traces(
    store: str | None = None,
    regions: list[str] | None = None,
    instance_types: tuple[str, ...] = ("p3.2xlarge",),
    job_tag: str = "parcae-job",
    endpoint_url: str | None = None,
    price_hours: float = 1.0,
    target_capacity: int = 32,
) -> dict[str, Any]:
    """One collection round; returns rows written per table and the calls the endpoint does not support."""
    settings.check_all(*settings.flow_checks("collect-traces", locals()))  # locals(): the flow's arguments
    return collect_spot_traces(store, regions, instance_types, job_tag, endpoint_url, price_hours, target_capacity)
