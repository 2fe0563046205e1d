"""The ``parcae`` command line: one module per command group, assembled here into the Typer `app`.

Map (``parcae --help`` lists the commands in the order `app` adds them below):

- `common`    the `command` decorator, `UserError` (``error: <message>``, exit code 2), consoles, option checks;
- `simulate`  ``parcae simulate`` (compare policies on a trace) and ``parcae simulations`` (a logged comparison);
- `plan`      ``parcae plan`` (one planning step from a JSON forecast; the format: ``parcae plan --help``);
- `traces`    ``parcae traces`` and the ``--trace`` loading the commands share;
- `forecast`  ``parcae forecast train|evaluate|predict`` (a sub-app);
- `collect`   ``parcae collect`` (EC2 spot fleet, prices and placement scores into the trace store);
- `train`     ``parcae train``, ``parcae profile`` and ``parcae export`` (the elastic trainer).

Must not touch: the work behind a command (liveput, forecasting, trainer, `parcae.simulations`): a command checks
its options, calls one face and prints. Every JSON it writes is strict (`common.strict_json`). To add a command:
one function decorated with ``@command()`` in the module of its group (``traces`` is the smallest example), raising
`UserError` for a mistake the user can fix, and added to `app` below.
"""

from typing import Annotated

import typer

from parcae.cli import collect, plan, simulate, traces, train
from parcae.cli.common import UserError, add_commands, command, error, set_quiet
from parcae.cli.forecast import forecast_app
from parcae.cli.plan import plan_from_input
from parcae.cli.simulate import format_migrations, results_tables

app = typer.Typer(
    name="parcae",
    help="Train on spot instances: forecast availability, plan D x P by liveput, live-migrate the workers; "
    "simulate policies on traces.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    rich_markup_mode=None,  # help text is printed as written: the plan input example must stay intact
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"parcae {version('parcae')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print parcae's version and exit.")
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="Print only results, warnings and errors: no progress bars, no notes on stderr."
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also log what parcae's packages do (INFO) on stderr.")
    ] = False,
) -> None:
    """(The options every command shares; colour follows NO_COLOR.)"""
    if quiet and verbose:
        error("--quiet and --verbose contradict each other: give one")
        raise typer.Exit(2)
    set_quiet(quiet)
    if verbose:
        import logging

        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        for name in ("parcae", "trainer", "forecasting", "liveput", "tracking"):
            logger = logging.getLogger(name)
            logger.setLevel(logging.INFO)
            logger.addHandler(handler)


add_commands(app, simulate.simulate, simulate.simulations, plan.plan, traces.traces)
app.add_typer(forecast_app, name="forecast")
add_commands(app, collect.collect, train.train_cmd, train.profile_cmd, train.export_cmd)

__all__ = ["UserError", "app", "command", "format_migrations", "plan_from_input", "results_tables"]
