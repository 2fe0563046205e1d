"""Checkpoints keyed by layer name, so that they load into any D x P, and that prove their integrity.

Owns: the file format (shards and their hash records), atomic and durable writing, verified loading, the question
"which checkpoint here is intact?" and retention. Must not touch: processes, process groups, the store, optimiser
construction (it stores and returns `trainer.runtime.pipeline.layer_state` snapshots; installing them is
`StageContext.load_layer_states`). Every function here is file-level: the caller decides when to call it (a worker
saves its shard, the driver picks the resume point and prunes).

Format. A **shard** file holds `{"format": FORMAT, "layers": {name: layer_state}, "step": s, "config": ModelConfig as a
dict, "job": job_id, "settings": the job's JobConfig as a dict}` (read with `torch.load(weights_only=True, mmap=True)`:
a checkpoint is data, never code, mapped rather than read into the reader's memory). A checkpoint is **one shard or
several**: a single process writes `step{s:08d}.pt` with every layer; a distributed job lets one replica of each stage
write `step{s:08d}.stage{k}.pt` with that stage's layers (no gather through a single rank). Beside each shard its **hash
record** `step{s:08d}[.stage{k}].sha256` (JSON, `RECORD_FORMAT`: `file`, `size`, `sha256` of the shard's bytes, `step`,
`job`, `model`, `layers` it holds, `model_layers` — every layer of the model, so a record says on its own what a
complete checkpoint is). The record is the manifest written **last**: only after the shard is durable (fsync'ed,
renamed, directory fsync'ed). The shards of one step are written by different processes at different times, so each
carries its own record rather than one manifest per step that someone would have to write after all of them. A job that
validates keeps the **held-out scores** of a checkpoint beside it, `step{s:08d}.val.json` (JSON: `format`, `step`,
`job`, `val_loss`, `metrics`, and the `monitor` and `mode` the job ranks by), written by the driver once the boundary is
scored — after the shards, so outside their records —; retention keeps the best-scored intact checkpoint by them
(`best_validated`).

States of a step's checkpoint (`verify_step`): **intact** — every shard matches its record (size, sha256, file name,
step), the records agree on the job and cover every layer of the model exactly once; **corrupt** — a shard differs
from its record (a bit flip, a torn or truncated file), an unreadable record, or a layer in two shards; **foreign** —
another job's or another model's; **unverified** — a shard without a record (written before hash records existed,
or its writer stopped between the shard and the record): not used for resume, `load(..., allow_unverified=True)`
reads it; **incomplete** — layers missing (shards not all written yet, or a record without its shard). A checkpoint
being written is incomplete until its last record lands. `latest_intact` gives the newest intact step and why the
newer ones were skipped; `prune` keeps the newest N intact ones.

`load` verifies each shard against its record before parsing it, merges the shards, checks they agree on job,
config and step, that no layer appears twice and, by default, that every layer of the model is present, and refuses
NaN/Inf in any tensor (parameter or optimiser state). `save` refuses to write NaN/Inf: a checkpoint of a diverged
run is never written.

Writing is atomic and durable: shard and record each go to a temporary file in the same directory (same file
system), flushed and fsync'ed, `os.replace`d over the target, then the directory is fsync'ed so the rename survives
a power cut; a reader sees the old file or the new one, never a partial one. Temporary files are named
`.<name>.tmp-*` (hidden, never picked up by `find_shards`) and removed on error. Rewriting a step removes its old
record before replacing the shard, so a crash in between leaves an unverified shard, never a mismatched pair.

Versioning: `FORMAT` (1) is the shard payload, unchanged since before hash records, so older shards still read;
`RECORD_FORMAT` (1) is the hash record's own version. A reader refuses a format it does not know.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from io import BufferedIOBase
from pathlib import Path
from typing import Any, BinaryIO

import torch

from trainer.config import ModelConfig
from trainer.runtime.model import layer_names, model_fingerprint
from trainer.runtime.validation import Monitor

FORMAT = 1
RECORD_FORMAT = 1
RECORD_SUFFIX = ".sha256"
LayerState = dict[str, torch.Tensor]

_SHARD = re.compile(r"step(\d{8,})(?:\.stage(\d+))?\.pt")
_RECORD = re.compile(r"step(\d{8,})(?:\.stage(\d+))?\.sha256")
VAL_SUFFIX = ".val.json"
_VAL = re.compile(r"step(\d{8,})\.val\.json")
_TEMPORARY = re.compile(r"\.step\d{8,}(?:(?:\.stage\d+)?\.(?:pt|sha256)|\.val\.json)\.tmp-.+")
# worst first: a step with several problems is reported by the worst
STATUSES = ("corrupt", "foreign", "unverified", "incomplete")


class CheckpointError(Exception):
    """A checkpoint that cannot be used: unreadable, corrupt, unverified, non-finite, of another job or model,
    incomplete or inconsistent. The message names the file."""


class ForeignCheckpointError(CheckpointError):
    """An intact checkpoint of another job or another model config: not damage to skip, a folder mix-up."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded (possibly merged) checkpoint: every layer's state by name, at the start of step `step`."""

    step: int
    job: str
    config: ModelConfig
    layers: dict[str, LayerState]


@dataclass(frozen=True)
class ShardRecord:
    """A shard's hash record (`step….sha256`): what the shard's writer wrote once the shard was durable."""

    file: str
    size: int
    sha256: str
    step: int
    job: str
    model: str
    layers: tuple[str, ...]
    model_layers: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps({"format": RECORD_FORMAT, **{k: getattr(self, k) for k in self.__dataclass_fields__}},
                          indent=1)  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    """What `verify_step` found about the checkpoint of one step: `status` is "intact" or one of `STATUSES`;
    `problems` each name a file ("step00000020.stage1.pt: sha256 mismatch …")."""

    step: int
    status: str
    files: tuple[Path, ...]
    problems: tuple[str, ...] = ()

    @property
    def intact(self) -> bool:
        return self.status == "intact"

    def __str__(self) -> str:
        return f"step {self.step} ({'; '.join(self.problems) or 'intact'})"


@dataclass(frozen=True)
class ResumePoint:
    """`latest_intact`'s answer: the newest intact checkpoint (`step`, its shard `files`; `step` None when there is
    none) and the newer checkpoints passed over, newest first, each with why."""

    step: int | None
    files: tuple[Path, ...]
    skipped: tuple[Verdict, ...] = field(default=())

    def note(self) -> str:
        """One line for the user: "skipped step 20 (step00000020.stage1.pt: sha256 mismatch …); resuming from
        step 10"."""
        parts = [f"skipped {v}" for v in self.skipped]
        parts.append(f"resuming from step {self.step}" if self.step is not None else "no intact checkpoint")
        return "; ".join(parts)


# ---- names


def shard_path(directory: str | os.PathLike[str], step: int, stage: int | None = None) -> Path:
    """Conventional file name: `step{s}.pt` for a whole checkpoint, `step{s}.stage{k}.pt` for a stage's shard."""
    suffix = "" if stage is None else f".stage{stage}"
    return Path(directory) / f"step{step:08d}{suffix}.pt"


def record_path(shard: str | os.PathLike[str]) -> Path:
    """The hash record beside `shard`: `step00000020.stage1.pt` -> `step00000020.stage1.sha256`."""
    return Path(shard).with_suffix(RECORD_SUFFIX)


def is_checkpoint_file(name: str) -> bool:
    """Whether a file name is one this module writes and owns: a shard, a hash record or a held-out loss of the
    conventional names (temporary files are not: see `remove_temporary`)."""
    return bool(_SHARD.fullmatch(name) or _RECORD.fullmatch(name) or _VAL.fullmatch(name))


def _stage_key(p: Path) -> int:
    m = _SHARD.fullmatch(p.name)
    return -1 if m is None or m.group(2) is None else int(m.group(2))


def find_shards(directory: str | os.PathLike[str], step: int) -> list[Path]:
    """The finished shard files of the checkpoint at `step` in `directory`, whole file first, then by stage
    (temporary files are hidden dot-files, hash records are not shards)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [p for p in d.glob(f"step{step:08d}*.pt") if _step_of(p.name, _SHARD) == step and p.is_file()]
    return sorted(found, key=_stage_key)


def _step_of(name: str, *patterns: re.Pattern[str]) -> int | None:
    m = next((m for pattern in patterns if (m := pattern.fullmatch(name))), None)
    return int(m.group(1)) if m else None


def checkpoint_steps(directory: str | os.PathLike[str]) -> list[int]:
    """Steps with a shard or a hash record in `directory`, newest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    steps = (_step_of(p.name, _SHARD, _RECORD) for p in directory.iterdir())
    return sorted({s for s in steps if s is not None}, reverse=True)


def step_files(directory: str | os.PathLike[str], step: int) -> list[Path]:
    """Every recognised file (shards, records and the held-out loss) of `step`."""
    return sorted(p for p in Path(directory).glob(f"step{step:08d}*")
                  if _step_of(p.name, _SHARD, _RECORD, _VAL) == step)  # fmt: skip


# ---- durable writing


def _fsync_dir(directory: Path) -> None:
    """Make the renames and removals in `directory` durable (a rename is an entry of the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some file systems cannot fsync a directory; the rename is then as durable as it gets
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """`write(f)` into a temporary file beside `path`, fsync it, rename it over `path`, fsync the directory."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _sha256(f: BufferedIOBase) -> tuple[int, str]:
    f.seek(0)
    digest = hashlib.file_digest(f, "sha256").hexdigest()
    size = f.tell()
    f.seek(0)
    return size, digest


#: The digests this process took of shard files it verified, by the file's identity (device, inode, size, mtime,
#: ctime): the callers verify a step and then load it (a resume, `parcae export`, the logged model), and a shard of a
#: large model is hashed at ~1.5 GB/s. A shard is never written in place, only renamed over whole (a new inode); an
#: unchanged identity is the same file. A file changed less than `_SETTLED_NS` before it is hashed is not remembered:
#: file times move at the kernel's tick (a few ms), so a write in the tick of the last one would leave them as they
#: were. Bounded: the oldest entries go first.
_DIGESTS: dict[tuple[int, int, int, int, int], tuple[int, str]] = {}
_DIGESTS_MAX = 1024
_DIGESTS_LOCK = threading.Lock()
_SETTLED_NS = 1_000_000_000


def _verified_sha256(f: BufferedIOBase) -> tuple[int, str]:
    """`_sha256(f)`, once per settled file a process reads (see `_DIGESTS`)."""
    st, now = os.fstat(f.fileno()), time.time_ns()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _DIGESTS.get(key)
    if known is None:
        known = _sha256(f)
        if now - max(st.st_mtime_ns, st.st_ctime_ns) >= _SETTLED_NS:
            with _DIGESTS_LOCK:  # (a worker's helper threads read checkpoints too)
                while len(_DIGESTS) >= _DIGESTS_MAX:
                    del _DIGESTS[next(iter(_DIGESTS))]
                _DIGESTS[key] = known
    return known


def _non_finite(layers: Mapping[str, Mapping[str, object]]) -> tuple[str, str, int, int] | None:
    """The first (layer, key, NaN count, Inf count) holding a non-finite value, or None."""
    for name, state in layers.items():
        for key, t in state.items():
            if torch.is_tensor(t) and (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
                return name, key, int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
    return None


def save(
    path: str | os.PathLike[str],
    layers: Mapping[str, LayerState],
    *,
    step: int,
    config: ModelConfig,
    job: str,
    settings: Mapping[str, Any] | None = None,
) -> Path:
    """Write `layers` (all of them or one stage's shard) durably to `path`, then its hash record; returns the path.
    `settings`: the job's `JobConfig.to_dict()`, recorded beside the layers (what wrote this checkpoint).

    Refuses (CheckpointError, nothing written) a state with NaN or Inf in any tensor, naming the layer."""
    path = Path(path)
    known = layer_names(config)
    unknown = sorted(set(layers) - set(known))
    if unknown:
        raise ValueError(f"layers {unknown} are not layers of model {config.name!r}")
    bad = _non_finite(layers)
    if bad is not None:
        name, key, nan, inf = bad
        raise CheckpointError(f"{path}: refusing to checkpoint non-finite state of step {step}: layer {name!r} "
                              f"{key!r} has {nan} NaN and {inf} Inf values (training diverged before step {step}); "
                              "the earlier checkpoints are kept")  # fmt: skip
    payload = {
        "format": FORMAT,
        "layers": {name: dict(state) for name, state in layers.items()},
        "step": int(step),
        "config": config.to_dict(),
        "fingerprint": model_fingerprint(config),
        "job": str(job),
        "settings": dict(settings or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    record = record_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w+b") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
            size, digest = _sha256(f)
        if record.exists():  # an old record must not vouch for the new shard, not even after a crash
            record.unlink()
            _fsync_dir(path.parent)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    rec = ShardRecord(file=path.name, size=size, sha256=digest, step=int(step), job=str(job), model=config.name,
                      layers=tuple(layers), model_layers=tuple(known))  # fmt: skip
    _write_record(record, rec)
    return path


def _write_record(path: Path, rec: ShardRecord) -> None:
    _write_atomic(path, lambda f: f.write(rec.to_json().encode()))


# ---- verification


def read_record(shard: str | os.PathLike[str]) -> ShardRecord | None:
    """The hash record of `shard`, or None when it has none. CheckpointError (naming the record) when the record is
    unreadable or not a hash record of a known format."""
    path = record_path(shard)
    try:
        return _parse_record(path)
    except _BadRecord as e:
        raise CheckpointError(f"{path}: {e}") from None


class _BadRecord(Exception):
    pass


def _parse_record(path: Path) -> ShardRecord | None:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _BadRecord(f"unreadable ({e.strerror})") from None
    try:
        data = json.loads(text)
        if data.get("format") != RECORD_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {RECORD_FORMAT}")
        rec = ShardRecord(
            file=data["file"], size=data["size"], sha256=data["sha256"], step=data["step"], job=data["job"],
            model=data["model"], layers=tuple(data["layers"]), model_layers=tuple(data["model_layers"]),
        )  # fmt: skip
        types = [(rec.file, str), (rec.size, int), (rec.sha256, str), (rec.step, int), (rec.job, str)]
        names = rec.layers + rec.model_layers
        if not all(isinstance(v, t) for v, t in types) or not all(isinstance(n, str) for n in names):
            raise ValueError("a field has the wrong type")
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # UnicodeDecodeError is a ValueError
        raise _BadRecord(f"not a hash record ({type(e).__name__}: {e})") from None
    return rec


def _check_bytes(shard: Path, f: BufferedIOBase, rec: ShardRecord) -> str | None:
    """What is wrong with the open shard `f` against its record, or None when it matches."""
    if rec.file != shard.name:
        return f"{shard.name}: its hash record {record_path(shard).name} is for {rec.file!r}"
    size, digest = _verified_sha256(f)
    if size != rec.size:
        return f"{shard.name}: {size} bytes, its hash record says {rec.size} (truncated or overwritten)"
    if digest != rec.sha256:
        return f"{shard.name}: sha256 mismatch (hash record {rec.sha256[:12]}…, file {digest[:12]}…)"
    return None


def _no_record(shard: Path) -> str:
    return (f"unverified, no hash record {record_path(shard).name} (written before hash records existed, or its "
            "writer stopped before finishing it)")  # fmt: skip


def check_shard(shard: str | os.PathLike[str]) -> str | None:
    """What is wrong with one shard file against its hash record (missing, unverified, unreadable, corrupt), or
    None when it matches. Reads the bytes, does not unpickle."""
    shard = Path(shard)
    try:
        rec = _parse_record(record_path(shard))
    except _BadRecord as e:
        return f"{record_path(shard).name}: {e}"
    if rec is None:
        return f"{shard.name}: {_no_record(shard)}" if shard.is_file() else f"{shard.name}: no such file"
    try:
        with open(shard, "rb") as f:
            return _check_bytes(shard, f, rec)
    except FileNotFoundError:
        return f"{shard.name}: no such file (its hash record is there)"
    except OSError as e:
        return f"{shard.name}: unreadable ({e.strerror})"


def shard_layers(directory: str | os.PathLike[str], step: int) -> dict[str, tuple[str, ...]]:
    """The shard files of the checkpoint of `step` in `directory` and the layers each holds, from their hash
    records (what a worker needs to fetch only the shards of its own layers)."""
    out = {}
    for shard in find_shards(directory, step):
        rec = read_record(shard)
        if rec is not None:
            out[shard.name] = rec.layers
    return out


def verify_step(
    directory: str | os.PathLike[str],
    step: int,
    layers: Sequence[str] | None = None,
    *,
    job: str | None = None,
) -> Verdict:
    """Whether the checkpoint of `step` in `directory` is complete and intact, from the files and their hash
    records alone (nothing is unpickled). `layers`: the model's layer names (default: the records' own
    `model_layers`); `job`: the job it must be of (default: the records must agree)."""
    d = Path(directory)
    shards = find_shards(d, step)
    problems: dict[str, list[str]] = {s: [] for s in STATUSES}
    held: dict[str, str] = {}
    records: list[ShardRecord] = []
    for shard in shards:
        try:
            rec = _parse_record(record_path(shard))
        except _BadRecord as e:
            problems["corrupt"].append(f"{record_path(shard).name}: {e}")
            continue
        if rec is None:
            problems["unverified"].append(f"{shard.name}: {_no_record(shard)}")
            continue
        try:
            with open(shard, "rb") as f:
                wrong = _check_bytes(shard, f, rec)
        except OSError as e:
            wrong = f"{shard.name}: unreadable ({e.strerror})"
        if wrong is None and rec.step != step:
            wrong = f"{shard.name}: its hash record says step {rec.step}"
        if wrong is not None:
            problems["corrupt"].append(wrong)
            continue
        records.append(rec)
        for name in rec.layers:
            if name in held:
                problems["corrupt"].append(f"{shard.name}: layer {name!r} is also in {held[name]}")
            held.setdefault(name, shard.name)
    names = set(shard.name for shard in shards)
    for rec_file in sorted(d.glob(f"step{step:08d}*{RECORD_SUFFIX}")):
        if _step_of(rec_file.name, _RECORD) == step and rec_file.with_suffix(".pt").name not in names:
            problems["incomplete"].append(f"{rec_file.name}: its shard {rec_file.with_suffix('.pt').name} is missing")
    jobs = sorted({r.job for r in records})
    if job is not None and any(j != job for j in jobs):
        problems["foreign"].append(f"of job {', '.join(map(repr, jobs))}, expected job {job!r}")
    elif job is None and len(jobs) > 1:
        problems["corrupt"].append(f"shards of different jobs {jobs}")
    if layers is None:
        declared = sorted({r.model_layers for r in records})
        if len(declared) > 1:
            problems["corrupt"].append("shards of different models (their hash records disagree on the layers)")
        expected = list(declared[0]) if len(declared) == 1 else []
    else:
        expected = list(layers)
    strange = sorted(set(held) - set(expected)) if expected else []
    if strange:
        problems["foreign"].append(f"layers {strange} are not layers of this model")
    missing = [n for n in expected if n not in held]
    if missing:  # (no `expected` when nothing verified and no `layers`: the other problems say why)
        problems["incomplete"].append(f"missing layers {missing}")
    if not shards and not any(problems.values()):
        problems["incomplete"].append(f"no shard files of step {step}")
    status = next((s for s in STATUSES if problems[s]), "intact")
    found = tuple(p for s in STATUSES for p in problems[s])
    return Verdict(step=step, status=status, files=tuple(shards), problems=found)


def latest_intact(directory: str | os.PathLike[str], layers: Sequence[str], *, job: str) -> ResumePoint:
    """The newest intact, complete checkpoint of job `job` (a model of `layers`) in `directory`, and the newer ones
    skipped (corrupt, foreign, unverified, incomplete) with why. Verifies hashes, does not unpickle: `load` the
    files to also check the model config and finiteness."""
    skipped: list[Verdict] = []
    for s in checkpoint_steps(Path(directory)):
        v = verify_step(directory, s, layers, job=job)
        if v.intact:
            return ResumePoint(step=s, files=v.files, skipped=tuple(skipped))
        skipped.append(v)
    return ResumePoint(step=None, files=(), skipped=tuple(skipped))


# ---- held-out losses


def val_path(directory: str | os.PathLike[str], step: int) -> Path:
    """Where the held-out loss of the checkpoint of `step` is kept: `step{s}.val.json` beside its shards."""
    return Path(directory) / f"step{step:08d}{VAL_SUFFIX}"


def val_step(name: str) -> int | None:
    """The step of a held-out loss's file name (`val_path`), or None for any other name."""
    return _step_of(name, _VAL)


@dataclass(frozen=True)
class HeldOut:
    """The held-out scores recorded beside a checkpoint ("loss" and each of the spec's metrics) and the score the job
    ranked its checkpoints by when it wrote them (`Monitor`: its validation's `monitor` and `mode`)."""

    scores: Mapping[str, float]
    monitor: Monitor = Monitor()

    @property
    def loss(self) -> float:
        return self.scores["loss"]

    @property
    def value(self) -> float:
        """The monitored score."""
        return self.scores[self.monitor.name]


def val_record(step: int, held: HeldOut, *, job: str) -> bytes:
    """The held-out scores of the parameters the checkpoint of `step` holds (`TrainSpec.validation` scored at
    boundary `step`, after the shards were written: so it is a file of its own, not in their hash records) and the
    monitor that ranks the job's checkpoints (so that `parcae export --best` needs no spec to tell the best one)."""
    metrics = {k: float(v) for k, v in held.scores.items() if k != "loss"}
    rec = {"format": RECORD_FORMAT, "step": step, "job": job, "val_loss": float(held.loss),
           "monitor": held.monitor.name, "mode": held.monitor.mode}  # fmt: skip
    return json.dumps({**rec, **({"metrics": metrics} if metrics else {})}).encode()


def parse_held_out(data: bytes, step: int, *, job: str | None = None) -> HeldOut | None:
    """What `val_record` wrote for `step` (of `job`, if given); None for anything else: a torn, foreign or
    non-finite record counts as no score (the checkpoint is then kept or pruned as if never scored). A record
    without a monitor (written before they were kept) ranks by the loss."""
    try:
        rec = json.loads(data)
        scores = {"loss": float(rec["val_loss"]), **{str(k): float(v) for k, v in rec.get("metrics", {}).items()}}
        monitor = Monitor(str(rec.get("monitor", "loss")), str(rec.get("mode", "min")))
        ok = rec["format"] == RECORD_FORMAT and rec["step"] == step and (job is None or rec["job"] == job)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not ok or monitor.mode not in ("min", "max") or monitor.name not in scores:
        return None
    return HeldOut(scores, monitor) if math.isfinite(scores["loss"]) and math.isfinite(scores[monitor.name]) else None


def write_held_out(directory: str | os.PathLike[str], step: int, held: HeldOut, *, job: str) -> Path:
    """Record, atomically, the held-out scores of the checkpoint of `step` beside it (the driver does, once both are
    known): `prune` keeps the best-scored checkpoint by them, across resumes."""
    path = val_path(directory, step)
    data = val_record(step, held, job=job)
    _write_atomic(path, lambda f: f.write(data))
    return path


def held_out(directory: str | os.PathLike[str], *, job: str | None = None) -> dict[int, HeldOut]:
    """The held-out scores recorded in `directory`, by step (unreadable or foreign records left out)."""
    d = Path(directory)
    out: dict[int, HeldOut] = {}
    for p in d.glob(f"step*{VAL_SUFFIX}") if d.is_dir() else ():
        step = _step_of(p.name, _VAL)
        if step is not None:
            try:
                record = parse_held_out(p.read_bytes(), step, job=job)
            except OSError:
                continue
            if record is not None:
                out[step] = record
    return out


def val_losses(directory: str | os.PathLike[str], *, job: str | None = None) -> dict[int, float]:
    """The held-out losses recorded in `directory`, by step (`held_out`)."""
    return {s: record.loss for s, record in held_out(directory, job=job).items()}


def best_scored(records: Mapping[int, HeldOut]) -> list[int]:
    """`records`' steps, best first by the newest record's monitor (the job's, as it was last run: a resume may
    watch another score), among those that hold that score as a number; the earliest of equal ones (a later
    checkpoint must improve on it to replace it)."""
    if not records:
        return []
    monitor = records[max(records)].monitor
    held = {s: r.scores[monitor.name] for s, r in records.items() if monitor.name in r.scores}
    ranked = {s: monitor.rank(v) for s, v in held.items() if math.isfinite(v)}  # (a NaN: unranked)
    return sorted(ranked, key=lambda s: (ranked[s], s))


def best_validated(
    directory: str | os.PathLike[str], layers: Sequence[str] | None = None, *, job: str | None = None,
    intact: Collection[int] = (),
) -> tuple[int, HeldOut] | None:  # fmt: skip
    """The intact checkpoint in `directory` with the best recorded held-out score (`best_scored`: the validation's
    monitor, the loss by default), and its scores (None: no scored checkpoint is intact). What `parcae export
    --best` writes and `prune` never removes. `intact`: steps the caller verified already (not hashed again)."""
    records = held_out(directory, job=job)
    for s in best_scored(records):
        if s in intact or verify_step(directory, s, layers, job=job).intact:
            return s, records[s]
    return None


# ---- loading


def _read(path: Path, *, allow_unverified: bool) -> dict[str, Any]:
    try:
        rec = _parse_record(record_path(path))
    except _BadRecord as e:
        raise CheckpointError(f"{path}: cannot be verified: {record_path(path).name} is {e}") from None
    try:  # opened apart from the `with`: only the open's own errors mean "no such file" or "unreadable"
        f = open(path, "rb")  # noqa: SIM115 — closed by the `with f:` below
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable ({e.strerror})") from None
    with f:
        if rec is not None:
            wrong = _check_bytes(path, f, rec)
            if wrong is not None:
                raise CheckpointError(f"{path}: corrupt checkpoint, {wrong.removeprefix(path.name + ': ')}")
        try:  # mapped, not read: the tensors' pages come from the file as they are touched, and the page cache
            # can drop them (a loader wanting only some tensors — the parameters, not the optimiser state — or
            # copying them into its layers holds no second copy of the shard in its own memory). By its path, as
            # torch maps only a named file: a shard is never written in place, only renamed over whole
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # a truncated zip, garbage, or a pickle that is not plain data
            raise CheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from e
    fields = {"layers", "step", "config", "job"}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not fields <= data.keys():
        raise CheckpointError(f"{path}: not a trainer checkpoint (format {FORMAT} with layers, step, config, job)")
    if rec is None and not allow_unverified:
        raise CheckpointError(f"{path}: {_no_record(path)}; load(..., allow_unverified=True) reads it anyway")
    if rec is not None and (rec.step != data["step"] or rec.job != data["job"]):
        raise CheckpointError(f"{path}: its hash record is of step {rec.step} job {rec.job!r}, the file of step "
                              f"{data['step']} job {data['job']!r}")  # fmt: skip
    return data


def _flat(config: Mapping[str, Any]) -> dict[str, Any]:
    """A model config's fields with its args spread out ("args.n_layer"), so a difference names the argument."""
    out = {k: v for k, v in config.items() if k != "args"}
    out.update({f"args.{k}": v for k, v in dict(config.get("args") or {}).items()})
    return out


def describe(path: str | os.PathLike[str]) -> tuple[ModelConfig, str, int]:
    """The model config, job and step a verified shard was written for (its hash record vouches for the bytes)."""
    data = _read(Path(path), allow_unverified=False)
    return ModelConfig.from_dict(data["config"]), str(data["job"]), int(data["step"])


def load(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    config: ModelConfig,
    job: str,
    complete: bool = True,
    allow_unverified: bool = False,
) -> Checkpoint:
    """Read, verify and merge checkpoint file(s), refusing a file that differs from its hash record, one without a
    record (unless `allow_unverified`), non-finite values, another job, another model config, a step mismatch
    between shards, a layer in two shards, or (with `complete`) a missing layer. Errors name the file."""
    files = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    if not files:
        raise CheckpointError("no checkpoint files given")
    expected = config.to_dict()
    layers: dict[str, LayerState] = {}
    origin: dict[str, Path] = {}
    step: int | None = None
    for path in files:
        data = _read(path, allow_unverified=allow_unverified)
        if data["job"] != job:
            raise ForeignCheckpointError(f"{path}: checkpoint of job {data['job']!r}, expected job {job!r}")
        if data["config"] != expected:
            have, want = _flat(data["config"]), _flat(expected)
            diff = {k: (have.get(k), want.get(k)) for k in sorted(want.keys() | have.keys())
                    if have.get(k) != want.get(k)}  # fmt: skip
            detail = ", ".join(f"{k}: file has {a!r}, expected {b!r}" for k, (a, b) in diff.items())
            raise ForeignCheckpointError(f"{path}: checkpoint of another model config ({detail})")
        if "fingerprint" in data and data["fingerprint"] != model_fingerprint(config):
            raise ForeignCheckpointError(f"{path}: checkpoint of another spec: model {config.name!r} with these args "
                                         "now builds layers of other names, shapes or dtypes than the ones saved "
                                         "(the spec's code changed); resume with the code that wrote it, or start "
                                         "a new job")  # fmt: skip
        if step is None:
            step = data["step"]
        elif data["step"] != step:
            raise CheckpointError(f"{path}: step {data['step']} but {files[0]} has step {step}")
        bad = _non_finite(data["layers"])
        if bad is not None:
            name, key, nan, inf = bad
            raise CheckpointError(f"{path}: layer {name!r} {key!r} has {nan} NaN and {inf} Inf values; a "
                                  "checkpoint of a diverged run cannot be resumed from")  # fmt: skip
        for name, state in data["layers"].items():
            if name in layers:
                raise CheckpointError(f"{path}: layer {name!r} is also in {origin[name]}")
            layers[name], origin[name] = state, path
    if complete:
        missing = [n for n in layer_names(config) if n not in layers]
        if missing:
            raise CheckpointError(f"{', '.join(map(str, files))}: incomplete checkpoint, missing layers {missing}")
    assert step is not None
    return Checkpoint(step=step, job=job, config=config, layers=layers)


# ---- removal


def _remove(files: Iterable[Path]) -> list[Path]:
    """Remove `files`, hash records before shards (a crash midway leaves shards without records: unverified, never
    used), and fsync the directories touched."""
    files = sorted(files, key=lambda p: (p.suffix != RECORD_SUFFIX, p))
    removed = []
    for p in files:
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        removed.append(p)
    for d in sorted({p.parent for p in removed}):
        _fsync_dir(d)
    return removed


def _file_steps(d: Path) -> set[int]:
    """Steps with any file of ours in `d`: a shard, a record or a held-out loss (whose shards may be gone)."""
    return {s for p in d.iterdir() if (s := _step_of(p.name, _SHARD, _RECORD, _VAL)) is not None}


def remove_after(directory: str | os.PathLike[str], step: int) -> list[Path]:
    """Delete the checkpoint files (shards, hash records, held-out losses) of steps after `step`; returns what
    was removed.

    A checkpoint-restart from `step` calls it before the restarted job writes again: files of later steps are
    an incomplete checkpoint of the abandoned run, and a shard of another cut left next to the new ones would make
    the later checkpoint ambiguous (`load` refuses a layer in two shards).
    """
    d = Path(directory)
    if not d.is_dir():
        return []
    return _remove(p for s in _file_steps(d) if s > step for p in step_files(d, s))


def remove_before(directory: str | os.PathLike[str], step: int) -> list[Path]:
    """Delete the checkpoint files (shards, hash records, held-out losses) of steps before `step`; returns
    what was removed.

    A worker whose shards are copied to a checkpoint URI keeps only its disk's newest steps with it: the URI holds
    the copies a restore needs (`trainer.runtime.checkpoint_mirror.gather_shards` fetches what this disk lacks).
    """
    d = Path(directory)
    if not d.is_dir():
        return []
    return _remove(p for s in _file_steps(d) if s < step for p in step_files(d, s))


def remove_temporary(directory: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files of writers that crashed (`.step….pt.tmp-*`, `.step….sha256.tmp-*`). Only when no
    writer is running (a resume, before workers start): a live writer's temporary file is its next shard."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return _remove(p for p in d.iterdir() if _TEMPORARY.fullmatch(p.name))


def prune(
    directory: str | os.PathLike[str],
    keep: int,
    *,
    layers: Sequence[str] | None = None,
    job: str | None = None,
) -> list[Path]:
    """Keep the newest `keep` intact checkpoints in `directory` (0: keep all), and the best-scored one
    (`best_validated`: the best held-out score a validating job recorded, by its monitor), and remove the files
    (shards, hash records, held-out scores) of every older step, intact or not; returns what was removed.

    Never removes the newest intact checkpoint, nor anything newer than it (a checkpoint still being written is
    incomplete, not garbage), nor a file whose name it does not recognise (`is_checkpoint_file`); with no intact
    checkpoint it removes nothing. `layers`/`job` as in `verify_step`."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError(f"keep must be an integer >= 0 (0: keep every checkpoint), got {keep!r}")
    d = Path(directory)
    if keep == 0 or not d.is_dir():
        return []
    steps = checkpoint_steps(d)
    kept: list[int] = []
    for s in steps:  # newest first; what is older than the keep-th intact one goes unverified
        if len(kept) == keep:
            break
        if verify_step(d, s, layers, job=job).intact:
            kept.append(s)
    if not kept:
        return []
    best = best_validated(d, layers, job=job, intact=kept)  # (often the newest: verified just above)
    kept += [best[0]] if best is not None else []
    return _remove(p for s in sorted(_file_steps(d)) if s < kept[0] and s not in kept for p in step_files(d, s))
