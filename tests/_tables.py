"""Synthetic canonical per-interval tables (`forecasting.traces.COLUMNS`) for the forecasting tests.

Imported as a top-level module (``from _tables import ...``): ``tests/`` is on ``sys.path`` under pytest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from forecasting.traces import COLUMNS


def canonical_table(
    available,
    capacity: int,
    *,
    prev=None,
    n_in=None,
    n_out=None,
    initial: int | None = None,
    start: str | None = None,
    interval_s: float = 60.0,
    name: str = "synthetic",
    source: str = "test",
) -> pd.DataFrame:
    """A canonical table of the counts ``available``; ``n_in``/``n_out`` default to the net changes.

    ``prev`` defaults to the previous interval's count, ``initial`` (or the first count itself) before
    the first. Intervals are ``interval_s`` apart, from ``start`` (UTC) or with no absolute time.
    """
    avail = np.asarray(available, dtype=np.int64)
    if prev is None:
        prev = np.concatenate([[avail[0] if initial is None else initial], avail[:-1]])
    prev = np.asarray(prev, dtype=np.int64)
    delta = avail - prev
    n_in = np.maximum(delta, 0) if n_in is None else np.asarray(n_in, dtype=np.int64)
    n_out = np.maximum(-delta, 0) if n_out is None else np.asarray(n_out, dtype=np.int64)
    n = len(avail)
    start_s = np.arange(n, dtype=np.float64) * interval_s
    if start is None:
        start_time = pd.Series(pd.NaT, index=range(n), dtype="datetime64[ns, UTC]")
    else:
        start_time = pd.Series(pd.Timestamp(start, tz="UTC") + pd.to_timedelta(start_s, unit="s"))
    df = pd.DataFrame(
        {
            "interval": np.arange(n, dtype=np.int64),
            "start_s": start_s,
            "start_time": start_time.astype("datetime64[ns, UTC]"),
            "prev_available": prev,
            "n_in": n_in,
            "n_out": n_out,
            "available": avail,
            "capacity": np.full(n, capacity, dtype=np.int64),
        },
        columns=list(COLUMNS),
    )
    df.attrs = {"name": name, "source": source, "interval_s": interval_s, "capacity": capacity, "format": "test"}
    return df


def periodic_counts(
    periods: int, period: int = 20, drop_at: int = 12, capacity: int = 10, low: int = 7, drop_len: int = 3
) -> np.ndarray:
    """Full cluster except ``low`` instances for ``drop_len`` intervals from phase ``drop_at`` of every period."""
    phase = np.arange(periods * period) % period
    return np.where((phase >= drop_at) & (phase < drop_at + drop_len), low, capacity)
