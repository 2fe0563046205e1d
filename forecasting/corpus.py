"""The training corpus for learnt forecasters: every distinct multi-instance availability trace we hold.

This module owns the choice of *which* traces a learnt forecaster trains on, so that a leave-one-trace-out
evaluation cannot leak the held-out trace through one of its copies. It reads traces only through
``forecasting.traces`` and never writes anything.

Rules, in order (the names are ``available_traces()`` names):

* skip the shared copies of bundled traces (``parcae-p3-events``, ``bamboo-p3-events``, ``p3-counts`` are
  the bundled ``p3``; ``gcp-v100x1-east1c`` is the bundled ``gcp-v100``), the ``-scaled`` re-plots of the
  Bamboo 2020 curves, and the 6-interval toy ``parcae-fake-events``;
* skip one-node traces (capacity < ``min_capacity``; their 0/1 series say nothing about partial
  preemption of a cluster) and flat ones (no change at all);
* drop any trace whose count series equals one already taken, or one that is excluded: a copy under a
  name we do not know yet must neither duplicate weight nor leak a held-out trace;
* keep at most ``max_intervals`` of each trace, the most recent, so that training stays fast and no
  month-long trace drowns the others.

Without ``../shared/traces`` the corpus is the bundled ``p3``, ``gcp-v100`` and four Nov 2020 AWS curves
(``aws2020-*``). Given a trace store, the live fleets' own histories it holds (``fleet:<job tag>``,
`forecasting.collect.TraceStore.fleet_histories`) join the candidates under the same rules.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any, Final

import numpy as np
import pandas as pd

from forecasting.traces import DEFAULT_INTERVAL_S, available_traces, load_trace

__all__ = ["DUPLICATES", "TOYS", "training_corpus"]

#: Shared-folder names that are byte-for-byte or event-for-event copies of a bundled trace.
DUPLICATES: Final[frozenset[str]] = frozenset(
    {"parcae-p3-events", "bamboo-p3-events", "p3-counts", "gcp-v100x1-east1c"}
)
#: Example files that are not measurements.
TOYS: Final[frozenset[str]] = frozenset({"parcae-fake-events"})


def _fingerprint(table: pd.DataFrame) -> str:
    """Identity of a trace's count series (independent of its name and source format)."""
    n = table["available"].to_numpy(dtype=np.int64)
    return hashlib.sha256(n.tobytes() + str(int(table["capacity"].iloc[0])).encode()).hexdigest()


def _is_skipped_name(name: str) -> bool:
    return name in DUPLICATES or name in TOYS or name.endswith("-scaled")


def training_corpus(
    names: Iterable[str] | None = None,
    interval_s: float = DEFAULT_INTERVAL_S,
    exclude: Iterable[str] = (),
    *,
    min_capacity: int = 4,
    max_intervals: int = 20_000,
    store: Any = None,
) -> dict[str, pd.DataFrame]:
    """Distinct multi-instance traces as canonical tables at ``interval_s``, keyed by name.

    ``names`` restricts the candidates (default: every name of ``available_traces()``); explicitly
    named traces are still subject to the capacity/flat/duplicate rules. ``exclude`` removes traces by
    name *and* every other trace with the same count series (a held-out trace's copies). The order is
    that of ``available_traces()``, so the corpus is deterministic. ``store`` (a `forecasting.collect.TraceStore`)
    adds the live fleets' histories it holds on the corpus's grid (those named, when ``names`` is given), after
    the named traces, in job-tag order.
    """
    known = available_traces()
    excluded = set(exclude)
    fleets: dict[str, pd.DataFrame] = {}
    if store is not None:  # (a history on another grid than the corpus's is left out)
        fleets = {n: t for n, t in store.fleet_histories().items() if t.attrs["interval_s"] == interval_s}
    candidates = list(known) if names is None else [n for n in known if n in set(names)]
    if names is not None:
        unknown = set(names) - set(known) - set(fleets)
        if unknown:
            raise KeyError(f"unknown trace names {sorted(unknown)}; known: {', '.join(sorted(known))}")
        fleets = {n: t for n, t in fleets.items() if n in set(names)}

    seen: set[str] = set()
    for name in excluded & set(known):
        seen.add(_fingerprint(load_trace(name, interval_s)))

    corpus: dict[str, pd.DataFrame] = {}
    for name in [*candidates, *fleets]:
        if name in excluded or _is_skipped_name(name):
            continue
        table = fleets[name] if name in fleets else load_trace(name, interval_s)
        if int(table.attrs["capacity"]) < min_capacity:
            continue
        if not np.any(np.diff(table["available"].to_numpy()) != 0):
            continue  # flat: no change from one interval to the next, nothing to learn
        fp = _fingerprint(table)
        if fp in seen:
            continue
        seen.add(fp)
        if len(table) > max_intervals:
            attrs = dict(table.attrs)
            table = table.iloc[-max_intervals:].reset_index(drop=True)
            table.attrs = attrs
        corpus[name] = table
    return corpus
