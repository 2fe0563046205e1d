"""Environment helpers that keep boto3 off real AWS: no credentials, config or proxies; moto's fake account.

Imported as a top-level module (``from _aws import ...``): ``tests/`` is on ``sys.path`` under pytest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

#: Every variable through which botocore could find credentials, a region, an endpoint or a proxy.
AWS_VARS = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_S3", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
    "ALL_PROXY", "all_proxy",
)  # fmt: skip


def isolate_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS credentials, region, endpoint or proxy; empty config files; no instance metadata."""
    for var in AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def fake_aws_account(monkeypatch: pytest.MonkeyPatch, region: str | None = None) -> None:
    """moto's fake key pair and, given ``region``, AWS_DEFAULT_REGION and AWS_REGION."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    if region is not None:
        monkeypatch.setenv("AWS_DEFAULT_REGION", region)
        monkeypatch.setenv("AWS_REGION", region)
    # moto loads thousands of default AMIs per backend (seconds); AMI ids are not validated without them
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")


def answer(events: Any, operation: str, responses: list[Any]) -> list[dict[str, Any]]:
    """Answer the next calls of EC2/STS `operation` (on a client's or a session's `events`) with `responses`, in
    order: a response dict, an (AWS error code, message) pair, or None (let moto answer that one). Once they run
    out, moto answers. Returns the request of every call made while responses remained."""
    sent: list[dict[str, Any]] = []

    def before_call(params: dict[str, Any], **_: Any) -> Any:
        if not responses:
            return None
        r = responses.pop(0)
        sent.append(params)
        if r is None:
            return None
        if isinstance(r, tuple):
            err = {"Error": {"Code": r[0], "Message": r[1]}, "ResponseMetadata": {"HTTPStatusCode": 400}}
            return AWSResponse("https://aws.local", 400, {}, None), err
        return AWSResponse("https://aws.local", 200, {}, None), {**r, "ResponseMetadata": {"HTTPStatusCode": 200}}

    service = "sts" if operation == "GetCallerIdentity" else "ec2"
    events.register(f"before-call.{service}.{operation}", before_call)
    return sent
