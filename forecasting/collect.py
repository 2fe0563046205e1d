"""Collection of spot availability from AWS into the trace store (`forecasting.trace_store`).

This module owns the *I/O edge* of availability data: it asks EC2 (through boto3) what happened to the
job's own spot fleet and what the spot market looks like, and records the answers in the store's tables
(``fleet_events``: one row per state transition of an instance tagged ``parcae:job=<job tag>`` — ``add`` when
it is pending/running, ``remove`` when it shuts down, stops, terminates, vanishes, or gets a spot interruption
notice; ``spot_prices``; ``placement_scores``), which :mod:`forecasting.traces` can turn into the canonical
per-interval table. It must not import the planner (liveput, simulator, CLI, trainer): collection has to run on a
small cron box with only boto3 and pandas.

Credentials and region come from boto3's standard chain (environment, config files, SSO, instance
profile), or from a ``boto3.Session`` the caller builds; never from arguments of this module.
Throttling is retried by botocore (``Config(retries={"mode": "standard", ...})``); whatever still fails
is reported in :class:`CollectResult` and nothing of that call is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

import pandas as pd

from forecasting.ec2 import (
    ALIVE_STATES,
    FILTER_VALUES_MAX,
    JOB_TAG_KEY,
    SPOT_RECLAIMED_RE,
    SPOT_WARNING_RE,
    no_credentials,
    no_region,
)
from forecasting.trace_store import TraceStore, as_utc, trace_store_root

if TYPE_CHECKING:
    import boto3

__all__ = [
    "JOB_TAG_KEY",
    "CollectError",
    "CollectResult",
    "InstanceObservation",
    "Interruption",
    "SpotCollector",
    "fleet_transitions",
]


_NO_CREDENTIALS: Final = no_credentials(
    "collecting spot traces",
    "ec2:Describe* and ec2:GetSpotPlacementScores",
    "the collector",
    also="pass SpotCollector(session=boto3.Session(...))",
)
_NO_REGION: Final = no_region("SpotCollector(regions=[...])")

_THROTTLING_CODES: Final = frozenset(
    {"RequestLimitExceeded", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled"}
)
# What an EC2-compatible endpoint (a mock, a private cloud, an old partition) answers for an action it lacks.
_UNSUPPORTED_CODES: Final = frozenset({"InvalidAction", "UnsupportedOperation", "NotImplemented"})

_SPOT_STATE_REASONS: Final = frozenset({"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"})
_GONE: Final = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
# "User initiated (2019-05-15 13:21:48 GMT)" on AWS; moto writes "UTC".
_TRANSITION_RE: Final = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


# --------------------------------------------------------------------------------------------- results


class CollectError(RuntimeError):
    """Collection cannot start at all (no credentials, no region); the message says how to fix it."""


@dataclass
class CollectResult:
    """What one collect call did: rows written per table, per-call errors, unsupported calls.

    A call listed in ``errors`` (throttled after botocore's retries, access denied, endpoint down) wrote
    nothing; ``unsupported`` lists calls the endpoint does not implement (moto's placement scores).
    """

    rows_written: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass
class CollectRound:
    """One collection round (`SpotCollector.collect_round`): each table's `CollectResult`, then the part files
    merged per table by the store's compaction (`TraceStore.compact`)."""

    results: dict[str, CollectResult]
    compacted: dict[str, int]

    @property
    def errors(self) -> list[str]:
        return [e for r in self.results.values() for e in r.errors]

    @property
    def unsupported(self) -> list[str]:
        return [u for r in self.results.values() for u in r.unsupported]


# ----------------------------------------------------------------------------------------------- store


def _now() -> pd.Timestamp:
    return pd.Timestamp.now(tz="UTC")


# ----------------------------------------------------------------------------- fleet state machine


@dataclass(frozen=True)
class InstanceObservation:
    """One instance as ``describe_instances`` showed it in one collection round."""

    instance_id: str
    region: str
    state: str
    launch_time: pd.Timestamp | None
    instance_type: str = ""
    az: str = ""
    lifecycle: str = "on-demand"
    spot_request_id: str = ""
    state_reason: str = ""  # StateReason.Code, e.g. Server.SpotInstanceTermination
    transition_time: pd.Timestamp | None = None  # parsed from StateTransitionReason

    @classmethod
    def from_api(cls, inst: Mapping[str, Any], region: str) -> InstanceObservation:
        m = _TRANSITION_RE.search(inst.get("StateTransitionReason") or "")
        launch = inst.get("LaunchTime")
        return cls(
            instance_id=inst["InstanceId"],
            region=region,
            state=inst.get("State", {}).get("Name", ""),
            launch_time=as_utc(launch) if launch is not None else None,
            instance_type=inst.get("InstanceType", ""),
            az=inst.get("Placement", {}).get("AvailabilityZone", ""),
            lifecycle=inst.get("InstanceLifecycle") or "on-demand",
            spot_request_id=inst.get("SpotInstanceRequestId") or "",
            state_reason=(inst.get("StateReason") or {}).get("Code") or "",
            transition_time=as_utc(m.group(1)) if m else None,
        )


@dataclass(frozen=True)
class Interruption:
    """A spot request status that says the provider took (or is taking) the instance."""

    code: str
    time: pd.Timestamp | None


def fleet_transitions(
    observed: Sequence[InstanceObservation],
    last_known: Mapping[str, Mapping[str, Any]],
    interruptions: Mapping[str, Interruption],
    *,
    now: pd.Timestamp,
    job_tag: str,
    region: str,
) -> list[dict[str, Any]]:
    """New ``fleet_events`` rows: what changed since the last stored event of each instance.

    Pure, so the transition rules are testable without AWS. ``last_known`` maps instance id to its last
    stored row (of this job, any region). Rules:

    * alive (pending/running, no interruption) and not known alive -> ``add`` at ``LaunchTime``
      (stable across re-collection, so racing collectors write the same key); a restart since a stored
      removal is added no earlier than that removal;
    * alive, known alive, but ``LaunchTime`` after the stored add -> it stopped and restarted between two
      rounds: ``remove`` and ``add`` at the new ``LaunchTime``;
    * gone (shutting-down/stopping/stopped/terminated) or interrupted, and known alive or never seen ->
      ``remove`` at the notice time, the time in ``StateTransitionReason``, or ``now``; an instance never
      seen alive first gets its ``add`` at ``LaunchTime`` (it lived between two rounds);
    * known alive in ``region`` but no longer listed -> ``remove`` at ``now`` (reason ``vanished``).
    """
    rows: list[dict[str, Any]] = []
    now = as_utc(now)

    def row(base: Mapping[str, Any], event: str, ts: pd.Timestamp, state: str, reason: str) -> None:
        rows.append(
            {
                "job_tag": job_tag,
                "region": base["region"],
                "instance_id": base["instance_id"],
                "event": event,
                "timestamp": ts,
                "state": state,
                "reason": reason,
                "instance_type": base["instance_type"],
                "az": base["az"],
                "lifecycle": base["lifecycle"],
                "spot_request_id": base["spot_request_id"],
                "observed_at": now,
            }
        )

    seen: set[str] = set()
    for o in observed:
        seen.add(o.instance_id)
        base = {
            "region": o.region,
            "instance_id": o.instance_id,
            "instance_type": o.instance_type,
            "az": o.az,
            "lifecycle": o.lifecycle,
            "spot_request_id": o.spot_request_id,
        }
        last = last_known.get(o.instance_id)
        last_event = last["event"] if last is not None else None
        last_ts = as_utc(last["timestamp"]) if last is not None else None
        launch = o.launch_time if o.launch_time is not None else now
        notice = interruptions.get(o.instance_id)
        if notice is not None and notice.time is not None and o.launch_time is not None and o.launch_time > notice.time:
            notice = None  # a persistent request's old status: the instance has been started again since
        if o.state in ALIVE_STATES and notice is None:
            if last_event is None:
                row(base, "add", launch, o.state, o.state)
            elif last_event == "remove":
                row(base, "add", max(launch, last_ts), o.state, "restarted")
            elif launch > last_ts:
                row(base, "remove", launch, o.state, "stopped-and-restarted-between-rounds")
                row(base, "add", launch, o.state, "restarted")
        elif o.state in _GONE or notice is not None:
            if notice is not None:
                when, reason = notice.time or now, notice.code
            else:
                when = o.transition_time or now
                reason = o.state_reason or o.state
                if o.state_reason in _SPOT_STATE_REASONS:
                    reason = o.state_reason
            if last_event is None or (last_event == "remove" and launch > last_ts):
                row(base, "add", launch, "running", "launched-between-rounds")
                row(base, "remove", max(when, launch), o.state, reason)
            elif last_event == "add":
                row(base, "remove", max(when, last_ts), o.state, reason)
    for instance_id, last in last_known.items():
        if instance_id in seen or last["event"] != "add" or last["region"] != region:
            continue
        notice = interruptions.get(instance_id)
        when = notice.time if notice and notice.time is not None else now
        reason = notice.code if notice else "vanished"
        row(last, "remove", max(when, as_utc(last["timestamp"])), "unknown", reason)
    return rows


def _last_known(events: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Last stored event per instance (a removal wins over an add at the same instant)."""
    if events.empty:
        return {}
    rank = events["event"].map({"add": 0, "remove": 1})
    ordered = events.assign(_rank=rank).sort_values(["timestamp", "_rank"]).drop(columns="_rank")
    last = ordered.groupby("instance_id", sort=False).tail(1)
    return {r["instance_id"]: r for r in last.to_dict("records")}


# ----------------------------------------------------------------------------------------- collector

_T = TypeVar("_T")


class _Failed:
    """Marker returned by a guarded call that recorded an error instead of a value."""


_FAILED: Final = _Failed()


def spot_price_history(client: Any, instance_types: Sequence[str], start: datetime, end: datetime, *,
                       products: Sequence[str] = ("Linux/UNIX",)) -> list[dict[str, Any]]:  # fmt: skip
    """Every ``describe_spot_price_history`` record of `instance_types` between `start` and `end` (every zone of the
    client's region, all pages): what the collector stores and what a live fleet on AWS is priced at. AWS's first
    record of each pool is the price in effect at `start`, dated when it was set."""
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=list(instance_types), ProductDescriptions=list(products), StartTime=start, EndTime=end
    )
    return [p for page in pages for p in page.get("SpotPriceHistory", [])]


class SpotCollector:
    """Records the job's fleet and the spot market of ``regions`` into a :class:`TraceStore`.

    ``session``: a ``boto3.Session`` (default: a new one, i.e. the standard credential/region chain).
    ``regions``: where to look (default: the session's region). ``store``: default
    ``$PARCAE_TRACE_STORE``, else ``./trace-store``. ``endpoint_url``: send every EC2 call
    there instead of the public endpoint (an interface VPC endpoint, or a local ``moto_server``).
    ``max_attempts`` (tries per request, the first included; 1 disables retries) and ``retry_mode``
    (``standard`` or ``adaptive``) configure botocore's retries; throttling is retried there, not here.
    """

    def __init__(
        self,
        session: boto3.Session | None = None,
        regions: Sequence[str] | None = None,
        instance_types: Sequence[str] = ("p3.2xlarge",),
        job_tag: str = "parcae-job",
        store: TraceStore | None = None,
        *,
        endpoint_url: str | None = None,
        product_descriptions: Sequence[str] = ("Linux/UNIX",),
        max_attempts: int = 8,
        retry_mode: str = "standard",
    ) -> None:
        import boto3  # deferred: importing this module (for TraceStore) must not need boto3

        self.session = session if session is not None else boto3.Session()
        self.instance_types = tuple(instance_types)
        self.job_tag = job_tag
        self.store = store if store is not None else TraceStore(trace_store_root())
        self.endpoint_url = endpoint_url
        self.product_descriptions = tuple(product_descriptions)
        self.max_attempts = int(max_attempts)
        self.retry_mode = retry_mode
        self._regions = tuple(regions) if regions else None
        self._clients: dict[str, Any] = {}

    # ------------------------------------------------------------------------------- plumbing

    @property
    def regions(self) -> tuple[str, ...]:
        """Regions to collect; the session's region when none were given."""
        if self._regions:
            return self._regions
        region = self.session.region_name
        if not region:
            raise CollectError(_NO_REGION)
        return (region,)

    def check_setup(self) -> None:
        """CollectError now, as the first call would raise it, unless this machine gives a region (or ``regions``
        were given) and credentials: read locally, no call to AWS."""
        _ = self.regions
        self._check_credentials()

    def _check_credentials(self) -> None:
        from botocore.exceptions import BotoCoreError, ProfileNotFound

        try:
            credentials = self.session.get_credentials()
        except ProfileNotFound as exc:
            raise CollectError(f"{exc}. {_NO_CREDENTIALS}") from exc
        except BotoCoreError as exc:  # e.g. a credential_process or SSO token that fails
            raise CollectError(f"could not load AWS credentials: {exc}. {_NO_CREDENTIALS}") from exc
        if credentials is None:
            raise CollectError(_NO_CREDENTIALS)

    def client(self, region: str) -> Any:
        """The EC2 client for ``region`` (cached; tests attach a ``botocore.stub.Stubber`` to it)."""
        if region in self._clients:
            return self._clients[region]
        from botocore.config import Config

        self._check_credentials()
        config = Config(
            # total_max_attempts counts the first try too; botocore's max_attempts counts only retries
            retries={"mode": self.retry_mode, "total_max_attempts": self.max_attempts},
            connect_timeout=10,
            read_timeout=60,
            user_agent_extra="parcae-collector",
        )
        client = self.session.client("ec2", region_name=region, endpoint_url=self.endpoint_url, config=config)
        self._clients[region] = client
        return client

    def _guarded(self, result: CollectResult, what: str, call: Callable[[], _T]) -> _T | _Failed:
        """Run one API call (all its pages); turn AWS failures into entries of ``result``."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )
        from botocore.parsers import ResponseParserError

        try:
            return call()
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise CollectError(f"{exc}. {_NO_CREDENTIALS}") from exc
        except NotImplementedError as exc:  # moto in-process: the action is not emulated
            result.unsupported.append(f"{what}: not supported by this endpoint ({exc})")
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code, message = err.get("Code", "?"), err.get("Message", "")
            attempts = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) + 1
            if code in _UNSUPPORTED_CODES:
                result.unsupported.append(f"{what}: not supported by this endpoint ({code}: {message})")
            elif code in _THROTTLING_CODES:
                result.errors.append(
                    f"{what}: throttled ({code}) after {attempts} attempt(s), nothing written; "
                    "collect again later or raise max_attempts / use retry_mode='adaptive'"
                )
            else:
                result.errors.append(f"{what}: {code}: {message} (nothing written)")
        except ResponseParserError as exc:
            if self.endpoint_url:  # a non-AWS endpoint answered with something that is not EC2 XML
                first = str(exc).splitlines()[0]
                result.unsupported.append(f"{what}: not supported by this endpoint ({first})")
            else:
                result.errors.append(f"{what}: unparsable response: {exc} (nothing written)")
        except BotoCoreError as exc:  # endpoint unreachable, timeouts, ...
            result.errors.append(f"{what}: {exc} (nothing written)")
        return _FAILED

    @staticmethod
    def _pages(client: Any, operation: str, **params: Any) -> Iterable[dict[str, Any]]:
        pages: Iterable[dict[str, Any]] = client.get_paginator(operation).paginate(**params)
        return pages

    # --------------------------------------------------------------------------------- fleet

    def _describe_fleet(self, client: Any, region: str) -> list[InstanceObservation]:
        filters = [{"Name": f"tag:{JOB_TAG_KEY}", "Values": [self.job_tag]}]
        return [
            InstanceObservation.from_api(inst, region)
            for page in self._pages(client, "describe_instances", Filters=filters)
            for reservation in page.get("Reservations", [])
            for inst in reservation.get("Instances", [])
        ]

    def _interruptions(self, client: Any, instance_ids: Sequence[str]) -> dict[str, Interruption]:
        """Interruption notices among the spot requests of ``instance_ids``.

        Real EC2 keeps a request (with its status code) for a while after its instance is gone, which is
        where ``marked-for-termination`` and ``instance-terminated-no-capacity`` show up.
        """
        found: dict[str, Interruption] = {}
        for start in range(0, len(instance_ids), FILTER_VALUES_MAX):
            chunk = list(instance_ids[start : start + FILTER_VALUES_MAX])
            filters = [{"Name": "instance-id", "Values": chunk}]
            for page in self._pages(client, "describe_spot_instance_requests", Filters=filters):
                for req in page.get("SpotInstanceRequests", []):
                    status = req.get("Status") or {}
                    code = status.get("Code") or ""
                    interrupted = SPOT_WARNING_RE.fullmatch(code) or SPOT_RECLAIMED_RE.fullmatch(code)
                    if not req.get("InstanceId") or not interrupted:
                        continue
                    when = as_utc(status["UpdateTime"]) if status.get("UpdateTime") else None
                    prev = found.get(req["InstanceId"])
                    if prev is None or (when is not None and (prev.time is None or when > prev.time)):
                        found[req["InstanceId"]] = Interruption(code, when)
        return found

    def collect_fleet(self, *, now: datetime | None = None) -> CollectResult:
        """Record state transitions of the job's instances since the last round (see :func:`fleet_transitions`).

        Per region, ``describe_instances`` and ``describe_spot_instance_requests`` must both succeed or the
        region contributes nothing (a removal without its interruption code would be recorded wrongly for
        good). ``now`` is the observation time (default: the clock).
        """
        result = CollectResult(rows_written={"fleet_events": 0})
        observed_at = as_utc(now) if now is not None else _now()
        last = _last_known(self.store.fleet_events(self.job_tag))
        rows: list[dict[str, Any]] = []
        for region in self.regions:
            client = self.client(region)
            observed = self._guarded(
                result, f"describe_instances[{region}]", partial(self._describe_fleet, client, region)
            )
            if isinstance(observed, _Failed):
                continue
            ids = {o.instance_id for o in observed if o.lifecycle == "spot"}
            ids |= {
                i for i, r in last.items() if r["region"] == region and r["event"] == "add" and r["lifecycle"] == "spot"
            }
            notices: dict[str, Interruption] | _Failed = {}
            if ids:
                notices = self._guarded(
                    result,
                    f"describe_spot_instance_requests[{region}]",
                    partial(self._interruptions, client, sorted(ids)),
                )
            if isinstance(notices, _Failed):
                continue
            rows += fleet_transitions(observed, last, notices, now=observed_at, job_tag=self.job_tag, region=region)
        result.rows_written["fleet_events"] = self.store.append("fleet_events", rows)
        return result

    def collect_round(self, price_window: timedelta, target_capacity: int) -> CollectRound:
        """The job's fleet, the spot prices of the last ``price_window`` and the placement scores, then the
        store's compaction: every read opens every part file, and each round adds up to three.

        A failed call is in its result's ``errors`` (the others still write); an unwritable store raises
        ``OSError``.
        """
        now = datetime.now(UTC)
        results = {
            "fleet_events": self.collect_fleet(now=now),
            "spot_prices": self.collect_prices(now - price_window, now),
            "placement_scores": self.collect_placement_scores(target_capacity),
        }
        return CollectRound(results, self.store.compact())

    # -------------------------------------------------------------------------------- market

    def collect_prices(self, start: datetime, end: datetime) -> CollectResult:
        """Record spot price history of ``instance_types`` in ``[start, end]`` (all pages, every region)."""
        start_ts, end_ts = as_utc(start), as_utc(end)
        if not start_ts < end_ts:
            raise ValueError(f"empty price window: start {start_ts} is not before end {end_ts}")
        result = CollectResult(rows_written={"spot_prices": 0})
        observed_at = _now()
        rows: list[dict[str, Any]] = []

        def fetch(client: Any, region: str) -> list[dict[str, Any]]:
            history = spot_price_history(client, self.instance_types, start_ts.to_pydatetime(),
                                         end_ts.to_pydatetime(), products=self.product_descriptions)  # fmt: skip
            return [
                {
                    "region": region,
                    "instance_type": p["InstanceType"],
                    "az": p.get("AvailabilityZone", ""),
                    "product": p.get("ProductDescription", ""),
                    "timestamp": as_utc(p["Timestamp"]),
                    "price": float(p["SpotPrice"]),
                    "observed_at": observed_at,
                }
                for p in history
            ]

        for region in self.regions:
            client = self.client(region)
            got = self._guarded(result, f"describe_spot_price_history[{region}]", partial(fetch, client, region))
            if not isinstance(got, _Failed):
                rows += got
        result.rows_written["spot_prices"] = self.store.append("spot_prices", rows)
        return result

    def collect_placement_scores(self, target_capacity: int, *, single_az: bool = False) -> CollectResult:
        """Record spot placement scores (1-10) of ``instance_types`` for ``target_capacity`` instances.

        One call covers all ``regions`` (``RegionNames``), issued from the first. AWS advises at least three
        instance types; with fewer the score is always low. Endpoints without the action (moto) yield an
        ``unsupported`` entry and no rows.
        """
        if isinstance(target_capacity, bool) or int(target_capacity) != target_capacity or target_capacity < 1:
            raise ValueError(f"target_capacity must be a positive integer, got {target_capacity!r}")
        result = CollectResult(rows_written={"placement_scores": 0})
        regions = self.regions
        client = self.client(regions[0])
        asked_at = _now()
        types = ",".join(sorted(self.instance_types))

        def fetch() -> list[dict[str, Any]]:
            pages = self._pages(
                client,
                "get_spot_placement_scores",
                InstanceTypes=list(self.instance_types),
                TargetCapacity=int(target_capacity),
                SingleAvailabilityZone=single_az,
                RegionNames=list(regions),
            )
            return [
                {
                    "region": s.get("Region", ""),
                    "az_id": s.get("AvailabilityZoneId", ""),
                    "instance_types": types,
                    "target_capacity": int(target_capacity),
                    "single_az": single_az,
                    "score": int(s["Score"]),
                    "timestamp": asked_at,
                }
                for page in pages
                for s in page.get("SpotPlacementScores", [])
            ]

        got = self._guarded(result, f"get_spot_placement_scores[{regions[0]}]", fetch)
        if not isinstance(got, _Failed):
            result.rows_written["placement_scores"] = self.store.append("placement_scores", got)
        return result
