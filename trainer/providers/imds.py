"""On the instance: the IMDSv2 spot interruption watcher, which the instance agent runs
(`trainer.providers.agent --imds`).

Owns: `InstanceActionWatcher` (polls `spot/instance-action`), `imds_watcher` (one that reports errors once and calls
back on the notice), `watch_process` (`python -m trainer.providers.aws watch --pid PID`: signal a process on the notice)
and `parse_time` (AWS's timestamps). Standard library only: it runs beside the worker, before anything heavy is loaded.
Must not touch: the cloud API on the driver's side (`trainer.providers.aws`), the job's store (`trainer.providers.agent`
passes the notice on to the worker as SIGTERM).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

__all__ = ["IMDS_ENDPOINT", "InstanceAction", "InstanceActionWatcher", "imds_endpoint", "imds_watcher", "parse_time",
           "watch_process"]  # fmt: skip

IMDS_ENDPOINT: Final = "http://169.254.169.254"


@dataclass(frozen=True)
class InstanceAction:
    """IMDS `spot/instance-action`: the instance will be stopped/terminated/hibernated at `time`."""

    action: str
    time: datetime | None
    raw: str = field(repr=False, default="")


class InstanceActionWatcher:
    """Polls IMDSv2 for a spot interruption notice in a daemon thread; calls `on_notice(InstanceAction)` once,
    then stops.

    IMDSv2: a session token from `PUT /latest/api/token` (header X-aws-ec2-metadata-token-ttl-seconds), sent as
    X-aws-ec2-metadata-token with `GET /latest/meta-data/spot/instance-action`: 404 = no notice, 200 = the notice
    (JSON {"action", "time"}; any 200 counts — the item exists only once a notice was issued), 401 = the token
    expired (fetch another). AWS advises polling every 5 s. Proxies are bypassed (IMDS is link-local). Errors
    (IMDS unreachable, a timeout) do not stop the watcher: they are counted in `errors`, kept in `last_error`, and
    passed to `on_error` if given.
    """

    TOKEN_PATH: Final = "/latest/api/token"
    ACTION_PATH: Final = "/latest/meta-data/spot/instance-action"

    def __init__(
        self,
        on_notice: Callable[[InstanceAction], None],
        *,
        endpoint: str = IMDS_ENDPOINT,
        poll_s: float = 5.0,
        timeout_s: float = 2.0,
        token_ttl_s: int = 21600,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        if not poll_s > 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s!r}")
        self.on_notice, self.on_error = on_notice, on_error
        self.endpoint = endpoint.rstrip("/")
        self.poll_s, self.timeout_s, self.token_ttl_s = poll_s, timeout_s, int(token_ttl_s)
        self.notice: InstanceAction | None = None
        self.errors = 0
        self.last_error: Exception | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._token: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> InstanceActionWatcher:
        if self._thread is not None:
            raise RuntimeError("the watcher is already started")
        self._thread = threading.Thread(target=self._run, name="parcae-instance-action", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.check()
            except (OSError, ValueError) as exc:  # URLError/HTTPError/timeouts are OSErrors
                self.errors += 1
                self.last_error = exc
                if self.on_error is not None:
                    self.on_error(exc)
            else:
                if notice is not None:
                    self.notice = notice
                    self.on_notice(notice)
                    return
            self._stop.wait(self.poll_s)

    def check(self) -> InstanceAction | None:
        """One poll: the notice, or None. Raises OSError if IMDS cannot be asked."""
        for attempt in (1, 2):
            if self._token is None:
                self._token = self._fetch_token()
            req = urllib.request.Request(self.endpoint + self.ACTION_PATH, method="GET",
                                         headers={"X-aws-ec2-metadata-token": self._token})  # fmt: skip
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    return _instance_action(resp.read().decode("utf-8", "replace"))
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:  # the token expired: one more try with a fresh one
                    self._token = None
                    continue
                raise
        return None  # unreachable

    def _fetch_token(self) -> str:
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)}
        req = urllib.request.Request(self.endpoint + self.TOKEN_PATH, method="PUT", data=b"", headers=ttl)
        with self._opener.open(req, timeout=self.timeout_s) as resp:
            token: str = resp.read().decode("ascii", "replace").strip()
        if not token:
            raise ValueError(f"IMDS at {self.endpoint} returned an empty session token")
        return token


def _instance_action(body: str) -> InstanceAction:
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return InstanceAction("unknown", None, body)
    when = parse_time(data["time"]) if isinstance(data.get("time"), str) else None
    return InstanceAction(str(data.get("action") or "unknown"), when, body)


def parse_time(text: str) -> datetime | None:
    """An AWS timestamp (ISO 8601, 'Z' for UTC), or None if it is not one."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def imds_endpoint() -> str:
    """The instance metadata service: `AWS_EC2_METADATA_SERVICE_ENDPOINT` (botocore's own setting) if set, else
    AWS's link-local address."""
    return os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or IMDS_ENDPOINT


def imds_watcher(
    on_notice: Callable[[], None], *, poll_s: float = 5.0, endpoint: str | None = None, who: str = "parcae watch"
) -> InstanceActionWatcher:
    """An `InstanceActionWatcher` (not started) that calls `on_notice()` on a spot interruption notice and prints
    each distinct error once to stderr (a dead IMDS must not flood the log), prefixed with `who`."""
    url = endpoint or imds_endpoint()
    seen: set[str] = set()

    def report(exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if text not in seen:
            seen.add(text)
            print(f"{who}: cannot ask IMDS at {url} (still trying): {text}", file=sys.stderr, flush=True)

    def notice(action: InstanceAction) -> None:
        print(f"{who}: spot interruption notice ({action.action} at {action.time})", file=sys.stderr, flush=True)
        on_notice()

    return InstanceActionWatcher(notice, endpoint=url, poll_s=poll_s, on_error=report)


def watch_process(pid: int, signal_name: str = "TERM", *, poll_s: float = 5.0, endpoint: str | None = None) -> int:
    """Send `signal_name` (TERM, INT, USR1, USR2) to process `pid` when IMDS posts a spot interruption notice;
    return 0 (also when the process ended first), 1 if there is no such process."""
    sig = signal.Signals["SIG" + signal_name.upper().removeprefix("SIG")]
    if not _pid_alive(pid):
        print(f"parcae watch: no process {pid} to watch", file=sys.stderr)
        return 1
    fired = threading.Event()
    watcher = imds_watcher(fired.set, poll_s=poll_s, endpoint=endpoint)
    watcher.start()
    while not fired.wait(min(poll_s, 1.0)):
        if not _pid_alive(pid):  # the worker ended first: nothing to do
            watcher.stop()
            return 0
    print(f"parcae watch: sending {sig.name} to {pid}", file=sys.stderr, flush=True)
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.kill(pid, sig)
    return 0
