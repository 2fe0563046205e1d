"""Reading the trace store before and after compaction, side by side in one run.

A live fleet appends one part file to ``fleet_intervals`` per interval and a collection round up to three, and every
read opens every part. This builds a store of ``--parts`` part files (``--fleets`` live fleets' histories, one row an
interval, seeded), times `TraceStore.read` and `TraceStore.fleet_histories` (the planner's read, each interval of
the ``plan-interval`` flow) on it, compacts it (`TraceStore.compact`, timed) and times both again. Medians of
``--repeat`` runs; the rows read must be the same before and after. ``--store s3://bucket/prefix`` runs it on an
empty S3 prefix instead of a temporary folder (boto3's credentials; the compacted store stays there).

    python benchmarks/trace_store.py [--parts 640] [--fleets 8] [--repeat 5] [--store URI] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forecasting import TraceStore  # noqa: E402


def build(root: str, parts: int, fleets: int, seed: int = 0) -> TraceStore:
    """A store whose ``fleet_intervals`` holds `parts` part files: the fleets' intervals in turn, one row each."""
    rng = np.random.default_rng(seed)
    store = TraceStore(root)
    t0 = pd.Timestamp("2026-12-01", tz="UTC")
    for i in range(parts):
        fleet, interval = i % fleets, i // fleets
        alive = int(rng.integers(0, 9))
        store.append("fleet_intervals", [{
            "job_tag": f"job-{fleet}@1", "provider": "market", "interval": interval, "interval_s": 60.0,
            "capacity": 8, "requested": 1, "granted": 1, "refused": 0, "reclaimed": 0, "alive": alive,
            "timestamp": t0 + pd.Timedelta(minutes=interval)}], skip_existing=False)  # fmt: skip
    return store


def median_s(call: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", type=int, default=640, help="part files in the store before compaction")
    ap.add_argument("--fleets", type=int, default=8, help="live fleets whose histories the store holds")
    ap.add_argument("--repeat", type=int, default=5, help="runs per timing (the median is reported)")
    ap.add_argument("--store", help="an empty s3://bucket/prefix to run on (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    if args.parts < 2 or args.fleets < 1 or args.repeat < 1:
        ap.error("--parts must be at least 2, --fleets and --repeat at least 1")

    with tempfile.TemporaryDirectory(prefix="parcae-trace-store-") as tmp:
        root = args.store or str(Path(tmp) / "store")
        if TraceStore(root).exists():
            ap.error(f"--store {root}: not empty; give a prefix this benchmark may fill")
        store = build(root, args.parts, args.fleets)
        before_rows = store.read("fleet_intervals")
        before = {"read": median_s(lambda: store.read("fleet_intervals"), args.repeat),
                  "fleet_histories": median_s(store.fleet_histories, args.repeat)}  # fmt: skip
        t = time.perf_counter()
        removed = store.compact("fleet_intervals")["fleet_intervals"]
        compact_s = time.perf_counter() - t
        after = {"read": median_s(lambda: store.read("fleet_intervals"), args.repeat),
                 "fleet_histories": median_s(store.fleet_histories, args.repeat)}  # fmt: skip
        left = len(store.parts("fleet_intervals"))
        pd.testing.assert_frame_equal(store.read("fleet_intervals"), before_rows)  # the same rows, in the same order

    print(f"store {root if args.store else 'a temporary folder'}")
    print(f"fleet_intervals: {args.parts} part files ({len(before_rows)} rows, {args.fleets} fleets); compaction "
          f"removed {removed} in {compact_s:.3f} s, {left} left; medians of {args.repeat}")  # fmt: skip
    print(f"{'call':<16} {'before s':>9} {'after s':>9} {'before/after':>13}")
    for name in before:
        print(f"{name:<16} {before[name]:>9.4f} {after[name]:>9.4f} {before[name] / after[name]:>13.1f}")
    if args.json:
        args.json.write_text(json.dumps({"parts": args.parts, "rows": len(before_rows), "compact_s": compact_s,
                                         "before_s": before, "after_s": after}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
