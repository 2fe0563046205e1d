"""Where MLflow records go: one place that decides the tracking URI, so every component agrees.

The default is a local store under ``mlruns/`` in the working directory: MLflow 3's SQLite backend
(``mlruns/mlflow.db``) for runs, metrics and the model registry, with artifacts beside it
(``mlruns/artifacts/<experiment>``). The plain file store is deprecated in MLflow 3, and a default URI
would change with the process's working directory, which Prefect workers do not share; so the URI is
always absolute. Telemetry is switched off before MLflow is imported.

Which store, in order:

1. an explicit ``root`` argument: the local store in that folder (tests pass ``tmp_path``; an explicit
   folder wins over the environment so a test can never write to a server set in the shell);
2. ``MLFLOW_TRACKING_URI`` (for example ``http://127.0.0.1:5000`` for an ``mlflow server``, or another
   ``sqlite:////abs/path/mlflow.db``);
3. ``$PARCAE_MLRUNS`` or ``./mlruns``, made absolute.

For a SQLite URI, artifacts of new experiments go to ``<folder of the .db>/artifacts/<experiment>``,
so a store given only by ``MLFLOW_TRACKING_URI`` keeps everything in one folder (never in the
working directory's ``mlruns/``).

Reachability: MLflow retries a failing HTTP request 7 times with exponential back-off (minutes before
an unreachable server is reported). :func:`check_reachable` makes one request with
``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT`` = ``timeout`` (5 s) and turns
any failure into :class:`TrackingError` naming the fix; :func:`connect` and :func:`experiment_id`
call it first. The two variables are set in ``os.environ`` only for the duration of that one call
(MLflow reads them per request), which is not thread-safe against concurrent MLflow calls of the same
process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:
    from mlflow import MlflowClient

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

DEFAULT_ROOT = "mlruns"
#: Seconds the reachability check waits for a tracking server (connect and read).
CHECK_TIMEOUT_S = 5.0

_reachable: set[str] = set()  # URIs that answered once in this process


class TrackingError(RuntimeError):
    """The tracking store cannot be used; the message names the setting and the fix."""


def tracking_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The local store's folder (absolute), created if needed."""
    path = Path(root or os.environ.get("PARCAE_MLRUNS", DEFAULT_ROOT)).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def tracking_uri(root: str | os.PathLike[str] | None = None) -> str:
    """``sqlite:///<abs root>/mlflow.db`` for an explicit ``root``, else ``MLFLOW_TRACKING_URI`` if set,
    else ``sqlite:///<abs>/mlruns/mlflow.db`` (``$PARCAE_MLRUNS`` replaces ``mlruns``)."""
    if root is None:
        env = os.environ.get("MLFLOW_TRACKING_URI")
        if env:
            return env
    return f"sqlite:///{tracking_root(root) / 'mlflow.db'}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (absolute), or None for any other scheme."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]).resolve()


def artifact_location(name: str, uri: str) -> str | None:
    """Where a new experiment's artifacts go: beside a SQLite database, else the server's default."""
    db = sqlite_path(uri)
    if db is None:
        return None
    return (db.parent / "artifacts" / name).as_uri()


def configure(root: str | os.PathLike[str] | None = None) -> str:
    """Point MLflow (tracking and registry) at the store and return the URI."""
    import mlflow

    uri = tracking_uri(root)
    db = sqlite_path(uri)
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackingError(f"cannot create the MLflow store folder {str(db.parent)!r} ({exc}); {_fix(uri)}") from exc
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


@contextmanager
def _fail_fast(timeout: float) -> Iterator[None]:
    """No retries and a short timeout for the MLflow HTTP requests made inside the block."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, int(round(timeout))))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _short(exc: BaseException, limit: int = 300) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fix(uri: str) -> str:
    if urlparse(uri).scheme in ("http", "https"):
        return (
            "start the server (e.g. `mlflow server --host 127.0.0.1 --port 5000 --workers 1 "
            "--backend-store-uri sqlite:///$PWD/mlruns/mlflow.db --default-artifact-root $PWD/mlruns/artifacts`), "
            "or point MLFLOW_TRACKING_URI at one that runs, or unset MLFLOW_TRACKING_URI to use the local "
            "mlruns/ store"
        )
    return (
        "check MLFLOW_TRACKING_URI (an absolute sqlite:////path/to/mlflow.db or an http:// server URL), "
        "or unset it to use the local mlruns/ store"
    )


def check_reachable(uri: str | None = None, *, timeout: float = CHECK_TIMEOUT_S) -> None:
    """Make one request to the store (no retries, ``timeout`` seconds); raise TrackingError if it fails.

    A SQLite store is created (and migrated, 1-6 s the first time) by this call. A URI that answered
    once is not checked again in this process.
    """
    uri = uri or tracking_uri()
    if uri in _reachable:
        return
    from mlflow import MlflowClient

    try:
        with _fail_fast(timeout):
            MlflowClient(uri, registry_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # MlflowException, requests/urllib3 connection errors, sqlite errors
        raise TrackingError(f"cannot use the MLflow tracking store {uri!r} ({_short(exc)}); {_fix(uri)}") from exc
    _reachable.add(uri)


def connect(root: str | os.PathLike[str] | None = None, *, timeout: float = CHECK_TIMEOUT_S) -> MlflowClient:
    """Configure MLflow for the store, check that it answers, and return a client for it."""
    from mlflow import MlflowClient

    uri = configure(root)
    check_reachable(uri, timeout=timeout)
    return MlflowClient(uri, registry_uri=uri)


def experiment_id(name: str, root: str | os.PathLike[str] | None = None) -> str:
    """Get or create an experiment; SQLite stores keep its artifacts under ``<db folder>/artifacts/<name>``."""
    from mlflow.exceptions import MlflowException

    client = connect(root)
    uri = client.tracking_uri
    try:
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                raise TrackingError(
                    f"experiment {name!r} is deleted in {uri!r}; restore it (`mlflow experiments restore "
                    f"--experiment-id {exp.experiment_id}`) or use another experiment name"
                )
            return exp.experiment_id
        return client.create_experiment(name, artifact_location=artifact_location(name, uri))
    except MlflowException as exc:
        raise TrackingError(f"cannot use the MLflow tracking store {uri!r} ({_short(exc)}); {_fix(uri)}") from exc
    except TrackingError:
        raise
    except Exception as exc:  # connection errors surface as requests/urllib3 exceptions
        raise TrackingError(f"cannot reach the MLflow tracking store {uri!r}: {_short(exc)}; {_fix(uri)}") from exc
