"""``parcae simulate`` (replay a trace, compare policies) and ``parcae simulations`` (a comparison logged to MLflow).

Owns: the comparison tables (`results_tables`, `format_migrations`), the options' checks. Must not touch: the
simulation itself (`liveput.simulate`), logging and rebuilding comparisons (`parcae.simulations`); the forecaster of
the ``parcae`` policy is built by `parcae.cli.forecast`.
"""

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table
from typer.core import TyperOption

from liveput import DEFAULT_INTERVAL_S, DEFAULT_LOOK_AHEAD
from parcae.cli.common import (
    UserError,
    check_look_ahead,
    check_outputs,
    check_writable,
    command,
    fmt,
    key_error_message,
    progress_bar,
    stderr,
    stdout,
    write_file,
    write_json,
)
from parcae.cli.forecast import CHAMPION_MODEL, FORECAST_MODELS, build_forecaster, corpus_without
from parcae.cli.traces import load_window

if TYPE_CHECKING:
    import pandas as pd

    from liveput import CostModel, Preparation, ThroughputProfile


def _load_model(
    model: str, global_batch: int | None = None, preparation: "Preparation | None" = None
) -> tuple["ThroughputProfile", "CostModel"]:
    """Throughput profile and reference cost model of ``model`` (under ``preparation``: by default the reference's full
    stop); an unknown model is a UserError."""
    from liveput import FULL_STOP, CostModel, load_profile

    try:
        profile = load_profile(model)  # the bundled table: an unknown model fails here, naming the known ones
        if global_batch is not None and global_batch != profile.global_batch:
            _check_global_batch(model, global_batch)
            profile = load_profile(model, global_batch)
        cost = CostModel.reference(model, preparation or FULL_STOP)
    except KeyError as exc:
        raise UserError(key_error_message(exc)) from None
    return profile, cost


def _load_runtime_profile(
    path: Path, global_batch: int | None, preparation: "Preparation"
) -> tuple["ThroughputProfile", "CostModel"]:
    """The measured profile at ``path`` (`parcae profile`) as the simulator's throughput and cost model; prepared
    migrations slow the old strategy by what the profile measured. A bad file or batch is a UserError."""
    from trainer import ProfileFormatError, RuntimeProfile

    try:
        measured = RuntimeProfile.load(path)
    except ProfileFormatError as exc:
        raise UserError(str(exc)) from None
    if preparation.enabled:
        try:
            preparation = measured.preparation(preparation.notice_s)
        except ProfileFormatError as exc:
            raise UserError(f"{path}: {exc}; or simulate the full stop (--full-stop)") from None
    batch = measured.throughput.global_batch
    if global_batch is not None and global_batch != batch:
        raise UserError(f"--global-batch {global_batch}: {path} was measured at global batch {batch} and a measured "
                        "profile is not rescaled; measure it at that batch, or leave --global-batch out")  # fmt: skip
    return measured.throughput, measured.cost_model(preparation)


def _check_global_batch(model: str, global_batch: int) -> None:
    """--global-batch within what the throughput estimate simulates (beyond it, minutes and then a MemoryError)."""
    from liveput import MAX_MICRO_BATCHES, max_global_batch

    most = max_global_batch(model)
    if not 1 <= global_batch <= most:
        raise UserError(
            f"--global-batch must be in [1, {most}] for {model} (its throughput is estimated by simulating at most "
            f"{MAX_MICRO_BATCHES} micro-batches per iteration), got {global_batch}; give a smaller global batch"
        )


def _check_policies(policies: Sequence[str] | None) -> list[str]:
    from liveput import POLICY_NAMES

    if not policies:
        return list(POLICY_NAMES)
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        bad = ", ".join(repr(p) for p in unknown)
        raise UserError(f"unknown policy {bad}; choose from {', '.join(POLICY_NAMES)}")
    return list(dict.fromkeys(policies))  # repeated names run once


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
    rows: list[tuple[str, ...]] = []
    for name, r in results.items():
        ratio = r.samples / ideal_samples if ideal_samples else None
        rows.append(
            (
                name,
                f"{r.samples:,.0f}",
                fmt(ratio, ".3f"),
                f"{r.throughput:.2f}",
                f"{r.instance_hours:.2f}",
                f"{r.cost_usd:.2f}",
                fmt(r.cost_per_million_samples, ".2f"),
                f"{r.migration_s:.1f}",
                fmt(r.decision_ms_median, ".2f"),  # median planner decision time (parcae policies)
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


def _summary(result: Any) -> dict[str, Any]:
    s: dict[str, Any] = result.summary()
    s["migrations"] = {k: float(v) for k, v in s["migrations"].items()}  # numpy scalars -> plain floats
    return s


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
    notice_seconds: Annotated[
        float | None,
        typer.Option(
            metavar="S",
            help="Preemption notice, in seconds: how long before a preemption parcae can prepare its migration "
            "(and knows of it when it plans). Default: the trace's cloud's (120 for AWS traces such as p3, 30 for "
            "GCP; 0 when the cloud is unknown); 0 = no notice, every preemption a kill.",
        ),
    ] = None,
    full_stop: Annotated[
        bool,
        typer.Option(
            "--full-stop",
            help="The reference's cost model: every migration stops training for its whole cost (nothing is "
            "prepared in the background), as in the published comparison.",
        ),
    ] = False,
    runtime_profile: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            metavar="PROFILE.json",
            help="Simulate this runtime as `parcae profile` measured it (its iteration times, its calibrated cost "
            "model and the slowdown it measured while preparing) instead of --model's bundled table.",
        ),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", metavar="OUT.json", help="Write the per-policy summary here.")
    ] = None,
    plot: Annotated[Path | None, typer.Option(metavar="OUT.png", help="Write a timeline plot (PNG) here.")] = None,
    mermaid: Annotated[
        Path | None,
        typer.Option(
            metavar="OUT.md",
            help="Write the timeline as Markdown here: Mermaid charts of the first two policies (parcae first, if "
            "run), which GitHub draws in a README, issue or pull request.",
        ),
    ] = None,
    mlflow: Annotated[
        bool,
        typer.Option(
            "--mlflow",
            help="Also log the comparison to MLflow (experiment 'simulations', one run per policy, the plot as an "
            "artifact); the store is $MLFLOW_TRACKING_URI, else ./mlruns. Show it with `parcae simulations`.",
        ),
    ] = False,
) -> None:
    from liveput import BambooConstants, SimulationConfig, instance_price, plot_timeline, timeline_mermaid
    from liveput import simulate as run_simulation

    policies = _check_policies(policy)
    check_look_ahead(look_ahead)
    check_outputs(json_out, plot)
    if mermaid is not None:
        check_writable(mermaid, "Markdown")
        if len(policies) < 2:
            raise UserError("--mermaid draws two policies side by side: name two, e.g. -p parcae -p reactive")
    store = _check_store() if mlflow else None  # fail fast, before minutes of simulation
    if not 0.0 <= bamboo_overhead < 1.0:
        raise UserError(f"--bamboo-overhead must be in [0, 1), got {bamboo_overhead:g}")
    if notice_seconds is not None and not (math.isfinite(notice_seconds) and notice_seconds >= 0):
        raise UserError(f"--notice-seconds must be >= 0 seconds, got {notice_seconds:g}")
    df, window = load_window(trace, interval_seconds, start_hour, end_hour)
    preparation = _preparation(df, notice_seconds, full_stop)
    if runtime_profile is not None:
        profile, cost = _load_runtime_profile(runtime_profile, global_batch, preparation)
        model, preparation = profile.model, cost.preparation
    else:
        profile, cost = _load_model(model, global_batch, preparation)
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
        corpus = corpus_without(trace, df) if forecaster != CHAMPION_MODEL else {}
        fc_model = build_forecaster(forecaster, corpus, look_ahead, trace=str(df.attrs.get("name") or trace))
    price = instance_price(config.instance_type)
    iv = float(df.attrs["interval_s"])
    h0 = float(window["start_s"].iloc[0]) / 3600.0
    h1 = (float(window["start_s"].iloc[-1]) + iv) / 3600.0
    trace_name = str(df.attrs.get("name") or trace)

    with progress_bar() as progress:
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

    out = stdout()
    out.print(
        f"trace {trace_name}: intervals {first}-{last} ({n_intervals} x {iv:g} s, hours {h0:.2f}-{h1:.2f}), "
        f"model {model}, K={look_ahead}, prices as of {price.as_of} "
        f"({price.instance_type} spot ${price.spot_per_hour:.3f}/h, on-demand ${price.on_demand_per_hour:.2f}/h)"
    )
    out.print(f"migrations: {preparation.describe()}", soft_wrap=True)
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
            "migrations": _preparation_doc(preparation),
            "policies": {name: _summary(r) for name, r in results.items()},
        }
        write_json(json_out, doc)
    if plot is not None:
        title = f"{trace_name} intervals {first}-{last}, {model}, K={look_ahead}"
        write_file(plot, "plot", lambda p: plot_timeline(results, p, title=title, interval_s=interval_seconds))
        stderr().print(f"wrote {plot}", soft_wrap=True)
    if mermaid is not None:
        ours = "parcae" if "parcae" in policies else policies[0]
        against = next(p for p in policies if p != ours)
        title = f"{trace_name}, hours {h0:.2f}-{h1:.2f}, {model}"
        text = timeline_mermaid(results, ours, against, title=title, interval_s=iv)
        write_file(mermaid, "Markdown", lambda p: p.write_text(text))
        stderr().print(f"wrote {mermaid}", soft_wrap=True)
    if store is not None:
        from tracking import TrackingError

        from parcae.simulations import SIMULATIONS_EXPERIMENT, log_comparison

        try:
            comparison = log_comparison(
                results, trace=trace_name, model=model, window=(h0, h1), look_ahead=look_ahead, interval_s=iv,
                forecaster=forecaster, ideal_samples=ideal_samples, plot=plot, tracking=store,
                migrations=preparation.describe(), tags={"parcae.command": _command_line(ctx)},
            )  # fmt: skip
        except TrackingError as exc:
            raise UserError(str(exc)) from None
        out.print(f"logged comparison {comparison} to MLflow experiment {SIMULATIONS_EXPERIMENT!r} ({store}); "
                  f"show it with: parcae simulations --comparison {comparison}", soft_wrap=True)  # fmt: skip


def _preparation(table: "pd.DataFrame", notice_seconds: float | None, full_stop: bool) -> "Preparation":
    """How the simulated migrations run: prepared in the background with the trace's cloud's notice (or
    ``notice_seconds``), or the reference's full stop."""
    from forecasting import trace_cloud
    from liveput import CLOUD_NOTICE_S, FULL_STOP, Preparation

    if full_stop:
        return FULL_STOP
    if notice_seconds is None:
        cloud = trace_cloud(table)
        notice_seconds = CLOUD_NOTICE_S[cloud] if cloud is not None else 0.0
    return Preparation(notice_s=float(notice_seconds))


def _preparation_doc(preparation: "Preparation") -> dict[str, Any]:
    return {
        "prepared": sorted(t.value for t in preparation.triggers),
        "notice_s": preparation.notice_s,
        "slowdown": preparation.slowdown,
        "summary": preparation.describe(),
    }


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
        if not isinstance(param, TyperOption) or value is None or value is False:
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
    out = stdout()
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
        if p.get("migrations"):
            out.print(f"migrations: {p['migrations']}", soft_wrap=True)
    for i, table in enumerate(results_tables(logged.policies, logged.ideal_samples, out.width)):
        if i:
            out.print()
        out.print(table)
