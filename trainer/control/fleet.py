"""The driver's side of a live fleet: how many instances to ask the provider for and when, and the fleet's history.

Owns: `FleetController` (keep up to `FleetConfig.max_instances` requested; a refused or pending request backs off,
doubling, so that a market without capacity gets no request storm; every answer, reclaim, interval and instance-second
counted), `FleetRow` (one interval of the fleet's history: the JSON report's ``fleet`` rows, and what the planner
forecasts from) and `fleet_cost` (the instance time in hours and dollars: the report's ``fleet_cost``; at the cloud's
own spot prices where it publishes them, `cloud_spot`, which asks the provider once, at the job's end). Must not
touch: processes, the store, the provider's market behind `trainer.providers.fleet.Fleet`, what the planner decides
(`trainer.control.planning`).

`FleetController` is pure: every call says what time it is, so the same answers give the same requests (tests drive
it on a virtual clock against `trainer.providers.market.SpotMarket`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from liveput import Pool, instance_price, spot_usd, usd_per_million_samples
from trainer.config import FleetConfig
from trainer.providers.fleet import CapacityAnswer, Fleet

# A refused request is retried after a quarter interval, doubling up to half an interval: a fleet without capacity
# asks twice an interval (no request storm: two EC2 calls a minute at the default interval), and one that gets it
# back sees it within half an interval, so that its workers have joined by the interval's end.
FIRST_BACKOFF_INTERVALS = 0.25
MAX_BACKOFF_INTERVALS = 0.5


@dataclass(frozen=True)
class FleetRow:
    """One interval of a live fleet: it ended `t` seconds after the job started; instances `requested`, `granted`,
    `refused` and `reclaimed` (noticed or killed by the cloud) during it; `alive` for the next one."""

    t: float
    requested: int
    granted: int
    alive: int
    refused: int
    reclaimed: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


class FleetController:
    """Asks for capacity and keeps the history of one live fleet (`config`), with intervals of `interval_s`;
    `on_row(index, row)` is told each interval as it ends."""

    def __init__(
        self, config: FleetConfig, interval_s: float, start: float,
        on_row: Callable[[int, FleetRow], None] | None = None,
    ) -> None:  # fmt: skip
        if config.max_instances is None:
            raise ValueError("a fleet controller needs fleet.max_instances")
        self.max_instances, self.min_instances = config.max_instances, config.min_instances
        self.interval_s = interval_s
        self.base_backoff_s = config.backoff_s or FIRST_BACKOFF_INTERVALS * interval_s
        self.max_backoff_s = max(self.base_backoff_s, config.max_backoff_s or MAX_BACKOFF_INTERVALS * interval_s)
        self.start = start
        self.rows: list[FleetRow] = []
        self.on_row = on_row  # told each row as its interval ends (e.g. the trace store's writer)
        self._backoff_s = self.base_backoff_s
        self._next_ask = start
        self._counts = {"requested": 0, "granted": 0, "refused": 0, "reclaimed": 0}
        self.totals = dict(self._counts)
        # the instance time held so far (`hold`), what a cloud bills: (start, end, instances per capacity pool, (type,
        # zone)), a span per change of the counts; a cloud's own spot prices are applied to it (`cloud_spot`)
        self.spans: list[tuple[float, float, dict[tuple[str | None, str | None], int]]] = []
        self._held: tuple[float, dict[tuple[str | None, str | None], int]] = (start, {})

    def ask(self, now: float, have: int, outstanding: int) -> int:
        """How many instances to request now, with `have` alive or joining and `outstanding` granted but not
        arrived or pending (0: none, or not yet: backing off)."""
        want = self.max_instances - have - outstanding
        return want if want > 0 and now >= self._next_ask else 0

    def answered(self, answer: CapacityAnswer, now: float) -> None:
        """Count `answer`; back off after a refusal or an open request, reset once a request is granted whole."""
        self._add(requested=answer.asked, granted=len(answer.granted), refused=answer.refused)
        if answer.refused or answer.pending:
            self._next_ask = now + self._backoff_s
            self._backoff_s = min(2 * self._backoff_s, self.max_backoff_s)
        else:
            self._backoff_s = self.base_backoff_s
            self._next_ask = now

    def granted_later(self, n: int) -> None:
        """`n` instances of a pending request were granted (they arrived)."""
        self._add(granted=n)

    def reclaimed(self, n: int) -> None:
        """The cloud took `n` instances (a notice, or a kill without one)."""
        self._add(reclaimed=n)

    def _add(self, **counts: int) -> None:
        for k, v in counts.items():
            self._counts[k] += v
            self.totals[k] += v

    def hold(self, now: float, held: int | Mapping[Any, int]) -> None:
        """From `now` on the fleet holds `held` instances (booting, joining, training or leaving after a notice: each
        billed from its grant to its end, as clouds bill), a count or counts by instance type (None: the provider's
        own) or by capacity pool, (instance type, zone); the time since the last call is counted at the counts that
        call gave."""
        since, counts = self._held
        live = {pool: count for pool, count in counts.items() if count}
        if live and now > since:
            last = self.spans[-1] if self.spans else None
            if last is not None and last[1] == since and last[2] == live:
                self.spans[-1] = (last[0], now, live)  # the same instances held on
            else:
                self.spans.append((since, now, live))
        by_pool = {None: held} if isinstance(held, int) else held
        self._held = (now, {key if isinstance(key, tuple) else (key, None): n for key, n in by_pool.items()})

    @property
    def instance_seconds_by_type(self) -> dict[str | None, float]:
        """The instance time held so far, by instance type (None: the provider's own)."""
        seconds: dict[str | None, float] = {}
        for start, end, held in self.spans:
            for (kind, _zone), count in held.items():
                seconds[kind] = seconds.get(kind, 0.0) + count * (end - start)
        return seconds

    @property
    def instance_seconds(self) -> float:
        """The instance time held so far, every type together."""
        return sum(self.instance_seconds_by_type.values())

    def close(self, now: float, alive: int) -> FleetRow:
        """End the interval at `now`, with `alive` instances for the next one."""
        row = FleetRow(t=round(now - self.start, 3), alive=alive, **self._counts)
        self.rows.append(row)
        self._counts = dict.fromkeys(self._counts, 0)
        if self.on_row is not None:
            self.on_row(len(self.rows) - 1, row)
        return row


@dataclass(frozen=True)
class CloudSpot:
    """A live fleet's instance time at its cloud's own spot prices (`cloud_spot`): dollars by instance type, from
    `source`; or `error`, why they are not known."""

    source: str
    usd_by_type: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None


def cloud_spot(fleet: FleetController, provider: Fleet, instance_type: str | None,
               wall_offset: float) -> CloudSpot | None:  # fmt: skip
    """What `fleet`'s instances cost at the spot prices their `provider`'s cloud published while they ran (its
    `spans`, on the driver's monotonic clock, `wall_offset` seconds behind epoch time; a pool of no type is
    `instance_type`'s): None where the cloud publishes none, or an instance is of no known type."""
    spans: list[tuple[float, float, dict[Pool, int]]] = []
    for a, b, held in fleet.spans:
        pools = {(kind or instance_type, zone): n for (kind, zone), n in held.items()}
        if not all(kind for kind, _ in pools):
            return None
        spans.append((a + wall_offset, b + wall_offset, {(str(kind), zone): n for (kind, zone), n in pools.items()}))
    if not spans:
        return None
    prices = provider.spot_prices(sorted({kind for *_, held in spans for kind, _ in held}), spans[0][0], spans[-1][1])
    if prices is None or prices.error is not None:
        return None if prices is None else CloudSpot(prices.source, error=prices.error)
    try:
        return CloudSpot(prices.source, spot_usd(spans, prices.changes))
    except KeyError as exc:
        return CloudSpot(prices.source, error=str(exc.args[0]))


def fleet_cost(instance_seconds: float | Mapping[str | None, float], instance_type: str | None, samples: int,
               time_scale: float = 1.0, cloud: CloudSpot | None = None) -> dict[str, Any]:  # fmt: skip
    """What a live fleet cost (the JSON report's ``fleet_cost``): its `instance_seconds` (times `time_scale`: a
    compressed market's interval stands for its trace's own) in instance-hours and, at the bundled prices of each
    instance type (`liveput.instance_price`: dated, a reference point rather than a quote), in dollars at spot and
    on demand, and per million of the `samples` trained. `instance_seconds` is a total of `instance_type`, the
    provider's own, or a total per type where a fleet's instances were of several (an AWS fleet over several
    capacity pools; None: `instance_type`), which ``instance_hours_by_type`` then gives. An instance type without a
    price gives the hours, and ``unpriced`` says why.

    With the `cloud`'s own spot prices (AWS's price history: `cloud_spot`), the spot dollars are those, whatever
    the type (``spot_prices`` names where they came from); on demand stays at the bundled prices where they know
    the types (``on_demand_unpriced`` says why not). Where the cloud's could not be read, ``spot_prices_error`` says
    why beside the bundled prices."""
    seconds = instance_seconds if isinstance(instance_seconds, Mapping) else {None: instance_seconds}
    hours: dict[str | None, float] = {}
    for kind, held in seconds.items():
        hours[kind or instance_type] = hours.get(kind or instance_type, 0.0) + held * time_scale / 3600.0
    hours = hours or {instance_type: 0.0}
    cost: dict[str, Any] = {"instance_hours": round(sum(hours.values()), 6), "instance_type": instance_type,
                            "time_scale": time_scale}  # fmt: skip
    if list(hours) != [instance_type]:  # other types than the provider's own
        by_type = sorted(hours.items(), key=lambda item: str(item[0]))
        cost["instance_hours_by_type"] = {str(kind): round(h, 6) for kind, h in by_type}
    if cloud is not None and cloud.error is None:
        spot_usd_ = sum(cloud.usd_by_type.values())
        cost.update(spot_usd=round(spot_usd_, 6), spot_prices=cloud.source,
                    usd_per_million_samples=_round(usd_per_million_samples(spot_usd_, samples)))  # fmt: skip
        try:
            priced = [(h, instance_price(str(kind))) for kind, h in hours.items()]
        except KeyError as exc:
            return {**cost, "on_demand_unpriced": str(exc.args[0])}
        on_demand = sum(h * price.on_demand_per_hour for h, price in priced)
        return {**cost, "on_demand_usd": round(on_demand, 6), "prices_as_of": min(p.as_of for _, p in priced)}
    if cloud is not None:
        cost["spot_prices_error"] = f"{cloud.source}: {cloud.error}"
    if None in hours:
        return {**cost, "unpriced": "the provider names no instance type"}
    try:
        priced = [(h, instance_price(str(kind))) for kind, h in hours.items()]
    except KeyError as exc:
        return {**cost, "unpriced": str(exc.args[0])}
    spot = sum(h * price.spot_per_hour for h, price in priced)
    return {
        **cost,
        "spot_usd": round(spot, 6),
        "on_demand_usd": round(sum(h * price.on_demand_per_hour for h, price in priced), 6),
        "usd_per_million_samples": _round(usd_per_million_samples(spot, samples)),
        "prices_as_of": min(price.as_of for _, price in priced),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def fleet_cost_text(cost: Mapping[str, Any]) -> str:
    """`fleet_cost` in a line: "fleet: 0.57 instance-hours of p3.2xlarge, $0.35 at spot ($1.74 on demand; prices as
    of 2025-06-28)"; under the local market, in its trace's time."""
    hours = f"{cost['instance_hours']:.2f} instance-hours"
    if cost.get("instance_hours_by_type"):
        hours += " of " + ", ".join(f"{kind} ({h:.2f})" for kind, h in cost["instance_hours_by_type"].items())
    elif cost.get("instance_type"):
        hours += f" of {cost['instance_type']}"
    if cost.get("time_scale", 1.0) != 1.0:
        hours += f" (in the market's trace time: {cost['time_scale']:g}x the wall clock)"
    failed = f"; {cost['spot_prices_error']}" if cost.get("spot_prices_error") else ""
    if "spot_usd" not in cost:
        return f"fleet: {hours}; not priced: {cost.get('unpriced')}{failed}"
    if "spot_prices" not in cost:
        return (f"fleet: {hours}, ${cost['spot_usd']:.2f} at spot (${cost['on_demand_usd']:.2f} on demand; prices as "
                f"of {cost['prices_as_of']}){failed}")  # fmt: skip
    on_demand = (f"${cost['on_demand_usd']:.2f} on demand at the prices of {cost['prices_as_of']}"
                 if "on_demand_usd" in cost else f"on demand not priced: {cost['on_demand_unpriced']}")  # fmt: skip
    return f"fleet: {hours}, ${cost['spot_usd']:.2f} at spot ({cost['spot_prices']}; {on_demand})"
