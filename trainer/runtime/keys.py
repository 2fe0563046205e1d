"""The control plane's store keys: one function or constant per key, shared by everyone who talks through the store
— the coordinator, the workers, the instance agents, the driver and `trainer.control.planning.hand_plan` clients.

Owns: the names of the keys, what each holds (below), and which of them only the driver may write (`DRIVER_ONLY`,
which `trainer.runtime.store` signs and checks). Pure: no store, no torch (the agent imports it before torch). Must not
touch: what is done with the values (`trainer.control.coordinator` decides, `trainer.runtime.worker` acts,
`trainer.providers.agent` reports), the sealing (`trainer.runtime.store`, which also owns its own ``auth/*`` keys).

Keys in the store ({id}: a worker/instance id, {n}: an epoch number, {s}: a step):

  job/spec                 JSON: model and train configs, steps, job id, directories, checkpoint period, timeouts
  auth/salt, auth/check     the salt the job's key is derived with (plain), and a sealed check value: a client
                           whose token does not open it is refused (a worker exits with EXIT_TOKEN); see
                           `trainer.runtime.store`. Every other value is sealed with the job's key, counters (add)
                           aside
  epoch/{n}, epoch/current the epoch blobs (`Epoch.to_json`): every epoch, and the latest one
  epoch/prep/{p}, .../latest  preparation p: the epoch the driver expects to decide at a coming boundary (its
                           `prepared` = p), published a step or more ahead so that its members and transfer parties
                           form its groups (on prefix prep{p}) while the old epoch trains; and the latest p. The
                           epoch decided at the boundary uses them only if it is that epoch (else it forms its own)
  ctl/prep/{p}/{id}        when worker id finished forming preparation p's groups
  ctl/joined               "3,0,1,..." appended by each worker when it registers (JOINING -> STANDBY)
  ctl/joins/{id}           how many processes of instance `id` registered (a checkpoint-restart starts a new one)
  ctl/worker/{id}          the registered process's pid
  ctl/final/{id}           the incarnation (ctl/joins value) of instance id's process that ended normally
  hb/{id}                  the heartbeat: a counter the worker's heartbeat thread (its own TCPStore client) bumps
                           every `hb_interval_s`; the coordinator declares a worker dead when it stops moving for
                           `hb_timeout_s` (measured on the coordinator's clock: no clock skew between hosts)
  ctl/at/{id}              the step the worker started last (the driver kills a victim mid-step with it)
  ctl/boundary/{s}         the decision for the boundary before step s, taken **once** by compare-and-set (as the
                           reference's `/rdzv/global_steps_{step}` CAS, §D.3): the first worker to reach it writes
                           "train"; the coordinator claims it beforehand with "hold" and resolves a hold to
                           "epoch:{n}" (migrate into epoch n; "epoch:{n}:{p}" when it is preparation p's epoch,
                           which its parties hold already), "restart:{n}" (checkpoint here, exit for a
                           checkpoint-restart into epoch n) or "train". A decision naming an epoch the worker has
                           already reached is stale (the boundary is being passed again after a recovery) and means
                           "train". Every member of an epoch therefore sees the same decision.
  ctl/decided/{s}          when the boundary before step s was resolved (wall clock)
  ctl/preempt/{id}         the last epoch number a preempted worker takes part in (standby workers exit after it)
  ctl/notice/{id}, ctl/notices
                           a preemption notice the worker received (SIGTERM, `trainer.runtime.worker`): its
                           deadline (wall clock: time of the signal + the job's `notice_grace_s`); then the id
                           appended to the list the driver polls with the heartbeats
  ctl/exit/{id}            when the worker's process ended normally (a notice's notice-to-exit time)
  ctl/restart/{id}         the worker's process must exit (EXIT_RESTART) for a checkpoint-restart
  ctl/e{n}/abort           epoch n is broken (a member died, or a worker saw a collective fail): members abandon
                           the step in flight (nothing applied) and report; set by the coordinator or a worker
  ctl/e{n}/abandon/{id}, ctl/e{n}/failed/{id}
                           the step a survivor of broken epoch n abandoned (= the steps it applied; all agree), and
                           when the work it lost started
  ctl/e{n}/next            the number of the epoch that replaces broken epoch n (survivors wait for it)
  ctl/e{n}/commit/{s}/{id}, ctl/e{n}/decide/{s}
                           the once-only commit of step s in epoch n (each member marks itself done): "apply" iff
                           every rank finished its collectives, "abort" if the epoch broke first (see
                           `trainer.runtime.pipeline`). The decision
                           of a migrated epoch's first step is also the migration's: "apply" commits it, "abort"
                           (which the coordinator writes itself when the hand-off breaks) rolls it back
  ctl/e{n}/...             per-epoch measurements: arrive/{id} (old member's last step ended), ready/{id} (new
                           member about to run its first step), phases/{id} (its migration's phase durations,
                           JSON), bytes (sent or loaded, counter), sent/{id} (a
                           transfer source has added what it sent to bytes), decided (when the epoch was published)
  ckpt/written             "s:n:k;" appended when stage k of epoch n wrote its shard of the checkpoint of step s (with a
                           checkpoint URI: once the shard and its record are uploaded there)
  ckpt/files/{s}/{n}/{k}   with a checkpoint URI: the files stage k of epoch n uploaded for step s and their sizes
                           (JSON {name: size}), set before ckpt/written names them (the driver's manifest lists them)
  ckpt/failed/{id}         with a checkpoint URI: the uploads worker id could not make (JSON list of messages)
  ckpt/restore/{n}         the checkpoint a restoring epoch n loads: JSON {shard file: [its layers]}, set before
                           the epoch is published (a worker loads the shards of its layers, fetching from the URI
                           those its disk does not hold)
  loss/{s}                 the loss of step s, written by the last stage's replica 0 (`StepLoss`: with the loss
                           scale after it, and whether it was skipped, where the job scales its loss); a
                           checkpoint-restart deletes those of the steps it recomputes before publishing its epoch
                           (so a key present after it holds the recomputed value)
  val/patience             a spec that stops early (`Validation.patience`): the count after the latest scored
                           boundary (`trainer.runtime.validation.Patience`, JSON), rewritten there by the last
                           stage's replica 0; read by every member at each scored boundary (a joiner or a restarted
                           process was not there to count); the driver seeds it when a job resumes
  plan/accepts             the planner's name, when the job's live planner takes plans handed in from outside
                           (`trainer.control.planning.HandedPlanner`); absent otherwise
  plan/seq, plan/handed/{i}
                           plans handed in by `trainer.control.planning.hand_plan` clients: the counter, then plan
                           i as JSON {"strategy", "source", "sent_at"} (the client increments the counter, then
                           writes the plan)
  ctl/states/{id}          the worker's state transitions, "TRAINING@0;MIGRATING@2;..."
  ctl/error/{id}, ctl/rejected/{id}
                           why the worker failed (`message`); ctl/abort: why the job was aborted; ctl/done: it ended
  agent/{id}/up/{k}        the agent started instance id's k-th worker process (its pid; k = 0, 1, ...)
  agent/{id}/exit/{k}      the exit code of that process (negative: killed by that signal)
  agent/{id}/start/{k}     the driver asks for process k (k >= 1: after a checkpoint-restart)
  agent/{id}/signals, agent/{id}/signal/{n}
                           the driver asks the agent to send signal n's number to the worker (a counter, then
                           the numbers): how a preemption notice the driver learns of reaches a worker elsewhere
  final/{id}               the worker's stage, replica and parameter digest when it finished the job (JSON)
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
JOB_SPEC = "job/spec"
DONE = "ctl/done"
ABORT = "ctl/abort"
EPOCH_CURRENT = "epoch/current"


def epoch(n: int) -> str:
    return f"epoch/{n}"


PREPARE_LATEST = "epoch/prep/latest"


def prepare(p: int) -> str:
    return f"epoch/prep/{p}"


def prepared(p: int, w: int) -> str:
    return f"ctl/prep/{p}/{w}"


# -- membership and liveness -------------------------------------------------------------------------------------
JOINED = "ctl/joined"
NOTICES = "ctl/notices"


def joins(w: int) -> str:
    return f"ctl/joins/{w}"


def worker_pid(w: int) -> str:
    return f"ctl/worker/{w}"


def final(w: int) -> str:
    """The incarnation of instance `w`'s process that ended normally."""
    return f"ctl/final/{w}"


def heartbeat(w: int) -> str:
    return f"hb/{w}"


def step_at(w: int) -> str:
    return f"ctl/at/{w}"


def preempt(w: int) -> str:
    return f"ctl/preempt/{w}"


def notice(w: int) -> str:
    return f"ctl/notice/{w}"


def exited(w: int) -> str:
    return f"ctl/exit/{w}"


def restart(w: int) -> str:
    return f"ctl/restart/{w}"


def states(w: int) -> str:
    return f"ctl/states/{w}"


def message(kind: str, w: int) -> str:
    """A worker's message of `kind` ("error", "rejected")."""
    return f"ctl/{kind}/{w}"


def replica_final(w: int) -> str:
    """The finished worker's stage, replica and parameter digest."""
    return f"final/{w}"


# -- step boundaries ---------------------------------------------------------------------------------------------
def boundary(s: int) -> str:
    return f"ctl/boundary/{s}"


def boundary_decided(s: int) -> str:
    return f"ctl/decided/{s}"


# -- per epoch ---------------------------------------------------------------------------------------------------
def epoch_abort(n: int) -> str:
    return f"ctl/e{n}/abort"


def epoch_next(n: int) -> str:
    return f"ctl/e{n}/next"


def epoch_decided(n: int) -> str:
    return f"ctl/e{n}/decided"


def loaded(n: int, w: int) -> str:
    """The bytes of state worker `w` loaded from the checkpoint restoring epoch `n` (sealed, as `sent`)."""
    return f"ctl/e{n}/loaded/{w}"


def arrive(n: int, w: int) -> str:
    return f"ctl/e{n}/arrive/{w}"


def last_step(n: int, w: int) -> str:
    """How long worker `w`'s last step before epoch `n`'s boundary took, in seconds, from the end of the step before
    it (the boundary's checks, what it sent ahead, the step; written with its arrival)."""
    return f"ctl/e{n}/last_step/{w}"


def ready(n: int, w: int) -> str:
    return f"ctl/e{n}/ready/{w}"


def phases(n: int, w: int) -> str:
    return f"ctl/e{n}/phases/{w}"


def sent(n: int, w: int) -> str:
    return f"ctl/e{n}/sent/{w}"


def abandon(n: int, w: int) -> str:
    return f"ctl/e{n}/abandon/{w}"


def failed(n: int, w: int) -> str:
    return f"ctl/e{n}/failed/{w}"


def commit(n: int, s: int, w: int) -> str:
    return f"ctl/e{n}/commit/{s}/{w}"


def decide(n: int, s: int) -> str:
    return f"ctl/e{n}/decide/{s}"


# -- checkpoints and losses --------------------------------------------------------------------------------------
CKPT_WRITTEN = "ckpt/written"


def ckpt_files(s: int, n: int, k: int) -> str:
    return f"ckpt/files/{s}/{n}/{k}"


def ckpt_failed(w: int) -> str:
    return f"ckpt/failed/{w}"


def ckpt_restore(n: int) -> str:
    return f"ckpt/restore/{n}"


PATIENCE = "val/patience"


def loss(s: int) -> str:
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
ACCEPTS = "plan/accepts"
HANDED_SEQ = "plan/seq"


def handed(i: int) -> str:
    """The `i`-th plan handed in from outside."""
    return f"plan/handed/{i}"


# -- instance agents (`trainer.providers.agent`) -----------------------------------------------------------------------
def agent_up(w: int, k: int) -> str:
    return f"agent/{w}/up/{k}"


def agent_exit(w: int, k: int) -> str:
    return f"agent/{w}/exit/{k}"


def agent_start(w: int, k: int) -> str:
    return f"agent/{w}/start/{k}"


def agent_signals(w: int) -> str:
    return f"agent/{w}/signals"


def agent_signal(w: int, n: int) -> str:
    return f"agent/{w}/signal/{n}"
