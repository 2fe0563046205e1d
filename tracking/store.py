"""Where MLflow records go: the one place that decides the tracking URI, so every component agrees.

Owns: the store's URI (:func:`tracking_uri`, :func:`resolve_uri`), pointing MLflow at it (:func:`configure`), the
one-request reachability check (:func:`check_reachable`, :func:`connect`) and getting or creating an experiment
(:func:`ensure_experiment`, :func:`experiment_id`: its description and saved view, `VIEWS`). It logs nothing (that
is :mod:`tracking.runs`).

Which store, in order: an explicit ``root`` folder (tests pass ``tmp_path``; it wins over the environment, so a
test never writes to a server set in the shell); ``MLFLOW_TRACKING_URI``; ``$PARCAE_MLRUNS`` or ``./mlruns``.
A local store is MLflow 3's SQLite backend (``<folder>/mlflow.db``, artifacts in ``<folder>/artifacts/<experiment>``),
always absolute, because Prefect workers do not share a working directory.

Why a check of its own: MLflow retries a failing HTTP request 7 times with back-off (minutes before an unreachable
server is reported); :func:`check_reachable` makes one request with ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` and a
short timeout, set in ``os.environ`` only for that call (so not thread-safe against concurrent MLflow calls).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlparse

from tracking.views import RunsView, view_link, view_tag

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_ROOT = "mlruns"
#: Experiment of the plan runs (one run per liveput plan).
PLANS_EXPERIMENT: Final = "plans"
#: Experiment of the training jobs' runs (``trainer.observe.tracking``).
TRAINING_EXPERIMENT: Final = "training"
#: The experiment tag the MLflow UI reads to open an experiment as model training (runs, metrics, charts) rather
#: than as a GenAI application (traces, evaluations): without it, MLflow 3 shows a parcae experiment as "Traces 0".
EXPERIMENT_KIND_TAG: Final = "mlflow.experimentKind"
MODEL_TRAINING_KIND: Final = "custom_model_development"
#: The experiment tag the MLflow UI shows as the experiment's description.
NOTE_TAG: Final = "mlflow.note.content"
#: What the experiments this package names hold, as their MLflow descriptions.
DESCRIPTIONS: Final = {
    TRAINING_EXPERIMENT: "One run per training job: loss, throughput, alive instances, D and P per step; "
    "summaries at the end (final loss, migrations per kind, total and longest pause); each migration "
    "(kind, trigger, pause, bytes moved, steps lost) a row of migrations_table.json; checkpoints, timeline.png "
    "and, for a live fleet, its history (fleet.json, fleet.png).",
    PLANS_EXPERIMENT: "One run per liveput plan (an interval of a job): the forecast it planned with, the decision "
    "(D x P), its expected samples and the alternatives; tagged with the training run it was made for.",
}
#: The saved view of each experiment's runs table (`tracking.views`): the columns its runs are compared by, which
#: must be params, metrics and tags its runs log (`trainer.observe.tracking`, `tasks.tracking`).
VIEWS: Final = {
    TRAINING_EXPERIMENT: RunsView(
        params=("model", "start_strategy", "workers", "planner", "stage_cut"),
        metrics=(
            "final_loss",
            "best_val_loss",
            "mean_samples_per_s",
            "reconfigurations",
            "total_pause_s",
            "total_steps_lost",
        ),  # fmt: skip
    ),
    PLANS_EXPERIMENT: RunsView(
        params=("interval", "current_strategy"),
        metrics=("alive", "decision_D", "decision_P", "expected_samples"),
        tags=("decision", "parcae.decided_by"),
    ),
}
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
    return Path(uri[len("sqlite:///") :].split("?", 1)[0]).resolve()


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
            raise TrackingError(
                f"cannot create the MLflow store folder {str(db.parent)!r} ({exc}); {_fix(uri)}"
            ) from exc
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


def short_error(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line of at most ``limit`` characters (for log messages and tags)."""
    return _short(exc, limit)


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


def resolve_uri(target: str | os.PathLike[str] | None = None) -> str:
    """A tracking URI from a URI (``sqlite:///...``, ``http://...``: returned as is) or a store folder (its
    ``mlflow.db``); None: :func:`tracking_uri`'s default. Sets no global MLflow state."""
    if target is None:
        return tracking_uri()
    text = os.fspath(target)
    if "://" in text or text.startswith("sqlite:"):
        return text
    return tracking_uri(text)


def ensure_experiment(
    client: MlflowClient, name: str, description: str | None = None, view: RunsView | None = None
) -> str:
    """Get or create experiment ``name`` through ``client``; a SQLite store keeps its artifacts under
    ``<db folder>/artifacts/<name>``. The experiment is marked as model training for the MLflow UI
    (`EXPERIMENT_KIND_TAG`) and, unless it has them, given `description` (default: `DESCRIPTIONS`'s) and the saved
    view `view` of its runs table (default: `VIEWS`'s; `tracking.views`), which the description links to. Raises
    TrackingError for a deleted experiment (the message says how to restore it); store errors propagate as MLflow
    raised them (callers decide what is worth a retry)."""
    from mlflow.exceptions import MlflowException

    uri = client.tracking_uri
    exp = client.get_experiment_by_name(name)
    tags: dict[str, str] = {}
    if exp is None:
        try:
            exp_id = client.create_experiment(name, artifact_location=artifact_location(name, uri))
        except MlflowException:
            exp = client.get_experiment_by_name(name)  # another process created it meanwhile
            if exp is None:
                raise
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            raise TrackingError(
                f"experiment {name!r} is deleted in {uri!r}; restore it (`mlflow experiments restore "
                f"--experiment-id {exp.experiment_id}`) or use another experiment name"
            )
        exp_id, tags = exp.experiment_id, dict(exp.tags)
    if tags.get(EXPERIMENT_KIND_TAG) != MODEL_TRAINING_KIND:
        _tag_experiment(client, exp_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
    view = view or VIEWS.get(name)
    if view is not None and view_tag() not in tags:  # a view someone saved over ours in the UI stays
        _tag_experiment(client, exp_id, view_tag(), view.tag_value(int(time.time() * 1000)))
    note = description or DESCRIPTIONS.get(name)
    if note and NOTE_TAG not in tags:  # a description someone wrote in the UI stays
        if view is not None:
            note += f" The runs table with the columns to compare them by: view [parcae]({view_link(str(exp_id))})."
        _tag_experiment(client, exp_id, NOTE_TAG, note)
    return str(exp_id)


def _tag_experiment(client: MlflowClient, exp_id: str, key: str, value: str) -> None:
    """Set an experiment tag that another process may be setting at the same moment: SQLite stores refuse the
    second insert (a unique constraint), which is fine once the tag is there."""
    from mlflow.exceptions import MlflowException

    try:
        client.set_experiment_tag(exp_id, key, value)
    except MlflowException:
        if key not in client.get_experiment(exp_id).tags:
            raise


def experiment_id(
    name: str,
    root: str | os.PathLike[str] | None = None,
    description: str | None = None,
    view: RunsView | None = None,
) -> str:
    """Get or create an experiment (`ensure_experiment`, with `description` and `view`); SQLite stores keep its
    artifacts under ``<db folder>/artifacts/<name>``."""
    from mlflow.exceptions import MlflowException

    client = connect(root)
    uri = client.tracking_uri
    try:
        return ensure_experiment(client, name, description, view)
    except MlflowException as exc:
        raise TrackingError(f"cannot use the MLflow tracking store {uri!r} ({_short(exc)}); {_fix(uri)}") from exc
    except TrackingError:
        raise
    except Exception as exc:  # connection errors surface as requests/urllib3 exceptions
        raise TrackingError(f"cannot reach the MLflow tracking store {uri!r}: {_short(exc)}; {_fix(uri)}") from exc
