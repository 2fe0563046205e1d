"""``parcae forecast train|evaluate|predict``: the availability forecasters, tracked in MLflow.

Owns: the ``forecast`` sub-app, the models it offers (`FORECAST_MODELS`: the `FORECASTERS` registry's and the
registry's champion), the held-out training corpus (`corpus_without`) and `build_forecaster` (``simulate`` uses both).
Must not touch: fitting, backtesting and the model registry (`forecasting`'s face).
"""

import difflib
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from forecasting import FORECASTERS, past_rows
from liveput import DEFAULT_INTERVAL_S
from parcae.cli.common import (
    F,
    UserError,
    check_look_ahead,
    check_outputs,
    fmt,
    key_error_message,
    progress_bar,
    register,
    stderr,
    stdout,
    strict_json,
    warn,
    write_json,
)
from parcae.cli.traces import load_window

if TYPE_CHECKING:
    import pandas as pd

    from forecasting import Forecaster

forecast_app = typer.Typer(
    name="forecast",
    help="Train, evaluate and query availability forecasters (MLflow-tracked; see forecasting.registry).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)

#: The registry's champion (trained by `parcae forecast train`), offered beside the models of `FORECASTERS`.
CHAMPION_MODEL = "champion"
#: Models `parcae forecast evaluate/predict` know, in the order tables list them.
FORECAST_MODELS = (*FORECASTERS, CHAMPION_MODEL)


def forecast_command(name: str | None = None, **kwargs: Any) -> Callable[[F], F]:
    """Like :func:`command`, for a sub-command of ``parcae forecast``."""
    return register(forecast_app, name, kwargs)


class _WarnHandler:
    """Route ``forecasting.registry`` warnings to ``warning: ...`` lines while a command runs."""

    def __enter__(self) -> "_WarnHandler":
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


def _forecast_trace(trace: str) -> tuple[str, "pd.DataFrame"]:
    """(name, canonical table at 60 s) of ``--trace``; unknown or malformed traces are UserErrors."""
    df, _ = load_window(trace, DEFAULT_INTERVAL_S, None, None)
    return str(df.attrs.get("name") or trace), df


def _check_trace_names(names: Sequence[str], option: str) -> None:
    from forecasting import available_traces

    known = available_traces()
    unknown = [n for n in names if n not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(known), n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UserError(f"{option}: unknown trace {unknown[0]!r}.{hint} Run `parcae traces` to list the names.")


def corpus_without(
    name: str, table: Any, names: Sequence[str] | None = None, exclude: Sequence[str] = ()
) -> dict[str, "pd.DataFrame"]:
    """Training corpus without ``name``, the ``exclude`` names, and any copy of ``table``'s count series."""
    from forecasting import trace_fingerprint, training_corpus

    _check_trace_names(list(names or ()), "--trace")
    _check_trace_names(list(exclude), "--exclude")
    try:
        corpus = training_corpus(names or None, exclude=[name, *exclude])
    except KeyError as exc:
        raise UserError(key_error_message(exc)) from None
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


def build_forecaster(
    kind: str, corpus: Mapping[str, Any], horizon: int, seed: int = 0, trace: str | None = None
) -> "Forecaster":
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

    def __init__(self, inner: "Forecaster", tick: Callable[[], None]) -> None:
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
    """One row per model: mean MAE, MAE at the first and last step, pinball, 80% coverage (plain and tie-aware),
    Brier."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    headers = ("model", "mae_mean", "mae h1", f"mae h{horizon}", "pinball", "coverage80", "pit cov80", "brier")
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
    for name, m in rows.items():
        mae = m["mae"]
        table.add_row(
            name,
            f"{m['mae_mean']:.4f}",
            f"{mae[0]:.4f}",
            f"{mae[-1]:.4f}",
            f"{m['pinball']:.4f}",
            fmt(m["coverage80"], ".3f"),
            fmt(m["pit_coverage80"], ".3f"),
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

    check_outputs(json_out, None)
    check_look_ahead(horizon, "--horizon")  # a forecast past what the planner takes is never used
    name, table = _forecast_trace(eval_trace)
    _check_horizon(horizon, table, name)
    corpus = corpus_without(name, table, trace, exclude or ())
    if not corpus:
        raise UserError(
            f"no training traces left once {name!r} and the excluded ones are removed "
            f"(run `parcae traces` to see what is available)"
        )
    options: dict[str, Any] = {} if n_estimators is None else {"n_estimators": n_estimators}
    err = stderr()
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
            **{k: m[f"{prefix}{k}"] for k in ("mae_mean", "pinball", "coverage80", "pit_coverage80", "brier")},
        }
    out = stdout()
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
        write_json(json_out, outcome.to_dict())


@forecast_command(
    "evaluate",
    help=(
        "Rolling-origin backtest of forecasters on one trace; print a table and write the scores as JSON: "
        '{"models": {NAME: {"mae": [per horizon], "mae_mean", "pinball", "coverage80", "pit_coverage80", "brier"}}} '
        "(pit_coverage80: the 80% band's coverage counted for whole-instance counts that repeat; see docs/results). "
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
    check_outputs(json_out, None)
    check_look_ahead(horizon, "--horizon")
    name, table = _forecast_trace(trace)
    n_origins = _check_horizon(horizon, table, name)
    corpus = corpus_without(name, table) if set(kinds) - {CHAMPION_MODEL} else {}
    results: dict[str, dict[str, Any]] = {}
    with progress_bar() as progress:
        task = progress.add_task("", total=n_origins * len(kinds))
        for kind in kinds:
            progress.update(task, description=f"fitting {kind}")
            model = build_forecaster(kind, corpus, horizon, seed, name)
            progress.update(task, description=f"backtesting {kind}")
            counted = _Counted(model, lambda: progress.advance(task))
            result = rolling_origin(counted, table, horizon, max_history=model.history_window(horizon))
            results[kind] = result.to_dict()
        progress.update(task, description=f"backtested {len(kinds)} model(s) x {n_origins} origins")
    out = stdout()
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
                "pit_coverage80": _finite(r["pit_coverage80"]),
                "brier": _finite(r["brier"]),
            }
            for k, r in results.items()
        }
    }
    write_json(json_out, doc)


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
    plot: Annotated[
        Path | None,
        typer.Option(
            metavar="OUT.png",
            help="Also draw the forecast's fan (10-90% band, median, point) after the 2 x horizon intervals before it, "
            "with what came next where the trace has it.",
        ),
    ] = None,
) -> None:
    import numpy as np

    kind = _parse_models(model)
    if len(kind) != 1:
        raise UserError(f"--model takes one model, got {model!r}")
    check_look_ahead(horizon, "--horizon")
    check_outputs(None, plot)
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
    corpus = corpus_without(name, table) if kind[0] != CHAMPION_MODEL else {}
    forecaster = build_forecaster(kind[0], corpus, horizon, seed, name)
    forecast = forecaster.predict(past_rows(table, row), horizon)
    stderr().print(f"{forecast.model} forecast of {name} after interval {int(intervals[row])}", soft_wrap=True)
    if plot is not None:
        from forecasting import plot_fans

        plot_fans(table, {forecast.model: forecaster}, [row], horizon, plot)
        stderr().print(f"wrote {plot}", soft_wrap=True)
    typer.echo(strict_json(forecast.to_dict(), "the forecast"))
