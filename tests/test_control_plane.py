"""The closed control plane (`trainer.runtime.store`): the coordinator's store listens only where asked, as the OS
reports it; a client without the job's token can neither read a value nor write one that any reader accepts; values from
token holders are untrusted input too (malformed ones are logged and ignored); the token reaches local workers
through neither argv nor a file others can read."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from _jobs import coordinator as make_coordinator
from _jobs import run_job
from _trainer_fixtures import _no_orphans, _one_thread  # noqa: F401  (autouse fixtures)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from trainer.config import TrainConfig, model_config
from trainer.control import coordinator
from trainer.observe.observer import JobObserver
from trainer.runtime.keys import HANDED_SEQ
from trainer.runtime.keys import handed as handed_key
from trainer.runtime.store import SealedStore, StoreAuthError, connect_store, read_token_file, write_token_file

CFG = model_config("tiny-gpt", dtype="float64")
TRAIN = TrainConfig()


def listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} writes them) of sockets in LISTEN on `port`."""
    out = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(name):
            continue
        for line in Path(name).read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hexport, 16) == port:  # 0A: TCP_LISTEN
                out.add(addr)
    return out


def raw_client(port: int) -> dist.TCPStore:
    """A plain TCPStore client: what anyone who can reach the port has."""
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))


@pytest.fixture
def coord(tmp_path):
    c = make_coordinator(CFG, TRAIN, 10, str(tmp_path / "layers"), job="job-a", token="s3cret")
    c.expect([0, 1])
    return c


def test_the_store_listens_on_loopback_only_as_the_os_sees_it(coord):
    assert listening(coord.port) == {"0100007F"}  # 127.0.0.1, not 0.0.0.0 (every interface)


def test_a_client_without_the_token_reads_only_ciphertext(coord):
    raw = raw_client(coord.port)
    spec = raw.get("job/spec")
    assert b"tiny-gpt" not in spec and b"job-a" not in spec and not spec.startswith(b"{")
    with pytest.raises(StoreAuthError, match="wrong token"):
        connect_store("127.0.0.1", coord.port, "guess", 10)
    with pytest.raises(StoreAuthError, match="requires a token and none was given"):
        connect_store("127.0.0.1", coord.port, None, 10)
    # the right token reads it
    assert json.loads(connect_store("127.0.0.1", coord.port, "s3cret", 10).get("job/spec"))["job"] == "job-a"


def landed(raw, key: str) -> None:
    """Wait until the server has applied `raw`'s writes: a TCPStore client's set and append are not answered, so
    without a round trip on the same connection a later read by another client may come first."""
    raw.get(key)


def test_what_a_client_without_the_token_writes_is_ignored(coord, monkeypatch):
    raw = raw_client(coord.port)
    raw.set("ctl/abort", "pwned")  # would stop every worker
    raw.set("ctl/done", "1")
    landed(raw, "ctl/done")
    assert not coord.store.check(["ctl/abort"]) and not coord.store.check(["ctl/done"])
    raw.append("ctl/notices", "0,")  # a forged notice for a real worker, and junk that crashed the driver
    raw.append("ctl/notices", "junk,")
    raw.set("ctl/notice/0", repr(time.time() + 5))
    landed(raw, "ctl/notice/0")
    assert coord.new_notices() == {}
    raw.add(HANDED_SEQ, 1)  # a plan injected past hand_plan's checks
    raw.set(handed_key(1), json.dumps({"strategy": [1, 1], "source": "attacker", "sent_at": 0}))
    landed(raw, handed_key(1))
    assert coord.handed_plans(0) == []  # as good as not written yet...
    monkeypatch.setattr(coordinator, "HANDED_GAP_S", 0.0)
    assert coord.handed_plans(0) == [(1, None)]  # ...and passed over once it stays so
    # a once-only decision cannot be pre-empted by a forged value: the real first writer still wins
    raw.set("ctl/boundary/3", "train")
    landed(raw, "ctl/boundary/3")  # the forgery is there before the first real writer comes
    assert coord.store.compare_set("ctl/boundary/3", "", "hold") == b"hold"
    assert coord.store.compare_set("ctl/boundary/3", "", "train") == b"hold"
    # a forged frame appended to a sealed value is skipped, the sealed part still reads
    coord.store.append("ctl/states/0", "JOINING@-;")
    raw.append("ctl/states/0", "forged")
    landed(raw, "ctl/states/0")
    assert coord.states(0) == ["JOINING@-"]
    assert coord.store.rejected["ctl/states/0"] >= 1


def test_batched_reads_and_writes_are_sealed_and_check_refuses_a_forgery_among_several_keys(coord):
    """`multi_set`, `multi_get` and `check` serve many keys at once, not one request per key (a boundary's reports,
    a step's commit marks): what they write is sealed like `set`, and one forged key among several fails `check`."""
    store, raw = coord.store, raw_client(coord.port)
    store.multi_set(["ctl/e7/phases/0", "ctl/e7/ready/0"], ['{"groups_s": 0.1}', "12.5"])
    assert raw.get("ctl/e7/ready/0") != b"12.5"  # ciphertext to a client without the token
    assert store.multi_get(["ctl/e7/phases/0", "ctl/e7/ready/0"]) == [b'{"groups_s": 0.1}', b"12.5"]
    marks = [f"ctl/e7/commit/3/{w}" for w in range(3)]
    store.multi_set(marks[:2], ["1", "1"])
    assert not store.check(marks)  # one absent
    raw.set(marks[2], "1")  # forged by a client without the token
    landed(raw, marks[2])
    assert not store.check(marks)
    store.set(marks[2], "1")
    assert store.check(marks)
    with pytest.raises(StoreAuthError):
        raw.set("ctl/e7/ready/0", "1.0")
        landed(raw, "ctl/e7/ready/0")
        store.multi_get(["ctl/e7/phases/0", "ctl/e7/ready/0"])
    # get_if: one round trip, writes nothing; a key absent or holding only a forgery reads as None
    assert store.get_if("ctl/e7/decide/3") is None and not raw.check(["ctl/e7/decide/3"])
    raw.set("ctl/e7/decide/3", "apply")
    landed(raw, "ctl/e7/decide/3")
    assert store.get_if("ctl/e7/decide/3") is None and not store.check(["ctl/e7/decide/3"])
    assert store.compare_set("ctl/e7/decide/3", "", "abort") == b"abort"  # the forgery did not pre-empt it
    assert store.get_if("ctl/e7/decide/3") == b"abort" and store.check(["ctl/e7/decide/3"])


def test_take_reads_what_was_appended_since_and_empties_it(coord):
    """`take` consumes a list the workers append to (a checkpoint's shards written): each call returns what came
    since the last, so the list does not grow with the job; a forged frame among them is left out."""
    store, raw = coord.store, raw_client(coord.port)
    assert store.take("ckpt/written") is None
    store.append("ckpt/written", "10:1:0;")
    store.append("ckpt/written", "10:1:1;")
    assert store.take("ckpt/written") == b"10:1:0;10:1:1;"
    assert store.take("ckpt/written") is None and raw.get("ckpt/written") == b""  # emptied in the store
    store.append("ckpt/written", "20:1:0;")
    raw.append("ckpt/written", "99:9:9;")  # a client without the token
    landed(raw, "ckpt/written")
    assert store.take("ckpt/written") == b"20:1:0;"
    store.append("ckpt/written", "20:1:1;")
    assert coord.written_checkpoints() == {(20, 1): {1}} and coord.written_checkpoints() == {(20, 1): {1}}


def test_malformed_values_from_token_holders_are_logged_and_ignored(coord):
    s = coord.store
    s.append("ctl/notices", "junk,")
    s.append("ctl/notices", "99,")  # no such worker
    s.append("ctl/notices", "1,")
    s.set("ctl/notice/1", "nan")  # not a finite deadline
    assert coord.new_notices() == {}
    s.set("ctl/notice/1", repr(time.time() + 30))
    s.append("ctl/notices", "1,")
    assert list(coord.new_notices()) == [1]
    s.add(HANDED_SEQ, 1)
    s.set(handed_key(1), "[" * 100_000)
    s.add(HANDED_SEQ, 1)
    s.set(handed_key(2), json.dumps({"strategy": [0, 2], "source": "x", "sent_at": 1.0}))
    s.add(HANDED_SEQ, 1)
    s.set(handed_key(3), json.dumps({"strategy": [1, 2], "source": "ok", "sent_at": 1.0}))
    assert coord.handed_plans(0) == [(1, None), (2, None), (3, {"strategy": [1, 2], "source": "ok", "sent_at": 1.0})]
    s.append("ckpt/written", "x:y;")
    assert coord.written_checkpoints() == {}
    malformed = [e["key"] for e in coord.log if e.get("event") == "malformed"]
    assert "ctl/notices" in malformed and "ctl/notice/1" in malformed and handed_key(1) in malformed
    assert "ckpt/written" in malformed


def test_a_token_holder_cannot_forge_what_only_the_driver_writes(coord):
    """A worker has the token, but the job, its epochs and the orders to stop, leave or restart are signed by the
    driver: a client with the token but another signer (or none) cannot write them."""
    worker = connect_store("127.0.0.1", coord.port, "s3cret", 10)
    assert worker.driver_key == coord.store.driver_key
    with pytest.raises(StoreAuthError, match="only the job's driver writes store key 'ctl/abort'"):
        worker.set("ctl/abort", "stop")
    impostor = SealedStore(raw_client(coord.port), worker._key, signer=Ed25519PrivateKey.generate())
    for key, value in (("ctl/abort", "stop"), ("ctl/done", "1"), ("ctl/restart/0", "1"), ("ctl/preempt/1", "0"),
                       ("epoch/current", "{}"), ("job/spec", "{}")):  # fmt: skip
        impostor.set(key, value)
        assert not worker.check([key]), key
    # what the driver writes, every client reads
    coord.finish()
    landed(coord.store, "ctl/done")  # (without it the worker's read was once served first: it saw the impostor's)
    assert worker.check(["ctl/done"]) and worker.get("ctl/done") == b"1"


def test_the_token_file_is_readable_by_its_owner_only(tmp_path):
    p = write_token_file(tmp_path / "job" / "token", "abc")
    assert stat.S_IMODE(p.stat().st_mode) == 0o600 and read_token_file(p) == "abc"
    assert stat.S_IMODE(p.parent.stat().st_mode) & 0o077 == 0
    with pytest.raises(StoreAuthError, match="token file .* is empty"):
        read_token_file(write_token_file(tmp_path / "empty", ""))


class Attacker(JobObserver):
    """From a plain client without the token, during the job: reads, and forges what would have stopped, crashed or
    steered it; also checks that no process of the job carries the token in its command line."""

    def __init__(self) -> None:
        self.read: list[bytes] = []
        self.cmdlines: list[bytes] = []
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.token = ""

    def on_start(self, info):
        self.token = read_token_file(info["token_file"])
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                with contextlib.suppress(OSError):
                    self.cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        self.thread = threading.Thread(target=self._run, args=(info["port"],), daemon=True)
        self.thread.start()

    def _run(self, port: int) -> None:
        try:
            raw = raw_client(port)
            while not self.stop.is_set():
                self.read.append(raw.get("job/spec"))
                raw.set("ctl/abort", "pwned")
                raw.append("ctl/notices", "junk,0,1,")
                for w in (0, 1):
                    raw.set(f"ctl/notice/{w}", repr(time.time() + 1))
                    raw.set(f"ctl/restart/{w}", "1")
                raw.add(HANDED_SEQ, 1)
                raw.set(handed_key(raw.add(HANDED_SEQ, 0)), json.dumps({"strategy": [1, 1], "source": "x"}))
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 — the store goes away when the job ends
            if not self.stop.is_set():
                self.error = e

    def on_end(self, result):
        self.stop.set()


def test_a_job_under_attack_from_a_client_without_the_token_trains_as_if_alone(tmp_path):
    kw = dict(timeout_s=120)
    quiet = run_job(CFG, TRAIN, 2, (2, 1), 6, [], tmp_path / "quiet", job="job", **kw)
    attacker = Attacker()
    attacked = run_job(CFG, TRAIN, 2, (2, 1), 6, [], tmp_path / "attacked", job="job", observer=attacker, **kw)
    assert attacker.error is None and attacker.read, "the attacker ran"
    assert attacked["final_checksum"] == quiet["final_checksum"] and attacked["loss"] == quiet["loss"]
    assert attacked["reconfigurations"] == [] and attacked["exit_codes"] == {0: 0, 1: 0}
    assert all(b"job" not in v and b"tiny-gpt" not in v for v in attacker.read)
    assert attacker.token and not any(attacker.token.encode() in c for c in attacker.cmdlines)


def test_the_store_does_not_grow_with_the_steps(tmp_path, monkeypatch):
    """Each step left world + 3 keys in the store (commit marks, the decision, the boundary, the loss), which a job
    of millions of steps would keep in the driver's memory: a job of 90 steps now ends with the keys of one of 30,
    a kill's recovery and a checkpoint-restart included (which rewind and redo steps)."""
    from trainer.control import driver

    counts: list[int] = []
    run = driver.Driver.run

    def counted(self: driver.Driver, *args: object, **kwargs: object) -> None:
        run(self, *args, **kwargs)
        counts.append(self.coord.store.inner.num_keys())

    monkeypatch.setattr(driver.Driver, "run", counted)
    events = [{"step": 12, "kind": "checkpoint-restart", "strategy": [2, 1]}, {"step": 20, "kind": "kill",
              "instances": [1]}, {"step": 21, "kind": "add", "workers": 1}, {"step": 24, "kind": "plan",
              "strategy": [2, 1]}]  # fmt: skip
    kw = dict(timeout_s=120, checkpoint_every=5)
    short = run_job(CFG, TRAIN, 2, (2, 1), 30, events, tmp_path / "short", **kw)
    long = run_job(CFG, TRAIN, 2, (2, 1), 90, events, tmp_path / "long", **kw)
    assert len(short["loss"]) == 30 and len(long["loss"]) == 90 and long["loss"][:30] == short["loss"]
    assert counts[1] - counts[0] < 10, counts  # (60 more steps of 2 workers left ~300 more keys before)
