"""The driver loop: applies one job's schedule — the provider's processes on one side, the coordinator's decisions
on the other — asks the live planner at interval boundaries, reacts to notices and deaths, and feeds the observers.

Owns: `Driver` (boundaries held and decided in order, notices, deaths -> live recovery or checkpoint-restart, the
planner at interval boundaries, the observers), `LivePlanning`, `JobError`. Must not touch: what a migration moves
(`trainer.runtime.migration`), what a planner decides (`trainer.control.planning`), the store layout
(`trainer.runtime.keys`), how a job is set up and its result (`trainer.control.run`), a live fleet's own loop
(`trainer.control.fleet_driver.FleetDriver`, which extends this one).

Where to look next: `docs/driver.md` (the manual), `trainer.control.run` (which builds and runs a `Driver`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.control.coordinator import (
    HB_RUNNING_FACTOR,
    Coordinator,
)
from trainer.control.events import EventGroup
from trainer.control.planning import HandedPlan, Planner, PlanRequest, check_decision, plan_info_dict
from trainer.observe.observer import ObserverList, PlanInfo, StepInfo
from trainer.providers.agent import AgentInstances
from trainer.providers.local import LocalProcessProvider
from trainer.runtime import checkpoint
from trainer.runtime.checkpoint_mirror import StepCommitter
from trainer.runtime.migration import PlanError, recovery_strategy
from trainer.runtime.model import layer_names, spec_of
from trainer.runtime.model import n_layers as layer_count
from trainer.runtime.validation import Monitor, metrics_of
from trainer.runtime.worker import EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART, EXIT_TOKEN

log = logging.getLogger(__name__)

POLL_S = 0.005
OBSERVE_S = 0.1  # observers are fed at most this often from the driver loop (each poll reads only new store keys)
KILLED = -9  # exit code of a SIGKILLed process
NOTICE_S = 120.0  # a preempted worker still running this long after its notice is killed (AWS: two minutes)
NOTICE_MARGIN_S = 5.0  # a notice is folded into the next interval boundary only if it comes this long before the
# deadline (time for the hand-off itself; longer where steps and hand-offs are: `notice_margin_s`); else the
# preemption gets a boundary of its own at once
NOTICE_POLL_S = 0.05  # notices are read from the store at most this often (with the heartbeats)
GONE = {KILLED, EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART, 1, 3}  # exit codes a worker declared dead may show


class JobError(RuntimeError):
    """A job that started but did not finish: a worker failed, exited unexpectedly or the job timed out."""


class TrainingEnded(Exception):
    """Every member of the epoch in force finished the job while the schedule still waited for a later boundary: the
    held-out loss stopped it early (`trainer.runtime.validation.Patience`). Nothing is left to decide."""


def notice_margin_s(step_s: float, handoff_s: float, *, folded: bool = False) -> float:
    """How long before its deadline a noticed member must reach the boundary where it leaves: `NOTICE_MARGIN_S`, or
    two steps (when a boundary comes is estimated from the pace so far, off by up to a step) and the longest hand-off
    seen (`handoff_s`: the pause of a migration that moved state) where those take longer — a large model's steps and
    transfers do (a GPT-1.5B step takes seconds on a V100, a stage's state tens of seconds to move).

    `folded`: the member's leaving is folded into a boundary already (the planner told of it), which it keeps while
    the boundary still leaves the hand-off its two steps and longest hand-off, and half the floor (a job's first
    hand-off has no time measured yet). The other half is slack for a boundary foreseen ahead: a plan that then
    decides a little late (a loaded machine) still takes the member in, where the full margin sent it off at a
    boundary of its own a step before the plan (seen on this 2-core machine)."""
    return max(NOTICE_MARGIN_S / 2 if folded else NOTICE_MARGIN_S, 2.0 * step_s + handoff_s)


class Driver:
    """Applies one job's schedule: the provider's processes on one side, the coordinator's decisions on the other;
    asks the planner at interval boundaries and feeds the observers."""

    def __init__(
        self, coord: Coordinator, provider: LocalProcessProvider | AgentInstances, groups: Sequence[EventGroup],
        live: LivePlanning, *, deadline: float, max_processes: int, observer: ObserverList | None = None,
    ) -> None:  # fmt: skip
        cfg = coord.config
        self.coord, self.provider, self.groups, self.steps = coord, provider, list(groups), cfg.steps
        self.deadline, self.pg_timeout_s = deadline, cfg.control.pg_timeout_s
        self.prepare = cfg.control.prepare  # scheduled reconfigurations: their groups form a step ahead
        self.max_processes = max_processes
        self.keep_checkpoints = cfg.checkpoint.keep  # complete checkpoints kept on disk (0: all)
        self.committer: StepCommitter | None = None  # manifests of the steps workers uploaded (checkpoint.uri)
        planner, intervals, steps_per_interval = live.planner, live.intervals, live.steps_per_interval
        self.allowed: dict[int, set[int]] = {}  # exit codes each instance's current process may end with
        self._started: dict[int, list[int]] = {}  # group index -> ids started for its `add` (maybe ahead of time)
        self._recovering = False
        self._no_death_recoveries = 0
        self._killed_outside: set[int] = set()  # processes found SIGKILLed by someone else than the driver
        self._unscheduled: set[int] = set()  # instances lost without the schedule saying so (notices, deaths)
        self._scripted_kills: set[int] = set()
        self._fenced: set[int] = set()  # declared dead on a silent heartbeat alone (then killed): the instance lives
        # preemption notices (SIGTERM): worker -> its deadline (monotonic clock); decided at a boundary
        self._noticed: dict[int, float] = {}
        self._notice_polled = 0.0
        self._folding: set[int] = set()  # noticed workers waiting for the next interval boundary's decision
        self._unplaceable: set[int] = set()  # noticed workers no one survives to take over from
        self._notice_at: int | None = None  # the held boundary a prepared notice decision waits for (`decide_notices`)
        self._deciding = False  # inside a boundary decision or a scripted kill: notices wait
        self._stops_left: set[int] = set()  # scripted event steps and interval boundaries not decided yet
        self._trained_from = (0.0, 0)  # (monotonic time, step) when training started: the step time estimate
        # the held boundary a live fleet's prepared plan waits for (`FleetDriver._plan_live`; None for a replay)
        self._live_at: int | None = None
        # live planning
        self.planner = planner
        self.intervals = sorted(intervals)
        self.steps_per_interval = steps_per_interval
        self.plans: list[PlanInfo] = []
        self.history: list[int] = []  # alive count at each interval boundary since the job (re)started
        self._accepts_handed = bool(getattr(planner, "accepts_handed", False))
        self._handed: HandedPlan | None = None
        self._handed_seen = 0
        self._final_validated = False  # the final layers' held-out loss was delivered to the observers
        self._handoff_s = 0.0  # the longest pause of a migration that moved state so far (`_margin_s`)
        self._schedule_open = False  # `run` applies the schedule: a job that ends early ends it (`TrainingEnded`)
        # held-out scores kept beside their checkpoints (`_record_val_losses`): each scored boundary's ("loss", the
        # spec's metrics), the complete checkpoints' steps, and the steps whose scores are recorded beside them
        self._scored: dict[int, dict[str, float]] = {}
        self._checkpointed: set[int] = set()
        self._val_recorded: set[int] = set()
        spec = spec_of(cfg.model, cfg.train)
        self._lr = spec.lr  # the spec's learning rate of each step (None: the optimiser's)
        # what ranks the scored checkpoints (kept beside each: retention and `parcae export --best` read it there)
        self._monitor = spec.validation.watched if spec.validation is not None else Monitor()
        # (request, decision, details, seconds) of the planner asked a step before a boundary (`plan_ahead`)
        self._planned_ahead: tuple[PlanRequest, tuple[int, int], Mapping[str, Any], float] | None = None
        # observers
        self.observer = observer or ObserverList()
        self._observing = False  # on_start was called
        self._observed_at = 0.0
        self._next_step = 0  # the next committed step to report
        self._next_record = 1  # index in coord.epochs of the next reconfiguration to report
        self._timeline: list[tuple[int, Any]] = []  # (start step, epoch): which epoch trains each step
        self._alive_steps: list[tuple[int, int]] = []  # (step, alive instances from that step on), by step
        self._timeline_n = 0

    # -- waiting --------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise `JobError` if a process ended with a code it was not expected to. One SIGKILLed from outside the
        job (an instance reclaimed without notice, the OOM killer) is a death: the next `tick` recovers from it."""
        self.provider.poll()
        for w, code in self.provider.exitcodes().items():
            if code == KILLED and code not in self.allowed.get(w, {EXIT_DONE}):
                self.allowed[w] = set(GONE)
                self._killed_outside.add(w)
            elif code is not None and code not in self.allowed.get(w, {EXIT_DONE}):
                c = self.coord
                msg = c.message("error", w)
                if not msg and code == EXIT_TOKEN:  # it could not write to the sealed store: it had no valid token
                    msg = "the coordinator refused its token (see the worker's stderr)"
                raise JobError(f"worker {w} exited with code {code}" + (f": {msg}" if msg else " (no message)"))

    def tick(self) -> None:
        self.check()
        self.observe()
        if self._recovering:
            return
        self.poll_notices()
        stale = self._silent_and_dead(self.coord.check_heartbeats()) | self.vanished()
        if stale or self.coord.epoch_broken():
            self.recover(stale)
            return
        self.decide_notices()

    def _silent_and_dead(self, silent: set[int]) -> set[int]:
        """Of the workers whose heartbeat is silent past the bound, those to declare dead: all of them, except those
        whose process the provider sees running (a starved process on a loaded machine keeps its place until
        `HB_RUNNING_FACTOR` bounds have passed)."""
        running = getattr(self.provider, "running", None)
        if running is None or not silent:
            return silent
        c = self.coord
        return {w for w in silent if running(w) is not True or c.silent_for(w) > HB_RUNNING_FACTOR * c.hb_timeout_s}

    def vanished(self) -> set[int]:
        """Instances the provider killed at their notice's deadline (before they had left), the schedule's kills, and
        processes SIGKILLed from outside the job: dead at once (declared), no need to wait for their heartbeat to
        stop."""
        c = self.coord
        out = set()
        while self.provider.reclaimed:
            w, at = self.provider.reclaimed.pop(0)
            if w not in c.dead and not c.ended(w):
                c.note_killed([w], at)
                self.allowed[w] = set(GONE)
                c.declare_dead([w], "killed at its notice's deadline")
                out.add(w)
        for w in sorted(self._killed_outside):
            if w not in c.dead and not c.ended(w):
                c.declare_dead([w], "its process was killed")
                self._unscheduled.add(w)
                out.add(w)
        self._killed_outside.clear()
        if self._scripted_kills - c.dead:  # the schedule's kills: their exit is the evidence, not a silent heartbeat
            codes = self.provider.exitcodes()
            for w in sorted(self._scripted_kills - c.dead):
                if codes.get(w) == KILLED and not c.ended(w):
                    c.declare_dead([w], "its process was killed")
                    out.add(w)
        return out

    def wait(self, cond: Callable[[], bool], what: str, timeout_s: float | None = None) -> None:
        """Tick until `cond` holds. While the schedule is open (`run`), a job whose members all finished — stopped
        early by its held-out loss — raises `TrainingEnded`: the boundary waited for never comes."""
        end = self.deadline if timeout_s is None else min(self.deadline, time.monotonic() + timeout_s)
        while not cond():
            self.tick()
            if self._schedule_open and self.finished():
                raise TrainingEnded(what)
            if time.monotonic() > end:
                raise JobError(f"timed out waiting for {what}")
            time.sleep(POLL_S)

    def finished(self) -> bool:
        """Every member of the epoch in force finished the job (exited done)."""
        c = self.coord
        return c.current is not None and all(self.provider.exitcode(w) == EXIT_DONE for w in c.in_force.members)

    def settle(self) -> set[int]:
        """Wait until every alive instance's heartbeat is fresh; returns those that went silent meanwhile (the caller
        declares them dead). Typically returns at once; a silent one takes up to the heartbeat timeout."""
        c = self.coord
        silent: set[int] = set()
        end = time.monotonic() + c.hb_timeout_s + 1.0
        while True:
            silent |= self._silent_and_dead(c.check_heartbeats(every_s=0))
            if not (c.unsettled() - silent) or time.monotonic() > end:
                return silent
            self.check()
            time.sleep(POLL_S)

    def start_instances(self, n: int | Sequence[int], next_id: int = 0) -> list[int]:
        """Start `n` new instances, or the instances with ids `n` (then later ones are numbered from `next_id`)."""
        ids = self.provider.start(n) if isinstance(n, int) else self.provider.start_ids(n, next_id)
        self.coord.expect(ids)
        for w in ids:
            self.allowed[w] = {EXIT_DONE}
        return ids

    def wait_joined(self, ids: Sequence[int], what: str = "") -> list[int]:
        """Wait until the new process of each of `ids` registered; returns those that did. An instance reclaimed
        before its worker registered (its process killed from outside: a spot instance taken back while it boots)
        never joined the job: it is declared dead and left out, instead of holding the job until its timeout.
        `what`: if given, losing one is a `JobError` saying that it is needed for `what`."""
        c = self.coord

        def gone() -> set[int]:
            codes = self.provider.exitcodes()
            return {w for w in ids if codes.get(w) == KILLED}

        joined = c.wait_joined(ids, self.deadline - time.monotonic(), self.check, gone)
        lost = sorted(set(ids) - set(joined))
        if lost:
            if what:
                raise JobError(f"instances {lost} were reclaimed before their workers joined; {what} needs them")
            for w in lost:
                self.allowed[w] = set(GONE)
            self._unscheduled |= set(lost)
            self._killed_outside -= set(lost)
            c.note({"event": "lost-before-join", "workers": lost})
            c.declare_dead(lost, "reclaimed before its worker joined")
        return joined

    # -- preemption notices -----------------------------------------------------------------------------------
    def poll_notices(self) -> None:
        """Read the notices workers reported (SIGTERM) since the last poll. One for a worker the driver already
        preempted (a scripted preemption's own SIGTERM) or declared dead changes nothing; any other is pending until
        a boundary decides it, and the provider kills the worker at its deadline (what the cloud does)."""
        now = time.monotonic()
        c = self.coord
        if now - self._notice_polled < NOTICE_POLL_S or c.current is None:
            return
        self._notice_polled = now
        for w, deadline in c.new_notices().items():
            if w in c.preempted or w in c.dead or w in self._noticed:
                continue
            left = deadline - time.time()
            self._noticed[w] = now + left
            self._unscheduled.add(w)
            self.allowed[w] = self.allowed.get(w, {EXIT_DONE}) | {EXIT_PREEMPTED, KILLED}
            self.provider.preempt([w], max(0.0, left), notify=False)
            c.note({"event": "notice", "worker": w, "source": "sigterm", "deadline": deadline,
                    "step": self.step_in_flight()})  # fmt: skip

    def _pending_notices(self) -> dict[int, float]:
        c = self.coord
        self._noticed = {w: d for w, d in self._noticed.items() if w not in c.preempted and w not in c.dead}
        self._folding &= self._noticed.keys()
        return self._noticed

    def _step_s(self, at_step: int) -> float:
        """Seconds per step so far (for when a boundary will come)."""
        t0, s0 = self._trained_from
        return (time.monotonic() - t0) / max(1, at_step - s0)

    def _margin_s(self, at_step: int, folded: bool = False) -> float:
        """`notice_margin_s` at this job's pace and hand-offs so far."""
        return notice_margin_s(self._step_s(at_step), self._handoff_s, folded=folded)

    def decide_notices(self) -> None:
        """Decide the pending notices' preemptions, once the current epoch is committed: a standby instance leaves at
        once; members are preempted at the next boundary training has not reached (`Coordinator.claim`) — in a planned
        job folded into the next interval boundary's decision (a live fleet's prepared plan too) if it comes at least
        the notice margin (`notice_margin_s`) before the earliest deadline, into a scheduled event's decision if the
        claim lands on its boundary. The reconfiguration is the one a scripted `preempt` gives (survivors take over, the
        noticed workers send the layers whose last copy they hold, then exit). With `control.prepare`, when the deadline
        leaves a step to spare, the boundary claimed is one step further and the epoch is published at once
        (`Coordinator.prepare`): its groups form while training goes on, and the decision is taken once training is live
        at the step before (`_notice_at`)."""
        pending = self._pending_notices()
        c = self.coord
        if self._deciding or self._recovering or c.current is None:
            return
        if self._notice_at is not None:  # prepared: decide once training is live at the step before its boundary
            s = self._notice_at
            if not pending:  # the noticed workers are gone meanwhile (a death, their deadline): nothing to decide
                self._notice_at = None
                c.release(s)
            elif self.live_at(s - 1) and (c.committed() or c.entered_at(s)):
                self._notice_at = None
                self._decide_notice(s, pending)
            return
        if not pending:
            return
        if not c.committed():
            return  # new epochs are planned on top of a committed one: at most a step away
        standby = sorted(w for w in pending if w not in c.current.members and w in c.alive())
        if standby:
            c.preempt_standby(standby)
            self.alive_from(self.step_in_flight())
        members = sorted(w for w in pending if w in c.current.members and w not in self._unplaceable)
        if not members:
            return
        p = self.step_in_flight()
        first = p + 1
        if first >= self.steps:
            return  # the job ends before any boundary: the noticed workers finish it
        # the last moment to reach the leaving boundary (a fold made already keeps its boundary on a smaller margin)
        latest = min(pending[w] - self._margin_s(p, folded=w in self._folding) for w in members)
        if self.planner is not None:
            upcoming = [b for b in self._stops_left if b in self.intervals and b >= first]
            if self._live_at is not None and self._live_at >= first:
                upcoming.append(self._live_at)  # a live fleet's prepared plan: decided there
            if upcoming:
                b = min(upcoming)
                eta = time.monotonic() + (b - p) * self._step_s(p)
                if eta <= latest:
                    new = set(members) - self._folding
                    if new:
                        c.note({"event": "notice-folded", "workers": sorted(new), "boundary": b})
                    self._folding |= new
                    return
            elif (plan := self._next_plan_eta()) is not None and plan <= latest:
                new = set(members) - self._folding  # (a live fleet's next plan, not held yet: decided there)
                if new:
                    c.note({"event": "notice-folded", "workers": sorted(new), "boundary": None,
                            "plan_in_s": round(plan - time.monotonic(), 3)})  # fmt: skip
                self._folding |= new
                return
        # prepared (`control.prepare`): a boundary a step further, if it still comes before the deadline, and the
        # epoch published now, so that the hand-off's groups form while training goes on
        ahead = self.prepare and time.monotonic() + (first + 1 - p) * self._step_s(p) <= latest
        s = c.claim(first + 1 if ahead else first)
        if s in self._stops_left or s == self._live_at:
            return  # the boundary of a decision the schedule (or a live plan) makes anyway: the notices fold into it
        if s >= self.steps:
            c.release(s)
            return
        if ahead and s - 1 > p:
            leaving = [w for w in members if w in c.alive()]
            if c.prepare(s, None, leaving, ()) is not None:
                self._notice_at = s
                return
        self._decide_notice(s, pending)

    def _decide_notice(self, s: int, pending: Mapping[int, float]) -> None:
        """The decision at held boundary `s` for the members with a pending notice: they leave there."""
        c = self.coord
        assert c.current is not None
        silent = self.settle()
        if silent:
            self.release_after(s, silent)
            return
        self._deciding = True
        try:
            leaving = [w for w in sorted(pending) if w in c.current.members and w not in self._unplaceable
                       and w in c.alive()]  # fmt: skip
            self.reconfigure(s, None, leaving, (), leaving)
        finally:
            self._deciding = False

    def reconfigure(
        self, s: int, strategy: tuple[int, int] | None, preempt: Sequence[int], added: Sequence[int],
        noticed: Sequence[int], source: str = "schedule",
    ) -> None:  # fmt: skip
        """`Coordinator.reconfigure`, made to fit instances the schedule did not expect to lose (notices, deaths):
        if the strategy no longer fits, keep P and as many replicas as survive (else one pipeline of as many stages);
        if nobody survives to take over from the noticed workers, decide without them (they run to their deadline,
        then die like any worker)."""
        c = self.coord
        try:
            epoch = c.reconfigure(s, strategy, preempt, added, noticed=noticed, source=source)
            self.alive_from(epoch.start_step if epoch is not None else s)
            return
        except PlanError as e:
            if not self._unscheduled:
                raise  # (the schedule's dry run says this cannot happen)
            error = e
        left = len(c.alive() - set(preempt))
        options: list[tuple[int, int] | None] = [None]
        with contextlib.suppress(PlanError):
            options.append(recovery_strategy(c.in_force, left, layer_count(c.spec.model), c.spec.train.global_batch))
        for option in options:
            try:
                epoch = c.reconfigure(s, option, preempt, added, noticed=noticed, source=source)
                self.alive_from(epoch.start_step if epoch is not None else s)
                c.note({"event": "plan-dropped", "step": s, "strategy": list(strategy or ()), "reason": str(error),
                        "instead": list(option) if option else None})  # fmt: skip
                return
            except PlanError:
                continue
        if not noticed:
            raise error
        if not (c.alive() - set(preempt)) and self._park(s, sorted(set(preempt) & set(c.in_force.members))):
            return  # the cloud takes every instance: a live fleet waits for it to come back
        c.note({"event": "notice-unplaceable", "step": s, "workers": list(noticed), "reason": str(error)})
        self._unplaceable |= set(noticed)
        self.reconfigure(s, strategy, [w for w in preempt if w not in noticed], added, (), source)

    def release_after(self, s: int, silent: set[int]) -> None:
        """A boundary claimed for a notice, when instances fell silent meanwhile: let training pass it and recover
        (the notices are decided afterwards)."""
        self.coord.release(s)
        self.recover(silent)

    def _departures(self, preempt: Iterable[int], at: int) -> tuple[list[int], list[int]]:
        """The preemptions the decision at boundary `at` makes: the scheduled ones still possible, plus every pending
        notice (folded) but those that stay for a later one (`_stays`). Returns (all preempted, those from notices)."""
        c = self.coord
        alive = c.alive()
        noticed = sorted(w for w in self._pending_notices() if w in alive and not self._stays(w, at))
        scheduled = [w for w in preempt if w in alive and w not in noticed]
        return sorted(set(scheduled) | set(noticed)), noticed

    def await_boundary(self, s: int) -> None:
        """Wait until training is live at step s-1 (decisions use only the past, and a notice can still be decided
        before s) and the current epoch is committed (nothing is planned on top of a migration that may still roll
        back) — or begins at s itself, every member holding its layers: a recovery whose survivors had finished step
        s-1 and waited at the held boundary s cannot commit before s is decided (waiting for it hung the job), and
        its members hold the state of step s, which is what a decision at s builds on."""
        c = self.coord
        if s - 1 >= c.first_step:
            self.wait(lambda: self.live_at(s - 1) and (c.committed() or c.entered_at(s)),
                      f"training to start step {s - 1} (before deciding step {s})")  # fmt: skip

    # -- the schedule -----------------------------------------------------------------------------------------
    def run(
        self,
        workers: Sequence[int],
        strategy: tuple[int, int],
        start_info: Mapping[str, Any],
        *,
        next_id: int = 0,
        restore_step: int = 0,
        assignment: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        """Start `workers` (ids) on `strategy` (at `restore_step`, loading its checkpoint, when resumed), then apply
        the schedule and the planner's decisions, boundary by boundary, until the last step."""
        c = self.coord
        by_step = {g.step: (i, g) for i, g in enumerate(self.groups)}
        stops = sorted(by_step.keys() | set(self.intervals))
        holds = set(stops) | {g.step + 1 for g in self.groups if g.kill}
        for s in sorted(holds):
            c.claim(s)
        self._stops_left = set(stops)
        ids = self.start_instances(workers, next_id)
        self.wait_joined(ids, f"the job's start on {strategy[0]}x{strategy[1]}")
        c.start(strategy, ids, restore_step=restore_step, assignment=assignment)
        self.prestart(0)  # the schedule's first additions boot while the job starts, not at their boundary
        self.alive_from(restore_step)
        self._trained_from = (time.monotonic(), restore_step)
        self.history = [len(c.alive())]
        self._next_step = restore_step
        self.resumed_at(restore_step)
        self.observer.on_start(start_info)
        self._observing = True
        interval_steps = set(self.intervals)
        self._schedule_open = True
        try:
            for s in stops:
                i, g = by_step.get(s, (None, None))
                if s in interval_steps:
                    self.plan_at(s, i, g)
                else:
                    i, g = by_step[s]  # a stop that is no interval boundary is a scheduled group's
                    self.apply(i, g)
                self._stops_left.discard(s)
                if g is not None and g.kill and g.step + 1 not in stops:
                    c.release(g.step + 1)
        except TrainingEnded:
            pass  # stopped early (`Validation.patience`): the schedule's later boundaries never come
        finally:
            self._schedule_open = False
        # the final epoch trains to the end and writes its shards
        self.wait(lambda: all(self.provider.exitcode(w) == EXIT_DONE for w in c.in_force.members), "the last step")

    def prestart(self, first: int) -> None:
        """Start the processes of upcoming `add`s early (in schedule order, so ids stay as scheduled) while fewer than
        `max_processes` run: an added instance is then ready at its step instead of holding training ~2-3 s while
        it imports torch. The coordinator admits it only at its event (`Coordinator.alive`)."""
        for i in range(first, len(self.groups)):
            g = self.groups[i]
            if not g.add or i in self._started:
                continue
            if len(self.provider.alive()) + g.add > self.max_processes:
                return
            self._started[i] = self.start_instances(g.add)

    def apply(self, i: int, g: EventGroup) -> None:
        """Decide scheduled group `g` at its held boundary, just in time: once training is live at the step before
        (`await_boundary`), so that a notice received meanwhile can still get an earlier boundary of its own."""
        c = self.coord
        self.prestart(i)
        if g.add and i not in self._started:
            self._started[i] = self.start_instances(g.add)
        added = self._started.get(i, [])
        if self.prepare and not g.restart:
            self.prepare_ahead(g, added)
        self.await_boundary(g.step)
        self._deciding = True
        try:
            added = self.wait_joined(added)
            silent = self.settle()  # plan only with instances known to be alive
            if silent:
                self.recover(silent)
            if g.restart:
                c.admit(added)
                self.checkpoint_restart(g.step, g.strategy, on_demand=True)
            else:
                preempt, noticed = self._departures(g.preempt, g.step)
                self.reconfigure(g.step, g.strategy, preempt, added, noticed)
                for w in preempt:
                    self.allowed[w] = self.allowed.get(w, {EXIT_DONE}) | {EXIT_PREEMPTED, KILLED}
                # the schedule's own preemptions get their notice now (SIGTERM); the workers' reports of it change
                # nothing (they are preempted already); noticed ones have theirs
                self.provider.preempt([w for w in preempt if w not in noticed], NOTICE_S)
        finally:
            self._deciding = False
        if g.kill:
            self.kill(g.step, g.kill)

    def prepare_ahead(self, g: EventGroup, added: Sequence[int]) -> None:
        """A step before scheduled group `g`'s boundary (once its predecessor is committed), publish the epoch it will
        decide there (`Coordinator.prepare`): its members form its groups while the current epoch trains, and the
        boundary only swaps them. What happens meanwhile (a notice, a death) changes the decision, and the
        preparation goes unused: nothing is lost but the time it saves."""
        c = self.coord
        if not self._preparable(g.step, "preparing"):
            return
        self._deciding = True
        try:
            added = self.wait_joined(added)
            preempt, _ = self._departures(g.preempt, g.step)
            c.prepare(g.step, g.strategy, preempt, added)
        finally:
            self._deciding = False

    def _preparable(self, s: int, what: str) -> bool:
        """Wait until a decision at boundary `s` can be prepared — training live at `s - 2` on a committed epoch —
        and say whether it can: not without a step to prepare during, nor once the epoch in force begins too late
        to commit before the boundary (a recovery)."""
        c = self.coord
        if s - 1 <= c.first_step:
            return False  # no step to prepare during

        def late() -> bool:
            return c.in_force.start_step >= s - 1

        self.wait(lambda: late() or (self.live_at(s - 2) and c.committed()),
                  f"training to start step {s - 2} (before {what} step {s})")  # fmt: skip
        return not late()

    def step_in_flight(self) -> int:
        """The latest step a member of the current epoch has started (-1 before any)."""
        c = self.coord
        return max((c.progress(m) for m in c.in_force.members), default=-1)

    def live_at(self, step: int) -> bool:
        """Some member of the current epoch has started `step`."""
        c = self.coord
        return any(c.progress(m) >= step for m in c.in_force.members)

    def plan_at(self, s: int, i: int | None, g: EventGroup | None) -> None:
        """The interval boundary before step `s`: once training is live at `s - 1`, apply the boundary's
        availability events (group `g`, if any), ask the planner, and publish one reconfiguration (or let training
        pass); then the group's kills, as `apply` does. With `control.prepare` the planner is asked a step earlier
        (`plan_ahead`): its request holds nothing the last step changes."""
        assert self.planner is not None
        if self.prepare and not self._accepts_handed:  # a plan handed in during the last step must still count
            self.plan_ahead(s, i, g)
        self.await_boundary(s)  # the decision uses only the past: wait for the interval's last step
        self._deciding = True
        try:
            self._plan_at(s, i, g)
        finally:
            self._deciding = False
        if g is not None and g.kill:
            self.kill(s, g.kill)

    def plan_ahead(self, s: int, i: int | None, g: EventGroup | None) -> None:
        """A step before interval boundary `s` (once its predecessor is committed): ask the planner what it will be
        asked at `s` — the boundary's events applied, the added instances joined — and publish that epoch as a
        preparation (`Coordinator.prepare`). At `s` the answer is used if the request came out the same (nothing
        unscheduled happened meanwhile); else the planner is asked again."""
        c = self.coord
        if not self._preparable(s, "planning"):
            return
        self._deciding = True
        try:
            added, scheduled = self._interval_events(i, g)
            if self.settle():
                return  # an instance fell silent: the boundary recovers first, then plans
            preempt, _ = self._departures(scheduled, s)
            alive = len((c.alive() | set(added)) - set(preempt))
            self._ask_ahead(s, alive, s // self.steps_per_interval, preempt, added)
        finally:
            self._deciding = False

    def _ask_ahead(self, s: int, alive: int, interval: int, preempt: Sequence[int], added: Sequence[int] = ()) -> None:
        """Ask the planner, a step before boundary `s`, what it will be asked there (`alive` instances then), and
        publish that epoch as a preparation; `_ask_planner` reuses the answer if the request comes out the same."""
        req = self._plan_request(s, alive, (*self.history, alive), interval)
        decision, details, took = self._consult(req)
        self._planned_ahead = (req, decision, details, took)
        self.coord.prepare(s, decision, preempt, added)

    def _interval_events(self, i: int | None, g: EventGroup | None) -> tuple[list[int], tuple[int, ...]]:
        """The instances scheduled group `g` adds at its interval boundary (started now if not yet, and joined) and
        those it preempts."""
        self.prestart(0)
        if g is None or i is None:
            return [], ()
        if g.add and i not in self._started:
            self._started[i] = self.start_instances(g.add)
        return self.wait_joined(self._started.get(i, [])), g.preempt

    def _plan_at(self, s: int, i: int | None, g: EventGroup | None) -> None:
        c = self.coord
        assert self.planner is not None
        added, scheduled = self._interval_events(i, g)
        silent = self.settle()  # plan only with instances known to be alive
        if silent:
            self.recover(silent)
        c.admit(added)
        preempt, noticed = self._departures(scheduled, s)
        alive = len(c.alive() - set(preempt))
        self.history.append(alive)
        decision = self._ask_planner(s, s // self.steps_per_interval, alive)
        c.reconfigure(s, decision, preempt, added, noticed=noticed, source="planner")  # s is held: it starts there
        self.alive_from(s)
        for w in preempt:
            self.allowed[w] = self.allowed.get(w, {EXIT_DONE}) | {EXIT_PREEMPTED, KILLED}
        self.provider.preempt([w for w in preempt if w not in noticed], NOTICE_S)

    def _ask_planner(self, s: int, interval: int, alive: int) -> tuple[int, int]:
        """The planner's checked decision for the interval that starts at boundary `s`, with `alive` instances
        (`self.history` ends with it); logged and told to the observers."""
        assert self.planner is not None
        c = self.coord
        self.observe(force=True)  # deliver what happened so far, and read plans handed in until now
        req = self._plan_request(s, alive, tuple(self.history), interval)
        ahead, self._planned_ahead = self._planned_ahead, None
        if ahead is not None and ahead[0] == req:
            _, decision, details, took = ahead  # asked a step ahead, with the same request (`plan_ahead`)
        else:
            decision, details, took = self._consult(req)
        info = PlanInfo(interval=req.interval, step=s, alive=alive, current=req.current, decision=decision,
                        decision_s=took, planner=self.planner.name, details=dict(details))  # fmt: skip
        self.plans.append(info)
        c.note({"event": "plan", **plan_info_dict(info)})
        self.observer.on_plan(info)
        return decision

    def _plan_request(self, s: int, alive: int, history: tuple[int, ...], interval: int) -> PlanRequest:
        c = self.coord
        cur = c.in_force
        return PlanRequest(interval=interval, step=s,
                           alive=alive, current=(cur.D, cur.P), history=history, n_layers=layer_count(c.spec.model),
                           global_batch=c.spec.train.global_batch, handed=self._handed,
                           noticed=self._noticed_ahead(interval))  # fmt: skip

    def _noticed_ahead(self, interval: int) -> tuple[int, ...]:
        """The preemptions with notice the schedule makes at the starts of the intervals after `interval`, and the
        noticed members that stay past this boundary (`_stays`), as many intervals as the planner asks for
        (`notices_ahead`: what its cloud's notice would have told by now); trailing zeros cut."""
        ahead, spi = getattr(self.planner, "notices_ahead", 0), self.steps_per_interval
        if not ahead or not spi:
            return ()
        at = {g.step: len(g.preempt) for g in self.groups if g.preempt}
        for w in self._pending_notices():  # (a member that stays past this boundary, `_stays`, leaves at a later one)
            b = self._leaves_at(w, after=interval * spi)
            if b is not None:
                at[b] = at.get(b, 0) + 1
        out = [at.get((interval + j) * spi, 0) for j in range(1, ahead + 1) if (interval + j) * spi < self.steps]
        while out and not out[-1]:
            out.pop()
        return tuple(out)

    def _consult(self, req: PlanRequest) -> tuple[tuple[int, int], Mapping[str, Any], float]:
        """The planner's checked decision for `req`, its details and how long it took."""
        assert self.planner is not None
        t0 = time.perf_counter()
        decision, details = self.planner(req)
        took = time.perf_counter() - t0
        return check_decision(self.planner.name, decision, req), details, took

    # -- where a live fleet differs (`trainer.control.fleet_driver.FleetDriver`) ------------------------------
    def _next_plan_eta(self) -> float | None:
        """When the next live plan not held yet will decide (monotonic clock), for a notice to fold into; None: no
        such plan (a replay's interval boundaries are held from the start)."""
        return None

    def _stays(self, w: int, at: int) -> bool:
        """Whether noticed member `w` keeps training past the decision at boundary `at`: a planned job's next interval
        boundary still comes the notice margin (`notice_margin_s`) before its deadline (it leaves at the last that does,
        as the simulator counts an instance until its preemption; a live fleet's plans: `FleetDriver`)."""
        return self._leaves_at(w, after=at) is not None

    def _leaves_at(self, w: int, after: int) -> int | None:
        """The last interval boundary after `after` that comes the notice margin (`notice_margin_s`) before noticed
        member `w`'s deadline (at the pace trained so far), where it leaves; None: none does (it leaves at `after`'s
        decision)."""
        deadline = self._noticed.get(w)
        c = self.coord
        if deadline is None or c.current is None or w not in c.current.members:
            return None
        p = self.step_in_flight()
        now, step_s = time.monotonic(), self._step_s(p)
        margin = self._margin_s(p)
        fits = [b for b in self.intervals if after < b < self.steps and now + (b - p) * step_s <= deadline - margin]
        return max(fits, default=None)

    def _park(self, s: int, members: Sequence[int]) -> bool:
        """Every instance has a notice and no plan keeps one: whether the job parks at held boundary `s` until
        capacity comes back (a live fleet does; a replay's schedule never leaves it empty: False)."""
        return False

    def _lost_all(self, why: str) -> None:
        """A checkpoint-restart found no instance alive: a live fleet waits for capacity (a replay has nothing to
        wait for)."""

    # -- observers ----------------------------------------------------------------------------------------------
    def observe(self, force: bool = False, final: bool = False) -> None:
        """Feed the observers what happened since the last call (at most every OBSERVE_S unless `force`): committed
        steps in order, complete reconfiguration records (a record after the steps before its boundary), complete
        checkpoints; and read the plans handed in. `final`: the job is over, deliver every remaining record."""
        if not self._observing:
            return
        now = time.monotonic()
        if not (force or final) and now - self._observed_at < OBSERVE_S:
            return
        self._observed_at = now
        c = self.coord
        if self._accepts_handed:
            self._read_handed()
        new = c.committed_losses(self._next_step)
        for s, got in new:
            self._deliver_records(upto=s)
            e = self._epoch_of(s)
            if got.val is not None:  # the held-out scores of boundary s: the parameters step s started from
                self._scored[s] = dict(got.val)
                self.observer.on_validation(s, got.val["loss"], metrics_of(got.val))
            self.observer.on_step(StepInfo(step=s, loss=got.loss, strategy=(e.D, e.P), alive=self.alive_at(s),
                                           time=time.time(), loss_scale=got.scale, skipped=got.skipped,
                                           lr=None if self._lr is None else float(self._lr(s))))  # fmt: skip
            self._next_step = s + 1
        self._deliver_records(upto=self._next_step, final=final)
        if final and not self._final_validated and (val := c.final_validation()) is not None:
            self._final_validated = True
            self._scored[c.end_step] = val  # (a job stopped early has a checkpoint of its final boundary)
            self.observer.on_validation(c.end_step, val["loss"], metrics_of(val))
        # boundaries are passed only as steps go on: asked (every member's progress, a request each) only when a
        # step was committed since; and not during a decision, which may claim boundaries
        if new and not self._deciding:
            c.forget_passed()
        fresh = c.new_checkpoints()
        for s, n in fresh:
            self._checkpointed.add(s)
            self._val_recorded.discard(s)  # (written again: a checkpoint-restart removed the later steps' files)
            self.observer.on_checkpoint(s, Path(c.spec.checkpoint_dir))
            if self.committer is not None:  # every shard is at the URI: its manifest makes the step complete there
                files = c.checkpoint_files(s, n)
                if files is None:
                    self.committer.errors.append(f"step {s}: the workers' reports of their uploaded files are missing")
                else:
                    self.committer.submit(s, files, c.shards_of(s, n))
        recorded = self._record_val_losses()  # (a newly scored checkpoint may be the best: pruned again)
        if (fresh or recorded) and self.keep_checkpoints and self.committer is None:
            self.prune_local()

    def resumed_at(self, step: int) -> None:
        """A resumed job starts from the checkpoint of `step` (0: from scratch): its first boundary's held-out loss is
        that checkpoint's too (a finished job's final layers, which became it, were never scored beside it)."""
        if step:
            self._checkpointed.add(step)

    def _record_val_losses(self) -> bool:
        """Keep the held-out scores of each complete checkpoint beside it once both are known (on this disk where it
        holds the shards, at the checkpoint URI after its manifest): retention keeps the best-scored checkpoint by
        them, and `parcae export --best` exports it, across resumes. A loss that cannot be written is logged; the
        checkpoint is then kept or pruned as if never scored. Returns whether any was recorded."""
        c = self.coord
        todo = sorted((self._scored.keys() & self._checkpointed) - self._val_recorded)
        for s in todo:
            self._val_recorded.add(s)
            held = checkpoint.HeldOut(self._scored[s], self._monitor)
            if self.committer is not None:
                self.committer.record_val(s, held)
            if checkpoint.find_shards(c.spec.checkpoint_dir, s):
                try:
                    checkpoint.write_held_out(c.spec.checkpoint_dir, s, held, job=c.spec.job)
                except OSError as e:
                    c.note({"event": "val-loss-unrecorded", "step": s, "error": f"{type(e).__name__}: {e}"})
                    log.warning("the held-out loss of the checkpoint of step %d is not kept beside it (retention may "
                                "remove that checkpoint): %s", s, e)  # fmt: skip
        return bool(todo)

    def prune_local(self, _step: int | None = None) -> None:
        """Keep the newest `keep_checkpoints` complete checkpoints on this machine's disk."""
        c = self.coord
        checkpoint.prune(c.spec.checkpoint_dir, self.keep_checkpoints, layers=layer_names(c.spec.model),
                         job=c.spec.job)  # fmt: skip

    def _deliver_records(self, upto: int, final: bool = False) -> None:
        """Report, in order, the reconfigurations that start at a step <= `upto` and are complete."""
        c = self.coord
        while self._next_record < len(c.epochs):
            e = c.epochs[self._next_record]
            if not final and (e.start_step > upto or not c.record_complete(e)):
                return
            rec = c.record(e)
            if rec["bytes_moved"] and rec["kind"] != "checkpoint-restart" and rec["trigger"] != "kill":
                self._handoff_s = max(self._handoff_s, float(rec["pause_s"]))  # (what a noticed member's takes)
            self.observer.on_reconfiguration(rec)
            self._next_record += 1

    def alive_from(self, step: int) -> None:
        """Record that the instances alive now (`Coordinator.alive`) train from `step` on: each step's
        ``alive`` then says who was there when it trained, not when it was reported. A record at a step already
        passed (a recovery redoing it, a checkpoint-restart rewinding) replaces the later ones."""
        self._alive_steps = [(s, n) for s, n in self._alive_steps if s < step] + [(step, len(self.coord.alive()))]

    def alive_at(self, step: int) -> int:
        """The instances alive while `step` trained (`alive_from`)."""
        for s, n in reversed(self._alive_steps):
            if s <= step:
                return n
        return len(self.coord.alive())

    def _epoch_of(self, step: int) -> Any:
        """The epoch that trained committed `step`: the latest one starting at or before it, where an epoch starting
        at step r replaces every epoch that started at r or later (a checkpoint-restart rewinds to r)."""
        epochs = self.coord.epochs
        if len(epochs) != self._timeline_n:
            timeline: list[tuple[int, Any]] = []
            for e in epochs:
                while timeline and timeline[-1][0] >= e.start_step:
                    timeline.pop()
                timeline.append((e.start_step, e))
            self._timeline, self._timeline_n = timeline, len(epochs)
        return next((e for start, e in reversed(self._timeline) if start <= step), self._timeline[0][1])

    def _read_handed(self) -> None:
        for seq, raw in self.coord.handed_plans(self._handed_seen):
            self._handed_seen = seq
            if raw is None:  # malformed, or never written: the coordinator logged it
                continue
            d, p = raw["strategy"]
            self._handed = HandedPlan(strategy=(int(d), int(p)), source=str(raw.get("source", "")), seq=seq,
                                      sent_at=float(raw.get("sent_at", 0.0)), received_at=time.time())  # fmt: skip
            self.coord.note({"event": "handed-plan", **self._handed.to_dict()})

    def kill(self, step: int, victims: Sequence[int]) -> None:
        """SIGKILL `victims` once they have started `step` (standby victims: once training has), then wait until the
        coordinator has noticed and the job has recovered."""
        c = self.coord
        victims = [v for v in victims if v not in c.dead and v not in c.preempted]  # (gone after a notice)
        if not victims:
            return
        was, self._deciding = self._deciding, True
        try:
            self._kill(step, victims)
        finally:
            self._deciding = was

    def _kill(self, step: int, victims: Sequence[int]) -> None:
        c = self.coord
        members = set(c.in_force.members)
        in_epoch = [v for v in victims if v in members]

        def started() -> bool:
            # every member has formed the epoch's groups (a kill inside group formation is only noticed at the
            # group timeout), and the victims are inside step `step`
            if c.ready() != members:
                return False
            if in_epoch:
                return all(c.progress(v) >= step for v in in_epoch)
            return any(c.progress(m) >= step for m in members)

        self.wait(started, f"workers {sorted(victims)} to start step {step}")
        for v in victims:
            self.allowed[v] = {KILLED, EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART}
        self._scripted_kills |= set(victims)
        at = time.time()
        self.provider.kill(victims)
        c.note_killed(victims, at)
        self.wait(lambda: set(victims) <= c.dead, f"the death of {sorted(victims)} to be detected")

    # -- failures ---------------------------------------------------------------------------------------------
    def recover(self, stale: Iterable[int]) -> None:
        """The current epoch broke, or heartbeats stopped, or the provider reclaimed a noticed instance: declare the
        dead, fix whether the current migration committed (`Coordinator.seal`), collect the survivors' reports,
        then continue with a live migration or, failing that, a checkpoint-restart. A death during a migration's
        hand-off is detected like any other (heartbeat timeout) and rolls the migration back."""
        c = self.coord
        self._recovering = True
        try:
            dead = set(stale)
            report_by = time.monotonic() + self.pg_timeout_s + 2 * c.hb_timeout_s + 5
            while True:
                if dead:
                    for w in dead:
                        self.allowed[w] = set(GONE)
                    self._unscheduled |= set(dead) - self._scripted_kills
                    self._fenced |= dead - c.dead  # (those `vanished` found dead are declared already)
                    c.declare_dead(dead, f"heartbeat lost: silent for more than the {c.hb_timeout_s:g} s bound "
                                         "(hb_timeout_s, parcae train --heartbeat-timeout)")  # fmt: skip
                    self.provider.kill(dead)  # fence: a hung worker must not come back into the job
                if not c.epoch_broken():
                    # a standby instance (or a preempted one that had handed off) died: nothing to redo
                    self.alive_from(self.step_in_flight())
                    return
                c.break_epoch(c.epoch_broken() or "")  # a worker's own flag: every party of the migration sees it
                c.seal()
                survivors = c.reporters()
                if not survivors:
                    reports: dict[int, int] = {}
                    break
                dead = self._silent_and_dead(c.check_heartbeats(every_s=0.02)) | self.vanished()
                if dead:
                    continue
                self.check()
                reports = c.abandoned()
                if survivors <= reports.keys():
                    break
                if time.monotonic() > report_by:
                    raise JobError(f"survivors {sorted(survivors - reports.keys())} of epoch {c.in_force.number} "
                                   "did not report after it broke")  # fmt: skip
                time.sleep(POLL_S)
            more = self.settle()  # a standby killed with the member must not be planned in
            if more:
                self._fenced |= more - c.dead
                c.declare_dead(more)
                self.provider.kill(more)
                for w in more:
                    self.allowed[w] = set(GONE)
                survivors -= more
            if not (c.dead & c.holders()):
                self._no_death_recoveries += 1
                if self._no_death_recoveries > 3:
                    raise JobError(f"epoch {c.in_force.number} keeps breaking with every worker alive: "
                                   f"{c.epoch_broken()}")  # fmt: skip
            redo = {reports[w] for w in survivors if w in reports}
            if len(redo) > 1:
                raise JobError(f"survivors disagree on the step to redo: {reports}")
            if redo:
                r = redo.pop()
            else:  # nobody survived: the step is the one the dead started last
                r = max(c.progress(w) for w in c.holders())
            if c.recover(r) is None:
                self.checkpoint_restart(r, None, on_demand=False, survivors=sorted(survivors))
            else:
                self.alive_from(r)
        finally:
            self._recovering = False

    def _revive(self) -> list[int]:
        """No instance is left alive: those whose workers were declared dead on a silent heartbeat alone (fenced:
        hung, or starved past every bound) still exist, so the checkpoint-restart starts fresh workers on them
        instead of failing the job. Instances the schedule killed or the cloud reclaimed are not among them, nor
        instances elsewhere (only local processes: fencing an agent's instance may have handed it back)."""
        c = self.coord
        if getattr(self.provider, "running", None) is None:  # fencing an instance elsewhere may have ended it
            return []
        ids = sorted((self._fenced & c.dead) - c.preempted - self._scripted_kills)
        if ids:
            c.revive(ids)
            self._fenced -= set(ids)
            self._unscheduled -= set(ids)
        return ids

    def checkpoint_restart(
        self, step: int, strategy: tuple[int, int] | None, *, on_demand: bool, survivors: Sequence[int] = ()
    ) -> None:
        """What torchrun does: stop every worker process of the epoch, start fresh ones, load the latest complete
        checkpoint into `strategy`, continue. On demand (at the held boundary before `step`) the members first
        write the checkpoint of `step`; after a failure the survivors' state is discarded."""
        c = self.coord
        was, self._recovering = self._recovering, True
        try:
            revived = self._revive() if not on_demand and not c.alive() else []
            ids = c.restart_members()
            # holders under a notice whose hand-off was rolled back: their state is discarded too, and they leave
            leaving = [] if on_demand else c.leaving_members()
            for w in ids:
                self.allowed[w] = {EXIT_RESTART, KILLED} if w in revived else {EXIT_RESTART}
            for w in leaving:
                self.allowed[w] = {EXIT_RESTART, EXIT_PREEMPTED, KILLED}
            c.order_restart([*ids, *leaving] if not on_demand else (), step=step if on_demand else None)
            self.wait(lambda: all(self.provider.exitcode(w) is not None for w in [*ids, *leaving]),
                      f"workers {ids} to exit for a checkpoint-restart", self.pg_timeout_s + 30)  # fmt: skip
            self.check()
            restore = c.latest_checkpoint()
            if on_demand and restore != step:
                raise JobError(f"checkpoint-restart at step {step}: the latest complete checkpoint is {restore}")
            c.clear_restart(ids)
            c.expect(ids)
            self.provider.restart(ids)
            for w in ids:
                self.allowed[w] = {EXIT_DONE}
            self.wait_joined(ids, "the checkpoint-restart")
            if not c.alive():  # the cloud took every instance (a live fleet: wait for capacity)
                self._lost_all(f"every instance was lost; the job restarts from the checkpoint of step {restore}")
            self.observe(force=True)  # the old processes are gone: report every step they committed first
            c.publish_restart(restore, strategy, ids if on_demand else survivors, steps_lost=step - restore)
            self.alive_from(restore)
            self._next_step = min(self._next_step, restore)  # the recomputed steps are reported again
        finally:
            self._recovering = was


@dataclass(frozen=True)
class LivePlanning:
    """A job's live planner: asked at each of the `intervals` boundaries (every `steps_per_interval` steps)."""

    planner: Planner | None = None
    intervals: Sequence[int] = ()
    steps_per_interval: int = 0
