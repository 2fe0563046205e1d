"""Durable checkpoints: a copy of every complete checkpoint where it survives the instance that wrote it.

Owns: `CheckpointMirror` (a checkpoint URI: ``file:///path`` or ``s3://bucket/prefix`` through boto3), `mirror_for`
(the URI's backend, checked before a job starts), `MirrorError`, and `MirrorUploader` (the driver's background
uploads: complete checkpoints copied as they land, old ones pruned, failures recorded, never silent). Must not
touch: the checkpoint format and its verification (`trainer.runtime.checkpoint`: a mirrored step is the same files,
verified the same way once fetched), when checkpoints are written (the workers), processes.

Atomicity: the files of one step go up shards first, then their hash records, then a step **manifest**
(``step{s:08d}.manifest.json``: the files and their sizes) — last. A step is at the URI only once its manifest is
there: a driver killed mid-upload leaves files without a manifest, which `steps()` does not list and the next
upload of that step overwrites. Pruning removes a step's manifest first. A fresh driver (`fetch_latest`) downloads
the newest complete step into the local checkpoint folder, where `trainer.runtime.checkpoint` verifies it like any
other before the job resumes from it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from trainer.runtime import checkpoint

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = ".manifest.json"


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

    # -- steps ------------------------------------------------------------------------------------------------
    def upload_step(self, directory: Path, step: int) -> list[str]:
        """Copy the complete checkpoint of `step` in `directory`: shards, then records, then the manifest."""
        files = checkpoint.step_files(directory, step)
        shards = [p for p in files if p.suffix == ".pt"]
        records = [p for p in files if p.suffix != ".pt"]
        if not shards or not records:
            raise MirrorError(f"step {step} in {directory} is not a complete checkpoint (shards {shards}, records "
                              f"{records})")  # fmt: skip
        for p in [*shards, *records]:
            self.put(p.name, p)
        manifest = {"step": step, "files": {p.name: p.stat().st_size for p in [*shards, *records]}}
        self.put_bytes(_manifest_name(step), json.dumps(manifest, sort_keys=True).encode())
        return [p.name for p in files]

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
        """Download the files of complete `step` into `directory` (records last, so a torn download reads as an
        incomplete checkpoint there, never as an intact one)."""
        manifest = json.loads(self.get_bytes(_manifest_name(step)))
        names = sorted(manifest["files"], key=lambda n: (not n.endswith(".pt"), n))
        directory.mkdir(parents=True, exist_ok=True)
        out = []
        for name in names:
            target = directory / name
            tmp = directory / f".{name}.download"
            self.get(name, tmp)
            os.replace(tmp, target)
            out.append(target)
        return out

    def prune(self, keep: int) -> list[int]:
        """Keep the newest `keep` complete steps (0: all); remove the others, manifest first."""
        steps = self.steps()
        if keep <= 0 or len(steps) <= keep:
            return []
        gone = steps[keep:]
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


@dataclass
class MirrorUploader:
    """The driver's uploads to `mirror`, on a thread of their own so that training never waits for them: each
    complete checkpoint step is copied from `directory` as it lands, then the mirror is pruned to `keep` (0: keep
    all). `flush()` waits for what is queued (the job's end). Failures are logged and kept in `errors`."""

    mirror: CheckpointMirror
    directory: Path
    keep: int = 0
    uploaded: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    on_upload: Callable[[int], None] | None = None

    def __post_init__(self) -> None:
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="parcae-checkpoint-upload", daemon=True)
        self._thread.start()

    def submit(self, step: int) -> None:
        self._queue.put(step)

    def _run(self) -> None:
        while True:
            step = self._queue.get()
            try:
                if step is None:
                    return
                self.mirror.upload_step(self.directory, step)
                self.uploaded.append(step)
                if self.keep:
                    self.mirror.prune(self.keep)
                if self.on_upload is not None:
                    self.on_upload(step)
            except Exception as exc:  # noqa: BLE001 — recorded and reported, training goes on
                self.errors.append(f"step {step}: {type(exc).__name__}: {exc}")
                log.warning("checkpoint of step %s not copied to %s: %s", step, self.mirror.uri, exc)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=30)

    def summary(self) -> dict[str, Any]:
        return {"uri": self.mirror.uri, "uploaded": list(self.uploaded), "errors": list(self.errors)}
