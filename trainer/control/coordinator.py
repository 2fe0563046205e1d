"""The control plane of one elastic job: the store it hosts, membership, heartbeats, epochs, step boundaries,
checkpoints and the log of reconfigurations (`Coordinator`).

Owns: the decisions — who is a member, who is dead, which epoch is in force and whether its migration committed,
what each step boundary does, which checkpoint is complete — and the records of reconfigurations. Must not touch:
tensors, process groups, training (`trainer.runtime.worker`); processes (the driver, `trainer.control.run`, and its
provider start and stop them); which assignment and transfers an epoch has (`trainer.runtime.migration` plans it).

Where to look next: `docs/coordinator.md` (the store it hosts, how a migration commits or rolls back, security),
`trainer.runtime.keys` (every key in the store, what it holds, who writes it).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from liveput import MigrationKind
from trainer.config import JobConfig
from trainer.runtime import checkpoint, keys
from trainer.runtime.migration import (
    Epoch,
    PlanError,
    first_epoch,
    job_layer_sizes,
    next_epoch,
    plan_recovery,
    restart_epoch,
)
from trainer.runtime.model import layer_names, model_fingerprint
from trainer.runtime.spec import ABORT, APPLY, HOLD, TRAIN, JobSpec
from trainer.runtime.store import host_store, new_token
from trainer.runtime.validation import Patience

log = logging.getLogger(__name__)

# A silent worker whose process the provider sees running (schedulable: starved on a loaded machine, not hung) is
# declared dead only this many bounds past its last heartbeat: evidence, not a guess.
HB_RUNNING_FACTOR = 3.0
HANDED_GAP_S = 5.0  # a handed-plan number taken but not written this long is passed over (its client died)


def _as_int(text: str) -> int | None:
    """`text` as a non-negative int of at most 18 digits, or None (store values are untrusted input)."""
    text = text.strip()
    return int(text) if text.isdigit() and len(text) <= 18 else None


def _as_float(text: str) -> float | None:
    """`text` as a finite float, or None."""
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _handed_record(raw: bytes) -> dict[str, Any] | None:
    """A handed plan as `trainer.control.planning.hand_plan` writes it — {"strategy": [D, P], "source", "sent_at"} — or
    None if `raw` is not one."""
    try:
        plan = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(plan, dict):
        return None
    st, sent = plan.get("strategy"), plan.get("sent_at", 0.0)
    if not (isinstance(st, list) and len(st) == 2 and all(type(v) is int and 1 <= v <= 1 << 20 for v in st)):
        return None
    if not isinstance(sent, (int, float)) or not math.isfinite(sent) or not isinstance(plan.get("source", ""), str):
        return None
    return {"strategy": st, "source": plan.get("source", ""), "sent_at": float(sent)}


class Coordinator:
    """The job's control plane (`docs/coordinator.md`; the store's keys: `trainer.runtime.keys`).

    Lifecycle: construct (binds the store, publishes the spec) -> `claim` the boundaries of scripted events and
    interval boundaries -> `expect` + workers join (`wait_joined`) -> `start` (epoch 1, at step 0 or at a resumed
    job's checkpoint) -> `reconfigure` per event or plan, `check_heartbeats` all along, `declare_dead` + `recover`
    (or a checkpoint-restart: `order_restart`, `publish_restart`) after a death -> `finish` -> `records`. While it
    runs, observers are fed incrementally: `committed_losses`, `record_complete` + `record` per epoch,
    `new_checkpoints`, and plans handed in from outside are read with `handed_plans`.
    """

    def __init__(self, config: JobConfig, *, token: str | None = None, bind: tuple[str, int] | None = None) -> None:
        """Bind the store (on `bind` = (host, port), else the config's control plane address) and publish the
        job's spec. Every client authenticates, loopback included: without a `token` the job makes one."""
        ctl = config.control
        host, port = bind if bind is not None else (ctl.host, ctl.port)
        self.config = config
        self.spec = JobSpec(config.model, config.train, config.steps, config.job, config.layers_dir, ctl.pg_timeout_s,
                            config.checkpoint_dir, config.checkpoint.every, ctl.hb_interval_s,
                            float(ctl.notice_grace_s), config.to_dict(), model_fingerprint(config.model),
                            config.checkpoint.uri, config.checkpoint.keep)  # fmt: skip
        hb_timeout_s, store_timeout_s, model = ctl.hb_timeout_s, ctl.store_timeout_s, config.model
        self.host = host
        self.hb_timeout_s = hb_timeout_s
        # every client authenticates, loopback included: without a token given, the job makes one (`token`)
        self.token = token or new_token()
        self.store = host_store(host, port, self.token, store_timeout_s)
        self.port = self.store.port
        self.store.set(keys.JOB_SPEC, self.spec.to_json())
        self.end_step = config.steps  # the job's last boundary: sooner where it stopped early (`read_end`)
        self.sizes = job_layer_sizes(model, config.train)
        self.current: Epoch | None = None
        self.epochs: list[Epoch] = []
        self.preempted: set[int] = set()
        self.dead: set[int] = set()
        self.admitted: set[int] = set()  # instances the schedule has made available (started early ones are not)
        self.log: list[dict[str, Any]] = []
        self._held: set[int] = set()
        self._expected: dict[int, int] = {}  # instance id -> incarnations started
        self._hb: dict[int, tuple[int, float]] = {}  # monitored instance -> (last counter, when it last moved)
        self._hb_checked = 0.0
        self._killed_at: dict[int, float] = {}
        self._detected_at: dict[int, float] = {}
        self._restarts: list[tuple[int, int]] = []  # (restart epoch number, restore step)
        self.first_step = 0  # the step epoch 1 starts at (> 0: resumed from the checkpoint of that step)
        self._written: dict[tuple[int, int], set[int]] = {}  # (step, epoch) -> stages whose shard was written
        # of those, the ones not handed out complete yet (one that was is complete: no new stage makes it pending)
        self._ckpt_pending: set[tuple[int, int]] = set()
        self._committed: set[int] = set()  # epoch numbers whose first step was applied
        self._replaced: set[int] = set()  # broken epochs a recovery (or a checkpoint-restart) replaced
        self._by_number: dict[int, Epoch] = {}
        self._sources: dict[int, str] = {}  # epoch number -> what made it: schedule, planner, sigterm, failure
        self._noticed: dict[int, tuple[int, ...]] = {}  # epoch number -> its preempted workers that had a notice
        self.notices: dict[int, float] = {}  # worker -> deadline (wall clock) of the notice it reported
        self._rejected: set[tuple[str, str]] = set()  # malformed store values already logged
        self._handed_gap: dict[int, float] = {}  # handed-plan numbers taken but not written -> first seen missing
        # the committed steps' losses read from the store (whose keys are then deleted: one per step), and the
        # boundary keys deleted below the steps every member has started (`forget_passed`)
        self._losses = array("d")  # from `first_step` on, in step order (8 bytes a step)
        self._skipped: set[int] = set()  # the steps a float16 job skipped for an overflow (`skipped_steps`)
        # boundary -> held-out scores there ("loss", each metric), as read with its step (`validations`)
        self._validated: dict[int, dict[str, float]] = {}
        self._forgotten = 0
        self._preparations = 0  # preparations published (`prepare`)
        self._prepared: Epoch | None = None  # the epoch the latest preparation expects, until an epoch is published

    @property
    def in_force(self) -> Epoch:
        """The current epoch, for the calls that only come after `start` published epoch 1."""
        if self.current is None:
            raise RuntimeError("no epoch in force: the coordinator has not started (call `start` first)")
        return self.current

    # -- membership -------------------------------------------------------------------------------------
    def joined(self) -> set[int]:
        got = self.store.get_if(keys.JOINED)
        return set() if got is None else {int(w) for w in got.decode().split(",") if w}

    def alive(self) -> set[int]:
        """Joined and admitted (`start`, or the `added` of a reconfiguration), neither preempted nor dead. An
        instance started ahead of its `add` event (to hide its start-up time) is not alive before that event."""
        return (self.joined() & self.admitted) - self.preempted - self.dead

    def admit(self, ids: Iterable[int]) -> None:
        """The schedule makes `ids` available now (an `add` event); `reconfigure(added=...)` does it too."""
        self.admitted |= set(ids)

    def expect(self, ids: Iterable[int]) -> None:
        """A new process of each of `ids` is being started (a new instance, or a restart): `wait_joined` waits for
        it, and heartbeats are not checked before it registered."""
        for w in ids:
            self._expected[w] = self._expected.get(w, 0) + 1
            self._hb.pop(w, None)

    def _joins(self, w: int) -> int:
        return self.store.add(keys.joins(w), 0)

    def wait_joined(
        self, ids: Iterable[int], timeout_s: float, check: Any = None, gone: Callable[[], Iterable[int]] | None = None
    ) -> list[int]:
        """Block until the expected process of every id in `ids` registered, or is among `gone()` (ids whose process
        ended before it could); returns the ids that registered. `check()` is called while waiting."""
        want = set(ids)
        deadline = time.monotonic() + timeout_s
        lost: set[int] = set()
        while True:
            missing = sorted(w for w in want if self._joins(w) < self._expected.get(w, 1))
            if gone is not None and missing:
                lost = set(missing) & set(gone())
            if not set(missing) - lost:
                break
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers {missing} did not join within {timeout_s:.0f} s")
            time.sleep(0.01)
        now = time.monotonic()
        for w in want - lost:
            self._hb[w] = (self.store.add(keys.heartbeat(w), 0), now)
        return sorted(want - lost)

    # -- failure detection ---------------------------------------------------------------------------------
    def ended(self, w: int) -> bool:
        """The current process of `w` ended normally (done, preempted, or exited for a restart)."""
        return self._ended(w)

    def _ended(self, w: int) -> bool:
        """The current process of `w` ended normally (done, preempted, or exited for a restart)."""
        key = keys.final(w)
        got = self.store.get_if(key)  # (one round trip: this is polled)
        return got is not None and int(got) >= self._expected.get(w, 1)

    def check_heartbeats(self, every_s: float = 0.05) -> set[int]:
        """Monitored workers whose heartbeat has not moved for `hb_timeout_s` (and that did not end normally).

        Cheap to call often: the store is read at most every `every_s`. Workers that ended normally leave the
        monitored set; the caller decides what a silent one is (`declare_dead`).
        """
        now = time.monotonic()
        if now - self._hb_checked < every_s:
            return set()
        self._hb_checked = now
        stale = set()
        for w, (last, seen) in list(self._hb.items()):
            if w in self.dead:  # (a preempted worker stays monitored until it ends: it may die during its hand-off)
                self._hb.pop(w)
                continue
            v = self.store.add(keys.heartbeat(w), 0)
            if v != last:
                self._hb[w] = (v, now)
            elif now - seen > self.hb_timeout_s:
                if self._ended(w):
                    self._hb.pop(w)
                else:
                    stale.add(w)
        return stale

    def silent_for(self, w: int) -> float:
        """Seconds since worker `w`'s heartbeat last moved (0 when it is not monitored)."""
        return time.monotonic() - self._hb[w][1] if w in self._hb else 0.0

    def unsettled(self, within_s: float | None = None) -> set[int]:
        """Alive, monitored workers whose heartbeat has not moved within `within_s` (default 3 intervals): possibly
        dead but not yet declared so. Plans wait for this to be empty, so that a worker killed together with
        another (its death detected a moment later) is not given a role or a transfer."""
        self.check_heartbeats(every_s=0)
        limit = 3 * self.spec.hb_interval_s if within_s is None else within_s
        now = time.monotonic()
        return {w for w in self.alive() if w in self._hb and now - self._hb[w][1] > limit}

    def stop_monitoring(self, ids: Iterable[int]) -> None:
        for w in ids:
            self._hb.pop(w, None)

    def note_killed(self, ids: Iterable[int], at: float) -> None:
        """The driver killed `ids` at wall time `at` (used only to report detection latency)."""
        for w in ids:
            self._killed_at[w] = at

    def declare_dead(self, ids: Iterable[int], reason: str = "heartbeat lost") -> bool:
        """Mark `ids` dead; if any was a member of the current epoch, flag the epoch broken (its members abandon the
        step in flight). Returns whether the epoch broke."""
        ids = set(ids) - self.dead
        if not ids:
            return False
        now = time.time()
        for w in ids:
            self._detected_at[w] = now
        self.dead |= ids
        self.stop_monitoring(ids)
        broken = self.current is not None and bool(ids & self.holders())
        if broken:
            # the epoch still training (an uncommitted migration's base) breaks only if one of its members died
            cur = self.in_force
            training = not self.committed(cur) and bool(ids & set(self.epoch(cur.base_number).members))
            self.break_epoch(f"{reason}: workers {sorted(ids)}", base=training)
        self.log.append({"event": "dead", "workers": sorted(ids), "reason": reason, "epoch_broken": broken})
        return broken

    def revive(self, ids: Iterable[int]) -> None:
        """Undo `declare_dead` for `ids`: their instances live (only their workers fell silent and were fenced), and
        a checkpoint-restart starts fresh workers on them. Used when no instance is left alive otherwise."""
        ids = set(ids) & self.dead
        self.dead -= ids
        for w in ids:
            self._hb.pop(w, None)
        self.log.append({"event": "revive", "workers": sorted(ids)})

    def _broken_epochs(self) -> list[int]:
        """The epochs a failure now breaks: the current one, and its base while its migration is uncommitted (its
        members may still be training there, or waiting at the boundary) — unless the base broke already and the
        current epoch is its replacement (the base's flag and reports are those of that earlier failure)."""
        cur = self.in_force
        if self.committed(cur) or cur.base_number in self._replaced:
            return [cur.number]
        return [cur.number, cur.base_number]

    def holders(self) -> set[int]:
        """The workers whose death breaks the job's current configuration: the current epoch's members and, while
        its migration is uncommitted, every member of its base (old holders, senders, departing workers)."""
        cur = self.current
        if cur is None:
            return set()
        if self.committed(cur):
            return set(cur.members)
        return set(cur.members) | set(self.epoch(cur.base_number).members)

    def break_epoch(self, reason: str, base: bool = False) -> None:
        """Flag the current epoch broken: its members abandon the step, the transfer or the group formation in flight
        within ~20 ms and report. With `base`, also the base of its uncommitted migration (members still training
        there abandon their step; otherwise they finish it and find the migration broken at the boundary)."""
        for n in self._broken_epochs()[: None if base else 1]:
            self.store.compare_set(keys.epoch_abort(n), "", reason)

    def epoch_broken(self) -> str | None:
        """Why the current epoch (or the base of its uncommitted migration) is broken — a member died, or a worker
        saw a collective or a transfer fail — or None."""
        if self.current is None:
            return None
        for n in self._broken_epochs():
            got = self.store.get_if(keys.epoch_abort(n))
            if got is not None:
                return got.decode()
        return None

    def abandoned(self) -> dict[int, int]:
        """Survivors of the broken configuration that reported (`reporters`), -> the step they abandoned (= steps
        applied). A survivor reports in the epoch it trained in or the one it was migrating into."""
        out = {}
        epochs = self._broken_epochs()
        for w in self.reporters():
            for n in epochs:
                got = self.store.get_if(keys.abandon(n, w))
                if got is not None:
                    out[w] = int(got)
                    break
        return out

    def reporters(self) -> set[int]:
        """The live workers whose reports a recovery needs (after `seal`): the holders of the state it continues
        from — the current epoch's members, or those of its base when its migration rolls back (a worker that was
        joining holds nothing then)."""
        cur = self.in_force
        base = cur if self.committed(cur) else self.epoch(cur.base_number)
        return set(base.members) - self.dead

    # -- commits of migrations -----------------------------------------------------------------------------
    def epoch(self, number: int) -> Epoch:
        """Epoch `number` (published)."""
        return self._by_number[number]

    def committed(self, epoch: Epoch | None = None) -> bool:
        """Whether `epoch` (default: the current one) is committed: its first step was applied. The first epoch and
        checkpoint-restart epochs (every member loads its state afresh) always are."""
        e = self.in_force if epoch is None else epoch
        if e.kind in (MigrationKind.START, MigrationKind.CHECKPOINT_RESTART) or e.number in self._committed:
            return True
        key = keys.decide(e.number, e.start_step)
        got = self.store.get_if(key)
        if got is not None and got.decode() == APPLY:
            self._committed.add(e.number)
            return True
        return False

    def entered_at(self, step: int) -> bool:
        """The current epoch begins at `step`, every member has formed its groups and holds its layers, it is unbroken,
        and no holder of its base waits outside it for its commit: what remains of its migration is only its first
        step, which a decision at `step`'s boundary replaces."""
        cur = self.in_force
        if cur.start_step != step or self.ready() != set(cur.members) or self.epoch_broken() is not None:
            return False
        base = self._by_number.get(cur.base_number)
        return base is None or set(base.members) - self.dead <= set(cur.members)

    def seal(self) -> bool:
        """After a failure: decide once whether the current epoch's migration committed. Its first step's decision
        is written "abort" unless it already says "apply" — then nothing of it can be applied any more, and every
        holder of its base rolls back. Returns whether it committed."""
        e = self.in_force
        if self.committed(e):
            return True
        got = self.store.compare_set(keys.decide(e.number, e.start_step), "", ABORT).decode()
        if got == APPLY:
            self._committed.add(e.number)
            return True
        return False

    # -- preemption notices --------------------------------------------------------------------------------
    def new_notices(self) -> dict[int, float]:
        """Notices workers reported (SIGTERM) since the last call: worker -> deadline (wall clock). Two store calls
        when there is none; poll it with the heartbeats. A malformed entry (not a known worker's id, a deadline
        that is not a finite number) is logged once and ignored: store values are untrusted input."""
        got = self.store.get_if(keys.NOTICES)
        if got is None:
            return {}
        out = {}
        for item in got.decode(errors="replace").split(","):
            if not item:  # (each entry ends with a comma)
                continue
            w = _as_int(item)
            if w is None or w not in self._expected:
                self._malformed(keys.NOTICES, item)
                continue
            if w in self.notices:
                continue
            key = keys.notice(w)
            got = self.store.get_if(key)
            deadline = None if got is None else _as_float(got.decode(errors="replace"))
            if deadline is None:
                self._malformed(key, "missing or not a finite number")
                continue
            self.notices[w] = out[w] = deadline
        return out

    def _malformed(self, key: str, value: str) -> None:
        """Log a malformed store value once (the driver goes on without it)."""
        if (key, value) in self._rejected:
            return
        self._rejected.add((key, value))
        self.log.append({"event": "malformed", "key": key, "value": value[:80]})
        log.warning("ignored a malformed value of store key %r: %r", key, value[:80])

    def notice_at(self, w: int) -> float | None:
        """When worker `w` received its notice (wall clock), if it reported one."""
        d = self.notices.get(w)
        return None if d is None else d - self.spec.notice_grace_s

    def preempt_standby(self, ids: Iterable[int], source: str = "sigterm") -> None:
        """Preempt standby instances (no role in the current epoch, nothing to hand off): they exit at once."""
        ids = sorted(set(ids))
        for w in ids:
            self.store.set(keys.preempt(w), str(self.in_force.number))
        self.preempted |= set(ids)
        self.log.append({"event": "preempt-standby", "workers": ids, "source": source})

    def left(self, ids: Iterable[int], step: int) -> None:
        """`ids` left at boundary `step` under a notice with nobody to hand off to: their state is in the checkpoint
        of that step (a live fleet the cloud took whole, `FleetDriver.park`). Neither alive nor monitored from now
        on."""
        ids = sorted(set(ids))
        self.preempted |= set(ids)
        self.stop_monitoring(ids)
        self.log.append({"event": "left-checkpointed", "workers": ids, "step": step})

    def ready(self) -> set[int]:
        """Members of the current epoch that have formed its groups and hold their layers."""
        n = self.in_force.number
        return {w for w in self.in_force.members if self.store.check([keys.ready(n, w)])}

    def progress(self, w: int) -> int:
        """The step worker `w` started last (-1 before its first)."""
        key = keys.step_at(w)
        got = self.store.get_if(key)  # (one round trip: the driver polls every member's)
        return -1 if got is None else int(got)

    # -- step boundaries ---------------------------------------------------------------------------------
    def claim(self, step: int) -> int:
        """Hold the first boundary >= `step` that no worker has passed; workers reaching it wait for its decision.

        Called before workers start, a claim of a scripted step always succeeds at that step; called while they
        train (a live notice), it may land later than asked. The search starts no lower than the boundaries whose
        keys were deleted as passed (`forget_passed`): an absent key there is no boundary still to come.
        """
        s = max(step, self._forgotten)
        while True:
            v = self.store.compare_set(keys.boundary(s), "", HOLD).decode()
            if v == HOLD:
                self._held.add(s)
                return s
            s += 1

    def _resolve(self, step: int, value: str) -> None:
        got = self.store.compare_set(keys.boundary(step), HOLD, value).decode()
        if got != value:
            raise RuntimeError(f"boundary {step} was not held (it is {got!r})")
        self.store.set(keys.boundary_decided(step), repr(time.time()))
        self._held.discard(step)

    def release(self, step: int) -> None:
        """Let training pass a held boundary with nothing to change."""
        if step in self._held:
            self._resolve(step, TRAIN)

    # -- epochs ------------------------------------------------------------------------------------------
    def prepare(
        self, step: int, strategy: tuple[int, int] | None = None, preempt: Iterable[int] = (), added: Iterable[int] = ()
    ) -> Epoch | None:
        """Publish, ahead of the boundary before `step`, the epoch `reconfigure` would decide there with the same
        arguments (added instances must have joined), so that its members and transfer parties form its process groups
        while the current epoch trains. Returns that epoch (its `prepared` set), or None when nothing would change.
        The boundary's decision uses it only if it comes out the same (`reconfigure`); anything published first (a
        recovery, a restart, another reconfiguration) overtakes it, and its groups are left unused."""
        if self.current is None:
            raise RuntimeError("prepare before start")
        alive = (self.joined() & (self.admitted | set(added))) - self.preempted - self.dead  # as `reconfigure` sees it
        try:
            epoch = next_epoch(self.current, step, alive, self.sizes, strategy, tuple(sorted(preempt)),
                               self.spec.train.global_batch)  # fmt: skip
        except PlanError:
            return None  # not possible as things stand (an added instance did not join): the boundary decides
        if epoch is None or epoch.kind is MigrationKind.CHECKPOINT_RESTART:
            return None
        self._preparations += 1
        p = self._preparations
        epoch = replace(epoch, prepared=p)
        self.store.set(keys.prepare(p), epoch.to_json())
        self.store.set(keys.PREPARE_LATEST, str(p))
        self._prepared = epoch
        self.log.append({"step": epoch.start_step, "event": "prepare", "preparation": p, "kind": epoch.kind.value,
                         "strategy": [epoch.D, epoch.P]})  # fmt: skip
        return epoch

    def _publish(self, epoch: Epoch, source: str = "schedule") -> None:
        if epoch.kind is MigrationKind.CHECKPOINT_RESTART and epoch.restore_step:
            # which shard holds which layer: a worker loads only its layers' shards, fetching what its disk lacks
            cut = self.checkpoint_cut(epoch.restore_step)
            self.store.set(keys.ckpt_restore(epoch.number), json.dumps(cut, sort_keys=True))
        self._prepared = None  # a preparation serves the next epoch published, or none
        blob = epoch.to_json()
        self._by_number[epoch.number] = epoch
        self._sources[epoch.number] = source
        self.store.set(keys.epoch_decided(epoch.number), repr(time.time()))
        self.store.set(keys.epoch(epoch.number), blob)
        self.store.set(keys.EPOCH_CURRENT, blob)
        self.current = epoch
        self.epochs.append(epoch)

    def start(
        self,
        strategy: tuple[int, int],
        workers: Sequence[int],
        *,
        restore_step: int = 0,
        assignment: Mapping[int, tuple[int, int]] | None = None,
    ) -> Epoch:
        """Publish epoch 1 over `workers` (they must have joined): at step 0, or — a resumed job — at
        `restore_step`, every member loading the checkpoint of that step (complete in the checkpoint directory)."""
        epoch = first_epoch(strategy[0], strategy[1], workers, self.sizes.cut,
                            self.spec.train.global_batch, restore_step=restore_step,
                            assignment=assignment)  # fmt: skip
        self.first_step = restore_step
        self._forgotten = max(self._forgotten, restore_step)  # (a resumed job's store never held the earlier ones)
        self.admitted |= set(workers)
        self._publish(epoch)
        entry = {"step": restore_step, "event": "start", "strategy": list(strategy), "workers": sorted(workers)}
        if restore_step:
            entry["resumed_from"] = restore_step
        self.log.append(entry)
        return epoch

    def reconfigure(
        self,
        step: int,
        strategy: tuple[int, int] | None = None,
        preempt: Iterable[int] = (),
        added: Iterable[int] = (),
        *,
        noticed: Iterable[int] = (),
        source: str = "schedule",
    ) -> Epoch | None:
        """Decide the boundary before `step` (held beforehand or claimed now): publish the next epoch, or let
        training pass if nothing has to change. Preempted workers are told when their last epoch is.

        `noticed`: those of `preempt` whose preemption comes from a notice they reported (SIGTERM); the epoch's
        `source` is then "sigterm" (else `source`: "schedule", "planner"). Preempted workers stay monitored until
        they exit: a death during their hand-off breaks the migration (see `seal`)."""
        if self.current is None:
            raise RuntimeError("reconfigure before start")
        s = step if step in self._held else self.claim(step)
        preempt = tuple(sorted(preempt))
        noticed = tuple(sorted(set(noticed) & set(preempt)))
        if noticed:
            source = "sigterm"
        self.admitted |= set(added)
        epoch = next_epoch(self.current, s, self.alive(), self.sizes, strategy, preempt, self.spec.train.global_batch)
        ahead = self._prepared
        if epoch is not None and ahead is not None and replace(epoch, prepared=ahead.prepared) == ahead:
            epoch = ahead  # what was prepared: its groups are formed (or forming) already
        entry = {"step": s, "event": "reconfigure", "strategy": list(strategy) if strategy else None,
                 "preempt": list(preempt), "added": sorted(added), "source": source}  # fmt: skip
        if noticed:
            entry["noticed"] = list(noticed)
        if epoch is not None and epoch.prepared is not None:
            entry["prepared"] = epoch.prepared
        if epoch is not None:
            self._publish(epoch, source)
            self._noticed[epoch.number] = noticed
        last_epoch = self.current.number
        for w in preempt:
            self.store.set(keys.preempt(w), str(last_epoch))
        self.preempted |= set(preempt)
        self._resolve(s, TRAIN if epoch is None else f"epoch:{epoch.number}" if epoch.prepared is None
                      else f"epoch:{epoch.number}:{epoch.prepared}")  # fmt: skip
        entry["kind"] = epoch.kind.value if epoch is not None else MigrationKind.NONE.value
        self.log.append(entry)
        return epoch

    def recover(self, step: int, strategy: tuple[int, int] | None = None) -> Epoch | None:
        """After the current configuration broke (and `seal`): publish the live migration that continues from the
        survivors at `step` (the step they abandoned), or return None when only a checkpoint-restart can continue
        (a layer lost its last holder, or too few instances survive).

        A committed current epoch is recovered from its own members. An uncommitted one is abandoned: the
        replacement is planned from its base's holders — those it preempted still send what only they hold, its
        strategy is kept if the survivors allow it — so a death during a hand-off loses nothing that survives."""
        cur = self.in_force
        gb = self.spec.train.global_batch
        broken = self._broken_epochs()
        if self.committed(cur):
            epoch = plan_recovery(cur, step, self.alive(), self.dead & set(cur.members), self.sizes, gb, strategy)
            noticed: tuple[int, ...] = ()
        else:
            base = self.epoch(cur.base_number)
            departing = sorted(set(cur.preempted) - self.dead)
            lost = self.dead & self.holders()
            epoch = plan_recovery(base, step, self.alive(), lost, self.sizes, gb, strategy or (cur.D, cur.P),
                                  departing=departing, number=cur.number + 1)  # fmt: skip
            noticed = tuple(w for w in self._noticed.get(cur.number, ()) if w in departing)
        if epoch is not None:
            self._publish(epoch, "failure")
            self._noticed[epoch.number] = noticed
            for n in broken:
                self.store.set(keys.epoch_next(n), str(epoch.number))
            self._replaced |= set(broken)
            self.log.append({"step": step, "event": "recover", "kind": epoch.kind.value, "lost": list(epoch.lost),
                             "rolled_back": cur.number if len(broken) > 1 else None})  # fmt: skip
        return epoch

    # -- checkpoint-restart ----------------------------------------------------------------------------------
    def restart_members(self) -> list[int]:
        """The processes a checkpoint-restart stops and starts afresh: the live holders of state (the current epoch's
        members; while its migration is uncommitted, its base's too), except those preempted (`leaving_members`)."""
        return sorted(self.holders() - self.dead - self.preempted)

    def leaving_members(self) -> list[int]:
        """Holders of state under a preemption that a checkpoint-restart after a failure stops for good (their
        migration was rolled back; their state is discarded with everyone else's)."""
        return sorted((self.holders() & self.preempted) - self.dead)

    def order_restart(self, ids: Iterable[int], step: int | None = None) -> None:
        """Tell `ids` to exit for a checkpoint-restart; with `step`, resolve that held boundary so the members
        arriving there first write the checkpoint of `step`."""
        for w in ids:
            self.store.set(keys.restart(w), "1")
        if step is not None:
            s = step if step in self._held else self.claim(step)
            self._resolve(s, f"restart:{self.in_force.number + 1}")

    def clear_restart(self, ids: Iterable[int]) -> None:
        for w in ids:
            self.store.delete_key(keys.restart(w))

    def written_checkpoints(self) -> dict[tuple[int, int], set[int]]:
        """(step, epoch) -> the stages whose shard was written. The workers' reports are taken from the store as
        they come (`SealedStore.take`) and kept here: read whole at every poll, the list grew with the job (22 ms a
        read at 10,000 shards)."""
        got = self.store.take(keys.CKPT_WRITTEN)
        if got is not None:
            for item in got.decode(errors="replace").split(";"):
                parts = [_as_int(v) for v in item.split(":")] if item else []
                ints = [v for v in parts if v is not None]
                if len(parts) != 3 or len(ints) != 3:
                    if item:
                        self._malformed(keys.CKPT_WRITTEN, item)
                    continue
                s, n, k = ints
                stages = self._written.setdefault((s, n), set())
                if k not in stages:
                    stages.add(k)
                    self._ckpt_pending.add((s, n))
        return self._written

    def _complete_checkpoints(self) -> dict[int, int]:
        """step -> the epoch whose every stage wrote its shard of that step's checkpoint (the latest such epoch),
        leaving out the checkpoints a later checkpoint-restart from an earlier step discarded."""
        by_number = {e.number: e for e in self.epochs}
        out: dict[int, int] = {}
        for (s, n), stages in self.written_checkpoints().items():
            e = by_number.get(n)
            if e is None or stages != set(range(e.P)):
                continue
            if any(m > n and s > c for m, c in self._restarts):
                continue  # discarded by a later restart from an earlier checkpoint
            out[s] = max(out.get(s, n), n)
        return out

    def latest_checkpoint(self) -> int:
        """The step of the latest complete checkpoint (every stage of one epoch wrote its shard, and no later
        checkpoint-restart discarded it); 0 when there is none — step 0's state is the deterministic initial one."""
        return max([self.first_step, *self._complete_checkpoints()])  # a resumed job's first epoch loaded one

    def checkpoint_cut(self, step: int) -> dict[str, list[str]]:
        """The shard files of the complete checkpoint of `step` and the layers each holds: from the epoch that wrote
        it, or — the checkpoint a resumed job started from — from its hash records in the checkpoint folder."""
        n = self._complete_checkpoints().get(step)
        if n is not None:
            return self.shards_of(step, n)
        if step == self.first_step:
            return {f: list(v) for f, v in checkpoint.shard_layers(self.spec.checkpoint_dir, step).items()}
        raise checkpoint.CheckpointError(f"no complete checkpoint of step {step} to restore from")

    def shards_of(self, step: int, epoch: int) -> dict[str, list[str]]:
        """The shard files `epoch`'s stages write for the checkpoint of `step`, and the layers of each."""
        e, names = self._by_number[epoch], layer_names(self.spec.model)
        return {checkpoint.shard_path("", step, k).name: [names[i] for i in e.layers(k)] for k in range(e.P)}

    def checkpoint_files(self, step: int, epoch: int) -> dict[str, int] | None:
        """The files (and sizes) the stages of `epoch` uploaded for the checkpoint of `step` (with a checkpoint
        URI), or None while one is missing or unreadable."""
        e = self._by_number.get(epoch)
        if e is None:
            return None
        files: dict[str, int] = {}
        for k in range(e.P):
            key = keys.ckpt_files(step, epoch, k)
            raw = self.store.get_if(key)
            if raw is None:
                return None
            try:
                got = json.loads(raw)
                if not isinstance(got, dict) or not all(isinstance(v, int) for v in got.values()):
                    raise ValueError("not {name: size}")
            except ValueError:
                self._malformed(key, raw.decode(errors="replace"))
                return None
            files.update({str(name): int(size) for name, size in got.items()})
        return files

    def checkpoint_failures(self) -> list[str]:
        """The uploads to the checkpoint URI that workers reported failed, as "worker w: why"."""
        out = []
        for w in sorted(self.joined()):
            raw = self.store.get_if(keys.ckpt_failed(w))
            if raw is not None:
                try:
                    got = json.loads(raw)
                except ValueError:
                    got = [raw.decode(errors="replace")]
                out += [f"worker {w}: {m}" for m in (got if isinstance(got, list) else [got])]
        return out

    def publish_restart(
        self,
        restore_step: int,
        strategy: tuple[int, int] | None,
        previous: Iterable[int],
        steps_lost: int = 0,
        source: str | None = None,
    ) -> Epoch:
        """Publish the checkpoint-restart epoch: the restarted processes (already joined) and any standby ones load
        checkpoint `restore_step` into `strategy`. Checkpoint files of later steps are deleted first. `source`: what
        made it (default: "failure" after a loss, else "schedule")."""
        cur = self.in_force
        lost = (self.dead & self.holders()) - set(cur.lost)  # (those the current epoch was planned without: counted)
        broken = self._broken_epochs()
        epoch = restart_epoch(cur, restore_step, self.alive(), self.sizes.cut, strategy,
                              self.spec.train.global_batch, previous, lost, steps_lost)  # fmt: skip
        for w in epoch.previous:  # survivors of a failure exit without arriving: their lost work starts the pause
            for n in broken:
                failed_at = self.store.get_if(keys.failed(n, w))
                if failed_at is not None:
                    self.store.compare_set(keys.arrive(epoch.number, w), "", failed_at.decode())
                    break
        if self.spec.checkpoint_dir:
            checkpoint.remove_after(self.spec.checkpoint_dir, restore_step)
        # recomputed: a key present from now on holds the new value. Only the steps trained and not read yet have
        # keys (`committed_losses` deletes what it reads): from the first not kept here to the furthest one started
        # (a worker writes a step's loss after it started it) — not every step to the job's end, a request each
        furthest = max((self.progress(w) for w in self.joined()), default=-1)
        for s in range(max(restore_step, self.first_step + len(self._losses)), furthest + 1):
            self.store.delete_key(keys.loss(s))
        del self._losses[max(0, restore_step - self.first_step) :]
        self._skipped = {s for s in self._skipped if s < restore_step}
        self._validated = {s: v for s, v in self._validated.items() if s < restore_step}
        self._restarts.append((epoch.number, restore_step))
        if self.epoch_broken():
            self._replaced |= set(broken)
        self._publish(epoch, source or ("failure" if lost or steps_lost else "schedule"))
        self.log.append({"step": restore_step, "event": "checkpoint-restart", "strategy": [epoch.D, epoch.P],
                         "lost": list(lost), "steps_lost": steps_lost})  # fmt: skip
        return epoch

    # -- results -----------------------------------------------------------------------------------------
    def applied(self, step: int) -> bool:
        """Whether `step`'s update is applied: its loss was written (read here already — `committed_losses` deletes
        the keys it reads —, or still in the store)."""
        return 0 <= step - self.first_step < len(self._losses) or self.store.check([keys.loss(step)])

    def losses(self, steps: int | None = None) -> list[float]:
        """The loss of every step from `first_step` (0, or the step a resumed job started at) to `steps`."""
        n = self.end_step if steps is None else steps
        kept = len(self._losses)
        return [self._losses[s - self.first_step] if s - self.first_step < kept
                else self._seen(s, keys.StepLoss.parse(self.store.get(keys.loss(s)))).loss
                for s in range(self.first_step, n)]  # fmt: skip

    def _seen(self, step: int, got: keys.StepLoss) -> keys.StepLoss:
        (self._skipped.add if got.skipped else self._skipped.discard)(step)
        if got.val is not None:
            self._validated[step] = dict(got.val)
        return got

    def final_records(self) -> dict[int, dict[str, Any]]:
        """What each member of the epoch in force reported with its final layers (stage, replica, digest, the step it
        ended at, the held-out scores there), by worker; those yet to report are missing."""
        raw = {w: self.store.get_if(keys.replica_final(w)) for w in self.in_force.members}
        return {w: json.loads(r) for w, r in raw.items() if r is not None}

    def final_validation(self, records: Mapping[int, Mapping[str, Any]] | None = None) -> dict[str, float] | None:
        """The held-out scores of the final layers ("loss", each metric; a job whose spec validates), as the last
        stage's replicas reported them with their final digests (`records`: read now if not given); None before
        they did, or without validation."""
        for rec in (self.final_records() if records is None else records).values():
            if (val := rec.get("val")) is not None:
                return {str(k): float(v) for k, v in val.items()}
        return None

    def validations(self, records: Mapping[int, Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
        """(boundary, held-out scores there) in step order, as far as the steps' losses were read (`committed_losses`,
        `losses`), and the final layers' at the job's last boundary, from the members' final `records`."""
        out = sorted(self._validated.items())
        final = self.final_validation(records)
        return out + ([(self.end_step, final)] if final is not None else [])

    def read_end(self, records: Mapping[int, Mapping[str, Any]]) -> int:
        """The job's last boundary, from the final `records` of every member of the epoch in force
        (`final_records`): the step they ended at (sooner than the job's steps where the held-out scores stopped it
        early, `Validation.patience`)."""
        ends = {rec.get("step", self.spec.steps) for rec in records.values()}
        if len(ends) > 1:
            raise RuntimeError(f"the members ended at different steps {sorted(ends)}")
        if ends:
            self.end_step = int(ends.pop())
        return self.end_step

    def patience(self) -> Patience | None:
        """The early-stopping count the workers kept (`Validation.patience`); None: the job does not stop early."""
        raw = self.store.get_if(keys.PATIENCE)
        return None if raw is None else Patience.from_json(raw)

    def seed_patience(self, count: Patience) -> None:
        """A resumed job's early-stopping count (`Patience.since`), before its workers start."""
        self.store.set(keys.PATIENCE, count.to_json())

    def skipped_steps(self) -> list[int]:
        """The steps whose update was skipped for an overflow (a float16 job's), as far as their losses were read
        (`committed_losses`, `losses`)."""
        return sorted(self._skipped)

    def committed_losses(self, from_step: int) -> list[tuple[int, keys.StepLoss]]:
        """(step, its loss) of the committed steps from `from_step` on, up to the first one not committed yet: what an
        observer has not seen. Reads only those keys (two store calls per new step, one more to stop), and keeps
        what it read here instead (`losses`): the keys are deleted, so the store does not grow with the steps."""
        out = []
        s = from_step
        while s < self.end_step and (got := self.store.get_if(keys.loss(s))) is not None:
            out.append((s, self._seen(s, keys.StepLoss.parse(got))))
            i = s - self.first_step
            if i <= len(self._losses):  # (the next one in order, or one read again: kept here, its key deleted)
                self._losses[i : i + 1] = array("d", [out[-1][1].loss])
                self.store.delete_key(keys.loss(s))
            s += 1
        return out

    def forget_passed(self, most: int = 256) -> int:
        """Delete the keys of step boundaries that every member of the epoch in force has passed (one per step,
        which a job of millions of steps would otherwise keep in the store's memory), at most `most` a call;
        returns how many. A boundary before step s is passed once every member started s + 1 (`progress`); a
        claim (`claim`) searches from the first boundary not deleted."""
        members = self.in_force.members
        low = min(self.progress(w) for w in members) - 1
        start = self._forgotten
        stop = min(low, start + most)
        for s in range(start, stop):
            if s not in self._held:
                self.store.delete_key(keys.boundary(s))
                self.store.delete_key(keys.boundary_decided(s))
        self._forgotten = max(start, stop)
        return max(0, stop - start)

    def new_checkpoints(self) -> list[tuple[int, int]]:
        """(step, epoch) of the checkpoints that became complete (every stage of one epoch wrote its shard) since
        the last call, in step order; each is handed out once — a checkpoint rewritten after a restart is a new
        one."""
        written = self.written_checkpoints()
        by_number = {e.number: e for e in self.epochs}
        new = []
        for s, n in list(self._ckpt_pending):  # (those not handed out yet)
            e = by_number.get(n)
            if e is None or written[(s, n)] != set(range(e.P)):
                continue
            self._ckpt_pending.discard((s, n))
            new.append((s, n))
        return sorted(new)

    def _reports(self, key: Callable[[int, int], str], epoch: int, workers: Iterable[int]) -> dict[int, bytes]:
        """What `workers` reported under `key(epoch, w)`, by worker (those that reported): one round trip each."""
        got = {w: self.store.get_if(key(epoch, w)) for w in workers}
        return {w: v for w, v in got.items() if v is not None}

    def _times(self, key: Callable[[int, int], str], epoch: int, workers: Iterable[int]) -> list[float]:
        return list(self._times_by(key, epoch, workers).values())

    def _times_by(self, key: Callable[[int, int], str], epoch: int, workers: Iterable[int]) -> dict[int, float]:
        """The times that `workers` reported under `key(epoch, w)`, by worker (those that reported)."""
        return {w: float(v) for w, v in self._reports(key, epoch, workers).items()}

    def records(self) -> list[dict[str, Any]]:
        """One record per reconfiguration (epochs after the first), measured once the job has run past them (see
        `record`)."""
        return [self.record(e) for e in self.epochs[1:]]

    def record_complete(self, epoch: Epoch) -> bool:
        """Whether `epoch`'s record is final: every member is ready, every old member that is not dead arrived at its
        boundary and every transfer source counted its bytes — or the epoch broke before that and a later one
        replaced it (what is missing never comes)."""
        n = epoch.number
        wanted = [keys.ready(n, w) for w in epoch.members]
        wanted += [keys.arrive(n, w) for w in epoch.previous if w not in self.dead]
        wanted += [keys.sent(n, w) for w in {t.src for t in epoch.transfers} if w not in self.dead]
        wanted += [keys.exited(w) for w in self._noticed.get(n, ()) if w not in self.dead]
        if self.store.check(wanted):
            return True
        replaced = self.epochs[-1].number > n
        return replaced and self.store.check([keys.epoch_abort(n)])

    def record(self, e: Epoch) -> dict[str, Any]:
        """The record of reconfiguration epoch `e` (final once `record_complete(e)`).

        trigger: what made it (`Epoch.trigger`: "kill", "notice", "addition" or "planned"); joined: its members that
        were not in the epoch it replaces. pause_s: from the first old member finishing its last committed step to the
        last new member being ready for the new epoch's first step (group teardown, transfers, group formation,
        installs, any hold; after a kill also the wasted part of the abandoned step and the detection; for a
        checkpoint-restart the checkpoint save, process exits and starts, and the load). hold_s: the part of it before
        the coordinator published the epoch (an added instance still starting; a failure being detected). spread_s: how
        far apart the old members finished their last step (the first starts the pause, the last is needed by the new
        epoch: part of any pause, prepared or not; None when none arrived). detect_s: from the kill to the coordinator
        declaring the worker dead (kills only). critical_s: the pause split along the member ready last (`_critical`:
        last_step, reach, ahead, hand_off, groups, install). phases_s: the slowest new member's phase durations.
        layers_built: how many layers the new members built for it — at the boundary ("built") or before it, while
        standing by or beside the old epoch's training ("built_ahead"); the layers a member keeps are not rebuilt, so
        a live migration builds exactly the layers it transfers. build_ahead_errors: why a member's build or install
        ahead failed (the boundary then did it). layers_caught_up: of those transferred, how many had their state
        sent during the step before the boundary (a prepared epoch), then that step's gradients (as soon as the step
        reduced them, or at the boundary); layers_installed_ahead: of those, how many had that state installed
        before the boundary too; layers_grads_ahead: of those, how many had the step's gradients come before it as
        well (at the boundary only the source's go came).
        bytes_moved: tensor bytes the workers sent (live migrations) or loaded from the checkpoint (restarts).
        steps_lost: committed steps thrown away and recomputed (a checkpoint-restart after a kill; else 0).
        pause_s is None for an epoch that broke before any member was ready.
        source: what made the epoch — "schedule" (a scripted event), "planner" (an interval boundary's plan),
        "sigterm" (a preemption notice a worker received as a signal), "failure" (a recovery). noticed: the
        preempted workers whose notice it acts on; notice_to_exit_s: the longest time from such a notice (the signal)
        to the worker's exit (None when none exited). abandoned: the migration was rolled back (a death during its
        hand-off, before its first step was applied); the next epoch replaced it. prepared: its groups were formed
        ahead, while the old epoch trained (`prepare`).
        """
        n = e.number
        arrive_by = self._times_by(keys.arrive, n, e.previous)
        arrive = list(arrive_by.values())
        ready_by = self._times_by(keys.ready, n, e.members)
        ready = list(ready_by.values())
        decided = float(self.store.get(keys.epoch_decided(n)))
        # no survivor to report: the pause starts at the kill (or, not knowing it, at the detection)
        failed = [self._killed_at.get(w, self._detected_at.get(w, decided)) for w in e.lost]
        start = min(arrive) if arrive else min(failed, default=decided)
        phases_by = {w: json.loads(v) for w, v in self._reports(keys.phases, n, e.members).items()}
        phases = list(phases_by.values())
        phase_names = sorted({k for p in phases for k in p if k.endswith("_s")})
        detect = [self._detected_at[w] - self._killed_at[w] for w in e.lost
                  if w in self._detected_at and w in self._killed_at]  # fmt: skip
        noticed = self._noticed.get(n, ())
        to_exit = []
        for w in noticed:
            at = self.notice_at(w)
            exited = self.store.get_if(keys.exited(w)) if at is not None else None
            if at is not None and exited is not None:
                to_exit.append(float(exited) - at)
        decision = self.store.get_if(keys.decide(n, e.start_step))
        abandoned = (e.kind not in (MigrationKind.START, MigrationKind.CHECKPOINT_RESTART)
                     and decision is not None and decision.decode() == ABORT
                     and self.epochs[-1].number > n)  # fmt: skip
        return {
            "epoch": n, "kind": e.kind.value, "trigger": None if e.trigger is None else e.trigger.value,
            "notice": e.notice, "step": e.start_step, "joined": list(e.joined),
            "strategy": [e.D, e.P], "bounds": list(e.bounds), "preempted": list(e.preempted), "lost": list(e.lost),
            "pause_s": max(ready) - start if ready else None, "hold_s": max(0.0, decided - start),
            "spread_s": max(arrive) - min(arrive) if arrive else None,
            **self._critical(start, arrive_by, ready_by, phases_by),
            "detect_s": max(detect) if detect else None,
            "bytes_moved": self._bytes_moved(e), "bytes_planned": e.bytes_planned,
            "transfers": len(e.transfers), "steps_lost": e.steps_lost, "restore_step": e.restore_step,
            "phases_s": {k: max(p.get(k, 0.0) for p in phases) for k in phase_names},
            "layers_built": {k: sum(p.get(k, 0) for p in phases) for k in ("built", "built_ahead")},
            "layers_caught_up": sum(p.get("caught_up", 0) for p in phases),
            "layers_installed_ahead": sum(p.get("installed_ahead", 0) for p in phases),
            "layers_grads_ahead": sum(p.get("grads_ahead", 0) for p in phases),
            "build_ahead_errors": sorted({p["build_ahead_error"] for p in phases if "build_ahead_error" in p}),
            "source": self._sources.get(n, "schedule"), "noticed": list(noticed),
            "notice_to_exit_s": max(to_exit) if to_exit else None, "abandoned": abandoned,
            "prepared": e.prepared is not None,
        }  # fmt: skip

    def _bytes_moved(self, e: Epoch) -> int:
        """The tensor bytes epoch `e`'s transfer sources reported sending, plus those its members loaded from a
        checkpoint (each a sealed value of its own: a sum no client without the token can inflate)."""
        total = 0
        for key, workers in ((keys.sent, {t.src for t in e.transfers}), (keys.loaded, e.members)):
            for w, v in self._reports(key, e.number, workers).items():
                try:
                    total += max(0, int(v))
                except ValueError:
                    self._malformed(key(e.number, w), v.decode(errors="replace"))
        return total

    @staticmethod
    def _critical(
        start: float, arrive_by: Mapping[int, float], ready_by: Mapping[int, float],
        phases_by: Mapping[int, Mapping[str, Any]],
    ) -> dict[str, Any]:  # fmt: skip
        """Where the pause went, along the member ready last (`critical_worker`; `critical_joined`: it was not an old
        member): `critical_s` splits the pause into consecutive parts, each ending at one of that member's
        milestones — "last_step" (until its last step of the old epoch ended: how much later than the first old
        member's; 0 for a joiner), "reach" (until it passed the boundary: the store round trips between a step's end
        and a migration; 0 for a joiner already waiting there), "ahead" (what came ahead: its preparation's helper
        receiving, installing and stepping it), "hand_off" (the boundary's transfers: a go, the gradients or the
        state — and waiting for their sources), "groups" (taking or forming the epoch's process groups), "install"
        (its layers, then the ready report). They sum to the pause. None where the member left no milestones (an
        epoch it was not entered through a migration into)."""
        if not ready_by:
            return {"critical_s": None, "critical_worker": None, "critical_joined": None}
        w = max(ready_by, key=ready_by.__getitem__)
        at = phases_by.get(w, {}).get("at")
        parts = None
        if isinstance(at, dict):
            parts, before = {}, start
            for name, t in (("last_step", arrive_by.get(w)), ("reach", at.get("boundary")),
                            ("ahead", at.get("ahead")), ("hand_off", at.get("hand_off")),
                            ("groups", at.get("groups")), ("install", ready_by[w])):  # fmt: skip
                t = before if not isinstance(t, int | float) else max(before, float(t))
                parts[name], before = t - before, t
        return {"critical_s": parts, "critical_worker": w, "critical_joined": w not in arrive_by}

    def epoch_spans(self) -> list[dict[str, Any]]:
        """One span per epoch: which steps it trained, on which stage cut (`bounds`) and for how long
        (`trainer.observe.profile` turns them into iteration times per strategy).

        steps [start_step, end_step): end_step is where the next epoch takes over (its start_step, plus the steps a
        checkpoint-restart after a failure threw away) or the job's end. train_s: from the last member being ready
        (`ctl/e{n}/ready/*`) to the first one arriving at the next epoch's boundary (`ctl/e{n+1}/arrive/*`), so it
        holds the epoch's steps (the first one after the migration included) and no pause; None where an end is not
        in the store (the last epoch: the job's end is not recorded; or no member reached the next boundary).
        decided_at / ready_at / end_at: the wall times of the epoch's publication, last ready member and first
        arrival (None when absent). last_step_s: how long its last step took, from the end of the step before it
        (the median over the members that reported it on arriving; None when none did; in a one-step epoch, the
        migration into it too): the step beside which the next epoch was prepared, if it was.
        """
        out = []
        for i, e in enumerate(self.epochs):
            n = e.number
            nxt = self.epochs[i + 1] if i + 1 < len(self.epochs) else None
            ready = self._times(keys.ready, n, e.members)
            arrive = self._times(keys.arrive, nxt.number, nxt.previous) if nxt is not None else []
            ready_at = max(ready) if len(ready) == len(e.members) else None
            end_at = min(arrive) if arrive else None
            end_step = nxt.start_step + nxt.steps_lost if nxt is not None else self.end_step
            train_s = end_at - ready_at if ready_at is not None and end_at is not None else None
            last = self._times(keys.last_step, nxt.number, nxt.previous) if nxt is not None else []
            out.append({
                "epoch": n, "kind": e.kind.value, "strategy": [e.D, e.P], "bounds": list(e.bounds),
                "start_step": e.start_step,
                "end_step": end_step, "train_s": train_s,
                "decided_at": float(self.store.get(keys.epoch_decided(n))), "ready_at": ready_at, "end_at": end_at,
                "last_step_s": statistics.median(last) if last else None,
            })  # fmt: skip
        return out

    def states(self, worker: int) -> list[str]:
        """The worker's state transitions, e.g. ["JOINING@-", "STANDBY@-", "TRAINING@0", ...]."""
        got = self.store.get_if(keys.states(worker))
        return [] if got is None else [s for s in got.decode().split(";") if s]

    def message(self, kind: str, worker: int) -> str | None:
        """A worker's `error` message (or another `kind` of message), if it wrote one."""
        key = keys.message(kind, worker)
        got = self.store.get_if(key)
        return None if got is None else got.decode()

    # -- live planning ---------------------------------------------------------------------------------------
    def accept_handed_plans(self, planner: str) -> None:
        """Let `trainer.control.planning.hand_plan` clients hand plans to this job (its planner reads them)."""
        self.store.set(keys.ACCEPTS, planner)

    def handed_plans(self, after: int) -> list[tuple[int, dict[str, Any] | None]]:
        """Plans handed in after the `after`-th, as (sequence number, {"strategy", "source", "sent_at"}), in order
        (None for a number passed over); stops at one whose number was taken but which is not written yet (it comes
        with the next call), unless it
        stays missing for `HANDED_GAP_S` (its client died, or the counter was bumped by someone else): then it is
        passed over. A plan that is not such a record is logged and passed over too."""
        out: list[tuple[int, dict[str, Any] | None]] = []
        last = self.store.add(keys.HANDED_SEQ, 0)
        now = time.monotonic()
        for i in range(after + 1, last + 1):
            key = keys.handed(i)
            raw = self.store.get_if(key)
            if raw is None:
                since = self._handed_gap.setdefault(i, now)
                if now - since < HANDED_GAP_S:
                    break
                self._malformed(key, "never written")
                out.append((i, None))
                continue
            plan = _handed_record(raw)
            if plan is None:
                self._malformed(key, raw.decode(errors="replace"))
            out.append((i, plan))
        return out

    def note(self, entry: dict[str, Any]) -> None:
        """Add a driver decision (a plan, a handed plan) to the log."""
        self.log.append(entry)

    def finish(self) -> None:
        """Tell standby workers the job is over."""
        self.store.set(keys.DONE, "1")

    def abort(self, reason: str) -> None:
        """Tell every worker to stop at its next control check."""
        self.store.set(keys.ABORT, reason)
