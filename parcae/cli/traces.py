"""``parcae traces`` and the trace loading the commands share (`load_window`: ``--trace`` and an hour window; a
``fleet:<job tag>`` name is a live fleet's own history in the trace store).

Owns: the messages of an unknown or malformed trace. Must not touch: reading trace formats (`forecasting`'s face:
`load_trace`, `available_traces`); the forecast commands' corpus (`parcae.cli.forecast`).
"""

import difflib
import math
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from parcae.cli.common import UserError, check_interval, command, stdout, warn

if TYPE_CHECKING:
    import pandas as pd


def _unknown_trace_message(exc: Any) -> str:
    """The library's message, with the list of names cut to close matches when it is long."""
    known = list(exc.known)
    if len(known) <= 12 or exc.message:  # (a live fleet's: the store's own message)
        return str(exc)
    close = difflib.get_close_matches(exc.source, known, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return (
        f"unknown trace {exc.source!r}: not a bundled or shared trace name and not an existing file.{hint} "
        f"Run `parcae traces` to list all {len(known)} names; a path to a trace file also works."
    )


def _fleet_histories() -> tuple[str, dict[str, "pd.DataFrame"]]:
    """The trace store's location and the live fleets' histories it holds (none where it does not exist)."""
    from forecasting import TraceStore, trace_store_root

    root = trace_store_root()
    try:
        store = TraceStore(root)
        return store.uri, store.fleet_histories(min_intervals=1) if store.exists() else {}
    except (OSError, ValueError) as exc:
        raise UserError(f"the trace store {root!r} ($PARCAE_TRACE_STORE) cannot be read: {exc}") from None


def load_window(
    trace: str, interval_s: float, start_hour: float | None, end_hour: float | None, *, interval_fix: str | None = None
) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """(full trace, window) for ``--trace`` and the optional hours; every user mistake is a UserError. A live fleet's
    history recorded at another interval says `interval_fix` (default: the --interval-seconds to give)."""
    from forecasting import FleetIntervalError, TraceFormatError, UnknownTraceError, load_trace, slice_hours

    check_interval(interval_s, "--interval-seconds")
    try:
        df = load_trace(trace, interval_s)
    except UnknownTraceError as exc:
        raise UserError(_unknown_trace_message(exc)) from None
    except FleetIntervalError as exc:
        raise UserError(f"{exc}: {interval_fix or f'give --interval-seconds {exc.recorded_s:g}'}") from None
    except TraceFormatError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:  # unreadable file (permissions, a directory, ...)
        raise UserError(f"cannot read trace {trace!r}: {exc.strerror or exc}") from None
    if start_hour is None and end_hour is None:
        return df, df
    iv = float(df.attrs["interval_s"])
    lo = float(df["start_s"].iloc[0]) / 3600.0
    hi = (float(df["start_s"].iloc[-1]) + iv) / 3600.0
    for name, hour in (("--start-hour", start_hour), ("--end-hour", end_hour)):
        if hour is not None and not math.isfinite(hour):
            raise UserError(f"{name} must be a number of hours, got {hour:g}")
    if start_hour is not None and end_hour is not None and not start_hour < end_hour:
        raise UserError(f"--start-hour ({start_hour:g}) must come before --end-hour ({end_hour:g}); the trace "
                        f"covers hours {lo:.3f}-{hi:.3f}")  # fmt: skip
    try:
        window = slice_hours(df, lo if start_hour is None else start_hour, hi if end_hour is None else end_hour)
    except ValueError as exc:
        raise UserError(f"--start-hour/--end-hour: {exc}") from None
    return df, window


@command(
    help=(
        "List the trace names --trace accepts: bundled, ../shared/traces when present, and the live fleets' own "
        "histories in the trace store ($PARCAE_TRACE_STORE, else ./trace-store), as fleet:<job tag>."
    )
)
def traces() -> None:
    from forecasting import TraceFormatError, available_traces, detect_format

    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("name", no_wrap=True)
    table.add_column("format", no_wrap=True)
    table.add_column("path", overflow="fold")
    for name, path in available_traces().items():
        try:
            fmt = detect_format(path)
        except (TraceFormatError, OSError) as exc:
            fmt = f"? ({type(exc).__name__})"
        table.add_row(name, fmt, str(path))
    try:
        where, histories = _fleet_histories()
    except UserError as exc:  # the bundled traces are still worth listing
        warn(str(exc))
        histories = {}
    for name, history in histories.items():
        fmt = f"fleet history: {len(history)} x {float(history.attrs['interval_s']):g} s"
        table.add_row(name, fmt, f"{where} (fleet_intervals)")
    stdout().print(table)
