"""Prefect tasks: thin wrappers over the domain packages, one module per thing they produce.

``traces`` (collected spot data, training corpora, trace histories), ``forecaster`` (trained and champion
forecasters), ``plan`` (forecasts and plans), ``training`` (runtime profiles, the job's live planner, training
jobs), ``tracking`` (MLflow runs and Prefect artifacts). A task calls
one domain function and returns data (or an MLflow run id); the domain packages never import Prefect.

Every task sets ``persist_result=False`` (which also turns caching off): their outputs are in-memory objects
(tables, fitted forecasters) that are cheap to recompute and costly to pickle every minute, and a plan must
never be replayed from a cache. The flows persist their own small JSON results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["retry_on"]


def retry_on(*conditions: type[BaseException] | Callable[[BaseException], bool]) -> Callable[[Any, Any, Any], bool]:
    """A ``retry_condition_fn`` that retries only when the task's exception matches one of ``conditions``.

    Each condition is an exception class or a predicate on the exception. Transient failures (a throttled
    API, a locked SQLite store, a tracking server restarting) are worth a retry; a wrong argument or a
    missing credential is not, and retrying it only delays the error.
    """

    def transient(exc: BaseException) -> bool:
        return any(isinstance(exc, c) if isinstance(c, type) else c(exc) for c in conditions)

    def condition(task: Any, task_run: Any, state: Any) -> bool:
        try:
            state.result()  # re-raises the task's exception
        except BaseException as exc:  # noqa: BLE001 - classified, not swallowed: the task fails either way
            return transient(exc)
        return False

    names = ", ".join(getattr(c, "__name__", repr(c)) for c in conditions)
    condition.__name__ = condition.__qualname__ = f"retry_on({names})"
    return condition
