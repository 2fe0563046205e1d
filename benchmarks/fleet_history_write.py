"""What a live fleet's boundary waits for to record its history: the write itself against a queued one, side by side.

At each interval's boundary (training held) the fleet's row goes to the trace store's ``fleet_intervals``. It used
to be written there and then (`TraceStore.append`: a file with its fsync on a disk, a PUT on S3); the
`FleetHistoryWriter` now queues it for a thread of its own. This times both on the same store: ``--intervals``
boundaries each way, the median and the slowest of each, and checks that every row the writer was told is stored.
Stores: a temporary folder, and S3 served by moto on 127.0.0.1 (``moto[server]``, a test dependency: no network
latency, so a lower bound for S3), or ``--store s3://bucket/prefix`` for a real one (boto3's credentials).

    python benchmarks/fleet_history_write.py [--intervals 40] [--store s3://bucket/prefix] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting import TraceStore  # noqa: E402
from trainer.control.fleet import FleetRow  # noqa: E402
from trainer.observe.fleet_history import FleetHistoryWriter  # noqa: E402


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """An S3 bucket served by moto on 127.0.0.1 (fake credentials, this process only)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    saved = dict(os.environ)
    try:
        host, port = server.get_host_and_port()
        os.environ.update({"AWS_ENDPOINT_URL_S3": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                           "NO_PROXY": "127.0.0.1,localhost"})  # fmt: skip
        boto3.client("s3").create_bucket(Bucket="bench")
        yield "s3://bench/traces"
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


def row(i: int) -> FleetRow:
    return FleetRow(t=float(i), requested=1, granted=1, alive=1 + i % 7, refused=0, reclaimed=0)


def boundary_waits(root: str, intervals: int) -> dict[str, list[float]]:
    """Seconds each boundary waited: writing the row itself (as before), then telling the writer (now)."""
    store = TraceStore(root)
    waits: dict[str, list[float]] = {"write": [], "queue": []}
    for i in range(intervals):
        record = {"job_tag": "sync@1", "provider": "market", "interval": i, "interval_s": 60.0, "capacity": 8,
                  "requested": 1, "granted": 1, "refused": 0, "reclaimed": 0, "alive": 1 + i % 7,
                  "timestamp": pd.Timestamp.now(tz="UTC")}  # fmt: skip
        t = time.perf_counter()
        store.append("fleet_intervals", [record], skip_existing=False)
        waits["write"].append(time.perf_counter() - t)
    writer = FleetHistoryWriter(root, "queued@1", "market", 60.0, 8)
    for i in range(intervals):
        t = time.perf_counter()
        writer(i, row(i))
        waits["queue"].append(time.perf_counter() - t)
        time.sleep(0.02)  # the training between two boundaries (a fleet's are a minute apart)
    writer.close()
    stored = store.fleet_histories()
    if writer.errors or stored["fleet:queued@1"]["available"].tolist() != [row(i).alive for i in range(intervals)]:
        raise SystemExit(f"the writer lost rows on {root}: {writer.errors}")
    return waits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", type=int, default=40, help="boundaries timed each way, per store")
    ap.add_argument("--store", help="an s3://bucket/prefix to run on besides the folder (default: S3 on moto)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    if args.intervals < 1:
        ap.error("--intervals must be at least 1")

    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="parcae-history-") as tmp:
        results["folder"] = boundary_waits(str(Path(tmp) / "store"), args.intervals)
    if args.store:
        results[args.store] = boundary_waits(args.store, args.intervals)
    else:
        with moto_s3() as root:
            results["S3 (moto, 127.0.0.1)"] = boundary_waits(root, args.intervals)

    print(f"the boundary's wait to record the fleet's history, {args.intervals} intervals each; ms")
    print(f"{'store':<22} {'write median':>13} {'max':>8} {'queue median':>13} {'max':>8} {'write/queue':>12}")
    summary = {}
    for name, w in results.items():
        med_w, med_q = statistics.median(w["write"]), statistics.median(w["queue"])
        summary[name] = {"write_median_s": med_w, "write_max_s": max(w["write"]),
                         "queue_median_s": med_q, "queue_max_s": max(w["queue"])}  # fmt: skip
        print(f"{name:<22} {med_w * 1e3:>13.2f} {max(w['write']) * 1e3:>8.2f} {med_q * 1e3:>13.3f} "
              f"{max(w['queue']) * 1e3:>8.3f} {med_w / med_q:>12.0f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
