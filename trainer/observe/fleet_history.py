"""A live fleet's history, recorded where collected spot traces go: one row per interval into the trace store.

Owns: `FleetHistoryWriter` (appends each `trainer.control.fleet.FleetRow` to the ``fleet_intervals`` table of a
`forecasting.TraceStore` as the interval ends, so that a crash keeps every interval but the one in flight), at the
fleet config's `trace_store`, else where collection writes (`forecasting.trace_store_root`). Must not touch: what
the rows say (`trainer.control.fleet`), training.

A failed write (a full disk, a read-only folder) does not stop the job: it is logged, counted, and the job's
report says it (``fleet_history.errors``), never silently. The table is compacted (`forecasting.TraceStore.compact`)
every `forecasting.COMPACT_AT` rows, in a thread of its own so that no boundary waits for it, and at the job's end:
the planner's reads of the fleet's history (one part file per interval otherwise) stay short.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from forecasting import COMPACT_AT, TraceStore, trace_store_root

log = logging.getLogger(__name__)


@dataclass
class FleetHistoryWriter:
    """Writes the rows of one live fleet (`job_tag`: one run of a job's driver) into the store at `root` (a folder or
    ``s3://bucket/prefix``; None: `forecasting.trace_store_root`'s).
    `interval_s` is the interval the planner prices (a compressed market's: the trace's), `capacity` the fleet's
    maximum."""

    root: str | os.PathLike[str] | None
    job_tag: str
    provider: str
    interval_s: float
    capacity: int
    rows: int = 0
    errors: list[str] = field(default_factory=list)
    _compaction: threading.Thread | None = field(default=None, repr=False)
    _store: TraceStore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # one store for the job: on S3, one boto3 client (thread-safe) for every write
        self._store = TraceStore(trace_store_root(self.root))

    def __call__(self, interval: int, row: Any) -> None:
        record = {"job_tag": self.job_tag, "provider": self.provider, "interval": interval,
                  "interval_s": self.interval_s, "capacity": self.capacity, "requested": row.requested,
                  "granted": row.granted, "refused": row.refused, "reclaimed": row.reclaimed, "alive": row.alive,
                  "timestamp": pd.Timestamp.now(tz="UTC")}  # fmt: skip
        try:  # the row's key (job_tag, interval) is this writer's own: no lookup of what the store holds, which
            # read every part file of every fleet before (0.6 s at 561) while the interval's boundary waited
            self.rows += self._store.append("fleet_intervals", [record], skip_existing=False)
        except (OSError, ValueError) as exc:
            self.errors.append(f"interval {interval}: {exc}")
            log.warning("the fleet's history could not be written to %s: %s", self._store.uri, exc)
            return
        if self.rows % COMPACT_AT == 0 and not (self._compaction is not None and self._compaction.is_alive()):
            self._compaction = threading.Thread(target=self._compact, name="fleet-history-compaction", daemon=True)
            self._compaction.start()

    def _compact(self) -> None:
        try:
            self._store.compact("fleet_intervals")
        except (OSError, ValueError) as exc:
            self.errors.append(f"compaction: {exc}")
            log.warning("the trace store %s could not be compacted: %s", self._store.uri, exc)

    def close(self) -> None:
        """At the job's end: the store compacted once no compaction is in flight (a crash before leaves the parts,
        which read the same)."""
        if self._compaction is not None:
            self._compaction.join()
        self._compact()

    def summary(self) -> dict[str, Any]:
        return {"store": self._store.uri, "job_tag": self.job_tag, "rows": self.rows, "errors": list(self.errors)}
