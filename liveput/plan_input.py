"""The plan input: the JSON document `parcae plan` reads (its format: `parcae plan --help`), validated field by field.

Owns: `parse_plan_input` (a decoded document -> `PlanInput`, or `PlanInputError` naming the field, its bound and
what was given) and `plan_of_input` (the plan of a valid input, as the JSON-able dict the command prints). Must not
touch: reading files or stdin, printing, exit codes (`parcae.cli` wires the command and prints the errors); the
planning itself is `liveput.optimizer.plan_interval`.

Every bound is checked before the planner runs: K <= `MAX_LOOK_AHEAD`, ``interval_s`` in
`forecasting.traces.INTERVAL_S_RANGE`, counts <= `forecasting.traces.MAX_INSTANCES`, `MAX_EVENTS_PER_INTERVAL`.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from liveput.horizon import DEFAULT_INTERVAL_S, INTERVAL_S_RANGE, MAX_INSTANCES, MAX_LOOK_AHEAD
from liveput.migration import CostModel
from liveput.optimizer import IDLE, JobState, plan_interval
from liveput.scenarios import IntervalForecast
from liveput.throughput import ThroughputProfile, load_profile

__all__ = ["MAX_EVENTS_PER_INTERVAL", "PlanInput", "PlanInputError", "parse_plan_input", "plan_of_input", "shown"]

_TOP_FIELDS: Final = ("model", "interval_s", "state", "forecast")
_STATE_FIELDS: Final = ("strategy", "migrating", "leftover_ms")
_FORECAST_FIELDS: Final = ("prev_available", "events")
#: Events of one forecast interval: the planner's time grows with them (1000 cost about 1 s per interval on 2 cores).
MAX_EVENTS_PER_INTERVAL: Final = 1000


class PlanInputError(ValueError):
    """A plan input the planner cannot take; the message names the field and what it must be."""


@dataclass(frozen=True)
class PlanInput:
    """A validated plan input: the model's profile and cost model, the state planned from and the K forecasts."""

    model: str
    interval_s: float
    state: JobState
    forecast: tuple[IntervalForecast, ...]
    profile: ThroughputProfile
    cost: CostModel

    @property
    def nothing_fits(self) -> str | None:
        """Why the plan can only be to stay idle (no strategy fits the forecast), or None: a warning, not an error."""
        smallest = min((d * p for d, p in self.profile.strategies()), default=0)
        most = max(f.prev_available + i - o for f in self.forecast for i, o, _ in f.events)
        if most < smallest and self.state.strategy[0] * self.state.strategy[1] < smallest:
            return (f"no strategy of {self.model} fits the forecast (at most {most} instances alive; the smallest "
                    f"strategy needs {smallest}): the plan is to stay idle")  # fmt: skip
        return None


def shown(value: Any, *, as_json: bool = True) -> str:
    """A value as a message shows it: its JSON (or, `as_json=False`, its Python repr, for a setting given in Python),
    at most 60 characters (a hostile input can be megabytes)."""
    text = repr(value)
    if as_json:
        with contextlib.suppress(TypeError, ValueError):  # not JSON data: its repr
            text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer too large for a float
        return False


def _type_name(v: Any) -> str:
    names: dict[type, str] = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
                              type(None): "null"}  # fmt: skip
    return names.get(type(v), "a number" if _is_number(v) else type(v).__name__)


def _unknown_fields(obj: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    extra = [k for k in obj if k not in allowed]
    if extra:
        raise PlanInputError(
            f"plan input: unknown field {extra[0][:40]!r} in {where}; expected only {', '.join(allowed)}"
        )


def _int_field(v: Any, path: str, minimum: int = 0) -> int:
    """An instance count: an integer in [minimum, `forecasting.traces.MAX_INSTANCES`]."""
    if not _is_int(v) or not minimum <= v <= MAX_INSTANCES:
        raise PlanInputError(
            f"plan input: {path} must be an integer from {minimum} to {MAX_INSTANCES:,}, got {shown(v)}"
        )
    return int(v)


def _model_name(model: Any) -> str:
    if model is None:
        raise PlanInputError('plan input: model is missing (a bundled model name, e.g. "gpt-1.5b")')
    if not isinstance(model, str):
        raise PlanInputError(f"plan input: model must be a string, got {shown(model)}")
    if len(model) > 100:
        raise PlanInputError(f'plan input: model {shown(model)} is not a bundled model name (e.g. "gpt-1.5b")')
    return model


def _load_model(model: str) -> tuple[ThroughputProfile, CostModel]:
    try:
        return load_profile(model), CostModel.reference(model)  # an unknown model names the known ones
    except KeyError as exc:
        raise PlanInputError(str(exc.args[0]) if exc.args else str(exc)) from None


def _parse_interval_s(raw: Any) -> float:
    if not _is_number(raw) or raw <= 0:
        raise PlanInputError(f"plan input: interval_s must be a number of seconds > 0, got {shown(raw)}")
    low, high = INTERVAL_S_RANGE
    if not low <= raw <= high:
        raise PlanInputError(f"plan input: interval_s must be a number of seconds in [{low:g}, {high:g}], "
                             f"got {shown(raw)}")  # fmt: skip
    return float(raw)


def _parse_state(raw: Any, profile: ThroughputProfile) -> JobState:
    if raw is None:
        return JobState()
    if not isinstance(raw, dict):
        raise PlanInputError(f"plan input: state must be an object, got {_type_name(raw)}")
    _unknown_fields(raw, _STATE_FIELDS, "state")
    strategy = raw.get("strategy", [0, 0])
    if not (isinstance(strategy, list) and len(strategy) == 2 and all(_is_int(x) and x >= 0 for x in strategy)):
        raise PlanInputError(
            f"plan input: state.strategy must be [D, P] with integers >= 0 ([0, 0] = not running), "
            f"got {shown(strategy)}"
        )
    s = (int(strategy[0]), int(strategy[1]))
    if s != IDLE and not profile.is_feasible(*s):
        raise PlanInputError(
            f"plan input: state.strategy {s[0]}x{s[1]} is not a feasible strategy of {profile.model}; "
            f"feasible: {profile.describe_limits()}"
        )
    migrating = raw.get("migrating", False)
    if not isinstance(migrating, bool):
        raise PlanInputError(f"plan input: state.migrating must be true or false, got {shown(migrating)}")
    leftover = raw.get("leftover_ms", 0)
    if not _is_number(leftover) or leftover < 0:
        raise PlanInputError(f"plan input: state.leftover_ms must be a number >= 0, got {shown(leftover)}")
    return JobState(s, migrating, float(leftover))


def _parse_event(ev: Any, at: str, n: int) -> tuple[int, int, float]:
    if not (isinstance(ev, list) and len(ev) == 3):
        raise PlanInputError(f"plan input: {at} must be [n_in, n_out, prob], got {shown(ev)}")
    n_in = _int_field(ev[0], f"{at}[0] (n_in)")
    n_out = _int_field(ev[1], f"{at}[1] (n_out)")
    prob = ev[2]
    if not _is_number(prob) or not 0.0 <= prob <= 1.0:
        raise PlanInputError(f"plan input: {at}[2] (prob) must be a probability in [0, 1], got {shown(prob)}")
    if n_out > n:
        raise PlanInputError(
            f"plan input: {at} is infeasible: n_out={n_out} preemptions but only prev_available={n} instances alive"
        )
    return n_in, n_out, float(prob)


def _parse_interval(raw: Any, i: int) -> IntervalForecast:
    where = f"forecast[{i}]"
    if not isinstance(raw, dict):
        raise PlanInputError(f"plan input: {where} must be an object {{\"prev_available\": N, \"events\": [...]}}, "
                             f"got {_type_name(raw)}")  # fmt: skip
    _unknown_fields(raw, _FORECAST_FIELDS, where)
    if "prev_available" not in raw:
        raise PlanInputError(f"plan input: {where}.prev_available is missing (instances alive before the interval)")
    n = _int_field(raw["prev_available"], f"{where}.prev_available")
    events = raw.get("events")
    if events is None:
        return IntervalForecast.point(n)
    if not isinstance(events, list) or not events:
        raise PlanInputError(f"plan input: {where}.events must be a non-empty array of [n_in, n_out, prob], "
                             f"got {shown(events)}")  # fmt: skip
    if len(events) > MAX_EVENTS_PER_INTERVAL:
        raise PlanInputError(f"plan input: {where}.events has {len(events):,} entries, more than the "
                             f"{MAX_EVENTS_PER_INTERVAL} an interval may have; merge the unlikely ones")  # fmt: skip
    parsed = [_parse_event(ev, f"{where}.events[{j}]", n) for j, ev in enumerate(events)]
    total = math.fsum(w for _, _, w in parsed)
    if abs(total - 1.0) > 1e-6:
        raise PlanInputError(f"plan input: {where}.events probabilities sum to {total:g}; expected 1")
    try:
        return IntervalForecast(n, tuple(parsed))
    except ValueError as exc:  # anything the checks above missed, still pinned to the field
        raise PlanInputError(f"plan input: {where}: {exc}") from None


def parse_plan_input(doc: Any) -> PlanInput:
    """The validated plan input of a decoded JSON document; `PlanInputError` at the first field out of bounds."""
    if not isinstance(doc, dict):
        raise PlanInputError(f"plan input must be a JSON object, got {_type_name(doc)}")
    _unknown_fields(doc, _TOP_FIELDS, "the top level")
    model = _model_name(doc.get("model"))
    interval_s = _parse_interval_s(doc.get("interval_s", DEFAULT_INTERVAL_S))
    forecast = doc.get("forecast")
    if not isinstance(forecast, list) or not forecast:
        got = "missing" if forecast is None else shown(forecast) if forecast == [] else _type_name(forecast)
        raise PlanInputError(f"plan input: forecast must be a non-empty array of intervals, got {got}")
    if len(forecast) > MAX_LOOK_AHEAD:
        raise PlanInputError(f"plan input: the forecast's length K must be in [1, {MAX_LOOK_AHEAD}] intervals, "
                             f"got {len(forecast)}; ask for fewer intervals")  # fmt: skip
    profile, cost = _load_model(model)
    state = _parse_state(doc.get("state"), profile)
    forecasts = tuple(_parse_interval(f, i) for i, f in enumerate(forecast))
    held = state.strategy[0] * state.strategy[1]
    if held > forecasts[0].prev_available:
        raise PlanInputError(
            f"plan input: infeasible forecast: state.strategy {state.strategy[0]}x{state.strategy[1]} runs on "
            f"{held} instances but forecast[0].prev_available is {forecasts[0].prev_available}; the instances "
            f"alive before the first interval include the running ones"
        )
    return PlanInput(model, interval_s, state, forecasts, profile, cost)


def plan_of_input(inp: PlanInput, *, timing: bool = False) -> dict[str, Any]:
    """The plan of ``inp`` as `parcae plan` prints it: ``Plan.to_dict()`` plus ``model`` and ``look_ahead``;
    ``decision_ms`` (the planner's wall time, not reproducible) only with ``timing``."""
    try:
        result = plan_interval(inp.forecast, inp.state, inp.profile, inp.cost, interval_s=inp.interval_s)
    except RuntimeError as exc:
        if "no feasible plan" in str(exc):
            raise PlanInputError(f"plan input: infeasible forecast: {exc}") from None
        raise
    body = result.to_dict()
    if not timing:
        body.pop("decision_ms", None)
    return {"model": inp.model, "look_ahead": len(inp.forecast), **body}
