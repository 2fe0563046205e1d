"""What a job's EC2 spot instances look like: `AwsSpotConfig`, checked field by field, and their boot script.

Owns: the tags that mark a job's instances (`JOB_TAG_KEY`, `WORKER_TAG_KEY`), AWS's notice (`NOTICE_S`),
`AwsSpotConfig` (`AwsConfigError` names the field that is wrong) and `user_data`, the boot script that reads the job
token from SSM and `exec`s the instance agent. Pure: no boto3 call. Must not touch: launching (`trainer.providers.aws`),
what runs on the instance (`trainer.providers.agent`, `trainer.providers.imds`).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from forecasting import JOB_TAG_KEY  # the fleet collector filters by the same tag

__all__ = ["ALLOCATION_STRATEGIES", "JOB_TAG_KEY", "LAUNCH_MODES", "NOTICE_S", "WORKER_TAG_KEY", "AwsConfigError",
           "AwsSpotConfig", "user_data"]  # fmt: skip

#: The tag holding an instance's worker id (stable: 0, 1, ... in launch order).
WORKER_TAG_KEY: Final = "parcae:worker-id"
#: AWS's spot interruption notice: two minutes before the instance is reclaimed.
NOTICE_S: Final = 120.0


class AwsConfigError(ValueError):
    """A field of `AwsSpotConfig` is wrong; the message names it."""


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
#: How instances are asked for (`AwsSpotConfig.launch`).
LAUNCH_MODES: Final = ("run-instances", "ec2-fleet")
#: EC2 Fleet's spot allocation strategies (`AwsSpotConfig.allocation_strategy`).
ALLOCATION_STRATEGIES: Final = ("price-capacity-optimized", "capacity-optimized", "capacity-optimized-prioritized",
                                "lowest-price", "diversified")  # fmt: skip
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

    `instance_types` and `subnet_ids` add capacity pools, in order of preference after `instance_type` and
    `subnet_id`: an instance the first pool has no capacity for is asked of the next (the same type in each
    subnet, i.e. zone, first; then the next type), and a request is refused only once every pool has refused it
    (`capacity_pools`). The planner's runtime profile is of one machine: list only types with the same GPUs.

    `launch`: how an instance is asked for. "run-instances" (the default): one `RunInstances` call per pool, in
    the order above. "ec2-fleet": one EC2 Fleet request (`CreateFleet`, type instant) offering every pool at once,
    AWS choosing among them by `allocation_strategy` (default "price-capacity-optimized": the pools least likely
    to be reclaimed soon, at the lowest price among those; "capacity-optimized-prioritized" keeps the order above as
    a tie-break). It needs ec2:CreateFleet and the launch-template actions (docs/live-fleet.md).
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
    instance_types: tuple[str, ...] = ()
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    python: str = "python3"
    workdir: str = "/opt/parcae"
    max_price: str | None = None
    notice_s: float = NOTICE_S
    launch: str = "run-instances"
    allocation_strategy: str = "price-capacity-optimized"

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
        for name, pattern, expected in (
            ("instance_types", _INSTANCE_TYPE_RE, "a list of EC2 instance types such as ['p3.2xlarge']"),
            ("subnet_ids", _SUBNET_RE, "a list of subnet ids such as ['subnet-0123456789abcdef0']"),
        ):
            more = getattr(self, name)
            if isinstance(more, str) or not all(isinstance(v, str) and pattern.fullmatch(v) for v in more):
                raise bad(name, expected)
            object.__setattr__(self, name, tuple(more))
        pools = self.capacity_pools
        if len(set(pools)) != len(pools):
            raise AwsConfigError("AwsSpotConfig: instance_types and subnet_ids repeat a pool of instance_type and "
                                 f"subnet_id; give each type and subnet once (pools: {pools})")  # fmt: skip
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
        if self.launch not in LAUNCH_MODES:
            raise bad("launch", " or ".join(repr(m) for m in LAUNCH_MODES))
        if self.allocation_strategy not in ALLOCATION_STRATEGIES:
            raise bad("allocation_strategy", "one of " + ", ".join(repr(m) for m in ALLOCATION_STRATEGIES))

    @property
    def capacity_pools(self) -> tuple[tuple[str, str | None], ...]:
        """The (instance type, subnet) pools an instance is asked of, in order of preference: every subnet of the
        first type, then of the next (a subnet of None: the default VPC's, which AWS picks the zone of)."""
        subnets: tuple[str | None, ...] = (
            (self.subnet_id, *self.subnet_ids) if self.subnet_id is not None else self.subnet_ids or (None,)
        )
        return tuple((t, s) for t in (self.instance_type, *self.instance_types) for s in subnets)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AwsSpotConfig:
        """From a parsed config file section; unknown keys are an error naming them (a typo must not be ignored)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AwsConfigError(
                f"AwsSpotConfig: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        missing = [name for name in _REQUIRED if name not in data]
        if missing:
            raise AwsConfigError(f"AwsSpotConfig: missing field(s) {', '.join(missing)}")
        return cls(**dict(data))


def user_data(config: AwsSpotConfig, worker: int) -> str:
    """The boot script of worker `worker`'s instance (cloud-init runs it as root at first boot).

    It holds no secret: it reads the token from SSM, then `exec`s the instance agent (`trainer.providers.agent`), which
    runs the worker process (restarting it when the driver asks for a checkpoint-restart), reports how it ended through
    the job's store, and watches IMDSv2 for a spot interruption notice (`--imds`), which it passes on to the worker
    as SIGTERM. `set -e`: a token that cannot be read stops the boot, with the `token` command's message in
    /var/log/cloud-init-output.log.
    """
    q = shlex.quote
    py = q(config.python)
    return (
        "#!/bin/bash\n"
        f"# parcae worker {int(worker)}: written by trainer.providers.aws.user_data; "
        "no secret here (the token is in SSM)\n"
        "set -euo pipefail\n"
        f"cd {q(config.workdir)}\n"
        f'PARCAE_TOKEN="$({py} -m trainer.providers.aws token --parameter {q(config.token_parameter)} '
        f'--region {q(config.region)})"\n'
        "export PARCAE_TOKEN\n"
        "# the agent runs the worker, reports its exit through the job's store, passes a spot notice (IMDSv2) on\n"
        f"exec {py} -m trainer.providers.agent --id {int(worker)} --host {q(config.coordinator_host)} "
        f"--port {int(config.coordinator_port)} --imds\n"
    )
