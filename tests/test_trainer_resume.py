"""Tests of resuming a job from its last checkpoint (`run_job(resume=True)`): the process running the job (the
driver, e.g. a Prefect flow) is SIGKILLed mid-run — its worker processes must not outlive it — and the same call
started again continues from the latest complete checkpoint, with the instances and strategy the schedule had there,
and ends with exactly the parameters of an uninterrupted run (float64, same strategies: bit for bit). A checkpoint of
another job or model, or a corrupt file, is refused by name; without a checkpoint the job starts from scratch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _jobs import run_job
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)

from trainer.config import TrainConfig, model_config
from trainer.control.dry_run import ScheduleError
from trainer.observe.observer import RecordingObserver
from trainer.runtime import checkpoint
from trainer.runtime.model import layer_names
from trainer.runtime.pipeline import StageLayout, build_context

ROOT = Path(__file__).resolve().parents[1]
CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()
STEPS = 12
# worker 3 preempted at 2 (2x2 -> 1x2 on 0-2); at 8 an added instance (id 4) and a plan back to 2x2
EVENTS = [
    {"step": 2, "kind": "preempt", "instances": [3]},
    {"step": 8, "kind": "add", "workers": 1},
    {"step": 8, "kind": "plan", "strategy": [2, 2]},
]

# The driver process: runs the job and SIGKILLs itself once a checkpoint of step >= 6 is complete, after writing
# down its descendants (the worker processes, and the fork server they are forked from).
DRIVER = r"""
import json, os, signal, sys
from trainer.config import TrainConfig, model_config
from trainer.observe.observer import JobObserver
from _jobs import run_job

def descendants(pid):
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out

class KillAtCheckpoint(JobObserver):
    def on_checkpoint(self, step, directory):
        if step >= 6:
            with open(sys.argv[2], "w") as f:
                json.dump({"step": step, "pids": descendants(os.getpid())}, f)
            os.kill(os.getpid(), signal.SIGKILL)

run_job(model_config("tiny-gpt", dtype="float64"), TrainConfig(), 4, (2, 2), int(sys.argv[3]), json.loads(sys.argv[4]),
        sys.argv[1], checkpoint_every=3, start_method=sys.argv[5], observer=KillAtCheckpoint(), timeout_s=120)
"""


@pytest.fixture(autouse=True)
def _no_orphans_here(_no_orphans):
    yield


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _job(out: Path, **kw) -> dict:
    return run_job(CFG, TRAIN, 4, (2, 2), STEPS, EVENTS, out, checkpoint_every=3, timeout_s=90, **kw)  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("uninterrupted") / "job"
    return out, _job(out)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc to find the worker processes")
def test_a_killed_driver_leaves_no_worker_and_the_job_resumes_where_it_was(tmp_path, uninterrupted):
    out, marker = tmp_path / "job", tmp_path / "killed.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(out), str(marker), str(STEPS), json.dumps(EVENTS),
                           "forkserver"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    killed = json.loads(marker.read_text())
    assert len(killed["pids"]) >= 4  # the fork server and the workers it forked
    deadline = time.monotonic() + 30
    while any(_running(p) for p in killed["pids"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in killed["pids"] if _running(p)], "worker processes outlived their driver"

    rec = RecordingObserver()
    result = _job(out, resume=True, observer=rec)
    r = result["resumed_from"]
    assert r >= killed["step"] >= 6 and r % 3 == 0 and result["first_step"] == r
    assert f"checkpoint of step {r}" in result["resume_note"]
    assert rec.calls[0][1]["resumed_from"] == r and [s.step for s in rec.of("step")] == list(range(r, STEPS))
    # the instances the schedule had at r (worker 3 preempted before), the add at 8 numbered on from there
    start = next(e for e in result["events"] if e["event"] == "start")
    assert start["workers"] == [0, 1, 2] and start["resumed_from"] == r
    if r < 8:
        assert 4 in result["exit_codes"] and [x["strategy"] for x in result["reconfigurations"]] == [[2, 2]]
    # exactly the uninterrupted run, and its losses from r on
    _, ref = uninterrupted
    assert result["final_checksum"] == ref["final_checksum"]
    assert result["loss"] == ref["loss"][r:]


def test_resuming_a_finished_job_refuses_or_trains_on_from_its_final_parameters(uninterrupted, tmp_path):
    """A finished job is not retrained: with the same steps resume refuses (its final weights stay); with more
    steps it trains on from the final parameters, never replacing them with an earlier checkpoint's."""
    out, ref = uninterrupted
    job = tmp_path / "job"
    shutil.copytree(out, job)
    final = {p.name: p.read_bytes() for p in checkpoint.find_shards(job / "layers", STEPS)}
    with pytest.raises(ScheduleError, match=rf"job 'job' has finished: it trained {STEPS} steps .*more steps than"):
        _job(job, resume=True)
    assert {p.name: p.read_bytes() for p in checkpoint.find_shards(job / "layers", STEPS)} == final
    longer = run_job(CFG, TRAIN, 4, (2, 2), STEPS + 2, EVENTS, job, checkpoint_every=3,
                     timeout_s=90, resume=True)  # fmt: skip
    assert longer["resumed_from"] == STEPS and len(longer["loss"]) == 2
    # the finished run's final parameters are now the checkpoint the longer run started from
    assert {p.name: p.read_bytes() for p in checkpoint.find_shards(job / "checkpoints", STEPS)} == final


def test_resume_skips_a_corrupt_latest_checkpoint_for_the_newest_intact_one(uninterrupted, tmp_path):
    """Sixteen bytes of the latest checkpoint overwritten with 0xFF: refused, named, and the job resumes from the
    checkpoint before it, ending with the uninterrupted run's parameters."""
    out, ref = uninterrupted
    job = tmp_path / "job"
    shutil.copytree(out, job)
    shutil.rmtree(job / "layers")  # as if the job had been killed after its last checkpoint
    latest = max(checkpoint.checkpoint_steps(job / "checkpoints"))
    shard = checkpoint.find_shards(job / "checkpoints", latest)[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = b"\xff" * 16
    shard.write_bytes(bytes(data))
    result = _job(job, resume=True)
    assert result["resumed_from"] == latest - 3
    assert f"skipped step {latest} ({shard.name}: " in result["resume_note"] and "sha256" in result["resume_note"]
    assert result["final_checksum"] == ref["final_checksum"] and result["loss"] == ref["loss"][latest - 3 :]


def _layers(names=None) -> dict:
    states = build_context(CFG, TRAIN, StageLayout.even(1, 1, CFG)).layer_states()
    return {n: states[n] for n in (names or layer_names(CFG))}


def test_resume_refuses_checkpoints_of_another_job_or_model_and_corrupt_files(tmp_path):
    ckdir = tmp_path / "job" / "checkpoints"
    foreign = checkpoint.save(checkpoint.shard_path(ckdir, 6), _layers(), step=6, config=CFG, job="other-job")
    with pytest.raises(
        ScheduleError,
        match=rf"cannot resume from .*: {foreign.name} \(step 6\) is not this job's checkpoint \(of job 'other-job'",
    ):
        _job(tmp_path / "job", resume=True)
    foreign.unlink()
    other = model_config("tiny-gpt", dtype="float64", seed=3)
    path = checkpoint.save(checkpoint.shard_path(ckdir, 6), _layers(), step=6, config=other, job="job")
    with pytest.raises(ScheduleError, match=rf"{path}: checkpoint of another model config \(seed: file has 3"):
        _job(tmp_path / "job", resume=True)
    path.write_bytes(b"not a checkpoint")  # the only checkpoint, damaged: refused rather than restarted silently
    with pytest.raises(
        ScheduleError, match=rf"no intact checkpoint; skipped step 6 \({path.name}: 16 bytes, its hash record says"
    ):
        _job(tmp_path / "job", resume=True)
    path.unlink()
    (ckdir / "notes.txt").write_text("mine")
    with pytest.raises(ScheduleError, match=r"holds files that are not this job's checkpoints \(notes\.txt\)"):
        _job(tmp_path / "job", resume=True)
    with pytest.raises(ScheduleError, match=r"already holds files .* or resume \(--resume\)"):
        _job(tmp_path / "job")


def test_resume_without_a_complete_checkpoint_starts_from_scratch(tmp_path):
    ckdir = tmp_path / "job" / "checkpoints"
    names = layer_names(CFG)
    part = checkpoint.save(checkpoint.shard_path(ckdir, 3, 0), _layers(names[:3]), step=3, config=CFG, job="job")
    result = run_job(CFG, TRAIN, 2, (1, 2), 4, [], tmp_path / "job", timeout_s=60, resume=True)  # fmt: skip
    assert result["resumed_from"] is None and result["first_step"] == 0 and len(result["loss"]) == 4
    assert "no complete checkpoint" in result["resume_note"] and "started from step 0" in result["resume_note"]
    assert not part.exists()  # the killed run's incomplete checkpoint was cleared


def test_every_checkpoint_records_the_settings_of_the_job_that_wrote_it(uninterrupted):
    """A checkpoint says what wrote it: the job's whole `JobConfig` as a dict, beside the layers."""
    out, _ = uninterrupted
    shards = sorted((out / "checkpoints").glob("*.pt"))
    assert shards
    for shard in shards:
        data = torch.load(shard, map_location="cpu", weights_only=True)
        assert data["settings"]["job"] == "job" and data["settings"]["train"]["steps"] == STEPS
        assert data["settings"]["model"] == CFG.to_dict() and data["settings"]["checkpoint"]["every"] == 3
