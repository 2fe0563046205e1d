"""Tests of durable checkpoints (`trainer.runtime.checkpoint_mirror`): the step protocol on a folder and on S3
(moto), a torn upload that is never taken for a checkpoint, pruning, the workers' uploads and the driver's
manifests failing loudly, and a worker's restore from its own disk or from the URI. The real jobs are elsewhere:
a spot fleet on `moto_server` whose killed driver is resumed by a second one from S3
(`tests/test_trainer_agent.py`), hosts that share no disk through a checkpoint-restart (`tests/test_trainer_hosts.py`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)
from moto import mock_aws
from typer.testing import CliRunner

from parcae.cli import app
from trainer import export_from_uri, export_state_dict
from trainer.config import TrainConfig, model_config
from trainer.runtime import checkpoint
from trainer.runtime.checkpoint import HeldOut
from trainer.runtime.checkpoint_mirror import (
    FileMirror,
    MirrorError,
    S3Mirror,
    ShardUploader,
    StepCommitter,
    gather_shards,
    mirror_for,
)
from trainer.runtime.model import layer_names
from trainer.runtime.pipeline import StageLayout, build_context

ROOT = Path(__file__).resolve().parent.parent
CFG = model_config("tiny-gpt", dtype="float64")


def write_checkpoint(directory: Path, step: int) -> None:
    """A real, complete one-shard checkpoint of tiny-gpt at `step` (as a single process writes it)."""
    ctx = build_context(CFG, TrainConfig(), StageLayout.even(1, 1, CFG))
    checkpoint.save(checkpoint.shard_path(directory, step), ctx.layer_states(), step=step, config=CFG, job="job")


def protocol(mirror, local: Path, fresh: Path) -> None:
    layers = layer_names(CFG)
    for s in (10, 20, 30):
        write_checkpoint(local, s)
        mirror.upload_step(local, s)
    assert mirror.steps() == [30, 20, 10]
    # a torn upload of step 40: its files but no manifest — not a checkpoint at the URI
    write_checkpoint(local, 40)
    for p in checkpoint.step_files(local, 40):
        mirror.put(p.name, p)
    assert mirror.steps() == [30, 20, 10]
    assert mirror.prune(2) == [10] and mirror.steps() == [30, 20]
    assert not any(n.startswith("step00000010") for n in mirror.list_names())
    # a fresh machine: the newest complete copy comes down, and verifies as any checkpoint
    assert mirror.fetch_latest(fresh, layers, job="job") == 30
    assert checkpoint.latest_intact(fresh, layers, job="job").step == 30
    assert mirror.fetch_latest(fresh, layers, job="job") is None  # nothing newer there
    with pytest.raises(MirrorError, match="not a complete checkpoint"):
        mirror.upload_step(local, 50)
    # held-out losses beside the steps: the best-scored complete step outlives the retention
    mirror.record_val(20, HeldOut({"loss": 0.5}), job="job")
    mirror.record_val(30, HeldOut({"loss": 0.7}), job="job")
    mirror.record_val(40, HeldOut({"loss": 0.1}), job="job")  # (40 is not complete at the URI: no manifest)
    assert mirror.best_validated(job="job") == (20, HeldOut({"loss": 0.5}))
    assert mirror.best_validated(job="another") is None
    write_checkpoint(local, 50)
    mirror.upload_step(local, 50)
    assert mirror.prune(1, job="job") == [30] and mirror.steps() == [50, 20]
    assert not any(n.startswith("step00000030") for n in mirror.list_names())
    # parcae export of the URI: the best-scored step, the newest, a given one — downloaded and verified
    res = CliRunner().invoke(app, ["export", mirror.uri, "--best", "--out", str(fresh / "best.pt")])
    assert res.exit_code == 0 and "step 20, validation loss 0.5000)" in res.output, res.output
    assert torch.load(fresh / "best.pt").keys() == export_state_dict(local, 20).state.keys()
    assert export_from_uri(mirror.uri).step == 50 and export_from_uri(mirror.uri, 20).val_loss == 0.5
    res = CliRunner().invoke(app, ["export", mirror.uri, "--step", "30", "--out", str(fresh / "x.pt")])
    assert res.exit_code == 2 and "no complete checkpoint of step 30 there (complete: 50, 20)" in res.output


def test_the_step_protocol_on_a_folder(tmp_path):
    mirror = mirror_for(f"file://{tmp_path / 'durable'}")
    assert isinstance(mirror, FileMirror)
    protocol(mirror, tmp_path / "local", tmp_path / "fresh")


def test_the_step_protocol_on_s3(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        import boto3

        boto3.client("s3").create_bucket(Bucket="ckpt")
        mirror = mirror_for("s3://ckpt/jobs/a")
        assert isinstance(mirror, S3Mirror) and (mirror.bucket, mirror.prefix) == ("ckpt", "jobs/a")
        protocol(mirror, tmp_path / "local", tmp_path / "fresh")
        keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="ckpt")["Contents"]]
        assert all(k.startswith("jobs/a/step000000") for k in keys)


def test_bad_uris_and_a_failed_upload_are_said(tmp_path):
    for uri, says in [("http://x/y", "expected file:///path or s3://"), ("file://host/x", "absolute folder"),
                      ("s3:///x", "name the bucket")]:  # fmt: skip
        with pytest.raises(MirrorError, match=says):
            mirror_for(uri)
    # a worker's upload of a shard that is not there: handed back as failed, the thread goes on
    mirror = FileMirror(tmp_path / "durable", "file://x")
    uploads = ShardUploader(mirror)
    uploads.submit(("s", 10), [tmp_path / "gone.pt"])
    write_checkpoint(tmp_path / "local", 10)
    uploads.submit(("s", 20), checkpoint.step_files(tmp_path / "local", 10))
    uploads.flush()
    assert [tag for tag, _ in uploads.done()] == [("s", 20)] and uploads.done() == []
    ((tag, why),) = uploads.failed()
    assert tag == ("s", 10) and "gone.pt" in why
    # the driver's manifest of a step whose mirror refuses writes: recorded, not raised

    class Refusing(FileMirror):
        def put_bytes(self, name, data):
            raise PermissionError(f"{name}: access denied")

    committer = StepCommitter(Refusing(tmp_path / "ro", "file://ro"))
    committer.submit(10, {"step00000010.stage0.pt": 1}, {"step00000010.stage0.pt": ["wte"]})
    committer.record_val(10, HeldOut({"loss": 0.5}))
    committer.close()
    assert committer.uploaded == [] and "access denied" in committer.errors[0]
    assert committer.errors[1].startswith("step 10 (its held-out loss): PermissionError")


def test_the_committer_keeps_the_best_scored_step_at_the_uri_as_the_losses_come(tmp_path):
    """Each held-out loss is recorded after its step's manifest, and the retention runs again: a step that became
    the best-scored outlives `keep`, one that stopped being it goes at the next prune."""
    local, mirror = tmp_path / "local", FileMirror(tmp_path / "durable", "file://durable")
    pruned: list[int] = []
    committer = StepCommitter(mirror, keep=1, job="job", on_upload=pruned.append)
    for step, loss in ((10, 0.5), (20, 0.4), (30, 0.6)):
        write_checkpoint(local, step)
        files = {p.name: p.stat().st_size for p in checkpoint.step_files(local, step)}
        for p in checkpoint.step_files(local, step):
            mirror.put(p.name, p)
        committer.submit(step, files, checkpoint.shard_layers(local, step))
        committer.record_val(step, HeldOut({"loss": loss}))
    committer.close()
    assert committer.errors == [] and committer.uploaded == [10, 20, 30] and pruned == [10, 10, 20, 20, 30, 30]
    assert mirror.steps() == [30, 20] and mirror.best_validated(job="job") == (20, HeldOut({"loss": 0.4}))


def test_a_worker_loads_its_layers_from_its_disk_or_fetches_them_from_the_uri(tmp_path):
    """`gather_shards`: a shard on this disk that matches its record is read in place; one this disk lacks, or
    whose copy is damaged, comes from the URI; without a URI the error says the disk is not shared and what to
    give. Only the shards holding the wanted layers are read."""
    layers = layer_names(CFG)
    ctx = build_context(CFG, TrainConfig(), StageLayout.even(1, 1, CFG))
    states = ctx.layer_states()
    written = tmp_path / "written"
    half = len(layers) // 2
    cut = {checkpoint.shard_path("", 10, k).name: part for k, part in enumerate([layers[:half], layers[half:]])}
    for name, part in cut.items():
        checkpoint.save(written / name, {n: states[n] for n in part}, step=10, config=CFG, job="job")
    mirror = FileMirror(tmp_path / "durable", "file://durable")
    for name in cut:
        mirror.upload_files([written / name, checkpoint.record_path(written / name)])
    here, scratch = tmp_path / "here", tmp_path / "scratch"
    here.mkdir()
    first = list(cut)[0]
    for f in (written / first, checkpoint.record_path(written / first)):
        (here / f.name).write_bytes(f.read_bytes())
    # the first stage's layers: on this disk
    assert gather_shards(here, 10, cut, layers[:1], mirror, scratch) == [here / first]
    # the second's: not here, fetched
    second = list(cut)[1]
    assert gather_shards(here, 10, cut, layers[-1:], mirror, scratch) == [scratch / second]
    loaded = checkpoint.load([here / first, scratch / second], config=CFG, job="job")
    assert set(loaded.layers) == set(layers)
    # a bit flipped in the local copy: fetched instead
    raw = bytearray((here / first).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (here / first).write_bytes(bytes(raw))
    assert gather_shards(here, 10, cut, layers[:1], mirror, tmp_path / "s2") == [tmp_path / "s2" / first]
    # no URI: said, with the fix
    with pytest.raises(checkpoint.CheckpointError, match=r"not on this instance's disk.*--checkpoint-uri"):
        gather_shards(here, 10, cut, layers[-1:], None, scratch)
    with pytest.raises(checkpoint.CheckpointError, match=r"could not be fetched from file://empty \(FileNotFound"):
        gather_shards(here, 10, cut, layers[-1:], FileMirror(tmp_path / "empty", "file://empty"), scratch)
    with pytest.raises(checkpoint.CheckpointError, match="holds no shard of layers"):
        gather_shards(here, 10, {first: cut[first]}, layers, mirror, scratch)


def test_train_names_a_bad_checkpoint_uri():
    from typer.testing import CliRunner

    from parcae.cli import app

    res = CliRunner().invoke(app, ["train", "--checkpoint-uri", "ftp://x"])
    assert res.exit_code != 0 and "--checkpoint-uri: expected file:///path or s3://bucket/prefix" in res.output


# ------------------------------------------------------------------------------------ checked before training


@pytest.fixture
def fake_aws(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield


def test_a_checkpoint_uri_is_checked_before_the_job_trains(tmp_path, fake_aws, monkeypatch):
    """A URI the job cannot write to (a bucket that does not exist, no credentials, a folder under a file) is one
    error that names the URI, why and the fix — before any worker starts; a good one is left as it was found."""
    import boto3

    from trainer.control.run import check_checkpoint_uri

    boto3.client("s3").create_bucket(Bucket="ckpt")
    check_checkpoint_uri(mirror_for("s3://ckpt/jobs/a"))
    assert "Contents" not in boto3.client("s3").list_objects_v2(Bucket="ckpt")  # the probe removed its object
    with pytest.raises(MirrorError, match=r"s3://nosuch/p: the job could not keep a checkpoint there: .*NoSuchBucket.*"
                                          r"Fix: the checkpoint URI's bucket does not exist"):  # fmt: skip
        check_checkpoint_uri(mirror_for("s3://nosuch/p"))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(MirrorError, match="a-file/ck: the job could not keep a checkpoint there: .*Not a directory"):
        check_checkpoint_uri(mirror_for(f"file://{tmp_path / 'a-file' / 'ck'}"))
    check_checkpoint_uri(mirror_for(f"file://{tmp_path / 'new' / 'ck'}"))  # a folder that does not exist yet: made
    assert list((tmp_path / "new" / "ck").iterdir()) == []


def test_s3_without_credentials_says_what_to_set(tmp_path, monkeypatch):
    from trainer.control.run import check_checkpoint_uri

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # (no instance role to ask here)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # boto3's default session keeps the credentials it found first: an earlier test's (moto's) would be found here
    monkeypatch.setattr("boto3.DEFAULT_SESSION", None)
    with pytest.raises(MirrorError) as caught:
        check_checkpoint_uri(mirror_for("s3://ckpt/p"))
    said = str(caught.value)
    assert "no AWS credentials found, and a checkpoint URI on S3 needs them" in said and "AWS_PROFILE" in said
    assert "s3:PutObject" in said and "ec2:RunInstances" not in said


def test_parcae_train_refuses_a_checkpoint_uri_it_cannot_write_before_starting(tmp_path, fake_aws):
    from typer.testing import CliRunner

    from parcae.cli import app

    res = CliRunner().invoke(app, ["train", "--workers", "2", "--steps", "4", "--out-dir", str(tmp_path / "job"),
                                   "--checkpoint-uri", "s3://nosuch/p"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert "error: checkpoint.uri (--checkpoint-uri) s3://nosuch/p" in res.output and "NoSuchBucket" in res.output
    assert not (tmp_path / "job" / "layers").exists()  # nothing trained


def test_parcae_train_says_at_the_end_which_copies_failed(capsys):
    from parcae.cli.train import _warn_uncopied

    _warn_uncopied({"checkpoint_uri": {"uri": "s3://b/p", "uploaded": [4], "errors": ["step 8: OSError: disk", "w"]}})
    said = capsys.readouterr().err
    assert "warning: 2 copies to s3://b/p failed (step 8: OSError: disk; w)" in " ".join(said.split())
    assert "checkpoints of steps [4]" in said
    _warn_uncopied({"checkpoint_uri": {"uri": "s3://b/p", "uploaded": [4, 8], "errors": []}})
    assert capsys.readouterr().err == ""


def test_the_train_flow_s_summary_lists_the_failed_copies():
    from tasks.tracking import _uri_lines

    assert _uri_lines(None) == []
    ok = _uri_lines({"uri": "s3://b/p", "uploaded": [4, 8], "errors": []})
    assert ok == ["", "Copied to `s3://b/p`: the checkpoints of steps [4, 8]."]
    bad = _uri_lines({"uri": "s3://b/p", "uploaded": [], "errors": ["worker 0: final layers of stage 0: denied"]})
    assert "the checkpoints of steps none" in bad[1] and "**1 copy failed**" in bad[3]
    assert bad[-1] == "- worker 0: final layers of stage 0: denied"
