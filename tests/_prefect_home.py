"""Import first in a test module that runs Prefect flows: a throw-away PREFECT_HOME and telemetry off.

Prefect reads its settings when it is first imported, so this module must be imported before `prefect` (and before
any project module that imports it); it is removed at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

PREFECT_HOME = tempfile.mkdtemp(prefix="parcae-prefect-home-")
atexit.register(shutil.rmtree, PREFECT_HOME, ignore_errors=True)
os.environ.update(
    DO_NOT_TRACK="true",  # MLflow accepts only the literal "true"
    PREFECT_SERVER_ANALYTICS_ENABLED="false",
    MLFLOW_DISABLE_TELEMETRY="true",
    PREFECT_HOME=PREFECT_HOME,
)
