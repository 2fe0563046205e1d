"""Durable checkpoints: a copy of every checkpoint where it survives the instance that wrote it.

Owns: `CheckpointMirror` (a checkpoint URI: ``file:///path`` or ``s3://bucket/prefix`` through boto3), `mirror_for`
(the URI's backend, checked before a job starts), `MirrorError`, `ShardUploader` (a worker's background uploads of
the shards it writes), `StepCommitter` (the driver's manifests of complete steps, and pruning) and `gather_shards`
(a worker's restore: local shards where intact, the others fetched). Must not touch: the checkpoint format and its
verification (`trainer.runtime.checkpoint`: a mirrored step is the same files, verified the same way once fetched),
when checkpoints are written (the workers), processes, the store.

Who copies what. Each worker uploads the shards it writes itself, from its own disk: the instances need not share
a disk with the driver or with each other (on AWS or ``--hosts`` they do not). It reports a shard to the driver only
once the shard and its record are at the URI, so a checkpoint the driver counts complete is durable. The final
layers go to ``<uri>/final/`` the same way; the driver fetches those it does not hold before loading them.

Atomicity: the files of one step go up shards first, then their hash records, then a step **manifest**
(``step{s:08d}.manifest.json``: the files and their sizes, each shard's layers) — last, written by the driver once
every stage's shard is up. A step is at the URI only once its manifest is there: a job killed mid-upload leaves
files without a manifest, which `steps()` does not list and the next upload of that step overwrites. Pruning removes
a step's manifest first. A fresh driver (`fetch_latest`) downloads the newest complete step into the local
checkpoint folder, where `trainer.runtime.checkpoint` verifies it like any other before the job resumes from it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import shutil
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from trainer.runtime import checkpoint

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = ".manifest.json"
FINAL = "final"  # the folder under the URI that holds the final layers


class MirrorError(ValueError):
    """A checkpoint URI that cannot work (its scheme, its bucket, its folder): the message says how to fix it."""


def _manifest_name(step: int) -> str:
    return f"step{step:08d}{MANIFEST_SUFFIX}"


class CheckpointMirror:
    """Where complete checkpoints are copied: a backend of `put`, `get`, `list_names`, `delete`, with the
    step-level protocol (`upload_step`, `steps`, `download_step`, `prune`) on top."""

    uri: str

    # -- the backend -------------------------------------------------------------------------------------------
    def put(self, name: str, path: Path) -> None:
        raise NotImplementedError

    def put_bytes(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, name: str, path: Path) -> None:
        raise NotImplementedError

    def get_bytes(self, name: str) -> bytes:
        raise NotImplementedError

    def list_names(self) -> list[str]:
        raise NotImplementedError

    def delete(self, names: Sequence[str]) -> None:
        raise NotImplementedError

    def child(self, name: str) -> CheckpointMirror:
        """The mirror of a folder under this one (``<uri>/<name>``): the final layers go to ``final``."""
        raise NotImplementedError

    def probe(self) -> None:
        """Write a small object, read it back and delete it: a job checks, before it trains, that it can keep its
        checkpoints here (else every copy would fail while it trains, and the job would end with none saved). Raises
        what the backend raises; `MirrorError` if the object reads back different."""
        name = f".parcae-probe-{secrets.token_hex(8)}"
        data = name.encode()
        self.put_bytes(name, data)
        try:
            if self.get_bytes(name) != data:
                raise MirrorError(f"{self.uri}: an object written there read back different")
        finally:
            self.delete([name])

    # -- files and steps --------------------------------------------------------------------------------------
    def upload_files(self, paths: Sequence[Path]) -> dict[str, int]:
        """Copy checkpoint files (a shard and its hash record, ...): shards first, records last, so a record at
        the URI always follows the bytes it vouches for. Returns each file's name and size."""
        ordered = sorted(paths, key=lambda p: (p.suffix != ".pt", p.name))
        sizes = {}
        for p in ordered:
            self.put(p.name, p)
            sizes[p.name] = p.stat().st_size
        return sizes

    def commit_step(self, step: int, files: Mapping[str, int], shards: Mapping[str, Sequence[str]]) -> None:
        """Write the manifest of `step` (its files and sizes; each shard's layers): the step is complete at the URI
        from now on. Called once every file is uploaded."""
        manifest = {"step": step, "files": dict(sorted(files.items())),
                    "shards": {k: list(v) for k, v in sorted(shards.items())}}  # fmt: skip
        self.put_bytes(_manifest_name(step), json.dumps(manifest, sort_keys=True).encode())

    def upload_step(self, directory: Path, step: int) -> list[str]:
        """Copy the complete checkpoint of `step` in `directory`: shards, then records, then the manifest."""
        files = checkpoint.step_files(directory, step)
        shards = [p for p in files if p.suffix == ".pt"]
        records = [p for p in files if p.suffix != ".pt"]
        if not shards or not records:
            raise MirrorError(f"step {step} in {directory} is not a complete checkpoint (shards {shards}, records "
                              f"{records})")  # fmt: skip
        sizes = self.upload_files(files)
        self.commit_step(step, sizes, checkpoint.shard_layers(directory, step))
        return [p.name for p in files]

    def fetch(self, names: Sequence[str], directory: Path) -> list[Path]:
        """Download `names` into `directory`, each atomically, hash records last (a torn download reads as a shard
        without its record: unverified, never as an intact one)."""
        directory.mkdir(parents=True, exist_ok=True)
        out = []
        for name in sorted(names, key=lambda n: (not n.endswith(".pt"), n)):
            target = directory / name
            tmp = directory / f".{name}.download"
            self.get(name, tmp)
            os.replace(tmp, target)
            out.append(target)
        return out

    def steps(self) -> list[int]:
        """Steps whose manifest is at the URI (complete uploads), newest first."""
        out = []
        for name in self.list_names():
            if name.startswith("step") and name.endswith(MANIFEST_SUFFIX):
                digits = name[4 : -len(MANIFEST_SUFFIX)]
                if digits.isdigit():
                    out.append(int(digits))
        return sorted(out, reverse=True)

    def download_step(self, step: int, directory: Path) -> list[Path]:
        """Download the files of complete `step` into `directory` (records last)."""
        return self.fetch(list(self.manifest(step)["files"]), directory)

    def manifest(self, step: int) -> dict[str, Any]:
        """The manifest of complete `step` (MirrorError when the URI holds none, or an unreadable one)."""
        try:
            data = json.loads(self.get_bytes(_manifest_name(step)))
            if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
                raise ValueError("no files")
        except Exception as e:  # noqa: BLE001 — a backend's own error (botocore's ClientError, OSError) or bad JSON
            raise MirrorError(f"{self.uri}: no readable manifest of step {step} ({type(e).__name__}: {e})") from e
        return data

    def record_val(self, step: int, held: checkpoint.HeldOut, *, job: str) -> None:
        """Keep the held-out scores of complete `step` beside it (`checkpoint.val_record`): what `prune` keeps the
        best-scored step by, and what a resumed job's early stopping counts from."""
        self.put_bytes(checkpoint.val_path("", step).name, checkpoint.val_record(step, held, job=job))

    def held_out(self, *, job: str | None = None) -> dict[int, checkpoint.HeldOut]:
        """The held-out scores kept here, by step (unreadable or foreign ones left out)."""
        out = {}
        for name in self.list_names():
            step = checkpoint.val_step(name)
            if step is not None:
                try:
                    record = checkpoint.parse_held_out(self.get_bytes(name), step, job=job)
                except Exception:  # noqa: BLE001 — a backend's own error (gone meanwhile): as if never scored
                    continue
                if record is not None:
                    out[step] = record
        return out

    def best_validated(self, *, job: str | None = None) -> tuple[int, checkpoint.HeldOut] | None:
        """The complete step with the best held-out score kept here (`checkpoint.best_scored`), and its scores (None:
        none scored)."""
        complete = set(self.steps())
        records = {s: r for s, r in self.held_out(job=job).items() if s in complete}
        best = checkpoint.best_scored(records)
        return (best[0], records[best[0]]) if best else None

    def prune(self, keep: int, *, job: str | None = None) -> list[int]:
        """Keep the newest `keep` complete steps (0: all) and the best-scored one (`best_validated`); remove the
        others, manifest first."""
        steps = self.steps()
        if keep <= 0 or len(steps) <= keep:
            return []
        best = self.best_validated(job=job)
        gone = [s for s in steps[keep:] if best is None or s != best[0]]
        names = self.list_names()
        for s in gone:
            self.delete([_manifest_name(s)])
            prefix = f"step{s:08d}"
            self.delete([n for n in names if n.startswith(prefix) and not n.endswith(MANIFEST_SUFFIX)])
        return gone

    def fetch_latest(self, directory: Path, layers: Sequence[str], *, job: str) -> int | None:
        """A fresh driver's resume: if the URI holds a newer complete checkpoint than `directory`'s newest intact
        one, download it there; returns the step downloaded, or None."""
        local = checkpoint.latest_intact(directory, layers, job=job).step if Path(directory).is_dir() else None
        remote = self.steps()
        if not remote or (local is not None and local >= remote[0]):
            return None
        self.download_step(remote[0], Path(directory))
        return remote[0]


class FileMirror(CheckpointMirror):
    """``file:///path``: a folder (a mounted network or cloud volume), written atomically."""

    def __init__(self, root: Path, uri: str) -> None:
        self.root, self.uri = root, uri

    def child(self, name: str) -> FileMirror:
        return FileMirror(self.root / name, f"{self.uri.rstrip('/')}/{name}")

    def put(self, name: str, path: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.upload"
        shutil.copyfile(path, tmp)
        os.replace(tmp, self.root / name)

    def put_bytes(self, name: str, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.upload"
        tmp.write_bytes(data)
        os.replace(tmp, self.root / name)

    def get(self, name: str, path: Path) -> None:
        shutil.copyfile(self.root / name, path)

    def get_bytes(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def list_names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if not p.name.startswith(".")) if self.root.is_dir() else []

    def delete(self, names: Sequence[str]) -> None:
        for n in names:
            (self.root / n).unlink(missing_ok=True)


class S3Mirror(CheckpointMirror):
    """``s3://bucket/prefix`` through boto3 (credentials and region from boto3's standard chain; `endpoint_url`
    from ``$AWS_ENDPOINT_URL_S3`` / ``$AWS_ENDPOINT_URL`` as boto3 reads them). Each object is one PUT: atomic."""

    def __init__(self, bucket: str, prefix: str, uri: str, client: Any = None) -> None:
        import boto3

        self.bucket, self.prefix, self.uri = bucket, prefix.strip("/"), uri
        self.s3 = client if client is not None else boto3.client("s3")

    def child(self, name: str) -> S3Mirror:
        return S3Mirror(self.bucket, self._key(name), f"{self.uri.rstrip('/')}/{name}", self.s3)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def put(self, name: str, path: Path) -> None:
        self.s3.upload_file(str(path), self.bucket, self._key(name))

    def put_bytes(self, name: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def get(self, name: str, path: Path) -> None:
        self.s3.download_file(self.bucket, self._key(name), str(path))

    def get_bytes(self, name: str) -> bytes:
        body: bytes = self.s3.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
        return body

    def list_names(self) -> list[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        names = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
            names += [o["Key"][len(start) :] for o in page.get("Contents", [])]
        return sorted(n for n in names if n and "/" not in n)

    def delete(self, names: Sequence[str]) -> None:
        for i in range(0, len(names), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = [{"Key": self._key(n)} for n in names[i : i + 1000]]
            if chunk:
                self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})


def mirror_for(uri: str, *, s3_client: Any = None) -> CheckpointMirror:
    """The mirror of `uri` (``file:///abs/path`` or ``s3://bucket/prefix``), or `MirrorError` naming the fix."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise MirrorError(f"checkpoint URI {uri!r}: a file URI names an absolute folder, e.g. file:///mnt/ckpt")
        return FileMirror(Path(parsed.path), uri)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise MirrorError(f"checkpoint URI {uri!r}: name the bucket, e.g. s3://my-bucket/parcae/job-1")
        return S3Mirror(parsed.netloc, parsed.path, uri, s3_client)
    raise MirrorError(f"checkpoint URI {uri!r}: expected file:///path or s3://bucket/prefix (--checkpoint-uri)")


class _Background:
    """One daemon thread that handles the items submitted to it, in order (`_handle`); an item that raises is
    handed to `_failure` and the thread goes on. `flush` waits for what is queued; `close` also ends the thread."""

    def _start(self, name: str) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _handle(self, item: Any) -> None:
        raise NotImplementedError

    def _failure(self, item: Any, exc: Exception) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._handle(item)
            except Exception as exc:  # noqa: BLE001 — recorded by `_failure`, training goes on
                self._failure(item, exc)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=30)


@dataclass
class StepCommitter(_Background):
    """The driver's side of a mirrored job, on a thread of its own so that training never waits for it: each step
    whose every shard the workers uploaded (`submit`: the files and sizes they reported, each shard's layers) gets
    its manifest — complete at the URI from then on —, then the mirror is pruned to `keep` (0: keep all) and the
    best-scored step; so again after each held-out loss recorded (`record_val`). `on_upload(step)` follows each.
    `flush()` waits for what is queued (at the job's end). Failures are logged and kept in `errors` (the job's
    report adds the workers' upload failures)."""

    mirror: CheckpointMirror
    keep: int = 0
    uploaded: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    on_upload: Callable[[int], None] | None = None
    job: str | None = None  # whose held-out scores these are (`record_val`)

    def __post_init__(self) -> None:
        self._start("parcae-checkpoint-commit")

    def submit(self, step: int, files: Mapping[str, int], shards: Mapping[str, Sequence[str]]) -> None:
        self._queue.put((step, dict(files), {k: list(v) for k, v in shards.items()}))

    def record_val(self, step: int, held: checkpoint.HeldOut) -> None:
        """Keep the held-out scores of `step` at the URI (`CheckpointMirror.record_val`), after what is queued: the
        driver records them once the step is complete, so its manifest is there first."""
        self._queue.put((step, held, None))

    def _handle(self, item: tuple[int, dict[str, int] | checkpoint.HeldOut, dict[str, list[str]] | None]) -> None:
        step, files, shards = item
        if isinstance(files, checkpoint.HeldOut):  # held-out scores (`record_val`): the best step may have changed
            self.mirror.record_val(step, files, job=str(self.job))
        else:
            assert shards is not None
            self.mirror.commit_step(step, files, shards)
            self.uploaded.append(step)
        if self.keep:
            self.mirror.prune(self.keep, job=self.job)
        if self.on_upload is not None:
            self.on_upload(step)

    def _failure(self, item: tuple[int, Any, Any], exc: Exception) -> None:
        if isinstance(item[1], checkpoint.HeldOut):  # (`record_val`)
            self.errors.append(f"step {item[0]} (its held-out loss): {type(exc).__name__}: {exc}")
            log.warning("the held-out loss of step %s is not kept at %s: %s", item[0], self.mirror.uri, exc)
            return
        self.errors.append(f"step {item[0]}: {type(exc).__name__}: {exc}")
        log.warning("the checkpoint of step %s is not complete at %s: %s", item[0], self.mirror.uri, exc)

    def summary(self) -> dict[str, Any]:
        return {"uri": self.mirror.uri, "uploaded": list(self.uploaded), "errors": list(self.errors)}


@dataclass
class ShardUploader(_Background):
    """A worker's uploads of the shards it writes, on a thread of its own so that training never waits for them.
    `submit(tag, files)` queues a shard and its hash record; `done()` hands back, once each, the tags uploaded with
    the files' sizes (the worker reports them to the driver from its own thread: the store client is not shared
    across threads) and `failed()` the ones that could not be, with why. `flush` waits for what is queued (before
    the worker leaves: a checkpoint-restart, a notice, the job's end)."""

    mirror: CheckpointMirror

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._done: list[tuple[Any, dict[str, int]]] = []
        self._failed: list[tuple[Any, str]] = []
        self._start("parcae-shard-upload")

    def submit(self, tag: Any, files: Sequence[Path]) -> None:
        self._queue.put((tag, list(files)))

    def _handle(self, item: tuple[Any, list[Path]]) -> None:
        tag, files = item
        sizes = self.mirror.upload_files(files)
        with self._lock:
            self._done.append((tag, sizes))

    def _failure(self, item: tuple[Any, list[Path]], exc: Exception) -> None:
        with self._lock:
            self._failed.append((item[0], f"{type(exc).__name__}: {exc}"))
        log.warning("%s not copied to %s: %s", [p.name for p in item[1]], self.mirror.uri, exc)

    def done(self) -> list[tuple[Any, dict[str, int]]]:
        with self._lock:
            out, self._done = self._done, []
        return out

    def failed(self) -> list[tuple[Any, str]]:
        with self._lock:
            out, self._failed = self._failed, []
        return out


def gather_shards(
    directory: Path,
    step: int,
    shards: Mapping[str, Sequence[str]],
    wanted: Collection[str],
    mirror: CheckpointMirror | None,
    scratch: Path,
) -> list[Path]:
    """The shard files to load `wanted` layers of the checkpoint of `step` from: `shards` names each file of that
    checkpoint and its layers. A file in `directory` that matches its hash record and holds the layers named is
    used in place; any other is fetched from `mirror` into `scratch` (the instance does not share the disk the
    shard was written on, or its copy is damaged). Without a mirror a missing or damaged shard is a
    `checkpoint.CheckpointError` that says why and what to give."""
    missing = sorted(set(wanted) - {n for layers in shards.values() for n in layers})
    if missing:
        raise checkpoint.CheckpointError(f"the checkpoint of step {step} holds no shard of layers {missing}")
    out = []
    for name, layers in sorted(shards.items()):
        if not set(layers) & set(wanted):
            continue
        local = Path(directory) / name
        problem = checkpoint.check_shard(local)
        if problem is None:
            rec = checkpoint.read_record(local)
            if rec is not None and rec.step == step and set(rec.layers) == set(layers):
                out.append(local)
                continue
            problem = f"{name}: its hash record is not of step {step} with layers {sorted(layers)}"
        if mirror is None:
            raise checkpoint.CheckpointError(
                f"{local}: {problem.removeprefix(name + ': ')}; the checkpoint of step {step} is not on this "
                "instance's disk (the instances do not share the checkpoint folder): give the job a "
                "--checkpoint-uri (s3://bucket/prefix or a shared file:///folder) so that every instance can fetch it"
            )  # fmt: skip
        try:
            fetched = mirror.fetch([name, checkpoint.record_path(Path(name)).name], scratch)
        except Exception as e:  # noqa: BLE001 — the backend's own error (a missing key, no access): said with the file
            raise checkpoint.CheckpointError(
                f"{local}: {problem.removeprefix(name + ': ')}, and it could not be fetched from {mirror.uri} "
                f"({type(e).__name__}: {e}); its writer's upload may have failed (the job report's checkpoint_uri "
                "errors say)"
            ) from e
        out.append(next(p for p in fetched if p.suffix == ".pt"))
    return out
