"""A temporary MLflow store for a test module, named only through ``MLFLOW_TRACKING_URI``.

Imported as a top-level module (``from _mlflow import ...``): ``tests/`` is on ``sys.path`` under pytest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def temporary_mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Body of a module-scoped fixture: ``yield from`` it to get the store's folder (a sqlite file in it)."""
    root = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root}/mlflow.db")
        yield root
