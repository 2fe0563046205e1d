"""AWS: the trainer's instances as EC2 spot instances (boto3), their interruption notices, and the on-instance CLI.

Owns: `AwsSpotProvider` (the `InstanceProvider` that launches, lists and terminates a job's spot instances
and gathers their interruption notices), `aws_spot_provider` and `check_credentials` (fail fast before anything is
launched), `aws_job` (a `trainer.providers.agent.RemoteJob` on it, for `trainer.control.run.run_job`), the job token in
SSM (`publish_token`; `python -m trainer.providers.aws token`, which the boot script runs) and the notices' parsing
(`spot_request_notice`, `parse_interruption_event`). Also the package's AWS face: it re-exports the spot
configuration and the errors. Must not touch: the job's control plane (`trainer.control.coordinator` — the driver tells
workers, a provider never does), planning, training, the trace store (`forecasting.collect` records the same fleet
through the same `parcae:job` tag).

Where to look next: `trainer.providers.aws_config` (`AwsSpotConfig`, the boot script `user_data`),
`trainer.providers.aws_errors` (what each AWS error code means and how to fix it), `trainer.providers.imds` (the IMDSv2
watcher the instance agent runs; `python -m trainer.providers.aws watch --pid PID`), `trainer.providers.agent` (the
agent on the instance, `AgentInstances` on the driver). docs/live-fleet.md has the IAM permissions, docs/trainer.md
the three ways a notice arrives. moto (the tests) creates no spot request and emits no notice, so the notice paths
are tested on real-shaped API responses and events.
"""

from __future__ import annotations

import argparse
import base64
import math
import re
import secrets
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from forecasting import ALIVE_STATES, FILTER_VALUES_MAX, SPOT_RECLAIMED_RE, SPOT_WARNING_RE
from trainer.providers.agent import AgentInstances, RemoteJob
from trainer.providers.aws_config import JOB_TAG_KEY, NOTICE_S, WORKER_TAG_KEY, AwsConfigError, AwsSpotConfig, user_data
from trainer.providers.aws_errors import (
    NO_CREDENTIALS,
    NO_REGION,
    AwsCredentialsError,
    AwsProviderError,
    aws_call,
    aws_error,
    client_config,
)
from trainer.providers.fleet import CapacityAnswer, Fleet, SpotPrices
from trainer.providers.imds import IMDS_ENDPOINT, parse_time, watch_process
from trainer.providers.instances import InstanceProvider, NumberedInstances

__all__ = [
    "CAPACITY_CODES",
    "JOB_TAG_KEY",
    "WORKER_TAG_KEY",
    "NOTICE_S",
    "aws_job",
    "aws_spot_provider",
    "publish_token",
    "AwsConfigError",
    "AwsCredentialsError",
    "AwsFleet",
    "AwsProviderError",
    "AwsSpotConfig",
    "AwsSpotProvider",
    "InterruptionEventError",
    "InterruptionNotice",
    "check_credentials",
    "parse_interruption_event",
    "spot_request_notice",
    "user_data",
]

_NOT_TERMINATED: Final = ("pending", "running", "stopping", "stopped", "shutting-down")

_ACTION: Final = {"termination": "terminate", "terminated": "terminate", "stop": "stop", "stopped": "stop",
                  "hibernation": "hibernate", "hibernated": "hibernate"}  # fmt: skip

_INTERRUPTION_WARNING: Final = "EC2 Spot Instance Interruption Warning"
_REBALANCE: Final = "EC2 Instance Rebalance Recommendation"


# ---------------------------------------------------------------------------------------------------- jobs


def publish_token(config: AwsSpotConfig, token: str, *, session: boto3.Session | None = None) -> None:
    """Store the job token in the SSM SecureString parameter `config.token_parameter` (overwriting the previous
    job's), where the instances' boot script reads it. Needs ssm:PutParameter (and the key's kms:Encrypt)."""
    if not token:
        raise ValueError("the job token must not be empty")
    session = session if session is not None else boto3.Session(region_name=config.region)
    ssm = session.client("ssm", region_name=config.region, config=client_config())
    aws_call(f"ssm:PutParameter {config.token_parameter}", ssm.put_parameter, Name=config.token_parameter,
          Value=token, Type="SecureString", Overwrite=True)  # fmt: skip


def aws_job(config: AwsSpotConfig, *, session: boto3.Session | None = None) -> RemoteJob:
    """What `trainer.control.run.run_job` needs to drive a job on spot instances of `config` (a
    `trainer.providers.agent.RemoteJob`): the coordinator listens on `coordinator_port` (all interfaces) and is reached
    at `coordinator_host`, with a fresh token published to SSM; instances are `AwsSpotProvider`'s, their workers run by
    `trainer.providers.agent`. Instances of the same job still running (left by a driver that was killed) are terminated
    when the job starts. Fails fast (`AwsCredentialsError`, `AwsProviderError`) before anything is launched."""
    check_credentials(session, config.region)
    token = secrets.token_urlsafe(32)
    publish_token(config, token, session=session)

    def cloud() -> AwsSpotProvider:
        provider = AwsSpotProvider(config, session=session)
        provider.stop()  # what a killed earlier run of this job left running (by its tag): no longer this job's
        return provider

    return RemoteJob(host=config.coordinator_host, port=config.coordinator_port, token=token,
                     instances=lambda store: AgentInstances(cloud(), store),
                     fleet=lambda store: AwsFleet(cloud(), store))  # fmt: skip


# ----------------------------------------------------------------------------------------------- credentials


def check_credentials(session: boto3.Session | None = None, region: str | None = None) -> dict[str, str]:
    """Fail fast, before anything is launched: AwsCredentialsError (saying which setting to fix) unless there are
    a region and credentials AWS accepts (sts:GetCallerIdentity, which needs no permission). Returns the identity:
    {"account", "arn", "source"} (source: where botocore found the credentials, e.g. "env", "iam-role")."""
    session = session if session is not None else boto3.Session(region_name=region)
    region = region or session.region_name
    if not region:
        raise AwsCredentialsError("check_credentials", NO_REGION)
    creds = session.get_credentials()
    if creds is None:
        raise AwsCredentialsError("check_credentials", NO_CREDENTIALS)
    sts = session.client("sts", region_name=region, config=client_config(max_attempts=2))
    ident = aws_call("sts:GetCallerIdentity", sts.get_caller_identity)
    return {"account": ident.get("Account", ""), "arn": ident.get("Arn", ""), "source": getattr(creds, "method", "")}


def aws_spot_provider(config: AwsSpotConfig, *, session: boto3.Session | None = None) -> InstanceProvider:
    """EC2 spot instances of `config` through boto3 (`session`, default the standard credential chain). Fails fast —
    `AwsCredentialsError`, naming the setting to fix — when there are no AWS credentials or no region, before
    anything is launched."""
    check_credentials(session, getattr(config, "region", None))
    return AwsSpotProvider(config, session=session)


# ---------------------------------------------------------------------------------------------------- notices


@dataclass(frozen=True)
class InterruptionNotice:
    """AWS said instance `instance_id` (our `worker`, None if not ours or not yet mapped) is being taken.

    `kind`: "warning" (reclaimed at `deadline`, about two minutes after `time`), "reclaimed" (already gone, at
    `time`) or "rebalance" (at elevated risk: no deadline). `action`: terminate, stop or hibernate (None for a
    rebalance). `source`: "spot-request" (a status code, `code`) or "eventbridge" (`code` is the detail-type).
    """

    instance_id: str
    kind: str
    source: str
    code: str
    action: str | None = None
    time: datetime | None = None
    deadline: datetime | None = None
    worker: int | None = None


def spot_request_notice(request: Mapping[str, Any], notice_s: float = NOTICE_S) -> InterruptionNotice | None:
    """The notice a `describe_spot_instance_requests` entry carries, or None (fulfilled, cancelled by us, ...)."""
    status = request.get("Status") or {}
    code = status.get("Code") or ""
    instance_id = request.get("InstanceId")
    if not instance_id:
        return None
    when = status.get("UpdateTime")
    if isinstance(when, str):
        when = parse_time(when)
    if m := SPOT_WARNING_RE.fullmatch(code):
        deadline = when + timedelta(seconds=notice_s) if when else None
        return InterruptionNotice(instance_id, "warning", "spot-request", code, _ACTION[m.group(1)], when, deadline)
    if m := SPOT_RECLAIMED_RE.fullmatch(code):
        return InterruptionNotice(instance_id, "reclaimed", "spot-request", code, _ACTION[m.group(1)], when, when)
    return None


class InterruptionEventError(ValueError):
    """An EventBridge event of an interruption type lacks what every such event has."""


def parse_interruption_event(event: Mapping[str, Any], notice_s: float = NOTICE_S) -> InterruptionNotice | None:
    """The notice an EventBridge event carries: "EC2 Spot Instance Interruption Warning" (a warning; its
    detail's instance-action says terminate/stop/hibernate) or "EC2 Instance Rebalance Recommendation". Any other
    event: None. An interruption event without an instance id raises InterruptionEventError."""
    if not isinstance(event, Mapping):
        raise InterruptionEventError(f"an EventBridge event is a JSON object, got {type(event).__name__}")
    kind = event.get("detail-type")
    if kind not in (_INTERRUPTION_WARNING, _REBALANCE) or event.get("source", "aws.ec2") != "aws.ec2":
        return None
    detail = event.get("detail")
    instance_id = detail.get("instance-id") if isinstance(detail, Mapping) else None
    if not isinstance(detail, Mapping) or not isinstance(instance_id, str) or not instance_id:
        raise InterruptionEventError(f"{kind!r} event {event.get('id', '?')}: no detail.instance-id")
    when = parse_time(event["time"]) if isinstance(event.get("time"), str) else None
    if kind == _REBALANCE:
        return InterruptionNotice(instance_id, "rebalance", "eventbridge", kind, None, when, None)
    action = detail.get("instance-action") or "terminate"
    deadline = when + timedelta(seconds=notice_s) if when else None
    return InterruptionNotice(instance_id, "warning", "eventbridge", kind, action, when, deadline)


# ---------------------------------------------------------------------------------------------------- provider


#: How far back `describe_spot_price_history` answers (AWS keeps 90 days; a day's margin for the clock).
PRICE_HISTORY_DAYS: Final = 89


class AwsSpotProvider(NumberedInstances):
    """A job's instances are EC2 spot instances of `config` (one-time requests, or instant EC2 Fleets: `launch`);
    instance i runs worker i.

    `session`: a boto3.Session (default: the standard credential chain); `endpoint_url`: send EC2 calls there (a
    VPC endpoint, a local moto_server). Thread-safe: `preempt`'s timers terminate from their own threads; a failure
    there is raised by the next `alive()`. Use as a context manager, or call `stop()`: spot instances cost money
    until terminated.
    """

    def __init__(
        self, config: AwsSpotConfig, *, session: boto3.Session | None = None, endpoint_url: str | None = None
    ) -> None:
        if not isinstance(config, AwsSpotConfig):
            raise TypeError(f"config must be an AwsSpotConfig, got {type(config).__name__}")
        self.config = config
        self.session = session if session is not None else boto3.Session(region_name=config.region)
        self.ec2 = self.session.client("ec2", region_name=config.region, endpoint_url=endpoint_url,
                                       config=client_config())  # fmt: skip
        super().__init__()
        self._instances: dict[int, str] = {}
        self._types: dict[int, str] = {}  # worker -> the instance type its pool (or AWS's EC2 Fleet) launched
        self._zones: dict[int, str | None] = {}  # worker -> its instance's availability zone, where AWS said
        self._timers: dict[int, tuple[float, threading.Timer]] = {}
        self._deferred: list[AwsProviderError] = []
        self._reported: set[tuple[str, str]] = set()
        self._events: list[InterruptionNotice] = []

    def __enter__(self) -> AwsSpotProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- InstanceProvider ------------------------------------------------------------------------------------
    # start(n), start_ids(ids, next_id): `NumberedInstances`, over `_launch` -- one `run_instances` (or one EC2
    # Fleet request) per instance, all or nothing: if one fails, those this call launched are terminated and
    # AwsProviderError says why

    def _taken(self, ids: list[int]) -> str | None:
        taken = sorted(w for w in ids if w in self._instances)
        return f"worker ids {taken} already have an instance" if taken else None

    def _launch(self, ids: list[int]) -> None:
        """An instance per worker id (`AwsSpotConfig.launch`: a `run_instances` pool after pool, or an EC2 Fleet
        request offering every pool); all or nothing. Called with the lock held."""
        launched: dict[int, str] = {}
        pools = list(self.config.capacity_pools)  # run-instances: a pool that refused one is not asked again now
        for w in ids:
            try:
                if self.config.launch == "ec2-fleet":
                    launched[w] = self._launch_in_fleet(w)
                else:
                    launched[w] = self._launch_in_pools(w, pools)
            except AwsProviderError as exc:
                self._roll_back(launched, exc)
                raise
        self._instances.update(launched)

    def _launch_in_pools(self, w: int, pools: list[tuple[str, str | None]]) -> str:
        """Worker `w`'s instance, in the first of `pools` that has capacity (one that refuses leaves `pools`)."""
        several = len(self.config.capacity_pools) > 1
        refused: list[AwsProviderError] = []
        for pool in list(pools):
            what = f"worker {w}, {_pool_name(pool)}" if several else f"worker {w}"
            try:
                resp = aws_call(f"run_instances ({what})", self.ec2.run_instances, **self.launch_params(w, pool))
            except AwsProviderError as exc:
                if exc.code in CAPACITY_CODES and pool != pools[-1]:
                    refused.append(exc)
                    pools.remove(pool)
                    continue
                if refused:  # every pool refused: say so, with AWS's code of the last one
                    exc.args = (f"{exc.args[0]} (and before it: {'; '.join(str(e) for e in refused)})",)
                raise
            self._types[w] = pool[0]
            self._zones[w] = resp["Instances"][0].get("Placement", {}).get("AvailabilityZone")
            return str(resp["Instances"][0]["InstanceId"])
        raise AssertionError("unreachable: the last pool's refusal is raised")

    def _launch_in_fleet(self, w: int) -> str:
        """Worker `w`'s instance from an instant EC2 Fleet that offers every capacity pool, AWS choosing by
        `allocation_strategy`. One fleet per instance, because each boot script names its worker: its launch
        template is made for it and deleted once AWS has answered (`stop` deletes any a crash left)."""
        c = self.config
        name = f"parcae-{_TEMPLATE_NAME_RE.sub('-', c.job)[:80]}-{w}-{secrets.token_hex(4)}"
        made = aws_call(f"create_launch_template (worker {w})", self.ec2.create_launch_template,
                        LaunchTemplateName=name, LaunchTemplateData=self.launch_template_data(w),
                        TagSpecifications=[{"ResourceType": "launch-template", "Tags": self._job_tags()}])  # fmt: skip
        template = made["LaunchTemplate"]["LaunchTemplateId"]
        try:
            resp = aws_call(f"create_fleet (worker {w})", self.ec2.create_fleet, **self.fleet_params(template))
        finally:
            with suppress(AwsProviderError):  # a template costs nothing; stop() deletes what is left
                aws_call("delete_launch_template", self.ec2.delete_launch_template, LaunchTemplateId=template)
        launched = [
            (i, item.get("InstanceType"), item.get("LaunchTemplateAndOverrides", {}).get("Overrides", {}))
            for item in resp.get("Instances", [])
            for i in item.get("InstanceIds", [])
        ]
        if launched:
            iid, kind, overrides = launched[0]
            self._types[w] = str(kind or c.instance_type)  # the pool AWS picked
            self._zones[w] = overrides.get("AvailabilityZone")  # (an override by subnet names no zone)
            return str(iid)
        raise fleet_error(f"create_fleet (worker {w})", resp.get("Errors", []))

    def _roll_back(self, launched: dict[int, str], cause: AwsProviderError) -> None:
        if not launched:
            return
        try:
            aws_call(
                "terminate_instances (rollback)", self.ec2.terminate_instances, InstanceIds=list(launched.values())
            )
        except AwsProviderError as exc:  # keep them: stop() retries, and their ids must not be handed out again
            self._instances.update(launched)
            self._next_id = max(launched) + 1
            cause.args = (f"{cause.args[0]}; and rolling back the {len(launched)} instance(s) this start launched "
                          f"failed ({exc}): workers {sorted(launched)} stay until stop()",)  # fmt: skip

    def _job_tags(self) -> list[dict[str, str]]:
        return [{"Key": JOB_TAG_KEY, "Value": self.config.job}]

    def _instance_spec(self, worker: int) -> dict[str, Any]:
        """What worker `worker`'s instance is, however it is asked for: AMI, role, IMDSv2 only, network, tags."""
        c = self.config
        tags = [*self._job_tags(), {"Key": WORKER_TAG_KEY, "Value": str(worker)}]
        profile = c.iam_instance_profile
        spec: dict[str, Any] = {
            "ImageId": c.image_id,
            "IamInstanceProfile": {"Arn": profile} if profile.startswith("arn:") else {"Name": profile},
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},  # IMDSv2 only
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [*tags, {"Key": "Name", "Value": f"parcae-{c.job}-{worker}"}]},
                {"ResourceType": "spot-instances-request", "Tags": tags},
            ],
        }
        if c.security_group_ids:
            spec["SecurityGroupIds"] = list(c.security_group_ids)
        if c.key_name is not None:
            spec["KeyName"] = c.key_name
        return spec

    def launch_params(self, worker: int, pool: tuple[str, str | None] | None = None) -> dict[str, Any]:
        """The `run_instances` parameters of worker `worker`'s instance, in capacity `pool` (instance type, subnet;
        default: the config's first)."""
        c = self.config
        instance_type, subnet = pool if pool is not None else c.capacity_pools[0]
        spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if c.max_price is not None:
            spot["MaxPrice"] = c.max_price
        params: dict[str, Any] = {
            **self._instance_spec(worker),
            "InstanceType": instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": user_data(c, worker),  # boto3 base64-encodes it
            "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": spot},
        }
        if subnet is not None:
            params["SubnetId"] = subnet
        return params

    def launch_template_data(self, worker: int) -> dict[str, Any]:
        """The launch template of worker `worker`'s EC2 Fleet request: its instance without type, subnet or market
        (the fleet's overrides and spot options say those; EC2 Fleet refuses a template that asks for spot)."""
        data = self._instance_spec(worker)
        data["UserData"] = base64.b64encode(user_data(self.config, worker).encode()).decode()  # not encoded for us
        return data

    def fleet_params(self, template_id: str) -> dict[str, Any]:
        """The `create_fleet` parameters: one spot instance from launch template `template_id`, in whichever of the
        capacity pools AWS's `allocation_strategy` picks (the pools' order is their priority)."""
        c = self.config
        overrides: list[dict[str, Any]] = []
        for rank, (instance_type, subnet) in enumerate(c.capacity_pools):
            o: dict[str, Any] = {"InstanceType": instance_type}
            if subnet is not None:
                o["SubnetId"] = subnet
            if c.max_price is not None:
                o["MaxPrice"] = c.max_price
            if c.allocation_strategy == "capacity-optimized-prioritized":
                o["Priority"] = float(rank)
            overrides.append(o)
        return {
            "Type": "instant",
            "TargetCapacitySpecification": {"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "spot"},
            "SpotOptions": {"AllocationStrategy": c.allocation_strategy, "InstanceInterruptionBehavior": "terminate"},
            "LaunchTemplateConfigs": [{
                "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": "$Latest"},
                "Overrides": overrides,
            }],
            "TagSpecifications": [{"ResourceType": "fleet", "Tags": self._job_tags()}],
        }  # fmt: skip

    def alive(self) -> set[int]:
        """Workers whose instance is pending or running (one describe_instances by the job tag)."""
        with self._lock:
            if self._deferred:
                errors, self._deferred = self._deferred, []
                raise AwsProviderError("preempt (timer)", "; ".join(str(e) for e in errors))
            running = self._job_instances(ALIVE_STATES)
            return {w for w, iid in self._instances.items() if iid in running}

    def kill(self, ids: Iterable[int]) -> None:
        """Terminate the instances of `ids` now (a reclaim without notice)."""
        with self._lock:
            ids = self._known(ids)
            for w in ids:
                self._cancel_timer(w)
            if ids:
                aws_call("terminate_instances", self.ec2.terminate_instances,
                      InstanceIds=[self._instances[w] for w in ids])  # fmt: skip

    def preempt(self, ids: Iterable[int], notice_s: float) -> None:
        """Terminate `ids` after `notice_s` seconds (a timer per instance; the earliest deadline wins).

        Not how AWS preempts — the cloud does, with its notice (see `interruptions`). This is the reclaim a chaos
        drill or a trace replay asks for on real instances; the driver tells the job, as with local processes.
        """
        number = isinstance(notice_s, (int, float)) and not isinstance(notice_s, bool)
        if not (number and math.isfinite(notice_s) and notice_s >= 0):
            raise ValueError(f"notice_s must be seconds >= 0, got {notice_s!r}")
        with self._lock:
            ids = self._known(ids)
            if notice_s == 0:
                self.kill(ids)
                return
            deadline = time.monotonic() + notice_s
            for w in ids:
                old = self._timers.get(w)
                if old is not None and old[0] <= deadline:
                    continue
                self._cancel_timer(w)
                timer = threading.Timer(notice_s, self._reclaim, args=(w,))
                timer.daemon = True
                timer.name = f"parcae-reclaim-{w}"
                self._timers[w] = (deadline, timer)
                timer.start()

    def _reclaim(self, w: int) -> None:
        with self._lock:
            entry = self._timers.get(w)
            if entry is None or entry[1] is not threading.current_thread():
                return  # cancelled or replaced meanwhile
            del self._timers[w]
            try:
                aws_call(
                    "terminate_instances (preempt)", self.ec2.terminate_instances, InstanceIds=[self._instances[w]]
                )
            except AwsProviderError as exc:
                self._deferred.append(exc)

    def _cancel_timer(self, w: int) -> None:
        entry = self._timers.pop(w, None)
        if entry is not None:
            entry[1].cancel()

    def _known(self, ids: Iterable[int]) -> list[int]:
        ids = sorted(set(ids))
        unknown = [w for w in ids if w not in self._instances]
        if unknown:
            raise ValueError(f"unknown worker id(s) {unknown}: this provider started {sorted(self._instances)}")
        return ids

    # -- beyond the interface ----------------------------------------------------------------------------------
    def instance_ids(self) -> dict[int, str]:
        """Worker id -> EC2 instance id, for every instance this provider launched."""
        with self._lock:
            return dict(self._instances)

    def instance_type_of(self, worker: int) -> str | None:
        """The instance type worker `worker`'s instance is (its capacity pool's: with several instance types, not
        always `config.instance_type`); None: no instance of this provider's."""
        with self._lock:
            return self._types.get(worker)

    def zone_of(self, worker: int) -> str | None:
        """The availability zone of worker `worker`'s instance, as AWS answered its launch (None: not said)."""
        with self._lock:
            return self._zones.get(worker)

    def spot_prices(self, instance_types: Sequence[str], start: float, end: float) -> SpotPrices:
        """AWS's own spot prices of `instance_types` in every zone of the region from `start` to `end` (epoch
        seconds): ``describe_spot_price_history`` for Linux/UNIX, what the job's instances were billed at (an AMI of
        another platform is priced otherwise). AWS keeps 90 days: a longer job's earlier time is priced at the
        oldest price it gives. A call refused (no ``ec2:DescribeSpotPriceHistory``) is the `SpotPrices`' error."""
        from forecasting import spot_price_history  # deferred: the instance's own commands need no pandas

        source = f"AWS describe_spot_price_history, {self.config.region}"
        kept = min(end, max(start, time.time() - PRICE_HISTORY_DAYS * 86400.0))
        window = {"start": datetime.fromtimestamp(kept, UTC), "end": datetime.fromtimestamp(end, UTC)}
        try:
            records = aws_call("ec2:DescribeSpotPriceHistory", spot_price_history, client=self.ec2,
                               instance_types=sorted(instance_types), **window)  # fmt: skip
        except AwsProviderError as exc:  # (named by its IAM action: a refusal's fix is to allow it)
            return SpotPrices(source, error=str(exc))
        changes: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for r in records:
            pool = (str(r["InstanceType"]), str(r.get("AvailabilityZone", "")))
            changes.setdefault(pool, []).append((r["Timestamp"].timestamp(), float(r["SpotPrice"])))  # (botocore's)
        return SpotPrices(source, {pool: sorted(points) for pool, points in changes.items()})

    def worker_of(self, instance_id: str) -> int | None:
        with self._lock:
            return next((w for w, iid in self._instances.items() if iid == instance_id), None)

    def feed_event(self, event: Mapping[str, Any]) -> InterruptionNotice | None:
        """Hand over an EventBridge event (parsed JSON); its notice, if it is one about our instances, is returned
        and queued for `interruptions()`."""
        notice = parse_interruption_event(event, self.config.notice_s)
        if notice is None:
            return None
        w = self.worker_of(notice.instance_id)
        if w is None:
            return None
        notice = _with_worker(notice, w)
        with self._lock:
            self._events.append(notice)
        return notice

    def interruptions(self) -> list[InterruptionNotice]:
        """Notices not reported before: queued EventBridge ones, then the spot requests' status codes (polled now).

        Each (instance, kind) is reported once, whichever path saw it first; a warning and the later reclaim of
        the same instance are two notices.
        """
        with self._lock:
            queued, self._events = self._events, []
            ids = list(self._instances.values())
        polled = self._poll_spot_requests(ids)
        fresh: list[InterruptionNotice] = []
        with self._lock:
            for n in [*queued, *polled]:
                key = (n.instance_id, n.kind)
                if key not in self._reported:
                    self._reported.add(key)
                    fresh.append(n)
        return fresh

    def _poll_spot_requests(self, instance_ids: Sequence[str]) -> list[InterruptionNotice]:
        out: list[InterruptionNotice] = []
        pages = self.ec2.get_paginator("describe_spot_instance_requests")
        for start in range(0, len(instance_ids), FILTER_VALUES_MAX):
            chunk = list(instance_ids[start : start + FILTER_VALUES_MAX])
            try:
                for page in pages.paginate(Filters=[{"Name": "instance-id", "Values": chunk}]):
                    for req in page.get("SpotInstanceRequests", []):
                        notice = spot_request_notice(req, self.config.notice_s)
                        w = self.worker_of(notice.instance_id) if notice is not None else None
                        if notice is not None and w is not None:
                            out.append(_with_worker(notice, w))
            except (ClientError, BotoCoreError) as exc:
                raise aws_error("describe_spot_instance_requests", exc) from exc
        return out

    def stop(self) -> None:
        """Terminate every instance of the job (by its tag, so also those of an earlier provider of the same job)
        and cancel pending preemptions. Raises what a preemption timer met, after terminating."""
        with self._lock:
            for w in list(self._timers):
                self._cancel_timer(w)
            ids = sorted(self._job_instances(_NOT_TERMINATED))  # ours carry the tag too
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                aws_call("terminate_instances (stop)", self.ec2.terminate_instances, InstanceIds=chunk)
            if self.config.launch == "ec2-fleet":
                self._delete_templates()
            if self._deferred:
                errors, self._deferred = self._deferred, []
                raise AwsProviderError("preempt (timer)", "; ".join(str(e) for e in errors))

    def _delete_templates(self) -> None:
        """Delete the job's launch templates that a launch could not (EC2 Fleet requests; found by the job tag)."""
        filters = [{"Name": f"tag:{JOB_TAG_KEY}", "Values": [self.config.job]}]
        try:
            pages = self.ec2.get_paginator("describe_launch_templates").paginate(Filters=filters)
            left = [t["LaunchTemplateId"] for page in pages for t in page.get("LaunchTemplates", [])]
        except (ClientError, BotoCoreError) as exc:
            raise aws_error("describe_launch_templates", exc) from exc
        for template in left:
            aws_call("delete_launch_template (stop)", self.ec2.delete_launch_template, LaunchTemplateId=template)

    def _job_instances(self, states: Sequence[str]) -> set[str]:
        filters = [{"Name": f"tag:{JOB_TAG_KEY}", "Values": [self.config.job]},
                   {"Name": "instance-state-name", "Values": list(states)}]  # fmt: skip
        try:
            pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
            return {i["InstanceId"] for page in pages for r in page.get("Reservations", []) for i in r["Instances"]}
        except (ClientError, BotoCoreError) as exc:
            raise aws_error("describe_instances", exc) from exc


# ------------------------------------------------------------------------------------------------ a live fleet

#: The launch errors that mean "no capacity for you now" — the market's answer, recorded and retried with backoff —
#: rather than a configuration to fix (which fails the job with AWS's message and our fix).
CAPACITY_CODES: Final = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded", "UnfulfillableCapacity",
})  # fmt: skip
_TEMPLATE_NAME_RE: Final = re.compile(r"[^A-Za-z0-9().\-_]")  # what a launch template's name may not hold


def fleet_error(operation: str, errors: Sequence[Mapping[str, Any]]) -> AwsProviderError:
    """An instant EC2 Fleet that launched nothing, as one error: each pool's answer, with the code of the first
    that is a configuration to fix (so the job fails with its fix), else of the first capacity refusal."""
    if not errors:
        return AwsProviderError(operation, "no instance launched, and no error given", "UnfulfillableCapacity")

    def pool(e: Mapping[str, Any]) -> str:
        o = e.get("LaunchTemplateAndOverrides", {}).get("Overrides", {})
        return _pool_name((o.get("InstanceType", "?"), o.get("SubnetId")))

    to_fix = [e for e in errors if e.get("ErrorCode") not in CAPACITY_CODES]
    code = str((to_fix or errors)[0].get("ErrorCode", "?"))
    each = "; ".join(f"{pool(e)}: {e.get('ErrorCode', '?')}: {e.get('ErrorMessage', '')}" for e in errors)
    return AwsProviderError(operation, f"no pool launched an instance ({each})", code)


def _pool_name(pool: tuple[str, str | None]) -> str:
    return f"{pool[0]} in {pool[1] or 'the default subnet'}"


class AwsFleet(AgentInstances, Fleet):
    """A live fleet of EC2 spot instances (`AwsSpotProvider`), their workers run by instance agents.

    A request launches instances one by one, each in the first of the config's capacity pools (instance types x
    subnets, `AwsSpotConfig.capacity_pools`) that has capacity — or, with `launch="ec2-fleet"`, in the pool an EC2
    Fleet request picks — until every pool refuses one with a capacity error (`CAPACITY_CODES`): the rest of the
    request is refused, with AWS's code as the reason (the driver retries with backoff). Any other launch error is
    a configuration to fix and fails the job. A granted instance arrives at once (its agent starts the worker when
    it boots; one reclaimed while it boots is seen as killed); the cloud's interruption notices reach its agent,
    and through it the worker, as in any AWS job."""

    def __init__(self, cloud: AwsSpotProvider, store: Any, **kw: Any) -> None:
        super().__init__(cloud, store, **kw)
        self._spot = cloud  # (`cloud`, typed as this fleet's: the types of its instances)
        self._arrived: list[int] = []

    def request(self, n: int) -> CapacityAnswer:
        granted: list[int] = []
        try:
            for _ in range(n):
                granted += self.start(1)
        except AwsProviderError as exc:
            if exc.code not in CAPACITY_CODES:
                raise
            self._arrived += granted
            return CapacityAnswer(n, tuple(granted), refused=n - len(granted), reason=exc.code)
        self._arrived += granted
        return CapacityAnswer(n, tuple(granted))

    def arrivals(self) -> list[int]:
        out, self._arrived = self._arrived, []
        return out

    def outstanding(self) -> int:
        return 0  # a granted instance has arrived already: its worker joins when it has booted

    def joined(self, ids: list[int]) -> None:
        """(An agent holds a notice until its worker can take it: nothing to do.)"""

    def instance_type_of(self, worker: int) -> str | None:
        return self._spot.instance_type_of(worker)

    def zone_of(self, worker: int) -> str | None:
        return self._spot.zone_of(worker)

    def spot_prices(self, instance_types: Sequence[str], start: float, end: float) -> SpotPrices:
        return self._spot.spot_prices(instance_types, start, end)


def _with_worker(notice: InterruptionNotice, worker: int) -> InterruptionNotice:
    return replace(notice, worker=worker)


# ----------------------------------------------------------------------------------------- the on-instance CLI


def _token(a: argparse.Namespace) -> int:
    try:
        ssm = boto3.Session(region_name=a.region).client("ssm", config=client_config(max_attempts=3))
        value = aws_call(f"ssm:GetParameter {a.parameter}", ssm.get_parameter, Name=a.parameter, WithDecryption=True)
        token = value["Parameter"]["Value"]
    except AwsProviderError as exc:
        print(f"parcae token: cannot read the job token from SSM parameter {a.parameter!r} in {a.region}: {exc}. "
              "Fix: create it (`aws ssm put-parameter --type SecureString`) and let the instance profile's role "
              "ssm:GetParameter it (and kms:Decrypt its key)", file=sys.stderr)  # fmt: skip
        return 1
    if not token:
        print(f"parcae token: SSM parameter {a.parameter!r} is empty", file=sys.stderr)
        return 1
    sys.stdout.write(token + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m trainer.providers.aws", description="The instance side of a parcae spot job."
    )
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("watch", help="signal a process when IMDS posts a spot interruption notice")
    w.add_argument("--pid", type=int, required=True, help="the process to signal (the worker)")
    w.add_argument("--signal", default="TERM", choices=["TERM", "INT", "USR1", "USR2"], help="default: TERM")
    w.add_argument(
        "--endpoint",
        default=None,
        help=f"the instance metadata service (default: $AWS_EC2_METADATA_SERVICE_ENDPOINT, else {IMDS_ENDPOINT})",
    )
    w.add_argument("--poll-s", type=float, default=5.0, help="seconds between polls (AWS advises 5)")
    t = sub.add_parser("token", help="print the job token held in an SSM SecureString parameter")
    t.add_argument("--parameter", required=True)
    t.add_argument("--region", required=True)
    a = p.parse_args(argv)
    if a.command == "watch" and not a.poll_s > 0:
        p.error(f"--poll-s must be > 0, got {a.poll_s}")
    if a.command == "watch":
        return watch_process(a.pid, a.signal, poll_s=a.poll_s, endpoint=a.endpoint)
    return _token(a)


if __name__ == "__main__":
    sys.exit(main())
