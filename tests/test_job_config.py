"""One `JobConfig` carries a job's settings end to end; providers come from one registry (`trainer.providers`)."""

from __future__ import annotations

import json

import pytest

from trainer.config import (
    AvailabilityConfig,
    CheckpointConfig,
    ConfigError,
    ControlPlaneConfig,
    FleetConfig,
    JobConfig,
    ProviderConfig,
    TrainConfig,
    config_default,
)
from trainer.providers import PROVIDERS, ProviderError, provider, provider_of


def test_a_job_config_round_trips_through_json():
    cfg = JobConfig(
        job="j", out_dir="runs/x", availability=AvailabilityConfig(workers=3, trace="p3", strategy=(1, 3)),
        checkpoint=CheckpointConfig(every=5, keep=2), control=ControlPlaneConfig(timeout_s=60.0),
        provider=ProviderConfig("hosts", {"hosts": ["a", "b"], "coordinator": "10.0.0.5:29500", "slots": 2}),
    )  # fmt: skip
    back = JobConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and back.availability.strategy == (1, 3)
    assert cfg.layers_dir.endswith("runs/x/layers") and cfg.checkpoint_dir.endswith("runs/x/checkpoints")
    assert cfg.replace(checkpoint={"resume": True}).checkpoint == CheckpointConfig(every=5, keep=2, resume=True)


def checked_provider(name: str, options: dict | None = None):
    """A job of provider `name` with `options`, its provider checked (`provider_of`, before anything starts)."""
    return lambda: provider_of(JobConfig(provider=ProviderConfig(name, options or {})))


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (lambda: CheckpointConfig(every=-1), "checkpoint.every"),
        (lambda: ControlPlaneConfig(hb_timeout_s=0.1, hb_interval_s=0.1), "control.hb_timeout_s"),
        (lambda: ControlPlaneConfig(timeout_s=float("nan")), "control.timeout_s"),
        (lambda: AvailabilityConfig(trace="p3", events_file="e.json"), "not both"),
        (lambda: AvailabilityConfig(interval_seconds=0), "availability.interval_seconds"),
        (checked_provider("gcp"), "choose one of local, hosts, aws"),
        (checked_provider("local", {"region": "x"}), "no option 'region'"),
        (checked_provider("hosts", {"hosts": "a"}), "hosts and coordinator go together"),
        (checked_provider("hosts", {"hosts": "a", "coordinator": "127.0.0.1:29500"}), "loopback"),
        (checked_provider("aws", {"regon": "us-east-1"}), "unknown field(s) regon"),
        (lambda: JobConfig.from_dict({"modle": {}}), "unknown fields ['modle']"),
        (lambda: FleetConfig(max_instances=2, trace_store="gs://b/traces"), "fleet.trace_store"),
        (lambda: FleetConfig(max_instances=2, trace_store="s3:///traces"), "name the bucket"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_field(build, names):
    with pytest.raises(ConfigError, match=".") as e:
        build()
    assert names in str(e.value)


def test_a_live_fleet_s_trace_store_from_the_environment_is_checked_before_the_job(monkeypatch):
    monkeypatch.setenv("PARCAE_TRACE_STORE", "gs://b/traces")
    with pytest.raises(ConfigError, match=r"\$PARCAE_TRACE_STORE: trace store 'gs://b/traces': expected a folder"):
        FleetConfig(max_instances=2)
    FleetConfig(max_instances=2, record_history=False)  # no history: the store is not used
    FleetConfig()  # no fleet
    monkeypatch.setenv("PARCAE_TRACE_STORE", "s3://b/traces")
    assert FleetConfig(max_instances=2).trace_store is None  # (resolved where the history is written)


def test_every_provider_is_in_one_registry():
    assert list(PROVIDERS) == ["local", "hosts", "aws", "market"]
    assert provider("local").job({}) is None  # local worker processes
    assert provider("local").notice_grace_s({}) == 30.0
    assert [n for n, p in PROVIDERS.items() if p.fleet is not None] == ["market"]  # live fleets
    assert [n for n, p in PROVIDERS.items() if not p.replays] == ["market"]  # it runs nothing else
    assert provider("market").notice_grace_s({"trace": "p3", "notice_s": 5}) == 5.0
    aws = {"region": "us-east-1", "image_id": "ami-0123456789abcdef0", "coordinator_host": "10.0.0.5",
           "coordinator_port": 29500, "token_parameter": "/parcae/t", "job": "j",
           "iam_instance_profile": "parcae-worker"}  # fmt: skip
    provider("aws").check(aws)
    assert provider("aws").notice_grace_s(aws) == 120.0  # AWS's two minutes
    with pytest.raises(ProviderError, match="unknown provider 'gcp'"):
        provider("gcp")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--provider", "gcp"], "--provider: unknown provider 'gcp'; choose one of local, hosts, aws"),
        (["--provider", "aws", "--provider-options", "{not json"], "--provider-options: not JSON"),
        (["--provider", "aws", "--provider-options", "[1]"], "--provider-options: expected a JSON object"),
        (["--provider", "aws", "--provider-options", '{"regon": "us-east-1"}'], "unknown field(s) regon"),
        (["--provider", "aws", "--provider-options", "@/nonexistent/aws.json"], "cannot read"),
        (["--provider", "local", "--hosts", "a", "--coordinator", "10.0.0.5:1"], "the hosts provider's options"),
    ],
)
def test_the_cli_takes_any_registered_provider_and_names_what_is_wrong(args, says, tmp_path):
    from typer.testing import CliRunner

    from parcae.cli import app

    r = CliRunner().invoke(app, ["train", "--out-dir", str(tmp_path / "job"), *args])
    assert r.exit_code == 2 and says in r.stderr, r.output
    assert "Traceback" not in r.output and not (tmp_path / "job").exists()


def test_the_cli_checks_aws_credentials_before_any_job_starts(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from parcae.cli import app

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    spot = tmp_path / "spot.json"
    spot.write_text(json.dumps({"region": "us-east-1", "image_id": "ami-0123456789abcdef0", "job": "j",
                                "coordinator_host": "10.0.0.5", "coordinator_port": 29500,
                                "token_parameter": "/parcae/t", "iam_instance_profile": "parcae-worker"}))  # fmt: skip
    r = CliRunner().invoke(app, ["train", "--out-dir", str(tmp_path / "job"), "--provider", "aws",
                                 "--provider-options", f"@{spot}"])  # fmt: skip
    assert r.exit_code == 2 and "--provider aws" in r.stderr and "credentials" in r.stderr.lower(), r.output
    assert not (tmp_path / "job").exists()


def test_a_job_resumes_only_with_the_settings_it_was_started_with(tmp_path):
    """The folder's job.json (what the earlier run wrote) against the resumed job's settings: more steps, another
    deadline or retention are fine; another seed, model or schedule is refused, naming what changed."""
    from trainer.config import TrainConfig, model_config
    from trainer.control.resume import check_same_job
    from trainer.control.run import JOB_FILE

    before = JobConfig(out_dir=str(tmp_path), model=model_config("tiny-gpt"), train=TrainConfig(steps=10),
                       availability=AvailabilityConfig(workers=2, trace="p3"))  # fmt: skip
    where = tmp_path / JOB_FILE
    previous = json.loads(json.dumps(before.to_dict()))
    check_same_job(previous, before.replace(train={"steps": 20}, control={"timeout_s": 60.0},
                                            checkpoint={"keep": 2, "resume": True}), where)  # fmt: skip
    with pytest.raises(ValueError, match=r"train\.seed: 0 -> 1.*availability\.workers: 2 -> 3"):
        check_same_job(previous, before.replace(train={"seed": 1}, availability={"workers": 3}), where)
    with pytest.raises(ValueError, match=r"model\.name: 'tiny-gpt' -> 'small-gpt'"):
        check_same_job(previous, before.replace(model=model_config("small-gpt")), where)


def test_the_cli_refuses_to_resume_a_job_with_other_settings(tmp_path):
    from typer.testing import CliRunner

    from parcae.cli import app
    from trainer.config import TrainConfig, model_config

    out = tmp_path / "job"
    out.mkdir()
    started = JobConfig(out_dir=str(out), model=model_config("tiny-gpt"), train=TrainConfig(steps=40),
                        availability=AvailabilityConfig(workers=2))  # fmt: skip
    (out / "job.json").write_text(json.dumps(started.to_dict()))
    r = CliRunner().invoke(app, ["train", "--workers", "2", "--out-dir", str(out), "--resume", "--seed", "7"])
    assert r.exit_code == 2 and "started with other settings" in r.stderr and "train.seed: 0 -> 7" in r.stderr
    assert "Traceback" not in r.output and not (out / "layers").exists()


def test_the_cli_and_the_flow_take_their_defaults_from_the_config_s_fields():
    import inspect

    from flows.train import train as train_flow
    from parcae.cli.train import train_cmd

    assert config_default(CheckpointConfig, "every") == CheckpointConfig().every
    assert config_default(TrainConfig, "stage_costs") == ()
    with pytest.raises(AttributeError, match="TrainConfig.no_such_field has no default"):
        config_default(TrainConfig, "no_such_field")
    cli = inspect.signature(train_cmd).parameters
    flow = inspect.signature(train_flow.fn).parameters
    for section, name, option in ((CheckpointConfig, "every", "checkpoint_every"), (TrainConfig, "seed", "seed"),
                                  (ControlPlaneConfig, "prepare", "prepare"), (CheckpointConfig, "keep",
                                  "keep_checkpoints")):  # fmt: skip
        assert cli[option].default == config_default(section, name), option
    for section, name, param in ((TrainConfig, "seed", "seed"), (ControlPlaneConfig, "timeout_s", "timeout_s")):
        assert flow[param].default == config_default(section, name), param


def test_a_job_file_takes_its_provider_s_notice_grace_unless_it_gives_one(tmp_path):
    """`trainer.load_job` (what `parcae train --config` and the train flow's config_file read): a file without
    control.notice_grace_s gets its provider's, as a job built from options does; one it gives is kept; the run's
    out_dir and resume replace the file's; a section that is not a table is named."""
    from trainer import ConfigError, load_job

    job = tmp_path / "fleet.toml"
    fleet = (f'out_dir = "{tmp_path / "a"}"\n\n[provider]\nname = "market"\noptions = {{trace = "p3", notice_s = 12.0}}'
             '\n\n[fleet]\nmax_instances = 2\nrecord_history = false\n')  # fmt: skip
    job.write_text(fleet)
    config, batch_given = load_job(job)
    assert config.control.notice_grace_s == 12.0 and config.out_dir == str(tmp_path / "a") and not batch_given
    job.write_text(fleet + "\n[control]\nnotice_grace_s = 7.0\n\n[train]\nglobal_batch = 8\n")
    config, batch_given = load_job(job, out_dir=tmp_path / "b", resume=False)
    assert config.control.notice_grace_s == 7.0 and batch_given
    assert config.out_dir == str(tmp_path / "b") and config.checkpoint.resume is False
    job.write_text("train = 3\n")
    with pytest.raises(ConfigError, match=r"fleet\.toml: train: must be a section of fields, got 3"):
        load_job(job)
