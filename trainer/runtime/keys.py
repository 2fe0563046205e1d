"""The control plane's store keys: one function or constant per key, shared by everyone who talks through the store
— the coordinator, the workers, the instance agents, the driver and `trainer.control.planning.hand_plan` clients.

Owns: the names of the keys, what each holds (the docstring or comment at its definition: {id} a worker/instance id,
{n} an epoch number, {s} a step), and which of them only the driver may write (`DRIVER_ONLY`, which
`trainer.runtime.store` signs and checks). Pure: no store, no torch (the agent imports it before torch). Must not
touch: what is done with the values (`trainer.control.coordinator` decides, `trainer.runtime.worker` acts,
`trainer.providers.agent` reports), the sealing (`trainer.runtime.store`, which owns its own ``auth/salt`` and
``auth/check`` keys: every other value is sealed with the job's key, counters aside). Where to look next: `boundary`
(the once-only decision at a step boundary) and `commit` (the once-only commit of a step) hold the protocol's two
agreements.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

# What only the driver writes: the job, its epochs, the orders to leave, restart, stop, the agents' orders. A token
# holder (a worker) cannot forge these: the driver signs them (Ed25519) inside the sealed value
# (`trainer.runtime.store`).
DRIVER_ONLY = re.compile(
    r"job/spec|epoch/.*|ctl/preempt/\d+|ctl/restart/\d+|ctl/e\d+/next|ctl/done|ctl/abort|plan/accepts"
    r"|agent/\d+/(start|signal)/\d+|ckpt/restore/\d+"
)

# -- the job ---------------------------------------------------------------------------------------------------
#: JSON: model and train configs, steps, job id, directories, checkpoint period, timeouts
JOB_SPEC = "job/spec"
#: the job ended
DONE = "ctl/done"
#: why the job was aborted
ABORT = "ctl/abort"
#: the latest epoch's blob (`Epoch.to_json`)
EPOCH_CURRENT = "epoch/current"


def epoch(n: int) -> str:
    """Epoch `n`'s blob (`Epoch.to_json`)."""
    return f"epoch/{n}"


#: the latest preparation's number (`prepare`)
PREPARE_LATEST = "epoch/prep/latest"


def prepare(p: int) -> str:
    """Preparation `p`: the epoch the driver expects to decide at a coming boundary (its `prepared` = p), published a
    step or more ahead so that its members and transfer parties form its groups (on prefix prep{p}) while the old epoch
    trains. The epoch decided at the boundary uses them only if it is that epoch (else it forms its own)."""
    return f"epoch/prep/{p}"


def prepared(p: int, w: int) -> str:
    """When worker `w` finished forming preparation `p`'s groups."""
    return f"ctl/prep/{p}/{w}"


# -- membership and liveness -------------------------------------------------------------------------------------
#: "3,0,1,..." appended by each worker when it registers (JOINING -> STANDBY)
JOINED = "ctl/joined"
#: the ids of the workers that received a preemption notice (`notice`), appended; the driver polls it with the
#: heartbeats
NOTICES = "ctl/notices"


def joins(w: int) -> str:
    """How many processes of instance `w` registered (a checkpoint-restart starts a new one)."""
    return f"ctl/joins/{w}"


def worker_pid(w: int) -> str:
    """The registered process's pid."""
    return f"ctl/worker/{w}"


def final(w: int) -> str:
    """The incarnation of instance `w`'s process that ended normally."""
    return f"ctl/final/{w}"


def heartbeat(w: int) -> str:
    """A counter worker `w`'s heartbeat thread (its own TCPStore client) bumps every `hb_interval_s`; the coordinator
    declares the worker dead when it stops moving for `hb_timeout_s` (on the coordinator's clock: no skew between
    hosts)."""
    return f"hb/{w}"


def step_at(w: int) -> str:
    """The step worker `w` started last (the driver kills a victim mid-step with it)."""
    return f"ctl/at/{w}"


def preempt(w: int) -> str:
    """The last epoch number a preempted worker takes part in (standby workers exit after it)."""
    return f"ctl/preempt/{w}"


def notice(w: int) -> str:
    """A preemption notice worker `w` received (SIGTERM, `trainer.runtime.worker`): its deadline (wall clock: the
    signal's time + the job's `notice_grace_s`); then `w` is appended to `NOTICES`."""
    return f"ctl/notice/{w}"


def exited(w: int) -> str:
    """When worker `w`'s process ended normally (a notice's notice-to-exit time)."""
    return f"ctl/exit/{w}"


def restart(w: int) -> str:
    """Worker `w`'s process must exit (EXIT_RESTART) for a checkpoint-restart."""
    return f"ctl/restart/{w}"


def states(w: int) -> str:
    """Worker `w`'s state transitions, "TRAINING@0;MIGRATING@2;..."."""
    return f"ctl/states/{w}"


def message(kind: str, w: int) -> str:
    """A worker's message of `kind` ("error", "rejected")."""
    return f"ctl/{kind}/{w}"


def replica_final(w: int) -> str:
    """The finished worker's stage, replica and parameter digest."""
    return f"final/{w}"


# -- step boundaries ---------------------------------------------------------------------------------------------
def boundary(s: int) -> str:
    """The decision for the boundary before step `s`, taken **once** by compare-and-set (as the reference's
    `/rdzv/global_steps_{step}` CAS, §D.3): the first worker to reach it writes "train"; the coordinator claims it
    beforehand with "hold" and resolves a hold to "epoch:{n}" (migrate into epoch n; "epoch:{n}:{p}" when it is
    preparation p's epoch, which its parties hold already), "restart:{n}" (checkpoint here, exit for a checkpoint-
    restart into epoch n) or "train". A decision naming an epoch the worker has already reached is stale (the boundary
    is being passed again after a recovery) and means "train". Every member of an epoch therefore sees the same
    decision."""
    return f"ctl/boundary/{s}"


def boundary_decided(s: int) -> str:
    """When the boundary before step `s` was resolved (wall clock)."""
    return f"ctl/decided/{s}"


# -- per epoch ---------------------------------------------------------------------------------------------------
def epoch_abort(n: int) -> str:
    """Epoch `n` is broken (a member died, or a worker saw a collective fail): members abandon the step in flight
    (nothing applied) and report; set by the coordinator or a worker."""
    return f"ctl/e{n}/abort"


def epoch_next(n: int) -> str:
    """The number of the epoch that replaces broken epoch `n` (survivors wait for it)."""
    return f"ctl/e{n}/next"


def epoch_decided(n: int) -> str:
    """When epoch `n` was published."""
    return f"ctl/e{n}/decided"


def loaded(n: int, w: int) -> str:
    """The bytes of state worker `w` loaded from the checkpoint restoring epoch `n` (sealed, as `sent`)."""
    return f"ctl/e{n}/loaded/{w}"


def arrive(n: int, w: int) -> str:
    """When old member `w`'s last step before epoch `n` ended."""
    return f"ctl/e{n}/arrive/{w}"


def last_step(n: int, w: int) -> str:
    """How long worker `w`'s last step before epoch `n`'s boundary took, in seconds, from the end of the step before
    it (the boundary's checks, what it sent ahead, the step; written with its arrival)."""
    return f"ctl/e{n}/last_step/{w}"


def ready(n: int, w: int) -> str:
    """When new member `w` of epoch `n` is about to run its first step."""
    return f"ctl/e{n}/ready/{w}"


def phases(n: int, w: int) -> str:
    """Worker `w`'s migration into epoch `n`: its phases' durations (JSON)."""
    return f"ctl/e{n}/phases/{w}"


def sent(n: int, w: int) -> str:
    """The bytes of state transfer source `w` sent into epoch `n` (sealed: the driver adds them up)."""
    return f"ctl/e{n}/sent/{w}"


def abandon(n: int, w: int) -> str:
    """The step survivor `w` of broken epoch `n` abandoned (= the steps it applied; all agree)."""
    return f"ctl/e{n}/abandon/{w}"


def failed(n: int, w: int) -> str:
    """When the work survivor `w` of broken epoch `n` lost started."""
    return f"ctl/e{n}/failed/{w}"


def commit(n: int, s: int, w: int) -> str:
    """Member `w`'s mark on the once-only commit of step `s` in epoch `n` (`decide`): "apply" iff every rank finished
    its collectives, "abort" if the epoch broke first (`trainer.runtime.pipeline`). The decision of a migrated epoch's
    first step is also the migration's: "apply" commits it, "abort" (which the coordinator writes itself when the
    hand-off breaks) rolls it back."""
    return f"ctl/e{n}/commit/{s}/{w}"


def decide(n: int, s: int) -> str:
    """The once-only decision on step `s` of epoch `n` (`commit`)."""
    return f"ctl/e{n}/decide/{s}"


# -- checkpoints and losses --------------------------------------------------------------------------------------
#: "s:n:k;" appended when stage k of epoch n wrote its shard of the checkpoint of step s (with a checkpoint URI: once
#: the shard and its record are uploaded there)
CKPT_WRITTEN = "ckpt/written"


def ckpt_files(s: int, n: int, k: int) -> str:
    """With a checkpoint URI: the files stage `k` of epoch `n` uploaded for step `s` and their sizes (JSON {name:
    size}), set before `CKPT_WRITTEN` names them (the driver's manifest lists them)."""
    return f"ckpt/files/{s}/{n}/{k}"


def ckpt_failed(w: int) -> str:
    """With a checkpoint URI: the uploads worker `w` could not make (JSON list of messages)."""
    return f"ckpt/failed/{w}"


def ckpt_restore(n: int) -> str:
    """The checkpoint a restoring epoch `n` loads: JSON {shard file: [its layers]}, set before the epoch is published (a
    worker loads the shards of its layers, fetching from the URI those its disk does not hold)."""
    return f"ckpt/restore/{n}"


#: a spec that stops early (`Validation.patience`): the count after the latest scored boundary
#: (`trainer.runtime.validation.Patience`, JSON), rewritten there by the last stage's replica 0; read by every member
#: at each scored boundary (a joiner or a restarted process was not there to count); the driver seeds it when a job
#: resumes
PATIENCE = "val/patience"


def loss(s: int) -> str:
    """The loss of step `s` (`StepLoss`), written by the last stage's replica 0; a checkpoint-restart deletes those of
    the steps it recomputes before publishing its epoch (so a key present after it holds the recomputed value)."""
    return f"loss/{s}"


class StepLoss(NamedTuple):
    """A committed step's `loss` value: its loss; where the job scales its loss (float16), the scale after it and
    whether its update was skipped for an overflow; where the boundary before it was validated
    (`trainer.runtime.validation`), the held-out scores there (`val`: "loss", and each metric by name)."""

    loss: float
    scale: float | None = None
    skipped: bool = False
    val: Mapping[str, float] | None = None

    def value(self) -> str:
        out = [repr(self.loss)] + ([] if self.scale is None else [repr(self.scale), str(int(self.skipped))])
        held_out = dict(self.val or {})
        if held_out:  # "val=<loss>", then "val.<metric>=<value>" (names are `validation.METRIC_NAME`s)
            out.append(f"val={held_out.pop('loss')!r}")
            out += [f"val.{name}={v!r}" for name, v in held_out.items()]
        return " ".join(out)

    @classmethod
    def parse(cls, raw: bytes | str) -> StepLoss:
        parts = (raw.decode() if isinstance(raw, bytes) else raw).split()
        scores = [p for p in parts[1:] if p.startswith("val")]
        parts = [p for p in parts if p not in scores]
        val = None
        if scores:
            named = [s.partition("=") for s in scores]
            val = {("loss" if k == "val" else k.removeprefix("val.")): float(v) for k, _, v in named}
            if "loss" not in val:
                raise ValueError(f"a step's held-out scores lack the loss: {raw!r}")
        if len(parts) not in (1, 3):
            raise ValueError(f"a step's loss value holds {len(parts)} fields: {raw!r}")
        if len(parts) == 1:
            return cls(float(parts[0]), val=val)
        return cls(float(parts[0]), float(parts[1]), parts[2] == "1", val)


# -- plans handed in from outside (`trainer.control.planning.hand_plan`) -----------------------------------------------
#: the planner's name, when the job's live planner takes plans handed in from outside
#: (`trainer.control.planning.HandedPlanner`); absent otherwise
ACCEPTS = "plan/accepts"
#: how many plans were handed in (`handed`): a client increments it, then writes the plan
HANDED_SEQ = "plan/seq"


def handed(i: int) -> str:
    """The `i`-th plan handed in from outside."""
    return f"plan/handed/{i}"


# -- instance agents (`trainer.providers.agent`) -----------------------------------------------------------------------
def agent_up(w: int, k: int) -> str:
    """The agent started instance `w`'s `k`-th worker process (its pid; k = 0, 1, ...)."""
    return f"agent/{w}/up/{k}"


def agent_exit(w: int, k: int) -> str:
    """The exit code of that process (negative: killed by that signal)."""
    return f"agent/{w}/exit/{k}"


def agent_start(w: int, k: int) -> str:
    """The driver asks for instance `w`'s process `k` (k >= 1: after a checkpoint-restart)."""
    return f"agent/{w}/start/{k}"


def agent_signals(w: int) -> str:
    """How many signals the driver asked instance `w`'s agent to send its worker (`agent_signal`): how a preemption
    notice the driver learns of reaches a worker elsewhere."""
    return f"agent/{w}/signals"


def agent_signal(w: int, n: int) -> str:
    """The number of the `n`-th signal to send."""
    return f"agent/{w}/signal/{n}"
