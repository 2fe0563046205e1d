"""Tasks that produce availability data: collected spot traces, the training corpus, one trace's past.

Wrappers over `forecasting.collect` (the AWS edge) and `forecasting.traces` / `forecasting.corpus` (the
canonical per-interval tables). Collection is the only task here that talks to a remote service, so it is
the only one with retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pandas as pd
from prefect import task

from forecasting import DEFAULT_INTERVAL_S, SpotCollector, TraceStore, load_trace, training_corpus
from tasks import retry_on

__all__ = ["CollectIncomplete", "collect_spot_traces", "load_availability_trace", "load_training_corpus"]


class CollectIncomplete(RuntimeError):
    """Some EC2 calls of a collection round failed (throttled past botocore's retries, endpoint down).

    What the other calls collected is already in the store; a retry collects the same window again, which
    the store deduplicates by natural key, so retrying is safe.
    """


@task(
    name="collect-spot-traces",
    retries=3,
    retry_delay_seconds=[10, 30, 90],
    # a missing credential or region (CollectError) or a bad argument is not transient: fail at once
    retry_condition_fn=retry_on(CollectIncomplete, TimeoutError),
    timeout_seconds=300,
    persist_result=False,
)
def collect_spot_traces(
    store: str | None,
    regions: Sequence[str] | None,
    instance_types: Sequence[str],
    job_tag: str,
    endpoint_url: str | None,
    price_hours: float,
    target_capacity: int,
) -> dict[str, Any]:
    """One collection round (fleet events, spot prices of the last ``price_hours``, placement scores).

    Returns the store folder, rows written per table, the calls the endpoint does not support and the part
    files merged per table (`forecasting.TraceStore.compact`); raises `CollectIncomplete` when any call failed.
    """
    collector = SpotCollector(
        regions=regions or None,
        instance_types=tuple(instance_types),
        job_tag=job_tag,
        store=TraceStore(store) if store else None,
        endpoint_url=endpoint_url,
    )
    done = collector.collect_round(timedelta(hours=price_hours), target_capacity)
    if done.errors:
        raise CollectIncomplete(f"{len(done.errors)} EC2 call(s) failed: " + "; ".join(done.errors))
    return {
        "store": collector.store.uri,
        "regions": list(collector.regions),
        "rows_written": {k: v for r in done.results.values() for k, v in r.rows_written.items()},
        "unsupported": done.unsupported,
        "parts_compacted": done.compacted,
    }


@task(name="load-training-corpus", persist_result=False)
def load_training_corpus(
    names: Sequence[str] | None,
    exclude: Sequence[str] = (),
    interval_s: float = DEFAULT_INTERVAL_S,
    store: str | None = None,
) -> dict[str, pd.DataFrame]:
    """The distinct traces a forecaster trains on (all known ones by default), without ``exclude`` and copies,
    and the live fleets' own histories in the trace store at ``store`` (if it exists)."""
    found = TraceStore(store) if store is not None else None
    return training_corpus(names, interval_s, exclude, store=found if found is not None and found.exists() else None)


@task(name="load-availability-trace", persist_result=False)
def load_availability_trace(
    trace: str, until_interval: int | None = None, interval_s: float = DEFAULT_INTERVAL_S
) -> pd.DataFrame:
    """A trace's canonical table (name or path), cut after interval ``until_interval`` (default: all of it)."""
    table = load_trace(trace, interval_s)
    if until_interval is None:
        return table
    intervals = table["interval"]
    if until_interval not in set(intervals):
        raise ValueError(
            f"interval {until_interval} is not an interval of trace {table.attrs.get('name', trace)!r} "
            f"(it has intervals {int(intervals.iloc[0])}-{int(intervals.iloc[-1])})"
        )
    past = table.loc[intervals <= until_interval].reset_index(drop=True)
    past.attrs = dict(table.attrs)
    return past
