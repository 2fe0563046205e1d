"""The ``parcae`` command line: simulate policies on a spot trace, plan one interval, list traces.

Commands
--------
``parcae simulate``
    Replay a spot-availability trace and compare policies (samples, dollars, migrations).
``parcae simulations [--comparison ID]``
    Show a comparison logged by ``parcae simulate --mlflow``, rebuilt from MLflow with ``mlflow.search_runs``
    (``parcae.simulations``); without an id, list the latest.
``parcae plan [INPUT.json|-]``
    Run the liveput planner once on a forecast and print the plan as JSON.
``parcae traces``
    List the trace names ``--trace`` accepts.
``parcae forecast train|evaluate|predict``
    Train, log and promote the LightGBM forecaster in MLflow (``forecasting.registry``); backtest
    forecasters on a trace (scores as JSON); print one forecast (``Forecast.to_dict()``) as JSON.
``parcae collect``
    Record the job's spot fleet, spot prices and placement scores from EC2 (``forecasting.collect``).
``parcae train``
    Run the elastic CPU trainer on local worker processes (or instance agents on other hosts over ssh), from a
    trace or scripted events (``trainer.control.run``, ``trainer.providers.hosts``).
``parcae profile``
    Measure the trainer's iteration time per D x P and its migration pauses; calibrate the cost model
    (``trainer.observe.profile``).

Plan input
----------
``parcae plan`` reads one JSON object (from a file, or stdin with ``-``)::

    {
      "model": "gpt-1.5b",                 # required: a bundled model (see the error for the list)
      "interval_s": 60,                    # optional (60): the interval T in seconds, > 0
      "state": {                           # optional (not running)
        "strategy": [D, P],                #   running strategy; [0, 0] = not running; D*P must not
                                           #   exceed forecast[0].prev_available
        "migrating": false,                #   a migration still in flight?
        "leftover_ms": 0                   #   its remaining time in ms (>= 0)
      },
      "forecast": [                        # required: one entry per future interval; K = its length
        {"prev_available": 32,             #   instances alive before the interval's events (>= 0)
         "events": [[n_in, n_out, prob], ...]},  # optional (no events): a law over (additions,
        ...                                      #   preemptions); probabilities sum to 1
      ]
    }

The output is ``Plan.to_dict()`` (decision, expected samples, the K steps, the alternatives the decision
beat) plus ``"model"`` and ``"look_ahead"``. It is deterministic: the same input gives the same bytes
(the planner's wall time, ``decision_ms``, is only added with ``--timing``). Every JSON the command line
writes is strict JSON (``forecasting.jsonio.dumps_strict``): a non-finite number becomes ``null``, with a warning.

The input is bounded before the planner runs: ``forecasting.jsonio.MAX_JSON_BYTES`` and ``MAX_JSON_DEPTH``,
K <= ``liveput.MAX_LOOK_AHEAD``, ``interval_s`` in ``forecasting.traces.INTERVAL_S_RANGE``, counts
<= ``forecasting.traces.MAX_INSTANCES``, ``liveput.plan_input.MAX_EVENTS_PER_INTERVAL`` events per interval.

Errors
------
A mistake the user can fix (unknown trace, model or policy, malformed trace file, window outside the
trace, bad plan input, an infeasible forecast) prints ``error: <message>`` in red on stderr and exits with code 2, without a
traceback. Anything else is a bug and propagates.

Adding a command
----------------
Write one function decorated with ``@command()`` (typer options as parameters); raise
:class:`UserError` for mistakes the user can fix. See ``traces`` for the smallest example.
"""

import difflib
import functools
import json
import math
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from forecasting import DEFAULT_INTERVAL_S, FORECASTERS
from liveput import DEFAULT_LOOK_AHEAD

__all__ = ["UserError", "app", "command"]

app = typer.Typer(
    name="parcae",
    help="Plan D x P training strategies on spot instances: simulate policies on traces, plan from forecasts.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # help text is printed as written: the plan input example must stay intact
)

EXIT_USER_ERROR = 2
F = TypeVar("F", bound=Callable[..., Any])


class UserError(Exception):
    """A mistake the user can act on: printed as ``error: <message>``, exit code 2, no traceback."""


def _stdout() -> Console:
    """Console for results. Piped output gets a wide page instead of rich's 80 columns (tables stay whole)."""
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=max(200, shutil.get_terminal_size((200, 24)).columns))
    return console


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def error(message: str) -> None:
    """Print ``error: <message>`` in red on stderr (never wrapped, so paths stay greppable)."""
    _stderr().print(Text(f"error: {message}", style="red"), soft_wrap=True)


def warn(message: str) -> None:
    """Print ``warning: <message>`` in yellow on stderr."""
    _stderr().print(Text(f"warning: {message}", style="yellow"), soft_wrap=True)


def command(name: str | None = None, **kwargs: Any) -> Callable[[F], F]:
    """Register a sub-command of :data:`app`; a :class:`UserError` it raises becomes exit code 2.

    ``kwargs`` go to ``typer.Typer.command`` (``help=``, ``epilog=``, ...).
    """
    return _register(app, name, kwargs)


def _register(typer_app: typer.Typer, name: str | None, kwargs: dict[str, Any]) -> Callable[[F], F]:
    """Decorator adding ``fn`` to ``typer_app`` as a command whose :class:`UserError` exits with code 2."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kw: Any) -> Any:
            try:
                return fn(*args, **kw)
            except UserError as exc:
                error(str(exc))
                raise typer.Exit(EXIT_USER_ERROR) from None

        typer_app.command(name, **kwargs)(run)
        return fn

    return decorate


def _key_error_message(exc: KeyError) -> str:
    """A KeyError's message without the quotes ``str(KeyError)`` adds."""
    return str(exc.args[0]) if exc.args else str(exc)


def _load_model(model: str, global_batch: int | None = None):
    """Throughput profile and reference cost model of ``model``; an unknown model is a UserError."""
    from liveput import CostModel, load_profile

    try:
        profile = load_profile(model)  # the bundled table: an unknown model fails here, naming the known ones
        if global_batch is not None and global_batch != profile.global_batch:
            _check_global_batch(model, global_batch)
            profile = load_profile(model, global_batch)
        cost = CostModel.reference(model)
    except KeyError as exc:
        raise UserError(_key_error_message(exc)) from None
    return profile, cost


def _check_global_batch(model: str, global_batch: int) -> None:
    """--global-batch within what the throughput estimate simulates (beyond it, minutes and then a MemoryError)."""
    from liveput import MAX_MICRO_BATCHES, max_global_batch

    most = max_global_batch(model)
    if not 1 <= global_batch <= most:
        raise UserError(
            f"--global-batch must be in [1, {most}] for {model} (its throughput is estimated by simulating at most "
            f"{MAX_MICRO_BATCHES} micro-batches per iteration), got {global_batch}; give a smaller global batch"
        )


def _check_look_ahead(look_ahead: int, what: str = "--look-ahead") -> None:
    """K within what the planner takes (`liveput.MAX_LOOK_AHEAD`)."""
    from liveput import MAX_LOOK_AHEAD

    if not 1 <= look_ahead <= MAX_LOOK_AHEAD:
        raise UserError(f"{what} must be in [1, {MAX_LOOK_AHEAD}] intervals, got {look_ahead}; ask for fewer "
                        "intervals")  # fmt: skip


def _check_interval(interval_s: float, what: str) -> float:
    """An interval T in `forecasting.traces.INTERVAL_S_RANGE` (a finer grid multiplies the work, a coarser one
    plans a day at a time)."""
    from forecasting import INTERVAL_S_RANGE

    low, high = INTERVAL_S_RANGE
    if not (math.isfinite(interval_s) and low <= interval_s <= high):
        raise UserError(f"{what} must be a number of seconds in [{low:g}, {high:g}], got {_shown(interval_s)}")
    return interval_s


def _shown(value: Any) -> str:
    """A value as a message shows it: its JSON, at most 60 characters (a hostile input can be megabytes)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _strict_json(doc: Any, what: str) -> str:
    """``doc`` as strict JSON, which every parser reads: a non-finite number (an overflow) is written as null, with
    a warning naming where."""
    from forecasting import jsonio

    bad = jsonio.non_finite(doc)
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        warn(f"{what}: {', '.join(bad[:3])}{more} not finite; written as null")
    return jsonio.dumps_strict(doc, indent=2)


# ----------------------------------------------------------------------------------------------- simulate


def _unknown_trace_message(exc: Any) -> str:
    """The library's message, with the list of names cut to close matches when it is long."""
    known = list(exc.known)
    if len(known) <= 12:
        return str(exc)
    close = difflib.get_close_matches(exc.source, known, n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return (
        f"unknown trace {exc.source!r}: not a bundled or shared trace name and not an existing file.{hint} "
        f"Run `parcae traces` to list all {len(known)} names; a path to a trace file also works."
    )


def _load_window(trace: str, interval_s: float, start_hour: float | None, end_hour: float | None):
    """(full trace, window) for ``--trace`` and the optional hours; every user mistake is a UserError."""
    from forecasting import TraceFormatError, UnknownTraceError, load_trace, slice_hours

    _check_interval(interval_s, "--interval-seconds")
    try:
        df = load_trace(trace, interval_s)
    except UnknownTraceError as exc:
        raise UserError(_unknown_trace_message(exc)) from None
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


def _check_policies(policies: Sequence[str] | None) -> list[str]:
    from liveput import POLICY_NAMES

    if not policies:
        return list(POLICY_NAMES)
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        bad = ", ".join(repr(p) for p in unknown)
        raise UserError(f"unknown policy {bad}; choose from {', '.join(POLICY_NAMES)}")
    return list(dict.fromkeys(policies))  # repeated names run once


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_migrations(migrations: Mapping[str, float]) -> str:
    """Expected migrations per kind, most frequent first, the start last: ``pipeline 4, inter-stage 1.44``."""
    items = sorted(
        ((k, float(v)) for k, v in migrations.items() if v > 0), key=lambda kv: (kv[0] == "start", -kv[1], kv[0])
    )
    return ", ".join(f"{k} {round(v, 2):g}" for k, v in items) or "-"


_HEADERS = (
    "policy",
    "samples",
    "vs ideal",
    "samples/s",
    "instance-h",
    "cost $",
    "$/M samples",
    "migration s",
    "planner ms",
    "migrations (expected)",
)


def _result_rows(results: Mapping[str, Any], ideal_samples: float | None) -> list[tuple[str, ...]]:
    rows = []
    for name, r in results.items():
        ratio = r.samples / ideal_samples if ideal_samples else None
        rows.append(
            (
                name,
                f"{r.samples:,.0f}",
                _fmt(ratio, ".3f"),
                f"{r.throughput:.2f}",
                f"{r.instance_hours:.2f}",
                f"{r.cost_usd:.2f}",
                _fmt(r.cost_per_million_samples, ".2f"),
                f"{r.migration_s:.1f}",
                _fmt(r.decision_ms_median, ".2f"),  # median planner decision time (parcae policies)
                format_migrations(r.migrations),
            )
        )
    return rows


def _table(rows: Sequence[tuple[str, ...]], columns: Sequence[int]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for i in columns:
        widest = max((len(row[i]) for row in rows), default=0)
        if _HEADERS[i].startswith("migrations"):
            table.add_column(_HEADERS[i], min_width=min(widest, 24))  # the one column that may wrap
        else:
            table.add_column(_HEADERS[i], justify="left" if i == 0 else "right", min_width=widest)
    for row in rows:
        table.add_row(*(row[i] for i in columns))
    return table


def results_tables(results: Mapping[str, Any], ideal_samples: float | None, width: int) -> list[Table]:
    """The comparison ``parcae simulate`` prints, one row per policy, as tables that fit ``width``.

    Numbers are never truncated: columns that do not fit move to a further table (each starting with
    the policy name); only the migrations column wraps.
    """
    rows = _result_rows(results, ideal_samples)

    def cost(i: int) -> int:  # rendered width of column i: content + 2 padding + 1 divider
        content = max([len(_HEADERS[i])] + [len(row[i]) for row in rows])
        return (min(content, 24) if _HEADERS[i].startswith("migrations") else content) + 3

    groups: list[list[int]] = [[0]]
    used = cost(0) + 1
    for i in range(1, len(_HEADERS)):
        if used + cost(i) > width and len(groups[-1]) > 1:
            groups.append([0])
            used = cost(0) + 1
        groups[-1].append(i)
        used += cost(i)
    return [_table(rows, g) for g in groups]


def _summary(result: Any) -> dict:
    s = result.summary()
    s["migrations"] = {k: float(v) for k, v in s["migrations"].items()}  # numpy scalars -> plain floats
    return s


def _write_file(path: Path, what: str, write: Callable[[Path], Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    except OSError as exc:
        raise UserError(f"cannot write {what} {str(path)!r}: {exc.strerror or exc}") from None


def _check_writable(path: Path, what: str) -> None:
    """`path` is not a directory and its folder exists or can be created (else a `UserError` naming it)."""
    if path.is_dir():
        raise UserError(f"cannot write {what} {str(path)!r}: it is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write {what} {str(path)!r}: {exc.strerror or exc}") from None
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"cannot write {what} {str(path)!r}: permission denied; choose a writable place")


def _check_writable_dir(path: Path, what: str) -> None:
    """`path` is a folder that exists or can be created, and is writable (else a `UserError` naming it)."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{what}: {str(path)!r} is a file, not a folder; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{what}: cannot create the folder {str(path)!r}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{what}: the folder {str(path)!r} is not writable; choose a writable place")


def _check_outputs(json_out: Path | None, plot: Path | None) -> None:
    """Fail before simulating, not after: output folders must be creatable, the plot format known."""
    for path, what in ((json_out, "JSON"), (plot, "plot")):
        if path is not None:
            _check_writable(path, what)
    if plot is not None and plot.suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        known = FigureCanvasBase.get_supported_filetypes()
        if plot.suffix[1:].lower() not in known:
            raise UserError(
                f"cannot write plot {str(plot)!r}: unknown image format {plot.suffix!r}; use one of "
                f"{', '.join('.' + k for k in sorted(known))}"
            )


@command(help="Replay a spot trace and compare policies: samples, dollars, migrations.")
def simulate(
    ctx: typer.Context,
    trace: Annotated[
        str, typer.Option(metavar="NAME|PATH", help="Trace name (see `parcae traces`) or path to a trace file.")
    ] = "p3",
    model: Annotated[str, typer.Option(metavar="MODEL", help="Model with a bundled throughput table.")] = "gpt-1.5b",
    start_hour: Annotated[
        float | None, typer.Option(help="Window start, hours into the trace (default: trace start).")
    ] = None,
    end_hour: Annotated[float | None, typer.Option(help="Window end, exclusive (default: trace end).")] = None,
    look_ahead: Annotated[int, typer.Option(min=1, help="Planner look-ahead K, in intervals.")] = DEFAULT_LOOK_AHEAD,
    interval_seconds: Annotated[float, typer.Option(help="Interval length T in seconds.")] = DEFAULT_INTERVAL_S,
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", metavar="NAME", help="Policy to run; repeat for several (default: all)."),
    ] = None,
    global_batch: Annotated[
        int | None, typer.Option(min=1, help="Global batch (default: the profiled table's; else an estimate).")
    ] = None,
    bamboo_overhead: Annotated[
        float, typer.Option(help="Bamboo's throughput loss to redundant computation, in [0, 1).")
    ] = 0.10,
    forecaster: Annotated[
        str,
        typer.Option(
            metavar="MODEL",
            help="Forecaster of the `parcae` policy: persistence, arima, ets, lightgbm (trained now without "
            "the simulated trace) or champion (the MLflow registry's; persistence if there is none).",
        ),
    ] = "persistence",
    json_out: Annotated[
        Path | None, typer.Option("--json", metavar="OUT.json", help="Write the per-policy summary here.")
    ] = None,
    plot: Annotated[Path | None, typer.Option(metavar="OUT.png", help="Write a timeline plot (PNG) here.")] = None,
    mlflow: Annotated[
        bool,
        typer.Option(
            "--mlflow",
            help="Also log the comparison to MLflow (experiment 'simulations', one run per policy, the plot as an "
            "artifact); the store is $MLFLOW_TRACKING_URI, else ./mlruns. Show it with `parcae simulations`.",
        ),
    ] = False,
) -> None:
    from liveput import BambooConstants, SimulationConfig, instance_price, plot_timeline
    from liveput import simulate as run_simulation

    policies = _check_policies(policy)
    _check_look_ahead(look_ahead)
    _check_outputs(json_out, plot)
    store = _check_store() if mlflow else None  # fail fast, before minutes of simulation
    if not 0.0 <= bamboo_overhead < 1.0:
        raise UserError(f"--bamboo-overhead must be in [0, 1), got {bamboo_overhead:g}")
    profile, cost = _load_model(model, global_batch)
    df, window = _load_window(trace, interval_seconds, start_hour, end_hour)
    first, last = int(window["interval"].iloc[0]), int(window["interval"].iloc[-1])
    n_intervals = len(window)
    config = SimulationConfig(
        model=model,
        look_ahead=look_ahead,
        interval_s=float(df.attrs["interval_s"]),
        global_batch=global_batch,
        bamboo=BambooConstants(overhead=bamboo_overhead),
    )
    fc_model = None
    if "parcae" in policies and forecaster != "persistence":
        if forecaster not in FORECAST_MODELS:
            raise UserError(f"--forecaster: unknown model {forecaster!r}; choose from {', '.join(FORECAST_MODELS)}")
        corpus = _corpus_without(trace, df) if forecaster != CHAMPION_MODEL else {}
        fc_model = _build_forecaster(forecaster, corpus, look_ahead, trace=str(df.attrs.get("name") or trace))
    price = instance_price(config.instance_type)
    iv = float(df.attrs["interval_s"])
    h0 = float(window["start_s"].iloc[0]) / 3600.0
    h1 = (float(window["start_s"].iloc[-1]) + iv) / 3600.0
    trace_name = str(df.attrs.get("name") or trace)

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_stderr(),
    ) as progress:
        task = progress.add_task(f"simulating {policies[0]}", total=n_intervals * len(policies))

        def on_step() -> None:
            done = int(progress.tasks[0].completed) + 1
            i = min(done // n_intervals, len(policies) - 1)
            progress.update(task, advance=1, description=f"simulating {policies[i]}")

        results = run_simulation(
            df,
            policies,
            config,
            first_interval=first,
            last_interval=last,
            profile=profile,
            cost=cost,
            forecaster=fc_model,
            on_step=on_step,
        )
        noun = "policy" if len(policies) == 1 else "policies"
        progress.update(task, description=f"simulated {len(policies)} {noun} x {n_intervals} intervals")
    if "ideal" in results:
        ideal_samples = results["ideal"].samples
    else:  # the bound is free to compute: no migrations, no planner
        ideal_samples = run_simulation(
            df, ["ideal"], config, first_interval=first, last_interval=last, profile=profile, cost=cost
        )["ideal"].samples

    out = _stdout()
    out.print(
        f"trace {trace_name}: intervals {first}-{last} ({n_intervals} x {iv:g} s, hours {h0:.2f}-{h1:.2f}), "
        f"model {model}, K={look_ahead}, prices as of {price.as_of} "
        f"({price.instance_type} spot ${price.spot_per_hour:.3f}/h, on-demand ${price.on_demand_per_hour:.2f}/h)"
    )
    for i, table in enumerate(results_tables(results, ideal_samples, out.width)):
        if i:
            out.print()
        out.print(table)

    if json_out is not None:
        doc = {
            "trace": trace_name,
            "model": model,
            "window": {"first_interval": first, "last_interval": last},
            "look_ahead": look_ahead,
            "policies": {name: _summary(r) for name, r in results.items()},
        }
        text = _strict_json(doc, f"--json {json_out}")
        _write_file(json_out, "JSON", lambda p: p.write_text(text + "\n", encoding="utf-8"))
        _stderr().print(f"wrote {json_out}", soft_wrap=True)
    if plot is not None:
        title = f"{trace_name} intervals {first}-{last}, {model}, K={look_ahead}"
        _write_file(plot, "plot", lambda p: plot_timeline(results, p, title=title, interval_s=interval_seconds))
        _stderr().print(f"wrote {plot}", soft_wrap=True)
    if store is not None:
        from tracking import TrackingError

        from parcae.simulations import SIMULATIONS_EXPERIMENT, log_comparison

        try:
            comparison = log_comparison(
                results, trace=trace_name, model=model, window=(h0, h1), look_ahead=look_ahead, interval_s=iv,
                forecaster=forecaster, ideal_samples=ideal_samples, plot=plot, tracking=store,
                tags={"parcae.command": _command_line(ctx)},
            )  # fmt: skip
        except TrackingError as exc:
            raise UserError(str(exc)) from None
        out.print(f"logged comparison {comparison} to MLflow experiment {SIMULATIONS_EXPERIMENT!r} ({store}); "
                  f"show it with: parcae simulations --comparison {comparison}", soft_wrap=True)  # fmt: skip


def _check_store() -> str:
    """The tracking URI, checked to answer (one request, no retries); a UserError naming the fix if not."""
    from tracking import TrackingError, check_reachable, tracking_uri

    try:
        uri = tracking_uri()
        check_reachable(uri)
    except TrackingError as exc:
        raise UserError(f"--mlflow: {exc}") from None
    except OSError as exc:  # the local store's folder cannot be created
        raise UserError(f"--mlflow: cannot create the MLflow store ({exc.strerror or exc}); set MLFLOW_TRACKING_URI "
                        f"or PARCAE_MLRUNS to a writable place") from None  # fmt: skip
    return uri


def _command_line(ctx: typer.Context) -> str:
    """The running command with every option spelled out (defaults included), so a logged run can be re-run."""
    import shlex

    words = ctx.command_path.split()
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.param_type_name != "option" or value is None or value is False:
            continue
        if param.is_flag:
            words.append(param.opts[0])
        elif param.multiple:
            for item in value:
                words += [param.opts[0], str(item)]
        else:
            words += [param.opts[0], str(value)]
    return shlex.join(words)


@command(
    help="Show a comparison logged by `parcae simulate --mlflow`, rebuilt from MLflow; without --comparison, "
    "list the latest ones."
)
def simulations(
    comparison: Annotated[
        str | None, typer.Option(metavar="ID", help="The comparison id `parcae simulate --mlflow` printed.")
    ] = None,
) -> None:
    from tracking import TrackingError

    from parcae.simulations import ComparisonNotFound, list_comparisons, load_comparison

    store = _check_store()
    out = _stdout()
    try:
        if comparison is None:
            latest = list_comparisons(store)
            if latest.empty:
                out.print(f"no comparisons in {store}; log one with `parcae simulate --mlflow`", soft_wrap=True)
                return
            table = Table(box=box.SIMPLE_HEAD, show_edge=False)
            for col in latest.columns:
                table.add_column(col, no_wrap=col != "policies")
            for row in latest.itertuples(index=False):
                table.add_row(*(str(v) for v in row))
            out.print(table)
            return
        logged = load_comparison(comparison, store)
    except (TrackingError, ComparisonNotFound) as exc:
        raise UserError(str(exc)) from None
    p = logged.params
    if p:
        out.print(
            f"trace {p.get('trace')}: intervals {p.get('first_interval')}-{p.get('last_interval')}, hours "
            f"{float(p['start_hour']):.2f}-{float(p['end_hour']):.2f}, model {p.get('model')}, "
            f"K={p.get('look_ahead')}, T={p.get('interval_s')} s (comparison {logged.comparison_id})",
            soft_wrap=True,
        )
    for i, table in enumerate(results_tables(logged.policies, logged.ideal_samples, out.width)):
        if i:
            out.print()
        out.print(table)


# --------------------------------------------------------------------------------------------------- plan


def _read_plan_input(source: str) -> Any:
    """The decoded plan input, within `forecasting.jsonio`'s bounds on size and nesting."""
    from forecasting import jsonio

    name = "<stdin>" if source == "-" else source
    try:
        if source == "-":
            stdin = getattr(sys.stdin, "buffer", None)  # a text-only stdin (some IDEs): its text, re-encoded
            text = jsonio.read_stream(stdin if stdin else sys.stdin)
        else:
            text = jsonio.read(source)
    except FileNotFoundError:
        raise UserError(f"plan input {source!r}: no such file") from None
    except OSError as exc:
        raise UserError(f"cannot read plan input {source!r}: {exc.strerror or exc}") from None
    except jsonio.JsonInputError as exc:
        raise UserError(exc.at(f"plan input {name}")) from None
    if not text.strip():
        raise UserError(f"plan input {name}: empty; expected a JSON object (see `parcae plan --help`)")
    try:
        return jsonio.loads(text)
    except jsonio.JsonInputError as exc:
        raise UserError(exc.at(f"plan input {name}")) from None


def plan_from_input(doc: Any, *, timing: bool = False) -> dict:
    """The plan of a decoded plan input (`liveput.plan_input`); a bad input is a UserError, an idle plan a warning."""
    from liveput import PlanInputError, parse_plan_input, plan_of_input

    try:
        inp = parse_plan_input(doc)
        if inp.nothing_fits:
            warn(inp.nothing_fits)
        return plan_of_input(inp, timing=timing)
    except PlanInputError as exc:
        raise UserError(str(exc)) from None


@command(
    help=(
        "Plan the next intervals from a forecast; print the plan as JSON.\n\n"
        "INPUT is a JSON file, or - (the default) for stdin:\n\n"
        "\b\n"
        '  {"model": "gpt-1.5b",             required\n'
        '   "interval_s": 60,                optional, default 60\n'
        '   "state": {"strategy": [D, P],    optional, default [0, 0] = not running;\n'
        "                                    D*P <= the first prev_available\n"
        '             "migrating": false,\n'
        '             "leftover_ms": 0},\n'
        '   "forecast": [                    required, one entry per interval; K = its length\n'
        '     {"prev_available": 32,         instances alive before the interval\n'
        '      "events": [[n_in, n_out, prob], ...]},   optional, default no events;\n'
        "     ...]}                                      probabilities sum to 1\n\n"
        "The output is the plan (decision, expected samples, the K steps, the alternatives) plus "
        '"model" and "look_ahead"; the same input always gives the same output. It is strict JSON: a number '
        "that is not finite (an overflow) is written as null, with a warning on stderr naming the field.\n\n"
        "The input's size and nesting, K, interval_s, the instance counts and the events per interval are "
        "bounded; a value outside its bound is an error that states the allowed range."
    )
)
def plan(
    input: Annotated[str, typer.Argument(metavar="INPUT.json|-", help="Plan input file, or - for stdin.")] = "-",
    timing: Annotated[
        bool, typer.Option(help="Include the planner's wall time (decision_ms); not reproducible.")
    ] = False,
) -> None:
    doc = _read_plan_input(input)
    typer.echo(_strict_json(plan_from_input(doc, timing=timing), "the plan"))


# ------------------------------------------------------------------------------------------------- traces


@command(help="List the trace names --trace accepts (bundled, plus ../shared/traces when present).")
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
    _stdout().print(table)


# ----------------------------------------------------------------------------------------------- forecast

forecast_app = typer.Typer(
    name="forecast",
    help="Train, evaluate and query availability forecasters (MLflow-tracked; see forecasting.registry).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
app.add_typer(forecast_app, name="forecast")

#: The registry's champion (trained by `parcae forecast train`), offered beside the models of `FORECASTERS`.
CHAMPION_MODEL = "champion"
#: Models `parcae forecast evaluate/predict` know, in the order tables list them.
FORECAST_MODELS = (*FORECASTERS, CHAMPION_MODEL)


def forecast_command(name: str | None = None, **kwargs: Any) -> Callable[[F], F]:
    """Like :func:`command`, for a sub-command of ``parcae forecast``."""
    return _register(forecast_app, name, kwargs)


class _WarnHandler:
    """Route ``forecasting.registry`` warnings to ``warning: ...`` lines while a command runs."""

    def __enter__(self):
        import logging

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                warn(record.getMessage())

        self._logger = logging.getLogger("forecasting.registry")
        self._handler = Handler(level=logging.WARNING)
        self._logger.addHandler(self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._logger.removeHandler(self._handler)


def _forecast_trace(trace: str):
    """(name, canonical table at 60 s) of ``--trace``; unknown or malformed traces are UserErrors."""
    df, _ = _load_window(trace, DEFAULT_INTERVAL_S, None, None)
    return str(df.attrs.get("name") or trace), df


def _check_trace_names(names: Sequence[str], option: str) -> None:
    from forecasting import available_traces

    known = available_traces()
    unknown = [n for n in names if n not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(known), n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UserError(f"{option}: unknown trace {unknown[0]!r}.{hint} Run `parcae traces` to list the names.")


def _corpus_without(name: str, table: Any, names: Sequence[str] | None = None, exclude: Sequence[str] = ()) -> dict:
    """Training corpus without ``name``, the ``exclude`` names, and any copy of ``table``'s count series."""
    from forecasting import trace_fingerprint, training_corpus

    _check_trace_names(list(names or ()), "--trace")
    _check_trace_names(list(exclude), "--exclude")
    try:
        corpus = training_corpus(names or None, exclude=[name, *exclude])
    except KeyError as exc:
        raise UserError(_key_error_message(exc)) from None
    held_out = trace_fingerprint(table)
    return {k: t for k, t in corpus.items() if trace_fingerprint(t) != held_out}


def _check_horizon(horizon: int, table: Any, name: str) -> int:
    from forecasting import DEFAULT_START

    if len(table) - 1 - horizon < DEFAULT_START:
        raise UserError(
            f"trace {name!r} has {len(table)} intervals: too short for a backtest at --horizon {horizon} "
            f"(needs at least {DEFAULT_START + horizon + 1}); lower --horizon or use a longer trace"
        )
    return len(table) - 1 - horizon - DEFAULT_START + 1


def _parse_models(text: str) -> list[str]:
    models = [m.strip().lower() for m in text.split(",") if m.strip()]
    if not models:
        raise UserError(f"--models: give at least one of {', '.join(FORECAST_MODELS)}")
    unknown = [m for m in models if m not in FORECAST_MODELS]
    if unknown:
        raise UserError(f"--models: unknown model {unknown[0]!r}; choose from {', '.join(FORECAST_MODELS)}")
    return list(dict.fromkeys(models))


def _build_forecaster(kind: str, corpus: Mapping[str, Any], horizon: int, seed: int = 0, trace: str | None = None):
    """A fitted forecaster of ``kind``: a `FORECASTERS` model fitted on ``corpus``, or the champion from MLflow.

    For the champion, a warning says so when it was trained on ``trace`` (its scores there are optimistic).
    """
    from tracking import TrackingError

    from forecasting import champion_version, fit_forecaster, load_champion

    tables = list(corpus.values())
    if kind in FORECASTERS:
        try:
            return fit_forecaster(kind, tables, horizon, seed)
        except ValueError:
            if tables:
                raise
            raise UserError(f"no training traces left for {kind} once the evaluated trace is excluded") from None
    if kind == CHAMPION_MODEL:
        try:
            with _WarnHandler():
                model = load_champion()
            version = champion_version() if trace is not None else None
        except TrackingError as exc:
            raise UserError(str(exc)) from None
        if version is not None:
            import mlflow

            trained_on = mlflow.MlflowClient().get_run(version.run_id).data.params.get("train_traces", "")
            if trace in trained_on.split(","):
                warn(
                    f"the champion (version {version.version}) was trained on {trace!r}, future included: its "
                    "backtest scores and forecasts from past origins of that trace are optimistic"
                )
        limit = getattr(model, "horizon_max", None)
        if limit is not None and horizon > limit:
            raise UserError(f"the champion forecasts at most {limit} intervals; use --horizon <= {limit}")
        return model
    raise UserError(f"unknown model {kind!r}; choose from {', '.join(FORECAST_MODELS)}")


class _Counted:
    """A forecaster that calls ``tick`` after every prediction (progress over backtest origins)."""

    def __init__(self, inner: Any, tick: Callable[[], None]) -> None:
        self.inner, self.tick, self.name = inner, tick, inner.name

    def fit(self, histories: Any) -> Any:
        return self.inner.fit(histories)

    def predict(self, history: Any, horizon: int) -> Any:
        forecast = self.inner.predict(history, horizon)
        self.tick()
        return forecast

    def history_window(self, horizon: int) -> int | None:
        return self.inner.history_window(horizon)


def _metrics_table(rows: Mapping[str, Mapping[str, Any]], horizon: int) -> Table:
    """One row per model: mean MAE, MAE at the first and last step, pinball, 80% coverage, Brier."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for i, header in enumerate(("model", "mae_mean", "mae h1", f"mae h{horizon}", "pinball", "coverage80", "brier")):
        table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
    for name, m in rows.items():
        mae = m["mae"]
        table.add_row(
            name,
            f"{m['mae_mean']:.4f}",
            f"{mae[0]:.4f}",
            f"{mae[-1]:.4f}",
            f"{m['pinball']:.4f}",
            _fmt(m["coverage80"], ".3f"),
            f"{m['brier']:.4f}",
        )
    return table


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


@forecast_command(
    "train",
    help=(
        "Train the LightGBM forecaster on the trace corpus, backtest it against persistence on --eval-trace, "
        "log and register it in MLflow, and promote it to 'champion' if it beats persistence and the current "
        "champion (mean MAE). The store is $MLFLOW_TRACKING_URI, else ./mlruns (tracking)."
    ),
)
def forecast_train(
    trace: Annotated[
        list[str] | None,
        typer.Option("--trace", metavar="NAME", help="Train on this trace; repeat (default: the whole corpus)."),
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", metavar="NAME", help="Leave this trace out; repeat.")
    ] = None,
    eval_trace: Annotated[
        str, typer.Option(metavar="NAME|PATH", help="Held-out trace for the backtest (never trained on).")
    ] = "p3",
    horizon: Annotated[int, typer.Option(min=1, help="Forecast horizon in intervals.")] = 12,
    json_out: Annotated[
        Path | None, typer.Option("--json", metavar="OUT.json", help="Write the outcome (run, version, metrics).")
    ] = None,
    n_estimators: Annotated[
        int | None, typer.Option(min=1, help="Boosting rounds per model (default: the forecaster's, 300).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the forecaster.")] = 0,
) -> None:
    from tracking import TrackingError, tracking_uri

    from forecasting import DEFAULT_REGISTERED_NAME, make_forecaster, train_and_log

    _check_outputs(json_out, None)
    _check_look_ahead(horizon, "--horizon")  # a forecast past what the planner takes is never used
    name, table = _forecast_trace(eval_trace)
    _check_horizon(horizon, table, name)
    corpus = _corpus_without(name, table, trace, exclude or ())
    if not corpus:
        raise UserError(
            f"no training traces left once {name!r} and the excluded ones are removed "
            f"(run `parcae traces` to see what is available)"
        )
    options: dict[str, Any] = {} if n_estimators is None else {"n_estimators": n_estimators}
    err = _stderr()
    with err.status("training") as status:
        try:
            outcome = train_and_log(
                functools.partial(make_forecaster, "lightgbm", horizon, seed, **options),
                train_traces=corpus,
                eval_trace=(name, table),
                horizon=horizon,
                progress=lambda message: status.update(message),
            )
        except TrackingError as exc:
            raise UserError(str(exc)) from None
    m = outcome.metrics
    rows = {}
    for label, prefix in (("lightgbm", ""), ("persistence", "persistence_")):
        rows[label] = {
            "mae": [m[f"{prefix}mae_h{h}"] for h in range(1, horizon + 1)],
            **{k: m[f"{prefix}{k}"] for k in ("mae_mean", "pinball", "coverage80", "brier")},
        }
    out = _stdout()
    out.print(
        f"trained on {len(corpus)} trace(s): {', '.join(corpus)}; evaluated on {name} "
        f"({len(table)} intervals), horizon {horizon}"
    )
    out.print(_metrics_table(rows, horizon))
    if "champion_mae_mean" in m:
        out.print(f"champion mae_mean: {m['champion_mae_mean']:.4f}")
    out.print(Text(outcome.reason, style="green" if outcome.promoted else "yellow"), soft_wrap=True)
    out.print(
        f"version {outcome.version} of {DEFAULT_REGISTERED_NAME}; run {outcome.run_id}; store {tracking_uri()}",
        soft_wrap=True,
    )
    if json_out is not None:
        text = _strict_json(outcome.to_dict(), f"--json {json_out}")
        _write_file(json_out, "JSON", lambda p: p.write_text(text + "\n", encoding="utf-8"))
        _stderr().print(f"wrote {json_out}", soft_wrap=True)


@forecast_command(
    "evaluate",
    help=(
        "Rolling-origin backtest of forecasters on one trace; print a table and write the scores as JSON: "
        '{"models": {NAME: {"mae": [per horizon], "mae_mean", "pinball", "coverage80", "brier"}}}. '
        "Baselines and lightgbm are fitted on the corpus without that trace; champion comes from MLflow."
    ),
)
def forecast_evaluate(
    trace: Annotated[str, typer.Option(metavar="NAME|PATH", help="Trace name (see `parcae traces`) or file.")],
    json_out: Annotated[Path, typer.Option("--json", metavar="OUT.json", help="Write the scores here.")],
    horizon: Annotated[int, typer.Option(min=1, help="Forecast horizon K in intervals.")] = 12,
    models: Annotated[
        str, typer.Option(metavar="M1,M2,...", help=f"Comma-separated, from: {', '.join(FORECAST_MODELS)}.")
    ] = ",".join(FORECAST_MODELS),
    seed: Annotated[int, typer.Option(help="Seed of the seeded models (arima, ets, lightgbm).")] = 0,
) -> None:
    from forecasting import rolling_origin

    kinds = _parse_models(models)
    _check_outputs(json_out, None)
    _check_look_ahead(horizon, "--horizon")
    name, table = _forecast_trace(trace)
    n_origins = _check_horizon(horizon, table, name)
    corpus = _corpus_without(name, table) if set(kinds) - {CHAMPION_MODEL} else {}
    results: dict[str, dict] = {}
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=_stderr()
    ) as progress:
        task = progress.add_task("", total=n_origins * len(kinds))
        for kind in kinds:
            progress.update(task, description=f"fitting {kind}")
            model = _build_forecaster(kind, corpus, horizon, seed, name)
            progress.update(task, description=f"backtesting {kind}")
            counted = _Counted(model, lambda: progress.advance(task))
            result = rolling_origin(counted, table, horizon, max_history=model.history_window(horizon))
            results[kind] = result.to_dict()
        progress.update(task, description=f"backtested {len(kinds)} model(s) x {n_origins} origins")
    out = _stdout()
    out.print(
        f"trace {name}: {len(table)} intervals, {n_origins} origins, horizon {horizon}; "
        f"fitted on {len(corpus)} corpus trace(s)"
    )
    out.print(_metrics_table(results, horizon))
    doc = {
        "models": {
            k: {
                "mae": [_finite(x) for x in r["mae"]],
                "mae_mean": _finite(r["mae_mean"]),
                "pinball": _finite(r["pinball"]),
                "coverage80": _finite(r["coverage80"]),
                "brier": _finite(r["brier"]),
            }
            for k, r in results.items()
        }
    }
    text = _strict_json(doc, f"--json {json_out}")
    _write_file(json_out, "JSON", lambda p: p.write_text(text + "\n", encoding="utf-8"))
    _stderr().print(f"wrote {json_out}", soft_wrap=True)


@forecast_command("predict", help="Forecast the intervals after one origin of a trace; print the Forecast as JSON.")
def forecast_predict(
    trace: Annotated[str, typer.Option(metavar="NAME|PATH", help="Trace name (see `parcae traces`) or file.")] = "p3",
    at: Annotated[
        int | None, typer.Option(metavar="INTERVAL", help="Origin: the last interval seen (default: the trace's last).")
    ] = None,
    horizon: Annotated[int, typer.Option(min=1, help="Forecast horizon in intervals.")] = 12,
    model: Annotated[
        str, typer.Option(metavar="MODEL", help=f"One of: {', '.join(FORECAST_MODELS)}.")
    ] = CHAMPION_MODEL,
    seed: Annotated[int, typer.Option(help="Seed of the seeded models (arima, ets, lightgbm).")] = 0,
) -> None:
    import numpy as np

    kind = _parse_models(model)
    if len(kind) != 1:
        raise UserError(f"--model takes one model, got {model!r}")
    _check_look_ahead(horizon, "--horizon")
    name, table = _forecast_trace(trace)
    intervals = table["interval"].to_numpy()
    if at is None:
        row = len(table) - 1
    else:
        hits = np.flatnonzero(intervals == at)
        if len(hits) == 0:
            raise UserError(
                f"--at {at} is not an interval of trace {name!r} (it has intervals {int(intervals[0])}-"
                f"{int(intervals[-1])})"
            )
        row = int(hits[0])
    corpus = _corpus_without(name, table) if kind[0] != CHAMPION_MODEL else {}
    forecaster = _build_forecaster(kind[0], corpus, horizon, seed, name)
    history = table.iloc[: row + 1].copy()
    history.attrs = dict(table.attrs)
    forecast = forecaster.predict(history, horizon)
    _stderr().print(f"{forecast.model} forecast of {name} after interval {int(intervals[row])}", soft_wrap=True)
    typer.echo(_strict_json(forecast.to_dict(), "the forecast"))


# ------------------------------------------------------------------------------------------------ collect


def _credentials_missing(session: Any) -> bool:
    try:
        return session.get_credentials() is None
    except Exception:  # a broken profile: the collector reports it precisely once a region is set
        return True


@command(
    help=(
        "Collect the job's spot fleet (instances tagged parcae:job=TAG), spot prices and placement scores "
        "from EC2 into the local trace store. Credentials come from the standard AWS chain (AWS_PROFILE, "
        "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, SSO, instance profile). Exit code 1 if a call failed."
    )
)
def collect(
    store: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Trace store folder (default: $PARCAE_TRACE_STORE or ./trace-store)."),
    ] = None,
    region: Annotated[
        list[str] | None,
        typer.Option("--region", metavar="R", help="Region to collect; repeat (default: the profile's)."),
    ] = None,
    instance_type: Annotated[
        list[str] | None,
        typer.Option(
            "--instance-type", metavar="T", help="Instance type for prices and scores; repeat (default p3.2xlarge)."
        ),
    ] = None,
    job_tag: Annotated[
        str, typer.Option(metavar="TAG", help="Value of the parcae:job tag of the job's instances.")
    ] = "parcae-job",
    endpoint_url: Annotated[
        str | None, typer.Option(metavar="URL", help="Send EC2 calls here (a VPC endpoint, or a local moto_server).")
    ] = None,
    price_hours: Annotated[float, typer.Option(help="Collect spot prices of the last this many hours.")] = 1.0,
    target_capacity: Annotated[int, typer.Option(min=1, help="Instances asked for in the placement scores.")] = 32,
) -> None:
    from datetime import datetime, timedelta

    from forecasting import CollectError, SpotCollector, TraceStore

    if not (math.isfinite(price_hours) and price_hours > 0):
        raise UserError(f"--price-hours must be a positive number of hours, got {price_hours:g}")
    try:
        collector = SpotCollector(
            regions=region or None,
            instance_types=tuple(instance_type or ("p3.2xlarge",)),
            job_tag=job_tag,
            store=TraceStore(store) if store is not None else None,
            endpoint_url=endpoint_url,
        )
        try:
            regions = collector.regions
        except CollectError as exc:
            if _credentials_missing(collector.session):
                raise CollectError(
                    f"{exc}. Also, no AWS credentials were found: set AWS_PROFILE to a configured profile, or "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                ) from None
            raise
        now = datetime.now(UTC)
        results = {
            "fleet_events": collector.collect_fleet(now=now),
            "spot_prices": collector.collect_prices(now - timedelta(hours=price_hours), now),
            "placement_scores": collector.collect_placement_scores(target_capacity),
        }
    except CollectError as exc:
        raise UserError(str(exc)) from None
    except ValueError as exc:  # e.g. a malformed --endpoint-url
        raise UserError(str(exc)) from None

    out = _stdout()
    out.print(
        f"store {collector.store.root.resolve()}, job tag {job_tag!r}, regions {', '.join(regions)}", soft_wrap=True
    )
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("table", no_wrap=True)
    table.add_column("rows written", justify="right")
    table.add_column("errors", justify="right")
    table.add_column("unsupported", justify="right")
    for name, r in results.items():
        table.add_row(name, str(sum(r.rows_written.values())), str(len(r.errors)), str(len(r.unsupported)))
    out.print(table)
    errors = [e for r in results.values() for e in r.errors]
    for line in (u for r in results.values() for u in r.unsupported):
        warn(f"unsupported: {line}")
    for line in errors:
        error(line)
    if errors:
        raise typer.Exit(1)


@command("train")
def train_cmd(
    workers: Annotated[int, typer.Option(min=1, help="Local worker processes (instances) at the start.")] = 4,
    trace: Annotated[
        str | None, typer.Option(metavar="NAME|PATH", help="Replay this spot trace, scaled to the workers.")
    ] = None,
    events: Annotated[
        Path | None, typer.Option(metavar="FILE", help="A scripted schedule of events (JSON) instead of a trace.")
    ] = None,
    interval_seconds: Annotated[float, typer.Option(help="Wall time of one trace interval (time compression).")] = 2.0,
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 40,
    model: Annotated[str, typer.Option(metavar="MODEL", help="Trainer model (tiny-gpt, small-gpt).")] = "tiny-gpt",
    checkpoint_every: Annotated[int, typer.Option(min=1, help="Checkpoint every N steps.")] = 10,
    out_dir: Annotated[
        Path, typer.Option(metavar="DIR", help="Fresh folder for checkpoints and layers (or the one to --resume).")
    ] = Path("runs/train"),
    json_out: Annotated[
        Path | None, typer.Option("--json", metavar="OUT.json", help="Write the loss, throughput and migrations here.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the model, the data order and the trace replay.")] = 0,
    planner: Annotated[
        str,
        typer.Option(
            metavar="rule|liveput|handed",
            help="Who decides D x P at every interval boundary: rule (two stages once two instances are alive, as "
            "many replicas as fit; with --events, the file's own plan events decide), liveput (the liveput "
            "optimizer on --profile, persistence forecasts) or handed (plans handed in from outside; the current "
            "strategy until one comes).",
        ),
    ] = "rule",
    profile: Annotated[
        Path | None,
        typer.Option(metavar="PROFILE.json", help="A runtime profile written by `parcae profile` (for liveput)."),
    ] = None,
    look_ahead: Annotated[
        int,
        typer.Option(
            min=1,
            metavar="K",
            help="Intervals the liveput planner plans over (a trace's each priced at "
            "its own 60 s: the replay compresses time, the plans do not).",
        ),
    ] = DEFAULT_LOOK_AHEAD,
    start_interval: Annotated[int, typer.Option(min=0, metavar="N", help="Trace interval the replay starts at.")] = 0,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint in --out-dir (same arguments).")
    ] = False,
    hosts: Annotated[
        str | None,
        typer.Option(
            metavar="HOST,HOST,...",
            help="Run the instances on these machines (ssh destinations; OpenSSH "
            "in BatchMode) instead of local processes: each runs `python -m trainer.providers.agent`.",
        ),
    ] = None,
    coordinator: Annotated[
        str | None,
        typer.Option(
            metavar="ADDRESS:PORT",
            help="With --hosts: this machine's address and a free port, as the hosts reach them.",
        ),
    ] = None,
    slots: Annotated[int, typer.Option(min=1, help="With --hosts: instances per host at most.")] = 1,
    provider: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Where instances come from (trainer.providers): local (worker processes "
            "here, the default), hosts (machines over ssh; --hosts sets it) or aws (EC2 spot instances).",
        ),
    ] = None,
    provider_options: Annotated[
        str | None,
        typer.Option(
            metavar="JSON|@FILE",
            help="The provider's options as a JSON object, e.g. aws: "
            '\'{"region": "us-east-1", "image_id": "ami-..."}\' (trainer.providers.aws.AwsSpotConfig\'s fields).',
        ),
    ] = None,
    remote_python: Annotated[
        str, typer.Option(metavar="PATH", help="With --hosts: the interpreter with this project on the hosts.")
    ] = "python3",
    remote_workdir: Annotated[
        str, typer.Option(metavar="DIR", help="With --hosts: the project's folder on the hosts.")
    ] = ".",
    timeout: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            min=1,
            help="Stop the job if it has not finished after this long "
            "(default: no deadline; a job runs until it has trained its steps, is cancelled or fails).",
        ),
    ] = None,
    keep_checkpoints: Annotated[
        int, typer.Option(min=0, metavar="N", help="Keep the newest N complete checkpoints on disk (0: all).")
    ] = 0,
    heartbeat_timeout: Annotated[
        float | None,
        typer.Option(
            min=0.5,
            metavar="SECONDS",
            help="A worker whose heartbeat is silent this long "
            "is declared dead (one whose process exits is seen at once; default: "
            "trainer.config.DEFAULT_HB_TIMEOUT_S); raise it on a loaded machine.",
        ),
    ] = None,
) -> None:
    """Train on worker processes that live-migrate as instances come and go: local processes, or instance agents
    on other hosts (--hosts). Ctrl-C stops the workers and prints the command that continues the job."""
    from trainer import (
        PLANNERS,
        AvailabilityConfig,
        CheckpointConfig,
        ControlPlaneConfig,
        EventError,
        HostsError,
        JobConfig,
        JobError,
        PlanningConfig,
        ProfileFormatError,
        ProviderConfig,
        RuntimeProfile,
        ScheduleError,
        TrainConfig,
        UnknownModelError,
        make_planner,
        model_config,
        train,
    )
    from trainer import PROVIDERS as providers

    if events is not None and trace is not None:
        raise UserError("give --events or --trace, not both")
    provider_name, options = _provider_options(provider, provider_options, hosts=hosts, coordinator=coordinator,
                                               slots=slots, python=remote_python, workdir=remote_workdir)  # fmt: skip
    if events is not None and not events.is_file():
        raise UserError(f"--events: no such file {str(events)!r}")
    if planner not in PLANNERS:
        raise UserError(f"--planner must be one of {', '.join(PLANNERS)}, got {planner!r}")
    runtime = None
    if profile is not None and planner != "liveput":
        warn(f"--profile is used by --planner liveput only; {str(profile)!r} is ignored")
    elif profile is not None:
        try:
            runtime = RuntimeProfile.load(profile)
        except ProfileFormatError as exc:
            raise UserError(f"--profile: {exc}") from None
    live, forecasts = None, "none"
    if planner != "rule" or events is None:  # an events file with the rule planner keeps its scripted plans
        try:
            live, forecasts = make_planner(
                planner, profile=runtime, model=model, look_ahead=look_ahead,
                interval_s=DEFAULT_INTERVAL_S if trace is not None else interval_seconds,
            )  # fmt: skip
        except ValueError as exc:
            raise UserError(str(exc)) from None
    from parcae.progress import TrainProgress

    try:
        config = JobConfig(
            out_dir=str(out_dir),
            model=model_config(model, seed=seed),  # `seed` seeds the initial weights and the data order too
            train=TrainConfig(steps=steps, seed=seed),
            availability=AvailabilityConfig(workers=workers, trace=trace, interval_seconds=interval_seconds,
                                            events_file=None if events is None else str(events),
                                            start_interval=start_interval),
            checkpoint=CheckpointConfig(every=checkpoint_every, keep=keep_checkpoints, resume=resume),
            control=ControlPlaneConfig(timeout_s=timeout, notice_grace_s=providers[provider_name].notice_grace_s(options),
                                       **({} if heartbeat_timeout is None else {"hb_timeout_s": heartbeat_timeout})),
            provider=ProviderConfig(name=provider_name, options=options),
            planning=PlanningConfig(planner=None if live is None else planner, look_ahead=look_ahead,
                                    profile=None if profile is None else str(profile)),
        )  # fmt: skip
    except ValueError as exc:  # ConfigError, UnknownModelError: a message naming the option
        raise UserError(_config_message(exc)) from None
    if provider_name == "aws":  # boto3 would look for credentials only at the first call, after the job started
        from parcae import settings

        try:
            settings.check_aws(options.get("region"), setting="--provider aws")
        except settings.SettingError as exc:
            raise UserError(str(exc)) from None
    _check_writable_dir(out_dir, "--out-dir")  # before training, not after it: the report would be lost
    if json_out is not None:
        _check_writable(json_out, "--json report")
    try:
        # a live bar on a terminal; piped, one line per reconfiguration (parcae.progress)
        with TrainProgress(_stderr()) as progress:
            report = train(config, observer=progress, planner=live, json_out=json_out)
    except KeyboardInterrupt:
        _interrupted(config)
    except (EventError, ScheduleError, UnknownModelError, ValueError) as exc:
        raise UserError(str(exc)) from None
    except JobError as exc:
        raise UserError(f"the job failed: {exc}") from None
    except HostsError as exc:
        raise UserError(f"--hosts: {exc}") from None
    out = _stdout()
    loss = report["loss"]
    thr = report["throughput"]
    out.print(
        f"{model}: {len(loss)} steps, loss {loss[0]:.4f} -> {loss[-1]:.4f}, {thr['samples_per_s']:.1f} samples/s, "
        f"checksum {report['final_checksum'][:16]}",
        soft_wrap=True,  # one line, whatever the width: scripts grep it
    )
    table = Table(box=None)
    for col in ("step", "kind", "notice", "strategy", "pause s", "MB moved", "steps lost"):
        table.add_column(col, justify="right" if col not in ("kind",) else "left")
    for r in report["reconfigurations"]:
        strategy = "x".join(str(x) for x in r.get("strategy") or []) or "-"
        table.add_row(str(r.get("step")), r["kind"], str(r["notice"]).lower(), strategy, f"{r['pause_s']:.3f}",
                      f"{r['bytes_moved'] / 1e6:.2f}", str(r["steps_lost"]))  # fmt: skip
    out.print(table)
    if live is not None:
        decisions = ", ".join(f"{p['decision'][0]}x{p['decision'][1]}" for p in report["plans"]) or "none"
        out.print(f"{len(report['plans'])} plans by {live.name} ({decisions}); forecasts: {forecasts}",
                  soft_wrap=True)  # fmt: skip
    if json_out:
        out.print(f"wrote {json_out}")


#: The `JobConfig` field behind each `parcae train` option, so that a config error names the option to fix.
TRAIN_OPTIONS = {
    "availability.workers": "--workers", "availability.trace": "--trace", "availability.events_file": "--events",
    "availability.interval_seconds": "--interval-seconds", "availability.start_interval": "--start-interval",
    "availability": "--events/--trace", "train.steps": "--steps", "checkpoint.every": "--checkpoint-every",
    "checkpoint.keep": "--keep-checkpoints", "control.timeout_s": "--timeout",
    "control.hb_timeout_s": "--heartbeat-timeout", "planning.look_ahead": "--look-ahead", "out_dir": "--out-dir",
}  # fmt: skip


def _config_message(exc: Exception) -> str:
    """A `trainer.ConfigError` ("section.field: problem; fix") with the field named as its command-line option."""
    text = str(exc)
    field_name, sep, rest = text.partition(": ")
    if field_name == "provider.options":  # the hosts provider's options are options of the command: --hosts, ...
        if rest.startswith("hosts and coordinator "):
            return "--hosts and --coordinator " + rest.removeprefix("hosts and coordinator ")
        if rest.startswith(("hosts:", "coordinator:", "slots ")):
            return "--" + rest
        return f"--provider-options: {rest}"
    return f"{TRAIN_OPTIONS[field_name]}: {rest}" if sep and field_name in TRAIN_OPTIONS else text


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _interrupted(config: Any) -> NoReturn:
    """Ctrl-C: the workers are stopped (`run_job` lets none outlive it); say in one line where the job stands and
    how to continue it, then exit 130."""
    from trainer import checkpoint, layer_names

    ckpt = config.checkpoint_dir
    try:
        point = checkpoint.latest_intact(Path(ckpt), layer_names(config.model), job=config.job)
        where = (f"the last complete checkpoint is step {point.step} in {ckpt}"
                 if point.step is not None else "no checkpoint was written yet")  # fmt: skip
    except Exception:  # noqa: BLE001 — the one line must come out whatever the folder holds
        where = f"checkpoints are in {ckpt}"
    args = [a for a in sys.argv[1:] if a != "--resume"]
    again = shlex.join(["parcae", *args, "--resume"])
    _stderr().print(Text(f"interrupted: the workers are stopped; {where}. Continue with: {again}",
                         style="yellow"), soft_wrap=True)  # fmt: skip
    raise typer.Exit(EXIT_INTERRUPTED)


def _provider_options(name: str | None, raw: str | None, **hosts: Any) -> tuple[str, dict[str, Any]]:
    """The provider (`trainer.providers`) and its options from --provider and --provider-options (a JSON object,
    or @FILE holding one); the --hosts shortcut options make them the hosts provider's."""
    from trainer import PROVIDERS

    shortcut = {k: v for k, v in hosts.items() if v is not None}
    given = hosts.get("hosts") is not None or hosts.get("coordinator") is not None
    name = name or ("hosts" if given else "local")
    if name not in PROVIDERS:
        raise UserError(f"--provider: unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
    options: dict[str, Any] = {}
    if raw is not None:
        text = raw
        if raw.startswith("@"):
            try:
                text = Path(raw[1:]).read_text()
            except OSError as exc:
                raise UserError(f"--provider-options: cannot read {raw[1:]!r} ({exc.strerror or exc})") from None
        try:
            options = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"--provider-options: not JSON ({exc}); give an object such as "
                            "'{\"region\": \"us-east-1\"}' or @FILE.json") from None  # fmt: skip
        if not isinstance(options, dict):
            raise UserError(f"--provider-options: expected a JSON object, got {_shown(options)}")
    if given:
        if name != "hosts":
            raise UserError(f"--hosts and --coordinator are the hosts provider's options, not {name!r}'s")
        options = {**options, **shortcut}
    return name, options


@command("profile")
def profile_cmd(
    workers: Annotated[int, typer.Option(help="Local worker processes; every D x P fitting them is measured.")] = 4,
    model: Annotated[str, typer.Option(metavar="MODEL", help="Trainer model (tiny-gpt, small-gpt).")] = "tiny-gpt",
    steps_per_strategy: Annotated[int, typer.Option(help="Training steps measured per strategy.")] = 6,
    rounds: Annotated[
        int, typer.Option(help="Visits of every strategy; its iteration time is the fastest visit's.")
    ] = 2,
    out: Annotated[Path, typer.Option("--out", metavar="OUT.json", help="Where to write the profile.")] = Path(
        "profile.json"
    ),
    json_flag: Annotated[bool, typer.Option("--json", help="Print the profile as JSON instead of the tables.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the model and the data order.")] = 0,
    start_method: Annotated[
        str, typer.Option(help="How worker processes start: spawn (cold, as real instances) or forkserver (warm).")
    ] = "spawn",
) -> None:
    """Measure this machine's trainer: iteration time per D x P and the real migration costs, calibrated into the
    liveput cost model (a profile the planner can use instead of the paper's V100 tables)."""
    import tempfile

    from trainer import MODELS, START_METHODS, JobError, ProfileError, ScheduleError, measure

    if workers < 2:
        raise UserError(
            f"--workers must be >= 2 (an instance must leave and join to measure migrations), got {workers}"
        )
    if steps_per_strategy < 1:
        raise UserError(f"--steps-per-strategy must be >= 1, got {steps_per_strategy}")
    if rounds < 1:
        raise UserError(f"--rounds must be >= 1, got {rounds}")
    if model not in MODELS:
        raise UserError(f"--model: unknown model {model!r}; known models: {', '.join(sorted(MODELS))}")
    if start_method not in START_METHODS:
        raise UserError(f"--start-method must be one of {', '.join(START_METHODS)}, got {start_method!r}")
    _check_writable(out, "profile")
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise UserError(f"cannot write profile {str(out)!r}: permission denied")
    command_line = (f"parcae profile --workers {workers} --model {model} --steps-per-strategy {steps_per_strategy} "
                    f"--rounds {rounds} --seed {seed} --start-method {start_method} --out {out}")  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="parcae-profile-") as tmp, _stderr().status("profiling") as status:
            prof = measure(model, workers, steps_per_strategy=steps_per_strategy, rounds=rounds, seed=seed,
                           out_dir=Path(tmp) / "job", progress=status.update, start_method=start_method,
                           command=command_line)  # fmt: skip
    except (ProfileError, ScheduleError) as exc:
        raise UserError(str(exc)) from None
    except JobError as exc:
        raise UserError(f"the profiling job failed: {exc}") from None
    _write_file(out, "profile", prof.to_json)
    if json_flag:
        typer.echo(prof.to_json(), nl=False)
        _stderr().print(f"wrote {out}", soft_wrap=True)
        return
    _print_profile(prof)
    _stdout().print(f"wrote {out}", soft_wrap=True)


def _print_profile(prof: Any) -> None:
    """The tables of `parcae profile`: iteration time per strategy, each migration against the model, the constants."""
    out = _stdout()
    m = prof.measured
    job, machine = m["job"], m["machine"]
    out.print(f"{job['model']} on {job['workers']} workers ({machine['usable_cores']} cores, "
              f"{machine['start_method']}): {job['steps']} steps in {job['wall_s']:.1f} s, "
              f"global batch {job['global_batch']}")  # fmt: skip
    thr = prof.throughput
    table = Table(title="iteration time per strategy", box=box.SIMPLE, title_justify="left")
    for col in ("D x P", "iteration ms", "samples/s", "epochs"):
        table.add_column(col, justify="right")
    for d, p in thr.strategies():
        table.add_row(f"{d}x{p}", f"{thr.iteration_ms[(d, p)]:.1f}", f"{thr.throughput(d, p):.1f}",
                      str(len(m["step_ms"].get(f"{d}x{p}", []))))  # fmt: skip
    out.print(table)
    table = Table(title="migrations: measured pause vs the calibrated model", box=box.SIMPLE, title_justify="left")
    for col in ("epoch", "kind", "from", "to", "measured ms", "model ms", "fits"):
        table.add_column(col, justify="left" if col in ("kind", "fits") else "right")
    notes = []
    for r in m["fit"]:
        table.add_row(str(r["epoch"]), r["kind"], "x".join(map(str, r["from"])), "x".join(map(str, r["to"])),
                      f"{r['measured_ms']:.0f}", f"{r['model_ms']:.0f}", r["used_for"] or "-")  # fmt: skip
        if r["note"]:
            notes.append(f"epoch {r['epoch']}: {r['note']}")
    out.print(table)
    for line in notes:
        out.print(f"  {line}", soft_wrap=True)
    c = m["calibration"]["constants"]
    src = m["calibration"]["sources"]
    table = Table(title="calibrated constants (liveput CostConstants)", box=box.SIMPLE, title_justify="left")
    table.add_column("constant")
    table.add_column("value", justify="right")
    table.add_column("source")
    rows = [("group_base_ms", f"{c['group_base_ms']:.1f}", src["group_base_ms"]),
            ("group_remove_ms", f"{c['group_remove_ms']:.2f} / group", src["group_remove_ms"]),
            ("p2p", f"{c['p2p_latency_ms']:.1f} ms + {c['p2p_mib_per_s'] or math.inf:.0f} MiB/s", src["p2p"]),
            ("rendezvous_ms", f"{c['rendezvous_ms']:.0f}", src["rendezvous_ms"]),
            ("checkpoint_ms", f"{c['checkpoint_ms']:.0f}", src["checkpoint_ms"])]  # fmt: skip
    rows += [(f"build_ms[{p}]", f"{v:.1f}", src["build_ms"][p]) for p, v in c["build_ms"].items()]
    for row in rows:
        table.add_row(*row)
    out.print(table)


if __name__ == "__main__":  # pragma: no cover
    app()
