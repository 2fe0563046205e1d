"""Tests of trainer.providers.agent: the instance agent and the driver's view of instances it runs — and a whole job on
"EC2 spot instances": boto3 against a moto_server on 127.0.0.1, each instance a local process group running its real
boot script (`_ec2_standin`), with a spot notice through IMDSv2 and a reclaim without notice.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
import torch.distributed as dist
from _ec2_standin import Ec2StandIn, coordinator_host, moto_server_env
from _flow_fixtures import free_port
from _jobs import run_job
from _reference import uninterrupted
from _trainer_fixtures import Action, Cloud, Condition, _one_thread, started, until  # noqa: F401  (autouse fixture)

from forecasting import TraceStore
from trainer.config import TrainConfig, model_config
from trainer.control.driver import JobError
from trainer.providers.agent import KILLED, AgentInstances, InstanceAgent, RemoteJob
from trainer.providers.aws import JOB_TAG_KEY, WORKER_TAG_KEY, AwsSpotConfig, aws_job
from trainer.providers.instances import InstanceProvider
from trainer.runtime import checkpoint
from trainer.runtime.checkpoint_mirror import S3Mirror
from trainer.runtime.keys import agent_exit as exit_key
from trainer.runtime.keys import agent_signal as signal_key
from trainer.runtime.keys import agent_signals as signals_key
from trainer.runtime.keys import agent_start as start_key
from trainer.runtime.keys import agent_up as up_key
from trainer.runtime.pipeline import StageLayout, build_context
from trainer.runtime.worker import EXIT_PREEMPTED

REPO = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
AMI = "ami-12c6146b"
PARAM = "/parcae/agent-e2e/token"
CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    yield dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False,
                        timeout=timedelta(seconds=10))  # fmt: skip


def fake_worker(code_file: Path) -> Any:
    """A worker command for the agent: bumps its heartbeat once it has a SIGTERM handler, writes the signals it
    gets to `code_file`, and exits with the code the test puts in `code_file`.exit."""
    script = (
        "import os, signal, sys, time, datetime\n"
        "import torch.distributed as dist\n"
        "w, host, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])\n"
        f"log = {str(code_file)!r}\n"
        "signal.signal(signal.SIGTERM, lambda s, f: open(log, 'a').write(f'TERM {os.getpid()}\\n'))\n"
        "st = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))\n"
        "st.add(f'hb/{w}', 1)\n"
        "while not os.path.exists(log + '.exit'):\n"
        "    time.sleep(0.02)\n"
        "code = int(open(log + '.exit').read())\n"
        "os.remove(log + '.exit')\n"
        "sys.exit(code)\n"
    )
    return lambda w, host, port: [sys.executable, "-c", script, str(w), host, str(port)]


def run_agent(agent: InstanceAgent) -> tuple[threading.Thread, list[int]]:
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(agent.run()), daemon=True)
    t.start()
    return t, out


# ---------------------------------------------------------------------------------------------- the agent


def test_the_agent_reports_exits_restarts_on_request_and_passes_signals_on(store, tmp_path):
    log = tmp_path / "worker.log"
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    agent = InstanceAgent(4, "127.0.0.1", store.port, store=client, poll_s=0.02, command=fake_worker(log))
    agent.notify(signal.SIGTERM)  # a notice before the worker can take it: held, not lost, not fatal
    thread, code = run_agent(agent)
    until(lambda: log.exists() and "TERM" in log.read_text(), "the held notice to reach the worker")
    first = int(store.get(up_key(4, 0)))
    assert log.read_text() == f"TERM {first}\n"
    # the driver asks for a signal through the store
    n = store.add(signals_key(4), 1)
    store.set(signal_key(4, n), str(int(signal.SIGTERM)))
    until(lambda: log.read_text().count("TERM") == 2, "the driver's signal")
    # a checkpoint-restart: exit 125, wait for the driver's go, a fresh process
    Path(str(log) + ".exit").write_text("125")
    until(lambda: store.check([exit_key(4, 0)]), "the exit report")
    assert int(store.get(exit_key(4, 0))) == 125 and thread.is_alive() and not store.check([up_key(4, 1)])
    store.set(start_key(4, 1), "1")
    until(lambda: store.check([up_key(4, 1)]), "the second process")
    assert int(store.get(up_key(4, 1))) != first
    Path(str(log) + ".exit").write_text("13")  # preempted: the agent ends with its worker
    thread.join(timeout=20)
    assert code == [13] and int(store.get(exit_key(4, 1))) == 13


def test_the_agent_leaves_when_the_job_ends_instead_of_a_restart(store, tmp_path):
    log = tmp_path / "worker.log"
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    agent = InstanceAgent(0, "127.0.0.1", store.port, store=client, poll_s=0.02, command=fake_worker(log))
    thread, code = run_agent(agent)
    until(lambda: store.check([up_key(0, 0)]), "the worker")
    Path(str(log) + ".exit").write_text("125")
    until(lambda: store.check([exit_key(0, 0)]), "the exit report")
    store.set("ctl/done", "1")
    thread.join(timeout=20)
    assert code == [125] and not store.check([up_key(0, 1)])


class FakeCloud(InstanceProvider):
    """Instances that are only ids; `gone` ones are no longer listed (reclaimed behind the driver's back)."""

    def __init__(self) -> None:
        self.next, self.running, self.killed = 0, set(), []

    def start(self, n):
        ids = list(range(self.next, self.next + n))
        self.next += n
        self.running |= set(ids)
        return ids

    def preempt(self, ids, notice_s):
        raise AssertionError("AgentInstances enforces notices itself")

    def kill(self, ids):
        self.killed.append(sorted(ids))
        self.running -= set(ids)

    def alive(self):
        return set(self.running)


def test_the_driver_reads_exits_from_the_store_and_the_cloud(store):
    cloud = FakeCloud()
    inst = AgentInstances(cloud, store, alive_every_s=0, refresh_s=0)
    assert inst.start(3) == [0, 1, 2]
    assert inst.exitcodes() == {0: None, 1: None, 2: None} and inst.alive() == {0, 1, 2}
    store.set(exit_key(0, 0), "125")  # a checkpoint-restart: the instance stays
    store.set(exit_key(1, 0), str(EXIT_PREEMPTED))  # preempted: the instance is handed back at once
    cloud.running.discard(2)  # reclaimed without notice: the agent could not report
    inst.poll()
    assert inst.exitcodes() == {0: 125, 1: EXIT_PREEMPTED, 2: KILLED}
    assert cloud.killed == [[1]]
    inst.restart([0])
    assert store.check([start_key(0, 1)]) and inst.exitcode(0) is None and inst.exit_history == {0: [125]}
    with pytest.raises(RuntimeError, match="instance 1: its process has not ended for a restart"):
        inst.restart([1])
    # a notice through the store, then a reclaim at its deadline
    inst.preempt([0], 0.0)
    assert store.get(signal_key(0, 1)) == str(int(signal.SIGTERM)).encode()
    inst.poll()
    assert inst.exitcode(0) == KILLED and [w for w, _ in inst.reclaimed] == [0] and cloud.killed[-1] == [0]
    inst.stop()
    with pytest.raises(KeyError, match="instance 7 was not started"):
        inst.exitcode(7)


# ------------------------------------------------------------------------------ a job on "EC2 spot instances"


@pytest.fixture
def moto_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[boto3.Session]:
    with moto_server_env(monkeypatch, tmp_path, REGION) as session:
        yield session


def reclaim(ec2: Any, job: str, workers: list[str]) -> Action:
    """The cloud reclaims the instances of `workers` without notice (terminate_instances)."""

    def act(_: dist.Store) -> None:
        res = ec2.describe_instances(Filters=[{"Name": f"tag:{JOB_TAG_KEY}", "Values": [job]},
                                              {"Name": f"tag:{WORKER_TAG_KEY}", "Values": workers}])  # fmt: skip
        ids = [i["InstanceId"] for r in res["Reservations"] for i in r["Instances"]]
        assert len(ids) == len(workers)
        ec2.terminate_instances(InstanceIds=ids)

    return act


def left_and_joined(left: int, joined: int) -> Condition:
    """Worker `left`'s first process has ended and worker `joined` registered (the coordinator creates
    ctl/joins/{id} = 0 when it starts waiting for it: registered means >= 1)."""
    key = f"ctl/joins/{joined}"
    return lambda st: st.check([exit_key(left, 0)]) and st.add(key, 0) >= 1  # (a counter: read with add)


def on_standin(standin: Ec2StandIn, run: Any) -> Any:
    """`run()` a job whose instances `standin` boots; a failure shows each instance's boot log; returns once every
    boot script has ended (nothing left running)."""
    try:
        result = run()
    except JobError as e:
        boots = "\n".join(f"--- instance of worker {w}:\n{standin.log(w)[-2000:]}" for w in sorted(standin.logs))
        raise AssertionError(f"{e}\nstand-in: {standin.error!r}\n{boots}") from e
    until(lambda: not standin.booted or all(s.poll() is not None for s in standin.booted.values()),
          "every boot script to end")  # fmt: skip
    return result


def reference(steps: int) -> tuple[list[float], dict[str, Any]]:
    """Losses and final layer states of one uninterrupted process."""
    return uninterrupted(CFG, TRAIN, steps)


def test_a_job_on_spot_instances_through_moto_survives_a_notice_and_a_reclaim(moto_server, tmp_path):
    host = coordinator_host()
    job, steps = "agent-e2e", 60
    config = AwsSpotConfig(region=REGION, image_id=AMI, job=job, coordinator_host=host,
                           coordinator_port=free_port(), token_parameter=PARAM, iam_instance_profile="parcae-worker",
                           python=sys.executable, workdir=str(REPO))  # fmt: skip
    remote = aws_job(config, session=moto_server)
    assert isinstance(remote, RemoteJob) and remote.port == config.coordinator_port
    ssm = moto_server.client("ssm")
    assert ssm.get_parameter(Name=PARAM, WithDecryption=True)["Parameter"]["Value"] == remote.token
    ec2 = moto_server.client("ec2")
    cloud = Cloud((left_and_joined(1, 3), reclaim(ec2, job, ["2", "3"])))
    env = {k: v for k, v in os.environ.items() if k != "PARCAE_TOKEN"}
    with Ec2StandIn(ec2, job, env, tmp_path, notice_at_boot=(1,)) as standin:
        # 1x2 on workers 0 and 1, worker 2 stands by, worker 3 is added at step 2. Worker 1's instance has a spot
        # notice from boot: its agent passes it on, the worker hands stage 1 off and leaves. Then the cloud
        # reclaims 2 and 3 without notice: stage 1 has no holder left, so worker 0's agent restarts it from the
        # latest checkpoint.
        result = on_standin(standin, lambda: run_job(
            CFG, TRAIN, 3, (1, 2), steps, [{"step": 2, "kind": "add", "workers": 1}], tmp_path / "job",
            remote=remote, checkpoint_every=4, timeout_s=180, notice_grace_s=120, observer=cloud))  # fmt: skip
    cloud.finish()
    assert standin.error is None, standin.error
    logs = {w: standin.log(w) for w in range(4)}
    assert "spot interruption notice" in logs[1], logs[1]
    losses, layers = reference(steps)
    assert result["loss"] == pytest.approx(losses, rel=1e-5)  # every step once: the run of one process
    final = checkpoint.load(checkpoint.find_shards(result["layers"], steps), config=CFG, job="job")
    for name, want in layers.items():
        for key in want:
            assert torch.allclose(final.layers[name][key], want[key], rtol=1e-5, atol=1e-9), f"{name} {key}"
    recs = result["reconfigurations"]
    notice = next(r for r in recs if r["source"] == "sigterm")
    assert notice["preempted"] == [1] and notice["kind"] == "inter-stage" and notice["steps_lost"] == 0
    assert any(r["kind"] == "checkpoint-restart" for r in recs), [r["kind"] for r in recs]
    assert result["exit_codes"] == {0: 0, 1: EXIT_PREEMPTED, 2: KILLED, 3: KILLED}
    assert {2, 3} <= set(standin.reclaimed)
    # every instance handed back: nothing left running (and paid for) after the job
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"]
              for i in r["Instances"]}  # fmt: skip
    assert len(states) == 4 and set(states.values()) == {"terminated"}


def test_a_live_fleet_of_spot_instances_through_moto_takes_what_the_cloud_gives(moto_server, tmp_path):
    """`--provider aws --fleet 3` on moto_server, instances booted by the stand-in: the first request finds
    capacity for two only (InsufficientInstanceCapacity, injected at the botocore layer: moto cannot refuse), the
    retry after the backoff gets the third; worker 1's instance has a spot notice through IMDSv2 from boot; once
    step 12 has trained, the cloud reclaims worker 0 without notice. The job trains on what is alive, asks for
    replacements, and ends with the uninterrupted run's losses; its checkpoints are in an S3 bucket on the same
    moto_server (the newest complete, older ones pruned); nothing is left running."""
    from _aws import answer

    from trainer.config import (
        AvailabilityConfig,
        CheckpointConfig,
        ControlPlaneConfig,
        FleetConfig,
        JobConfig,
        PlanningConfig,
        ProviderConfig,
    )
    from trainer.control.planning import RulePlanner
    from trainer.control.run import job_schedule
    from trainer.control.run import run_job as run_config

    host = coordinator_host()
    job, steps = "fleet-e2e", 150
    options = dict(region=REGION, image_id=AMI, job=job, coordinator_host=host, coordinator_port=free_port(),
                   token_parameter=PARAM, iam_instance_profile="parcae-worker", python=sys.executable,
                   workdir=str(REPO))  # fmt: skip
    sent = answer(moto_server.events, "RunInstances",
                  [None, None, ("InsufficientInstanceCapacity", "There is no Spot capacity available")])  # fmt: skip
    # AWS's spot price history, as AWS shapes it (moto answers none for a type asked by name): $0.90 an hour in
    # every zone since the day before
    since = datetime.now(UTC) - timedelta(days=1)
    history = [{"InstanceType": "p3.2xlarge", "AvailabilityZone": f"{REGION}{z}", "SpotPrice": "0.900000",
                "ProductDescription": "Linux/UNIX", "Timestamp": since} for z in "abcdef"]  # fmt: skip
    asked_prices = answer(moto_server.events, "DescribeSpotPriceHistory", [{"SpotPriceHistory": history}])
    remote = aws_job(AwsSpotConfig(**options), session=moto_server)
    moto_server.client("s3").create_bucket(Bucket="ckpt")
    config = JobConfig(
        out_dir=str(tmp_path / "job"), model=CFG, train=TrainConfig(steps=steps),
        availability=AvailabilityConfig(interval_seconds=2.0),
        checkpoint=CheckpointConfig(every=5, keep=3, uri=f"s3://ckpt/{job}"),
        control=ControlPlaneConfig(notice_grace_s=120, timeout_s=300),
        provider=ProviderConfig(name="aws", options=options), planning=PlanningConfig(planner="rule"),
        fleet=FleetConfig(max_instances=3, min_instances=2, trace_store="s3://ckpt/traces"),
    )  # fmt: skip
    ec2 = moto_server.client("ec2")
    cloud = Cloud((started(13, range(16)), reclaim(ec2, job, ["0"])))  # past the checkpoint of step 10
    env = {k: v for k, v in os.environ.items() if k != "PARCAE_TOKEN"}
    with Ec2StandIn(ec2, job, env, tmp_path, notice_at_boot=(1,)) as standin:
        result = on_standin(
            standin,
            lambda: run_config(
                config, job_schedule(config, planned=True), planner=RulePlanner(), remote=remote, observer=cloud
            ),
        )
    cloud.finish()
    assert standin.error is None, standin.error
    assert cloud.done == [0], "the cloud reclaimed worker 0 once step 12 had trained"
    assert len(sent) == 3  # two granted, the third refused
    first = result["fleet"][0]
    # the injected refusal, retried after its backoff; no storm before the start (a replacement or two at most,
    # should the noticed worker leave before training starts)
    assert first["refused"] == 1 and first["requested"] <= 6, result["fleet"]
    totals = result["fleet_totals"]
    assert totals["granted"] >= 4 and totals["reclaimed"] >= 2, totals  # replacements were asked for
    cost = result["fleet_cost"]  # its instances' hours, on the wall clock, at AWS's spot prices (asked once)
    assert cost["instance_type"] == "p3.2xlarge" and cost["time_scale"] == 1.0 and len(asked_prices) == 1, cost
    assert cost["spot_prices"] == f"AWS describe_spot_price_history, {REGION}" and "spot_prices_error" not in cost
    assert cost["spot_usd"] == pytest.approx(cost["instance_hours"] * 0.9, abs=2e-6), cost
    losses, _ = reference(steps)
    assert result["loss"] == pytest.approx(losses, rel=1e-5)
    recs = result["reconfigurations"]
    # worker 1 took its notice and left cleanly: handed off live if it was a member by then, else as a standby
    # (which instances joined first, and so started the job, is the boot order's) — or, a member whose deadline
    # (two minutes) lies past the job's end, it trained on through every plan, as a noticed instance does until the
    # last plan before its deadline, and finished the job
    handed_off = any(r["source"] == "sigterm" and 1 in r["preempted"] and r["steps_lost"] == 0 for r in recs)
    standby = any(e.get("event") == "preempt-standby" and 1 in e["workers"] for e in result["events"])
    stayed = any(e.get("event") == "notice-folded" and 1 in e["workers"] for e in result["events"])
    assert ((handed_off or standby) and result["exit_codes"][1] == EXIT_PREEMPTED) or (
        stayed and result["exit_codes"][1] == 0), (recs, result["exit_codes"])  # fmt: skip
    # worker 0 was reclaimed without notice: a member then (the survivors recovered without notice), or a standby
    # (which instances train, and which stand by, is the boot order's and the rule's)
    died = [e for e in result["events"] if e.get("event") == "dead" and 0 in e["workers"]]
    assert died and (any(not r["notice"] for r in recs) or not died[0]["epoch_broken"]), (died, recs)
    assert "spot interruption notice" in standin.log(1)
    assert 0 in standin.reclaimed
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"]
              for i in r["Instances"]}  # fmt: skip
    assert len(states) >= 4 and set(states.values()) == {"terminated"}
    # the checkpoints outlive the instances: in the bucket, the last three complete, as --keep-checkpoints says
    copies = result["checkpoint_uri"]
    assert copies["uri"] == f"s3://ckpt/{job}" and not copies["errors"] and steps - 5 in copies["uploaded"]
    assert S3Mirror("ckpt", job, copies["uri"], moto_server.client("s3")).steps() == [steps - 5, steps - 10, steps - 15]
    # the fleet's history, an interval a row, in the trace store at an S3 prefix: a forecaster elsewhere trains on it
    history = result["fleet_history"]
    assert history["store"] == "s3://ckpt/traces" and not history["errors"]
    stored = TraceStore("s3://ckpt/traces").read("fleet_intervals")
    assert stored["alive"].tolist() == [r["alive"] for r in result["fleet"]] and set(stored["job_tag"]) == {
        history["job_tag"]
    }


def test_a_killed_driver_s_spot_fleet_resumes_from_s3_on_a_second_driver(moto_server, tmp_path):
    """`parcae train --provider aws --fleet 2 --checkpoint-uri s3://...` on moto_server: the driver is SIGKILLed
    once a checkpoint is complete in the bucket (its instances go on running: the cloud does not know), and a torn
    upload of a newer step is left in the bucket; a second driver on a fresh out-dir (another machine) with
    `--resume` terminates what the first left running, launches its own instances (through instant EC2 Fleet
    requests: `launch="ec2-fleet"`, where the first used run_instances), resumes from the newest complete
    checkpoint in S3 (not the torn one), keeps two there, and ends with the uninterrupted run's losses; nothing is
    left running, and no launch template is left."""
    import json
    import subprocess

    job, steps = "fleet-resume", 30
    options = dict(region=REGION, image_id=AMI, job=job, coordinator_host=coordinator_host(),
                   coordinator_port=free_port(), token_parameter=PARAM, iam_instance_profile="parcae-worker",
                   python=sys.executable, workdir=str(REPO))  # fmt: skip
    s3, ec2 = moto_server.client("s3"), moto_server.client("ec2")
    s3.create_bucket(Bucket="ckpt")
    uri = f"s3://ckpt/{job}"
    mirror = S3Mirror("ckpt", job, uri, s3)
    args = [sys.executable, "-m", "parcae.cli", "train", "--provider", "aws", "--provider-options",
            json.dumps(options), "--fleet", "2", "--min-instances", "2", "--planner", "rule", "--interval-seconds",
            "2", "--steps", str(steps), "--checkpoint-every", "5", "--keep-checkpoints", "2", "--checkpoint-uri", uri,
            "--model-args",
            '{"dtype": "float64"}', "--device", "cpu", "--timeout", "240"]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if k != "PARCAE_TOKEN"}, "PYTHONPATH": str(REPO)}
    with Ec2StandIn(ec2, job, env, tmp_path) as standin:
        first = subprocess.Popen([*args, "--out-dir", str(tmp_path / "a")], cwd=tmp_path, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        until(lambda: bool(mirror.steps()) or first.poll() is not None, "a checkpoint complete in S3", 180)
        os.killpg(first.pid, signal.SIGKILL)  # the driver's machine is gone; its instances are not
        first.wait(30)
        err = first.stderr.read().decode(errors="replace")[-3000:] if first.stderr else ""
        copied = mirror.steps()
        assert copied and copied[0] < steps, (copied, err)
        left = {i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
                if i["State"]["Name"] == "running"}  # fmt: skip
        assert len(left) == 2, left
        # a torn upload of a newer step: a shard reached S3, its manifest never did — not a checkpoint there
        torn = tmp_path / "torn"
        ctx = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG))
        shard = checkpoint.save(checkpoint.shard_path(torn, copied[0] + 5, 0), ctx.layer_states(),
                                step=copied[0] + 5, config=CFG, job=job)  # fmt: skip
        mirror.put(shard.name, shard)
        out = tmp_path / "report.json"
        by_fleet = json.dumps({**options, "launch": "ec2-fleet"})
        again = [by_fleet if a == json.dumps(options) else a for a in args]
        second = subprocess.run([*again, "--out-dir", str(tmp_path / "b"), "--resume", "--json", str(out)],
                                cwd=tmp_path, env=env, capture_output=True, timeout=300, text=True)  # fmt: skip
        boots = "\n".join(f"--- {w}:\n{standin.log(w)[-1500:]}" for w in sorted(standin.logs))
        assert second.returncode == 0, f"{second.stderr[-3000:]}\n{boots}"
        until(lambda: all(s.poll() is not None for s in standin.booted.values()), "every boot script to end")
    report = json.loads(out.read_text())
    newest = report["resumed_from"]
    assert newest is not None and newest >= copied[0], (newest, copied)
    assert report["loss"] == pytest.approx(reference(steps)[0][newest:], rel=1e-6)
    assert not report["checkpoint_uri"]["errors"] and mirror.steps() == [steps - 5, steps - 10]  # --keep 2
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"]
              for i in r["Instances"]}  # fmt: skip
    assert left <= set(states) and len(states) >= 4 and set(states.values()) == {"terminated"}, states
    fleets = ec2.describe_fleets()["Fleets"]
    assert len(fleets) >= 2 and {f["Type"] for f in fleets} == {"instant"}  # the second driver's instances
    assert ec2.describe_launch_templates()["LaunchTemplates"] == []
