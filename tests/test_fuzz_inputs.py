"""Generated hostile inputs (hypothesis) for every trace format and for the plan JSON: the only exceptions are the
project's own format errors, and no input makes a reader allocate beyond a bound.

Deterministic (``derandomize=True``, no example database) and bounded: 400 files per trace format (each read with
its reader and sniffed) and 500 plan inputs, 2,900 examples in about 30 s on two cores. The bound on the canonical
table (`forecasting.traces.MAX_INTERVALS`) is lowered to `SMALL_INTERVALS` here so that a generated trace that *is*
valid but long stays cheap, and the peak allocation of every read (tracemalloc, which numpy reports to) must stay
under `PEAK_BYTES`. The hand-picked cases are in `tests/test_hostile_inputs.py`.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import tracemalloc
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import forecasting.traces as traces
import forecasting.traces.table as trace_table
from parcae.cli import UserError, plan_from_input
from parcae.cli.common import strict_json as _strict_json
from parcae.cli.plan import _read_plan_input

SMALL_INTERVALS = 20_000  # the table bound while fuzzing: 20,000 rows of 8 int64 columns are 1.3 MB
PEAK_BYTES = 64 * 2**20  # most any one example may allocate (a file, its parse, its table)
FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
WORK = Path(tempfile.mkdtemp(prefix="parcae-fuzz-"))  # one file per format, rewritten by every example
atexit.register(shutil.rmtree, WORK, ignore_errors=True)


def bounded(run: Callable[[], object]) -> object:
    """``run()`` under tracemalloc; fails if its peak allocation passes PEAK_BYTES."""
    tracemalloc.start()
    try:
        return run()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < PEAK_BYTES, f"peak allocation {peak:,} bytes"


# ------------------------------------------------------------------------------------------ fields and lines

_digits = st.integers(1, 40).flatmap(lambda n: st.text("0123456789", min_size=n, max_size=n))
NUMBER = st.one_of(
    st.integers(0, 10**4).map(str),
    st.integers(-(10**30), 10**30).map(str),
    _digits,
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "-", "+1", "-0", "1e308", "1e400", "inf", "nan", "1.5", ".5", "0x10", "1_000", "٣", " 7 "]),
)
JUNK = st.text(max_size=6)
FIELD = st.one_of(NUMBER, JUNK)
DATE = st.builds("{:04d}-{:02d}-{:02d}".format, st.integers(0, 9999), st.integers(0, 13), st.integers(0, 32))
CLOCK = st.builds("{:02d}:{:02d}:{:02d}".format, st.integers(0, 25), st.integers(0, 61), st.integers(0, 61))
ISO = st.one_of(
    st.builds(lambda d, c, tz: f"{d}T{c}{tz}", DATE, CLOCK, st.sampled_from(["", "Z", "+00:00", "-23:59", "+14:00"])),
    st.datetimes().map(lambda d: d.isoformat()),
    JUNK,
)


def _rows(*fields: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    """Lines of the given fields, or of a wrong number of arbitrary fields."""
    good = st.tuples(*fields).map(",".join)
    wrong = st.lists(FIELD, max_size=5).map(",".join)
    return st.lists(st.one_of(good, good, wrong, st.just("")), min_size=0, max_size=12)


def _ordered_counts(time: st.SearchStrategy[int]) -> st.SearchStrategy[list[str]]:
    """A plausible series (times non-decreasing), so that generated files also reach the binning."""
    return st.lists(st.tuples(time, st.integers(0, 10**7)), min_size=1, max_size=12).map(
        lambda rows: [f"{t},{c}" for t, c in sorted(rows)]
    )


_STEP = st.one_of(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**16))  # ms; rarely a huge jump


def _events_log() -> st.SearchStrategy[list[str]]:
    """A valid log (every remove of a live node, times non-decreasing) but for its times' sizes."""

    def log(steps: list[tuple[int, bool]]) -> list[str]:
        t, alive, lines = 0, [], []
        for dt, add in steps:
            t += dt
            if add or not alive:
                alive.append(f"n{len(lines)}")
                lines.append(f"{t},add,{alive[-1]}")
            else:
                lines.append(f"{t},remove,{alive.pop()}")
        return lines

    return st.lists(st.tuples(_STEP, st.booleans()), min_size=1, max_size=12).map(log)


_WHEN = st.datetimes(min_value=datetime(1850, 1, 1), max_value=datetime(2300, 1, 1))


def _gcp_log() -> st.SearchStrategy[list[str]]:
    row = st.tuples(_WHEN, st.one_of(st.integers(0, 80), NUMBER))
    return st.lists(row, min_size=1, max_size=12).map(
        lambda rows: [f"{w:%Y-%m-%d}, {w:%H:%M:%S}, {c}" for w, c in rows]
    )


def _probe_log() -> st.SearchStrategy[list[str]]:
    row = st.tuples(_WHEN, st.sampled_from(["", "Z", "+02:00", "-23:59"]), st.sampled_from(["0", "1"]))
    return st.lists(row, min_size=1, max_size=12).map(
        lambda rows: [f"{i},{w.isoformat()}{tz},{fail}" for i, (w, tz, fail) in enumerate(sorted(rows))]
    )


LINES: dict[str, st.SearchStrategy[list[str]]] = {
    "event-csv": st.one_of(_events_log(), _rows(NUMBER, st.sampled_from(["add", "remove", "x", ""]), JUNK)),
    "count-csv": st.one_of(_ordered_counts(st.integers(0, 10**17)), _rows(NUMBER, NUMBER)),
    "gcp-log": st.one_of(
        _gcp_log(),
        st.lists(st.builds("{}, {}, {}".format, DATE, CLOCK, NUMBER), max_size=12),
        _rows(FIELD, FIELD, FIELD),
    ),
    "skypilot-log": st.one_of(
        _probe_log(),
        st.lists(st.tuples(st.integers(0, 10**6), ISO, st.sampled_from(["0", "1", "2"])), max_size=12).map(
            lambda rows: [f"{tick},{when},{fail}" for tick, when, fail in rows]
        ),
        _rows(NUMBER, ISO, FIELD),
    ),
    "aws-step-csv": st.one_of(_ordered_counts(st.integers(0, 10**17)), _rows(NUMBER, NUMBER)),
}
#: File names the formats' sniffing and unit rules look at.
FILE_NAMES = {
    "event-csv": "fuzz-events.csv",
    "count-csv": "fuzz-counts.csv",
    "gcp-log": "fuzz-gcp.txt",
    "skypilot-log": "fuzz-probe.log",
    "aws-step-csv": "aws-spot-instances-fuzz.csv",
    "skypilot-json": "fuzz-16-node.json",
}


def _text_file(lines: st.SearchStrategy[list[str]]) -> st.SearchStrategy[bytes]:
    joined = st.tuples(lines, st.sampled_from(["\n", "\r\n"]), st.sampled_from(["", "\ufeff"])).map(
        lambda t: (t[2] + t[1].join(t[0])).encode("utf-8", errors="surrogatepass")
    )
    return st.one_of(joined, joined, joined, st.binary(max_size=300))


# ------------------------------------------------------------------------------------------------ JSON values

JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(0, 40), st.floats(), st.text(max_size=6)
)
JSON_VALUE = st.recursive(
    JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner,
                                                                                   max_size=4)),
    max_leaves=10,
)  # fmt: skip
NESTING = st.integers(0, 400).map(lambda n: "[" * n + "1" + "]" * n)


def _json_text(value: st.SearchStrategy[object]) -> st.SearchStrategy[bytes]:
    """``value`` as JSON text (``NaN``/``Infinity`` included, as Python writes them), or broken JSON."""
    text = value.map(json.dumps)
    broken = st.tuples(text, st.integers(0, 50)).map(lambda t: t[0][: t[1]])
    other = st.one_of(broken, NESTING, st.text(max_size=40)).map(str.encode)
    return st.integers(0, 9).flatmap(
        lambda i: text.map(str.encode) if i < 7 else other if i < 9 else st.binary(max_size=200)
    )


_GAP = st.one_of(st.floats(0, 10**17), st.integers(1, 3600), st.integers(1, 3600), JSON_LEAF)
_DATA = st.one_of(
    st.lists(st.integers(0, 40), max_size=30),
    st.lists(st.integers(0, 10**7), max_size=5),
    st.lists(JSON_LEAF, max_size=8),
    JSON_VALUE,
)
SKYPILOT = st.one_of(
    st.fixed_dictionaries({"metadata": st.fixed_dictionaries({"gap_seconds": _GAP}), "data": _DATA}),
    st.fixed_dictionaries({"metadata": st.fixed_dictionaries({"gap_seconds": _GAP}), "data": _DATA}),
    st.fixed_dictionaries({"metadata": JSON_VALUE, "data": _DATA}),
)  # fmt: skip
FILES = {fmt: _text_file(lines) for fmt, lines in LINES.items()} | {"skypilot-json": _json_text(SKYPILOT)}


def _read(path: Path, fmt: str | None, interval_s: float) -> None:
    try:
        table = traces.to_intervals(traces.read_events(path, fmt), interval_s)
    except traces.TraceFormatError as exc:
        assert str(path) in str(exc) or "<trace>" in str(exc)  # the message names the file
        return
    assert 0 < len(table) <= SMALL_INTERVALS


def _check_trace(fmt: str, content: bytes, interval_s: float) -> None:
    path = WORK / FILE_NAMES[fmt]
    path.write_bytes(content)
    with mock.patch.object(trace_table, "MAX_INTERVALS", SMALL_INTERVALS):
        bounded(lambda: _read(path, fmt, interval_s))  # the given reader
        bounded(lambda: _read(path, None, interval_s))  # the sniffed one, as `--trace PATH` reads it


INTERVALS = st.sampled_from([1.0, 60.0, 3600.0])


@FUZZ
@given(content=FILES["event-csv"], interval_s=INTERVALS)
def test_event_csv(content: bytes, interval_s: float) -> None:
    _check_trace("event-csv", content, interval_s)


@FUZZ
@given(content=FILES["count-csv"], interval_s=INTERVALS)
def test_count_csv(content: bytes, interval_s: float) -> None:
    _check_trace("count-csv", content, interval_s)


@FUZZ
@given(content=FILES["gcp-log"], interval_s=INTERVALS)
def test_gcp_log(content: bytes, interval_s: float) -> None:
    _check_trace("gcp-log", content, interval_s)


@FUZZ
@given(content=FILES["skypilot-log"], interval_s=INTERVALS)
def test_skypilot_log(content: bytes, interval_s: float) -> None:
    _check_trace("skypilot-log", content, interval_s)


@FUZZ
@given(content=FILES["aws-step-csv"], interval_s=INTERVALS)
def test_aws_step_csv(content: bytes, interval_s: float) -> None:
    _check_trace("aws-step-csv", content, interval_s)


@FUZZ
@given(content=FILES["skypilot-json"], interval_s=INTERVALS)
def test_skypilot_json(content: bytes, interval_s: float) -> None:
    _check_trace("skypilot-json", content, interval_s)


# ---------------------------------------------------------------------------------------------- plan input


def _often(good: st.SearchStrategy[object], junk: st.SearchStrategy[object] = JSON_LEAF) -> st.SearchStrategy:
    """Mostly ``good``, sometimes ``junk``: deep enough into the document to reach the planner. (Not
    ``one_of(good, good, good, good, junk)``: one_of flattens the branches of a ``junk`` that is a one_of itself.)"""
    return st.integers(0, 4).flatmap(lambda i: good if i else junk)


_COUNT = _often(st.integers(0, 40))


def _law(events: list[tuple[object, object, float]]) -> list[list[object]]:
    """Events whose probabilities sum to 1 (the check most random laws fail first)."""
    total = sum(w for _, _, w in events)
    return [[i, o, w / total] for i, o, w in events]


_EVENTS = _often(
    st.lists(st.tuples(_COUNT, _COUNT, st.floats(0.01, 1)), min_size=1, max_size=3).map(_law),
    st.one_of(st.lists(st.one_of(st.tuples(_COUNT, _COUNT, JSON_LEAF).map(list), JSON_VALUE), max_size=3),
              JSON_VALUE),
)  # fmt: skip
_INTERVAL = _often(st.fixed_dictionaries({"prev_available": _COUNT}, optional={"events": _EVENTS}), JSON_VALUE)
_STATE = st.fixed_dictionaries({}, optional={
    "strategy": _often(st.tuples(st.integers(0, 4), st.integers(0, 8)).map(list), JSON_VALUE),
    "migrating": _often(st.booleans()),
    "leftover_ms": _often(st.floats(0, 10**6)),
})  # fmt: skip
PLAN_DOC = _often(
    st.fixed_dictionaries(
        {"model": _often(st.sampled_from(["gpt-1.5b", "bert", "resnet152"])),
         "forecast": _often(st.lists(_INTERVAL, min_size=1, max_size=3), JSON_VALUE)},
        optional={"interval_s": _often(st.floats(0.5, 7200)), "state": _often(_STATE, JSON_VALUE)},
    ),
    JSON_VALUE,
)  # fmt: skip


def _plan(path: Path) -> None:
    try:
        # the read and parse are what a hostile file controls: they run under the allocation bound; the planner
        # runs outside it (tracemalloc slows its numpy ten-fold; its work is bounded by what the validation admits)
        doc = bounded(lambda: _read_plan_input(str(path)))
        out = plan_from_input(doc)
    except UserError as exc:
        assert "Traceback" not in str(exc) and len(str(exc)) < 1000
        return
    json.loads(_strict_json(out, "the plan"), parse_constant=_refuse)  # strict JSON: no NaN, no Infinity


def _refuse(token: str) -> None:
    raise AssertionError(f"{token} in the plan's JSON")


@settings(parent=FUZZ, max_examples=500)
@given(content=_json_text(PLAN_DOC))
def test_plan_input(content: bytes) -> None:
    path = WORK / "plan.json"
    path.write_bytes(content)
    _plan(path)
