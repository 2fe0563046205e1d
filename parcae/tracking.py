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

Shared logging helpers (used by the Prefect plan task and by ``trainer.tracking``, the MLflow run of a
training job): :func:`resolve_uri` (a URI or a store folder), :func:`ensure_experiment` (get or create with
an explicit client), :func:`log_batched` (``log_batch`` within MLflow's per-call limits), :func:`log_run`
(one complete run in one go, FAILED if its logging fails), :func:`plan_metrics` (the metrics of a liveput
plan dict, ``liveput.optimizer.Plan.to_dict()``) and :func:`strategy_label` (``"DxP"``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

if TYPE_CHECKING:
    from mlflow import MlflowClient

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

DEFAULT_ROOT = "mlruns"
#: Experiment of the plan runs (one run per liveput plan).
PLANS_EXPERIMENT: Final = "plans"
#: Experiment of the training jobs' runs (``trainer.tracking``).
TRAINING_EXPERIMENT: Final = "training"
#: MLflow's limits on one ``log_batch`` call (``mlflow.utils.validation``) and on a param's / tag's value.
MAX_METRICS_PER_BATCH: Final = 1000
MAX_PARAMS_TAGS_PER_BATCH: Final = 100
MAX_PARAM_LENGTH: Final = 6000
MAX_TAG_LENGTH: Final = 8000
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


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """Get or create experiment ``name`` through ``client``; a SQLite store keeps its artifacts under
    ``<db folder>/artifacts/<name>``. Raises TrackingError for a deleted experiment (the message says how to
    restore it); store errors propagate as MLflow raised them (callers decide what is worth a retry)."""
    from mlflow.exceptions import MlflowException

    uri = client.tracking_uri
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location(name, uri))
        except MlflowException:
            exp = client.get_experiment_by_name(name)  # another process created it meanwhile
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        raise TrackingError(
            f"experiment {name!r} is deleted in {uri!r}; restore it (`mlflow experiments restore "
            f"--experiment-id {exp.experiment_id}`) or use another experiment name"
        )
    return exp.experiment_id


def experiment_id(name: str, root: str | os.PathLike[str] | None = None) -> str:
    """Get or create an experiment; SQLite stores keep its artifacts under ``<db folder>/artifacts/<name>``."""
    from mlflow.exceptions import MlflowException

    client = connect(root)
    uri = client.tracking_uri
    try:
        return ensure_experiment(client, name)
    except MlflowException as exc:
        raise TrackingError(f"cannot use the MLflow tracking store {uri!r} ({_short(exc)}); {_fix(uri)}") from exc
    except TrackingError:
        raise
    except Exception as exc:  # connection errors surface as requests/urllib3 exceptions
        raise TrackingError(f"cannot reach the MLflow tracking store {uri!r}: {_short(exc)}; {_fix(uri)}") from exc


def strategy_label(strategy: Iterable[int]) -> str:
    """``(D, P)`` as ``"DxP"``, the way runs, tags and reports name a strategy."""
    d, p = strategy
    return f"{d}x{p}"


def clip(value: Any, limit: int) -> str:
    """``str(value)``, cut to ``limit`` characters (MLflow refuses longer params and tags)."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def log_batched(
    client: MlflowClient,
    run_id: str,
    *,
    metrics: Iterable[Any] = (),
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
) -> None:
    """``log_batch`` within MLflow's limits: ``metrics`` (``mlflow.entities.Metric``) 1000 a call, params and
    tags 100 a call; values are stringified and clipped. Raises what the store raises, after the calls that
    succeeded (so a caller that retries re-sends only what raised — MLflow keeps a duplicate metric point)."""
    from mlflow.entities import Metric, Param, RunTag

    ps = [Param(k, clip(v, MAX_PARAM_LENGTH)) for k, v in (params or {}).items()]
    ts = [RunTag(k, clip(v, MAX_TAG_LENGTH)) for k, v in (tags or {}).items()]
    for i in range(0, len(ps), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=ps[i : i + MAX_PARAMS_TAGS_PER_BATCH])
    for i in range(0, len(ts), MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, tags=ts[i : i + MAX_PARAMS_TAGS_PER_BATCH])
    ms: list[Metric] = list(metrics)
    for i in range(0, len(ms), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=ms[i : i + MAX_METRICS_PER_BATCH])


def log_run(
    client: MlflowClient,
    experiment: str,
    *,
    run_name: str,
    tags: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float] | None = None,
    dicts: Mapping[str, Any] | None = None,
) -> str:
    """Log one complete run of experiment id ``experiment`` and return its id: params and metrics (step 0, now),
    then each ``dicts`` entry as a JSON artifact (``{"plan.json": {...}}``), then FINISHED. A run whose logging
    fails is marked FAILED and the error re-raised, so a half-logged run is never FINISHED."""
    from mlflow.entities import Metric

    run_id = client.create_run(
        experiment, run_name=run_name, tags={k: clip(v, MAX_TAG_LENGTH) for k, v in (tags or {}).items()}
    ).info.run_id
    try:
        now = int(time.time() * 1000)
        log_batched(
            client,
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in (metrics or {}).items()],
            params=params,
        )
        for name, content in (dicts or {}).items():
            client.log_dict(run_id, content, name)
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_id


def plan_metrics(plan: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a liveput plan dict (``Plan.to_dict()``, maybe with extra keys): expected_samples,
    decision_ms and, of the first planned interval, reach and expected_cost_ms; keys the dict lacks are left
    out, and with ``look_ahead`` and ``interval_s`` also expected_liveput (expected samples per second)."""
    out: dict[str, float] = {}
    for key in ("expected_samples", "decision_ms"):
        if plan.get(key) is not None:
            out[key] = float(plan[key])
    steps = plan.get("steps") or []
    if steps:
        for key in ("reach", "expected_cost_ms"):
            if steps[0].get(key) is not None:
                out[key] = float(steps[0][key])
    horizon = plan.get("look_ahead", len(steps) or None)
    if "expected_samples" in out and horizon and plan.get("interval_s"):
        out["expected_liveput"] = out["expected_samples"] / (float(horizon) * float(plan["interval_s"]))
    return out
