"""A live fleet's history, recorded where collected spot traces go: one row per interval into the trace store.

Owns: `FleetHistoryWriter` (appends each `trainer.control.fleet.FleetRow` to the ``fleet_intervals`` table of a
`forecasting.TraceStore` as the interval ends), at the fleet config's `trace_store`, else where collection writes
(`forecasting.trace_store_root`). Must not touch: what the rows say (`trainer.control.fleet`), training.

The row is told at the interval's boundary, which training waits for, so the writer only queues it: a thread of
its own writes (a PUT on S3, a file with its fsync on disk), the rows that queued meanwhile in one part, and
compacts the table (`forecasting.TraceStore.compact`) every `forecasting.COMPACT_AT` parts it wrote, so that the
planner's reads of the fleet's history stay short. `close` writes what is queued and compacts once more, at the
job's end or its failure: only a kill of the driver itself loses a row, the ones not yet written. A failed write (a
full disk, a read-only folder, S3 refusing) does not stop the job: it is logged, counted, and the job's report says
it (``fleet_history.errors``), never silently.
"""

from __future__ import annotations

import logging
import os
import queue
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
    _store: TraceStore = field(init=False, repr=False)
    _queue: queue.Queue[dict[str, Any] | None] = field(init=False, repr=False)
    _thread: threading.Thread = field(init=False, repr=False)
    _parts: int = field(default=0, init=False, repr=False)  # written by this writer

    def __post_init__(self) -> None:
        # one store for the job: on S3, one boto3 client for every write
        self._store = TraceStore(trace_store_root(self.root))
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._write_queued, name="fleet-history-writer", daemon=True)
        self._thread.start()

    def __call__(self, interval: int, row: Any) -> None:
        """Queue interval `interval`'s row; it is written off the boundary."""
        if not self._thread.is_alive():
            raise RuntimeError(f"the fleet history of {self.job_tag} is closed")
        self._queue.put({"job_tag": self.job_tag, "provider": self.provider, "interval": interval,
                         "interval_s": self.interval_s, "capacity": self.capacity, "requested": row.requested,
                         "granted": row.granted, "refused": row.refused, "reclaimed": row.reclaimed,
                         "alive": row.alive, "timestamp": pd.Timestamp.now(tz="UTC")})  # fmt: skip

    def _write_queued(self) -> None:
        """The writer's thread: each wake-up writes every row queued by then as one part; None ends it."""
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            records = [r for r in batch if r is not None]
            if records:
                self._write(records)
            for _ in batch:
                self._queue.task_done()
            if None in batch:
                return

    def _write(self, records: list[dict[str, Any]]) -> None:
        first, last = records[0]["interval"], records[-1]["interval"]
        try:  # the rows' keys (job_tag, interval) are this writer's own: no lookup of what the store holds, which
            # read every part file of every fleet before (0.6 s at 561 parts)
            self.rows += self._store.append("fleet_intervals", records, skip_existing=False)
            self._parts += 1
        except (OSError, ValueError) as exc:
            where = f"interval {first}" if first == last else f"intervals {first}-{last}"
            self.errors.append(f"{where}: {exc}")
            log.warning("the fleet's history could not be written to %s: %s", self._store.uri, exc)
            return
        if self._parts % COMPACT_AT == 0:  # a part file per write: what makes a read slow
            self._compact()

    def _compact(self) -> None:
        try:
            self._store.compact("fleet_intervals")
        except (OSError, ValueError) as exc:
            self.errors.append(f"compaction: {exc}")
            log.warning("the trace store %s could not be compacted: %s", self._store.uri, exc)

    def flush(self) -> None:
        """Wait until every row queued so far is written (or its failure counted)."""
        self._queue.join()

    def close(self) -> None:
        """At the job's end, or its failure: write what is queued, then compact the table once (a crash before
        leaves the parts, which read the same). Closing twice does nothing more."""
        if not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join()
        self._compact()

    def summary(self) -> dict[str, Any]:
        return {"store": self._store.uri, "job_tag": self.job_tag, "rows": self.rows, "errors": list(self.errors)}
