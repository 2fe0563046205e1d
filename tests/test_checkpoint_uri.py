"""Tests of durable checkpoints (`trainer.runtime.checkpoint_mirror`): the step protocol on a folder and on S3
(moto), a torn upload that is never taken for a checkpoint, pruning, and real jobs: `parcae train
--checkpoint-uri s3://...` against a `moto_server`, its driver SIGKILLed after a checkpoint was copied and a torn
upload of a newer one left behind, then resumed by a second driver on a fresh out-dir (a fresh machine) from the
copy — ending with the uninterrupted run's losses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _ec2_standin import moto_server_env
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)
from moto import mock_aws

from trainer.config import TrainConfig, model_config
from trainer.runtime import checkpoint
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
from trainer.runtime.pipeline import StageLayout, build_context, train_step

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
    committer.close()
    assert committer.uploaded == [] and "access denied" in committer.errors[0]


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
    with pytest.raises(checkpoint.CheckpointError, match="holds no shard of layers"):
        gather_shards(here, 10, {first: cut[first]}, layers, mirror, scratch)


def reference(steps: int) -> list[float]:
    ctx = build_context(CFG, TrainConfig(), StageLayout.even(1, 1, CFG))
    return [train_step(ctx, s) for s in range(steps)]


def test_a_killed_driver_s_job_resumes_on_a_fresh_machine_from_s3(tmp_path, monkeypatch, _no_orphans):
    """`parcae train --checkpoint-uri s3://ckpt/job` on a moto_server; the driver (and its workers) SIGKILLed once
    two checkpoints are copied; a torn upload of a newer step left in the bucket; a second driver on a fresh
    out-dir resumes from the newest complete copy and ends with the uninterrupted run's losses."""
    steps = 30
    with moto_server_env(monkeypatch, tmp_path, "us-east-1") as session:
        s3 = session.client("s3")
        s3.create_bucket(Bucket="ckpt")
        uri = "s3://ckpt/job"
        args = [sys.executable, "-m", "parcae.cli", "train", "--workers", "2", "--steps", str(steps),
                "--checkpoint-every", "5", "--keep-checkpoints", "2", "--checkpoint-uri", uri,
                "--model-args", '{"dtype": "float64"}', "--device", "cpu"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        first = subprocess.Popen([*args, "--out-dir", str(tmp_path / "a")], cwd=tmp_path, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        mirror = S3Mirror("ckpt", "job", uri, s3)
        end = time.monotonic() + 120
        while len(mirror.steps()) < 2 and time.monotonic() < end and first.poll() is None:
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its workers at once: the machine is gone
        first.wait(30)
        err = first.stderr.read().decode(errors="replace")[-2000:] if first.stderr else ""
        copied = mirror.steps()
        assert len(copied) >= 2 and copied[0] < steps, (copied, err)
        newest = copied[0]
        # a torn upload of a newer step: its shard reached S3, the manifest never did
        torn = tmp_path / "torn"
        write_checkpoint(torn, newest + 5)
        shard = checkpoint.step_files(torn, newest + 5)[0]
        mirror.put(shard.name, shard)
        # a second driver on a fresh machine: nothing local, the same job resumed from the newest complete copy
        out = tmp_path / "report.json"
        second = subprocess.run([*args, "--out-dir", str(tmp_path / "b"), "--resume", "--json", str(out)],
                                cwd=tmp_path, env=env, capture_output=True, timeout=300, text=True)  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]
        assert mirror.steps() == [steps - 5, steps - 10]  # the second driver's own copies, pruned to two
    report = json.loads(out.read_text())
    assert report["resumed_from"] == newest and report["first_step"] == newest
    assert report["loss"] == pytest.approx(reference(steps)[newest:], rel=1e-6)
    assert report["checkpoint_uri"]["uri"] == uri and not report["checkpoint_uri"]["errors"]


def test_train_names_a_bad_checkpoint_uri():
    from typer.testing import CliRunner

    from parcae.cli import app

    res = CliRunner().invoke(app, ["train", "--checkpoint-uri", "ftp://x"])
    assert res.exit_code != 0 and "--checkpoint-uri: expected file:///path or s3://bucket/prefix" in res.output
