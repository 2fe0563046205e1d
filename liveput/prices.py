"""Dated instance prices, so simulated runs can be compared in dollars, not only in samples."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


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
