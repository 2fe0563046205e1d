"""Scripted reconfiguration events: what happens to the job at which step (a perfect forecast, for tests and demos).

Owns: the schedule format, its parsing with errors a user can act on (file, event index, field), and the grouping
of the events of one step into one reconfiguration. Must not touch: processes, stores, strategies' feasibility
(that depends on the model and on who is alive: `trainer.control.dry_run.check_schedule`).

Format: a JSON list of objects, each with a `step` and a `kind`. Every kind but `kill` takes effect at the boundary
between step-1 and step (before `step` runs):

  {"step": 3, "kind": "plan", "strategy": [D, P]}         switch to D x P (proactive migration)
  {"step": 4, "kind": "add", "workers": 1}                 new instances become available (they join as standby)
  {"step": 5, "kind": "preempt", "instances": [2], "notice": true}
                                                           instances (worker ids) are preempted with notice: they
                                                           stay alive until the boundary, hand off state, then exit
  {"step": 6, "kind": "kill", "instances": [1]}            preemption *without* notice: the process is SIGKILLed
                                                           *mid-step*, after it started `step` (and before it can
                                                           pass the boundary to step+1); survivors detect it,
                                                           abandon the step and redo it after regrouping.
                                                           ("preempt" with "notice": false means the same.)
  {"step": 7, "kind": "checkpoint-restart", "strategy": [D, P]}
                                                           on demand, what torchrun does: checkpoint at the
                                                           boundary, stop every worker process, start fresh ones,
                                                           load the checkpoint into D x P (optional; default: the
                                                           current D x P if the instances allow it)

Events of the same step form one reconfiguration (an `EventGroup`): e.g. a preemption plus the plan that absorbs it,
as the reference's trace replay writes `failures` and the plan for the same step (reference §D.4); a kill of that
step happens after the group's boundary reconfiguration, during the step. Worker ids are 0..workers-1 for the
initial instances, then numbered on in order of the `add` events.

A job whose strategy a live planner decides (`trainer.control.planning`, `run_job(planner=...)`) takes the availability
events only — add, preempt, kill — and rejects plans and checkpoint-restarts in its schedule.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liveput import shown
from trainer.jsonfile import load_json

_repr = functools.partial(shown, as_json=False)  # a value in a message as Python shows it, at most 60 characters

KINDS = ("plan", "add", "preempt", "kill", "checkpoint-restart")
_FIELDS = {
    "plan": {"step", "kind", "strategy"},
    "add": {"step", "kind", "workers"},
    "preempt": {"step", "kind", "instances", "notice"},
    "kill": {"step", "kind", "instances", "notice"},
    "checkpoint-restart": {"step", "kind", "strategy"},
}


class EventError(ValueError):
    """A schedule that cannot be used; the message names the source, the event index and the field."""


@dataclass(frozen=True)
class Event:
    """One scripted event (see the module docstring for the fields of each kind)."""

    step: int
    kind: str
    strategy: tuple[int, int] | None = None
    workers: int = 0
    instances: tuple[int, ...] = ()
    notice: bool = True

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": self.step, "kind": self.kind}
        if self.kind == "plan" or (self.kind == "checkpoint-restart" and self.strategy):
            d["strategy"] = list(self.strategy or ())
        elif self.kind == "add":
            d["workers"] = self.workers
        elif self.kind != "checkpoint-restart":
            d["instances"] = list(self.instances)
            d["notice"] = self.notice
        return d


@dataclass(frozen=True)
class EventGroup:
    """The events of one step, merged: one reconfiguration at the boundary before `step`."""

    step: int
    strategy: tuple[int, int] | None = None  # the plan, if any
    add: int = 0  # new instances
    preempt: tuple[int, ...] = ()  # worker ids preempted (with notice)
    kill: tuple[int, ...] = ()  # worker ids killed without notice, during the step
    restart: bool = False  # an on-demand checkpoint-restart at the boundary (into `strategy` if given)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_one(raw: Any, where: str) -> Event:
    def fail(field: str, msg: str) -> EventError:
        return EventError(f"{where}: field {_repr(field)}: {msg}")

    if not isinstance(raw, Mapping):
        raise EventError(f'{where}: expected an object like {{"step": 3, "kind": "plan", ...}}, got {_repr(raw)}')
    kind = raw.get("kind")
    if kind is None:
        raise fail("kind", f"missing; expected one of {', '.join(KINDS)}")
    if kind not in KINDS:
        raise fail("kind", f"expected one of {', '.join(KINDS)}, got {_repr(kind)}")
    unknown = sorted(set(raw) - _FIELDS[kind])
    if unknown:
        raise fail(unknown[0], f"not a field of a {_repr(kind)} event (fields: {', '.join(sorted(_FIELDS[kind]))})")
    step = raw.get("step")
    if step is None:
        raise fail("step", "missing")
    if not _is_int(step) or step < 1:
        raise fail("step", f"expected an integer >= 1 (the step before which it takes effect), got {_repr(step)}")
    if kind in ("plan", "checkpoint-restart"):
        s = raw.get("strategy")
        if s is None:
            if kind == "checkpoint-restart":
                return Event(step, kind)
            raise fail("strategy", 'missing; a plan needs "strategy": [D, P]')
        pair = isinstance(s, Sequence) and not isinstance(s, str) and len(s) == 2
        if not pair or not all(_is_int(v) and v >= 1 for v in s):
            raise fail("strategy", f"expected [D, P] with two integers >= 1, got {_repr(s)}")
        return Event(step, kind, strategy=(int(s[0]), int(s[1])))
    if kind == "add":
        n = raw.get("workers")
        if n is None:
            raise fail("workers", 'missing; an add needs "workers": n')
        if not _is_int(n) or n < 1:
            raise fail("workers", f"expected an integer >= 1, got {_repr(n)}")
        return Event(step, kind, workers=n)
    ids = raw.get("instances")
    if ids is None:
        raise fail("instances", f'missing; a {kind} needs "instances": [worker ids]')
    if not isinstance(ids, Sequence) or isinstance(ids, str) or not ids or not all(_is_int(v) and v >= 0 for v in ids):
        raise fail("instances", f"expected a non-empty list of worker ids (integers >= 0), got {_repr(ids)}")
    if len(set(ids)) != len(ids):
        raise fail("instances", f"worker ids repeat: {_repr(list(ids))}")
    notice = raw.get("notice", kind == "preempt")
    if not isinstance(notice, bool):
        raise fail("notice", f"expected true or false, got {_repr(notice)}")
    if kind == "kill" and notice:
        raise fail("notice", 'a kill has no notice; use {"kind": "preempt"} for a preemption with notice')
    ids_t = tuple(int(v) for v in ids)
    if not notice:  # a preemption without notice is a kill
        return Event(step, "kill", instances=ids_t, notice=False)
    return Event(step, "preempt", instances=ids_t, notice=True)


def parse_events(raw: Any, source: str = "<events>") -> list[Event]:
    """Parse a decoded JSON schedule (a list of event objects, or `Event`s) into events sorted by step (stable)."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Iterable) or isinstance(raw, Mapping):
        raise EventError(f"{source}: expected a JSON list of events, got {type(raw).__name__}")
    events = [
        item if isinstance(item, Event) else _parse_one(item, f"{source}: event {i}") for i, item in enumerate(raw)
    ]
    return sorted(events, key=lambda e: e.step)


def load_events(path: str | os.PathLike[str]) -> list[Event]:
    """Read and parse a schedule file."""
    raw = load_json(path, EventError, "the schedule", "expected a JSON list of events (see trainer.control.events)")
    return parse_events(raw, str(Path(path)))


def group_events(events: Iterable[Event], source: str = "<events>") -> list[EventGroup]:
    """Merge the events of each step into one `EventGroup`, in step order.

    At most one plan per step; adds add up; a worker cannot be preempted twice in the same step.
    """
    by_step: dict[int, list[Event]] = {}
    for e in sorted(events, key=lambda e: e.step):
        by_step.setdefault(e.step, []).append(e)
    groups = []
    for step, evs in by_step.items():
        plans = [e.strategy for e in evs if e.kind == "plan"]
        restarts = [e for e in evs if e.kind == "checkpoint-restart"]
        if len(plans) + len(restarts) > 1:
            what = [e.kind for e in evs if e.kind in ("plan", "checkpoint-restart")]
            raise EventError(f"{source}: step {step}: {len(what)} plans for the same step ({what}); keep one")
        strategy = plans[0] if plans else (restarts[0].strategy if restarts else None)
        preempt: list[int] = []
        kill: list[int] = []
        for e in evs:
            for w in e.instances:
                if w in preempt or w in kill:
                    raise EventError(f"{source}: step {step}: worker {w} is preempted twice")
                (kill if e.kind == "kill" else preempt).append(w)
        groups.append(
            EventGroup(
                step,
                strategy=strategy,
                add=sum(e.workers for e in evs),
                preempt=tuple(preempt),
                kill=tuple(kill),
                restart=bool(restarts),
            )  # fmt: skip
        )
    return groups


@dataclass(frozen=True)
class Schedule:
    """What `run_job` applies: start `workers` instances on `strategy` = (D, P), then apply `events` (this module's
    format, or `Event`s); a trace's schedule (`trainer.control.schedules.trace_schedule`) also says how many intervals
    it covers and how many steps one lasts (a live planner decides at each interval boundary)."""

    workers: int
    strategy: tuple[int, int]
    events: Sequence[Event | Mapping[str, Any]] = ()
    intervals: int = 0  # trace intervals covered
    steps_per_interval: int = 0  # steps of one trace interval (a live planner decides at each interval boundary)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.events:
            k = e.kind if isinstance(e, Event) else e["kind"]
            out[k] = out.get(k, 0) + 1
        return out
