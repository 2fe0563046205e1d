"""EC2 names shared by the fleet collector (`forecasting.collect`) and the trainer's spot provider
(`trainer.providers.aws`): the tag that marks a job's instances, the states that count as alive, the API's cap on
filter values, the spot request status codes of an interruption, and what to do without credentials or a region.

Owns: these constants, one definition each. Pure: no boto3, no pandas (the face exports them cheaply). Must not
touch: anything that calls AWS.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["ALIVE_STATES", "FILTER_VALUES_MAX", "JOB_TAG_KEY", "SPOT_RECLAIMED_RE", "SPOT_WARNING_RE", "no_credentials",
           "no_region"]  # fmt: skip

#: The EC2 tag that marks the job's own instances (``tag:parcae:job`` in filters).
JOB_TAG_KEY: Final = "parcae:job"
#: Instance states in which an instance counts as alive (it is, or is about to be, running).
ALIVE_STATES: Final = ("pending", "running")
#: EC2 caps the values of one filter.
FILTER_VALUES_MAX: Final = 200

# Spot request status codes (AWS EC2 user guide, "Spot request status codes"). *-by-user, -by-schedule, -by-service
# (terminated from stopped) and request-canceled-and-instance-running are the owner's doing, not interruptions.
#: An interruption warning: the instance still runs, and the cloud reclaims it in about two minutes.
SPOT_WARNING_RE: Final = re.compile(r"marked-for-(termination|stop|hibernation)")
#: The cloud took the instance (a fault-injection experiment's reclaim, ``by-experiment``, included: the instance is
#: lost all the same).
SPOT_RECLAIMED_RE: Final = re.compile(
    r"instance-(terminated|stopped|hibernated)-"
    r"(by-price|no-capacity|capacity-oversubscribed|launch-group-constraint|by-experiment)"
)


def no_credentials(needs: str, grants: str, runs_on: str = "the driver", *, also: str = "") -> str:
    """What to do without AWS credentials, for what `needs` them: where credentials come from, or an instance whose
    role `grants` what is needed (`runs_on` runs there); `also`: one more way, for the caller's own API."""
    return (f"no AWS credentials found, and {needs} needs them. Fix: set AWS_PROFILE to a profile in "
            "~/.aws/config or ~/.aws/credentials (or run `aws configure` / `aws sso login`), or set AWS_ACCESS_KEY_ID "
            f"and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary keys), or run {runs_on} on an instance "
            f"whose instance role grants {grants}{f'; or {also}' if also else ''}")  # fmt: skip


def no_region(setting: str) -> str:
    """What to do without an AWS region: the environment, the profile, or the caller's own `setting`."""
    return (f"no AWS region configured. Fix: set {setting}, or AWS_REGION (or AWS_DEFAULT_REGION), or `region` in the "
            "profile in ~/.aws/config")  # fmt: skip
