"""A local spot market: a stand-in for a cloud's spot capacity on this machine, following a trace the job never
reads.

Owns: `MarketOptions` (the `market` provider's options), `market_capacity` (the trace, scaled to the fleet, as
capacity per interval), `SpotMarket` (the market itself: a pure state machine over time — requests granted up to
the capacity of the moment and refused or left open beyond it, instances booting, reclaimed with notice or, a seeded
share of them, without when capacity falls below what it granted) and `MarketFleet` (the `market` provider's
`trainer.providers.fleet.Fleet`: each instance the market grants is a local worker process once it has booted).
Must not touch: the job's control plane, how many instances the job asks for (`trainer.control.fleet`).

The job sees the market only through `Fleet` — what it granted and refused, which instances arrived, notices
(SIGTERM, the cloud's warning) and kills (SIGKILL) — as it would a cloud's. Time is compressed as a replay's is:
one trace interval lasts the job's `interval_s`; past the trace's end its last capacity holds.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.providers.fleet import CapacityAnswer, Fleet, FleetSetup
from trainer.providers.local import LocalProcessProvider
from trainer.runtime.worker import EXIT_RESTART

#: The error a refused request gets, as EC2 names it (`trainer.providers.aws_errors` maps the same code).
REFUSED = "InsufficientInstanceCapacity"
#: The status of a request the market leaves open (an AWS spot request's status code).
PENDING = "capacity-not-available"


class MarketError(ValueError):
    """A market option that cannot work: the message names the option and the fix."""


@dataclass(frozen=True)
class MarketOptions:
    """The `market` provider's options: the `trace` (a name or path for `forecasting.load_trace`) its capacity
    follows from interval `start_interval`; `kill_fraction` of its reclaims come without notice, the others with
    `notice_s` seconds of it; a granted instance boots for `boot_s` seconds; with `open_requests`, capacity not
    there when asked for is left pending and granted when it comes (a persistent spot request), else refused;
    `seed` seeds who is reclaimed; an instance stands for an `instance_type` (the p3 trace's), whose price the
    fleet's cost is counted at."""

    trace: str = "p3"
    start_interval: int = 0
    kill_fraction: float = 0.5
    notice_s: float = 2.0
    boot_s: float = 0.0
    open_requests: bool = False
    seed: int = 0
    instance_type: str = "p3.2xlarge"

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> MarketOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(options) - known)
        if extra:
            raise MarketError(f"provider 'market' has no option {extra[0]!r}; its options: {', '.join(sorted(known))}")
        if "trace" not in options:
            raise MarketError("the market needs a trace to follow: give option 'trace' (parcae train --market-trace "
                              "NAME|PATH, e.g. p3)")  # fmt: skip
        o = cls(**dict(options))
        if not isinstance(o.trace, str) or not o.trace:
            raise MarketError(f"trace: expected a trace name or path, got {o.trace!r}")
        if isinstance(o.start_interval, bool) or not isinstance(o.start_interval, int) or o.start_interval < 0:
            raise MarketError(f"start_interval: expected an interval index >= 0, got {o.start_interval!r}")
        if not _number(o.kill_fraction) or not 0.0 <= o.kill_fraction <= 1.0:
            raise MarketError(f"kill_fraction: expected a fraction in [0, 1], got {o.kill_fraction!r}")
        for name in ("notice_s", "boot_s"):
            v = getattr(o, name)
            if not _number(v) or v < 0:
                raise MarketError(f"{name}: expected seconds >= 0, got {v!r}")
        if not isinstance(o.open_requests, bool):
            raise MarketError(f"open_requests: expected true or false, got {o.open_requests!r}")
        if isinstance(o.seed, bool) or not isinstance(o.seed, int):
            raise MarketError(f"seed: expected an integer, got {o.seed!r}")
        if not isinstance(o.instance_type, str) or not o.instance_type:
            raise MarketError(f"instance_type: expected an instance type such as 'p3.2xlarge', got {o.instance_type!r}")
        return o


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def market_capacity(trace: str, max_instances: int, start_interval: int = 0) -> list[int]:
    """The market's capacity in each interval: `trace`'s availability from `start_interval` on, scaled to
    `max_instances` as a replay scales it (`forecasting.scale_trace`)."""
    from forecasting import load_trace, scale_trace

    try:
        df = scale_trace(load_trace(trace), max_instances)
    except (OSError, ValueError, LookupError) as exc:  # (an unknown name is a LookupError)
        raise MarketError(f"trace {trace!r}: {exc}") from None
    if not 0 <= start_interval < len(df):
        raise MarketError(f"start_interval {start_interval} is outside the trace's {len(df)} intervals")
    return [int(n) for n in df["available"].iloc[start_interval:]]


@dataclass
class MarketStep:
    """What the market did since it last advanced: instances that `booted`, were given notice (`deadline`: each one
    warned, by the time it is reclaimed) or reclaimed without one (`killed`), and granted instances reclaimed while
    still booting (`dropped`: they never ran)."""

    booted: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    deadline: dict[int, float] = field(default_factory=dict)

    @property
    def noticed(self) -> list[int]:
        """The instances warned (`deadline`'s)."""
        return sorted(self.deadline)


class SpotMarket:
    """Spot capacity over time: `capacity[i]` instances exist in interval i (of `interval_s` seconds from `start`;
    the last value holds past the end). Pure: every call says what time it is.

    A fall in capacity reclaims instances when it comes, as the trace has it; those it warns are warned `notice_s`
    ahead of it, as a cloud warns before it reclaims (AWS two minutes, GCP 30 s), and reclaimed at the fall."""

    def __init__(
        self, capacity: Sequence[int], interval_s: float, start: float, *, seed: int = 0, kill_fraction: float = 0.5,
        boot_s: float = 0.0, open_requests: bool = False, notice_s: float = 0.0,
    ) -> None:  # fmt: skip
        if not capacity:
            raise ValueError("a market needs the capacity of at least one interval")
        self.capacity_by_interval = [max(0, int(n)) for n in capacity]
        self.interval_s, self.start = float(interval_s), float(start)
        self.kill_fraction, self.boot_s, self.open_requests = kill_fraction, boot_s, open_requests
        self.notice_s = float(notice_s)
        self._rng = random.Random(seed)
        self.held: set[int] = set()  # granted and neither reclaimed nor ended: booting or running
        self._booting: dict[int, float] = {}  # id -> when it is up
        self._doomed: dict[int, tuple[float, bool]] = {}  # id -> (when it is reclaimed, whether it was warned)
        self._step = MarketStep()  # what happened since the last `advance` (a request advances the market too)
        self.pending = 0  # instances of requests left open
        self._next_id = 0

    def interval(self, now: float) -> int:
        return max(0, int((now - self.start) // self.interval_s))

    def capacity(self, now: float) -> int:
        return self.capacity_by_interval[min(self.interval(now), len(self.capacity_by_interval) - 1)]

    def _grant(self, n: int, now: float) -> tuple[int, ...]:
        ids = tuple(range(self._next_id, self._next_id + n))
        self._next_id += n
        self.held |= set(ids)
        for w in ids:
            self._booting[w] = now + self.boot_s
        return ids

    def free(self, now: float) -> int:
        """Instances a request may have now: what the capacity leaves free now and at each fall a notice given now
        would reach (a cloud offers no spot capacity it is about to reclaim; the warned keep their places until
        their fall)."""
        free, staying = self.capacity(now) - len(self.held), len(self.held) - len(self._doomed)
        for at in self._falls(now)[1:]:
            free = min(free, self.capacity(at) - staying)
        return max(0, free)

    def request(self, n: int, now: float) -> CapacityAnswer:
        """Grant up to the free capacity (`free`); refuse the rest, or leave it pending (`open_requests`)."""
        if n < 1:
            raise ValueError(f"a request is for at least one instance, got {n}")
        self.advance_capacity(now)
        granted = self._grant(min(n, self.free(now)), now)
        rest = n - len(granted)
        if not rest:
            return CapacityAnswer(n, granted)
        if self.open_requests:
            self.pending += rest
            return CapacityAnswer(n, granted, pending=rest, reason=PENDING)
        return CapacityAnswer(n, granted, refused=rest, reason=REFUSED)

    def cancel_pending(self) -> None:
        self.pending = 0

    def _falls(self, now: float) -> list[float]:
        """Now, and the interval boundaries after it that a notice given now reaches (`notice_s`)."""
        first = int((now - self.start) // self.interval_s) + 1
        last = int((now + self.notice_s - self.start) // self.interval_s)
        return [now, *(self.start + k * self.interval_s for k in range(max(first, 1), last + 1))]

    def advance_capacity(self, now: float) -> None:
        """Doom what exceeds the capacity now or at a fall within `notice_s` (seeded victims, each reclaimed without
        notice with probability `kill_fraction`, else warned now; one still booting is dropped at once), reclaim
        the doomed whose fall has come, then fill pending requests from what is free."""
        out = self._step
        staying = self.held - set(self._doomed)
        for at in self._falls(now):
            excess = len(staying) - self.capacity(at)
            if excess <= 0:
                continue
            for w in sorted(self._rng.sample(sorted(staying), excess)):
                staying.discard(w)
                if self._booting.pop(w, None) is not None:
                    self.held.discard(w)
                    out.dropped.append(w)
                elif self._rng.random() < self.kill_fraction:
                    self._doomed[w] = (at, False)
                else:
                    self._doomed[w] = (at, True)
                    out.deadline[w] = at
        for w, (at, warned) in sorted(self._doomed.items()):
            if at <= now:
                del self._doomed[w]
                self.held.discard(w)
                if not warned:
                    out.killed.append(w)
        free = self.free(now)
        if self.pending and free > 0:
            k = min(self.pending, free)
            self.pending -= k
            self._grant(k, now)

    def advance(self, now: float) -> MarketStep:
        """What the market did up to time `now` (since the last call): warnings, reclaims and filled requests
        (`advance_capacity`), then the boots that are due."""
        self.advance_capacity(now)
        out, self._step = self._step, MarketStep()
        out.booted = sorted(w for w, t in self._booting.items() if t <= now)
        for w in out.booted:
            self._booting.pop(w)
        return out

    def booting(self) -> int:
        return len(self._booting)

    def release(self, ids: Sequence[int]) -> None:
        """`ids` ended (their process exited: the job finished with them, or they left after a notice)."""
        self.held -= set(ids)
        for w in ids:
            self._booting.pop(w, None)
            self._doomed.pop(w, None)


class MarketFleet(LocalProcessProvider, Fleet):
    """The `market` provider: a `SpotMarket` whose granted instances are local worker processes once booted.

    `poll` (which the driver calls all along) advances the market: booted instances start their worker process
    and arrive; reclaimed ones get SIGTERM with the market's notice (SIGKILL at its deadline), or SIGKILL at once —
    and one whose worker has not registered yet is killed at once, as a spot instance reclaimed while it boots is."""

    compressed = True  # one market interval stands for one of the trace's

    def __init__(
        self, setup: FleetSetup, options: MarketOptions, *, clock: Callable[[], float] = time.monotonic
    ) -> None:  # fmt: skip
        super().__init__(setup.host, setup.port, setup.token, setup.start_method, driver_key=setup.driver_key)
        self.clock, self.notice_s = clock, float(options.notice_s)
        capacity = market_capacity(options.trace, setup.max_instances, options.start_interval)
        self.market = SpotMarket(capacity, setup.interval_s, clock(), seed=options.seed,
                                 kill_fraction=options.kill_fraction, boot_s=options.boot_s,
                                 open_requests=options.open_requests, notice_s=self.notice_s)  # fmt: skip
        self._arrived: list[int] = []
        self._joined: set[int] = set()
        self._ended: set[int] = set()

    def request(self, n: int) -> CapacityAnswer:
        with self._lock:
            return self.market.request(n, self.clock())

    def arrivals(self) -> list[int]:
        with self._lock:
            out, self._arrived = self._arrived, []
            return out

    def outstanding(self) -> int:
        with self._lock:
            return self.market.booting() + self.market.pending

    def booting(self) -> int:
        with self._lock:
            return self.market.booting()

    def joined(self, ids: list[int]) -> None:
        with self._lock:
            self._joined |= set(ids)

    def poll(self) -> None:
        with self._lock:
            now = self.clock()
            step = self.market.advance(now)
            for w in step.booted:
                self.start_ids([w], w + 1)
                self._arrived.append(w)
            for w, deadline in step.deadline.items():  # warned ahead of the fall that reclaims it
                if w in self._joined:
                    self.preempt([w], max(0.0, deadline - now))
                else:
                    step.killed.append(w)
            self.kill(step.killed)
            ended = [w for w, p in self.procs.items()
                     if w not in self._ended and p.exitcode is not None and p.exitcode != EXIT_RESTART]  # fmt: skip
            self._ended |= set(ended)
            self.market.release(ended)
        super().poll()

    def stop(self) -> None:
        with self._lock:
            self.market.cancel_pending()
        super().stop()
