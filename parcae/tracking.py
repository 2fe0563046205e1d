"""Where MLflow records go: one place that decides the tracking URI, so every component agrees.

The default is a local store under ``mlruns/`` in the working directory: MLflow 3's SQLite backend
(``mlruns/mlflow.db``) for runs, metrics and the model registry, with artifacts beside it
(``mlruns/artifacts/<experiment>``). The plain file store is deprecated in MLflow 3, and a default URI
would change with the process's working directory, which Prefect workers do not share; so the URI is
always absolute. ``MLFLOW_TRACKING_URI`` (for example an ``mlflow server``) overrides it. Telemetry is
switched off before MLflow is imported.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

DEFAULT_ROOT = "mlruns"


class TrackingError(RuntimeError):
    """The tracking store cannot be used; the message names the setting and the fix."""


def tracking_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The local store's folder (absolute), created if needed."""
    path = Path(root or os.environ.get("PARCAE_MLRUNS", DEFAULT_ROOT)).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def tracking_uri(root: str | os.PathLike[str] | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<abs>/mlruns/mlflow.db``."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{tracking_root(root) / 'mlflow.db'}"


def configure(root: str | os.PathLike[str] | None = None) -> str:
    """Point MLflow (tracking and registry) at the store and return the URI."""
    import mlflow

    uri = tracking_uri(root)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def experiment_id(name: str, root: str | os.PathLike[str] | None = None) -> str:
    """Get or create an experiment; local stores keep its artifacts under ``mlruns/artifacts/<name>``."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = configure(root)
    client = mlflow.MlflowClient(uri)
    try:
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        location = None
        if uri.startswith("sqlite:///"):
            location = (tracking_root(root) / "artifacts" / name).as_uri()
        return client.create_experiment(name, artifact_location=location)
    except MlflowException as exc:
        raise TrackingError(
            f"cannot use the MLflow tracking store {uri!r} ({exc.message if hasattr(exc, 'message') else exc}); "
            "check MLFLOW_TRACKING_URI (unset it to use the local mlruns/ store)"
        ) from exc
    except Exception as exc:  # connection errors surface as requests/urllib3 exceptions
        raise TrackingError(
            f"cannot reach the MLflow tracking store {uri!r}: {exc}; check MLFLOW_TRACKING_URI and that the "
            "server is running (or unset it to use the local mlruns/ store)"
        ) from exc
