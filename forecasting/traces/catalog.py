"""The trace catalog: names -> files, and `load_trace` (a name or a path -> the canonical table).

Owns: the traces bundled in ``forecasting/data`` (`BUNDLED`), the shared ones found under ``../shared/traces``
(or ``$PARCAE_SHARED_TRACES``) and their stable names, which cloud a trace was measured on (`trace_cloud`), and
`UnknownTraceError`. Must not touch: parsing
(`forecasting.traces.formats`), binning (`forecasting.traces.table`).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any, Final

import pandas as pd

from forecasting.traces.events import TraceFormatError
from forecasting.traces.formats import detect_format, read_events
from forecasting.traces.table import to_intervals
from liveput import DEFAULT_INTERVAL_S  # the planning grid is liveput's

DATA_DIR: Final = Path(__file__).resolve().parents[1] / "data"

_AWS2020: Final = DATA_DIR / "aws2020"
#: Traces shipped inside the package (see data/ATTRIBUTION.md); always available, even without ../shared.
BUNDLED: Final[dict[str, Path]] = {
    "p3": DATA_DIR / "p3.csv",
    "gcp-v100": DATA_DIR / "gcp-v100.txt",
    # Bamboo's Nov 2020 AWS measurements (step curves; the multi-row ones, under their shared names)
    "aws2020-g4dn-us-east-1c": _AWS2020
    / "aws-spot-instances-g4dn-xlarge-us-east-1c-2020-11-20-1930-to-2020-11-21-2200.csv",
    "aws2020-g4dn-us-east-1d": _AWS2020
    / "aws-spot-instances-g4dn-xlarge-us-east-1d-2020-11-23-1730-to-2020-11-24-1530.csv",
    "aws2020-p2": _AWS2020 / "aws-spot-instances-p2-xlarge-2020-11-20-to-2020-11-23.csv",
    "aws2020-p2-us-east-1e": _AWS2020
    / "aws-spot-instances-p2-xlarge-us-east-1e-2020-11-23-1700-to-2020-11-24-0700.csv",
}


class UnknownTraceError(LookupError):
    """``load_trace`` got a name that is neither bundled, shared, nor an existing file (`message`: what another
    kind of name, a live fleet's, says instead)."""

    def __init__(self, source: str, known: Sequence[str], message: str | None = None) -> None:
        self.source = source
        self.known = tuple(known)
        self.message = message
        super().__init__(
            message
            or f"unknown trace {source!r}: not a bundled or shared trace name and not an existing file. "
            f"Known names: {', '.join(self.known) or '(none)'}. A path to a trace file also works."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.known, self.message))


# ------------------------------------------------------------------------------- named traces


def shared_traces_dir() -> Path:
    """``$PARCAE_SHARED_TRACES`` if set, else ``<repo root>/../shared/traces``."""
    env = os.environ.get("PARCAE_SHARED_TRACES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "traces"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


_SKY_JSON_RE: Final = re.compile(
    r"(?P<kind>[^/]+)/(?P<n>\d+)-node/(?P<window>[^/]+)/(?P<zone>[^/_]+)_(?P<type>[^/]+)\.json$"
)
_SKY_LOG_RE: Final = re.compile(r"(?P<window>(?P<date>\d{4}-\d{2}-\d{2})[^/]*)/(?P<zone>[^/_]+)_(?P<type>[^/]+)\.\w+$")
_AWS2020_RE: Final = re.compile(
    r"aws-spot-instances-(?P<family>[a-z0-9]+)-(?P<size>\d*x?large)-"
    r"(?:(?P<zone>[a-z]{2}-[a-z]+-\d[a-z])-)?(?P<dates>.+?)(?P<scaled>_scaled)?"
)


def _name_tiers(rel: PurePosixPath, fmt: str) -> tuple[str, list[str]]:
    """A naming family and candidate names for a shared file, shortest first.

    Names come from the folder layouts documented in each SOURCE.md, so they stay stable as long as
    the data does. Later candidates add qualifiers (instance type, collection window, source repo);
    the last is the slug of the whole relative path, which is unique.
    """
    text = rel.as_posix()
    top = rel.parts[0] if len(rel.parts) > 1 else ""
    stem = rel.stem
    family = f"other-{fmt}"
    tiers: list[str] = []
    if fmt == "skypilot-json" and (m := _SKY_JSON_RE.search(text)):
        family = f"skypilot-{m['n']}node"
        base = f"{family}-{m['zone']}"
        typed = f"{base}-{m['type']}"
        tiers = [base, typed, f"{typed}-{m['window']}", f"{typed}-{m['window']}-{m['kind']}"]
    elif fmt == "skypilot-log" and (m := _SKY_LOG_RE.search(text)):
        family = "skypilot-log"
        base = f"{family}-{m['zone']}-{m['type']}"
        tiers = [base, f"{base}-{m['date']}", f"{base}-{m['window']}"]
    elif fmt == "aws-step-csv" and (m := _AWS2020_RE.fullmatch(stem)):
        year = re.search(r"\d{4}", m["dates"])
        family = f"aws{year.group(0) if year else ''}"
        base = f"{family}-{m['family']}" + (f"-{m['zone']}" if m["zone"] else "")
        suffix = "-scaled" if m["scaled"] else ""
        tiers = [base + suffix, f"{base}-{m['dates']}{suffix}"]
    elif fmt in ("event-csv", "count-csv"):
        family = "events" if fmt == "event-csv" else "counts"
        core = re.sub(r"[-_]?trace$", "", stem) or stem
        tiers = [f"{core}-{family}", f"{top}-{core}-{family}"]
    elif fmt == "gcp-log":
        family = "gcp"
        tiers = [f"gcp-{stem}", f"{top}-gcp-{stem}"]
    tiers.append(str(rel.with_suffix("")))
    return family, [_slug(t) for t in tiers]


def _assign_names(candidates: list[tuple[Path, str, list[str]]]) -> dict[str, Path]:
    """Give each file a name no other file has, as short as its whole family allows.

    A clash moves every member of the clashing family to its next candidate (not just the two
    clashing files), so names within a family have the same shape: ``skypilot-16node-<zone>`` for all
    16-node files rather than a mix of short and long names.
    """
    level = [0] * len(candidates)
    while True:
        owners: dict[str, list[int]] = defaultdict(list)
        for i, (_, _, tiers) in enumerate(candidates):
            owners[tiers[level[i]]].append(i)
        clashing = {candidates[i][1] for ids in owners.values() if len(ids) > 1 for i in ids}
        bump = [i for i, (_, fam, tiers) in enumerate(candidates) if fam in clashing and level[i] < len(tiers) - 1]
        if not bump:
            break
        for i in bump:
            level[i] += 1
    return {tiers[level[i]]: path for i, (path, _, tiers) in enumerate(candidates)}


def _shared_traces(root: Path) -> dict[str, Path]:
    if not root.is_dir():
        return {}
    candidates: list[tuple[Path, str, list[str]]] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name.startswith(".") or path.name == "SOURCE.md":
            continue
        try:
            fmt = detect_format(path)
        except (TraceFormatError, OSError):
            continue  # not availability data (replay segments, optimizer output, advisor snapshots)
        candidates.append((path, *_name_tiers(PurePosixPath(path.relative_to(root).as_posix()), fmt)))
    return _assign_names(candidates)


def available_traces() -> dict[str, Path]:
    """Names accepted by :func:`load_trace`: bundled traces, plus shared ones when the folder exists."""
    shared = _shared_traces(shared_traces_dir())
    return {**BUNDLED, **{k: v for k, v in shared.items() if k not in BUNDLED}}


def _resolve(source: str | os.PathLike[str]) -> tuple[Path, str]:
    """Path and display name for a trace name or path (names win over same-named files in the cwd)."""
    if isinstance(source, os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no trace file at {path}")
        return path, path.stem
    if source in BUNDLED:
        return BUNDLED[source], source
    known = available_traces()
    if source in known:
        return known[source], source
    path = Path(source)
    if path.is_file():
        return path, path.stem
    raise UnknownTraceError(source, sorted(known))


def load_trace(
    source: str | os.PathLike[str] = "p3",
    interval_s: float = DEFAULT_INTERVAL_S,
    capacity: int | None = None,
) -> pd.DataFrame:
    """Load a trace by bundled/shared name or path as the canonical per-interval table.

    Binning is done from the events, so any ``interval_s`` is exact (unlike :func:`resample`).
    ``capacity`` overrides the known/observed cap; it may not be below the trace's maximum.
    """
    path, name = _resolve(source)
    events = read_events(path)
    events = replace(events, name=name, source=str(path))
    if capacity is not None:
        if isinstance(capacity, bool) or int(capacity) != capacity or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        events = replace(events, capacity=int(capacity))
    return to_intervals(events, interval_s)


#: Formats whose every trace comes from one cloud (the Bamboo/SkyPilot AWS measurements, GCP's preemption logs).
_FORMAT_CLOUD: Final = {"aws-step-csv": "aws", "skypilot-json": "aws", "skypilot-log": "aws", "gcp-log": "gcp"}


def trace_cloud(table: pd.DataFrame) -> str | None:
    """The cloud a loaded trace was measured on ("aws", "gcp"), or None when nothing says (a user's own file):
    what sets the preemption notice a simulation of it assumes. The p3 traces (Bamboo's and Parcae's event and
    count files) are of AWS p3 instances."""
    if table.attrs.get("cloud") in ("aws", "gcp"):  # a live fleet's history on a cloud provider
        return str(table.attrs["cloud"])
    fmt = str(table.attrs.get("format", ""))
    if fmt in _FORMAT_CLOUD:
        return _FORMAT_CLOUD[fmt]
    name = str(table.attrs.get("name", ""))
    if name.startswith("gcp"):
        return "gcp"
    if name == "p3" or re.search(r"(^|-)p3(-|$)", name):
        return "aws"
    return None
