"""Environment helpers that keep boto3 off real AWS: no credentials, config or proxies; moto's fake account.

Imported as a top-level module (``from _aws import ...``): ``tests/`` is on ``sys.path`` under pytest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: Every variable through which botocore could find credentials, a region, an endpoint or a proxy.
AWS_VARS = (
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_EC2", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy",
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
