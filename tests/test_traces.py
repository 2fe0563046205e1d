"""Tests for forecasting.traces: loaders, the canonical table, resampling, slicing, scaling, errors.

Everything runs on the bundled traces and tiny files written into tmp_path; the tests that read
../shared/traces skip when it is absent.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forecasting import traces as T
from forecasting.traces import (
    COLUMNS,
    AvailabilityEvents,
    TraceFormatError,
    UnknownTraceError,
    available_traces,
    detect_format,
    load_trace,
    read_aws_step_csv,
    read_count_csv,
    read_event_csv,
    read_events,
    read_gcp_log,
    read_skypilot_json,
    read_skypilot_log,
    resample,
    scale_trace,
    slice_hours,
)

SHARED = T.shared_traces_dir()
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared traces not present at {SHARED}")


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    return path


def rows(df: pd.DataFrame) -> list[tuple[int, int, int, int, int]]:
    """(interval, prev_available, n_in, n_out, available) per row, for compact hand-checked asserts."""
    cols = ["interval", "prev_available", "n_in", "n_out", "available"]
    return [tuple(int(v) for v in r) for r in df[cols].itertuples(index=False)]


def assert_invariants(df: pd.DataFrame) -> None:
    assert tuple(df.columns) == COLUMNS
    avail = df["available"].to_numpy()
    prev = df["prev_available"].to_numpy()
    assert np.array_equal(avail, prev + df["n_in"].to_numpy() - df["n_out"].to_numpy())
    assert (avail >= 0).all() and (prev >= 0).all()
    assert (df["n_in"] >= 0).all() and (df["n_out"] >= 0).all()
    assert (avail <= df["capacity"].to_numpy()).all()
    assert np.array_equal(prev[1:], avail[:-1])
    assert np.array_equal(np.diff(df["interval"].to_numpy()), np.ones(len(df) - 1))
    assert (df["capacity"] == df.attrs["capacity"]).all()


# A small event log whose 60 s / 30 s / 120 s / 300 s tables are worked out by hand below.
EVENTS = """0,add,a
0,add,b
0,add,c
30000,remove,a
65000,add,d
100000,remove,b
170000,add,e
250000,remove,c
"""


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return write(tmp_path, "small.csv", EVENTS)


# ------------------------------------------------------------------------------------ the p3 trace


@pytest.fixture(scope="module")
def p3() -> pd.DataFrame:
    return load_trace("p3")


def test_p3_matches_reference_facts(p3: pd.DataFrame) -> None:
    assert len(p3) == 683
    assert p3["interval"].tolist() == list(range(683))
    assert rows(p3.head(1)) == [(0, 0, 18, 0, 18)]
    assert p3["available"].min() == 10 and p3["available"].max() == 32
    assert p3["n_in"].sum() == 177 and p3["n_out"].sum() == 167
    assert p3.attrs["capacity"] == 32 and p3.attrs["interval_s"] == 60.0 and p3.attrs["name"] == "p3"
    assert p3["start_s"].iloc[-1] == 682 * 60.0
    assert p3["start_time"].isna().all()  # the p3 log has no absolute time
    assert round(p3["available"].mean(), 2) == 24.01
    assert_invariants(p3)


@pytest.mark.parametrize(
    ("start_h", "end_h", "first", "start_n", "mean_n", "lo", "hi", "lost", "gained"),
    [
        (5.5, 6.5, 330, 32, 27.48, 20, 32, 19, 16),  # trace_hh_55_65
        (8.0, 9.0, 480, 18, 16.82, 11, 24, 18, 17),  # trace_lh_80_90
        (10.0, 11.0, 600, 18, 14.63, 14, 18, 4, 0),  # trace_ll_10_11
        # hl_15_25: the reference rewrites the first interval to [0, N0, 0], which hides the +1 at minute 90
        (1.5, 2.5, 90, 27, 29.63, 23, 32, 11, 8),
    ],
)
def test_p3_hour_slices_match_replay_segments(
    p3: pd.DataFrame, start_h, end_h, first, start_n, mean_n, lo, hi, lost, gained
) -> None:
    seg = slice_hours(p3, start_h, end_h)
    assert seg["interval"].tolist() == list(range(first, first + 60))  # numbers kept
    assert seg.index.tolist() == list(range(60))  # index reset
    assert seg["available"].iloc[0] == start_n
    assert round(seg["available"].mean(), 2) == mean_n
    assert (seg["available"].min(), seg["available"].max()) == (lo, hi)
    assert seg["n_out"].sum() == lost and seg["n_in"].sum() == gained
    assert seg.attrs == p3.attrs


def test_bundled_gcp_v100(tmp_path: Path) -> None:
    df = load_trace("gcp-v100")
    assert df.attrs["capacity"] == 80 and df.attrs["format"] == "gcp-log"
    assert df["start_time"].iloc[0] == pd.Timestamp("2021-12-10 13:07:45", tz="UTC")
    assert df["start_time"].iloc[1] - df["start_time"].iloc[0] == pd.Timedelta(seconds=60)
    assert df["start_time"].dt.day_of_week.iloc[0] == 4  # a Friday
    assert (df["available"].min(), df["available"].max()) == (30, 80)
    assert rows(df.head(3)) == [(0, 80, 0, 0, 80), (1, 80, 0, 10, 70), (2, 70, 0, 10, 60)]
    assert_invariants(df)


def test_available_traces_always_has_bundled() -> None:
    names = available_traces()
    assert names["p3"].is_file() and names["gcp-v100"].is_file()


# --------------------------------------------------------------------------------- each loader


def test_event_csv_crlf_and_blank_trailing_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "ev.csv", b"0,add,n1\r\n0,add,n2\r\n61000,remove,n1\r\n\r\n\r\n")
    ev = read_event_csv(path)
    assert isinstance(ev, AvailabilityEvents)
    assert ev.times_s.tolist() == [0.0, 61.0] and ev.adds.tolist() == [2, 0] and ev.removes.tolist() == [0, 1]
    assert ev.counts.tolist() == [2, 1] and ev.initial == 0
    assert detect_format(path) == "event-csv"
    df = load_trace(path)
    assert rows(df) == [(0, 0, 2, 0, 2), (1, 2, 0, 1, 1)]
    assert df.attrs["capacity"] == 2 and df.attrs["name"] == "ev"  # no known cap: the maximum
    assert_invariants(df)


def test_events_are_immutable(small: Path) -> None:
    ev = read_event_csv(small)
    with pytest.raises(ValueError):
        ev.counts[0] = 99
    with pytest.raises(AttributeError):
        ev.initial = 5  # type: ignore[misc]


def test_count_csv_first_row_is_initial_state(tmp_path: Path) -> None:
    # two rows in the same second are two events: gross +2 and -1 are kept separately
    path = write(tmp_path, "counts.csv", "0,4\n30000,6\n30500,5\n90000,5\n125000,2\n")
    assert detect_format(path) == "count-csv"
    df = load_trace(path)
    assert rows(df) == [(0, 4, 2, 1, 5), (1, 5, 0, 0, 5), (2, 5, 0, 3, 2)]
    assert_invariants(df)


def _gcp_rows(path: Path) -> list[tuple[pd.Timestamp, int]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            day, clock, count = (f.strip() for f in line.split(","))
            out.append((pd.Timestamp(f"{day} {clock}"), int(count)))
    return out


def _sorted_last_per_time(path: Path) -> list[int]:
    """The previous GCP rule (sort by time, last row per timestamp wins), kept here as the baseline."""
    last: dict[pd.Timestamp, int] = {}
    for when, count in _gcp_rows(path):
        last.pop(when, None)
        last[when] = count
    return [count for _, count in sorted(last.items())]


def _changes(counts: list[int]) -> tuple[int, int, int]:
    """(number of changes, instances added, instances removed) of a count series."""
    deltas = np.diff(counts)
    return int((deltas != 0).sum()), int(deltas[deltas > 0].sum()), int(-deltas[deltas < 0].sum())


def test_gcp_log_journal_late_rows_supersede(tmp_path: Path) -> None:
    text = (
        "2021-12-10, 13:00:00, 10\r\n"
        "2021-12-10, 13:01:00, 10\r\n"
        "2021-12-10, 13:02:00, 10\r\n"
        "2021-12-10, 13:01:00, 8\r\n"  # late: from 13:01 on it is 8 (drops the 13:01 and 13:02 tens)
        "2021-12-10, 13:02:00, 8\r\n"
        "2021-12-10, 13:03:00, 8\r\n"
        "2021-12-10, 13:03:00, 8\r\n"  # exact duplicate: nothing changes
        "2021-12-10, 13:01:00, 10\r\n"  # exact duplicate of line 2, not adjacent: still nothing changes
        "2021-12-10, 13:00:30, 9\r\n"  # late: from 13:00:30 on it is 9, superseding every 8 above
    )
    path = write(tmp_path, "gcp.txt", text)
    assert detect_format(path) == "gcp-log"
    ev = read_gcp_log(path)
    assert ev.times_s.tolist() == [30.0] and ev.initial == 10 and ev.counts.tolist() == [9]
    assert ev.last_s == 180.0  # the latest time the log names, although its row was superseded
    df = load_trace(path)
    assert rows(df) == [(0, 10, 0, 1, 9), (1, 9, 0, 0, 9), (2, 9, 0, 0, 9), (3, 9, 0, 0, 9)]
    assert df["start_time"].tolist() == list(pd.date_range("2021-12-10 13:00", periods=4, freq="60s", tz="UTC"))
    assert df.attrs["capacity"] == 10
    assert_invariants(df)


def test_gcp_log_no_false_revert_from_echo_rows(tmp_path: Path) -> None:
    # The logger's pattern: each change written three times a minute apart; the second change (58 at
    # 13:01:13) arrives before the first change's last echo (60 at 13:02:00) would sort.
    text = (
        "2021-12-10, 13:00:00, 60\n"
        "2021-12-10, 13:01:00, 60\n"
        "2021-12-10, 13:02:00, 60\n"
        "2021-12-10, 13:01:13, 58\n"
        "2021-12-10, 13:02:13, 58\n"
        "2021-12-10, 13:03:13, 58\n"
    )
    path = write(tmp_path, "gcp.txt", text)
    assert _sorted_last_per_time(path) == [60, 60, 58, 60, 58, 58]  # old rule: 58 -> 60 -> 58 within a minute
    ev = read_gcp_log(path)
    assert ev.times_s.tolist() == [73.0] and ev.counts.tolist() == [58] and ev.removes.tolist() == [2]
    assert ev.adds.sum() == 0 and ev.last_s == 193.0
    df = load_trace(path)
    assert rows(df) == [(0, 60, 0, 0, 60), (1, 60, 0, 2, 58), (2, 58, 0, 0, 58), (3, 58, 0, 0, 58)]
    assert_invariants(df)


def test_bundled_gcp_v100_change_counts() -> None:
    path = T.BUNDLED["gcp-v100"]
    assert _changes(_sorted_last_per_time(path)) == (134, 533, 533)  # the old rule's false reverts
    ev = read_gcp_log(path)
    assert (len(ev.times_s), int(ev.adds.sum()), int(ev.removes.sum())) == (120, 518, 518)
    assert ev.initial == 80 and ev.counts[-1] == 80
    df = load_trace("gcp-v100")
    assert len(df) == 1451 and df["n_in"].sum() == 518 and df["n_out"].sum() == 518


def test_skypilot_json_ticks_hold_until_next(tmp_path: Path) -> None:
    doc = '{"metadata": {"gap_seconds": 90}, "data": [2, 2, 0, 1], "prices": [1.0, 1.0, 1.0, 1.0]}'
    path = write(tmp_path, "4-node/aws-08-03-2023/us-east-1f_v100_1.json", doc)
    assert detect_format(path) == "skypilot-json"
    ev = read_skypilot_json(path)
    assert ev.capacity == 4  # from the "4-node" folder
    df = load_trace(path)
    # ticks at 0, 90, 180, 270 s; the last holds to 360 s, so six 60 s intervals
    assert rows(df) == [
        (0, 2, 0, 0, 2),
        (1, 2, 0, 0, 2),
        (2, 2, 0, 0, 2),
        (3, 2, 0, 2, 0),
        (4, 0, 1, 0, 1),
        (5, 1, 0, 0, 1),
    ]
    assert df.attrs["capacity"] == 4
    assert_invariants(df)


def test_skypilot_log_is_one_minus_fail(tmp_path: Path) -> None:
    text = (
        "0,2022-10-26T22:05:04.000Z,1\n"
        "1,2022-10-26T22:15:04.000Z,0\n"
        "2,2022-10-26T22:25:05.000Z,0\n"
        "3,2022-10-26T22:35:05.000Z,1\n"
    )
    path = write(tmp_path, "us-west-2a_v100_1.txt", text)
    assert detect_format(path) == "skypilot-log"
    ev = read_skypilot_log(path)
    assert ev.initial == 0 and ev.times_s.tolist() == [600.0, 1801.0] and ev.counts.tolist() == [1, 0]
    df = load_trace(path)
    assert len(df) == 31 and df.attrs["capacity"] == 1
    assert rows(df.iloc[[9, 10, 29, 30]]) == [(9, 0, 0, 0, 0), (10, 0, 1, 0, 1), (29, 1, 0, 0, 1), (30, 1, 0, 1, 0)]
    assert df["start_time"].iloc[0] == pd.Timestamp("2022-10-26 22:05:04", tz="UTC")
    assert_invariants(df)


def test_aws_step_csv_seconds_and_vertical_steps(tmp_path: Path) -> None:
    path = write(tmp_path, "aws-spot-instances-g4dn-xlarge-us-east-1c-x.csv", "0,0\r\n100,0\r\n100,3\r\n250,3\r\n250,2")
    assert detect_format(path) == "aws-step-csv"  # by name: the same lines elsewhere are ts_ms,count
    df = load_trace(path)
    assert rows(df) == [(0, 0, 0, 0, 0), (1, 0, 3, 0, 3), (2, 3, 0, 0, 3), (3, 3, 0, 0, 3), (4, 3, 0, 1, 2)]
    assert_invariants(df)


def test_aws_step_csv_scaled_is_hours(tmp_path: Path) -> None:
    path = write(tmp_path, "curve_scaled.csv", "0.000,0\n0.050,4\n0.100,4\n0.100,1\n")
    assert detect_format(path) == "aws-step-csv"
    ev = read_aws_step_csv(path)
    assert ev.times_s.tolist() == [180.0, 360.0] and ev.counts.tolist() == [4, 1]
    df = load_trace(path)
    assert len(df) == 7 and rows(df.iloc[[3, 6]]) == [(3, 0, 4, 0, 4), (6, 4, 0, 3, 1)]
    # explicit unit overrides the file name
    assert read_aws_step_csv(path, unit="seconds").times_s.tolist() == [0.05, 0.1]


def test_single_row_trace_is_constant(tmp_path: Path) -> None:
    path = write(tmp_path, "aws-spot-instances-p2-xlarge-us-east-1a-x.csv", "0,8\r\n")
    df = load_trace(path)
    assert rows(df) == [(0, 8, 0, 0, 8)] and df.attrs["capacity"] == 8
    assert_invariants(df)


def test_read_events_dispatch(small: Path) -> None:
    assert read_events(small).counts.tolist() == read_events(small, fmt="event-csv").counts.tolist()
    with pytest.raises(ValueError, match="unknown trace format"):
        read_events(small, fmt="parquet")


# ------------------------------------------------------------------------- binning and resampling


def test_to_intervals_60s(small: Path) -> None:
    df = load_trace(small)
    assert list(df.columns) == list(COLUMNS)
    assert rows(df) == [(0, 0, 3, 1, 2), (1, 2, 1, 1, 2), (2, 2, 1, 0, 3), (3, 3, 0, 0, 3), (4, 3, 0, 1, 2)]
    assert df["start_s"].tolist() == [0.0, 60.0, 120.0, 180.0, 240.0]
    assert str(df["start_time"].dtype) == "datetime64[ns, UTC]" and df["start_time"].isna().all()
    assert df.attrs == {
        "name": "small",
        "source": str(small),
        "interval_s": 60.0,
        "capacity": 3,
        "format": "event-csv",
    }


def test_load_trace_30s_rebins_from_events(small: Path) -> None:
    df = load_trace(small, interval_s=30)
    assert rows(df) == [
        (0, 0, 3, 0, 3),
        (1, 3, 0, 1, 2),
        (2, 2, 1, 0, 3),
        (3, 3, 0, 1, 2),
        (4, 2, 0, 0, 2),
        (5, 2, 1, 0, 3),
        (6, 3, 0, 0, 3),
        (7, 3, 0, 0, 3),
        (8, 3, 0, 1, 2),
    ]
    assert df.attrs["interval_s"] == 30.0
    assert_invariants(df)


def test_resample_120s_and_300s(small: Path) -> None:
    df = load_trace(small)
    r120 = resample(df, 120)
    assert rows(r120) == [(0, 0, 4, 2, 2), (1, 2, 1, 0, 3), (2, 3, 0, 1, 2)]
    assert r120["start_s"].tolist() == [0.0, 120.0, 240.0] and r120.attrs["interval_s"] == 120.0
    assert rows(r120) == rows(load_trace(small, interval_s=120))  # same as binning the events directly
    assert rows(resample(df, 300)) == [(0, 0, 5, 3, 2)]
    assert_invariants(r120)


def test_resample_rejects_finer_or_non_multiple(small: Path) -> None:
    df = load_trace(small)
    with pytest.raises(ValueError, match="integer multiple"):
        resample(df, 30)
    with pytest.raises(ValueError, match="integer multiple"):
        resample(df, 90)


def test_resample_keeps_absolute_time(tmp_path: Path) -> None:
    gcp = load_trace("gcp-v100")
    r = resample(gcp, 300)
    assert r["start_time"].iloc[1] == gcp["start_time"].iloc[0] + pd.Timedelta(seconds=300)
    assert r["n_in"].sum() == gcp["n_in"].sum() and r["available"].iloc[-1] == gcp["available"].iloc[-1]
    assert_invariants(r)


def test_resample_p3_preserves_totals(p3: pd.DataFrame) -> None:
    r = resample(p3, 300)
    assert len(r) == 137  # ceil(683 / 5)
    assert r["n_in"].sum() == 177 and r["n_out"].sum() == 167
    assert_invariants(r)


# --------------------------------------------------------------------------------- slicing


def test_slice_keeps_interval_numbers(small: Path) -> None:
    df = load_trace(small)
    part = slice_hours(df, 60 / 3600, 180 / 3600)
    assert part["interval"].tolist() == [1, 2] and part.index.tolist() == [0, 1]
    assert rows(part) == rows(df.iloc[1:3])
    assert rows(resample(part, 120)) == [(0, 2, 1, 1, 2), (1, 2, 1, 0, 3)]  # grid stays aligned to 0


@pytest.mark.parametrize(("start_h", "end_h"), [(11.0, 12.0), (-1.0, 1.0), (2.0, 2.0), (3.0, 2.0), (20.0, 21.0)])
def test_slice_outside_or_empty_names_trace_length(p3: pd.DataFrame, start_h: float, end_h: float) -> None:
    with pytest.raises(ValueError, match="683 intervals"):
        slice_hours(p3, start_h, end_h)


# --------------------------------------------------------------------------------- scaling


def test_scale_trace_hand_computed(small: Path) -> None:
    df = load_trace(small)  # capacity 3
    scaled = scale_trace(df, 5)  # N' = floor(N * 5/3 + 0.5): 0->0, 2->3, 3->5
    assert rows(scaled) == [(0, 0, 3, 0, 3), (1, 3, 0, 0, 3), (2, 3, 2, 0, 5), (3, 5, 0, 0, 5), (4, 5, 0, 2, 3)]
    assert scaled.attrs["capacity"] == 5 and (scaled["capacity"] == 5).all()
    assert rows(df)[1] == (1, 2, 1, 1, 2)  # the input is untouched; gross 1/1 collapsed to 0/0 above
    assert_invariants(scaled)


def test_scale_trace_rounds_half_up(tmp_path: Path) -> None:
    path = write(tmp_path, "halves.csv", "0,1\n60000,3\n120000,5\n")
    df = load_trace(path, capacity=10)
    scaled = scale_trace(df, 5)  # 0.5 -> 1, 1.5 -> 2, 2.5 -> 3 (banker's rounding would give 0, 2, 2)
    assert scaled["available"].tolist() == [1, 2, 3]
    assert_invariants(scaled)


def test_scale_p3_to_16(p3: pd.DataFrame) -> None:
    scaled = scale_trace(p3, 16)
    assert scaled["available"].iloc[0] == 9 and scaled["available"].max() == 16 and scaled["available"].min() == 5
    assert_invariants(scaled)
    with pytest.raises(ValueError):
        scale_trace(p3, 0)


def test_capacity_argument(small: Path) -> None:
    assert load_trace(small, capacity=8).attrs["capacity"] == 8
    with pytest.raises(ValueError, match="below"):
        load_trace(small, capacity=2)


# --------------------------------------------------------------------------------- names


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(UnknownTraceError) as err:
        load_trace("no-such-trace")
    message = str(err.value)
    assert "p3" in message and "gcp-v100" in message and "path" in message
    assert isinstance(err.value, LookupError)


def test_shared_names_are_derived_from_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "shared"
    sky = '{"metadata": {"gap_seconds": 300}, "data": [1, 1]}'
    write(root, "parcae/aws/traces/p3.csv", "0,1\n0,2\n")
    write(root, "parcae/liveput/traces/p3trace.csv", "0,add,node1\n")
    write(root, "bamboo/traces/p3-trace.csv", "0,add,node1\r\n")
    write(
        root,
        "bamboo/doc/data/aws-spot-instances-g4dn-xlarge-us-east-1c-2020-11-20-1930-to-2020-11-21-2200.csv",
        "0,0\n",
    )
    write(
        root,
        "bamboo/doc/data/aws-spot-instances-g4dn-xlarge-us-east-1c-2020-11-20-1930-to-2020-11-21-2200_scaled.csv",
        "0.000,0\n",
    )
    write(root, "sky/availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json", sky)
    write(root, "sky/preemption/4-node/aws-08-03-2023/us-east-1f_v100_1.json", sky)
    write(root, "sky/availability/1-node/aws-02-15-2023/us-east-1c_v100_1.json", sky)
    write(root, "sky/preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json", sky)
    write(root, "log/2022-10-26T22-05/us-west-2a_k80_8.txt", "0,2022-10-26T22:05:04.000Z,0\n")
    write(root, "parcae/aws/traces/liveput_res/bert.json", '[{"interval": [0, 18, 0]}]')  # not availability
    write(root, "SOURCE.md", "# notes\n")
    monkeypatch.setenv("PARCAE_SHARED_TRACES", str(root))
    names = available_traces()
    shared = {k: v.relative_to(root).as_posix() for k, v in names.items() if k not in T.BUNDLED}
    assert shared == {
        "p3-counts": "parcae/aws/traces/p3.csv",
        "parcae-p3-events": "parcae/liveput/traces/p3trace.csv",
        "bamboo-p3-events": "bamboo/traces/p3-trace.csv",
        "aws2020-g4dn-us-east-1c-scaled": (
            "bamboo/doc/data/aws-spot-instances-g4dn-xlarge-us-east-1c-2020-11-20-1930-to-2020-11-21-2200_scaled.csv"
        ),
        "skypilot-16node-us-east-2b": "sky/availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json",
        "skypilot-4node-us-east-1f": "sky/preemption/4-node/aws-08-03-2023/us-east-1f_v100_1.json",
        "skypilot-1node-us-east-1c-v100-1-aws-02-15-2023": (
            "sky/availability/1-node/aws-02-15-2023/us-east-1c_v100_1.json"
        ),
        "skypilot-1node-us-east-1c-v100-1-aws-04-22-2023": (
            "sky/preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json"
        ),
        "skypilot-log-us-west-2a-k80-8": "log/2022-10-26T22-05/us-west-2a_k80_8.txt",
    }
    assert names["aws2020-g4dn-us-east-1c"] == T.BUNDLED["aws2020-g4dn-us-east-1c"]  # the bundled copy wins
    assert load_trace("skypilot-16node-us-east-2b").attrs["capacity"] == 16
    assert load_trace("p3-counts").attrs["name"] == "p3-counts"
    monkeypatch.setenv("PARCAE_SHARED_TRACES", str(tmp_path / "missing"))
    assert set(available_traces()) == set(T.BUNDLED)


# --------------------------------------------------------------------------------- malformed files

EV = "ts_ms,add|remove,node"
MALFORMED = [
    # (id, file name, content, reader, bad line, text the message must hold)
    ("wrong-columns", "cols.csv", "0,add,a\n1000,add\n", read_event_csv, 2, "2 fields instead of 3"),
    ("non-int-timestamp", "ts.csv", "0,add,a\n1.5,add,b\n", read_event_csv, 2, "not an integer"),
    ("unknown-op", "op.csv", "0,add,a\n\n1000,kill,a\n", read_event_csv, 3, "unknown op 'kill'"),
    ("decreasing-time", "dec.csv", "0,add,a\n5000,add,b\n4000,remove,a\n", read_event_csv, 3, "before the previous"),
    ("remove-dead-node", "dead.csv", "0,add,a\n1000,remove,b\n", read_event_csv, 2, "not alive"),
    ("add-live-node", "twice.csv", "0,add,a\r\n1000,add,a\r\n", read_event_csv, 2, "already alive"),
    ("negative-count", "neg.csv", "0,3\n60000,-1\n", read_count_csv, 2, "negative count"),
    ("count-decreasing", "cdec.csv", "60000,3\n0,2\n", read_count_csv, 2, "before the previous"),
    (
        "json-no-gap",
        "nogap.json",
        '{\n  "metadata": {"note": 1},\n  "data": [1]\n}',
        read_skypilot_json,
        2,
        "gap_seconds",
    ),
    ("json-no-metadata", "nometa.json", '{\n  "data": [1]\n}', read_skypilot_json, 1, "gap_seconds"),
    (
        "json-data-negative",
        "negdata.json",
        '{"metadata": {"gap_seconds": 60},\n "data": [1, -2]}',
        read_skypilot_json,
        2,
        "data[1]",
    ),
    (
        "json-data-float",
        "fdata.json",
        '{"metadata": {"gap_seconds": 60},\n "data": [1, 2.5]}',
        read_skypilot_json,
        2,
        "data[1]",
    ),
    (
        "json-data-bool",
        "bdata.json",
        '{"metadata": {"gap_seconds": 60},\n "data": [true]}',
        read_skypilot_json,
        2,
        "data[0]",
    ),
    (
        "json-data-not-list",
        "sdata.json",
        '{"metadata": {"gap_seconds": 60},\n\n "data": "1,2"}',
        read_skypilot_json,
        3,
        "not a non-empty list",
    ),
    (
        "json-invalid",
        "broken.json",
        '{"metadata": {"gap_seconds": 60},\n "data": [1, 2',
        read_skypilot_json,
        2,
        "invalid JSON",
    ),
    ("empty-file", "empty.csv", "", read_event_csv, 1, "empty"),
    ("blank-file", "blank.csv", "\n\r\n  \n", read_count_csv, 1, "empty"),
    ("binary-garbage", "garbage.csv", bytes(range(256)) * 4, read_event_csv, 1, "binary"),
    ("invalid-utf8", "latin.csv", b"0,add,a\n1000,add,b\n\xff\xfe\x80,add,c\n", read_event_csv, 3, "binary"),
    ("gcp-bad-date", "gcp.txt", "2021-12-10, 10:00:00, 5\n2021-13-10, 10:00:00, 5\n", read_gcp_log, 2, "month"),
    ("gcp-columns", "gcp2.txt", "2021-12-10, 10:00:00, 5\n2021-12-10, 10:01:00\n", read_gcp_log, 2, "fields"),
    (
        "skypilot-log-fail",
        "sky.txt",
        "0,2022-10-26T22:05:04.000Z,1\n1,2022-10-26T22:15:04.000Z,2\n",
        read_skypilot_log,
        2,
        "fail must be 0 or 1",
    ),
    ("aws-negative", "step.csv", "0,1\n10,-4\n", read_aws_step_csv, 2, "negative count"),
    ("unknown-format", "what.txt", "\nhello world\n", detect_format, 2, "unrecognised"),
]


@pytest.mark.parametrize(
    ("name", "content", "reader", "line", "needle"),
    [m[1:] for m in MALFORMED],
    ids=[m[0] for m in MALFORMED],
)
def test_malformed_file_names_file_and_line(tmp_path: Path, name, content, reader, line, needle) -> None:
    path = write(tmp_path, name, content)
    with pytest.raises(TraceFormatError) as err:
        reader(path)
    message = str(err.value)
    assert name in message and f"line {line}:" in message and needle in message, message
    assert "expected '" in message
    assert err.value.line == line


def test_load_trace_surfaces_format_errors(tmp_path: Path) -> None:
    # through the sniffing path too, never a bare pandas/json error
    for name, content in [("a.csv", "0,add,a\n5,remove,zz\n"), ("b.json", '{"data": [1]}'), ("c.csv", b"\x00\x01\x02")]:
        with pytest.raises(TraceFormatError, match=name):
            load_trace(write(tmp_path, name, content))


def test_error_message_shape(tmp_path: Path) -> None:
    path = write(tmp_path, "x.csv", "".join(f"{i * 1000},add,n{i}\n" for i in range(16)) + "abc\n")
    with pytest.raises(TraceFormatError) as err:
        read_event_csv(path)
    assert str(err.value).startswith(f"{path} line 17: ")
    assert str(err.value).endswith(f"expected '{EV}', got 'abc'")
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value) and isinstance(again, ValueError)


# --------------------------------------------------------------------------------- ../shared


@needs_shared
def test_every_shared_trace_loads_with_invariants() -> None:
    shared = {k: v for k, v in available_traces().items() if k not in T.BUNDLED}
    assert len(shared) >= 10
    for name in shared:
        df = load_trace(name)
        assert len(df) >= 1, name
        assert df.attrs["name"] == name
        assert_invariants(df)


@needs_shared
def test_shared_known_capacities_and_p3_copies(p3: pd.DataFrame) -> None:
    names = available_traces()
    for name, cap in [("skypilot-16node-us-east-2b", 16), ("skypilot-4node-us-east-1f", 4), ("gcp-v100x1-east1c", 80)]:
        if name in names:
            assert load_trace(name).attrs["capacity"] == cap
    for name in ("parcae-p3-events", "bamboo-p3-events"):
        if name in names:
            assert rows(load_trace(name)) == rows(p3)
    if "p3-counts" in names:
        counts = load_trace("p3-counts")
        # the running-count file starts at "0,1": its first row is the initial state, the rest is identical
        assert rows(counts.head(1)) == [(0, 1, 17, 0, 18)]
        assert rows(counts)[1:] == rows(p3)[1:]


@needs_shared
def test_shared_unscaled_and_scaled_step_curves_agree() -> None:
    names = available_traces()
    pairs = [(n, n + "-scaled") for n in names if n.startswith("aws2020") and n + "-scaled" in names]
    assert pairs
    for plain, scaled in pairs:
        a, b = load_trace(plain), load_trace(scaled)
        # hours are rounded to 3 decimals (3.6 s), so a change may move by one interval; levels agree
        assert abs(len(a) - len(b)) <= 1
        assert a["n_in"].sum() == b["n_in"].sum() and a["n_out"].sum() == b["n_out"].sum()


def test_trace_cloud_names_the_cloud_a_trace_was_measured_on(tmp_path):
    from forecasting import trace_cloud

    assert trace_cloud(load_trace("p3")) == "aws"
    assert trace_cloud(load_trace("gcp-v100")) == "gcp"
    assert trace_cloud(load_trace("aws2020-p2")) == "aws"
    own = tmp_path / "mine.csv"
    own.write_text("0,add,n1\n0,add,n2\n61000,remove,n1\n")
    assert trace_cloud(load_trace(str(own))) is None  # nothing says: the simulator assumes no notice
