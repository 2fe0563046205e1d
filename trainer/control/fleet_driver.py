"""The driver of a live fleet: a job that trains on what a provider's fleet gives (`trainer.providers.fleet.Fleet`:
the local market, AWS), planned every interval from the fleet's own history, instead of a replayed schedule.

Owns: `FleetDriver` (asking the fleet for instances and admitting them as they join, the interval's plan, parking
the job when the cloud takes every instance and waiting for capacity). Must not touch: what the fleet's requests and
history are (`trainer.control.fleet.FleetController`), how instances are granted (the provider), everything a
replay does as well (`trainer.control.driver.Driver`: notices, deaths, recoveries, observers).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from trainer.control.driver import KILLED, POLL_S, Driver, JobError
from trainer.control.fleet import FleetController
from trainer.control.schedules import trace_strategy
from trainer.providers.fleet import Fleet
from trainer.runtime.model import n_layers as layer_count
from trainer.runtime.worker import EXIT_DONE, EXIT_PREEMPTED, EXIT_RESTART


class FleetDriver(Driver):
    """A `Driver` whose instances come from a live fleet (`run_fleet`) rather than a schedule."""

    _fleet: FleetController | None = None  # the fleet's requests and history (set by `run_fleet`)
    _next_plan: float = math.inf  # when the next interval's plan is due (monotonic clock; set by `run_fleet`)
    _interval_s: float = math.inf

    def run_fleet(
        self, fleet: FleetController, interval_s: float, start_info: Mapping[str, Any], *, restore_step: int = 0
    ) -> None:
        """Train on what a live fleet's provider (`trainer.providers.fleet.Fleet`) gives: ask it for up to
        `fleet.max_instances`, start once `fleet.min_instances` have joined, then, every `interval_s` of wall
        time, plan the next interval from the fleet's own history at the next step boundary. Instances that
        arrive are admitted as they join (standby until a plan uses them); the cloud's notices and kills are
        handled as any provider's are. Training never waits for capacity: it trains on what is alive."""
        assert self.planner is not None, "a live fleet is planned every interval: it needs a planner"
        c = self.coord
        self._fleet = fleet
        self._joining: set[int] = set()  # arrived, their workers not registered yet
        self._waiting: set[int] = set()  # registered before the job started
        self._asked_ids: set[int] = set()
        self._gone_seen: set[int] = set()
        ready: list[int] = []
        self.observer.on_fleet({"event": "fleet-waiting", "need": fleet.min_instances})
        while len(ready) < fleet.min_instances:
            self.check()
            ready += self._poll_fleet(admit=False)
            if time.monotonic() > self.deadline:
                raise JobError(f"timed out waiting for {fleet.min_instances} instances of the fleet to join "
                               f"({len(ready)} did)")  # fmt: skip
            time.sleep(POLL_S)
        rule = trace_strategy(len(ready), layer_count(c.spec.model), c.spec.train.global_batch)
        c.start(rule, ready, restore_step=restore_step)
        now = time.monotonic()
        self.alive_from(restore_step)
        self._trained_from = (now, restore_step)
        self.history = [len(c.alive())]
        fleet.close(now, len(c.alive()))  # interval 0 ends when training starts
        self._next_step = restore_step
        self.resumed_at(restore_step)
        self.observer.on_start({**start_info, "workers": len(ready), "strategy": rule})  # what the fleet gave
        self._observing = True
        self._interval_s = interval_s
        self._next_plan = now + interval_s  # (read by the notices: `_next_plan_eta`, `_stays`)
        while not all(self.provider.exitcode(w) == EXIT_DONE for w in c.in_force.members):
            self.tick()
            self._poll_fleet(admit=True)
            now = time.monotonic()
            if now >= self._next_plan and self._plan_live():
                self._next_plan += interval_s
                if self._next_plan <= now:  # an interval missed (a long recovery) is not made up: a whole one
                    self._next_plan = now + interval_s
            if time.monotonic() > self.deadline:
                raise JobError("timed out waiting for the last step")
            time.sleep(POLL_S)
        end = time.monotonic()
        fleet.close(end, len(c.alive()))  # the last interval, cut short by the job's end
        fleet.hold(end, 0)  # (the provider hands every instance back now)

    def _poll_fleet(self, *, admit: bool) -> list[int]:
        """Take the fleet's news: instances that arrived (their workers are expected), workers that joined (admitted
        when `admit`, else returned for the job's start), the cloud's reclaims (counted); then ask for what the
        fleet lacks. Returns the ids that joined."""
        c, fleet = self.coord, self._fleet
        provider = self.provider
        assert isinstance(provider, Fleet) and fleet is not None
        for w in provider.arrivals():
            c.expect([w])
            self.allowed[w] = {EXIT_DONE}
            self._joining.add(w)
            if w not in self._asked_ids:  # a pending request's instance
                fleet.granted_later(1)
        codes = provider.exitcodes()
        self._joining -= {w for w in self._joining if codes.get(w) is not None}  # reclaimed while booting
        joined = sorted(self._joining & c.joined())
        if joined:
            c.wait_joined(joined, self.pg_timeout_s)  # (registered already: this starts their heartbeats' watch)
            provider.joined(joined)
            self._joining -= set(joined)
            if admit:
                c.admit(joined)
                c.note({"event": "joined", "workers": joined, "step": self.step_in_flight()})
            else:
                self._waiting |= set(joined)  # joined before the job starts: its first members
        if admit:
            self._waiting.clear()  # the job has started: those are its members now
        else:
            self._waiting -= {w for w in self._waiting if codes.get(w) is not None}
        gone = (set(c.notices) | c.dead | c.preempted | self._killed_outside) - self._gone_seen
        gone -= self._scripted_kills
        if gone:
            self._gone_seen |= gone
            fleet.reclaimed(len(gone))
        now = time.monotonic()
        # held (and billed): every instance alive or waiting, joining, or still booting
        members = c.alive() | self._waiting
        held = Counter((provider.instance_type_of(w), provider.zone_of(w)) for w in members | self._joining)
        held[None, None] += provider.booting()  # (of the provider's own type)
        fleet.hold(now, held)
        have = len(members - set(self._pending_notices())) + len(self._joining)
        n = fleet.ask(now, have, provider.outstanding())
        if n:
            answer = provider.request(n)
            fleet.answered(answer, now)
            self._asked_ids |= set(answer.granted)
            c.note({"event": "capacity", "asked": n, "granted": list(answer.granted), "refused": answer.refused,
                    "pending": answer.pending, "reason": answer.reason})  # fmt: skip
        return joined

    def park(self, s: int, members: Sequence[int]) -> None:
        """A live fleet whose every instance has a notice: at the held boundary `s` the members write the checkpoint
        of step `s` and exit (their instances are going); the job waits for the fleet to come back
        (`await_capacity`), then restarts from that checkpoint on the new instances — no step is lost."""
        c = self.coord
        was, self._recovering = self._recovering, True
        try:
            for w in members:
                self.allowed[w] = {EXIT_RESTART, EXIT_PREEMPTED, KILLED}
            c.note({"event": "fleet-parked", "step": s, "workers": list(members)})
            c.order_restart(members, step=s)
            self.wait(lambda: all(self.provider.exitcode(w) is not None for w in members),
                      f"workers {list(members)} to checkpoint step {s} and leave", self.pg_timeout_s + 30)  # fmt: skip
            self.check()
            c.clear_restart(members)
            restore = c.latest_checkpoint()  # s, unless the cloud killed one before its shard was written
            c.left(members, s)
            self.observe(force=True)  # every step the members committed, before the restart rewinds
            self.await_capacity(f"every instance has a notice; the job restarts from the checkpoint of step {restore}")
            c.publish_restart(restore, None, members, steps_lost=s - restore, source="sigterm")  # pause from s
            self.alive_from(restore)
            self._next_step = min(self._next_step, restore)
        finally:
            self._recovering = was

    def await_capacity(self, why: str) -> None:
        """A live fleet without an instance alive: keep asking the provider (with backoff) until
        `FleetConfig.min_instances` instances have joined; training resumes on them."""
        assert self._fleet is not None
        c = self.coord
        fleet = self._fleet
        self._note_fleet({"event": "fleet-empty", "reason": why, "step": self.step_in_flight()})
        t0 = time.monotonic()
        row_at = t0 + fleet.interval_s
        while len(c.alive()) < fleet.min_instances:
            self.check()
            self._poll_fleet(admit=True)
            now = time.monotonic()
            if now >= row_at:  # the fleet's history goes on, empty intervals too
                fleet.close(now, len(c.alive()))
                self.history.append(len(c.alive()))
                row_at += fleet.interval_s
            if now > self.deadline:
                raise JobError(f"timed out waiting for capacity: {why}")
            time.sleep(POLL_S)
        waited_s = round(time.monotonic() - t0, 3)
        self._note_fleet({"event": "fleet-back", "workers": sorted(c.alive()), "waited_s": waited_s})

    def _note_fleet(self, entry: dict[str, Any]) -> None:
        """A wait for capacity, on the job's timeline and to the observers (a log shows why nothing trains)."""
        self.coord.note(entry)
        self.observer.on_fleet(entry)

    def _plan_live(self) -> bool:
        """An interval of a live fleet is over: at the next step boundary training has not reached, fold the
        pending notices in, close the fleet's interval and plan the next from its history. With `control.prepare`
        the boundary held is one step further and the planner is asked at once (what it will be asked there), its
        epoch published as a preparation: its groups form during that step, and the boundary's decision reuses the
        answer if the request comes out the same (`plan_ahead`, for a live fleet). Returns False while the boundary
        must wait (a migration in flight, a recovery, a prepared decision's step): the caller asks again at its next
        poll."""
        c, fleet = self.coord, self._fleet
        assert fleet is not None
        if self._live_at is not None:
            return self._decide_live()
        if self._deciding or self._recovering or c.current is None or not c.committed():
            return False
        p = self.step_in_flight()
        if p + 1 >= self.steps:
            return True  # the job ends before any boundary
        ahead = self.prepare and not self._accepts_handed and p + 2 < self.steps  # (handed plans: as `plan_at`)
        s = c.claim(p + 2 if ahead else p + 1)
        if s >= self.steps:
            c.release(s)
            return True
        if ahead and s - 1 > self.step_in_flight():  # a step to prepare during
            silent = self.settle()
            if silent:
                self.release_after(s, silent)
                return False
            self._deciding = True
            try:
                preempt, _ = self._departures((), s)
                alive = len(c.alive() - set(preempt))
                if alive >= 1:
                    self._ask_ahead(s, alive, len(fleet.rows), preempt)
            finally:
                self._deciding = False
        self._live_at = s
        return self._decide_live()

    def _decide_live(self) -> bool:
        """The decision of a live fleet's interval at held boundary `_live_at`, once training is live at the step
        before it: close the fleet's interval with the instances alive then, and reconfigure to the plan. False while
        it must wait; a silent instance meanwhile releases the boundary (its recovery first; the interval is planned
        again afterwards)."""
        c = self.coord
        s = self._live_at
        assert s is not None and self._fleet is not None
        if self._deciding or self._recovering or not (self.live_at(s - 1) and (c.committed() or c.entered_at(s))):
            return False
        self._live_at = None
        silent = self.settle()
        if silent:
            self._planned_ahead = None
            self.release_after(s, silent)
            return False
        self._deciding = True
        try:
            preempt, noticed = self._departures((), s)
            alive = len(c.alive() - set(preempt))
            interval = len(self._fleet.rows)
            self._fleet.close(time.monotonic(), alive)
            if alive < 1:  # every instance is leaving: the notices decide alone (nothing to plan for)
                self._planned_ahead = None
                c.release(s)
                return True
            self.history.append(alive)
            decision = self._ask_planner(s, interval, alive)
            self.reconfigure(s, decision, preempt, (), noticed, source="planner")
        finally:
            self._deciding = False
        return True

    def _park(self, s: int, members: Sequence[int]) -> bool:
        self.park(s, members)
        return True

    # -- notices: a noticed instance trains on until the last plan before its deadline ---------------------------
    def _plan_lead_s(self) -> float:
        """From a plan's time to the boundary it decides: the two steps it holds ahead (`_plan_live`)."""
        return 2 * self._step_s(self.step_in_flight())

    def _next_plan_eta(self) -> float | None:
        if self._fleet is None or self._live_at is not None:
            return None
        return max(self._next_plan, time.monotonic()) + self._plan_lead_s()

    def _stays(self, w: int, at: int) -> bool:
        """A noticed member stays past the plan now deciding (at `_next_plan`) if the plan after it still decides the
        notice margin (`trainer.control.driver.notice_margin_s`) before its deadline: an AWS instance, warned two
        minutes ahead, trains on through about one more minute-long interval instead of leaving at the first boundary
        (its replacement, asked for at the notice, boots meanwhile), as the simulator counts it until its preemption."""
        return self._leaves_after(w) is not None

    def _leaves_after(self, w: int) -> int | None:
        """How many plans after the one now deciding noticed worker `w` trains through, then leaves at the next
        (0: it leaves at the following plan); None: it leaves at this one."""
        deadline = self._noticed.get(w)
        c = self.coord
        if self._fleet is None or deadline is None or c.current is None or w not in c.current.members:
            return None
        following = max(self._next_plan + self._interval_s, time.monotonic()) + self._plan_lead_s()
        spare = deadline - self._margin_s(self.step_in_flight()) - following
        return None if spare < 0 else int(spare // self._interval_s)

    def _noticed_ahead(self, interval: int) -> tuple[int, ...]:
        """The noticed members that stay past this plan (`_stays`), by the interval at whose start they leave."""
        ahead = getattr(self.planner, "notices_ahead", 0)
        out = [0] * ahead
        for w in self._pending_notices():
            j = self._leaves_after(w)
            if j is not None and j < ahead:
                out[j] += 1
        while out and not out[-1]:
            out.pop()
        return tuple(out)

    def _lost_all(self, why: str) -> None:
        self.await_capacity(why)
