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
from _ec2_standin import coordinator_host, lan_address
from _flow_fixtures import free_port
from _jobs import run_job
from _reference import uninterrupted_losses
from _trainer_fixtures import _one_thread, until  # noqa: F401  (_one_thread: an autouse fixture)
from typer.testing import CliRunner

from parcae.cli import app
from trainer.config import TrainConfig, model_config
from trainer.providers.agent import KILLED, RemoteJob
from trainer.providers.hosts import HostsError, SshHosts, hosts_job
from trainer.runtime import checkpoint
from trainer.runtime.checkpoint_mirror import FileMirror

REPO = Path(__file__).resolve().parents[1]
CFG = model_config("tiny-gpt", dtype="float64")


def fake_ssh(tmp_path: Path, fail_host: str | None = None, disks: Path | None = None) -> tuple[Path, Path]:
    """An `ssh` that runs the command here; `fail_host` answers as an unreachable host (exit 255); with `disks`,
    each host runs in a folder of its own under it (its own disk: a relative path names a file no other host nor
    the driver sees)."""
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
        + (f'mkdir -p "{disks}/$host" && cd "{disks}/$host" || exit 255\n' if disks else "")
        + 'exec bash -c "$*"\n'
    )
    ssh.chmod(0o755)
    return ssh, log


def test_gloo_groups_listen_where_the_host_reaches_the_coordinator_from(monkeypatch):
    """On loopback gloo keeps its own choice; at a LAN address the groups listen on this host's address towards it
    (not where the host name resolves: 127.0.1.1 in many images' /etc/hosts, unreachable from the other hosts),
    unless GLOO_SOCKET_IFNAME names the interface. Two ranks (threads) form a group there and all-reduce."""
    import threading
    from datetime import timedelta

    import torch
    from torch.distributed import HashStore

    from trainer.runtime.pipeline import gloo_address, gloo_group

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert gloo_address("127.0.0.1") is None and gloo_address("localhost") is None
    lan = lan_address()
    if lan is None:
        pytest.skip("this machine has no address but loopback")
    assert gloo_address(lan) == lan
    store, sums = HashStore(), {}

    def rank(r: int) -> None:
        group = gloo_group(store, "lan", r, 2, timedelta(seconds=30), gloo_address(lan))
        t = torch.tensor([float(r + 1)])
        group.allreduce([t]).wait()
        sums[r] = t.item()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sums == {0: 3.0, 1: 3.0}
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    assert gloo_address(lan) is None  # the user's interface wins


def test_a_job_runs_on_agents_started_over_ssh_and_survives_a_kill(tmp_path):
    """The coordinator at this machine's LAN address when it has one (so the workers' gloo groups listen there,
    as across real hosts), else at its host name."""
    ssh, log = fake_ssh(tmp_path)
    host = lan_address() or coordinator_host()
    remote = hosts_job(["gpu-a", "gpu-b", "gpu-c"], host, free_port(), ssh=[str(ssh), "-o", "BatchMode=yes"],
                       python=sys.executable, workdir=str(REPO))  # fmt: skip
    assert isinstance(remote, RemoteJob) and len(remote.token) >= 32
    steps = 16
    # 2x1 on two hosts, a third instance added at step 4, a kill without notice at step 8: a live recovery from
    # worker 0's replica
    events = [{"step": 4, "kind": "add", "workers": 1}, {"step": 8, "kind": "kill", "instances": [1]}]
    result = run_job(CFG, TrainConfig(), 2, (2, 1), steps, events, tmp_path / "job", remote=remote, timeout_s=120)
    assert result["loss"] == pytest.approx(uninterrupted_losses(CFG, TrainConfig(), steps), rel=1e-5)
    assert result["exit_codes"] == {0: 0, 1: KILLED, 2: 0}
    calls = log.read_text().splitlines()
    starts = [c.split(" ", 1)[0] for c in calls if "trainer.providers.agent" in c]
    assert starts == ["gpu-a", "gpu-b", "gpu-c"]  # one instance per host (slots=1)
    assert all(remote.token not in c for c in calls)  # the token went over stdin, never on a command line
    assert any(c.startswith("gpu-b pkill -KILL -P ") for c in calls)  # the kill reached worker 1's host


def test_hosts_that_share_no_disk_checkpoint_restore_and_finish_through_the_checkpoint_uri(tmp_path, monkeypatch):
    """Three hosts whose disks share nothing with each other or with the driver (each runs in a folder of its own;
    the job's folders are relative): every worker copies the shards it writes to the `file://` checkpoint URI. 1x2
    on gpu-a and gpu-b, a third instance on gpu-c at step 4, then worker 1 — stage 1's only holder — is killed at
    step 8: the checkpoint-restart from step 5 loads shards that the restarted workers' disks never held (fetched
    from the URI), the driver fetches the final layers it never wrote, and the losses are the uninterrupted run's.
    With --keep-checkpoints 2, each disk keeps its own newest two steps and the URI its newest two."""
    disks, driver = tmp_path / "hosts", tmp_path / "driver"
    ssh, _ = fake_ssh(tmp_path, disks=disks)
    driver.mkdir()
    monkeypatch.chdir(driver)
    remote = hosts_job(["gpu-a", "gpu-b", "gpu-c"], coordinator_host(), free_port(), ssh=[str(ssh)],
                       python=sys.executable, workdir=".")  # fmt: skip
    steps, uri = 16, f"file://{tmp_path / 'durable'}"
    events = [{"step": 4, "kind": "add", "workers": 1}, {"step": 8, "kind": "kill", "instances": [1]}]
    result = run_job(CFG, TrainConfig(), 2, (1, 2), steps, events, "job", remote=remote, timeout_s=120,
                     checkpoint_every=5, checkpoint_uri=uri, keep_checkpoints=2)  # fmt: skip
    assert result["loss"] == pytest.approx(uninterrupted_losses(CFG, TrainConfig(), steps), rel=1e-5)
    restarts = [r for r in result["reconfigurations"] if r["kind"] == "checkpoint-restart"]
    assert restarts and restarts[0]["restore_step"] == 5, result["reconfigurations"]
    # nothing the workers wrote reached the driver's disk but through the URI
    assert not list((driver / "job" / "checkpoints").glob("*.pt"))
    # gpu-b died holding its only shard, of step 5; gpu-a and gpu-c uploaded up to step 15 and keep two steps
    assert [p.name for p in disks.glob("gpu-b/job/checkpoints/*.pt")] == ["step00000005.stage1.pt"]
    for host in ("gpu-a", "gpu-c"):
        assert checkpoint.checkpoint_steps(disks / host / "job" / "checkpoints") == [15, 10], host
    # worker 2 (gpu-c) trained on from the restore of step 5, a step its disk never held
    assert result["reconfigurations"][-1]["kind"] == "checkpoint-restart" and 2 in result["replicas"]
    assert not list(disks.glob("gpu-c/job/checkpoints/step00000005*"))
    assert sorted(p.name for p in (driver / "job" / "layers").glob("*.pt")) == sorted(
        checkpoint.shard_path("", steps, k).name for k in range(result["epochs"][-1]["strategy"][1])
    )
    copies = result["checkpoint_uri"]
    assert not copies["errors"] and copies["uploaded"][-1] == 15, copies
    assert FileMirror(tmp_path / "durable", uri).steps() == [15, 10]  # --keep-checkpoints 2 at the URI too


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
    full.procs[0], full.host_of[0], full.slot_of[0] = busy, "gpu-a", 0
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


def test_an_instance_takes_its_host_s_lowest_free_slot_and_that_slot_s_gpu(tmp_path):
    """Two hosts of two slots: instances fill the least busy host first, each in its lowest free slot, which is
    the GPU index its worker gets there (PARCAE_DEVICE_INDEX); a slot freed by a kill is taken again."""
    ssh, log = fake_ssh(tmp_path)
    seen = tmp_path / "seen.log"
    agent = tmp_path / "python"  # stands in for the hosts' interpreter: records what the agent would get
    agent.write_text(f'#!/bin/bash\necho "$4 $PARCAE_DEVICE_INDEX" >> {seen}\nexec sleep 60\n')
    agent.chmod(0o755)
    hosts = SshHosts(["gpu-a", "gpu-b"], "10.0.0.5", 29500, "t0ken", slots=2, ssh=[str(ssh)], python=str(agent),
                     workdir=str(tmp_path))  # fmt: skip
    try:
        assert hosts.start(3) == [0, 1, 2]
        hosts.kill([0])
        assert hosts.start(1) == [3]
        assert {w: (hosts.host_of[w], hosts.slot_of[w]) for w in (1, 2, 3)} == {
            1: ("gpu-b", 0), 2: ("gpu-a", 1), 3: ("gpu-a", 0)}  # fmt: skip
        until(lambda: len(seen.read_text().splitlines()) == 4 if seen.exists() else False, "four agents")
        assert sorted(seen.read_text().splitlines()) == ["0 0", "1 0", "2 1", "3 0"]  # worker id, GPU index
    finally:
        hosts.stop()
