"""What every command of the ``parcae`` command line shares: the `command` decorator, the consoles, the
user-error convention and the checks of options (look-ahead, interval, writable outputs).

Owns: `UserError` (a mistake the user can fix: ``error: <message>`` in red on stderr, exit code 2, no traceback),
`error`/`warn`, `strict_json` (every JSON the command line writes), the writable-path checks. Must not touch: any
command's own options or output (one module per command group; `parcae.cli` lists them and builds the app).
"""

import functools
import math
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text
from typer.core import TyperCommand

#: Exit codes, the same for every command: 0 done; 1 the work failed (a job, a cloud call); 2 a usage error (an
#: option, a file, a setting: the message names the fix); 130 interrupted (Ctrl-C).
EXIT_FAILED = 1
EXIT_USER_ERROR = 2
F = TypeVar("F", bound=Callable[..., Any])


class UserError(Exception):
    """A mistake the user can act on: printed as ``error: <message>``, exit code 2, no traceback."""


class CommandFailed(Exception):
    """The work itself failed (a training job, a cloud call), not the way it was asked for: printed as
    ``error: <message>``, exit code 1, no traceback."""


def stdout() -> Console:
    """Console for results. Piped output gets a wide page instead of rich's 80 columns (tables stay whole)."""
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=max(200, shutil.get_terminal_size((200, 24)).columns))
    return console


_QUIET = False  # ``parcae --quiet``: no progress bars, no notes on stderr (errors and warnings still print)


def set_quiet(quiet: bool) -> None:
    global _QUIET
    _QUIET = quiet


def stderr() -> Console:
    """Console for progress and notes (colour off under ``NO_COLOR``, as rich reads it; silent under --quiet)."""
    return Console(stderr=True, highlight=False, quiet=_QUIET)


def error(message: str) -> None:
    """Print ``error: <message>`` in red on stderr (never wrapped, so paths stay greppable; even under --quiet)."""
    Console(stderr=True, highlight=False).print(Text(f"error: {message}", style="red"), soft_wrap=True)


def warn(message: str) -> None:
    """Print ``warning: <message>`` in yellow on stderr (even under --quiet)."""
    Console(stderr=True, highlight=False).print(Text(f"warning: {message}", style="yellow"), soft_wrap=True)


class GroupedCommand(TyperCommand):
    """A command whose ``--help`` lists its options in named groups (`panels`: title -> option names, in the order
    shown), then the rest under "Options": a command with dozens of options reads as what each group is for. Each
    option also gets its group as its ``rich_help_panel`` (what typer's rich help would draw)."""

    panels: ClassVar[Mapping[str, Sequence[str]]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        where = self.panel_of()
        for param in self.params:
            if param.name in where and hasattr(param, "rich_help_panel"):
                param.rich_help_panel = where[param.name]

    @classmethod
    def panel_of(cls) -> dict[str, str]:
        return {name: title for title, names in cls.panels.items() for name in names}

    def format_options(self, ctx: Any, formatter: Any) -> None:  # (typer's own copy of click's types)
        where = self.panel_of()
        order = {name: i for names in self.panels.values() for i, name in enumerate(names)}
        sections: dict[str, list[tuple[int, tuple[str, str]]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                title = where.get(str(param.name), "Options")
                sections.setdefault(title, []).append((order.get(str(param.name), len(order)), record))
        for title in [*self.panels, "Options"]:
            if sections.get(title):
                with formatter.section(title):
                    formatter.write_dl([record for _, record in sorted(sections[title], key=lambda r: r[0])])


def grouped(panels: Mapping[str, Sequence[str]]) -> type[GroupedCommand]:
    """A `GroupedCommand` class with these `panels`, for ``@command(..., cls=grouped({...}))``."""
    return type("GroupedCommand", (GroupedCommand,), {"panels": dict(panels)})


#: The commands of `app`, by function: (name, ``typer.Typer.command`` keyword arguments); `parcae.cli` adds them.
_COMMANDS: dict[Callable[..., Any], tuple[str | None, dict[str, Any]]] = {}


def command(name: str | None = None, **kwargs: Any) -> Callable[[F], F]:
    """Mark a function as a sub-command of ``parcae`` (`add_commands` adds it to the app, in the order of
    ``parcae --help``); a :class:`UserError` it raises becomes exit code 2.

    ``kwargs`` go to ``typer.Typer.command`` (``help=``, ``epilog=``, ...).
    """

    def mark(fn: F) -> F:
        _COMMANDS[fn] = (name, kwargs)
        return fn

    return mark


def add_commands(typer_app: typer.Typer, *commands: Callable[..., Any]) -> None:
    """Add the functions marked by :func:`command` to ``typer_app``, in this order."""
    for fn in commands:
        name, kwargs = _COMMANDS[fn]
        register(typer_app, name, kwargs)(fn)


def register(typer_app: typer.Typer, name: str | None, kwargs: dict[str, Any]) -> Callable[[F], F]:
    """Decorator adding ``fn`` to ``typer_app`` as a command whose :class:`UserError` exits with code 2 and
    :class:`CommandFailed` with code 1."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kw: Any) -> Any:
            try:
                return fn(*args, **kw)
            except UserError as exc:
                error(str(exc))
                raise typer.Exit(EXIT_USER_ERROR) from None
            except CommandFailed as exc:
                error(str(exc))
                raise typer.Exit(EXIT_FAILED) from None

        typer_app.command(name, **kwargs)(run)
        return fn

    return decorate


def key_error_message(exc: KeyError) -> str:
    """A KeyError's message without the quotes ``str(KeyError)`` adds."""
    return str(exc.args[0]) if exc.args else str(exc)


def check_look_ahead(look_ahead: int, what: str = "--look-ahead") -> None:
    """K within what the planner takes (`liveput.MAX_LOOK_AHEAD`)."""
    from liveput import MAX_LOOK_AHEAD

    if not 1 <= look_ahead <= MAX_LOOK_AHEAD:
        raise UserError(f"{what} must be in [1, {MAX_LOOK_AHEAD}] intervals, got {look_ahead}; ask for fewer "
                        "intervals")  # fmt: skip


def check_interval(interval_s: float, what: str) -> float:
    """An interval T in `forecasting.traces.INTERVAL_S_RANGE` (a finer grid multiplies the work, a coarser one
    plans a day at a time)."""
    from liveput import INTERVAL_S_RANGE, shown

    low, high = INTERVAL_S_RANGE
    if not (math.isfinite(interval_s) and low <= interval_s <= high):
        raise UserError(f"{what} must be a number of seconds in [{low:g}, {high:g}], got {shown(interval_s)}")
    return interval_s


def strict_json(doc: Any, what: str) -> str:
    """``doc`` as strict JSON, which every parser reads: a non-finite number (an overflow) is written as null, with
    a warning naming where."""
    from forecasting import jsonio

    bad = jsonio.non_finite(doc)
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        warn(f"{what}: {', '.join(bad[:3])}{more} not finite; written as null")
    return jsonio.dumps_strict(doc, indent=2)


def json_object_option(raw: str | None, what: str, example: str) -> dict[str, Any]:
    """The JSON object an option holds inline or in @FILE (`{}` when the option is absent), read within
    `forecasting.jsonio`'s bounds on size and nesting, as every JSON input."""
    if raw is None:
        return {}
    fix = f"give an object such as '{example}' or @FILE.json"
    return json_object(raw[1:] if raw.startswith("@") else None, raw, what, fix)


def json_object(path: str | os.PathLike[str] | None, text: str, what: str, fix: str) -> dict[str, Any]:
    """The JSON object in the file at `path` (None: `text` itself), or a UserError that starts with `what` (and
    ends with `fix` where the text is not JSON)."""
    from forecasting import jsonio
    from liveput import shown

    try:
        doc = jsonio.loads(text if path is None else jsonio.read(path))
    except OSError as exc:
        raise UserError(f"{what}: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    except jsonio.JsonSyntaxError as exc:
        raise UserError(f"{what}: not JSON ({exc.at('')}); {fix}") from None
    except jsonio.JsonInputError as exc:
        raise UserError(f"{what}: {exc.at('')}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{what}: expected a JSON object, got {shown(doc)}")
    return doc


def write_json(path: Path, doc: Any) -> None:
    """Write ``doc`` to ``path`` (a ``--json`` option's file) as strict JSON, and say so on stderr."""
    text = strict_json(doc, f"--json {path}")
    write_file(path, "JSON", lambda p: p.write_text(text + "\n", encoding="utf-8"))
    stderr().print(f"wrote {path}", soft_wrap=True)


def progress_bar() -> Progress:
    """The bar of a long command (description, bar, done/total, elapsed), on stderr: stdout is the result."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=stderr()
    )


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def write_file(path: Path, what: str, write: Callable[[Path], Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    except OSError as exc:
        raise UserError(f"cannot write {what} {str(path)!r}: {exc.strerror or exc}") from None


def check_writable(path: Path, what: str) -> None:
    """`path` is not a directory and its folder exists or can be created (else a `UserError` naming it)."""
    if path.is_dir():
        raise UserError(f"cannot write {what} {str(path)!r}: it is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write {what} {str(path)!r}: {exc.strerror or exc}") from None
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"cannot write {what} {str(path)!r}: permission denied; choose a writable place")


def check_writable_dir(path: Path, what: str) -> None:
    """`path` is a folder that exists or can be created, and is writable (else a `UserError` naming it)."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{what}: {str(path)!r} is a file, not a folder; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{what}: cannot create the folder {str(path)!r}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{what}: the folder {str(path)!r} is not writable; choose a writable place")


def check_outputs(json_out: Path | None, plot: Path | None) -> None:
    """Fail before simulating, not after: output folders must be creatable, the plot format known."""
    for path, what in ((json_out, "JSON"), (plot, "plot")):
        if path is not None:
            check_writable(path, what)
    if plot is not None and plot.suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        known = FigureCanvasBase.get_supported_filetypes()
        if plot.suffix[1:].lower() not in known:
            raise UserError(
                f"cannot write plot {str(plot)!r}: unknown image format {plot.suffix!r}; use one of "
                f"{', '.join('.' + k for k in sorted(known))}"
            )
