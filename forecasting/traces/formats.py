"""The trace file formats: one reader per format, each checking its file line by line.

Owns: the formats we read (Parcae/Bamboo event logs, running-count CSVs, the Bamboo GCP log, the 2020 AWS step
curves, SkyPilot "Can't Be Late" JSON arrays and their raw collector logs), `detect_format` / `read_events`
(sniffing and dispatch), and the bounds on what a file may hold (a hostile or mistaken file fails with a message,
not an OverflowError, a MemoryError or hours of work). Each reader returns `AvailabilityEvents`; count sources
carry their first observation as the initial state (`forecasting.traces.events.from_count_series`).
Must not touch: the per-interval grid (`forecasting.traces.table`), trace names (`forecasting.traces.catalog`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal, TypeGuard, Unpack

import numpy as np
import pandas as pd

from forecasting import jsonio
from forecasting.traces.events import AvailabilityEvents, EventsMeta, TraceFormatError, from_count_series
from liveput import MAX_INSTANCES  # the bound every count shares (plans too)

#: Format name -> the line (or document) shape it expects; used verbatim in error messages.
FORMATS: Final[dict[str, str]] = {
    "event-csv": "ts_ms,add|remove,node",
    "count-csv": "ts_ms,count",
    "gcp-log": "YYYY-MM-DD, HH:MM:SS, count",
    "skypilot-json": '{"metadata": {"gap_seconds": G}, "data": [count, ...]}',
    "skypilot-log": "tick,ISO8601,fail",
    "aws-step-csv": "seconds,count (hours,count for *_scaled files)",
}

# Cluster-size caps that the files do not state but their sources do (reference doc F.1, SOURCE.md files).
# Keyed by file stem so that the bundled copies and the shared originals agree.
_CAPACITY_BY_STEM: Final[dict[str, int]] = {
    "p3": 32,  # "up to 32 p3.2xlarge" (Parcae); also the bundled copy data/p3.csv and aws/traces/p3.csv
    "p3trace": 32,
    "p3-trace": 32,
    "v100x1-east1c": 80,  # Bamboo GCP log: "target 80 x 1xV100"
    "gcp-v100": 80,
}

_SNIFF_BYTES: Final = 4096  # enough for the first line of every text format and the JSON header

# Bounds on what a trace may hold, checked while reading, so that a hostile or mistaken file fails with a
# message instead of an OverflowError, a MemoryError or hours of work.
#: Bytes of one trace file: room for a count CSV of MAX_INTERVALS rows (about 20 bytes each); ours are under 1 MB.
MAX_TRACE_BYTES: Final = 256 * 2**20
#: Characters of one line of a line-based format (the longest real one has under 60).
MAX_LINE_CHARS: Final = 4096
#: Largest time value (ms, s or h) a field may hold: 2**53 is where float64 stops counting exactly.
MAX_TIME_VALUE: Final = 2**53
#: Absolute times (UTC) a trace may carry: the canonical table stores them as datetime64[ns], which ends in 2262.
TIME_RANGE: Final = (datetime(1900, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC))


# ------------------------------------------------------------------------------------ file reading


def _first_bad_byte(path: Path, data: bytes, expected: str) -> None:
    """Reject binary files up front: a NUL byte or invalid UTF-8 means this is not a trace."""
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise TraceFormatError(path, expected, line=line, reason="binary data (NUL byte), not a text trace")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceFormatError(path, expected, line=line, reason="binary data (not UTF-8 text)") from None


def _read_bytes(path: Path, expected: str) -> bytes:
    """The file's bytes, never more than MAX_TRACE_BYTES of them (a FIFO or /dev/zero would not end)."""
    with path.open("rb") as fh:
        data = jsonio.read_bounded(fh, MAX_TRACE_BYTES)
    if data is None:
        raise TraceFormatError(
            path,
            expected,
            reason=f"larger than {MAX_TRACE_BYTES:,} bytes, the most a trace file may hold; "
            "cut it into shorter traces or write it at a coarser interval",
        )
    return data


def _read_text(path: Path, expected: str) -> str:
    data = _read_bytes(path, expected)
    _first_bad_byte(path, data, expected)
    text = data.decode("utf-8-sig")  # tolerate a BOM from spreadsheet exports
    if not text.strip():
        raise TraceFormatError(path, expected, line=1, reason="file is empty")
    return text


def _lines(path: Path, expected: str) -> Iterator[tuple[int, str]]:
    """Non-blank lines with their 1-based physical line numbers; CRLF tolerated."""
    text = _read_text(path, expected)
    # split("\n") rather than splitlines(): splitlines also breaks on \x0b, \x1c, ... and would shift numbers
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if len(line) > MAX_LINE_CHARS:
            raise TraceFormatError(
                path, expected, line=number, got=line,
                reason=f"a line of {len(line):,} characters, more than the {MAX_LINE_CHARS:,} a trace line may have",
            )  # fmt: skip
        if line.strip():
            yield number, line


_INT_RE: Final = re.compile(r"[+-]?\d+")
# "\d+(\.\d*)?" rather than "\d+\.?\d*": the latter backtracks quadratically on a long run of digits
_NUM_RE: Final = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def _bad(path: Path, fmt: str, number: int, line: str, reason: str) -> TraceFormatError:
    """The error for one bad line of a line-based format."""
    return TraceFormatError(path, FORMATS[fmt], line=number, got=line, reason=reason)


def _fields(path: Path, fmt: str, number: int, line: str, n: int, sep: str = ",") -> list[str]:
    fields = [f.strip() for f in line.split(sep)]
    if len(fields) != n:
        raise _bad(path, fmt, number, line, f"{len(fields)} fields instead of {n}")
    return fields


def _short(value: object) -> str:
    """A value as an error message shows it: its repr, at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _int(path: Path, fmt: str, number: int, line: str, text: str, what: str, maximum: int = MAX_TIME_VALUE) -> int:
    """Parse an integer field in ``[0, maximum]``, naming the field and the bound in the error."""
    if not _INT_RE.fullmatch(text):
        raise _bad(path, fmt, number, line, f"{what} {_short(text)} is not an integer")
    digits = text.lstrip("+-").lstrip("0")
    if text.startswith("-") and digits:
        raise _bad(path, fmt, number, line, f"negative {what} {_short(text)}")
    # compare lengths first: int() refuses more than 4300 digits, and we need no more than 16
    if len(digits) > len(str(maximum)) or int(digits or "0") > maximum:
        raise _bad(path, fmt, number, line, f"{what} {_short(text)} is above the largest allowed, {maximum:,}")
    return int(digits or "0")


def _number(path: Path, fmt: str, number: int, line: str, text: str, what: str) -> float:
    """Parse a number field in ``[0, MAX_TIME_VALUE]``."""
    if not _NUM_RE.fullmatch(text):
        raise _bad(path, fmt, number, line, f"{what} {_short(text)} is not a number")
    value = float(text)
    if value < 0:
        raise _bad(path, fmt, number, line, f"negative {what} {_short(text)}")
    if value > MAX_TIME_VALUE:  # inf included
        raise _bad(path, fmt, number, line, f"{what} {_short(text)} is above the largest allowed, {MAX_TIME_VALUE:,}")
    return value


def _outside_years(path: Path, fmt: str, number: int, line: str, shown: str) -> TraceFormatError:
    earliest, latest = TIME_RANGE
    reason = f"time {shown} is outside the years {earliest.year}-{latest.year - 1} (UTC) a trace may cover"
    return _bad(path, fmt, number, line, reason)


def _check_when(path: Path, fmt: str, number: int, line: str, when: datetime) -> datetime:
    """An absolute time within TIME_RANGE."""
    if not TIME_RANGE[0] <= when < TIME_RANGE[1]:
        raise _outside_years(path, fmt, number, line, when.isoformat())
    return when


def _known_capacity(path: Path, fmt: str, observed_max: int) -> int | None:
    """The source's stated cluster cap, if we know one and the data respects it; else None (-> max)."""
    known: int | None = None
    if fmt == "skypilot-json":
        # SkyPilot folders are named "<N>-node": N instances were requested
        for part in reversed(path.parts):
            m = re.fullmatch(r"(\d+)-node", part)
            if m:
                known = int(m.group(1))
                break
    elif fmt == "skypilot-log":
        known = 1  # one spot request per probe
    else:
        known = _CAPACITY_BY_STEM.get(path.stem)
    # A user file that merely shares a stem (say, their own p3.csv with 40 nodes) must not get a cap
    # below its own data; fall back to the observed maximum there.
    if known is not None and known < observed_max:
        return None
    return known


def _finish(events: AvailabilityEvents, path: Path) -> AvailabilityEvents:
    return replace(events, capacity=_known_capacity(path, events.fmt, events.max_count))


def events_from_log(log: Iterable[tuple[int, str]], **meta: Unpack[EventsMeta]) -> AvailabilityEvents:
    """:class:`AvailabilityEvents` of a time-ordered ``(ts_ms, "add"|"remove")`` log, binned per second.

    Milliseconds are integer-divided to seconds as the reference does before binning; events in the same
    second are merged (gross adds/removes kept). ``meta`` fills the remaining fields (``name``,
    ``source``, ``fmt``, ``start_time``). The log is consumed lazily, so a generator that validates
    as it yields fails at the offending entry.
    """
    times: list[int] = []
    adds: list[int] = []
    removes: list[int] = []
    for ts_ms, op in log:
        second = ts_ms // 1000
        if not times or times[-1] != second:
            times.append(second)
            adds.append(0)
            removes.append(0)
        (adds if op == "add" else removes)[-1] += 1
    a = np.asarray(adds, dtype=np.int64)
    r = np.asarray(removes, dtype=np.int64)
    return AvailabilityEvents(
        times_s=np.asarray(times, dtype=np.float64),
        adds=a,
        removes=r,
        counts=np.cumsum(a - r),
        initial=0,
        last_s=float(times[-1]),
        **meta,
    )


def read_event_csv(path: str | os.PathLike[str]) -> AvailabilityEvents:
    """Read a ``ts_ms,add|remove,node`` event log (Parcae ``p3trace.csv``, Bamboo ``p3-trace.csv``).

    Each line is one instance joining or leaving. Node identities are tracked so that impossible logs
    (adding a live node, removing a dead one) fail loudly instead of producing negative counts later.
    Timestamps must not decrease; events in the same second are merged (gross adds/removes kept).
    """
    p = Path(path)
    fmt = "event-csv"

    def checked() -> Iterator[tuple[int, str]]:
        alive: set[str] = set()
        prev_ms: int | None = None
        for number, line in _lines(p, FORMATS[fmt]):
            ts_text, op, node = _fields(p, fmt, number, line, 3)
            ts_ms = _int(p, fmt, number, line, ts_text, "timestamp")
            if prev_ms is not None and ts_ms < prev_ms:
                raise _bad(p, fmt, number, line, f"timestamp {ts_ms} is before the previous {prev_ms}")
            prev_ms = ts_ms
            if op not in ("add", "remove"):
                raise _bad(p, fmt, number, line, f"unknown op {_short(op)}")
            if not node:
                raise _bad(p, fmt, number, line, "empty node name")
            if op == "add":
                if node in alive:
                    raise _bad(p, fmt, number, line, f"add of {_short(node)}, which is already alive")
                if len(alive) == MAX_INSTANCES:
                    raise _bad(p, fmt, number, line, f"more than {MAX_INSTANCES:,} instances alive at once")
                alive.add(node)
            else:
                if node not in alive:
                    raise _bad(p, fmt, number, line, f"remove of {_short(node)}, which is not alive")
                alive.remove(node)
            yield ts_ms, op

    return _finish(events_from_log(checked(), name=p.stem, source=str(p), fmt=fmt), p)


def read_count_csv(path: str | os.PathLike[str]) -> AvailabilityEvents:
    """Read a ``ts_ms,count`` running-count CSV (Parcae ``aws/traces/p3.csv``).

    Each row is the count after one event; rows at the same millisecond are separate events, so their
    changes are summed as gross adds/removes. The first row is the initial state (see
    :func:`from_count_series`): for ``p3.csv`` (first row ``0,1``) interval 0 therefore reads
    ``prev_available=1, n_in=17`` where the event log reads ``0, 18``; every later interval is identical.
    """
    p = Path(path)
    fmt = "count-csv"
    times: list[int] = []
    counts: list[int] = []
    prev_ms: int | None = None
    for number, line in _lines(p, FORMATS[fmt]):
        ts_text, count_text = _fields(p, fmt, number, line, 2)
        ts_ms = _int(p, fmt, number, line, ts_text, "timestamp")
        count = _int(p, fmt, number, line, count_text, "count", MAX_INSTANCES)
        if prev_ms is not None and ts_ms < prev_ms:
            raise _bad(p, fmt, number, line, f"timestamp {ts_ms} is before the previous {prev_ms}")
        prev_ms = ts_ms
        times.append(ts_ms // 1000)
        counts.append(count)
    return _finish(from_count_series(times, counts, name=p.stem, source=str(p), fmt=fmt), p)


_GCP_RE: Final = re.compile(r"(\d{4})-(\d{2})-(\d{2})\s*,\s*(\d{1,2}):(\d{2}):(\d{2})\s*,\s*(\S+)")


def read_gcp_log(path: str | os.PathLike[str]) -> AvailabilityEvents:
    """Read Bamboo's GCP log ``YYYY-MM-DD, HH:MM:SS, count`` (``traces/gcloud/v100x1-east1c.txt``).

    The log is read as an **append-only journal**, in file order:

    * a row ``(t, count)`` says "from time ``t`` on, the count is ``count``" until a later row (in the
      file) says otherwise;
    * a row whose ``t`` is earlier than the latest time read so far is a late re-statement: it
      supersedes every earlier-in-file observation at or after ``t``. Concretely we keep a list of
      ``(time, count)`` sorted by time and, for each row, drop the entries with ``time >= t`` and append
      ``(t, count)`` (a row at the latest time simply replaces it, a later one is appended);
    * an exact duplicate of a row already read (same time and count) changes nothing.

    Why: the logger writes every change as three rows one minute apart (``t``, ``t+60 s``,
    ``t+120 s``), and when the next change comes within two minutes its first row is written *after*
    the previous change's echo rows but carries an *earlier* time. Sorting by time and keeping the last
    row per timestamp (the rule used before) puts those stale echoes after the new change, so the series
    briefly reverts, e.g. ``60 -> 58 -> 60 -> 58`` within a minute. Measured on the bundled
    ``data/gcp-v100.txt`` (identical to ``v100x1-east1c.txt``, 1477 rows): the old rule gives 134 changes
    and 533 instances added / 533 removed; the journal rule gives 120 changes and 518 added / 518 removed
    (``tests/test_traces.py`` asserts both).

    Times are taken as UTC (the source does not say). The trace starts at its earliest row, whose time
    becomes ``start_time`` (the earliest time always survives: only a row at that very time replaces it); it
    ends at the latest time any row names, even if that row was later superseded: the log did cover that
    time.
    """
    p = Path(path)
    fmt = "gcp-log"
    journal: list[tuple[datetime, int]] = []  # sorted by time: the series as currently stated
    seen: set[tuple[datetime, int]] = set()
    latest: datetime | None = None
    for number, line in _lines(p, FORMATS[fmt]):
        m = _GCP_RE.fullmatch(line.strip())
        if not m:
            # say which part is wrong when the column count is the problem
            n = len(line.split(","))
            reason = f"{n} fields instead of 3" if n != 3 else "not a date, time and count"
            raise _bad(p, fmt, number, line, reason)
        count = _int(p, fmt, number, line, m.group(7), "count", MAX_INSTANCES)
        try:
            year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
            when = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
        except ValueError as exc:
            raise _bad(p, fmt, number, line, str(exc)) from None
        _check_when(p, fmt, number, line, when)
        latest = when if latest is None else max(latest, when)
        if (when, count) in seen:
            continue  # exact duplicate: no new information
        seen.add((when, count))
        while journal and journal[-1][0] >= when:
            journal.pop()  # superseded by this (late) re-statement
        journal.append((when, count))
    assert latest is not None  # _lines rejects files without a non-blank line
    start = journal[0][0]
    times = [(when - start).total_seconds() for when, _ in journal]
    counts = [count for _, count in journal]
    events = from_count_series(times, counts, start_time=pd.Timestamp(start), name=p.stem, source=str(p), fmt=fmt)
    # the trace runs to the latest time the log names, even where that row was superseded
    events = replace(events, last_s=(latest - start).total_seconds())
    return _finish(events, p)


def _json_line(text: str, needle: str | None) -> int:
    """1-based line of the first ``needle`` (to point at a bad JSON key), else of the first non-blank."""
    at = text.find(needle) if needle else -1
    if at < 0:
        at = len(text) - len(text.lstrip())  # first non-blank character
    return text.count("\n", 0, max(at, 0)) + 1


def _is_time_value(v: object) -> TypeGuard[int | float]:
    """A JSON number in [0, MAX_TIME_VALUE] (``math.isfinite`` would overflow on a huge integer)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return 0 <= v <= MAX_TIME_VALUE  # False for nan; an int compares exactly


def read_skypilot_json(path: str | os.PathLike[str]) -> AvailabilityEvents:
    """Read a SkyPilot "Can't Be Late" array ``{"metadata": {"gap_seconds": G}, "data": [...]}``.

    ``data[i]`` is the number of instances available at tick ``i`` (time ``i * G``); it holds until the
    next tick, so the trace covers ``len(data) * G`` seconds. Capacity comes from the ``<N>-node``
    folder name. Extra keys (``prices``) are ignored.
    """
    p = Path(path)
    fmt = "skypilot-json"
    expected = FORMATS[fmt]
    text = _read_text(p, expected)
    try:
        doc = jsonio.loads(text)
    except jsonio.JsonSyntaxError as exc:
        raise TraceFormatError(p, expected, line=exc.line, reason=f"invalid JSON: {exc.reason}") from None
    except jsonio.JsonInputError as exc:
        raise TraceFormatError(p, expected, line=exc.line, reason=exc.reason) from None
    if not isinstance(doc, dict):
        reason = f"top level is a JSON {type(doc).__name__}, not an object"
        raise TraceFormatError(p, expected, line=_json_line(text, None), reason=reason)
    meta = doc.get("metadata")
    gap = meta.get("gap_seconds") if isinstance(meta, dict) else None
    if not _is_time_value(gap) or gap <= 0:
        line = _json_line(text, '"gap_seconds"' if isinstance(meta, dict) and "gap_seconds" in meta else '"metadata"')
        reason = "missing metadata.gap_seconds"
        if gap is not None:
            reason = f"metadata.gap_seconds={_short(gap)} is not a positive number up to {MAX_TIME_VALUE:,}"
        raise TraceFormatError(p, expected, line=line, reason=reason)
    data = doc.get("data")
    line = _json_line(text, '"data"')
    if not isinstance(data, list) or not data:
        reason = "missing 'data'" if data is None else "'data' is not a non-empty list"
        raise TraceFormatError(p, expected, line=line, reason=reason)
    bad = next((i for i, v in enumerate(data) if type(v) is not int or not 0 <= v <= MAX_INSTANCES), None)
    if bad is not None:
        reason = f"data[{bad}] = {_short(data[bad])} is not an instance count (an integer from 0 to {MAX_INSTANCES:,})"
        raise TraceFormatError(p, expected, line=line, reason=reason)
    times = np.arange(len(data), dtype=np.float64) * float(gap)
    events = from_count_series(times, data, hold_s=float(gap), name=p.stem, source=str(p), fmt=fmt)
    return _finish(events, p)


def read_skypilot_log(path: str | os.PathLike[str]) -> AvailabilityEvents:
    """Read a raw SkyPilot collector log ``tick,ISO8601,fail`` (skypilot-spot-strategy).

    ``fail`` = 1 means the one-instance spot request failed, so available = 1 - fail (the released JSON
    arrays use the same, inverted, convention). Probes are irregular (about 600 s), so times are kept
    as observed, relative to the first probe, whose time becomes ``start_time``.
    """
    p = Path(path)
    fmt = "skypilot-log"
    times: list[datetime] = []
    counts: list[int] = []
    prev_tick: int | None = None
    for number, line in _lines(p, FORMATS[fmt]):
        tick_text, when_text, fail_text = _fields(p, fmt, number, line, 3)
        tick = _int(p, fmt, number, line, tick_text, "tick")
        if prev_tick is not None and tick <= prev_tick:
            raise _bad(p, fmt, number, line, f"tick {tick} does not follow {prev_tick}")
        prev_tick = tick
        try:
            when = datetime.fromisoformat(when_text)
            when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
        except ValueError:
            raise _bad(p, fmt, number, line, f"{_short(when_text)} is not an ISO 8601 time") from None
        except OverflowError:  # an offset that moves the time past year 1 or 9999
            raise _outside_years(p, fmt, number, line, _short(when_text)) from None
        _check_when(p, fmt, number, line, when)
        if times and when < times[-1]:
            raise _bad(p, fmt, number, line, "time goes backwards")
        if fail_text not in ("0", "1"):
            raise _bad(p, fmt, number, line, f"fail must be 0 or 1, not {_short(fail_text)}")
        if times and when == times[-1]:  # same instant twice: the later probe wins
            counts[-1] = 1 - int(fail_text)
            continue
        times.append(when)
        counts.append(1 - int(fail_text))
    start = times[0]
    seconds = [(w - start).total_seconds() for w in times]
    events = from_count_series(seconds, counts, start_time=pd.Timestamp(start), name=p.stem, source=str(p), fmt=fmt)
    return _finish(events, p)


def _aws_step_is_hours(path: Path, first_time_text: str) -> bool:
    # Bamboo's "_scaled" files are in hours. One unsuffixed Bamboo file
    # (aws-spot-instances-p2-xlarge-2020-11-20-to-2020-11-23.csv) is also in hours (0.000 .. 88.695);
    # the seconds files always write integers, so a decimal point in the time column marks hours too.
    return path.stem.endswith("_scaled") or "." in first_time_text


def read_aws_step_csv(
    path: str | os.PathLike[str], unit: Literal["auto", "seconds", "hours"] = "auto"
) -> AvailabilityEvents:
    """Read Bamboo's Nov 2020 AWS step curves ``seconds,count`` (``_scaled``: ``hours,count``).

    The curves are drawn with vertical steps: a timestamp repeated with a new count means the count
    jumped there, so the last value at a timestamp wins. ``unit="auto"`` picks hours for ``*_scaled``
    files and for files whose times carry a decimal point.
    """
    p = Path(path)
    fmt = "aws-step-csv"
    raw: list[tuple[int, str, float, int]] = []
    for number, line in _lines(p, FORMATS[fmt]):
        t_text, count_text = _fields(p, fmt, number, line, 2)
        t = _number(p, fmt, number, line, t_text, "time")
        count = _int(p, fmt, number, line, count_text, "count", MAX_INSTANCES)
        if raw and t < raw[-1][2]:
            raise _bad(p, fmt, number, line, f"time {t_text} is before the previous {raw[-1][2]:g}")
        raw.append((number, line, t, count))
    hours = unit == "hours" or (unit == "auto" and _aws_step_is_hours(p, _time_text(raw[0][1])))
    scale = 3600.0 if hours else 1.0
    last: dict[float, int] = {}
    for _, _, t, count in raw:
        last[t] = count  # insertion order is time order; the last value at a time wins
    # rounding to microseconds removes float noise from hours * 3600 before flooring onto the grid
    times = [round(t * scale, 6) for t in last]
    events = from_count_series(times, list(last.values()), name=p.stem, source=str(p), fmt=fmt)
    return _finish(events, p)


def _time_text(line: str) -> str:
    """The raw first field of a CSV line (used to decide the time unit from how it is written)."""
    return line.split(",", 1)[0].strip()


# --------------------------------------------------------------------------------- format dispatch

_READERS: Final[dict[str, Callable[[Path], AvailabilityEvents]]] = {
    "event-csv": read_event_csv,
    "count-csv": read_count_csv,
    "gcp-log": read_gcp_log,
    "skypilot-json": read_skypilot_json,
    "skypilot-log": read_skypilot_log,
    "aws-step-csv": read_aws_step_csv,
}

_SNIFF: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("gcp-log", re.compile(r"\d{4}-\d{2}-\d{2}\s*,\s*\d{1,2}:\d{2}:\d{2}\s*,")),
    ("skypilot-log", re.compile(r"\d+\s*,\s*\d{4}-\d{2}-\d{2}T")),
    ("event-csv", re.compile(r"[^,]*,\s*(add|remove)\s*,")),
    ("two-numbers", re.compile(r"[+-]?[\d.]+\s*,\s*[+-]?\d+")),
)


def _first_line(path: Path) -> tuple[int, str]:
    """First non-blank line of the file (from its first few KiB) and its number."""
    expected = "one of: " + "; ".join(FORMATS.values())
    with path.open("rb") as fh:
        chunk = fh.read(_SNIFF_BYTES)
        truncated = bool(fh.read(1))
    if truncated:  # do not mistake a multi-byte character cut at the chunk end for binary data
        for cut in range(4):
            try:
                chunk[: len(chunk) - cut].decode("utf-8")
                chunk = chunk[: len(chunk) - cut]
                break
            except UnicodeDecodeError:
                continue
    _first_bad_byte(path, chunk, expected)
    text = chunk.decode("utf-8-sig")
    for number, raw in enumerate(text.split("\n"), start=1):
        if raw.strip():
            return number, raw.rstrip("\r").strip()
    if truncated:  # only blank lines so far: look at the whole file (rare, so no need to be clever)
        number, line = next(_lines(path, expected))
        return number, line.strip()
    raise TraceFormatError(path, expected, line=1, reason="file is empty")


def detect_format(path: str | os.PathLike[str]) -> str:
    """Name of the format of ``path`` (a key of :data:`FORMATS`), from its first non-blank line.

    ``ts_ms,count`` and Bamboo's ``seconds,count`` look alike; they differ in time unit, which only the
    file name reveals: Bamboo's files are named ``aws-spot-instances-*`` (or end in ``_scaled``), and
    a decimal point in the time column means hours (also Bamboo).
    """
    p = Path(path)
    number, line = _first_line(p)
    if line.startswith("{"):
        with p.open("rb") as fh:
            head = fh.read(_SNIFF_BYTES).decode("utf-8", errors="replace")
        if re.match(r'\s*\{\s*"(metadata|data)"', head) or '"gap_seconds"' in head:
            return "skypilot-json"
    for fmt, pattern in _SNIFF:
        if pattern.match(line):
            if fmt != "two-numbers":
                return fmt
            time_text = _time_text(line)
            bamboo = p.name.startswith("aws-spot-instances") or p.stem.endswith("_scaled")
            return "aws-step-csv" if bamboo or "." in time_text else "count-csv"
    raise TraceFormatError(
        p,
        "one of: " + "; ".join(FORMATS.values()),
        line=number,
        got=line,
        reason="unrecognised trace format",
    )


def read_events(path: str | os.PathLike[str], fmt: str | None = None) -> AvailabilityEvents:
    """Read any supported trace file (format sniffed unless ``fmt`` names one of :data:`FORMATS`)."""
    p = Path(path)
    if fmt is None:
        fmt = detect_format(p)
    try:
        reader = _READERS[fmt]
    except KeyError:
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}") from None
    return reader(p)
