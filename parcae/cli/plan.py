"""``parcae plan``: read a plan input (a file or stdin), run the liveput planner once, print the plan as JSON.

Owns: reading the input within `forecasting.jsonio`'s bounds, turning `PlanInputError` into a `UserError`. Must not
touch: the input's format and validation (`liveput.plan_input`, documented by ``parcae plan --help``), the planning
(`liveput.plan_interval`).
"""

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from parcae.cli.common import UserError, check_outputs, command, stderr, strict_json, warn


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


def plan_from_input(doc: Any, *, timing: bool = False, plot: Path | None = None) -> dict[str, Any]:
    """The plan of a decoded plan input (`liveput.plan_input`); a bad input is a UserError, an idle plan a warning.
    With `plot`, its figure too (`liveput.plot_plan`)."""
    from liveput import PlanInputError, parse_plan_input, plan_of_input, plot_plan

    try:
        inp = parse_plan_input(doc)
        if inp.nothing_fits:
            warn(inp.nothing_fits)
        result = plan_of_input(inp, timing=timing)
    except PlanInputError as exc:
        raise UserError(str(exc)) from None
    if plot is not None:
        plot_plan(inp, result, plot)
        stderr().print(f"wrote {plot}", soft_wrap=True)
    return result


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
    plot: Annotated[
        Path | None,
        typer.Option(
            metavar="OUT.png",
            help="Also draw the plan: the instances the forecast allows in each interval and the D x P the plan "
            "takes there; per interval, its throughput if nothing were preempted against its liveput; and the "
            "decision against the strategies it beat in the coming interval.",
        ),
    ] = None,
) -> None:
    check_outputs(None, plot)
    doc = _read_plan_input(input)
    typer.echo(strict_json(plan_from_input(doc, timing=timing, plot=plot), "the plan"))
