"""AWS errors a user can act on: which call failed, AWS's code and message, and what to do about it.

Owns: `AwsProviderError` / `AwsCredentialsError`, the fix for each error code a launch most often meets, and the one
way the trainer calls boto3 (`aws_call`: a botocore error becomes one of ours; `client_config`: retries, timeouts).
Must not touch: what is launched (`trainer.providers.aws`), the spot configuration (`trainer.providers.aws_config`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError, PartialCredentialsError

import forecasting

__all__ = ["EC2_GRANTS", "NO_CREDENTIALS", "NO_REGION", "S3_GRANTS", "AwsCredentialsError", "AwsProviderError",
           "aws_call", "aws_error", "client_config", "no_credentials"]  # fmt: skip

EC2_GRANTS: Final = (
    "ec2:RunInstances, ec2:CreateTags, ec2:Describe*, ec2:TerminateInstances and iam:PassRole (with "
    "AwsSpotConfig.launch='ec2-fleet' also ec2:CreateFleet, ec2:CreateLaunchTemplate and ec2:DeleteLaunchTemplate)"
)
S3_GRANTS: Final = "s3:PutObject, s3:GetObject, s3:DeleteObject and s3:ListBucket on the bucket"


def no_credentials(needs: str = "the AWS spot provider", grants: str = EC2_GRANTS) -> str:
    """What to do without AWS credentials, for what `needs` them (the instance role to give: `grants`)."""
    return forecasting.no_credentials(needs, grants)


NO_CREDENTIALS: Final = no_credentials()
NO_REGION: Final = forecasting.no_region("AwsSpotConfig.region")
_REJECTED_CREDENTIALS: Final = frozenset({
    "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException", "AuthFailure",
    "UnrecognizedClientException", "InvalidAccessKeyId", "RequestExpired",
})  # fmt: skip

# What to do about the errors a launch most often meets (the AWS code, then our fix).
_HINTS: Final = {
    "InsufficientInstanceCapacity": "no spot capacity for this instance type in this Availability Zone now: retry "
    "later, or add capacity pools: AwsSpotConfig.subnet_ids (subnets in other zones) and instance_types (other "
    "types with the same GPUs)",
    "UnfulfillableCapacity": "no pool of the EC2 Fleet request had spot capacity now: retry later, or add capacity "
    "pools (AwsSpotConfig.subnet_ids, instance_types)",
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
    "NoSuchBucket": "the checkpoint URI's bucket does not exist (or not in this account): create it, or fix the URI",
    "AccessDenied": f"the credentials' policy lacks this action: a checkpoint URI on S3 needs {S3_GRANTS}",
    "InvalidParameterValue": "check AwsSpotConfig (an iam_instance_profile that does not exist is reported this way)",
}


class AwsProviderError(RuntimeError):
    """An AWS call failed: says which operation, AWS's code and message, and what to do about it."""

    def __init__(self, operation: str, message: str, code: str = "") -> None:
        self.operation, self.code, self.aws_message = operation, code, message
        hint = _HINTS.get(code)
        text = f"{operation}: {code + ': ' if code else ''}{message}"
        super().__init__(f"{text}. Fix: {hint}" if hint else text)


class AwsCredentialsError(AwsProviderError):
    """No usable AWS credentials or region: nothing can be launched."""


def aws_error(operation: str, exc: Exception, *, fix: str = NO_CREDENTIALS) -> AwsProviderError:
    """`exc` of `operation` as an error that says what to do; `fix`: what to do about missing or rejected
    credentials (`no_credentials` for what needs them)."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code, message = err.get("Code", "?"), err.get("Message", "")
        if code in _REJECTED_CREDENTIALS:
            return AwsCredentialsError(operation, f"AWS rejected the credentials ({message}). {fix}", code)
        return AwsProviderError(operation, message, code)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return AwsCredentialsError(operation, f"{exc}. {fix}")
    if isinstance(exc, NoRegionError):
        return AwsCredentialsError(operation, NO_REGION)
    return AwsProviderError(operation, f"{type(exc).__name__}: {exc}")  # unreachable endpoint, timeouts, ...


def aws_call(operation: str, fn: Callable[..., Any], **params: Any) -> Any:
    try:
        return fn(**params)
    except (ClientError, BotoCoreError) as exc:
        raise aws_error(operation, exc) from exc


def client_config(max_attempts: int = 5) -> Config:
    return Config(retries={"mode": "standard", "max_attempts": max_attempts}, connect_timeout=10, read_timeout=30)
