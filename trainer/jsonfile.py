"""A user's JSON file, read within `forecasting.jsonio`'s bounds, its failures raised as the reader's own error.

Owns: `load_json`, the one reading of a JSON document from a file that the trainer's file formats share (an events
schedule, `trainer.control.events`; a runtime profile, `trainer.observe.profile`). Must not touch: what the document
means (each reader validates its own), how the bounds are checked (`forecasting.jsonio`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from forecasting import jsonio

#: How a document that is not JSON at all is described, after "<path>: ".
NOT_JSON = "not valid JSON: {reason} at line {line} column {column}"


def load_json(
    path: str | os.PathLike[str], error: type[Exception], what: str, expected: str, not_json: str = NOT_JSON
) -> Any:
    """The decoded document at `path`; a file that cannot be read, is not JSON (`not_json`, formatted with the
    parser's reason, line and column) or is refused by the bounds (too large, too deep, not UTF-8; `expected` says
    what the file should be) raises `error` with a message that starts with the file's name."""
    p = Path(path)
    try:
        return jsonio.loads(jsonio.read(p))  # bounded: size, nesting, UTF-8
    except OSError as e:
        raise error(f"{p}: cannot read {what} ({e.strerror or e})") from None
    except jsonio.JsonSyntaxError as e:
        raise error(f"{p}: " + not_json.format(reason=e.reason, line=e.line, column=e.column)) from None
    except jsonio.JsonInputError as e:
        raise error(f"{e.at(str(p))}; {expected}") from None
