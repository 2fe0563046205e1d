"""Local processes standing in for EC2 instances that moto launches: what cloud-init and the hypervisor would do.

moto (a `moto_server` on 127.0.0.1) answers the EC2 API — run_instances, describe, terminate — but boots nothing.
`Ec2StandIn` watches moto's instances of one job and does what EC2 would: a new instance runs its user data (the
real boot script of `trainer.providers.aws.user_data`, with bash, in a process group of its own), a terminated one has
its whole process group SIGKILLed (a reclaim: no goodbye). Each instance gets its own IMDSv2 whose spot
notice a test switches on (`FakeImds`), as AWS posts one two minutes before a reclaim.

Imported as a top-level module (``from _ec2_standin import ...``): ``tests/`` is on ``sys.path`` under pytest.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from _aws import fake_aws_account, isolate_aws

from trainer.providers.aws import JOB_TAG_KEY, WORKER_TAG_KEY

NOTICE = '{"action": "terminate", "time": "2026-03-01T12:02:00Z"}'


@contextmanager
def moto_server_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, region: str) -> Iterator[boto3.Session]:
    """A moto_server on 127.0.0.1 that every boto3 client of this process and of its children talks to (through
    boto3's own AWS_ENDPOINT_URL), moto's fake account, an instance profile `parcae-worker`; a session on it."""
    from moto.server import ThreadedMotoServer

    isolate_aws(monkeypatch, tmp_path)
    fake_aws_account(monkeypatch, region)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per API call otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        _, port = server.get_host_and_port()
        # the server shares moto's in-process state with every earlier mock_aws of this pytest process: start clean
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST"),
                               timeout=30).close()  # fmt: skip
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        session = boto3.Session(region_name=region)
        session.client("iam").create_instance_profile(InstanceProfileName="parcae-worker")
        yield session
    finally:
        server.stop()


def coordinator_host() -> str:
    """This machine's name: the address the stand-in instances reach the coordinator at (AwsSpotConfig refuses
    loopback addresses, as real instances could not use them). Skips the test if there is no such name."""
    import socket

    host = socket.gethostname()
    if host in ("", "localhost"):
        pytest.skip("this machine has no host name other than localhost for the instances to reach")
    return host


def lan_address() -> str | None:
    """This machine's address on its default route (not loopback), or None if it has none: a coordinator there is
    one that other hosts could reach, and its workers' gloo groups listen there too (`gloo_address`)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.7", 9))  # TEST-NET-2: nothing is sent, the kernel only picks the route
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


class FakeImds:
    """IMDSv2 on 127.0.0.1: PUT a token (TTL header required), GET instance-action with it: 404 for the first
    `quiet` polls (default: until `notice()`), then the notice. A token is good for `token_uses` GETs (then 401,
    as an expired one)."""

    def __init__(self, quiet: int = 2**62, body: str = NOTICE, token_uses: int = 1000) -> None:
        self.quiet, self.body, self.token_uses = quiet, body, token_uses
        self.puts = 0
        self.gets = 0
        self.unauthorized = 0
        self.uses: dict[str, int] = {}
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def reply(self, code: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:  # noqa: N802
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self.reply(400)
                imds.puts += 1
                token = f"token-{imds.puts}"
                imds.uses[token] = 0
                self.reply(200, token)

            def do_GET(self) -> None:  # noqa: N802
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                if token not in imds.uses or imds.uses[token] >= imds.token_uses:
                    imds.unauthorized += 1
                    return self.reply(401)
                imds.uses[token] += 1
                if self.path != "/latest/meta-data/spot/instance-action":
                    return self.reply(404)
                imds.gets += 1
                self.reply(404 if imds.gets <= imds.quiet else 200, "" if imds.gets <= imds.quiet else imds.body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notice(self) -> None:
        """Post the notice now (the next poll gets it)."""
        self.quiet = self.gets

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Ec2StandIn:
    """Boots and reclaims moto's instances tagged `parcae:job` = `job` as local process groups (see module doc).

    `env`: the boot scripts' environment (moto's endpoint and fake keys); `notice_at_boot`: worker ids whose
    IMDS has a spot notice from the start. `logs` holds each boot's output file."""

    def __init__(self, ec2: Any, job: str, env: dict[str, str], log_dir: Path, *, poll_s: float = 0.1,
                 notice_at_boot: tuple[int, ...] = ()) -> None:  # fmt: skip
        self.ec2, self.job, self.env, self.log_dir, self.poll_s = ec2, job, env, log_dir, poll_s
        self.notice_at_boot = set(notice_at_boot)
        self.booted: dict[str, subprocess.Popen[bytes]] = {}  # instance id -> its boot shell (a process group)
        self.worker: dict[str, int] = {}  # instance id -> worker id
        self.imds: dict[int, FakeImds] = {}
        self.reclaimed: list[int] = []  # workers whose instance was terminated while its processes ran
        self._gone: set[str] = set()
        self.logs: dict[int, Path] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ec2-standin", daemon=True)

    def __enter__(self) -> Ec2StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.step()
                self._stop.wait(self.poll_s)
        except BaseException as e:  # noqa: BLE001 — reported by close()
            self.error = e

    def step(self) -> None:
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": f"tag:{JOB_TAG_KEY}", "Values": [self.job]}])  # fmt: skip
        for page in pages:
            for r in page["Reservations"]:
                for inst in r["Instances"]:
                    iid, state = inst["InstanceId"], inst["State"]["Name"]
                    if state in ("pending", "running") and iid not in self.booted:
                        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                        self._boot(iid, int(tags[WORKER_TAG_KEY]))
                    elif state in ("shutting-down", "terminated") and iid in self.booted and iid not in self._gone:
                        self._reclaim(iid)

    def _boot(self, iid: str, worker: int) -> None:
        raw = self.ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
        script = self.log_dir / f"user-data-{worker}.sh"
        script.write_text(base64.b64decode(raw).decode())
        imds = self.imds[worker] = FakeImds()
        if worker in self.notice_at_boot:
            imds.notice()
        log = self.logs[worker] = self.log_dir / f"boot-{worker}.log"
        env = {**self.env, "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url}
        with log.open("wb") as out:
            self.booted[iid] = subprocess.Popen(["bash", str(script)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)  # fmt: skip
        self.worker[iid] = worker

    def _reclaim(self, iid: str) -> None:
        shell = self.booted[iid]
        if shell.poll() is None or _group_alive(shell.pid):
            with suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)
            self.reclaimed.append(self.worker[iid])
        shell.wait()
        self._gone.add(iid)  # terminated instances stay listed: they must not boot or be reclaimed again

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for shell in self.booted.values():
            with suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
        for imds in self.imds.values():
            imds.close()

    def log(self, worker: int) -> str:
        return self.logs[worker].read_text(errors="replace") if worker in self.logs else ""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
