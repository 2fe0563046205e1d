"""The control plane's store: one `torch.distributed.TCPStore`, bound only where asked, every value sealed.

Owns: binding the store's listening socket (`host_store`), connecting clients (`connect_store`), the per-job token
(`new_token`, `write_token_file`, `read_token_file`, `TOKEN_ENV`) and `SealedStore`, the wrapper every client —
coordinator, workers, agents, `trainer.control.planning.hand_plan`, gloo's rendezvous — talks through.
Must not touch: what the keys mean (`trainer.runtime.keys` lists the layout), processes, tensors.

Why sealing: TCPStore has no authentication; anyone who reaches its port can read and write every key. A job's
token is therefore turned into a key (scrypt over a per-job salt) and every value is written as AES-SIV frames
(`cryptography`), authenticated with the key's name, so a client without the token reads only ciphertext, and
what it writes is rejected by every reader (logged and skipped). What only the driver may write (`DRIVER_ONLY`: the
job, its epochs, orders to leave, restart or stop) is also signed with the driver's Ed25519 key, so a token holder
— a worker — cannot forge it either; local workers get the driver's public key at start, other clients read it
from the store when they connect (trust on first use). AES-SIV is deterministic, which keeps
`compare_set` (the once-only boundary decisions) working on sealed values. What sealing cannot stop: counters
(`add`) are plain integers, and a client on the port can delete keys or bump counters — a denial of service,
never a forged value. The port itself listens only on the requested address (torch 2.13's TCPStore would listen on
every interface: stack.md §8), loopback by default.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import secrets
import socket
import struct
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESSIV
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # imported from torch._C, not re-exported
from torch.distributed.distributed_c10d import Store

from trainer.runtime.keys import DRIVER_ONLY  # what only the driver writes: signed as well as sealed

log = logging.getLogger(__name__)

TOKEN_FILE = "token"  # in a job's out_dir (0600): where clients that hand plans in read the token
TOKEN_ENV = "PARCAE_TOKEN"  # how a token reaches a worker or agent process: the environment, never argv (`ps`)
SALT_KEY = "auth/salt"  # plain: a client needs it before it can derive the key
CHECK_KEY = "auth/check"  # sealed CHECK_VALUE: a client with the wrong token fails to open it
CHECK_VALUE = b"parcae-control-plane"
MAGIC = b"\x00pS1"  # starts every sealed frame; a frame is MAGIC, its length (4 bytes, big-endian), the ciphertext
_HEAD = struct.Struct(">4sI")
MAX_VALUE_BYTES = 1 << 30  # a frame claiming more is not one of ours
DRIVER_KEY = "auth/driver"  # sealed: the driver's Ed25519 public key (hex), for clients not given it at start
DRIVER_KEY_ENV = "PARCAE_DRIVER_KEY"  # how an agent passes the driver's public key on to its worker
_SIG = 64  # bytes of an Ed25519 signature
# `SealedStore.get_if`'s compare-and-set: an expectation no value of ours (a sealed frame starts with MAGIC) equals,
# and a value it never writes (TCPStore only writes on a match, or for an absent key with an empty expectation)
_PROBE, _PROBE_NEVER = b"\x00parcae-probe", b"\x00parcae-probe-never-written"


class StoreAuthError(RuntimeError):
    """A store value that is not sealed with this job's token (written by a client without it), or a client whose
    token does not open the job's store."""


def new_token() -> str:
    """A fresh per-job token (256 random bits)."""
    return secrets.token_urlsafe(32)


def write_token_file(path: str | os.PathLike[str], token: str) -> Path:
    """Write `token` to `path`, readable by its owner only (0600, created so; the folder is created 0700)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode is masked by the umask, and ignored for an existing file
        os.write(fd, token.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p)
    return p


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in `path`; a `StoreAuthError` naming the file if it cannot be read or is empty."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise StoreAuthError(f"cannot read the job's token file {str(path)!r}: {e}") from None
    if not token:
        raise StoreAuthError(f"the job's token file {str(path)!r} is empty")
    return token


_KEYS: dict[tuple[str, bytes], bytes] = {}


def derive_key(token: str, salt: bytes) -> bytes:
    """The 512-bit AES-SIV key of `token` for a job's `salt` (scrypt: a guessable token stays costly to guess)."""
    k = (token, salt)
    if k not in _KEYS:
        _KEYS[k] = hashlib.scrypt(token.encode(), salt=salt, n=1 << 14, r=8, p=1, dklen=64)
    return _KEYS[k]


def _bytes(value: str | bytes | bytearray | Sequence[int]) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class SealedStore(Store):
    """A store whose values are sealed with the job's key: the same interface as the `TCPStore` it wraps (so it
    serves `PrefixStore` and gloo's rendezvous too). `get` returns the authentic frames' plaintexts joined (an
    appended value is one frame per `append`); frames that do not authenticate are skipped and counted in
    `rejected`; a value with none raises `StoreAuthError`. Keep a Python reference to it while C++ uses it (a
    pybind trampoline loses its Python methods when its Python object is collected)."""

    def __init__(
        self, inner: Store, key: bytes, *, signer: Ed25519PrivateKey | None = None,
        driver: Ed25519PublicKey | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.inner = inner
        self._aead = AESSIV(key)
        self._key = key
        self._signer = signer  # the driver's: it alone writes `DRIVER_ONLY` keys
        self._driver = signer.public_key() if signer is not None else driver  # verifies them (None: not yet known)
        self.rejected: dict[str, int] = {}  # key -> forged stretches seen (each read counts again)

    @property
    def driver_key(self) -> str | None:
        """The driver's public key (hex) this client verifies driver-only values with."""
        return None if self._driver is None else self._driver.public_bytes_raw().hex()

    def pin_driver(self, public_hex: str) -> None:
        """Verify driver-only values with this key from now on (`StoreAuthError` if it is not one)."""
        try:
            self._driver = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex))
        except ValueError:
            raise StoreAuthError(f"not an Ed25519 public key: {public_hex[:80]!r}") from None

    @property
    def port(self) -> int:
        port: int = self.inner.port  # type: ignore[attr-defined]  # a TCPStore's (what host_store/connect_store wrap)
        return port

    def _seal(self, key: str, value: str | bytes) -> bytes:
        data = _bytes(value)
        if DRIVER_ONLY.fullmatch(key):
            if self._signer is None:
                raise StoreAuthError(f"only the job's driver writes store key {key!r}")
            data = self._signer.sign(key.encode() + b"\0" + data) + data
        ct = self._aead.encrypt(data, [key.encode()])
        return _HEAD.pack(MAGIC, len(ct)) + ct

    def _signed(self, key: str, data: bytes) -> bytes | None:
        """A driver-only value without its signature, or None if the signature is not the driver's."""
        sig, value = data[:_SIG], data[_SIG:]
        if len(sig) < _SIG:
            return None
        if self._driver is not None:
            try:
                self._driver.verify(sig, key.encode() + b"\0" + value)
            except InvalidSignature:
                return None
        return value

    def _frames(self, key: str, data: bytes) -> tuple[list[bytes], int]:
        """The plaintexts of `data`'s authentic frames, and how many stretches of it were not ours."""
        out, i, bad = [], 0, 0
        while i < len(data):
            if data[i : i + 4] == MAGIC and i + _HEAD.size <= len(data):
                _, n = _HEAD.unpack_from(data, i)
                end = i + _HEAD.size + n
                if n <= MAX_VALUE_BYTES and end <= len(data):
                    try:
                        plain = self._aead.decrypt(data[i + _HEAD.size : end], [key.encode()])
                    except InvalidTag:
                        plain = None
                    if plain is not None and DRIVER_ONLY.fullmatch(key):
                        plain = self._signed(key, plain)  # sealed by a token holder, but not signed by the driver
                    if plain is not None:
                        out.append(plain)
                        i = end
                        continue
            bad += 1  # not a frame of ours here: resynchronise at the next marker
            j = data.find(MAGIC, i + 1)
            i = len(data) if j < 0 else j
        return out, bad

    def _open(self, key: str, data: bytes) -> bytes:
        out, bad = self._frames(key, data)
        if bad:
            if key not in self.rejected:  # once per key: polled keys would repeat it every few ms
                log.warning("store key %r holds a value not sealed with the job's token (a client without it wrote "
                            "it): ignored", key)  # fmt: skip
            self.rejected[key] = self.rejected.get(key, 0) + bad
        if not out:  # a value of ours is never empty: it has at least one frame
            raise StoreAuthError(f"store key {key!r} holds no value sealed with this job's token")
        return b"".join(out)

    # -- the Store interface ----------------------------------------------------------------------------------
    def set(self, key: str, value: str | bytes) -> None:
        self.inner.set(key, self._seal(key, value))  # type: ignore[arg-type]  # stub gap: values may be bytes

    def get(self, key: str) -> bytes:
        return self._open(key, bytes(self.inner.get(key)))

    def append(self, key: str, value: str | bytes) -> None:
        self.inner.append(key, self._seal(key, value))  # type: ignore[attr-defined]  # stub gap: Store.append

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """TCPStore's compare-and-set on sealed values; a value holding a forgery counts as its authentic part
        (absent if none), so a forged value cannot pre-empt a once-only decision."""
        exp = _bytes(expected)
        want, new = (self._seal(key, exp) if exp else b""), self._seal(key, desired)
        for _ in range(16):
            cur = bytes(self.inner.compare_set(key, want, new))  # type: ignore[arg-type]  # stub gap: bytes values
            if cur == new:
                return _bytes(desired)
            if cur == want:  # absent, with a non-empty expectation (TCPStore returns the expectation)
                return exp
            plain, bad = self._frames(key, cur)
            if not bad:
                return b"".join(plain)
            # strip the forgery atomically (from exactly what we saw), then decide again
            clean = self._seal(key, b"".join(plain)) if plain else (want or new)
            self.inner.compare_set(key, cur, clean)  # type: ignore[arg-type]  # stub gap: bytes values
        raise StoreAuthError(f"store key {key!r} keeps being rewritten by a client without the job's token")

    def get_if(self, key: str) -> bytes | None:
        """`key`'s value, or None if it is absent or holds nothing sealed with the job's token — in one round trip
        (a compare-and-set that never matches: TCPStore answers with the value, or with the expectation if the key
        is absent, and writes nothing). What a loop waiting for a decision polls."""
        got = bytes(self.inner.compare_set(key, _PROBE, _PROBE_NEVER))  # type: ignore[arg-type]  # stub gap: bytes
        if got == _PROBE:
            return None
        try:
            return self._open(key, got)
        except StoreAuthError:
            return None

    def take(self, key: str) -> bytes | None:
        """What was appended to `key` (`append`) since the last take, emptying it — unless something was appended
        meanwhile: then nothing is emptied, and the next take returns all of it again (its reader merges what it
        reads, so reading twice is harmless). For a list that workers append to and one reader consumes, which
        would otherwise grow with the job and be read whole at every poll. None when nothing is there."""
        got = bytes(self.inner.compare_set(key, _PROBE, _PROBE_NEVER))  # type: ignore[arg-type]  # stub gap: bytes
        if got in (_PROBE, b""):
            return None
        self.inner.compare_set(key, got, b"")  # type: ignore[arg-type]  # (fails if appended meanwhile: see above)
        try:
            return self._open(key, got)
        except StoreAuthError:
            return None

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Several keys' values in one round trip (TCPStore's own; waits, as `get` does, for absent keys)."""
        raw = self.inner.multi_get(keys)
        return [self._open(k, bytes(v)) for k, v in zip(keys, raw, strict=True)]

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        """Several keys set in one request (a worker's reports at a boundary, where every request is paid for)."""
        sealed = [self._seal(k, v) for k, v in zip(keys, values, strict=True)]
        self.inner.multi_set(keys, sealed)  # type: ignore[attr-defined]  # stub gap: Store.multi_set

    def add(self, key: str, amount: int) -> int:
        return self.inner.add(key, amount)

    def check(self, keys: list[str]) -> bool:
        """Every key exists and holds a sealed value: one forged by a client without the token is as good as
        absent (a forged `ctl/abort` must not stop the job). Not for counters (`add`): read those with add(k, 0)."""
        if len(keys) == 1:
            return self.get_if(keys[0]) is not None
        if not self.inner.check(keys):
            return False
        raw = self.inner.multi_get(keys)  # one round trip for all the keys, not one each
        return all(self._authentic(k, bytes(v)) for k, v in zip(keys, raw, strict=True))

    def _authentic(self, key: str, data: bytes) -> bool:
        try:
            self._open(key, data)
        except StoreAuthError:
            return False
        return True

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    def has_extended_api(self) -> bool:
        return False

    def clone(self) -> SealedStore:
        inner = self.inner.clone()  # type: ignore[attr-defined]  # stub gap: Store.clone
        return SealedStore(inner, self._key, signer=self._signer, driver=self._driver)


def _listener(host: str, port: int) -> socket.socket:
    """A socket listening on `host:port` only (0: a free port)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def host_store(host: str, port: int, token: str, timeout_s: float) -> SealedStore:
    """Host the job's store on `host:port` (0: a free port) — listening there only — sealed with `token`; publishes
    the salt and the check value clients verify their token against."""
    sock = _listener(host, port)
    bound = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the descriptor from here on (it closes it)
    try:
        raw = TCPStore(host, bound, world_size=None, is_master=True, wait_for_workers=False,
                       timeout=timedelta(seconds=timeout_s), master_listen_fd=fd)  # fmt: skip
    except BaseException:
        os.close(fd)
        raise
    salt = secrets.token_bytes(16)
    raw.set(SALT_KEY, salt.hex())
    store = SealedStore(raw, derive_key(token, salt), signer=Ed25519PrivateKey.generate())
    store.set(CHECK_KEY, CHECK_VALUE)
    store.set(DRIVER_KEY, store.driver_key or "")
    return store


def connect_store(
    host: str, port: int, token: str | None, timeout_s: float, *, driver_key: str | None = None
) -> SealedStore:
    """A client of the job's store at `host:port`, with `token`; `StoreAuthError` saying why if there is no token,
    no job there, or the token is not the job's. Driver-only values are verified with `driver_key` (the driver's
    public key, hex: given to local workers at start), else with the one the store publishes, read once here.
    Connection errors are the TCPStore's (RuntimeError)."""
    where = f"coordinator at {host}:{port}"
    raw = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    if not token:
        raise StoreAuthError(f"the {where} requires a token and none was given")
    if not raw.check([SALT_KEY, CHECK_KEY]):
        raise StoreAuthError(f"{host}:{port} is not a parcae job's coordinator (no job's store there)")
    try:
        salt = bytes.fromhex(raw.get(SALT_KEY).decode())
    except (UnicodeDecodeError, ValueError):
        raise StoreAuthError(f"the {where} has a malformed salt") from None
    store = SealedStore(raw, derive_key(token, salt))
    try:
        ok = store.get(CHECK_KEY) == CHECK_VALUE
    except StoreAuthError:
        ok = False
    if not ok:
        raise StoreAuthError(f"wrong token for the {where}")
    store.pin_driver(driver_key or store.get(DRIVER_KEY).decode())
    return store


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (a coordinator bound there is unreachable from other hosts)."""
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except (OSError, ValueError):
            return False
