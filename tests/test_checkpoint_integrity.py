"""Tests of checkpoints that prove their integrity (trainer.runtime.checkpoint): hash records written after the shard,
verified loads, non-finite state refused on save and on load, the newest intact checkpoint chosen over a corrupt
newer one, retention, and durable renames.

Small synthetic layer states (a few tensors per layer), no processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import torch

from trainer.config import model_config
from trainer.runtime import checkpoint
from trainer.runtime.checkpoint import CheckpointError, HeldOut
from trainer.runtime.model import layer_names
from trainer.runtime.validation import Monitor

CFG = model_config("tiny-gpt")
NAMES = layer_names(CFG)  # embed, block.0..3, head
JOB = "job-a"
STAGES = [NAMES[:3], NAMES[3:]]


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "param/weight": torch.randn(8, 8, generator=g),
        "exp_avg/weight": torch.randn(8, 8, generator=g),
        "exp_avg_sq/weight": torch.rand(8, 8, generator=g),
        "step/weight": torch.tensor(3.0),
    }


def layers(names, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    return {n: state(seed * 100 + NAMES.index(n)) for n in names}


def write_step(directory: Path, step: int, *, job: str = JOB, stages=STAGES) -> list[Path]:
    """The sharded checkpoint of `step`: one shard per stage."""
    return [
        checkpoint.save(checkpoint.shard_path(directory, step, k), layers(names, step), step=step, config=CFG, job=job)
        for k, names in enumerate(stages)
    ]


def flip(path: Path, at: int | None = None, n: int = 16) -> None:
    """Overwrite `n` bytes of `path` with 0xFF, in place (what a bad disk or a stray write does)."""
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at : at + n] = b"\xff" * n
    path.write_bytes(bytes(data))


def test_save_writes_a_hash_record_of_the_file_bytes(tmp_path):
    shard, _ = write_step(tmp_path, 10)
    record = tmp_path / "step00000010.stage0.sha256"
    assert checkpoint.record_path(shard) == record
    data = json.loads(record.read_text())
    assert data == {
        "format": checkpoint.RECORD_FORMAT, "file": shard.name, "size": shard.stat().st_size,
        "sha256": hashlib.sha256(shard.read_bytes()).hexdigest(), "step": 10, "job": JOB, "model": CFG.name,
        "layers": STAGES[0], "model_layers": NAMES,
    }  # fmt: skip
    assert checkpoint.read_record(shard).layers == tuple(STAGES[0])
    assert checkpoint.find_shards(tmp_path, 10) == [shard, tmp_path / "step00000010.stage1.pt"]  # not the records
    v = checkpoint.verify_step(tmp_path, 10, NAMES, job=JOB)
    assert (v.status, v.intact, v.problems) == ("intact", True, ())
    ckpt = checkpoint.load(checkpoint.find_shards(tmp_path, 10), config=CFG, job=JOB)
    assert all(torch.equal(ckpt.layers[n][k], t) for n, s in layers(NAMES, 10).items() for k, t in s.items())


def test_a_bit_flip_is_refused_and_the_previous_checkpoint_resumed(tmp_path):
    write_step(tmp_path, 10)
    _, bad = write_step(tmp_path, 20)
    flip(bad)  # sixteen bytes of 0xFF
    with pytest.raises(CheckpointError, match=r"step00000020\.stage1\.pt: corrupt checkpoint, sha256 mismatch"):
        checkpoint.load(checkpoint.find_shards(tmp_path, 20), config=CFG, job=JOB)
    with pytest.raises(CheckpointError, match=r"step00000020\.stage1\.pt: corrupt"):  # a partial load checks too
        checkpoint.load(bad, config=CFG, job=JOB, complete=False)

    v = checkpoint.verify_step(tmp_path, 20, NAMES, job=JOB)
    assert v.status == "corrupt" and v.problems[0].startswith("step00000020.stage1.pt: sha256 mismatch")
    found = checkpoint.latest_intact(tmp_path, NAMES, job=JOB)
    assert found.step == 10
    assert [p.name for p in found.files] == ["step00000010.stage0.pt", "step00000010.stage1.pt"]
    assert [(s.step, s.status) for s in found.skipped] == [(20, "corrupt")]
    note = found.note()
    assert note.startswith("skipped step 20 (step00000020.stage1.pt: sha256 mismatch") and note.endswith(
        "; resuming from step 10"
    )
    assert checkpoint.load(found.files, config=CFG, job=JOB).step == 10


def test_a_verified_shard_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    """A resume or an export verifies a step, then loads it: each settled shard is hashed once per process; a shard
    changed since (in place, or renamed over) is hashed again, and one changed just before its hash every time."""
    shards = write_step(tmp_path, 10)
    hashed: list[str] = []
    real = checkpoint._sha256

    def counted(f):  # (a writer's hash of its own file, opened by descriptor, is not counted)
        hashed.extend([Path(f.name).name] if isinstance(f.name, str) else [])
        return real(f)

    monkeypatch.setattr(checkpoint, "_sha256", counted)
    assert checkpoint.verify_step(tmp_path, 10, NAMES, job=JOB).intact  # written just now: not remembered
    checkpoint.load(shards, config=CFG, job=JOB)
    assert sorted(hashed) == sorted([s.name for s in shards] * 2)
    monkeypatch.setattr(checkpoint, "_SETTLED_NS", 0)  # (as a shard written a second before)
    hashed.clear()
    assert checkpoint.verify_step(tmp_path, 10, NAMES, job=JOB).intact
    checkpoint.load(shards, config=CFG, job=JOB)
    checkpoint.describe(shards[0])
    assert sorted(hashed) == sorted(s.name for s in shards)
    flip(shards[1])
    st = shards[1].stat()
    os.utime(shards[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # (its time moved, whatever the clock's tick)
    with pytest.raises(CheckpointError, match=r"step00000010\.stage1\.pt: corrupt checkpoint, sha256 mismatch"):
        checkpoint.load(shards, config=CFG, job=JOB)
    os.replace(write_step(tmp_path / "other", 10)[1], shards[1])  # the same bytes as a new file: hashed again
    hashed.clear()
    checkpoint.load(shards, config=CFG, job=JOB)
    assert hashed == [shards[1].name]


def test_a_flip_in_the_zip_header_is_caught_too(tmp_path):
    shard = checkpoint.save(tmp_path / "step00000010.pt", layers(NAMES), step=10, config=CFG, job=JOB)
    flip(shard, at=0, n=4)
    with pytest.raises(CheckpointError, match=r"step00000010\.pt: corrupt checkpoint, sha256 mismatch"):
        checkpoint.load(shard, config=CFG, job=JOB)


def test_a_truncated_shard_is_refused_and_skipped(tmp_path):
    write_step(tmp_path, 10)
    first, _ = write_step(tmp_path, 20)
    size = first.stat().st_size
    with open(first, "r+b") as f:
        f.truncate(size // 3)
    msg = rf"step00000020\.stage0\.pt: corrupt checkpoint, {size // 3} bytes, its hash record says {size} \(truncated"
    with pytest.raises(CheckpointError, match=msg):
        checkpoint.load(checkpoint.find_shards(tmp_path, 20), config=CFG, job=JOB)
    found = checkpoint.latest_intact(tmp_path, NAMES, job=JOB)
    assert found.step == 10 and found.skipped[0].status == "corrupt"
    assert "step00000020.stage0.pt: " in found.note() and "truncated" in found.note()


def test_a_shard_without_its_hash_record_is_unverified(tmp_path):
    write_step(tmp_path, 10)
    _, legacy = write_step(tmp_path, 20)
    checkpoint.record_path(legacy).unlink()  # as written before hash records existed
    with pytest.raises(CheckpointError, match=r"step00000020\.stage1\.pt: unverified, no hash record "
                                              r"step00000020\.stage1\.sha256 .*allow_unverified=True"):  # fmt: skip
        checkpoint.load(checkpoint.find_shards(tmp_path, 20), config=CFG, job=JOB)
    assert checkpoint.load(checkpoint.find_shards(tmp_path, 20), config=CFG, job=JOB, allow_unverified=True).step == 20

    v = checkpoint.verify_step(tmp_path, 20, NAMES, job=JOB)
    assert v.status == "unverified" and "step00000020.stage1.pt: unverified, no hash record" in v.problems[0]
    found = checkpoint.latest_intact(tmp_path, NAMES, job=JOB)
    assert found.step == 10 and [(s.step, s.status) for s in found.skipped] == [(20, "unverified")]
    assert "skipped step 20 (step00000020.stage1.pt: unverified" in found.note()


def test_a_writer_dying_between_shard_and_record_leaves_the_step_unverified(tmp_path, monkeypatch):
    write_step(tmp_path, 10)
    checkpoint.save(checkpoint.shard_path(tmp_path, 20, 0), layers(STAGES[0]), step=20, config=CFG, job=JOB)

    def killed(path, rec):
        raise KeyboardInterrupt("killed after the shard, before its record")

    monkeypatch.setattr(checkpoint, "_write_record", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(checkpoint.shard_path(tmp_path, 20, 1), layers(STAGES[1]), step=20, config=CFG, job=JOB)
    monkeypatch.undo()
    assert (tmp_path / "step00000020.stage1.pt").is_file()
    assert not (tmp_path / "step00000020.stage1.sha256").exists()
    found = checkpoint.latest_intact(tmp_path, NAMES, job=JOB)
    assert found.step == 10 and found.skipped[0].status == "unverified"


def test_incomplete_and_foreign_checkpoints_are_skipped_with_why(tmp_path):
    write_step(tmp_path, 10)
    write_step(tmp_path, 20, stages=STAGES[:1])  # stage 1 has not written yet
    write_step(tmp_path, 30, job="job-b")
    write_step(tmp_path, 40)
    (tmp_path / "step00000040.stage1.pt").unlink()  # its record stays behind
    found = checkpoint.latest_intact(tmp_path, NAMES, job=JOB)
    assert found.step == 10
    assert [(s.step, s.status) for s in found.skipped] == [(40, "incomplete"), (30, "foreign"), (20, "incomplete")]
    by_step = {s.step: s for s in found.skipped}
    assert "step00000040.stage1.sha256: its shard step00000040.stage1.pt is missing" in by_step[40].problems
    assert by_step[30].problems == ("of job 'job-b', expected job 'job-a'",)
    assert by_step[20].problems == ("missing layers ['block.2', 'block.3', 'head']",)
    assert checkpoint.latest_intact(tmp_path / "none", NAMES, job=JOB) == checkpoint.ResumePoint(None, ())


def test_a_record_moved_to_another_shard_does_not_vouch_for_it(tmp_path):
    a, b = write_step(tmp_path, 10)
    checkpoint.record_path(a).write_bytes(checkpoint.record_path(b).read_bytes())
    v = checkpoint.verify_step(tmp_path, 10, NAMES, job=JOB)
    assert v.status == "corrupt"
    assert v.problems[0] == "step00000010.stage0.pt: its hash record step00000010.stage0.sha256 is for " \
                            "'step00000010.stage1.pt'"  # fmt: skip
    checkpoint.record_path(a).write_text("{not json")
    assert (
        checkpoint.verify_step(tmp_path, 10, NAMES, job=JOB)
        .problems[0]
        .startswith("step00000010.stage0.sha256: not a hash record (JSONDecodeError")
    )
    with pytest.raises(CheckpointError, match=r"stage0\.pt: cannot be verified: step00000010\.stage0\.sha256 is not"):
        checkpoint.load(a, config=CFG, job=JOB, complete=False)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_save_refuses_non_finite_state(tmp_path, bad):
    states = layers(NAMES)
    states["block.2"]["exp_avg_sq/weight"][3, 4] = bad
    path = tmp_path / "step00000010.pt"
    with pytest.raises(CheckpointError, match=r"step00000010\.pt: refusing to checkpoint non-finite state of step "
                                              r"10: layer 'block.2' 'exp_avg_sq/weight' has"):  # fmt: skip
        checkpoint.save(path, states, step=10, config=CFG, job=JOB)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temporary file


def test_load_refuses_non_finite_state(tmp_path, monkeypatch):
    states = layers(NAMES)
    states["head"]["param/weight"][0, 0] = float("nan")
    monkeypatch.setattr(checkpoint, "_non_finite", lambda layers: None)  # a writer that did not check
    path = checkpoint.save(tmp_path / "step00000010.pt", states, step=10, config=CFG, job=JOB)
    monkeypatch.undo()
    assert checkpoint.verify_step(tmp_path, 10, NAMES, job=JOB).intact  # its bytes are what was written ...
    with pytest.raises(CheckpointError, match=r"step00000010\.pt: layer 'head' 'param/weight' has 1 NaN and 0 Inf"):
        checkpoint.load(path, config=CFG, job=JOB)  # ... but it is not a state to resume from


def _recorder(monkeypatch) -> list[tuple[str, str]]:
    """Record every fsync (of a directory or a file) and every rename, in order."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        events.append(("fsync", kind if kind == "dir" else Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        return real_fsync(fd)

    def replace(src, dst):
        assert not (str(dst).endswith(".pt") and checkpoint.record_path(dst).exists()), "old record left vouching"
        events.append(("replace", Path(dst).name))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc")
def test_the_record_is_written_after_the_shard_is_durable_and_directories_are_fsynced(tmp_path, monkeypatch):
    events = _recorder(monkeypatch)
    path = checkpoint.save(checkpoint.shard_path(tmp_path, 10, 0), layers(STAGES[0]), step=10, config=CFG, job=JOB)
    tmp_shard, tmp_record = events[0][1], events[3][1]
    assert tmp_shard.startswith(".step00000010.stage0.pt.tmp-") and tmp_record.startswith(
        ".step00000010.stage0.sha256.tmp-"
    )
    assert events == [
        ("fsync", tmp_shard), ("replace", "step00000010.stage0.pt"), ("fsync", "dir"),  # the shard is durable
        ("fsync", tmp_record), ("replace", "step00000010.stage0.sha256"), ("fsync", "dir"),  # then its record
    ]  # fmt: skip

    # rewriting a step drops the old record (durably) before the new shard takes the name
    events.clear()
    checkpoint.save(path, layers(STAGES[0], seed=7), step=10, config=CFG, job=JOB)
    assert [e for e in events if e[0] == "replace" or e == ("fsync", "dir")] == [
        ("fsync", "dir"), ("replace", "step00000010.stage0.pt"), ("fsync", "dir"),
        ("replace", "step00000010.stage0.sha256"), ("fsync", "dir"),
    ]  # fmt: skip
    monkeypatch.undo()
    assert (
        checkpoint.load(path, config=CFG, job=JOB, complete=False)
        .layers["embed"]["param/weight"]
        .equal(layers(STAGES[0], seed=7)["embed"]["param/weight"])
    )


def test_prune_keeps_the_newest_intact_and_never_what_it_does_not_know(tmp_path):
    for s in (10, 20, 30, 40):
        write_step(tmp_path, s)
    write_step(tmp_path, 5)
    checkpoint.record_path(checkpoint.shard_path(tmp_path, 5, 1)).unlink()  # an old unverified one
    flip(checkpoint.shard_path(tmp_path, 40, 1))  # the newest is corrupt
    write_step(tmp_path, 50, stages=STAGES[:1])  # and one still being written
    strangers = ["notes.txt", "step00000010.stage0.pt.bak", "step10.pt", ".step00000060.stage0.pt.tmp-abc",
                 "step00000010.stage0.json"]  # fmt: skip
    for name in strangers:
        (tmp_path / name).write_text("not ours")
    (tmp_path / "sub").mkdir()
    before = {p.name for p in tmp_path.iterdir()}

    assert checkpoint.prune(tmp_path, 0, layers=NAMES, job=JOB) == []  # 0: keep all
    assert checkpoint.prune(tmp_path / "absent", 2) == []
    with pytest.raises(ValueError, match=r"keep must be an integer >= 0"):
        checkpoint.prune(tmp_path, -1)

    removed = checkpoint.prune(tmp_path, 2, layers=NAMES, job=JOB)
    gone = {p.name for p in removed}
    assert gone == {f"step{s:08d}.stage{k}.{ext}" for s in (10, 5) for k in (0, 1) for ext in ("pt", "sha256")} - {
        "step00000005.stage1.sha256"
    }
    assert {p.name for p in tmp_path.iterdir()} == before - gone
    assert set(strangers) | {"sub"} <= before - gone
    assert checkpoint.latest_intact(tmp_path, NAMES, job=JOB).step == 30

    # keep=1 still keeps the newest intact (30) and what is newer than it (40 corrupt, 50 incomplete); judged from
    # the records alone when no layers are given
    gone = {p.name for p in checkpoint.prune(tmp_path, 1)}
    assert gone == {f"step00000020.stage{k}.{ext}" for k in (0, 1) for ext in ("pt", "sha256")}
    left = sorted(p.name for p in tmp_path.iterdir() if checkpoint.is_checkpoint_file(p.name))
    assert [n for n in left if n.endswith(".pt")] == [
        "step00000030.stage0.pt", "step00000030.stage1.pt", "step00000040.stage0.pt", "step00000040.stage1.pt",
        "step00000050.stage0.pt",
    ]  # fmt: skip
    assert checkpoint.prune(tmp_path, 1, layers=NAMES, job=JOB) == []


def test_prune_keeps_the_best_scored_intact_checkpoint_beside_the_newest(tmp_path):
    for s in (10, 20, 30, 40, 50):
        write_step(tmp_path, s)
    for s, loss in ((10, 0.4), (20, 0.3), (30, 0.3), (40, 0.2), (50, 0.6)):  # 30 ties 20: not an improvement
        checkpoint.write_held_out(tmp_path, s, HeldOut({"loss": loss}), job=JOB)
    checkpoint.write_held_out(tmp_path, 5, HeldOut({"loss": 0.1}), job=JOB)  # a score whose checkpoint is gone
    (tmp_path / "step00000060.val.json").write_text("{torn")  # unreadable: as if never scored
    flip(checkpoint.shard_path(tmp_path, 40, 1))  # the best-scored one is corrupt: the next best is kept
    assert checkpoint.val_losses(tmp_path, job=JOB) == {5: 0.1, 10: 0.4, 20: 0.3, 30: 0.3, 40: 0.2, 50: 0.6}
    assert checkpoint.val_losses(tmp_path, job="job-b") == {}
    assert checkpoint.best_validated(tmp_path, NAMES, job=JOB) == (20, HeldOut({"loss": 0.3}))

    gone = {p.name for p in checkpoint.prune(tmp_path, 1, layers=NAMES, job=JOB)}
    files = {f"step{s:08d}.{f}" for s in (10, 30, 40) for f in ("stage0.pt", "stage1.pt", "stage0.sha256",
                                                                 "stage1.sha256", "val.json")}  # fmt: skip
    assert gone == files | {"step00000005.val.json"}
    left = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in left if n.endswith(".val.json")] == ["step00000020.val.json", "step00000050.val.json",
                                                            "step00000060.val.json"]  # fmt: skip
    assert checkpoint.latest_intact(tmp_path, NAMES, job=JOB).step == 50

    # parcae export --best: the best-scored intact checkpoint, and its loss; refused where nothing is scored
    from trainer import export_state_dict

    best = export_state_dict(tmp_path, best=True)
    assert (best.step, best.val_loss) == (20, 0.3) and export_state_dict(tmp_path).step == 50
    with pytest.raises(ValueError, match="not both"):
        export_state_dict(tmp_path, 20, best=True)
    for p in tmp_path.glob("*.val.json"):
        p.unlink()
    with pytest.raises(CheckpointError, match=r"no intact checkpoint has a held-out loss beside it"):
        export_state_dict(tmp_path, best=True)


def test_the_best_checkpoint_is_the_best_by_the_validation_s_monitor_in_its_direction(tmp_path):
    """A job that watches its accuracy (higher is better) keeps and exports the checkpoint with the highest one, not
    the lowest loss; the newest record's monitor ranks them (a resume may watch another score)."""
    from typer.testing import CliRunner

    from parcae.cli import app
    from trainer import export_state_dict

    for s in (10, 20, 30):
        write_step(tmp_path, s)
    accuracy = Monitor("accuracy", "max")
    for s, loss, acc in ((10, 0.3, 0.80), (20, 0.4, 0.90), (30, 0.5, 0.85)):
        checkpoint.write_held_out(tmp_path, s, HeldOut({"loss": loss, "accuracy": acc}, accuracy), job=JOB)
    assert checkpoint.best_validated(tmp_path, NAMES, job=JOB) == (
        20,
        HeldOut({"loss": 0.4, "accuracy": 0.9}, accuracy),
    )
    assert checkpoint.best_scored(checkpoint.held_out(tmp_path, job=JOB)) == [20, 30, 10]
    assert {p.name for p in checkpoint.prune(tmp_path, 1, layers=NAMES, job=JOB)} == {
        f"step00000010.{f}" for f in ("stage0.pt", "stage1.pt", "stage0.sha256", "stage1.sha256", "val.json")
    }
    best = export_state_dict(tmp_path, best=True)
    assert (best.step, best.val_loss, best.held_out.value) == (20, 0.4, 0.9)
    res = CliRunner().invoke(app, ["export", str(tmp_path), "--best", "--out", str(tmp_path / "best.pt")])
    assert res.exit_code == 0 and "step 20, validation accuracy 0.9000, loss 0.4000)" in res.output, res.output
    # the newest record ranks by the loss (a record written before monitors were kept does too): the lowest loss
    (tmp_path / "step00000030.val.json").write_text(json.dumps({"format": 1, "step": 30, "job": JOB, "val_loss": 0.35}))
    assert checkpoint.best_scored(checkpoint.held_out(tmp_path, job=JOB)) == [30, 20]
    # a record whose score under the newest monitor is not a number is not ranked
    nan = {5: HeldOut({"loss": 0.1, "accuracy": float("nan")}), 6: HeldOut({"loss": 0.2, "accuracy": 0.5}, accuracy)}
    assert checkpoint.best_scored(nan) == [6]
    # a record that lacks its own monitored score, or has no known mode, counts as no score
    for bad in ({"monitor": "accuracy"}, {"mode": "best"}):
        record = {"format": 1, "step": 30, "job": JOB, "val_loss": 0.35, **bad}
        assert checkpoint.parse_held_out(json.dumps(record).encode(), 30) is None


def test_prune_removes_nothing_without_an_intact_checkpoint(tmp_path):
    write_step(tmp_path, 10, stages=STAGES[:1])
    write_step(tmp_path, 20)
    flip(checkpoint.shard_path(tmp_path, 20, 0))
    assert checkpoint.prune(tmp_path, 1, layers=NAMES, job=JOB) == []
    assert checkpoint.prune(tmp_path, 1, layers=NAMES, job="job-b") == []  # another job's are not intact for us


def test_remove_after_and_remove_temporary_take_the_records_along(tmp_path):
    write_step(tmp_path, 10)
    write_step(tmp_path, 20)
    (tmp_path / ".step00000030.stage0.pt.tmp-x1").write_bytes(b"partial")
    (tmp_path / ".step00000030.stage0.sha256.tmp-x2").write_bytes(b"partial")
    (tmp_path / ".stepwise.tmp-x3").write_bytes(b"not ours")
    removed = {p.name for p in checkpoint.remove_after(tmp_path, 10)}
    assert removed == {f"step00000020.stage{k}.{ext}" for k in (0, 1) for ext in ("pt", "sha256")}
    removed = {p.name for p in checkpoint.remove_temporary(tmp_path)}
    assert removed == {".step00000030.stage0.pt.tmp-x1", ".step00000030.stage0.sha256.tmp-x2"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".stepwise.tmp-x3", "step00000010.stage0.pt", "step00000010.stage0.sha256", "step00000010.stage1.pt",
        "step00000010.stage1.sha256",
    ]  # fmt: skip
    assert checkpoint.is_checkpoint_file("step00000010.stage1.sha256")
    assert checkpoint.is_checkpoint_file("step00000010.pt")
    write_step(tmp_path, 30)  # remove_before: older steps go, records and shards, nothing else
    removed = {p.name for p in checkpoint.remove_before(tmp_path, 30)}
    assert removed == {f"step00000010.stage{k}.{ext}" for k in (0, 1) for ext in ("pt", "sha256")}
    assert checkpoint.checkpoint_steps(tmp_path) == [30] and (tmp_path / ".stepwise.tmp-x3").exists()
    assert not checkpoint.is_checkpoint_file(".step00000030.stage0.pt.tmp-x1")
