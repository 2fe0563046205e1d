"""Tests for forecasting.trace_store: appends, reads, compaction, in a folder and on S3 (moto, in-process and
``ThreadedMotoServer`` on 127.0.0.1), and what a store that cannot work says."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pandas as pd
import pytest
from _aws import fake_aws_account, isolate_aws
from moto import mock_aws

from forecasting.trace_store import TABLES, TraceStore

REGION = "us-east-1"
BUCKET = "parcae-traces"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_aws(monkeypatch, tmp_path)
    fake_aws_account(monkeypatch, REGION)


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TraceStore]:
    """The same store in a folder and at an S3 prefix (moto in-process)."""
    if request.param == "folder":
        yield TraceStore(tmp_path / "store")
        return
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield TraceStore(f"s3://{BUCKET}/team/traces")


def price_row(hour: int, price: float = 0.9) -> dict:
    return {"region": REGION, "instance_type": "p3.2xlarge", "az": "us-east-1a", "product": "Linux/UNIX",
            "timestamp": T0 + timedelta(hours=hour), "price": price, "observed_at": T0}  # fmt: skip


def interval_row(tag: str, interval: int, alive: int) -> dict:
    return {"job_tag": tag, "provider": "market", "interval": interval, "interval_s": 60.0, "capacity": 8,
            "requested": 1, "granted": 1, "refused": 0, "reclaimed": 0, "alive": alive, "timestamp": T0}  # fmt: skip


def test_store_appends_atomic_parts_and_dedups_on_read(store: TraceStore) -> None:
    assert not store.exists()
    assert list(store.read("spot_prices").columns) == [
        "region", "instance_type", "az", "product", "timestamp", "price", "observed_at",
    ]  # fmt: skip
    row, later = price_row(0), price_row(1, 1.1)
    assert store.append("spot_prices", [row, row]) == 1  # duplicate within a batch
    assert store.append("spot_prices", [row, later]) == 1  # the stored key is skipped
    assert store.append("spot_prices", [row], skip_existing=False) == 1  # a racing writer's copy
    assert store.exists() and len(store.parts("spot_prices")) == 3
    df = store.read("spot_prices")
    assert len(df) == 2 and df["price"].tolist() == [0.9, 1.1]
    assert str(df["timestamp"].dt.tz) == "UTC"
    with pytest.raises(ValueError, match="unknown table"):
        store.read("nope")
    with pytest.raises(ValueError, match="lack column"):
        store.append("spot_prices", [{"region": REGION}])


def test_compaction_merges_the_parts_into_what_read_returned(store: TraceStore) -> None:
    for i in range(4):
        store.append("fleet_intervals", [interval_row("a", i, i), interval_row("b", i, 10 + i)])
    store.append("fleet_intervals", [interval_row("a", 1, 99)], skip_existing=False)  # a racing writer's copy
    before, parts = store.read("fleet_intervals"), store.parts("fleet_intervals")
    assert store.compact("fleet_intervals", min_parts=6) == {"fleet_intervals": 0}  # 5 parts: left alone
    assert store.compact(min_parts=2) == {t: 4 if t == "fleet_intervals" else 0 for t in TABLES}
    (merged,) = store.parts("fleet_intervals")  # a new part where the oldest was: newer appends sort after it
    assert merged != parts[0] and merged.rsplit("-", 1)[0] == parts[0].rsplit("-", 1)[0]
    pd.testing.assert_frame_equal(store.read("fleet_intervals"), before)
    assert before.set_index(["job_tag", "interval"]).loc[("a", 1), "alive"] == 1  # the first written
    store.append("fleet_intervals", [interval_row("a", 0, 98), interval_row("a", 4, 4)], skip_existing=False)
    after = store.read("fleet_intervals")
    assert after.iloc[:-1].equals(before) and after.iloc[-1]["alive"] == 4  # the merged rows still win
    histories = store.fleet_histories()
    assert sorted(histories) == ["fleet:a", "fleet:b"]
    assert histories["fleet:a"].attrs["source"] == store.where("fleet_intervals")


def test_a_read_lists_again_when_a_compaction_removes_a_part_under_it(store: TraceStore, monkeypatch) -> None:
    store.append("fleet_intervals", [interval_row("a", 0, 3)])
    listed = store.parts("fleet_intervals")
    gone = [*listed, "part-merged-away.parquet"]
    calls = iter([gone, gone, listed])
    monkeypatch.setattr(TraceStore, "parts", lambda self, table: next(calls))
    assert store.read("fleet_intervals")["alive"].tolist() == [3]
    monkeypatch.setattr(TraceStore, "parts", lambda self, table: gone)
    with pytest.raises(FileNotFoundError, match="part-merged-away.parquet was listed, then missing"):  # no cover-up
        store.read("fleet_intervals")


def test_appends_and_reads_go_on_while_the_store_compacts(store: TraceStore) -> None:
    stop = threading.Event()
    merged: list[int] = []

    def compact() -> None:
        while not stop.wait(0.005):  # (a loop that never yields starves the appends of the GIL on S3's mock)
            merged.append(store.compact("fleet_intervals", min_parts=2)["fleet_intervals"])

    thread = threading.Thread(target=compact)
    thread.start()
    try:
        for i in range(40):
            store.append("fleet_intervals", [interval_row("a", i, i)], skip_existing=False)
            assert store.read("fleet_intervals")["interval"].tolist() == list(range(i + 1))
    finally:
        stop.set()
        thread.join()
    assert sum(merged) > 0 and len(store.parts("fleet_intervals")) <= 2


def test_two_compactions_at_once_lose_no_row(store: TraceStore) -> None:
    """The lock makes a second compaction skip; where it does not hold (an S3 lock taken over from a holder
    thought dead), neither compaction overwrites a part: each removes only parts whose rows it wrote first."""
    for i in range(6):
        store.append("fleet_intervals", [interval_row("a", i, i)])
    backend = type(store._parts)
    real_write = backend.write
    calls: list[str] = []

    def write_after_another(parts, table, name, data):  # the first compaction listed, then waits for a second
        calls.append(name)
        if len(calls) == 2:  # the first compaction's merged part (the first call is the append's below)
            store.append("fleet_intervals", [interval_row("a", 6, 6)])
            assert store._compact(table, 2) == 6  # the second: the six parts and the new one, all merged
        real_write(parts, table, name, data)

    backend.write = write_after_another
    try:
        calls.append("first compaction")
        assert store._compact("fleet_intervals", 2) == 5
    finally:
        backend.write = real_write
    assert store.read("fleet_intervals")["interval"].tolist() == list(range(7))  # interval 6 kept
    assert len(store.parts("fleet_intervals")) == 2  # both merged parts: the same rows, read once


def test_a_folder_store_skips_a_locked_table_and_clears_stale_temp_files(tmp_path: Path) -> None:
    from filelock import FileLock

    store = TraceStore(tmp_path)
    for i in range(3):
        store.append("fleet_intervals", [interval_row("a", i, i)])
    table = tmp_path / "fleet_intervals"
    stale, fresh = table / ".tmp-crashed.parquet", table / ".tmp-writing.parquet"
    for tmp in (stale, fresh):
        tmp.write_bytes(b"half a file")
    os.utime(stale, (0, 0))
    assert len(store.read("fleet_intervals")) == 3  # a temp file is no part
    with FileLock(table / ".compact.lock"):  # another process compacts: skipped
        assert store.compact("fleet_intervals", min_parts=2) == {"fleet_intervals": 0}
    assert store.compact("fleet_intervals", min_parts=2) == {"fleet_intervals": 2}
    assert not stale.exists() and fresh.exists()
    assert store.uri == str(tmp_path.resolve()) and store.where("fleet_intervals") == str(table.resolve())


def test_an_s3_store_skips_a_held_lock_and_takes_over_an_expired_one() -> None:
    with mock_aws():
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        store = TraceStore(f"s3://{BUCKET}/traces")
        for i in range(3):
            store.append("fleet_intervals", [interval_row("a", i, i)])
        lock = "traces/fleet_intervals/.compact.lock"
        s3.put_object(Bucket=BUCKET, Key=lock, Body=json.dumps({"expires": time.time() + 600}).encode())
        assert store.compact("fleet_intervals", min_parts=2) == {"fleet_intervals": 0}  # held elsewhere
        s3.put_object(Bucket=BUCKET, Key=lock, Body=json.dumps({"expires": time.time() - 1}).encode())
        assert store.compact("fleet_intervals", min_parts=2) == {"fleet_intervals": 2}  # its holder died
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="traces/")["Contents"]]
        assert len(keys) == 1 and keys[0].startswith("traces/fleet_intervals/part-")  # the lock released
        assert (
            store.uri == f"s3://{BUCKET}/traces" and store.where("spot_prices") == f"s3://{BUCKET}/traces/spot_prices"
        )


def test_an_s3_delete_refused_per_key_is_an_error_not_a_silent_leftover(monkeypatch) -> None:
    """DeleteObjects answers 200 with an error per key it could not delete (no permission, say): the compaction
    says so, and the rows still read once."""
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        store = TraceStore(f"s3://{BUCKET}/traces")
        for i in range(3):
            store.append("fleet_intervals", [interval_row("a", i, i)])
        client = store._parts.s3
        denied = {"Errors": [{"Key": "traces/fleet_intervals/x", "Code": "AccessDenied", "Message": "Access Denied"}]}
        monkeypatch.setattr(client, "delete_objects", lambda **_: denied)
        with pytest.raises(OSError, match=r"delete from fleet_intervals: 1 object\(s\) not deleted.*AccessDenied"):
            store.compact("fleet_intervals", min_parts=2)
        assert store.read("fleet_intervals")["interval"].tolist() == [0, 1, 2]


def test_a_store_that_cannot_work_says_which_and_why(tmp_path: Path) -> None:
    for bad in ("gs://bucket/x", "s3://", "s3:///prefix"):
        with pytest.raises(ValueError, match="trace store"):
            TraceStore(bad)
    with mock_aws():
        store = TraceStore("s3://no-such-bucket/traces")
        with pytest.raises(OSError, match=r"trace store s3://no-such-bucket/traces: .*NoSuchBucket"):
            store.append("fleet_intervals", [interval_row("a", 0, 1)], skip_existing=False)
        with pytest.raises(OSError, match="NoSuchBucket"):
            store.read("fleet_intervals")


def test_an_s3_store_against_moto_server_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real HTTP path: boto3 finds the endpoint in $AWS_ENDPOINT_URL_S3, the lock's If-None-Match is a
    header the server honours."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://{host}:{port}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        store = TraceStore(f"s3://{BUCKET}")
        for i in range(3):
            store.append("spot_prices", [price_row(i)])
        s3.put_object(Bucket=BUCKET, Key="spot_prices/.compact.lock", Body=b'{"expires": 1e12}')
        assert store.compact("spot_prices", min_parts=2) == {"spot_prices": 0}
        s3.delete_object(Bucket=BUCKET, Key="spot_prices/.compact.lock")
        assert store.compact("spot_prices", min_parts=2) == {"spot_prices": 2}
        assert store.read("spot_prices")["timestamp"].tolist() == [
            pd.Timestamp(T0 + timedelta(hours=i)) for i in range(3)
        ]
    finally:
        server.stop()


def test_the_retrain_flow_s_corpus_reads_a_store_in_s3() -> None:
    """The forecaster's retraining (another machine than the fleets' drivers) takes their histories from S3."""
    from tasks.traces import load_training_corpus

    with mock_aws():
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        store = TraceStore(f"s3://{BUCKET}/traces")
        store.append("fleet_intervals", [interval_row("a@1", i, n) for i, n in enumerate([4, 6, 8, 8, 5])])
        corpus = load_training_corpus.fn(["p3", "fleet:a@1"], store=store.uri)
        assert list(corpus) == ["p3", "fleet:a@1"] and corpus["fleet:a@1"]["available"].tolist() == [4, 6, 8, 8, 5]
        assert "fleet:a@1" not in load_training_corpus.fn(None, store=f"s3://{BUCKET}/elsewhere")  # nothing there
