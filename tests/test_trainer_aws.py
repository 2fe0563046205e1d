"""Tests of trainer.providers.aws: the EC2 spot provider against moto, its notices, the boot script, the credential
check, and the on-instance IMDSv2 watcher against a local fake IMDS.

Everything is offline. AWS is moto (`mock_aws`, fake credentials, no config files, no instance metadata). moto
launches spot instances through run_instances but creates no spot request for them and cannot emit notices, so the
spot-request status path answers `DescribeSpotInstanceRequests` with a real-shaped response through a `before-call`
hook (the same hook injects AWS errors into single calls); everything else goes to moto. IMDS is an
`http.server` on 127.0.0.1 that speaks IMDSv2 (token PUT, 401 without a valid token, 404 until the notice).
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from _aws import answer, fake_aws_account, isolate_aws
from _ec2_standin import NOTICE, FakeImds
from _trainer_fixtures import until
from moto import mock_aws

from trainer.config import FleetConfig
from trainer.control.fleet import FleetController, cloud_spot, fleet_cost, fleet_cost_text
from trainer.providers.aws import (
    JOB_TAG_KEY,
    WORKER_TAG_KEY,
    AwsConfigError,
    AwsCredentialsError,
    AwsFleet,
    AwsProviderError,
    AwsSpotConfig,
    AwsSpotProvider,
    InterruptionEventError,
    aws_spot_provider,
    check_credentials,
    main,
    parse_interruption_event,
    spot_request_notice,
    user_data,
)
from trainer.providers.imds import InstanceActionWatcher
from trainer.providers.instances import InstanceProvider

REGION = "us-east-1"
AMI = "ami-12c6146b"  # any id: moto does not validate AMIs without its default set
TOKEN = "s3cret-job-token-7f1c"
PARAM = "/parcae/test-job/token"
REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No real AWS: no credentials, config files, instance metadata or proxies (a test adds moto's fake keys)."""
    isolate_aws(monkeypatch, tmp_path)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """moto with what a launch needs: a VPC, a subnet, a security group, an instance profile, the token in SSM."""
    fake_aws_account(monkeypatch, REGION)
    with mock_aws():
        session = boto3.Session(region_name=REGION)
        ec2 = session.client("ec2")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
        sg = ec2.create_security_group(GroupName="parcae", Description="workers", VpcId=vpc)["GroupId"]
        session.client("iam").create_instance_profile(InstanceProfileName="parcae-worker")
        session.client("ssm").put_parameter(Name=PARAM, Value=TOKEN, Type="SecureString")
        yield {"session": session, "ec2": ec2, "subnet": subnet, "sg": sg}


def config(**kw: Any) -> AwsSpotConfig:
    base: dict[str, Any] = {
        "region": REGION, "image_id": AMI, "job": "test-job", "coordinator_host": "10.0.1.10",
        "coordinator_port": 29500, "token_parameter": PARAM, "iam_instance_profile": "parcae-worker",
        "python": "/opt/parcae/.venv/bin/python",
    }  # fmt: skip
    return AwsSpotConfig(**{**base, **kw})


def provider(aws: dict[str, Any], **kw: Any) -> AwsSpotProvider:
    return AwsSpotProvider(config(subnet_id=aws["subnet"], security_group_ids=[aws["sg"]], **kw),
                           session=aws["session"])  # fmt: skip


def instance(ec2: Any, instance_id: str) -> dict[str, Any]:
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]


# ----------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("region", "US East", "an AWS region"),
        ("image_id", "ubuntu-22.04", "an AMI id"),
        ("job", "", "a tag value"),
        ("job", "a\nb", "a tag value"),
        ("coordinator_host", "127.0.0.1", "is the instance itself"),
        ("coordinator_port", 0, "a TCP port number"),
        ("coordinator_port", "29500", "a TCP port number"),
        ("token_parameter", "my token", "an SSM parameter name"),
        ("iam_instance_profile", "", "an instance profile name or ARN"),
        ("instance_type", "p3", "an EC2 instance type"),
        ("subnet_id", "vpc-0123456789abcdef0", "a subnet id"),
        ("security_group_ids", "sg-0123456789abcdef0", "a list of security group ids"),
        ("security_group_ids", ["default"], "a list of security group ids"),
        ("workdir", "opt/parcae", "an absolute path"),
        ("max_price", "-1", "a price in USD per hour > 0"),
        ("max_price", "cheap", "a price in USD per hour > 0"),
        ("notice_s", -5.0, "seconds >= 0"),
        ("instance_types", "p3.8xlarge", "a list of EC2 instance types"),
        ("subnet_ids", ["vpc-0123456789abcdef0"], "a list of subnet ids"),
        ("launch", "spot-fleet", "'run-instances' or 'ec2-fleet'"),
        ("allocation_strategy", "cheapest", "one of 'price-capacity-optimized'"),
    ],
)
def test_config_names_the_wrong_field(field: str, value: Any, says: str) -> None:
    with pytest.raises(AwsConfigError, match=rf"AwsSpotConfig\.{field}: .*{says}"):
        config(**{field: value})


def test_config_normalises_and_reads_mappings() -> None:
    c = config(security_group_ids=["sg-0123456789abcdef0"], max_price=1.5,
               iam_instance_profile="arn:aws:iam::123456789012:instance-profile/parcae-worker")  # fmt: skip
    assert c.security_group_ids == ("sg-0123456789abcdef0",) and c.max_price == "1.5"
    assert c.instance_type == "p3.2xlarge" and c.notice_s == 120.0
    data = {"region": REGION, "image_id": AMI, "job": "j", "coordinator_host": "10.0.0.2", "coordinator_port": 1,
            "token_parameter": PARAM, "iam_instance_profile": "p"}  # fmt: skip
    assert AwsSpotConfig.from_mapping(data).job == "j"
    with pytest.raises(AwsConfigError, match="unknown field.*imageid"):
        AwsSpotConfig.from_mapping({**data, "imageid": AMI})
    with pytest.raises(AwsConfigError, match="missing field.*token_parameter"):
        AwsSpotConfig.from_mapping({k: v for k, v in data.items() if k != "token_parameter"})


def test_capacity_pools_are_each_subnet_of_a_type_then_the_next_type() -> None:
    s1, s2 = "subnet-0123456789abcdef0", "subnet-0123456789abcdef1"
    assert config().capacity_pools == (("p3.2xlarge", None),)
    c = config(subnet_id=s1, subnet_ids=[s2], instance_types=["p3.8xlarge"])
    assert c.subnet_ids == (s2,) and c.capacity_pools == (
        ("p3.2xlarge", s1), ("p3.2xlarge", s2), ("p3.8xlarge", s1), ("p3.8xlarge", s2))  # fmt: skip
    assert config(subnet_ids=[s2]).capacity_pools == (("p3.2xlarge", s2),)
    with pytest.raises(AwsConfigError, match="repeat a pool.*give each type and subnet once"):
        config(subnet_id=s1, subnet_ids=[s1])


def test_our_job_tag_is_the_one_the_collector_records() -> None:
    from forecasting.collect import JOB_TAG_KEY as COLLECTED

    assert JOB_TAG_KEY == COLLECTED


# ----------------------------------------------------------------------------------------------- boot script


def test_boot_script_reads_the_token_from_ssm_and_execs_the_agent(tmp_path: Path) -> None:
    """Run the generated user data with bash and a stand-in interpreter that records every command it is given."""
    fake = tmp_path / "bin dir" / "python"  # a space: paths must be quoted
    fake.parent.mkdir()
    log = tmp_path / "calls.log"
    fake.write_text(
        "#!/bin/bash\n"
        f"log={log}\n"
        'case "$*" in\n'
        f'  "-m trainer.providers.aws token"*) echo "token $* env=${{PARCAE_TOKEN-unset}}" >> "$log"; echo {TOKEN} ;;\n'
        '  "-m trainer.providers.agent"*) echo "agent $* pid=$$ env=${PARCAE_TOKEN-unset} cwd=$PWD" >> "$log" ;;\n'
        '  *) echo "unexpected $*" >> "$log"; exit 9 ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    c = config(python=str(fake), workdir=str(tmp_path))
    script = user_data(c, 7)
    assert TOKEN not in script and script.startswith("#!/bin/bash\n")
    shell = subprocess.Popen(["bash", "-c", script], cwd="/")
    assert shell.wait(timeout=30) == 0
    calls = {line.split(" ", 1)[0]: line for line in log.read_text().splitlines()}
    assert set(calls) == {"token", "agent"}
    assert calls["token"] == f"token -m trainer.providers.aws token --parameter {PARAM} --region {REGION} env=unset"
    # exec: the agent is the boot shell's process (what cloud-init waits on), with the token in its environment
    assert calls["agent"] == (f"agent -m trainer.providers.agent --id 7 --host 10.0.1.10 --port 29500 "
                              f"--imds pid={shell.pid} env={TOKEN} cwd={tmp_path}")  # fmt: skip


def test_boot_script_stops_when_the_token_cannot_be_read(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text('#!/bin/bash\ncase "$*" in *token*) echo "no such parameter" >&2; exit 1 ;; '
                    f'*agent*) touch {tmp_path}/agent-ran ;; esac\n')  # fmt: skip
    fake.chmod(0o755)
    r = subprocess.run(["bash", "-c", user_data(config(python=str(fake), workdir=str(tmp_path)), 0)],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode != 0 and "no such parameter" in r.stderr
    assert not (tmp_path / "agent-ran").exists()


def test_token_command_prints_the_ssm_parameter(aws: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "--parameter", PARAM, "--region", REGION]) == 0
    assert capsys.readouterr().out == TOKEN + "\n"
    assert main(["token", "--parameter", "/parcae/missing", "--region", REGION]) == 1
    err = capsys.readouterr().err
    assert "'/parcae/missing'" in err and "ParameterNotFound" in err and "ssm:GetParameter" in err
    assert "Traceback" not in err


# -------------------------------------------------------------------------------------------------- provider


def test_start_tags_spot_instances_and_alive_follows_kill_and_stop(aws: dict[str, Any]) -> None:
    p = provider(aws, max_price="2.5")
    assert isinstance(p, InstanceProvider)
    ec2 = aws["ec2"]
    assert p.start(2) == [0, 1] and p.start(0) == []
    ids = p.instance_ids()
    assert sorted(ids) == [0, 1] and len(set(ids.values())) == 2
    for w, iid in ids.items():
        inst = instance(ec2, iid)
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags[JOB_TAG_KEY] == "test-job" and tags[WORKER_TAG_KEY] == str(w)
        assert inst["InstanceLifecycle"] == "spot" and inst["InstanceType"] == "p3.2xlarge"
        assert inst["SubnetId"] == aws["subnet"] and [g["GroupId"] for g in inst["SecurityGroups"]] == [aws["sg"]]
        assert inst["IamInstanceProfile"]["Arn"].endswith(":instance-profile/parcae-worker")
        raw = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
        script = base64.b64decode(raw).decode()
        assert TOKEN not in script
        assert (
            f"exec /opt/parcae/.venv/bin/python -m trainer.providers.agent --id {w} --host 10.0.1.10 --port 29500"
            " --imds" in script
        )
        assert f"trainer.providers.aws token --parameter {PARAM} --region {REGION}" in script
    params = p.launch_params(0)
    assert params["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": "2.5"},
    }
    assert params["MetadataOptions"]["HttpTokens"] == "required"

    assert p.alive() == {0, 1}
    p.kill([0])
    assert p.alive() == {1}
    assert instance(ec2, ids[0])["State"]["Name"] in ("shutting-down", "terminated")
    assert p.start(1) == [2]  # ids are never reused
    assert p.alive() == {1, 2}
    with pytest.raises(ValueError, match=r"unknown worker id\(s\) \[9\]"):
        p.kill([9])
    # another job's instance is not ours: neither alive() nor stop() touch it
    other = AwsSpotProvider(config(job="other-job", subnet_id=aws["subnet"]), session=aws["session"])
    assert other.start(1) == [0]
    p.stop()
    assert p.alive() == set()
    assert {instance(ec2, i)["State"]["Name"] for i in p.instance_ids().values()} <= {"shutting-down", "terminated"}
    assert other.alive() == {0}
    other.stop()


def test_preempt_terminates_when_the_notice_expires(aws: dict[str, Any]) -> None:
    with provider(aws) as p:
        p.start(3)
        p.preempt([0], notice_s=600)
        assert p.alive() == {0, 1, 2}  # still running during its notice
        p.preempt([0, 1], notice_s=0.05)  # an earlier deadline replaces the later one
        until(lambda: p.alive() == {2}, "the preempted instances to be terminated", timeout=20)
        p.preempt([2], notice_s=600)
        p.kill([2])  # a kill cancels the pending reclaim
        assert p.alive() == set()
        p.preempt([2], notice_s=0)  # already gone: terminating it again is harmless
        with pytest.raises(ValueError, match="notice_s"):
            p.preempt([1], notice_s=-1)


def test_aws_errors_name_the_operation_and_the_fix(aws: dict[str, Any]) -> None:
    p = AwsSpotProvider(config(subnet_id="subnet-0123456789abcdef0"), session=aws["session"])
    with pytest.raises(AwsProviderError, match=r"run_instances \(worker 0\): InvalidSubnetID\.NotFound: .*"
                                               r"Fix: AwsSpotConfig\.subnet_id does not exist"):  # fmt: skip
        p.start(1)
    p = AwsSpotProvider(config(iam_instance_profile="no-such-profile"), session=aws["session"])
    with pytest.raises(AwsProviderError, match="no-such-profile.*iam_instance_profile does not exist"):
        p.start(1)

    # all or nothing: the third launch finds no capacity; the two launched before it are terminated
    p = provider(aws)
    sent = answer(p.ec2.meta.events, "RunInstances",
                  [None, None, ("InsufficientInstanceCapacity", "There is no Spot capacity available")])  # fmt: skip
    with pytest.raises(AwsProviderError, match=r"worker 2\): InsufficientInstanceCapacity: .*Fix: no spot capacity"):
        p.start(3)
    assert len(sent) == 3 and p.instance_ids() == {} and p.alive() == set()
    states = {
        i["State"]["Name"]
        for r in aws["ec2"].describe_instances(Filters=[{"Name": f"tag:{JOB_TAG_KEY}", "Values": ["test-job"]}])[
            "Reservations"
        ]
        for i in r["Instances"]
    }
    assert states and states <= {"shutting-down", "terminated"}
    assert p.start(1) == [0]  # the failed call handed out no ids
    p.stop()


def test_an_instance_a_pool_has_no_capacity_for_is_asked_of_the_next_pool(aws: dict[str, Any]) -> None:
    """Two subnets (zones) and two types: the first pool refuses, so worker 0 launches in the second; worker 1 is
    not asked of the refusing pool again; when every pool refuses, the error names each and nothing stays."""
    ec2 = aws["ec2"]
    vpc = ec2.describe_subnets(SubnetIds=[aws["subnet"]])["Subnets"][0]["VpcId"]
    other = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.2.0/24")["Subnet"]["SubnetId"]
    p = provider(aws, subnet_ids=[other], instance_types=["p3.8xlarge"])
    no = ("InsufficientInstanceCapacity", "There is no Spot capacity available")
    sent = answer(p.ec2.meta.events, "RunInstances", [no, None, None])
    assert p.start(2) == [0, 1]
    assert [(r["body"]["InstanceType"], r["body"]["SubnetId"]) for r in sent] == [
        ("p3.2xlarge", aws["subnet"]), ("p3.2xlarge", other), ("p3.2xlarge", other)]  # fmt: skip
    assert {instance(ec2, i)["SubnetId"] for i in p.instance_ids().values()} == {other}
    assert p.instance_type_of(0) == p.instance_type_of(1) == "p3.2xlarge" and p.instance_type_of(7) is None
    # every pool refused worker 2: the request fails with AWS's capacity code, naming each pool
    sent = answer(p.ec2.meta.events, "RunInstances", [no, ("InsufficientInstanceCapacity", "none"), no, no])
    last, first = r"worker 2, p3\.8xlarge in subnet-.*InsufficientInstanceCapacity", r"worker 2, p3\.2xlarge in subnet-"
    with pytest.raises(AwsProviderError, match=rf"{last}.*and before it: .*{first}") as exc:
        p.start(1)
    assert exc.value.code == "InsufficientInstanceCapacity" and len(sent) == 4
    assert p.alive() == {0, 1}
    # the fleet takes that as the market's answer: refused, with the code, and retried later
    fleet = AwsFleet(p, store=None)
    answer(p.ec2.meta.events, "RunInstances", [no, no, no, no])
    refused = fleet.request(1)
    assert refused.granted == () and refused.refused == 1 and refused.reason == "InsufficientInstanceCapacity"
    # the second type's pools have capacity: its instance is of that type, and the fleet says so (its cost by type)
    answer(p.ec2.meta.events, "RunInstances", [no, no, None])
    (w,) = fleet.request(1).granted
    assert fleet.instance_type_of(w) == "p3.8xlarge" == instance(ec2, p.instance_ids()[w])["InstanceType"]
    p.stop()


def templates(ec2: Any) -> list[str]:
    return [t["LaunchTemplateName"] for t in ec2.describe_launch_templates()["LaunchTemplates"]]


def test_an_ec2_fleet_request_offers_every_pool_and_leaves_no_template(aws: dict[str, Any]) -> None:
    """`launch="ec2-fleet"`: each worker's instance is one instant EC2 Fleet request over every capacity pool
    (AWS picks), from a launch template holding that worker's boot script; the template is deleted once AWS has
    answered; the instance is tagged and run as with run_instances; stop() terminates it."""
    ec2 = aws["ec2"]
    vpc = ec2.describe_subnets(SubnetIds=[aws["subnet"]])["Subnets"][0]["VpcId"]
    other = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.2.0/24")["Subnet"]["SubnetId"]
    p = provider(aws, launch="ec2-fleet", subnet_ids=[other], instance_types=["p3.8xlarge"], max_price="3.5")
    sent = answer(p.ec2.meta.events, "CreateFleet", [None, None])
    assert p.start(2) == [0, 1]
    assert len(sent) == 2 and templates(ec2) == []
    request = sent[0]["body"]
    assert request["Type"] == "instant" and request["SpotOptions.AllocationStrategy"] == "price-capacity-optimized"
    assert str(request["TargetCapacitySpecification.TotalTargetCapacity"]) == "1"
    assert request["TargetCapacitySpecification.DefaultTargetCapacityType"] == "spot"
    offered = [(request[f"LaunchTemplateConfigs.1.Overrides.{i}.InstanceType"],
                request[f"LaunchTemplateConfigs.1.Overrides.{i}.SubnetId"]) for i in (1, 2, 3, 4)]  # fmt: skip
    assert offered == [("p3.2xlarge", aws["subnet"]), ("p3.2xlarge", other),
                       ("p3.8xlarge", aws["subnet"]), ("p3.8xlarge", other)]  # fmt: skip
    assert request["LaunchTemplateConfigs.1.Overrides.1.MaxPrice"] == "3.5"
    for w, iid in p.instance_ids().items():
        inst = instance(ec2, iid)
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags[JOB_TAG_KEY] == "test-job" and tags[WORKER_TAG_KEY] == str(w)
        assert inst["InstanceLifecycle"] == "spot" and p.instance_type_of(w) == inst["InstanceType"]  # AWS's pick
        raw = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
        assert base64.b64decode(raw).decode() == user_data(p.config, w)
    data = p.launch_template_data(0)
    assert "InstanceMarketOptions" not in data and "InstanceType" not in data  # the fleet's to say
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert p.alive() == {0, 1}
    p.stop()
    assert p.alive() == set()
    prioritized = provider(aws, launch="ec2-fleet", instance_types=["p3.8xlarge"],
                           allocation_strategy="capacity-optimized-prioritized").fleet_params("lt-0123")  # fmt: skip
    overrides = prioritized["LaunchTemplateConfigs"][0]["Overrides"]
    assert [(o["InstanceType"], o["Priority"]) for o in overrides] == [("p3.2xlarge", 0.0), ("p3.8xlarge", 1.0)]


def fleet_answer(*codes: str) -> dict[str, Any]:
    """An instant EC2 Fleet's answer that launched nothing: one error per pool, as AWS shapes it."""
    errors = [{"LaunchTemplateAndOverrides": {"Overrides": {"InstanceType": "p3.2xlarge", "SubnetId": f"subnet-{i}"}},
               "Lifecycle": "spot", "ErrorCode": code, "ErrorMessage": f"message {i}"}
              for i, code in enumerate(codes)]  # fmt: skip
    return {"FleetId": "fleet-0123", "Instances": [], "Errors": errors}


def test_an_ec2_fleet_that_launches_nothing_is_a_refusal_or_a_configuration_to_fix(aws: dict[str, Any]) -> None:
    ec2 = aws["ec2"]
    p = provider(aws, launch="ec2-fleet")
    # all or nothing: the third worker's fleet finds no capacity; the two launched before it are terminated
    answer(p.ec2.meta.events, "CreateFleet", [None, None, fleet_answer("InsufficientInstanceCapacity")])
    says = (
        r"create_fleet \(worker 2\): InsufficientInstanceCapacity: no pool launched an instance "
        r"\(p3\.2xlarge in subnet-0: .*message 0\).*Fix: no spot capacity"
    )
    with pytest.raises(AwsProviderError, match=says):
        p.start(3)
    assert p.instance_ids() == {} and p.alive() == set() and templates(ec2) == []
    # the fleet takes a capacity answer as the market's: refused, with AWS's code, the granted kept
    fleet = AwsFleet(p, store=None)
    answer(p.ec2.meta.events, "CreateFleet", [None, fleet_answer("InsufficientInstanceCapacity", "SpotMaxPriceTooLow")])
    got = fleet.request(3)
    assert got.granted == (0,) and got.refused == 2 and got.reason == "InsufficientInstanceCapacity"
    answer(p.ec2.meta.events, "CreateFleet", [{"FleetId": "fleet-0124", "Instances": [], "Errors": []}])
    assert fleet.request(1).reason == "UnfulfillableCapacity"
    # a pool that is misconfigured is a configuration to fix, whatever the other pools said: the job fails
    answer(p.ec2.meta.events, "CreateFleet",
           [fleet_answer("InsufficientInstanceCapacity", "InvalidParameterValue")])  # fmt: skip
    with pytest.raises(AwsProviderError, match=r"create_fleet \(worker 1\): InvalidParameterValue: .*Fix: check"):
        fleet.request(1)
    assert p.alive() == {0}
    # a template a launch could not delete (a denied call, a crash) is deleted by stop()
    answer(p.ec2.meta.events, "DeleteLaunchTemplate", [("UnauthorizedOperation", "not allowed")])
    assert p.start(1) == [1] and len(templates(ec2)) == 1
    p.stop()
    assert templates(ec2) == [] and p.alive() == set()


def test_interruptions_from_spot_request_status_codes(aws: dict[str, Any]) -> None:
    with provider(aws) as p:
        p.start(3)
        ids = p.instance_ids()
        assert p.interruptions() == []  # moto: no spot request behind run_instances' spot instances

        def req(iid: str, code: str, state: str, minute: int) -> dict[str, Any]:
            return {"SpotInstanceRequestId": f"sir-{iid[-8:]}", "InstanceId": iid, "State": state,
                    "Type": "one-time", "Status": {"Code": code, "UpdateTime": T0.replace(minute=minute),
                                                   "Message": "..."}}  # fmt: skip

        sent = answer(p.ec2.meta.events, "DescribeSpotInstanceRequests", [
            {"SpotInstanceRequests": [
                req(ids[0], "marked-for-termination", "active", 1),
                req(ids[1], "instance-terminated-no-capacity", "closed", 2),
                req(ids[2], "fulfilled", "active", 0),
                req("i-0notours00000000", "marked-for-termination", "active", 1),
            ]},
            {"SpotInstanceRequests": [
                req(ids[0], "instance-terminated-no-capacity", "closed", 3),
                req(ids[1], "instance-terminated-no-capacity", "closed", 2),  # seen already
                req(ids[2], "instance-terminated-by-user", "closed", 4),  # our own kill: no interruption
            ]},
        ])  # fmt: skip
        first = p.interruptions()
        assert [(n.worker, n.kind, n.action, n.code) for n in first] == [
            (0, "warning", "terminate", "marked-for-termination"),
            (1, "reclaimed", "terminate", "instance-terminated-no-capacity"),
        ]
        assert first[0].time == T0.replace(minute=1) and first[0].deadline == T0.replace(minute=3)
        assert first[0].source == "spot-request"
        body = sent[0]["body"]
        assert body["Filter.1.Name"] == "instance-id"
        assert sorted(v for k, v in body.items() if k.startswith("Filter.1.Value")) == sorted(ids.values())
        second = p.interruptions()
        assert [(n.worker, n.kind) for n in second] == [(0, "reclaimed")]
        assert p.interruptions() == []  # moto again: nothing new


@pytest.mark.parametrize(
    ("code", "kind", "action"),
    [
        ("marked-for-termination", "warning", "terminate"),
        ("marked-for-stop", "warning", "stop"),
        ("instance-terminated-by-price", "reclaimed", "terminate"),
        ("instance-terminated-no-capacity", "reclaimed", "terminate"),
        ("instance-terminated-launch-group-constraint", "reclaimed", "terminate"),
        ("instance-stopped-no-capacity", "reclaimed", "stop"),
        ("instance-terminated-by-experiment", "reclaimed", "terminate"),  # an AWS FIS drill
        ("fulfilled", None, None),
        ("instance-terminated-by-user", None, None),
        ("spot-instance-terminated-by-user", None, None),
        ("instance-terminated-by-service", None, None),
        ("request-canceled-and-instance-running", None, None),
        ("capacity-not-available", None, None),
    ],
)
def test_spot_request_status_codes(code: str, kind: str | None, action: str | None) -> None:
    n = spot_request_notice({"InstanceId": "i-0abc", "State": "active",
                             "Status": {"Code": code, "UpdateTime": T0, "Message": ""}})  # fmt: skip
    assert ((n.kind, n.action) if n is not None else (None, None)) == (kind, action)
    # a request not (or no longer) holding an instance says nothing about ours
    assert spot_request_notice({"State": "open", "Status": {"Code": code, "UpdateTime": T0}}) is None


def warning_event(instance_id: str, action: str = "terminate") -> dict[str, Any]:
    """The event AWS documents for a spot interruption warning (EC2 user guide, spot-instance-termination-notices)."""
    return {
        "version": "0", "id": "12345678-1234-1234-1234-123456789012",
        "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2", "account": "123456789012",
        "time": "2026-03-01T12:00:00Z", "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}:123456789012:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": action},
    }  # fmt: skip


def rebalance_event(instance_id: str) -> dict[str, Any]:
    """The documented "EC2 Instance Rebalance Recommendation" event (EC2 user guide, rebalance-recommendations)."""
    return {
        "version": "0", "id": "12345678-1234-1234-1234-123456789012",
        "detail-type": "EC2 Instance Rebalance Recommendation", "source": "aws.ec2", "account": "123456789012",
        "time": "2026-03-01T11:58:30Z", "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}:123456789012:instance/{instance_id}"],
        "detail": {"instance-id": instance_id},
    }  # fmt: skip


def test_eventbridge_events() -> None:
    n = parse_interruption_event(warning_event("i-1234567890abcdef0", "stop"))
    assert n is not None and (n.instance_id, n.kind, n.action, n.source) == ("i-1234567890abcdef0", "warning",
                                                                              "stop", "eventbridge")  # fmt: skip
    assert n.time == T0 and n.deadline == T0.replace(minute=2) and n.worker is None
    r = parse_interruption_event(rebalance_event("i-1234567890abcdef0"))
    assert r is not None and (r.kind, r.action, r.deadline) == ("rebalance", None, None)
    assert r.time == datetime(2026, 3, 1, 11, 58, 30, tzinfo=UTC)
    state_change = {**warning_event("i-1"), "detail-type": "EC2 Instance State-change Notification",
                    "detail": {"instance-id": "i-1", "state": "running"}}  # fmt: skip
    assert parse_interruption_event(state_change) is None
    with pytest.raises(InterruptionEventError, match="no detail.instance-id"):
        parse_interruption_event({**warning_event("i-1"), "detail": {}})
    with pytest.raises(InterruptionEventError, match="JSON object"):
        parse_interruption_event("{}")  # type: ignore[arg-type]


def test_fed_events_map_to_workers_and_are_reported_once(aws: dict[str, Any]) -> None:
    with provider(aws) as p:
        p.start(2)
        ids = p.instance_ids()
        assert p.feed_event(warning_event("i-0notours00000000")) is None
        reb = p.feed_event(json.loads(json.dumps(rebalance_event(ids[1]))))  # as an SQS body decodes
        warn = p.feed_event(warning_event(ids[1]))
        assert reb is not None and warn is not None and (reb.worker, warn.worker) == (1, 1)
        answer(p.ec2.meta.events, "DescribeSpotInstanceRequests", [{"SpotInstanceRequests": [
            {"InstanceId": ids[1], "State": "active", "Status": {"Code": "marked-for-termination", "UpdateTime": T0}},
        ]}])  # fmt: skip
        got = p.interruptions()
        # the warning the event brought is not repeated when the spot request says it too
        assert [(n.worker, n.kind, n.source) for n in got] == [(1, "rebalance", "eventbridge"),
                                                               (1, "warning", "eventbridge")]  # fmt: skip
        assert p.interruptions() == []


# ------------------------------------------------------------------------------------------------ credentials


def test_missing_credentials_fail_fast_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # a regression that calls AWS must not reach it
    with pytest.raises(AwsCredentialsError, match="no AWS credentials.*AWS_PROFILE.*aws configure.*instance role"):
        check_credentials(region=REGION)
    with pytest.raises(AwsCredentialsError, match="no AWS region.*AwsSpotConfig.region.*AWS_REGION"):
        check_credentials()
    with pytest.raises(AwsCredentialsError, match="no AWS credentials"):
        aws_spot_provider(config())  # choosing the AWS provider fails before anything else


def test_rejected_credentials_fail_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_aws_account(monkeypatch, REGION)
    with mock_aws():  # whatever the hook does not answer goes to moto, never to AWS
        session = boto3.Session(region_name=REGION)
        answer(session.events, "GetCallerIdentity", [("InvalidClientTokenId", "The security token is invalid.")])
        with pytest.raises(AwsCredentialsError, match="sts:GetCallerIdentity: InvalidClientTokenId: AWS rejected"):
            check_credentials(session)
        assert check_credentials(session)["account"] == "123456789012"  # the next call reaches moto


def test_credentials_pass_under_moto(aws: dict[str, Any]) -> None:
    ident = check_credentials(aws["session"])
    assert ident["account"] == "123456789012" and ident["source"] == "env"
    p = aws_spot_provider(config(subnet_id=aws["subnet"]), session=aws["session"])
    assert isinstance(p, AwsSpotProvider) and p.start(1) == [0] and p.alive() == {0}
    p.stop()


# ---------------------------------------------------------------------------------------- on the instance: IMDS


@pytest.fixture
def imds() -> Iterator[Any]:
    servers: list[FakeImds] = []

    def make(quiet: int, body: str = NOTICE, **kw: Any) -> FakeImds:
        servers.append(FakeImds(quiet, body, **kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_watcher_calls_on_notice_once_with_the_action(imds: Any) -> None:
    server = imds(quiet=3, token_uses=2)  # the token "expires" every two GETs: the watcher must fetch another
    notices = []
    w = InstanceActionWatcher(notices.append, endpoint=server.url, poll_s=0.01).start()
    w.join(timeout=20)
    assert len(notices) == 1 and w.notice is notices[0]
    assert (notices[0].action, notices[0].time) == ("terminate", T0.replace(minute=2))
    assert server.gets == 4  # 404, 404, 404, then the notice; it stopped polling after it
    assert server.puts >= 2 and server.unauthorized >= 1 and w.errors == 0


def test_watcher_survives_imds_errors_and_takes_any_200_as_a_notice(imds: Any) -> None:
    errors: list[Exception] = []
    notices = []
    dead = InstanceActionWatcher(notices.append, endpoint="http://127.0.0.1:9", poll_s=0.01, timeout_s=1,
                                 on_error=errors.append).start()  # fmt: skip
    until(lambda: len(errors) >= 2, "two failed polls", timeout=20)
    dead.stop()
    assert notices == [] and dead.errors >= 2 and isinstance(dead.last_error, OSError)
    server = imds(quiet=0, body="not json")
    w = InstanceActionWatcher(notices.append, endpoint=server.url, poll_s=0.01).start()
    w.join(timeout=20)
    assert [n.action for n in notices] == ["unknown"]


def test_watch_command_sends_sigterm_to_the_worker(imds: Any) -> None:
    server = imds(quiet=2)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        watch = subprocess.run(
            [sys.executable, "-m", "trainer.providers.aws", "watch", "--pid", str(victim.pid), "--endpoint", server.url,
             "--poll-s", "0.05"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert watch.returncode == 0, watch.stderr
        assert victim.wait(timeout=20) == -signal.SIGTERM
        assert "parcae watch: spot interruption notice (terminate at 2026-03-01 12:02:00+00:00)" in watch.stderr
        assert f"parcae watch: sending SIGTERM to {victim.pid}" in watch.stderr
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


def test_watch_command_refuses_a_pid_that_is_not_there(capsys: pytest.CaptureFixture[str]) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    assert main(["watch", "--pid", str(ended.pid), "--endpoint", "http://127.0.0.1:9"]) == 1
    assert f"no process {ended.pid} to watch" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ aws_job


def test_aws_job_publishes_a_fresh_token_and_clears_a_killed_runs_instances(aws: dict[str, Any]) -> None:
    from trainer.providers.agent import AgentInstances, RemoteJob
    from trainer.providers.aws import aws_job

    c = config(subnet_id=aws["subnet"], security_group_ids=[aws["sg"]])
    left = AwsSpotProvider(c, session=aws["session"])  # an earlier run of the job, whose driver was killed
    left.start(2)
    first = aws_job(c, session=aws["session"])
    second = aws_job(c, session=aws["session"])
    assert isinstance(first, RemoteJob) and (first.host, first.port) == ("10.0.1.10", 29500)
    assert first.token != second.token and len(second.token) >= 32
    ssm = aws["session"].client("ssm")
    assert ssm.get_parameter(Name=PARAM, WithDecryption=True)["Parameter"]["Value"] == second.token
    instances = second.instances(None)  # the driver builds it on its store when the job starts
    assert isinstance(instances, AgentInstances)
    assert left.alive() == set()  # the killed run's instances were terminated before anything was launched


def test_a_live_fleet_is_priced_at_aws_s_own_spot_price_history(aws: dict[str, Any]) -> None:
    """A live fleet on AWS is billed at the spot price of each instance's type in its zone while it ran, not at the
    bundled reference prices: the price history is asked once, at the job's end, and a price that changed meanwhile
    counts from its change. A call the driver's credentials may not make leaves the bundled prices, saying why."""
    p = provider(aws)
    fleet = AwsFleet(p, store=None)
    (w,) = fleet.request(1).granted
    kind, zone = fleet.instance_type_of(w), fleet.zone_of(w)
    assert (kind, zone) == ("p3.2xlarge", instance(aws["ec2"], p.instance_ids()[w])["Placement"]["AvailabilityZone"])
    held = FleetController(FleetConfig(max_instances=2), interval_s=60.0, start=0.0)
    held.hold(0.0, {(kind, zone): 1})
    held.hold(1800.0, {(kind, zone): 1, (None, None): 1})  # a second booting, of the provider's own type
    held.hold(3600.0, 0)
    t0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=1)  # (AWS keeps 90 days)
    start, iso = t0.timestamp(), "%Y-%m-%dT%H:%M:%SZ"
    assert held.spans == [(0.0, 1800.0, {(kind, zone): 1}), (1800.0, 3600.0, {(kind, zone): 1, (None, None): 1})]
    # moto answers a history asked by instance type with no record (its filter by type matches none): no price
    # of the instance's pool, said so, and the bundled prices stand
    moto = cloud_spot(held, fleet, "p3.2xlarge", start)
    assert moto is not None and moto.source == f"AWS describe_spot_price_history, {REGION}"
    half = t0 + timedelta(minutes=30)
    assert moto.error == f"no spot price of p3.2xlarge in {zone} between {t0:{iso}} and {half:{iso}}"
    # AWS's shape: the price in effect at the start (set before it), then a change half an hour in, in this zone
    other = "us-east-1z"
    history = [
        {"InstanceType": "p3.2xlarge", "AvailabilityZone": zone, "SpotPrice": "0.918000",
         "ProductDescription": "Linux/UNIX", "Timestamp": t0 - timedelta(hours=5)},
        {"InstanceType": "p3.2xlarge", "AvailabilityZone": zone, "SpotPrice": "1.224000",
         "ProductDescription": "Linux/UNIX", "Timestamp": t0 + timedelta(minutes=30)},
        {"InstanceType": "p3.2xlarge", "AvailabilityZone": other, "SpotPrice": "0.612000",
         "ProductDescription": "Linux/UNIX", "Timestamp": t0 - timedelta(hours=1)},
    ]  # fmt: skip
    sent = answer(p.ec2.meta.events, "DescribeSpotPriceHistory", [{"SpotPriceHistory": history}])
    billed = cloud_spot(held, fleet, "p3.2xlarge", start)
    asked = sent[0]["body"]  # (EC2's query form)
    assert (asked["InstanceType.1"], asked["ProductDescription.1"]) == ("p3.2xlarge", "Linux/UNIX")
    assert (asked["StartTime"], asked["EndTime"]) == (f"{t0:{iso}}", f"{t0 + timedelta(hours=1):{iso}}")
    # half an hour at 0.918, half an hour at 1.224, and the booting one (zone unknown) at its zones' mean
    assert billed is not None and billed.usd_by_type == {
        "p3.2xlarge": pytest.approx(0.459 + 0.612 + (1.224 + 0.612) / 4)
    }
    cost = fleet_cost(held.instance_seconds_by_type, "p3.2xlarge", samples=1_000_000, cloud=billed)
    assert cost["spot_usd"] == pytest.approx(1.53) and cost["on_demand_usd"] == pytest.approx(1.5 * 3.06)
    assert cost["spot_prices"] == f"AWS describe_spot_price_history, {REGION}"
    assert fleet_cost_text(cost) == ("fleet: 1.50 instance-hours of p3.2xlarge, $1.53 at spot (AWS "
                                     f"describe_spot_price_history, {REGION}; $4.59 on demand at the prices of "
                                     "2025-06-28)")  # fmt: skip
    # a type the bundle does not price: at spot still, on demand not
    g5 = FleetController(FleetConfig(max_instances=1), interval_s=60.0, start=0.0)
    g5.hold(0.0, {("g5.xlarge", zone): 1})
    g5.hold(3600.0, 0)
    g5_history = [{"InstanceType": "g5.xlarge", "AvailabilityZone": zone, "SpotPrice": "0.4",
                   "ProductDescription": "Linux/UNIX", "Timestamp": t0}]  # fmt: skip
    answer(p.ec2.meta.events, "DescribeSpotPriceHistory", [{"SpotPriceHistory": g5_history}])
    cost = fleet_cost(g5.instance_seconds_by_type, "g5.xlarge", 10, cloud=cloud_spot(g5, fleet, "g5.xlarge", start))
    assert (
        cost["spot_usd"] == pytest.approx(0.4)
        and "no price for instance type 'g5.xlarge'" in cost["on_demand_unpriced"]
    )
    assert "on demand not priced: no price for instance type 'g5.xlarge'" in fleet_cost_text(cost)
    # not allowed to read prices: the bundled prices, and the fix
    no = ("UnauthorizedOperation", "You are not authorized to perform this operation.")
    answer(p.ec2.meta.events, "DescribeSpotPriceHistory", [no])
    denied = cloud_spot(held, fleet, "p3.2xlarge", start)
    assert denied is not None and denied.error is not None and "UnauthorizedOperation" in denied.error
    cost = fleet_cost(held.instance_seconds_by_type, "p3.2xlarge", samples=1_000_000, cloud=denied)
    assert cost["spot_usd"] == pytest.approx(1.5 * 0.612) and "spot_prices" not in cost
    assert "ec2:DescribeSpotPriceHistory" in cost["spot_prices_error"]
    assert "ec2:DescribeSpotPriceHistory" in fleet_cost_text(cost)
    # a zone AWS gives no price for: said, not priced as another
    answer(p.ec2.meta.events, "DescribeSpotPriceHistory", [{"SpotPriceHistory": history[2:]}])
    assert cloud_spot(held, fleet, "p3.2xlarge", start) == moto
    # a fleet that began longer ago than AWS keeps prices: asked from the oldest day AWS answers for
    sent = answer(p.ec2.meta.events, "DescribeSpotPriceHistory", [{"SpotPriceHistory": history}])
    long = FleetController(FleetConfig(max_instances=1), interval_s=60.0, start=0.0)
    long.hold(0.0, {(kind, zone): 1})
    long.hold(100 * 86400.0, 0)  # a hundred days, ending now
    before = datetime.now(UTC)
    cloud_spot(long, fleet, "p3.2xlarge", before.timestamp() - 100 * 86400.0)
    oldest = datetime.fromisoformat(sent[0]["body"]["StartTime"])
    assert timedelta(days=89) - timedelta(seconds=2) <= before - oldest <= timedelta(days=89, seconds=2)
    p.stop()
