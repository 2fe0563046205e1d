"""A live fleet, as a provider offers it: capacity asked for, granted, refused or left pending, by the cloud.

Owns: `Fleet` (the part of a provider that the cloud's capacity decides: `request`, `arrivals`, `outstanding`,
`joined`), `CapacityAnswer` (what one request got), `FleetSetup` (what the driver hands a provider to build its
fleet) and `SpotPrices` (the cloud's own prices of a job's span, where it publishes them). Must not touch: how
many instances to ask for and when (`trainer.control.fleet`), the job's control plane, what a provider's market or
cloud does behind the interface (`trainer.providers.market`, `trainer.providers.aws`).

Why an interface of its own: the driver of a live fleet sees only what a cloud would tell it — which requests were
granted and which refused, which instances came up, notices and deaths — never the capacity behind them. A job
that cannot read the market cannot peek at its future either.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CapacityAnswer:
    """What a request for `asked` instances got: the ids `granted` (they boot, then arrive: `Fleet.arrivals`),
    how many were `refused` (with the cloud's `reason`, e.g. InsufficientInstanceCapacity) and how many were left
    `pending` (an open request the cloud may fill later)."""

    asked: int
    granted: tuple[int, ...] = ()
    refused: int = 0
    pending: int = 0
    reason: str | None = None

    def __post_init__(self) -> None:
        if len(self.granted) + self.refused + self.pending != self.asked:
            raise ValueError(f"an answer accounts for every instance asked: {self}")


@dataclass(frozen=True)
class FleetSetup:
    """What a live fleet's provider needs from the job: the control plane its workers join (`host`, `port`,
    `token`, the driver's key), how local worker processes start, the fleet's size and interval, and the seed."""

    host: str
    port: int
    token: str
    driver_key: str | None
    start_method: str
    max_instances: int
    interval_s: float
    seed: int


@dataclass(frozen=True)
class SpotPrices:
    """A cloud's own spot prices over a span of a job, from `source` (the call, the region): each capacity pool's
    (instance type, zone) price changes, (epoch seconds, dollars an hour) by time; or `error`, why they could not
    be read (with the fix), where the job's cost then falls back to the bundled prices and says so."""

    source: str
    changes: Mapping[tuple[str, str], Sequence[tuple[float, float]]] = field(default_factory=dict)
    error: str | None = None


class Fleet(abc.ABC):
    """The capacity side of a provider that runs a live fleet (it is an `InstanceProvider` too: notices and kills
    reach the driver as they do from any provider). `compressed`: its time is compressed (a local market
    following a trace), so its intervals stand for the trace's own (60 s) when they are priced or recorded."""

    compressed: bool = False

    @abc.abstractmethod
    def request(self, n: int) -> CapacityAnswer:
        """Ask the cloud for `n` more instances."""

    @abc.abstractmethod
    def arrivals(self) -> list[int]:
        """Granted instances whose worker process started since the last call (their workers join the job)."""

    @abc.abstractmethod
    def outstanding(self) -> int:
        """Instances granted but not arrived yet, plus those of requests left pending."""

    def booting(self) -> int:
        """Granted instances still booting, before they arrive: the cloud bills them already (what the fleet's cost
        counts, `trainer.control.fleet.FleetController.hold`). 0 where a granted instance arrives at once and boots
        as one that has arrived (AWS: its agent starts once it has booted)."""
        return 0

    def instance_type_of(self, worker: int) -> str | None:
        """The instance type of worker `worker`'s instance, where the fleet's instances are not all of one (an AWS
        fleet over several capacity pools); None: the provider's own (`Provider.instance_type`)."""
        return None

    def zone_of(self, worker: int) -> str | None:
        """The availability zone of worker `worker`'s instance, where the cloud prices zones apart; None: not
        known (its type is then priced at the mean of its zones)."""
        return None

    def spot_prices(self, instance_types: Sequence[str], start: float, end: float) -> SpotPrices | None:
        """The cloud's spot prices of `instance_types` from `start` to `end` (epoch seconds), what its instances are
        billed at; None where the cloud publishes none (the local market: its instances are priced at the bundled
        prices, `liveput.instance_price`)."""
        return None

    @abc.abstractmethod
    def joined(self, ids: list[int]) -> None:
        """The driver saw the workers of `ids` register: from now on a notice reaches them as one (SIGTERM, which
        they take), where before an instance still booting is simply reclaimed."""
