"""Fixtures shared across test modules (pytest finds them here; other helpers are the `_*.py` modules)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """One Prefect test server for the whole session (`prefect_test_harness`): the flow modules share it, as a
    server takes ~20 s to start. Its runs are told apart by flow-run ids, never by counting everything on it.
    Prefect is imported here, not at the top: `_prefect_home` must set the environment first."""
    import _prefect_home  # noqa: F401 - before prefect: a temporary PREFECT_HOME, telemetry off
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield PREFECT_API_URL.value()
