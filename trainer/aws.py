"""AWS: the trainer's instances as real EC2 spot instances (boto3), and the on-instance side of a spot notice.

Owns: `AwsSpotConfig` (what a job's spot instances look like), `AwsSpotProvider` (the `InstanceProvider` that
launches, lists and terminates them, and gathers their interruption notices), `check_credentials` (fail fast before
anything is launched), the job token in SSM (`publish_token`, and `python -m trainer.aws token`, which the boot
script runs), the instances' boot script (`user_data`), and the IMDSv2 interruption watcher (`InstanceActionWatcher`,
which the instance agent runs; standalone: `python -m trainer.aws watch --pid PID`). Must not touch: the job's control plane (`trainer.coordinator`
— a provider never tells workers anything, the driver does), planning, training, the trace store
(`forecasting.collect` records the same fleet through the same `parcae:job` tag).

How the pieces fit. `aws_job(config)` is what `trainer.run.run_job` needs to drive a job on spot instances: a
fresh job token published to SSM (`publish_token`) and `trainer.agent.AgentInstances` over this provider.
`start(n)` launches n one-time spot instances, one `run_instances` call each (each has its own worker id, in a tag
and in its boot script). The boot script (cloud-init user data) holds no secret: it reads the job token from an
SSM SecureString parameter with the instance profile's credentials and `exec`s the instance agent
(`python -m trainer.agent --id N --host H --port P --imds`, the token in PARCAE_TOKEN, not in argv: `ps`), which
runs the worker, reports its exit codes through the job's store, restarts it when the driver asks (a
checkpoint-restart) and watches IMDSv2 for the spot notice. The instance profile therefore needs ssm:GetParameter
on that parameter (and kms:Decrypt on its key); the driver needs ssm:PutParameter on it, ec2:RunInstances,
ec2:CreateTags, ec2:Describe*, ec2:TerminateInstances and iam:PassRole on the profile's role.

Preemption on AWS comes from the cloud, with a two-minute notice that reaches us three ways:
  * on the instance, IMDSv2 `spot/instance-action` (`InstanceActionWatcher`, run by the agent, which passes the
    notice on to the worker as SIGTERM; the worker's handler reports it to the coordinator through the store,
    `ctl/notice/{id}`, and keeps training until the driver decides its preemption; AWS jobs run with
    `notice_grace_s=120`);
  * at the driver, the spot request's status code (`describe_spot_instance_requests`: marked-for-termination, then
    instance-terminated-no-capacity, ...), polled by `AwsSpotProvider.interruptions()` (`AgentInstances.poll`
    passes them to the workers through their agents);
  * at the driver, EventBridge events ("EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance
    Recommendation") that whoever consumes the event bus (an SQS queue, a Lambda) hands to `feed_event`.
`preempt(ids, notice_s)` is not how AWS preempts: it is a reclaim we imitate (terminate after `notice_s`, a timer)
for chaos drills and trace replays on real instances, as `LocalProcessProvider.preempt` does locally.

moto (the tests) launches spot instances through `run_instances` but creates no spot request for them and cannot
emit notices, so the notice paths are tested on real-shaped API responses and events.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import shlex
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError, PartialCredentialsError

from trainer.agent import AgentInstances, RemoteJob
from trainer.instances import NumberedInstances

__all__ = [
    "JOB_TAG_KEY",
    "WORKER_TAG_KEY",
    "NOTICE_S",
    "aws_job",
    "imds_watcher",
    "publish_token",
    "AwsConfigError",
    "AwsCredentialsError",
    "AwsProviderError",
    "AwsSpotConfig",
    "AwsSpotProvider",
    "InstanceAction",
    "InstanceActionWatcher",
    "InterruptionEventError",
    "InterruptionNotice",
    "check_credentials",
    "parse_interruption_event",
    "spot_request_notice",
    "user_data",
]

#: The tag that marks a job's instances; the same key `forecasting.collect` filters the fleet by.
JOB_TAG_KEY: Final = "parcae:job"
#: The tag holding an instance's worker id (stable: 0, 1, ... in launch order).
WORKER_TAG_KEY: Final = "parcae:worker-id"
#: AWS's spot interruption notice: two minutes before the instance is reclaimed.
NOTICE_S: Final = 120.0
IMDS_ENDPOINT: Final = "http://169.254.169.254"

_ALIVE: Final = ("pending", "running")
_NOT_TERMINATED: Final = ("pending", "running", "stopping", "stopped", "shutting-down")
_FILTER_VALUES_MAX: Final = 200  # EC2 caps the values of one filter

# Spot request status codes (AWS EC2 user guide, "Spot request status codes"). A warning: the instance is still
# running and will be reclaimed in ~2 minutes. A reclaim: the cloud took it. *-by-user, -by-schedule, -by-service
# (terminated from stopped) and request-canceled-and-instance-running are our own doing, not interruptions.
_WARNING_RE: Final = re.compile(r"marked-for-(termination|stop|hibernation)")
_RECLAIMED_RE: Final = re.compile(
    r"instance-(terminated|stopped|hibernated)-"
    r"(by-price|no-capacity|capacity-oversubscribed|launch-group-constraint|by-experiment)"
)
_ACTION: Final = {"termination": "terminate", "terminated": "terminate", "stop": "stop", "stopped": "stop",
                  "hibernation": "hibernate", "hibernated": "hibernate"}  # fmt: skip

_INTERRUPTION_WARNING: Final = "EC2 Spot Instance Interruption Warning"
_REBALANCE: Final = "EC2 Instance Rebalance Recommendation"

_NO_CREDENTIALS: Final = (
    "no AWS credentials found, and the AWS spot provider needs them. Fix: set AWS_PROFILE to a profile in "
    "~/.aws/config or ~/.aws/credentials (or run `aws configure` / `aws sso login`), or set AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary keys), or run the driver on an instance whose "
    "instance role grants ec2:RunInstances, ec2:CreateTags, ec2:Describe*, ec2:TerminateInstances and iam:PassRole"
)
_NO_REGION: Final = (
    "no AWS region given. Fix: set AwsSpotConfig.region (or AWS_REGION / AWS_DEFAULT_REGION, or `region` in the "
    "profile in ~/.aws/config)"
)
_REJECTED_CREDENTIALS: Final = frozenset({
    "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException", "AuthFailure",
    "UnrecognizedClientException", "InvalidAccessKeyId", "RequestExpired",
})  # fmt: skip

# What to do about the errors a launch most often meets (the AWS code, then our fix).
_HINTS: Final = {
    "InsufficientInstanceCapacity": "no spot capacity for this instance type in this Availability Zone now: retry "
    "later, or set AwsSpotConfig.subnet_id to a subnet in another zone, or pick another instance_type",
    "SpotMaxPriceTooLow": "AwsSpotConfig.max_price is below the spot price: raise it, or leave it unset (the "
    "on-demand price)",
    "MaxSpotInstanceCountExceeded": "the account's spot instance quota is used up: request an increase (Service "
    "Quotas, 'All P Spot Instance Requests' for p3) or start fewer instances",
    "VcpuLimitExceeded": "the account's vCPU quota for this instance family is used up: request an increase in "
    "Service Quotas",
    "InvalidAMIID.NotFound": "AwsSpotConfig.image_id does not exist in AwsSpotConfig.region (AMIs are regional)",
    "InvalidAMIID.Malformed": "AwsSpotConfig.image_id is not an AMI id",
    "InvalidSubnetID.NotFound": "AwsSpotConfig.subnet_id does not exist in AwsSpotConfig.region",
    "InvalidGroup.NotFound": "a group of AwsSpotConfig.security_group_ids does not exist in the subnet's VPC",
    "InvalidKeyPair.NotFound": "AwsSpotConfig.key_name is not a key pair in AwsSpotConfig.region",
    "UnauthorizedOperation": "the credentials' IAM policy lacks this action (launching also needs iam:PassRole on "
    "the instance profile's role); `aws sts decode-authorization-message` explains an encoded message",
    "NoSuchEntity": "AwsSpotConfig.iam_instance_profile does not exist",
    "InvalidParameterValue": "check AwsSpotConfig (an iam_instance_profile that does not exist is reported this way)",
}


# ---------------------------------------------------------------------------------------------------- errors


class AwsProviderError(RuntimeError):
    """An AWS call failed: says which operation, AWS's code and message, and what to do about it."""

    def __init__(self, operation: str, message: str, code: str = "") -> None:
        self.operation, self.code, self.aws_message = operation, code, message
        hint = _HINTS.get(code)
        text = f"{operation}: {code + ': ' if code else ''}{message}"
        super().__init__(f"{text}. Fix: {hint}" if hint else text)


class AwsCredentialsError(AwsProviderError):
    """No usable AWS credentials or region: nothing can be launched."""


class AwsConfigError(ValueError):
    """A field of `AwsSpotConfig` is wrong; the message names it."""


def _aws_error(operation: str, exc: Exception) -> AwsProviderError:
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code, message = err.get("Code", "?"), err.get("Message", "")
        if code in _REJECTED_CREDENTIALS:
            return AwsCredentialsError(operation, f"AWS rejected the credentials ({message}). {_NO_CREDENTIALS}", code)
        return AwsProviderError(operation, message, code)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return AwsCredentialsError(operation, f"{exc}. {_NO_CREDENTIALS}")
    if isinstance(exc, NoRegionError):
        return AwsCredentialsError(operation, _NO_REGION)
    return AwsProviderError(operation, f"{type(exc).__name__}: {exc}")  # unreachable endpoint, timeouts, ...


def _call(operation: str, fn: Callable[..., Any], **params: Any) -> Any:
    try:
        return fn(**params)
    except (ClientError, BotoCoreError) as exc:
        raise _aws_error(operation, exc) from exc


# ---------------------------------------------------------------------------------------------------- config

_REGION_RE: Final = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
_INSTANCE_TYPE_RE: Final = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+")
_AMI_RE: Final = re.compile(r"ami-[0-9a-f]{8,17}")
_SUBNET_RE: Final = re.compile(r"subnet-[0-9a-f]{8,17}")
_SG_RE: Final = re.compile(r"sg-[0-9a-f]{8,17}")
_TAG_VALUE_RE: Final = re.compile(r"[\w .:/=+\-@]{1,200}")  # what EC2 tag values allow (200: room for "Name")
_PROFILE_RE: Final = re.compile(r"[\w+=,.@-]{1,128}|arn:aws[\w-]*:iam::\d{12}:instance-profile/[\w+=,.@/-]{1,128}")
_SSM_NAME_RE: Final = re.compile(r"[\w.-]+|(/[\w.-]+)+")
_HOST_RE: Final = re.compile(r"[A-Za-z0-9.:\[\]-]{1,253}")
_LOOPBACK: Final = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})
_REQUIRED: Final = ("region", "image_id", "job", "coordinator_host", "coordinator_port", "token_parameter",
                    "iam_instance_profile")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class AwsSpotConfig:
    """What a job's spot instances look like, and how their workers find the job.

    `job` tags every instance (`parcae:job`) and is what alive()/stop() select by: one job, one value.
    `coordinator_host`/`coordinator_port`: the coordinator's TCPStore, as the instances reach it (a private IP in
    the subnet's VPC, never loopback). `token_parameter`: the name of an SSM SecureString parameter holding the job
    token (read on the instance at boot; never in user data, which anyone with ec2:DescribeInstanceAttribute reads).
    `python`: the interpreter on the AMI that has this project installed; `workdir`: where the worker runs.
    `iam_instance_profile`: a name or an ARN; its role must be allowed ssm:GetParameter on `token_parameter`.
    `subnet_id`/`security_group_ids`: None/() for the default VPC's. `max_price`: USD per hour (None: the
    on-demand price). `notice_s`: how long before a reclaim AWS warns (its two minutes).
    """

    region: str
    image_id: str
    job: str
    coordinator_host: str
    coordinator_port: int
    token_parameter: str
    iam_instance_profile: str
    instance_type: str = "p3.2xlarge"
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    python: str = "python3"
    workdir: str = "/opt/parcae"
    max_price: str | None = None
    notice_s: float = NOTICE_S

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> AwsConfigError:
            return AwsConfigError(f"AwsSpotConfig.{name}: expected {expected}, got {getattr(self, name)!r}")

        def match(name: str, pattern: re.Pattern[str], expected: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, str) or not pattern.fullmatch(value):
                raise bad(name, expected)

        match("region", _REGION_RE, "an AWS region such as 'us-east-1'")
        match("image_id", _AMI_RE, "an AMI id such as 'ami-0123456789abcdef0' (of this region)")
        match("job", _TAG_VALUE_RE, "a tag value of 1-200 letters, digits, spaces or _ . : / = + - @")
        match("instance_type", _INSTANCE_TYPE_RE, "an EC2 instance type such as 'p3.2xlarge'")
        match("iam_instance_profile", _PROFILE_RE, "an instance profile name or ARN")
        match("token_parameter", _SSM_NAME_RE, "an SSM parameter name such as '/parcae/job-token'")
        match("coordinator_host", _HOST_RE, "a host name or IP address the instances can reach")
        if self.coordinator_host.lower() in _LOOPBACK:
            raise AwsConfigError(
                f"AwsSpotConfig.coordinator_host: {self.coordinator_host!r} is the instance itself; give the "
                "coordinator's address as the instances see it (e.g. its private IP in the subnet's VPC)"
            )
        port = self.coordinator_port
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise bad("coordinator_port", "a TCP port number (1-65535)")
        if self.subnet_id is not None:
            match("subnet_id", _SUBNET_RE, "a subnet id such as 'subnet-0123456789abcdef0', or None")
        groups = self.security_group_ids
        if isinstance(groups, str) or not all(isinstance(g, str) and _SG_RE.fullmatch(g) for g in groups):
            raise bad("security_group_ids", "a list of security group ids such as ['sg-0123456789abcdef0']")
        object.__setattr__(self, "security_group_ids", tuple(groups))
        if self.key_name is not None and (not isinstance(self.key_name, str) or not self.key_name.strip()):
            raise bad("key_name", "the name of an EC2 key pair, or None")
        for name in ("python", "workdir"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or any(c in value for c in "\n\r\0"):
                raise bad(name, "a path on the AMI")
        if not self.workdir.startswith("/"):
            raise bad("workdir", "an absolute path on the AMI")
        if self.max_price is not None:
            try:
                price = float(self.max_price)
            except (TypeError, ValueError):
                price = math.nan
            if isinstance(self.max_price, bool) or not (math.isfinite(price) and price > 0):
                raise bad("max_price", "a price in USD per hour > 0 (e.g. '1.50'), or None for the on-demand price")
            object.__setattr__(self, "max_price", str(self.max_price))
        notice = self.notice_s
        number = isinstance(notice, (int, float)) and not isinstance(notice, bool)
        if not (number and math.isfinite(notice) and notice >= 0):
            raise bad("notice_s", "seconds >= 0")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AwsSpotConfig:
        """From a parsed config file section; unknown keys are an error naming them (a typo must not be ignored)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AwsConfigError(f"AwsSpotConfig: unknown field(s) {', '.join(unknown)}; "
                                 f"known: {', '.join(sorted(known))}")
        missing = [name for name in _REQUIRED if name not in data]
        if missing:
            raise AwsConfigError(f"AwsSpotConfig: missing field(s) {', '.join(missing)}")
        return cls(**dict(data))


def user_data(config: AwsSpotConfig, worker: int) -> str:
    """The boot script of worker `worker`'s instance (cloud-init runs it as root at first boot).

    It holds no secret: it reads the token from SSM, then `exec`s the instance agent (`trainer.agent`), which runs
    the worker process (restarting it when the driver asks for a checkpoint-restart), reports how it ended through
    the job's store, and watches IMDSv2 for a spot interruption notice (`--imds`), which it passes on to the worker
    as SIGTERM. `set -e`: a token that cannot be read stops the boot, with the `token` command's message in
    /var/log/cloud-init-output.log.
    """
    q = shlex.quote
    py = q(config.python)
    return (
        "#!/bin/bash\n"
        f"# parcae worker {int(worker)}: written by trainer.aws.user_data; no secret here (the token is in SSM)\n"
        "set -euo pipefail\n"
        f"cd {q(config.workdir)}\n"
        f'PARCAE_TOKEN="$({py} -m trainer.aws token --parameter {q(config.token_parameter)} '
        f'--region {q(config.region)})"\n'
        "export PARCAE_TOKEN\n"
        "# the agent runs the worker, reports its exit through the job's store, passes a spot notice (IMDSv2) on\n"
        f"exec {py} -m trainer.agent --id {int(worker)} --host {q(config.coordinator_host)} "
        f"--port {int(config.coordinator_port)} --imds\n"
    )


def publish_token(config: AwsSpotConfig, token: str, *, session: boto3.Session | None = None) -> None:
    """Store the job token in the SSM SecureString parameter `config.token_parameter` (overwriting the previous
    job's), where the instances' boot script reads it. Needs ssm:PutParameter (and the key's kms:Encrypt)."""
    if not token:
        raise ValueError("the job token must not be empty")
    session = session if session is not None else boto3.Session(region_name=config.region)
    ssm = session.client("ssm", region_name=config.region, config=_client_config())
    _call(f"ssm:PutParameter {config.token_parameter}", ssm.put_parameter, Name=config.token_parameter,
          Value=token, Type="SecureString", Overwrite=True)  # fmt: skip


def aws_job(config: AwsSpotConfig, *, session: boto3.Session | None = None) -> RemoteJob:
    """What `trainer.run.run_job` needs to drive a job on spot instances of `config` (a `trainer.agent.RemoteJob`):
    the coordinator listens on `coordinator_port` (all interfaces) and is reached at `coordinator_host`, with a
    fresh token published to SSM; instances are `AwsSpotProvider`'s, their workers run by `trainer.agent`. Instances
    of the same job still running (left by a driver that was killed) are terminated when the job starts.
    Fails fast (`AwsCredentialsError`, `AwsProviderError`) before anything is launched."""
    check_credentials(session, config.region)
    token = secrets.token_urlsafe(32)
    publish_token(config, token, session=session)

    def instances(store: Any) -> AgentInstances:
        cloud = AwsSpotProvider(config, session=session)
        cloud.stop()  # what a killed earlier run of this job left running (by its tag): no longer this job's
        return AgentInstances(cloud, store)

    return RemoteJob(host=config.coordinator_host, port=config.coordinator_port, token=token, instances=instances)


# ----------------------------------------------------------------------------------------------- credentials


def check_credentials(session: boto3.Session | None = None, region: str | None = None) -> dict[str, str]:
    """Fail fast, before anything is launched: AwsCredentialsError (saying which setting to fix) unless there are
    a region and credentials AWS accepts (sts:GetCallerIdentity, which needs no permission). Returns the identity:
    {"account", "arn", "source"} (source: where botocore found the credentials, e.g. "env", "iam-role")."""
    session = session if session is not None else boto3.Session(region_name=region)
    region = region or session.region_name
    if not region:
        raise AwsCredentialsError("check_credentials", _NO_REGION)
    creds = session.get_credentials()
    if creds is None:
        raise AwsCredentialsError("check_credentials", _NO_CREDENTIALS)
    sts = session.client("sts", region_name=region, config=_client_config(max_attempts=2))
    ident = _call("sts:GetCallerIdentity", sts.get_caller_identity)
    return {"account": ident.get("Account", ""), "arn": ident.get("Arn", ""), "source": getattr(creds, "method", "")}


def _client_config(max_attempts: int = 5) -> Config:
    return Config(retries={"mode": "standard", "max_attempts": max_attempts}, connect_timeout=10, read_timeout=30)


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
        when = _parse_time(when)
    if m := _WARNING_RE.fullmatch(code):
        deadline = when + timedelta(seconds=notice_s) if when else None
        return InterruptionNotice(instance_id, "warning", "spot-request", code, _ACTION[m.group(1)], when, deadline)
    if m := _RECLAIMED_RE.fullmatch(code):
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
    if not isinstance(instance_id, str) or not instance_id:
        raise InterruptionEventError(f"{kind!r} event {event.get('id', '?')}: no detail.instance-id")
    when = _parse_time(event["time"]) if isinstance(event.get("time"), str) else None
    if kind == _REBALANCE:
        return InterruptionNotice(instance_id, "rebalance", "eventbridge", kind, None, when, None)
    action = detail.get("instance-action") or "terminate"
    deadline = when + timedelta(seconds=notice_s) if when else None
    return InterruptionNotice(instance_id, "warning", "eventbridge", kind, action, when, deadline)


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------------- provider


class AwsSpotProvider(NumberedInstances):
    """A job's instances are one-time EC2 spot instances of `config`; instance i runs worker i.

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
                                       config=_client_config())  # fmt: skip
        super().__init__()
        self._instances: dict[int, str] = {}
        self._timers: dict[int, tuple[float, threading.Timer]] = {}
        self._deferred: list[AwsProviderError] = []
        self._reported: set[tuple[str, str]] = set()
        self._events: list[InterruptionNotice] = []

    def __enter__(self) -> AwsSpotProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- InstanceProvider ------------------------------------------------------------------------------------
    # start(n), start_ids(ids, next_id): `NumberedInstances`, over `_launch` -- one `run_instances` per instance,
    # all or nothing: if one fails, those this call launched are terminated and AwsProviderError says why

    def _taken(self, ids: list[int]) -> str | None:
        taken = sorted(w for w in ids if w in self._instances)
        return f"worker ids {taken} already have an instance" if taken else None

    def _launch(self, ids: list[int]) -> None:
        """One `run_instances` per worker id; all or nothing. Called with the lock held."""
        launched: dict[int, str] = {}
        for w in ids:
            try:
                resp = _call(f"run_instances (worker {w})", self.ec2.run_instances, **self.launch_params(w))
            except AwsProviderError as exc:
                self._roll_back(launched, exc)
                raise
            launched[w] = resp["Instances"][0]["InstanceId"]
        self._instances.update(launched)

    def _roll_back(self, launched: dict[int, str], cause: AwsProviderError) -> None:
        if not launched:
            return
        try:
            _call("terminate_instances (rollback)", self.ec2.terminate_instances, InstanceIds=list(launched.values()))
        except AwsProviderError as exc:  # keep them: stop() retries, and their ids must not be handed out again
            self._instances.update(launched)
            self._next_id = max(launched) + 1
            cause.args = (f"{cause.args[0]}; and rolling back the {len(launched)} instance(s) this start launched "
                          f"failed ({exc}): workers {sorted(launched)} stay until stop()",)  # fmt: skip

    def launch_params(self, worker: int) -> dict[str, Any]:
        """The `run_instances` parameters of worker `worker`'s instance."""
        c = self.config
        spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if c.max_price is not None:
            spot["MaxPrice"] = c.max_price
        tags = [{"Key": JOB_TAG_KEY, "Value": c.job}, {"Key": WORKER_TAG_KEY, "Value": str(worker)}]
        profile = c.iam_instance_profile
        params: dict[str, Any] = {
            "ImageId": c.image_id,
            "InstanceType": c.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": user_data(c, worker),  # boto3 base64-encodes it
            "IamInstanceProfile": {"Arn": profile} if profile.startswith("arn:") else {"Name": profile},
            "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": spot},
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},  # IMDSv2 only
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [*tags, {"Key": "Name", "Value": f"parcae-{c.job}-{worker}"}]},
                {"ResourceType": "spot-instances-request", "Tags": tags},
            ],
        }
        if c.subnet_id is not None:
            params["SubnetId"] = c.subnet_id
        if c.security_group_ids:
            params["SecurityGroupIds"] = list(c.security_group_ids)
        if c.key_name is not None:
            params["KeyName"] = c.key_name
        return params

    def alive(self) -> set[int]:
        """Workers whose instance is pending or running (one describe_instances by the job tag)."""
        with self._lock:
            if self._deferred:
                errors, self._deferred = self._deferred, []
                raise AwsProviderError("preempt (timer)", "; ".join(str(e) for e in errors))
            running = self._job_instances(_ALIVE)
            return {w for w, iid in self._instances.items() if iid in running}

    def kill(self, ids: Iterable[int]) -> None:
        """Terminate the instances of `ids` now (a reclaim without notice)."""
        with self._lock:
            ids = self._known(ids)
            for w in ids:
                self._cancel_timer(w)
            if ids:
                _call("terminate_instances", self.ec2.terminate_instances,
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
                _call("terminate_instances (preempt)", self.ec2.terminate_instances, InstanceIds=[self._instances[w]])
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
        for start in range(0, len(instance_ids), _FILTER_VALUES_MAX):
            chunk = list(instance_ids[start : start + _FILTER_VALUES_MAX])
            try:
                for page in pages.paginate(Filters=[{"Name": "instance-id", "Values": chunk}]):
                    for req in page.get("SpotInstanceRequests", []):
                        notice = spot_request_notice(req, self.config.notice_s)
                        w = self.worker_of(notice.instance_id) if notice is not None else None
                        if w is not None:
                            out.append(_with_worker(notice, w))
            except (ClientError, BotoCoreError) as exc:
                raise _aws_error("describe_spot_instance_requests", exc) from exc
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
                _call("terminate_instances (stop)", self.ec2.terminate_instances, InstanceIds=chunk)
            if self._deferred:
                errors, self._deferred = self._deferred, []
                raise AwsProviderError("preempt (timer)", "; ".join(str(e) for e in errors))

    def _job_instances(self, states: Sequence[str]) -> set[str]:
        filters = [{"Name": f"tag:{JOB_TAG_KEY}", "Values": [self.config.job]},
                   {"Name": "instance-state-name", "Values": list(states)}]  # fmt: skip
        try:
            pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
            return {i["InstanceId"] for page in pages for r in page.get("Reservations", []) for i in r["Instances"]}
        except (ClientError, BotoCoreError) as exc:
            raise _aws_error("describe_instances", exc) from exc


def _with_worker(notice: InterruptionNotice, worker: int) -> InterruptionNotice:
    return replace(notice, worker=worker)


# ------------------------------------------------------------------------------------- on the instance: IMDSv2


@dataclass(frozen=True)
class InstanceAction:
    """IMDS `spot/instance-action`: the instance will be stopped/terminated/hibernated at `time`."""

    action: str
    time: datetime | None
    raw: str = field(repr=False, default="")


class InstanceActionWatcher:
    """Polls IMDSv2 for a spot interruption notice in a daemon thread; calls `on_notice(InstanceAction)` once,
    then stops.

    IMDSv2: a session token from `PUT /latest/api/token` (header X-aws-ec2-metadata-token-ttl-seconds), sent as
    X-aws-ec2-metadata-token with `GET /latest/meta-data/spot/instance-action`: 404 = no notice, 200 = the notice
    (JSON {"action", "time"}; any 200 counts — the item exists only once a notice was issued), 401 = the token
    expired (fetch another). AWS advises polling every 5 s. Proxies are bypassed (IMDS is link-local). Errors
    (IMDS unreachable, a timeout) do not stop the watcher: they are counted in `errors`, kept in `last_error`, and
    passed to `on_error` if given.
    """

    TOKEN_PATH: Final = "/latest/api/token"
    ACTION_PATH: Final = "/latest/meta-data/spot/instance-action"

    def __init__(
        self,
        on_notice: Callable[[InstanceAction], None],
        *,
        endpoint: str = IMDS_ENDPOINT,
        poll_s: float = 5.0,
        timeout_s: float = 2.0,
        token_ttl_s: int = 21600,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        if not poll_s > 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s!r}")
        self.on_notice, self.on_error = on_notice, on_error
        self.endpoint = endpoint.rstrip("/")
        self.poll_s, self.timeout_s, self.token_ttl_s = poll_s, timeout_s, int(token_ttl_s)
        self.notice: InstanceAction | None = None
        self.errors = 0
        self.last_error: Exception | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._token: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> InstanceActionWatcher:
        if self._thread is not None:
            raise RuntimeError("the watcher is already started")
        self._thread = threading.Thread(target=self._run, name="parcae-instance-action", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.check()
            except (OSError, ValueError) as exc:  # URLError/HTTPError/timeouts are OSErrors
                self.errors += 1
                self.last_error = exc
                if self.on_error is not None:
                    self.on_error(exc)
            else:
                if notice is not None:
                    self.notice = notice
                    self.on_notice(notice)
                    return
            self._stop.wait(self.poll_s)

    def check(self) -> InstanceAction | None:
        """One poll: the notice, or None. Raises OSError if IMDS cannot be asked."""
        for attempt in (1, 2):
            if self._token is None:
                self._token = self._fetch_token()
            req = urllib.request.Request(self.endpoint + self.ACTION_PATH, method="GET",
                                         headers={"X-aws-ec2-metadata-token": self._token})  # fmt: skip
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    return _instance_action(resp.read().decode("utf-8", "replace"))
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:  # the token expired: one more try with a fresh one
                    self._token = None
                    continue
                raise
        return None  # unreachable

    def _fetch_token(self) -> str:
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)}
        req = urllib.request.Request(self.endpoint + self.TOKEN_PATH, method="PUT", data=b"", headers=ttl)
        with self._opener.open(req, timeout=self.timeout_s) as resp:
            token = resp.read().decode("ascii", "replace").strip()
        if not token:
            raise ValueError(f"IMDS at {self.endpoint} returned an empty session token")
        return token


def _instance_action(body: str) -> InstanceAction:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return InstanceAction("unknown", None, body)
    when = _parse_time(data["time"]) if isinstance(data.get("time"), str) else None
    return InstanceAction(str(data.get("action") or "unknown"), when, body)


# ----------------------------------------------------------------------------------------- the on-instance CLI


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def imds_endpoint() -> str:
    """The instance metadata service: `AWS_EC2_METADATA_SERVICE_ENDPOINT` (botocore's own setting) if set, else
    AWS's link-local address."""
    return os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or IMDS_ENDPOINT


def imds_watcher(
    on_notice: Callable[[], None], *, poll_s: float = 5.0, endpoint: str | None = None, who: str = "parcae watch"
) -> InstanceActionWatcher:
    """An `InstanceActionWatcher` (not started) that calls `on_notice()` on a spot interruption notice and prints
    each distinct error once to stderr (a dead IMDS must not flood the log), prefixed with `who`."""
    url = endpoint or imds_endpoint()
    seen: set[str] = set()

    def report(exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if text not in seen:
            seen.add(text)
            print(f"{who}: cannot ask IMDS at {url} (still trying): {text}", file=sys.stderr, flush=True)

    def notice(action: InstanceAction) -> None:
        print(f"{who}: spot interruption notice ({action.action} at {action.time})", file=sys.stderr, flush=True)
        on_notice()

    return InstanceActionWatcher(notice, endpoint=url, poll_s=poll_s, on_error=report)


def _watch(a: argparse.Namespace) -> int:
    sig = signal.Signals["SIG" + a.signal.upper().removeprefix("SIG")]
    if not _pid_alive(a.pid):
        print(f"parcae watch: no process {a.pid} to watch", file=sys.stderr)
        return 1
    fired = threading.Event()
    watcher = imds_watcher(fired.set, poll_s=a.poll_s, endpoint=a.endpoint)
    watcher.start()
    while not fired.wait(min(a.poll_s, 1.0)):
        if not _pid_alive(a.pid):  # the worker ended first: nothing to do
            watcher.stop()
            return 0
    print(f"parcae watch: sending {sig.name} to {a.pid}", file=sys.stderr, flush=True)
    try:
        os.kill(a.pid, sig)
    except ProcessLookupError:
        pass
    return 0


def _token(a: argparse.Namespace) -> int:
    try:
        ssm = boto3.Session(region_name=a.region).client("ssm", config=_client_config(max_attempts=3))
        value = _call(f"ssm:GetParameter {a.parameter}", ssm.get_parameter, Name=a.parameter, WithDecryption=True)
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
    p = argparse.ArgumentParser(prog="python -m trainer.aws", description="The instance side of a parcae spot job.")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("watch", help="signal a process when IMDS posts a spot interruption notice")
    w.add_argument("--pid", type=int, required=True, help="the process to signal (the worker)")
    w.add_argument("--signal", default="TERM", choices=["TERM", "INT", "USR1", "USR2"], help="default: TERM")
    w.add_argument("--endpoint", default=None,
                   help=f"the instance metadata service (default: $AWS_EC2_METADATA_SERVICE_ENDPOINT, else {IMDS_ENDPOINT})")
    w.add_argument("--poll-s", type=float, default=5.0, help="seconds between polls (AWS advises 5)")
    t = sub.add_parser("token", help="print the job token held in an SSM SecureString parameter")
    t.add_argument("--parameter", required=True)
    t.add_argument("--region", required=True)
    a = p.parse_args(argv)
    if a.command == "watch" and not a.poll_s > 0:
        p.error(f"--poll-s must be > 0, got {a.poll_s}")
    return _watch(a) if a.command == "watch" else _token(a)


if __name__ == "__main__":
    sys.exit(main())
