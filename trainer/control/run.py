"""Run one elastic job end to end: a coordinator, the instances of a provider, a schedule, and optionally a live
planner, observers and a resume from the job's last checkpoint.

Owns: `run_job(config, schedule)` and `train(config)` (what `parcae train` and the train flow run), the driver loop that
applies the schedule (`_Driver`: boundaries held and decided in order, notices, deaths -> live recovery or
checkpoint-restart, the planner at interval boundaries, the observers), the resume point and the job's result. Must not
touch: migration planning (`trainer.runtime.migration`), what a planner decides (`trainer.control.planning`), the store
layout (`trainer.control.coordinator`), training (`trainer.runtime.worker`), where instances come from
(`trainer.providers`).

Where to look next: `docs/driver.md` (how a schedule, notices, kills, live planning, observers and resume are
driven, in detail), `trainer.config.JobConfig` (every setting), `trainer.control.events` (the schedule format).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forecasting import jsonio
from trainer.config import JobConfig, ModelConfig
from trainer.control.coordinator import (
    HB_RUNNING_FACTOR,
    Coordinator,
    ScheduleError,
    check_schedule,
    schedule_state,
)
from trainer.control.events import EventGroup, Schedule, group_events, load_events, parse_events
from trainer.control.planning import HandedPlan, Planner, PlanRequest, check_decision, plan_info_dict
from trainer.control.schedules import LocalTraceProvider, trace_strategy
from trainer.observe.observer import JobObserver, ObserverList, PlanInfo, StepInfo
from trainer.providers import provider
from trainer.providers.agent import AgentInstances, RemoteJob
from trainer.providers.local import LocalProcessProvider
from trainer.runtime import checkpoint, keys
from trainer.runtime.migration import PlanError, recovery_strategy
from trainer.runtime.model import layer_names
from trainer.runtime.pipeline import parameters_checksum
from trainer.runtime.store import TOKEN_FILE, new_token, write_token_file
from trainer.runtime.worker import EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART, EXIT_TOKEN

POLL_S = 0.005
OBSERVE_S = 0.1  # observers are fed at most this often from the driver loop (each poll reads only new store keys)
KILLED = -9  # exit code of a SIGKILLed process
NOTICE_S = 120.0  # a preempted worker still running this long after its notice is killed (AWS: two minutes)
NOTICE_MARGIN_S = 5.0  # a notice is folded into the next interval boundary only if it comes this long before the
# deadline (time for the hand-off itself); else the preemption gets a boundary of its own at once
NOTICE_POLL_S = 0.05  # notices are read from the store at most this often (with the heartbeats)
GONE = {KILLED, EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART, 1, 3}  # exit codes a worker declared dead may show


class JobError(RuntimeError):
    """A job that started but did not finish: a worker failed, exited unexpectedly or the job timed out."""


class _Driver:
    """Applies one job's schedule: the provider's processes on one side, the coordinator's decisions on the other;
    asks the planner at interval boundaries and feeds the observers."""

    def __init__(
        self, coord: Coordinator, provider: LocalProcessProvider | AgentInstances, groups: Sequence[EventGroup],
        live: LivePlanning, *, deadline: float, max_processes: int, observer: ObserverList | None = None,
    ) -> None:  # fmt: skip
        cfg = coord.config
        self.coord, self.provider, self.groups, self.steps = coord, provider, list(groups), cfg.steps
        self.deadline, self.pg_timeout_s = deadline, cfg.control.pg_timeout_s
        self.max_processes = max_processes
        self.keep_checkpoints = cfg.checkpoint.keep  # complete checkpoints kept on disk (0: all)
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
        self._deciding = False  # inside a boundary decision or a scripted kill: notices wait
        self._stops_left: set[int] = set()  # scripted event steps and interval boundaries not decided yet
        self._trained_from = (0.0, 0)  # (monotonic time, step) when training started: the step time estimate
        # live planning
        self.planner = planner
        self.intervals = sorted(intervals)
        self.steps_per_interval = steps_per_interval
        self.plans: list[PlanInfo] = []
        self.history: list[int] = []  # alive count at each interval boundary since the job (re)started
        self._accepts_handed = bool(getattr(planner, "accepts_handed", False))
        self._handed: HandedPlan | None = None
        self._handed_seen = 0
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
        end = self.deadline if timeout_s is None else min(self.deadline, time.monotonic() + timeout_s)
        while not cond():
            self.tick()
            if time.monotonic() > end:
                raise JobError(f"timed out waiting for {what}")
            time.sleep(POLL_S)

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

    def decide_notices(self) -> None:
        """Decide the pending notices' preemptions, once the current epoch is committed: a standby instance leaves
        at once; members are preempted at the next boundary training has not reached (`Coordinator.claim`) — in a
        planned job folded into the next interval boundary's decision if it comes at least `NOTICE_MARGIN_S` before
        the earliest deadline, into a scheduled event's decision if the claim lands on its boundary. The
        reconfiguration is the one a scripted `preempt` gives (survivors take over, the noticed workers send the
        layers whose last copy they hold, then exit)."""
        pending = self._pending_notices()
        c = self.coord
        if not pending or self._deciding or self._recovering or c.current is None:
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
        deadline = min(pending[w] for w in members)
        if self.planner is not None:
            upcoming = [b for b in self._stops_left if b in self.intervals and b >= first]
            if upcoming:
                b = min(upcoming)
                eta = time.monotonic() + (b - p) * self._step_s(p)
                if eta <= deadline - NOTICE_MARGIN_S:
                    new = set(members) - self._folding
                    if new:
                        c.note({"event": "notice-folded", "workers": sorted(new), "boundary": b})
                    self._folding |= new
                    return
        s = c.claim(first)
        if s in self._stops_left:
            return  # the boundary of a decision the schedule makes anyway: the notices are folded into it
        if s >= self.steps:
            c.release(s)
            return
        silent = self.settle()
        if silent:
            self.release_after(s, silent)
            return
        self._deciding = True
        try:
            leaving = [w for w in members if w in c.alive()]
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
            options.append(recovery_strategy(c.in_force, left, c.spec.model.n_layers_total, c.spec.train.global_batch))
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
        c.note({"event": "notice-unplaceable", "step": s, "workers": list(noticed), "reason": str(error)})
        self._unplaceable |= set(noticed)
        self.reconfigure(s, strategy, [w for w in preempt if w not in noticed], added, (), source)

    def release_after(self, s: int, silent: set[int]) -> None:
        """A boundary claimed for a notice, when instances fell silent meanwhile: let training pass it and recover
        (the notices are decided afterwards)."""
        self.coord.release(s)
        self.recover(silent)

    def _departures(self, preempt: Iterable[int]) -> tuple[list[int], list[int]]:
        """The preemptions a boundary decision makes: the scheduled ones still possible, plus every pending notice
        (folded). Returns (all preempted, those from notices)."""
        c = self.coord
        alive = c.alive()
        noticed = sorted(w for w in self._pending_notices() if w in alive)
        scheduled = [w for w in preempt if w in alive and w not in noticed]
        return sorted(set(scheduled) | set(noticed)), noticed

    def await_boundary(self, s: int) -> None:
        """Wait until training is live at step s-1 (decisions use only the past, and a notice can still be decided
        before s) and the current epoch is committed (nothing is planned on top of a migration that may still roll
        back)."""
        c = self.coord
        if s - 1 >= c.first_step:
            self.wait(lambda: self.live_at(s - 1) and c.committed(),
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
        self.alive_from(restore_step)
        self._trained_from = (time.monotonic(), restore_step)
        self.history = [len(c.alive())]
        self._next_step = restore_step
        self.observer.on_start(start_info)
        self._observing = True
        interval_steps = set(self.intervals)
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
                preempt, noticed = self._departures(g.preempt)
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
        pass); then the group's kills, as `apply` does."""
        assert self.planner is not None
        self.await_boundary(s)  # the decision uses only the past: wait for the interval's last step
        self._deciding = True
        try:
            self._plan_at(s, i, g)
        finally:
            self._deciding = False
        if g is not None and g.kill:
            self.kill(s, g.kill)

    def _plan_at(self, s: int, i: int | None, g: EventGroup | None) -> None:
        c = self.coord
        assert self.planner is not None
        self.prestart(0)
        added: list[int] = []
        scheduled: tuple[int, ...] = ()
        if g is not None and i is not None:
            if g.add and i not in self._started:
                self._started[i] = self.start_instances(g.add)
            added = self.wait_joined(self._started.get(i, []))
            scheduled = g.preempt
        silent = self.settle()  # plan only with instances known to be alive
        if silent:
            self.recover(silent)
        c.admit(added)
        preempt, noticed = self._departures(scheduled)
        alive = len(c.alive() - set(preempt))
        self.history.append(alive)
        self.observe(force=True)  # deliver what happened so far, and read plans handed in until now
        cur = c.in_force
        req = PlanRequest(interval=s // self.steps_per_interval, step=s, alive=alive, current=(cur.D, cur.P),
                          history=tuple(self.history), n_layers=c.spec.model.n_layers_total,
                          global_batch=c.spec.train.global_batch, handed=self._handed)  # fmt: skip
        t0 = time.perf_counter()
        decision, details = self.planner(req)
        took = time.perf_counter() - t0
        decision = check_decision(self.planner.name, decision, req)
        info = PlanInfo(interval=req.interval, step=s, alive=alive, current=req.current, decision=decision,
                        decision_s=took, planner=self.planner.name, details=dict(details))  # fmt: skip
        self.plans.append(info)
        c.note({"event": "plan", **plan_info_dict(info)})
        self.observer.on_plan(info)
        c.reconfigure(s, decision, preempt, added, noticed=noticed, source="planner")  # s is held: it starts there
        self.alive_from(s)
        for w in preempt:
            self.allowed[w] = self.allowed.get(w, {EXIT_DONE}) | {EXIT_PREEMPTED, KILLED}
        self.provider.preempt([w for w in preempt if w not in noticed], NOTICE_S)

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
        for s, loss in new:
            self._deliver_records(upto=s)
            e = self._epoch_of(s)
            self.observer.on_step(StepInfo(step=s, loss=loss, strategy=(e.D, e.P), alive=self.alive_at(s),
                                           time=time.time()))  # fmt: skip
            self._next_step = s + 1
        self._deliver_records(upto=self._next_step, final=final)
        fresh = c.new_checkpoints()
        for s in fresh:
            self.observer.on_checkpoint(s, Path(c.spec.checkpoint_dir))
        if fresh and self.keep_checkpoints:
            checkpoint.prune(c.spec.checkpoint_dir, self.keep_checkpoints, layers=layer_names(c.spec.model),
                             job=c.spec.job)  # fmt: skip

    def _deliver_records(self, upto: int, final: bool = False) -> None:
        """Report, in order, the reconfigurations that start at a step <= `upto` and are complete."""
        c = self.coord
        while self._next_record < len(c.epochs):
            e = c.epochs[self._next_record]
            if not final and (e.start_step > upto or not c.record_complete(e)):
                return
            self.observer.on_reconfiguration(c.record(e))
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
            self.observe(force=True)  # the old processes are gone: report every step they committed first
            c.publish_restart(restore, strategy, ids if on_demand else survivors, steps_lost=step - restore)
            self.alive_from(restore)
            self._next_step = min(self._next_step, restore)  # the recomputed steps are reported again
        finally:
            self._recovering = was


WORKERS_PER_CORE = 4  # local worker processes a core can hold usefully (one torch thread each; beyond, they thrash)


def local_capacity() -> int:
    """The most local worker processes a job may have alive at once on this machine."""
    return max(2 * WORKERS_PER_CORE, WORKERS_PER_CORE * (os.cpu_count() or 1))


def _check_local_capacity(peak: int) -> None:
    """Refuse a schedule that would put more worker processes on this machine than it can hold (`ScheduleError`)
    before anything starts: a hundred workers on two cores is a mistake, not a job."""
    most = local_capacity()
    if peak > most:
        raise ScheduleError(f"the schedule has up to {peak} worker processes alive at once; this machine has "
                            f"{os.cpu_count()} cores and holds at most {most} ({WORKERS_PER_CORE} per core): "
                            "scale the workers or the trace down, or run the instances elsewhere "
                            "(--hosts)")  # fmt: skip


def peak_instances(workers: int, groups: Sequence[EventGroup]) -> int:
    """The most instances alive at once under the schedule (adds before the same step's departures)."""
    alive = peak = workers
    for g in groups:
        alive += g.add
        peak = max(peak, alive)
        alive -= len(g.preempt) + len(g.kill)
    return peak


@dataclass(frozen=True)
class LivePlanning:
    """A job's live planner: asked at each of the `intervals` boundaries (every `steps_per_interval` steps)."""

    planner: Planner | None = None
    intervals: Sequence[int] = ()
    steps_per_interval: int = 0


def run_job(
    config: JobConfig,
    schedule: Schedule,
    *,
    observer: JobObserver | None = None,
    planner: Planner | None = None,
    remote: RemoteJob | None = None,
) -> dict[str, Any]:
    """Train `config` (its steps, model, checkpoints, control plane, ...) on `schedule`: its `workers` initial
    instances starting at its `strategy` = (D, P), then its `events`.

    Everything is validated before a process starts (impossible strategies, bad events, an out_dir holding an earlier
    job's files, a foreign or corrupt checkpoint to resume from: `ScheduleError`, `EventError`); a job that starts but
    fails raises `JobError` with the failing worker's message (or the planner's `PlanError`), and no worker outlives the
    call. `events` are dicts in the `trainer.control.events` format or `Event`s; a checkpoint-restart loads the latest
    complete periodic checkpoint. Added instances are started ahead of their event while fewer than
    `config.provider.max_processes` worker processes run (default: the most the schedule has alive at once).

    `observer` is told about the job as it runs (`trainer.observe.observer`; one that raises is dropped). With a
    `planner` (`trainer.control.planning`), the strategy is decided live at every interval boundary, each
    `schedule.steps_per_interval` steps; `events` must then be availability events only (add, preempt, kill). With
    `config.checkpoint.resume`, the job starts from the latest complete checkpoint of the same job if there is one (see
    the module docstring), else from scratch.

    A worker process that receives SIGTERM takes it as a preemption notice with `config.control.notice_grace_s`
    seconds of grace: the job hands its layers off at the next boundary and the worker exits; one still running
    at the deadline is killed and recovered from like any death (its record says `"source": "sigterm"`).

    Instances are local worker processes, or, with `remote` (`trainer.providers.agent.RemoteJob`: EC2 spot instances
    from `trainer.providers.aws.aws_job`, hosts over ssh), instances elsewhere whose workers an agent runs; the
    coordinator then listens on `remote.port` and requires `remote.token`. Returns (JSON-serialisable)::

        {"loss": [loss of each step from first_step], "first_step": 0 or the step a resumed job started at,
         "resumed_from": that step or None, "resume_note": what resume found (None without resume),
         "reconfigurations": [one record per reconfiguration, see Coordinator.records],
         "epochs": [one span per epoch, see Coordinator.epoch_spans], "plans": [each planner decision, see
         trainer.control.planning.plan_info_dict], "final_checksum": sha256 of all parameters, "layers": directory of
         the final shards (one per final stage), "replicas": {worker id: {"stage", "replica", "digest"}} of the final
         epoch, "latest_checkpoint": step, "throughput": {"steps_per_s", "samples_per_s", "tokens_per_s",
         "train_s"} (of the steps this run trained), "events": the coordinator's log, "states": {worker id: its
         state transitions}, "exit_codes": {worker id: code of its last process}, "wall_s": seconds}
    """
    t0 = time.monotonic()
    model, train_cfg, steps, job = config.model, config.train, config.steps, config.job
    workers, steps_per_interval = schedule.workers, schedule.steps_per_interval
    evs = parse_events(list(schedule.events))
    groups = group_events(evs)
    strategy = (int(schedule.strategy[0]), int(schedule.strategy[1]))
    rule = None
    if planner is not None:
        if steps_per_interval < 1:
            raise ScheduleError(f"a job with a live planner needs steps_per_interval >= 1, got {steps_per_interval}")
        planned = sorted({(e.kind, e.step) for e in evs if e.kind in ("plan", "checkpoint-restart")})
        if planned:
            raise ScheduleError(
                f"a job with a live planner ({planner.name}) takes availability events only (add, preempt, kill); "
                f"the schedule has {', '.join(f'{k} at step {st}' for k, st in planned)}: drop them "
                "(e.g. trace_schedule(..., plans=False))"
            )
        rule = lambda n: trace_strategy(n, model.n_layers_total, train_cfg.global_batch)  # noqa: E731
    elif steps_per_interval:
        raise ScheduleError(f"steps_per_interval={steps_per_interval} needs a planner (planner=...)")
    check_schedule(model, train_cfg, workers, strategy, steps, groups, strategy_for=rule)
    out = Path(config.out_dir)
    layers_dir, ckpt_dir = Path(config.layers_dir), Path(config.checkpoint_dir)
    restore, note = 0, None
    if config.checkpoint.resume:
        found = _resume_point(ckpt_dir, layers_dir, model, job, steps)
        restore = found[0] if found else 0
        _clear_for_resume(layers_dir, ckpt_dir, restore)
        note = (f"resumed from the checkpoint of step {restore} in {ckpt_dir} ({len(found[1])} files); "
                f"steps 0..{restore - 1} were trained by an earlier run" if found else
                f"resume: {ckpt_dir} holds no complete checkpoint of job {job!r}; started from step 0")  # fmt: skip
        if found and found[2]:
            note += f" (skipped {'; '.join(found[2])})"
    else:
        for d in (layers_dir, ckpt_dir):
            if d.exists() and any(d.iterdir()):
                raise ScheduleError(f"{d} already holds files (of an earlier job?); give a fresh output folder "
                                    "(--out-dir), or resume (--resume) to continue that job from its last "
                                    "checkpoint")  # fmt: skip
    ids: Sequence[int] = range(workers)
    next_id, start, assignment = workers, strategy, None
    if restore:  # start where the schedule was at the resume step, and drop the events before it
        state = schedule_state(model, train_cfg, workers, strategy, steps, groups, restore, strategy_for=rule)
        ids, next_id = state.alive, state.next_id
        start, assignment = (state.epoch.D, state.epoch.P), state.epoch.assignment
        groups = [g for g in groups if g.step >= restore]
    intervals: list[int] = []
    if planner is not None:
        intervals = [b for b in range(steps_per_interval, steps, steps_per_interval) if b >= restore]
    peak = max(len(ids), peak_instances(len(ids), groups))
    max_processes = config.provider.max_processes or peak
    if remote is None:
        _check_local_capacity(peak)
    bind, token = ((remote.host, remote.port), remote.token) if remote is not None else (None, new_token())
    token_file = write_token_file(out / TOKEN_FILE, token)  # for clients that hand plans in (`hand_plan`)
    _write_job_file(out, config)
    coord = Coordinator(config, token=token, bind=bind)
    if planner is not None and getattr(planner, "accepts_handed", False):
        coord.accept_handed_plans(planner.name)
    provider: LocalProcessProvider | AgentInstances
    if remote is not None:
        provider = remote.instances(coord.store)
    else:
        provider = LocalProcessProvider(coord.host, coord.port, coord.token, config.provider.start_method,
                                        driver_key=coord.store.driver_key)  # fmt: skip
    obs = ObserverList([observer])
    timeout_s = config.control.timeout_s
    deadline = math.inf if timeout_s is None else t0 + timeout_s  # no hidden deadline: a job runs until it is done
    driver = _Driver(coord, provider, groups, LivePlanning(planner, intervals, steps_per_interval),
                     deadline=deadline, max_processes=max_processes, observer=obs)  # fmt: skip
    info = {
        "job": job, "model": model.name, "workers": len(ids), "strategy": start, "steps": steps,
        "global_batch": train_cfg.global_batch, "checkpoint_dir": str(ckpt_dir), "resumed_from": restore or None,
        "host": coord.host, "port": coord.port, "token_file": str(token_file), "resume_note": note,
        "planner": planner.name if planner is not None else None,
        "steps_per_interval": steps_per_interval, "notice_grace_s": config.control.notice_grace_s,
        "config": config.to_dict(),
    }  # fmt: skip
    try:
        driver.run(ids, start, info, next_id=next_id, restore_step=restore, assignment=assignment)
        t_train = time.time() - float(coord.store.get(keys.epoch_decided(1)))
        coord.finish()
        driver.wait(lambda: all(c is not None for c in provider.exitcodes().values()), "every process to end")
        driver.observe(final=True)
        shards = checkpoint.find_shards(layers_dir, steps)
        final = checkpoint.load(shards, config=model, job=job)
        trained = steps - restore
        samples = trained * train_cfg.global_batch
        result = {
            "loss": coord.losses(),
            "first_step": restore,
            "resumed_from": restore or None,
            "resume_note": note,
            "reconfigurations": coord.records(),
            "epochs": coord.epoch_spans(),
            "plans": [plan_info_dict(p) for p in driver.plans],
            "final_checksum": parameters_checksum(final.layers, layer_names(model)),
            "layers": str(layers_dir),
            "replicas": {w: json.loads(coord.store.get(keys.replica_final(w))) for w in coord.in_force.members},
            "latest_checkpoint": coord.latest_checkpoint(),
            "throughput": {
                "steps_per_s": trained / t_train,
                "samples_per_s": samples / t_train,
                "tokens_per_s": samples * model.block_size / t_train,
                "train_s": t_train,
            },
            "events": coord.log,
            "states": {w: coord.states(w) for w in sorted(provider.exitcodes())},
            "exit_codes": dict(sorted(provider.exitcodes().items())),
            "wall_s": time.monotonic() - t0,
        }
    except BaseException as e:  # noqa: BLE001 — KeyboardInterrupt/SystemExit too: observers flush, then re-raise
        why = "the job was interrupted" if isinstance(e, KeyboardInterrupt) else f"run_job failed: {type(e).__name__}"
        coord.abort(why)
        err = JobError(str(e)) if isinstance(e, TimeoutError) else e
        obs.on_error(err)
        if err is e:
            raise
        raise err from None
    finally:
        provider.stop()
    obs.on_end(result)
    return result


def _resume_point(
    ckpt_dir: Path, layers_dir: Path, model: ModelConfig, job: str, steps: int
) -> tuple[int, list[Path], list[str]] | None:
    """Where a resumed job of `steps` steps starts: (step, files, why each newer checkpoint was skipped), or None.

    The newest intact checkpoint of job `job` in `ckpt_dir` (hash records verified, then loaded: same model config,
    finite values). A corrupt, incomplete or unverified newer one is skipped, and said why; with none intact but
    some corrupt, resuming is refused (`ScheduleError` naming them) rather than silently restarted from scratch.
    A finished job (final parameters in `layers_dir`) is refused unless `steps` is larger: then it trains on from
    its final parameters, which become the checkpoint of its last step — later weights are never replaced by
    earlier ones. A checkpoint of another job or model is an error naming the file."""
    names = layer_names(model)
    done = _finished_step(layers_dir, names, job)
    if done is not None:
        if done >= steps:
            raise ScheduleError(f"job {job!r} has finished: it trained {done} steps (its final parameters are in "
                                f"{layers_dir}); nothing to resume. Ask for more steps than {done} to train on from "
                                "there, or give a fresh output folder (--out-dir) for a new job")  # fmt: skip
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.remove_after(ckpt_dir, done - 1)  # (a partial checkpoint of that same step)
        for f in checkpoint.step_files(layers_dir, done):
            os.replace(f, ckpt_dir / f.name)
    skipped: list[str] = []
    damaged = False
    for s in checkpoint.checkpoint_steps(ckpt_dir):
        v = checkpoint.verify_step(ckpt_dir, s, names, job=job)
        if v.status == "foreign":
            raise ScheduleError(f"cannot resume from {ckpt_dir}: {', '.join(f.name for f in v.files)} (step {s}) "
                                f"is not this job's checkpoint ({'; '.join(v.problems)}); move it away or give "
                                "another checkpoint_dir")  # fmt: skip
        if not v.intact:
            skipped.append(str(v))
            damaged |= v.status != "incomplete"  # (a killed run's last, partly written one is no damage)
            continue
        try:
            checkpoint.load(list(v.files), config=model, job=job)
        except checkpoint.ForeignCheckpointError as e:
            raise ScheduleError(f"cannot resume from {ckpt_dir}: {e}; move the file away or give another "
                                "checkpoint_dir") from None  # fmt: skip
        except checkpoint.CheckpointError as e:
            skipped.append(f"step {s} ({e})")
            damaged = True
            continue
        if s >= steps:
            raise ScheduleError(f"cannot resume from {ckpt_dir}: its latest checkpoint is of step {s}, not "
                                f"before this job's last step ({steps} steps); was it a longer job?")  # fmt: skip
        return s, list(v.files), skipped
    if damaged:
        raise ScheduleError(f"cannot resume from {ckpt_dir}: no intact checkpoint; skipped {'; '.join(skipped)}. "
                            "Move the damaged files away to start from scratch")  # fmt: skip
    return None


def _finished_step(layers_dir: Path, names: Sequence[str], job: str) -> int | None:
    """The step count of a job that finished here: its final shards in `layers_dir`, complete and intact."""
    for s in checkpoint.checkpoint_steps(layers_dir):
        if checkpoint.verify_step(layers_dir, s, names, job=job).intact:
            return s
    return None


def _clear_for_resume(layers_dir: Path, ckpt_dir: Path, restore: int) -> None:
    """Remove what the killed run left that the resumed one would trip over: its final shards (if it got that far)
    and temporary files, and checkpoints after the resume step (an incomplete one, or one of another cut). Anything
    else in these directories is not the job's: refuse to touch it."""
    checkpoint.remove_after(ckpt_dir, restore)
    checkpoint.remove_after(layers_dir, -1)
    for d in (layers_dir, ckpt_dir):
        if not d.is_dir():
            continue
        checkpoint.remove_temporary(d)
        others = sorted(p.name for p in d.iterdir() if not checkpoint.is_checkpoint_file(p.name))
        if others:
            raise ScheduleError(f"{d} holds files that are not this job's checkpoints ({', '.join(others[:3])}); "
                                "move them away to resume")  # fmt: skip


def job_schedule(config: JobConfig, *, planned: bool) -> Schedule:
    """The schedule `config.availability` describes: a replayed trace (`LocalTraceProvider`: one interval lasts
    `interval_seconds`, i.e. `interval_seconds / step_seconds` steps; with a live planner (`planned`) its
    availability changes only), an events file, or no events. The first strategy is the config's, else the
    trace's, else the rule's for the workers."""
    av, steps = config.availability, config.steps
    spi = max(1, round(av.interval_seconds / av.step_seconds)) if planned else 0
    if av.trace is not None:
        provider = LocalTraceProvider(av.trace, av.workers, av.interval_seconds, config.train.seed,
                                      kill_fraction=av.kill_fraction, start_interval=av.start_interval)  # fmt: skip
        sched = provider.schedule(steps, av.step_seconds, plans=not planned)
        return dataclasses.replace(sched, strategy=av.strategy or sched.strategy,
                                   steps_per_interval=sched.steps_per_interval if planned else 0)  # fmt: skip
    events = load_events(av.events_file) if av.events_file is not None else []
    strategy = av.strategy or trace_strategy(av.workers, config.model.n_layers_total)
    return Schedule(workers=av.workers, strategy=strategy, events=events, steps_per_interval=spi)


def train(
    config: JobConfig,
    *,
    observer: JobObserver | None = None,
    planner: Planner | None = None,
    json_out: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """What `parcae train` and the train flow run: `config`'s job on its schedule (`job_schedule`), on the
    instances of its provider (`trainer.providers`: local processes, hosts over ssh, EC2 spot), decided live by
    `planner` every interval if one is given; the report is `job_report(result)` (also written to `json_out`).
    With `config.checkpoint.resume` the job continues from the latest checkpoint in its out_dir (the same config
    gives the same schedule, which restarts there)."""
    remote = provider(config.provider.name).job(config.provider.options)  # None: local worker processes
    result = run_job(config, job_schedule(config, planned=planner is not None), observer=observer, planner=planner,
                     remote=remote)  # fmt: skip
    report = job_report(result)
    if json_out is not None:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(jsonio.dumps_strict(report, indent=2))  # strict JSON: no Infinity or NaN
    return report


JOB_FILE = "job.json"  # the job's settings (`JobConfig.to_dict`) in its out_dir


def _write_job_file(out: Path, config: JobConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / JOB_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(jsonio.dumps_strict(config.to_dict(), indent=2))
    os.replace(tmp, path)


def job_report(result: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON a CLI writes: the loss per step (from `first_step`: a resumed job's first), throughput, each
    reconfiguration (kind, notice, pause_s, bytes_moved, steps_lost, ...), each live plan, the resume point and the
    final parameter checksum."""
    keep = ("epoch", "kind", "notice", "source", "step", "strategy", "preempted", "lost", "pause_s", "hold_s",
            "detect_s", "bytes_moved", "steps_lost", "restore_step", "notice_to_exit_s", "abandoned")  # fmt: skip
    return {
        "loss": list(result["loss"]),
        "first_step": result.get("first_step", 0),
        "resumed_from": result.get("resumed_from"),
        "throughput": dict(result["throughput"]),
        "reconfigurations": [{k: r[k] for k in keep} for r in result["reconfigurations"]],
        "plans": [dict(p) for p in result.get("plans", [])],
        "final_checksum": result["final_checksum"],
        "wall_s": result["wall_s"],
    }
