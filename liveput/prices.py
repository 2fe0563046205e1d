"""Dated instance prices, so simulated runs can be compared in dollars, not only in samples; and what instance time
cost at a cloud's own spot prices (`spot_usd`), so a live fleet is priced as it was billed."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

#: A capacity pool: an instance type, in an availability zone (None: not known).
Pool = tuple[str, str | None]
#: A pool's spot price changes, by time: (epoch seconds, dollars an hour), each in effect until the next.
PriceChanges = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class InstancePrice:
    instance_type: str
    region: str
    on_demand_per_hour: float
    spot_per_hour: float
    as_of: str
    source: str


def usd_per_million_samples(usd: float, samples: float) -> float | None:
    """Dollars per million samples trained: how a simulated run and a live fleet compare their cost (None before a
    sample is trained)."""
    return usd / samples * 1e6 if samples > 0 else None


@cache
def _table() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(resources.files("liveput").joinpath("data/prices.json").read_text())
    return table


def instance_price(instance_type: str = "p3.2xlarge") -> InstancePrice:
    """The bundled price of ``instance_type``; an unknown type names the known ones."""
    table = _table()
    try:
        entry = table["instances"][instance_type]
    except KeyError:
        known = ", ".join(sorted(table["instances"]))
        raise KeyError(f"no price for instance type {instance_type!r}; known: {known}") from None
    od = float(entry["on_demand"])
    return InstancePrice(
        instance_type=instance_type,
        region=entry["region"],
        on_demand_per_hour=od,
        spot_per_hour=round(od * (1 - entry["spot_savings_pct"] / 100.0), 4),
        as_of=table["as_of"],
        source=table["source"],
    )


def spot_usd(spans: Iterable[tuple[float, float, Mapping[Pool, int]]],
             history: Mapping[tuple[str, str], PriceChanges]) -> dict[str, float]:  # fmt: skip
    """Dollars per instance type of the instance time in `spans` ((start, end, instances per pool), epoch seconds)
    at the spot prices of `history` (per (type, zone)). A price holds from its time until the next; the first holds
    before its time too (AWS gives the price in effect at a window's start as the window's first record, dated when it
    was set). A pool whose zone is not known is priced at the mean of its type's zones. Raises KeyError naming a
    pool without prices."""
    by_type: dict[str, list[PriceChanges]] = {}
    for (kind, _zone), changes in sorted(history.items()):
        by_type.setdefault(kind, []).append(sorted(changes))
    usd: dict[str, float] = {}
    for start, end, counts in spans:
        for (kind, zone), count in counts.items():
            if not count or end <= start:
                continue
            if zone is not None and (kind, zone) in history:
                cost = _dollars(sorted(history[kind, zone]), start, end)
            elif zone is None and by_type.get(kind):
                cost = sum(_dollars(c, start, end) for c in by_type[kind]) / len(by_type[kind])
            else:
                when = " and ".join(f"{datetime.fromtimestamp(t, UTC):%Y-%m-%dT%H:%M:%SZ}" for t in (start, end))
                raise KeyError(f"no spot price of {kind} in {zone or 'any zone'} between {when}")
            usd[kind] = usd.get(kind, 0.0) + count * cost
    return usd


def _dollars(changes: PriceChanges, start: float, end: float) -> float:
    """One instance's dollars from `start` to `end` (epoch seconds) at the step prices `changes` (by time)."""
    total = 0.0
    for i, (_, price) in enumerate(changes):
        lo = start if i == 0 else max(start, changes[i][0])
        hi = end if i == len(changes) - 1 else min(end, changes[i + 1][0])
        total += price * max(0.0, hi - lo)
    return total / 3600.0
