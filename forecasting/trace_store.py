"""The trace store: append-only Parquet tables of collected spot traces and live fleets' histories.

Owns: `TraceStore` (append, read, compaction, the fleets' histories and event exports), the tables' schemas and
natural keys (`TABLES`), the compaction threshold (`COMPACT_AT`), `load_trace` (the catalog's names and files, and
the fleets' histories as ``fleet:<job tag>``: the one loader the commands and the trainer call), and where the
parts live: a local folder, or ``s3://bucket/prefix`` through boto3, so that collection, live fleets and the
forecaster's training on several machines (a Prefect work pool, instances on AWS) share one store. Must not touch:
EC2 (`forecasting.collect`), the canonical per-interval tables (`forecasting.traces`).

Four tables, each a folder (an S3 prefix) of immutable part files:

* ``fleet_events``: one row per state transition of an instance tagged ``parcae:job=<job tag>``;
* ``spot_prices``: ``describe_spot_price_history`` rows;
* ``placement_scores``: ``get_spot_placement_scores`` rows;
* ``fleet_intervals``: one row per interval of a live fleet a parcae job ran, written by the job's driver as each
  interval ends — the fleet's own history, which `TraceStore.fleet_histories` turns into canonical tables.

Every append writes a new part whole (a temp file renamed; an S3 PUT), so a reader never sees half a batch and
writers need no lock. A compaction writes the merged rows as a new part that sorts where the oldest merged part
did, before removing the parts it merged: whatever two compactions do at once (a lock makes the second skip, but an
S3 lock whose holder died is taken over after `_LEASE_S`), every part removed has its rows in a part written
before, so no row is ever lost; at worst two merged parts hold the same rows, which a read deduplicates.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlparse

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock, Timeout

from forecasting.traces import (
    DEFAULT_INTERVAL_S,
    AvailabilityEvents,
    UnknownTraceError,
    counts_table,
    events_from_log,
)
from forecasting.traces import load_trace as load_named_trace

__all__ = [
    "COMPACT_AT",
    "FLEET",
    "TABLES",
    "FleetIntervalError",
    "TraceStore",
    "as_utc",
    "check_trace_store",
    "load_trace",
    "trace_store_root",
]

_TS: Final = pa.timestamp("us", tz="UTC")
#: Part files a table holds before `TraceStore.compact` merges them by default (a read opens every part).
COMPACT_AT: Final = 32
#: A live fleet's history is the trace ``fleet:<job tag>`` (`TraceStore.fleet_histories`' keys, the commands' names).
FLEET: Final = "fleet:"


@dataclass(frozen=True)
class _Table:
    schema: pa.Schema
    key: tuple[str, ...]  # natural key: rows with equal keys are the same observation


#: Schemas and natural keys of the store's tables.
TABLES: Final[dict[str, _Table]] = {
    "fleet_events": _Table(
        pa.schema(
            [
                ("job_tag", pa.string()),
                ("region", pa.string()),
                ("instance_id", pa.string()),
                ("event", pa.string()),  # "add" | "remove"
                ("timestamp", _TS),  # when it happened (LaunchTime, transition time, notice time, or observed)
                ("state", pa.string()),
                ("reason", pa.string()),
                ("instance_type", pa.string()),
                ("az", pa.string()),
                ("lifecycle", pa.string()),  # "spot" | "on-demand"
                ("spot_request_id", pa.string()),
                ("observed_at", _TS),
            ]
        ),
        ("instance_id", "event", "timestamp"),
    ),
    "spot_prices": _Table(
        pa.schema(
            [
                ("region", pa.string()),
                ("instance_type", pa.string()),
                ("az", pa.string()),
                ("product", pa.string()),
                ("timestamp", _TS),
                ("price", pa.float64()),
                ("observed_at", _TS),
            ]
        ),
        ("instance_type", "az", "product", "timestamp"),
    ),
    "placement_scores": _Table(
        pa.schema(
            [
                ("region", pa.string()),
                ("az_id", pa.string()),  # "" unless single_az scores were asked
                ("instance_types", pa.string()),  # sorted, comma-joined
                ("target_capacity", pa.int64()),
                ("single_az", pa.bool_()),
                ("score", pa.int64()),
                ("timestamp", _TS),  # scores carry no time of their own: the collection time
            ]
        ),
        ("region", "az_id", "instance_types", "target_capacity", "timestamp"),
    ),
    "fleet_intervals": _Table(
        pa.schema(
            [
                ("job_tag", pa.string()),  # one run of a job's driver
                ("provider", pa.string()),
                ("interval", pa.int64()),
                ("interval_s", pa.float64()),  # the interval the planner prices (a compressed market: the trace's)
                ("capacity", pa.int64()),  # the fleet's maximum
                ("requested", pa.int64()),
                ("granted", pa.int64()),
                ("refused", pa.int64()),
                ("reclaimed", pa.int64()),
                ("alive", pa.int64()),  # for the next interval
                ("timestamp", _TS),  # when the interval ended
            ]
        ),
        ("job_tag", "interval"),
    ),
}

_STALE_TMP_S: Final = 3600.0  # a temp file this old belongs to a local write that crashed
_LEASE_S: Final = 900.0  # an S3 compaction lock this old belongs to a compaction that died
_READ_TRIES: Final = 8  # listings a read makes while compactions remove the parts it listed
_LOCK: Final = ".compact.lock"
_READERS: Final = 8  # parallel GETs of an S3 store's parts
_TAKEN: Final = ("PreconditionFailed", "ConditionalRequestConflict")  # S3's answers to a lock that exists


class FleetIntervalError(ValueError):
    """A live fleet's history asked for at an interval other than the one it was recorded with."""

    def __init__(self, name: str, recorded_s: float, asked_s: float) -> None:
        self.name, self.recorded_s, self.asked_s = name, recorded_s, asked_s
        super().__init__(f"{name} was recorded an interval every {recorded_s:g} s, a count per interval that cannot "
                         f"be cut into intervals of {asked_s:g} s")  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.recorded_s, self.asked_s))


def load_trace(
    source: str | os.PathLike[str] = "p3",
    interval_s: float = DEFAULT_INTERVAL_S,
    capacity: int | None = None,
) -> pd.DataFrame:
    """A trace by name or path as the canonical per-interval table (`forecasting.traces.load_trace`), or a live
    fleet's history by its name in the trace store, ``fleet:<job tag>`` (`TraceStore.fleet_history`, in the store
    `trace_store_root` names): so that every command and job that replays a trace replays the capacity a team's own
    fleet got as well. A store that cannot be read is an OSError naming it."""
    if not os.fspath(source).startswith(FLEET):
        return load_named_trace(source, interval_s, capacity)
    root = trace_store_root()
    try:
        store = TraceStore(root)
    except ValueError as exc:
        raise OSError(f"the trace store {root!r} ($PARCAE_TRACE_STORE) cannot be used: {exc}") from None
    return store.fleet_history(os.fspath(source), interval_s, capacity)


def as_utc(value: Any) -> pd.Timestamp:
    """``value`` as a UTC timestamp (a naive one is taken as UTC)."""
    ts = pd.Timestamp(value)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def _part_name() -> str:
    """A new part's name: parts sort in write order by the time in their name."""
    return f"part-{pd.Timestamp.now(tz='UTC').strftime('%Y%m%dT%H%M%S%fZ')}-{uuid.uuid4().hex[:12]}.parquet"


def trace_store_root(configured: str | os.PathLike[str] | None = None) -> str:
    """Where the trace store is: ``configured``, else ``$PARCAE_TRACE_STORE``, else ``./trace-store`` — for
    collection, the live fleets' histories, the forecaster's corpus and the commands alike."""
    return os.fspath(configured) if configured else os.environ.get("PARCAE_TRACE_STORE") or "trace-store"


def check_trace_store(root: str | os.PathLike[str]) -> str:
    """``root`` as text if it names a trace store (a folder, or ``s3://bucket[/prefix]``); else a ValueError that
    says what to give. Where a job checks its settings before it starts, and where a store is opened."""
    text = os.fspath(root)
    if not text:
        raise ValueError("trace store '': give a folder, or s3://bucket/prefix")
    if text.startswith("s3://"):
        if not urlparse(text).netloc:
            raise ValueError(f"trace store {text!r}: name the bucket, e.g. s3://my-bucket/parcae/traces")
    elif "://" in text:
        raise ValueError(f"trace store {text!r}: expected a folder or s3://bucket/prefix")
    return text


class TraceStore:
    """Append-only Parquet tables, deduplicated by natural key on read, in a local folder or at
    ``s3://bucket/prefix`` (boto3's credential chain; the endpoint from ``$AWS_ENDPOINT_URL_S3`` /
    ``$AWS_ENDPOINT_URL`` as boto3 reads them, or ``s3_client``).

    Each :meth:`append` writes one new part file whole, so a crash or a concurrent reader never sees half a
    batch, and two collectors may append at once: rows both of them wrote are merged by :meth:`read` (first
    written wins). An append never rewrites a part; :meth:`compact` merges a table's parts into one, while
    appends and reads go on. A store that cannot be read or written raises ``OSError`` naming it.
    """

    def __init__(self, root: str | os.PathLike[str], *, s3_client: Any = None) -> None:
        text = check_trace_store(root)
        if text.startswith("s3://"):
            parsed = urlparse(text)
            self._parts: _Folder | _S3 = _S3(parsed.netloc, parsed.path.strip("/"), s3_client)
        else:
            self._parts = _Folder(Path(text))

    @property
    def uri(self) -> str:
        """Where the store is: an absolute folder, or ``s3://bucket/prefix``."""
        return self._parts.uri

    def exists(self) -> bool:
        """Whether anything was ever written here."""
        return self._parts.exists()

    def where(self, table: str) -> str:
        """Where ``table``'s parts are (a table's source, in messages and a trace's attributes)."""
        return self._parts.where(self._checked(table))

    @staticmethod
    def _spec(table: str) -> _Table:
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}; known: {', '.join(TABLES)}")
        return TABLES[table]

    def _checked(self, table: str) -> str:
        self._spec(table)
        return table

    def parts(self, table: str) -> list[str]:
        """Names of the committed part files of ``table``, oldest first (writes in progress excluded)."""
        return self._parts.names(self._checked(table))

    def read(self, table: str) -> pd.DataFrame:
        """All rows of ``table``, one per natural key (the first written), in write order."""
        return _first_per_key(self._load(table), self._spec(table).key).to_pandas()

    def _load(self, table: str) -> pa.Table:
        """Every row of every part of ``table``, in write order.

        Lock-free: a compaction may remove a part between the listing and its read, so a missing part means
        list again (its rows are in the merged part by then).
        """
        schema = self._spec(table).schema
        for attempt in range(1, _READ_TRIES + 1):
            names = self.parts(table)
            data = self._parts.read_all(table, names, schema)
            if all(d is not None for d in data):
                return pa.concat_tables([schema.empty_table(), *(d for d in data if d is not None)])
            if attempt < _READ_TRIES:
                time.sleep(0.01 * attempt)
        gone = next(n for n, d in zip(names, data, strict=True) if d is None)
        raise FileNotFoundError(
            f"trace store {self.where(table)}: part {gone} was listed, then missing, {_READ_TRIES} times"
        )

    def compact(self, *tables: str, min_parts: int = COMPACT_AT) -> dict[str, int]:
        """Merge each table (default: all) that holds at least ``min_parts`` part files into one; returns the
        part files removed per table.

        Why: parts are never rewritten, so every append adds a file that every later read opens (about 1 ms
        each on a local disk, a request each on S3), and collection rounds and live fleets append for as long as
        the store lives. The merged rows are exactly what :meth:`read` returned; they go into a new part that
        sorts where the oldest merged part did, so that they win over any part left by a compaction that
        crashed, then the merged parts are removed. Appends go on meanwhile (their parts sort later and are
        untouched); a table already being compacted elsewhere is skipped (a lock). Temp files of local writes
        that crashed over an hour ago are removed.
        """
        removed: dict[str, int] = {}
        for table in tables or tuple(TABLES):
            removed[self._checked(table)] = 0
            with self._parts.compaction_lock(table) as held:
                if held:
                    removed[table] = self._compact(table, max(2, min_parts))
        return removed

    def _compact(self, table: str, min_parts: int) -> int:
        spec = self._spec(table)
        names = self.parts(table)
        if len(names) < min_parts:
            return 0
        data = self._parts.read_all(table, names, spec.schema)
        if any(d is None for d in data):  # merged away meanwhile (a compaction whose lock expired): next time
            return 0
        merged = _first_per_key(pa.concat_tables([d for d in data if d is not None]), spec.key)
        stamp = names[0].rsplit("-", 1)[0]  # "part-<time>": sorts where the oldest merged part did
        self._parts.write(table, f"{stamp}-{uuid.uuid4().hex[:12]}.parquet", merged)
        self._parts.delete(table, names)
        return len(names) - 1

    def append(
        self,
        table: str,
        rows: pd.DataFrame | Iterable[Mapping[str, Any]],
        *,
        skip_existing: bool = True,
    ) -> int:
        """Write ``rows`` as one new part file; returns the number of rows written.

        Rows whose key is already stored are dropped first (``skip_existing``) so repeated collection
        of the same window does not grow the store; :meth:`read` deduplicates anyway, which covers
        concurrent writers that cannot see each other's batch.
        """
        spec = self._spec(table)
        df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
        if df.empty:
            return 0
        missing = [c for c in spec.schema.names if c not in df.columns]
        if missing:
            raise ValueError(f"{table}: rows lack column(s) {', '.join(missing)}")
        df = df[spec.schema.names]
        for f in spec.schema:
            if pa.types.is_timestamp(f.type):
                df[f.name] = pd.to_datetime(df[f.name], utc=True)
            elif pa.types.is_string(f.type):
                df[f.name] = df[f.name].fillna("").astype(str)
        # round-trip through the schema so the key comparison below sees exactly what read() returns
        new = _to_arrow(df, spec.schema).to_pandas()
        new = new.drop_duplicates(subset=list(spec.key), keep="first")
        if skip_existing:
            old = self.read(table)[list(spec.key)]
            if not old.empty:
                merged = new.merge(old.drop_duplicates(), on=list(spec.key), how="left", indicator=True)
                new = new.loc[(merged["_merge"] == "left_only").to_numpy()]
        if new.empty:
            return 0
        self._parts.write(table, _part_name(), _to_arrow(new, spec.schema))
        return len(new)

    # ------------------------------------------------------------------------- live fleets' histories

    def fleet_histories(self, min_intervals: int = 2) -> dict[str, pd.DataFrame]:
        """Every live fleet's history in ``fleet_intervals`` with at least ``min_intervals`` intervals, as the
        canonical table of its alive count (`forecasting.traces.counts_table`), keyed ``fleet:<job tag>``."""
        df = self.read("fleet_intervals")
        return {f"{FLEET}{tag}": self._fleet_table(str(tag), rows.sort_values("interval"))
                for tag, rows in df.groupby("job_tag", sort=True) if len(rows) >= min_intervals}  # fmt: skip

    def _fleet_table(self, tag: str, rows: pd.DataFrame, capacity: int | None = None) -> pd.DataFrame:
        """One fleet's rows (in interval order) as the canonical table of its alive count; `capacity` overrides
        the fleet's maximum (`forecasting.traces.counts_table` refuses one below a count)."""
        if capacity is None:
            capacity = int(max(rows["capacity"].max(), rows["alive"].max(), 1))
        interval_s = float(rows["interval_s"].iloc[0])
        table = counts_table(rows["alive"].tolist(), capacity, interval_s, name=f"{FLEET}{tag}")
        table.attrs["source"] = self.where("fleet_intervals")
        if set(rows["provider"]) == {"aws"}:  # the cloud whose notice a simulation of it assumes (`trace_cloud`)
            table.attrs["cloud"] = "aws"
        return table

    def fleet_history(self, name: str, interval_s: float, capacity: int | None = None) -> pd.DataFrame:
        """The live fleet `name` (``fleet:<job tag>``) as a trace, at `interval_s`: the interval it was recorded
        with, since a count per interval cannot be cut otherwise (`FleetIntervalError`); an `UnknownTraceError`
        naming the fleets here when it is not one of them."""
        tag = name.removeprefix(FLEET)
        df = self.read("fleet_intervals") if self.exists() else None
        rows = None if df is None else df[df["job_tag"] == tag].sort_values("interval")
        if rows is None or rows.empty:
            fleets = [] if df is None else sorted(f"{FLEET}{t}" for t in df["job_tag"].unique())
            known = ", ".join(fleets[:8]) + (f" and {len(fleets) - 8} more" if len(fleets) > 8 else "")
            raise UnknownTraceError(name, fleets, message=f"no live fleet {name!r} in the trace store {self.uri}; "
                                    f"the fleets there: {known or 'none'} (`parcae traces` lists them)")  # fmt: skip
        recorded = float(rows["interval_s"].iloc[0])
        if recorded != interval_s:
            raise FleetIntervalError(name, recorded, interval_s)
        return self._fleet_table(tag, rows, capacity)

    # ------------------------------------------------------------------------- fleet trace export

    def fleet_events(self, job_tag: str) -> pd.DataFrame:
        """The job's fleet events, in time order."""
        df = self.read("fleet_events")
        df = df[df["job_tag"] == job_tag]
        rank = df["event"].map({"add": 0, "remove": 1})
        return df.assign(_rank=rank).sort_values(["timestamp", "_rank", "instance_id"]).drop(columns="_rank")

    def _event_log(self, job_tag: str) -> tuple[pd.Timestamp, list[tuple[int, str, str]]]:
        """Origin and a consistent ``(ms since origin, op, node)`` log of the job's fleet.

        Collected events may repeat a state (two collectors both saw a removal, an interruption notice
        followed by the termination) or remove an instance never seen alive; those are dropped here so the
        log satisfies :func:`forecasting.traces.read_event_csv` (no add of a live node, no remove of a dead
        one). At one instant an alive node is removed before it is re-added, a dead one added first.
        """
        df = self.fleet_events(job_tag)
        if df.empty:
            raise ValueError(f"no fleet events stored for job tag {job_tag!r} in {self.uri}")
        origin = as_utc(df["timestamp"].iloc[0])
        alive: set[str] = set()
        log: list[tuple[int, str, str]] = []
        records = zip(df["timestamp"], df["instance_id"], df["event"], strict=True)
        for (ts, node), group in itertools.groupby(sorted(records, key=lambda r: (r[0], r[1])), key=lambda r: r[:2]):
            ops = {op for _, _, op in group}
            order = ("remove", "add") if node in alive else ("add", "remove")
            ms = int((as_utc(ts) - origin) // pd.Timedelta(milliseconds=1))
            for op in order:
                if op not in ops or (op == "add") == (node in alive):
                    continue
                (alive.add if op == "add" else alive.discard)(node)
                log.append((ms, op, node))
        return origin, log

    def fleet_trace(self, job_tag: str) -> AvailabilityEvents:
        """The collected fleet as :class:`AvailabilityEvents`, binned exactly like its event CSV.

        Times are seconds since the first event, whose absolute time is ``start_time`` (the CSV written by
        :meth:`export_event_csv` cannot carry it). The trace ends at the last change.
        """
        origin, log = self._event_log(job_tag)
        return events_from_log(
            ((ms, op) for ms, op, _ in log),
            start_time=origin,
            name=job_tag,
            source=self.where("fleet_events"),
            fmt="event-csv",
        )

    def export_event_csv(self, job_tag: str, path: str | os.PathLike[str]) -> Path:
        """Write the job's fleet as a ``ts_ms,add|remove,node`` file for ``load_trace``; returns its path.

        ``ts_ms`` counts from the first event (absolute epoch ms would make the loaders pad decades of
        empty intervals); :meth:`fleet_trace` gives the absolute ``start_time``.
        """
        _, log = self._event_log(job_tag)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
        try:
            tmp.write_text("".join(f"{ms},{op},{node}\n" for ms, op, node in log), encoding="utf-8")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out


def _to_arrow(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    """``df`` as an Arrow table of ``schema``, column by column.

    Not ``pa.Table.from_pandas``: with pandas 3 it reads ``Series.values`` of tz-aware columns, which
    warns (Pandas4Warning); batches are small, so Python lists cost nothing that matters.
    """
    return pa.Table.from_pydict({f.name: pa.array(df[f.name].tolist(), type=f.type) for f in schema}, schema=schema)


def _first_per_key(data: pa.Table, key: Sequence[str]) -> pa.Table:
    """The first row of each natural key, in row order: the store's rule for rows written more than once."""
    rows = pa.array(np.arange(data.num_rows, dtype=np.int64))
    firsts = data.append_column("_row", rows).group_by(list(key), use_threads=False).aggregate([("_row", "min")])
    return data.take(np.sort(firsts["_row_min"].to_numpy()))


# ----------------------------------------------------------------------------------------- where parts live


class _Folder:
    """Parts in a local folder (or a mounted network volume): temp file, fsync, rename; a `filelock` lock, which
    the operating system releases when its holder dies."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def uri(self) -> str:
        return str(self.root.resolve())

    def exists(self) -> bool:
        return self.root.is_dir()

    def where(self, table: str) -> str:
        return str(self.root.resolve() / table)

    def names(self, table: str) -> list[str]:
        return sorted(p.name for p in (self.root / table).glob("part-*.parquet"))

    def read_all(self, table: str, names: Sequence[str], schema: pa.Schema) -> list[pa.Table | None]:
        """Each part's rows, None for a part removed since it was listed."""
        out: list[pa.Table | None] = []
        for name in names:
            try:
                out.append(pq.read_table(self.root / table / name, schema=schema))
            except FileNotFoundError:
                out.append(None)
        return out

    def write(self, table: str, name: str, data: pa.Table) -> None:
        directory = self.root / table
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".tmp-{uuid.uuid4().hex}.parquet"
        try:
            pq.write_table(data, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, directory / name)  # atomic on POSIX and Windows
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(directory)

    def delete(self, table: str, names: Sequence[str]) -> None:
        for name in names:
            (self.root / table / name).unlink(missing_ok=True)
        _fsync_dir(self.root / table)

    @contextlib.contextmanager
    def compaction_lock(self, table: str) -> Iterator[bool]:
        directory = self.root / table
        if not directory.is_dir():
            yield False
            return
        lock = FileLock(directory / _LOCK)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            yield False
            return
        try:
            cutoff = time.time() - _STALE_TMP_S
            for tmp in directory.glob(".tmp-*.parquet"):
                with contextlib.suppress(FileNotFoundError):
                    if tmp.stat().st_mtime < cutoff:
                        tmp.unlink()
            yield True
        finally:
            lock.release()


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (POSIX only; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _S3:
    """Parts as objects under ``s3://bucket/prefix/<table>/``: each PUT is atomic and S3 lists and reads what
    was written (strong consistency). The compaction lock is an object created only where none exists
    (``If-None-Match: *``) that carries its expiry: a dead holder's lock is taken over once expired."""

    def __init__(self, bucket: str, prefix: str, client: Any = None) -> None:
        import boto3  # deferred: a local store must not need boto3 at import

        self.bucket, self.prefix = bucket, prefix
        self.s3 = client if client is not None else boto3.client("s3")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def where(self, table: str) -> str:
        return f"s3://{self.bucket}/{self._key(table)}"

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as exc:
            err = exc.response.get("Error", {})
            raise OSError(f"trace store {self.uri}: {what}: {err.get('Code')}: {err.get('Message')}") from None
        except BotoCoreError as exc:
            raise OSError(f"trace store {self.uri}: {what}: {exc}") from None

    def exists(self) -> bool:
        start = f"{self.prefix}/" if self.prefix else ""
        with self._errors("list"):
            got = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=start, MaxKeys=1)
        return bool(got.get("KeyCount"))

    def names(self, table: str) -> list[str]:
        start = self._key(table, "part-")
        names: list[str] = []
        with self._errors(f"list {table}"):
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
                names += [o["Key"].rsplit("/", 1)[-1] for o in page.get("Contents", [])]
        return sorted(n for n in names if n.endswith(".parquet"))

    def read_all(self, table: str, names: Sequence[str], schema: pa.Schema) -> list[pa.Table | None]:
        """Each part's rows, None for a part removed since it was listed; the GETs run in parallel (a request
        each: up to COMPACT_AT of them between compactions)."""

        def read(name: str) -> pa.Table | None:
            with self._errors(f"read {table}/{name}"):
                try:
                    body = self.s3.get_object(Bucket=self.bucket, Key=self._key(table, name))["Body"].read()
                except self.s3.exceptions.NoSuchKey:
                    return None
            return pq.read_table(pa.BufferReader(body), schema=schema)

        if len(names) < 2:
            return [read(n) for n in names]
        with ThreadPoolExecutor(max_workers=min(_READERS, len(names)), thread_name_prefix="trace-store") as pool:
            return list(pool.map(read, names))

    def write(self, table: str, name: str, data: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(data, sink)
        with self._errors(f"write {table}/{name}"):
            self.s3.put_object(Bucket=self.bucket, Key=self._key(table, name), Body=sink.getvalue().to_pybytes())

    def delete(self, table: str, names: Sequence[str]) -> None:
        keys = [{"Key": self._key(table, n)} for n in names]
        with self._errors(f"delete from {table}"):
            for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
                got = self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True})
                failed = got.get("Errors") or []  # per key, in a 200 answer: no exception of boto3's
                if failed:
                    first = failed[0]
                    raise OSError(f"trace store {self.uri}: delete from {table}: {len(failed)} object(s) not deleted, "
                                  f"{first.get('Key')}: {first.get('Code')}: {first.get('Message')}")  # fmt: skip

    @contextlib.contextmanager
    def compaction_lock(self, table: str) -> Iterator[bool]:
        from botocore.exceptions import ClientError

        key = self._key(table, _LOCK)
        held = False
        with self._errors(f"lock {table}"):
            for _ in range(2):  # the second try after taking over an expired lock
                holder = {"host": socket.gethostname(), "pid": os.getpid(), "expires": time.time() + _LEASE_S}
                try:
                    self.s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(holder).encode(), IfNoneMatch="*")
                    held = True
                    break
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") not in _TAKEN:
                        raise
                if not self._expired(key):
                    break
                self.s3.delete_object(Bucket=self.bucket, Key=key)
        if not held:
            yield False
            return
        try:
            yield True
        finally:
            with self._errors(f"unlock {table}"):
                self.s3.delete_object(Bucket=self.bucket, Key=key)

    def _expired(self, key: str) -> bool:
        try:
            holder = json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())
            return float(holder["expires"]) < time.time()
        except self.s3.exceptions.NoSuchKey:
            return True  # released meanwhile
        except (ValueError, KeyError, TypeError):
            return True  # not a lock this module wrote
