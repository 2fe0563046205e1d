"""Tests of trainer.providers.hosts: a job whose instances are instance agents on "other hosts" reached with ssh.

No sshd here: `ssh` is a stand-in script that takes OpenSSH's arguments (options, destination, command), logs the
destination and runs the command with the remote user's shell semantics (`bash -c`) on this machine, stdin and
stdout passed through. Everything else — the remote command, the token over stdin, the agent, the worker, the kill
over "ssh" — is the real code path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _ec2_standin import coordinator_host
from _flow_fixtures import free_port
from _jobs import run_job
from _trainer_fixtures import _one_thread  # noqa: F401  (autouse fixture)
from typer.testing import CliRunner

from parcae.cli import app
from trainer.config import TrainConfig, model_config
from trainer.providers.agent import KILLED, RemoteJob
from trainer.providers.hosts import HostsError, SshHosts, hosts_job
from trainer.runtime.pipeline import StageLayout, build_context, train_step

REPO = Path(__file__).resolve().parents[1]
CFG = model_config("tiny-gpt", dtype="float64")


def fake_ssh(tmp_path: Path, fail_host: str | None = None) -> tuple[Path, Path]:
    """An `ssh` that runs the command here; `fail_host` answers as an unreachable host (exit 255)."""
    log = tmp_path / "ssh.log"
    ssh = tmp_path / "ssh"
    ssh.write_text(
        "#!/bin/bash\n"
        'while [[ "$1" == -* ]]; do if [[ "$1" == -o ]]; then shift; fi; shift; done\n'
        'host="$1"; shift\n'
        f'echo "$host $*" >> {log}\n'
        + (
            f'if [[ "$host" == {fail_host} ]]; then echo "ssh: connect to host {fail_host}: refused" >&2; '
            "exit 255; fi\n"
            if fail_host
            else ""
        )
        + 'exec bash -c "$*"\n'
    )
    ssh.chmod(0o755)
    return ssh, log


def test_a_job_runs_on_agents_started_over_ssh_and_survives_a_kill(tmp_path):
    ssh, log = fake_ssh(tmp_path)
    remote = hosts_job(["gpu-a", "gpu-b", "gpu-c"], coordinator_host(), free_port(), ssh=[str(ssh), "-o",
                       "BatchMode=yes"], python=sys.executable, workdir=str(REPO))  # fmt: skip
    assert isinstance(remote, RemoteJob) and len(remote.token) >= 32
    steps = 16
    # 2x1 on two hosts, a third instance added at step 4, a kill without notice at step 8: a live recovery from
    # worker 0's replica
    events = [{"step": 4, "kind": "add", "workers": 1}, {"step": 8, "kind": "kill", "instances": [1]}]
    result = run_job(CFG, TrainConfig(), 2, (2, 1), steps, events, tmp_path / "job", remote=remote, timeout_s=120)
    ctx = build_context(CFG, TrainConfig(), StageLayout.even(1, 1, CFG))
    assert result["loss"] == pytest.approx([train_step(ctx, s) for s in range(steps)], rel=1e-5)
    assert result["exit_codes"] == {0: 0, 1: KILLED, 2: 0}
    calls = log.read_text().splitlines()
    starts = [c.split(" ", 1)[0] for c in calls if "trainer.providers.agent" in c]
    assert starts == ["gpu-a", "gpu-b", "gpu-c"]  # one instance per host (slots=1)
    assert all(remote.token not in c for c in calls)  # the token went over stdin, never on a command line
    assert any(c.startswith("gpu-b pkill -KILL -P ") for c in calls)  # the kill reached worker 1's host


def test_an_unreachable_host_is_named_and_nothing_is_left_running(tmp_path):
    ssh, _ = fake_ssh(tmp_path, fail_host="gpu-b")
    hosts = SshHosts(["gpu-a", "gpu-b"], "10.0.0.5", 29500, "t0ken", ssh=[str(ssh)], python=sys.executable,
                     workdir=str(REPO), start_timeout_s=20)  # fmt: skip
    with pytest.raises(HostsError, match=r"instance 1 on gpu-b: ssh did not start the agent \(ssh exited with 255"):
        hosts.start(2)
    assert hosts.alive() == set()  # gpu-a's agent, started first, was killed again


def test_a_host_takes_at_most_its_slots(tmp_path):
    ssh, log = fake_ssh(tmp_path)
    full = SshHosts(["gpu-a"], "10.0.0.5", 29500, "t0ken", ssh=[str(ssh)])
    busy = subprocess.Popen(["sleep", "30"])
    full.procs[0], full.host_of[0] = busy, "gpu-a"
    try:
        with pytest.raises(HostsError, match=r"every host runs 1 instance\(s\) already \(gpu-a\); add hosts or slots"):
            full.start(1)
        assert not log.exists()  # refused before any ssh
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.parametrize(
    ("hosts", "says"),
    [(["gpu-a", "gpu-a"], "listed twice"), ([""], "ssh destinations"), (["-oProxyCommand=x"], "ssh destinations")],
)
def test_bad_host_lists_are_refused(hosts, says):
    with pytest.raises(ValueError, match=says):
        SshHosts(hosts, "10.0.0.5", 29500, "t")


def test_the_cli_names_what_is_wrong_with_the_hosts_options():
    runner = CliRunner()
    r = runner.invoke(app, ["train", "--hosts", "gpu-a,gpu-b"])
    assert r.exit_code == 2 and "--hosts and --coordinator go together" in r.stderr
    r = runner.invoke(app, ["train", "--hosts", "gpu-a", "--coordinator", "10.0.0.5"])
    assert r.exit_code == 2 and "--coordinator: expected ADDRESS:PORT" in r.stderr
    r = runner.invoke(app, ["train", "--hosts", "gpu-a", "--coordinator", "127.0.0.1:29500"])
    assert r.exit_code == 2 and "loopback address" in r.stderr
    r = runner.invoke(app, ["train", "--hosts", "gpu-a,gpu-a", "--coordinator", "10.0.0.5:29500"])
    assert r.exit_code == 2 and "--hosts:" in r.stderr and "listed twice" in r.stderr
    assert "Traceback" not in r.output
