"""The buffered MLflow sender behind a training job's run: a daemon thread that logs what the driver's hooks queue,
so that a slow or unreachable store delays that thread, never the driver.

Owns: `MlflowSender` (the "parcae-mlflow" thread, the bounded metric buffer, the queue of operations, flush and
close, retries while the store is down, giving up at the close deadline, the driver's SIGTERM and exit while a run
is open), `RunContent` (what it asks of the run it sends: opening it, its artifacts, ending it) and `transient`
(which store errors a retry may fix). Must not touch: what a run holds — which metrics, tags, params and artifacts
an event becomes (`trainer.observe.tracking.MlflowJobObserver`, the `RunContent` it sends); where the store is
(`tracking`).

Threading: the owner's hooks run on the driver's thread and only append under `lock` (held for microseconds,
never during I/O). The thread connects at once (a new SQLite store is migrated while the job's workers start),
opens the run once the job started, and every `flush_every_s` runs the queued operations in order, logs the metric
points with `log_batch` (<= `MAX_METRICS_PER_BATCH` a call), then the content's artifacts. The buffer holds
`max_pending` points; beyond that per-step points are coalesced to the latest value per metric and the points that
replaced are counted (`dropped`, and a ``tracking_dropped_metrics`` point). A transient error leaves the batch
queued for the next flush (one warning per outage); a permanent one drops that item with an error in the log
(counted in `failed`). `close` waits up to `close_timeout_s` for the queue to drain, then gives up, saying how much
was not logged.
"""

from __future__ import annotations

import atexit
import logging
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, Protocol

import tracking as store  # first: it switches MLflow's telemetry off before MLflow is imported

from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402

__all__ = ["MlflowSender", "Point", "RunContent", "RunEnd", "transient"]

#: MLflow error codes that no retry can fix.
_PERMANENT: Final = frozenset(
    {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS",
     "INVALID_STATE", "PERMISSION_DENIED", "UNAUTHENTICATED"}
)  # fmt: skip

Point = tuple[str, float, int, int]  # key, value, timestamp (ms), step — an mlflow Metric once logged
#: How a run ends: its MLflow status, the job's result (on success), the error's text (on failure).
RunEnd = tuple[str, Any, str | None]


def transient(exc: BaseException) -> bool:
    """Whether a store error may go away (unreachable, busy, locked) rather than be a bad request."""
    if isinstance(exc, store.TrackingError):
        return True
    if isinstance(exc, MlflowException):
        return exc.error_code not in _PERMANENT
    if isinstance(exc, OSError):  # connection errors (requests' are OSErrors), a full disk
        return True
    return type(exc).__module__.split(".")[0] in ("sqlalchemy", "sqlite3", "requests", "urllib3")


class RunContent(Protocol):
    """What the sender asks of the run it sends, always on its own thread
    (`trainer.observe.tracking.MlflowJobObserver`)."""

    run_id: str | None

    def started(self) -> bool:
        """Whether the job started: before that there is no run to open, and nothing can be queued for it."""
        ...

    def open_run(self, client: MlflowClient) -> bool:
        """Create or reopen the run; idempotent (retried after a failure). False: not now, or `set_fatal` was
        called."""
        ...

    def send_artifacts(self, client: MlflowClient) -> bool:
        """Log what changed besides metric points (artifacts, tags); raises what the store raised."""
        ...

    def finish(self, client: MlflowClient, final: RunEnd) -> bool:
        """End the run; True when done (or not worth a retry)."""
        ...

    def latest_step(self) -> int:
        """The step a point about the sending itself is logged at."""
        ...


class MlflowSender:
    """Sends `content`'s run to the store at `uri` from the "parcae-mlflow" daemon thread; see the module docstring.

    `log`: the owner's logger (its messages are the owner's, e.g. ``trainer.observe.tracking``). `start()` starts the
    thread once the owner can answer `content`'s calls."""

    def __init__(
        self, uri: str, content: RunContent, *, flush_every_s: float, max_pending: int, close_timeout_s: float,
        handle_sigterm: bool, log: logging.Logger,
    ) -> None:  # fmt: skip
        self.uri, self.content, self.log = uri, content, log
        self.flush_every_s, self.max_pending = flush_every_s, max_pending
        self.close_timeout_s, self.handle_sigterm = close_timeout_s, handle_sigterm
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        # shared with the driver's thread (under the lock)
        self._metrics: list[Point] = []
        self._overflow: dict[str, Point] = {}  # the latest point per key once the buffer is full
        self.dropped = 0  # points replaced in `_overflow`
        self._ops: deque[tuple[str, Callable[[], None]]] = deque()
        self._closing = False
        self._final: RunEnd | None = None
        self._deadline = math.inf
        self._flush_req = self._flush_done = 0
        self.fatal: str | None = None
        # the logging thread's own state
        self.client: MlflowClient | None = None
        self._dropped_logged = 0
        self.failed = 0  # items a permanent error made us skip
        self._outage = False
        self._ended = False
        self._sigterm_installed = False
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="parcae-mlflow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the driver's thread: queue and return (call with `lock` held) ---------------------------------------
    def add(self, points: list[Point]) -> None:
        """Append per-step points within `max_pending`; beyond it keep the latest point per key."""
        room = self.max_pending - len(self._metrics)
        if room >= len(points):
            self._metrics.extend(points)
            return
        if room > 0:
            self._metrics.extend(points[:room])
            points = points[room:]
        for p in points:
            if p[0] in self._overflow:
                self.dropped += 1
            self._overflow[p[0]] = p

    def extend(self, points: list[Point]) -> None:
        """Append points that are never coalesced (reconfigurations, plans)."""
        self._metrics.extend(points)

    def queue(self, name: str, op: Callable[[], None]) -> None:
        """Run `op` on the logging thread, in order; `name` says what failed if it does."""
        self._ops.append((name, op))

    # -- the driver's thread: the job's start and end -----------------------------------------------------------
    def started(self) -> None:
        """The job started: open the run now, not at the next tick; flush at exit and on SIGTERM from now on."""
        with self.cond:
            self.cond.notify_all()
        atexit.register(self._atexit)
        if self.handle_sigterm:
            self._install_sigterm()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far is logged (blocks: not for the driver's hooks). False if that did
        not happen within `timeout` seconds or the run cannot be logged at all."""
        with self.cond:
            self._flush_req += 1
            req = self._flush_req
            self.cond.notify_all()
            self.cond.wait_for(lambda: self._flush_done >= req or self.fatal is not None or self._stopped, timeout)
            return self._flush_done >= req and self.fatal is None

    @property
    def closed(self) -> bool:
        """Whether the run was ended (or the sender gave up on it)."""
        return not self._thread.is_alive()

    def close(self, status: str, result: Any, error: str | None) -> None:
        """End the run with `status` once the queue is drained, waiting at most `close_timeout_s` (+5 s)."""
        with self.cond:
            if self._closing:
                return
            self._closing = True
            self._final = (status, result, error)
            self._deadline = time.monotonic() + self.close_timeout_s
            self.cond.notify_all()
        atexit.unregister(self._atexit)
        self._restore_sigterm()
        self._thread.join(self.close_timeout_s + 5.0)
        if self._thread.is_alive():
            self._log_unsent(f"a store call did not return within {self.close_timeout_s:.0f} s",
                             "may not be logged, and the run may stay RUNNING")  # fmt: skip

    def _atexit(self) -> None:
        self.close("KILLED", None, "the driver process exited before the job ended")

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; atexit still flushes a normal exit
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # someone else handles SIGTERM (e.g. Prefect's engine): leave it, atexit flushes
        signal.signal(signal.SIGTERM, _raise_system_exit)
        self._sigterm_installed = True

    def _restore_sigterm(self) -> None:
        if not self._sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is _raise_system_exit:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._sigterm_installed = False

    # -- the logging thread (and the content's calls from it) ----------------------------------------------------
    def store_down(self, exc: BaseException) -> None:
        """The store failed transiently: warn once per outage; what is queued stays queued."""
        if not self._outage:
            self.log.warning("MLflow store %s is failing (%s); the run's logging is queued and retried every %.1f s",
                             self.uri, store.short_error(exc), self.flush_every_s)  # fmt: skip
        self._outage = True

    def set_fatal(self, message: str) -> None:
        """The run cannot be logged at all: drop what is queued, log nothing more."""
        with self.cond:
            self.fatal = message
            self.cond.notify_all()
        self.log.error("MLflow: %s; this job is not logged", message)

    def _loop(self) -> None:
        try:
            self._run_loop()
        finally:
            with self.cond:
                self._stopped = True
                self.cond.notify_all()  # wake any flush() waiting on a thread that is gone

    def _run_loop(self) -> None:
        try:
            self._connect()  # now: a new SQLite store is created and migrated while the job's workers start
        except Exception as exc:
            self.store_down(exc)
        drained = True
        while True:
            with self.cond:
                if not self._closing and self._flush_req == self._flush_done:
                    self.cond.wait(self.flush_every_s if drained else min(self.flush_every_s, 1.0))
                elif not drained:
                    self.cond.wait(min(self.flush_every_s, 0.2))  # closing and failing: retry, not spin
                closing, req = self._closing, self._flush_req
            drained = self._flush_once()
            if drained:
                with self.cond:
                    self._flush_done = max(self._flush_done, req)
                    self.cond.notify_all()
            if closing:
                if drained and self._finish():
                    return
                if time.monotonic() > self._deadline:
                    self._give_up()
                    return

    def _flush_once(self) -> bool:
        """Log everything queued; True when nothing is left (False: the store failed, retry later)."""
        if self.fatal is not None:
            self._discard()
            return True
        try:
            if not self._connect():
                return False
            if not self.content.started() and not self._closing:
                return True  # no run before the job starts; nothing can be queued for it yet either
            assert self.client is not None
            if not self.content.open_run(self.client):
                return self.fatal is not None
            done = self._run_ops() and self._send_metrics() and self.content.send_artifacts(self.client)
            if done and self._outage:
                self.log.info("MLflow store %s answers again; run %s is up to date", self.uri, self.content.run_id)
                self._outage = False
            return done
        except Exception as exc:
            if transient(exc):
                self.store_down(exc)
            else:
                self.log.exception("MLflow run %s: logging failed", self.content.run_id)
            return False

    def _connect(self) -> bool:
        if self.client is not None:
            return True
        try:
            store.check_reachable(self.uri)
        except store.TrackingError as exc:
            self.store_down(exc)
            return False
        self.client = MlflowClient(self.uri)
        return True

    def _discard(self) -> None:
        with self.lock:
            self._metrics.clear()
            self._overflow.clear()
            self._ops.clear()

    def _run_ops(self) -> bool:
        while True:
            with self.lock:
                if not self._ops:
                    return True
                name, op = self._ops[0]
            try:
                op()
            except Exception as exc:
                if transient(exc):
                    self.store_down(exc)
                    return False
                self.failed += 1
                self.log.error("MLflow run %s: %s logging failed and is skipped: %s", self.content.run_id, name,
                               store.short_error(exc))  # fmt: skip
            with self.lock:
                self._ops.popleft()

    def _send_metrics(self) -> bool:
        client, run_id = self.client, self.content.run_id
        assert client is not None and run_id is not None
        with self.lock:
            batch, self._metrics = self._metrics, []
            batch.extend(self._overflow.values())
            self._overflow.clear()
            dropped = self.dropped
        if dropped > self._dropped_logged:
            self.log.warning("MLflow run %s: the metric buffer (max_pending=%d) overflowed while the store lagged; "
                             "%d per-step points were coalesced away so far", run_id, self.max_pending,
                             dropped)  # fmt: skip
            batch.append(("tracking_dropped_metrics", float(dropped), int(time.time() * 1000),
                          self.content.latest_step()))  # fmt: skip
        sent = 0
        try:
            for i in range(0, len(batch), store.MAX_METRICS_PER_BATCH):
                chunk = batch[i : i + store.MAX_METRICS_PER_BATCH]
                client.log_batch(run_id, metrics=[Metric(*p) for p in chunk])
                sent = i + len(chunk)
        except Exception as exc:
            rest = batch[sent:]
            if transient(exc):
                with self.lock:
                    self._metrics[:0] = rest  # back in front, in order; the bound is exceeded by one batch at most
                self.store_down(exc)
                return False
            self.failed += 1
            self.log.error("MLflow run %s: %d metric points refused by the store and skipped: %s", run_id,
                           len(rest), store.short_error(exc))  # fmt: skip
        self._dropped_logged = dropped
        return True

    def _finish(self) -> bool:
        if self.fatal is not None or self._ended:
            return True
        if self.client is None:
            return False
        done = self.content.finish(self.client, self._final or ("FINISHED", None, None))
        self._ended = self._ended or done
        return done

    def _unsent(self) -> tuple[int, int]:
        """Metric points and operations (plan runs, checkpoint uploads) still queued."""
        with self.lock:
            return len(self._metrics) + len(self._overflow), len(self._ops)

    def _log_unsent(self, why: str, fate: str) -> None:
        """Say what is still queued when the sender stops short (`why`) and what becomes of it (`fate`)."""
        pending, ops = self._unsent()
        self.log.error("MLflow run %s in %s: %s; %d metric points and %d operations (plan runs, checkpoint uploads) %s",
                       self.content.run_id, self.uri, why, pending, ops, fate)  # fmt: skip

    def _give_up(self) -> None:
        self._log_unsent(f"gave up after {self.close_timeout_s:.0f} s of store failures",
                         "were not logged and the run was not ended")  # fmt: skip


def _raise_system_exit(signum: int, frame: Any) -> None:
    """SIGTERM -> SystemExit in the main thread: the driver unwinds (its cleanup and on_error run), then atexit."""
    raise SystemExit(128 + signum)
