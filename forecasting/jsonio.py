"""Bounded JSON in, strict JSON out: the one place that says how deep, how big and how finite our JSON may be.

It lives in `forecasting`, the package every other one may import (it imports no other package of ours), so the
trace readers, the trainer's events and profiles and the command line share it without an import running upward.

Owns: reading a JSON document a user handed us (a plan input, a SkyPilot trace, an events schedule, a runtime
profile) within bounds checked *before* parsing, and writing JSON that every parser accepts. Must not touch: what
the document means; each reader turns :class:`JsonInputError` into its own error type (``UserError``,
``TraceFormatError``, ``EventError``, ``ProfileFormatError``), naming its file.

Why: ``json.loads`` recurses once per nesting level, so 200,000 ``[`` end in a ``RecursionError``; an integer of
5,000 digits ends in a ``ValueError`` that is not a ``JSONDecodeError``; bytes that are not UTF-8 end in a
``UnicodeDecodeError`` without the file's name. And ``json.dumps`` writes ``Infinity``/``NaN`` by default, which
is not JSON (``jq``, JavaScript and most parsers reject it).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, Final, TextIO

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "JsonInputError",
    "JsonSyntaxError",
    "decode",
    "dumps_strict",
    "loads",
    "non_finite",
    "read",
    "read_bounded",
    "read_stream",
    "strict",
]

#: Deepest nesting of arrays and objects we parse. Our documents nest a handful of levels (a runtime profile's
#: measured data is the deepest); 64 leaves room for any hand-written one, far below Python's recursion limit.
MAX_JSON_DEPTH: Final = 64
#: Bytes of a JSON document handed to us (a plan input, an events schedule, a runtime profile): ours are under
#: 1 MB; 16 MiB parse in a fraction of a second and keep a mistaken multi-gigabyte file out of memory.
MAX_JSON_BYTES: Final = 16 * 2**20

# A JSON string (skipped: brackets inside strings do not nest) or one bracket.
_TOKENS: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


class JsonInputError(ValueError):
    """A document we refuse to parse, or cannot: ``reason`` says why, ``line``/``column`` (1-based) where."""

    def __init__(self, reason: str, line: int | None = None, column: int | None = None) -> None:
        self.reason, self.line, self.column = reason, line, column
        super().__init__(self.at(""))

    def at(self, name: str) -> str:
        """The message for the document called ``name``: ``"<name> line L column C: <reason>"``."""
        where = [name] if name else []
        if self.line is not None:
            where.append(f"line {self.line}" + (f" column {self.column}" if self.column is not None else ""))
        return f"{' '.join(where)}: {self.reason}" if where else self.reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.line, self.column))


class JsonSyntaxError(JsonInputError):
    """Not JSON at all: ``reason`` is the parser's message (``Expecting value``), ``line``/``column`` where."""

    def at(self, name: str) -> str:
        where = f"{name} line {self.line} column {self.column}".strip()
        return f"{where}: invalid JSON: {self.reason}"


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _check_depth(text: str, max_depth: int) -> None:
    depth = 0
    for m in _TOKENS.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > max_depth:
                line, column = _position(text, m.start())
                raise JsonInputError(
                    f"arrays and objects nested more than {max_depth} deep; flatten the document", line, column
                )
        elif c in "]}":
            depth -= 1


def decode(data: bytes) -> str:
    """``data`` as UTF-8 text (a BOM tolerated), else a JsonInputError saying where the first bad byte is."""
    try:
        text = data.decode("utf-8")  # not utf-8-sig: its error offsets would not count the BOM
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1  # in bytes
        raise JsonInputError(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8 JSON", line, column
        ) from None
    return text.removeprefix("\ufeff")


_CHUNK: Final = 2**20


def read_bounded(stream: BinaryIO | TextIO, max_bytes: int) -> bytes | None:
    """Everything ``stream`` holds if that is at most ``max_bytes`` bytes, else None. In chunks: ``read(n)``
    allocates ``n`` bytes up front, and a pipe or a device has no size to check first."""
    chunks: list[bytes] = []
    total = 0
    while chunk := stream.read(_CHUNK):
        if isinstance(chunk, str):  # a text stream: its characters, counted as their UTF-8 bytes
            chunk = chunk.encode("utf-8", errors="surrogateescape")
        total += len(chunk)
        if total > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def read_stream(stream: BinaryIO | TextIO, max_bytes: int = MAX_JSON_BYTES) -> str:
    """The text of a JSON stream (stdin) of at most ``max_bytes`` bytes, else a JsonInputError."""
    data = read_bounded(stream, max_bytes)
    if data is None:
        raise JsonInputError(f"larger than {max_bytes:,} bytes, the most a JSON input may hold")
    return decode(data)


def read(path: str | os.PathLike[str], max_bytes: int = MAX_JSON_BYTES) -> str:
    """The text of a JSON file of at most ``max_bytes`` bytes. OSError as ``open`` raises it; JsonInputError for
    a file too large or not UTF-8."""
    with Path(path).open("rb") as fh:
        return read_stream(fh, max_bytes)


def loads(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)`` after checking its nesting, with every failure a JsonInputError (never a
    RecursionError or a bare ValueError). ``NaN``/``Infinity`` parse as Python accepts them: validate the values."""
    _check_depth(text, max_depth)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise JsonSyntaxError(exc.msg, exc.lineno, exc.colno) from None
    except RecursionError:  # a deep call stack already: the bound above did not leave enough room
        raise JsonInputError("arrays and objects nested too deep to parse; flatten the document") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits())
        limit = sys.get_int_max_str_digits()
        raise JsonInputError(f"an integer of more than {limit} digits; write it with fewer digits") from None


def strict(value: Any) -> Any:
    """``value`` with every non-finite float (inf, -inf, nan) replaced by None, recursively (tuples become lists)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def non_finite(value: Any, path: str = "") -> list[str]:
    """Where ``value`` holds a non-finite float, as dotted paths (``steps[2].expected_samples``), to warn about."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "the value"]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in non_finite(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in non_finite(v, f"{path}[{i}]")]
    return []


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """JSON text every parser accepts: non-finite numbers are written as ``null`` (see :func:`strict`)."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)
