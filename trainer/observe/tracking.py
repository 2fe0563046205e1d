"""The MLflow run of a training job: `MlflowJobObserver` logs a live-migrating job without ever blocking it.

Owns: the observer that turns the driver's hooks (`trainer.observe.observer`) into one MLflow run per job, the runs of
the plans the job's planning hook made, the timeline plot, and `training_runs` (the runs side by side). Must not touch:
training, the control plane, the driver; where the store is (`tracking` decides); Prefect (a flow that wants its flow
run on the run passes it as a tag, e.g. ``parcae.prefect_flow_run_id``).

What the run holds (experiment "training"; a job resumed from a checkpoint can reopen its run with `run_id=`):
  params     model, model_args, model_fingerprint, workers, start_strategy ("DxP"), steps, stage_cut (what the
             stages are balanced by), global_batch, planner, ... (on_start's info, its config aside);
             a resume adds resume<n>.from_step and resume<n>.<key> for each start value that changed
  metrics    per step: loss, alive_instances, dp_D, dp_P, samples_per_s (global batch x step intervals over the
             last `throughput_window` intervals of the driver's clock, so a reconfiguration's pause shows as a dip; from
             the third step interval on: `trainer.observe.timeline.StepTimeline`), loss_scale (a float16 job's);
             val_loss and val_<metric> (a spec with `validation`, and each of its metrics: at each scored
             boundary, the final layers' at the last step), lr
             (a spec with a learning-rate schedule, `TrainSpec.lr`);
             per plan, at its step: planned_D, planned_P, plan_decision_ms; at the end (summaries, one value
             each, at step 0, which MLflow charts as bars): final_loss, mean_samples_per_s, wall_s,
             reconfigurations, migrations_<kind> (e.g. migrations_intra_stage), total_pause_s, max_pause_s,
             total_steps_lost, total_bytes_moved, skipped_steps (a float16 job's overflows), best_val_<monitor>
             and best_val_step (a validating job's best monitored held-out score, `Validation.monitor`: best_val_loss
             by default; resumes included), stopped_early_step (a
             job its held-out loss stopped early, `Validation.patience`); resumes,
             interrupted_at_step, steps_recomputed (a resume); tracking_dropped_metrics (only if the buffer
             overflowed), fleet_instance_hours, fleet_spot_usd, fleet_on_demand_usd and
             fleet_usd_per_million_samples (a live fleet's cost, `trainer.fleet_cost`). Each migration's own values
             are a row of the migrations table, not a step metric.
  tags       mlflow.note.content (the description: what the job trains and where to look, `run_description`),
             MLflow's run context (mlflow.user, mlflow.source.*: `tracking.context_tags`),
             parcae.job, parcae.coordinator (host:port), parcae.migrations.<kind> (counts), parcae.plan_runs,
             parcae.resumed (and the interruption's status, step and error), parcae.error,
             parcae.fleet_spot_prices (a live fleet's: the cloud's spot prices its cost is at, or "bundled: " and
             why not), and the observer's tags
  artifacts  job.json (the job's `JobConfig.to_dict()`, on_start's "config"; a resume's: resume<n>.job.json),
             migrations.json (every reconfiguration record, rewritten at each flush), migrations_table.json (at
             the end: a row per reconfiguration, `MIGRATION_COLUMNS`, MLflow's table format), plans.json (the plan
             runs), checkpoints/step-<N>/ (the checkpoint's shard files), final/ (the final layers: each stage's
             shard and hash record, as `parcae export` reads them), timeline.png, fleet.json and fleet.png (a
             live fleet's intervals)
  models     MLflow logged models whose source is the run (`trainer.observe.logged_model`): "model", the final
             layers, and "best", a validating job's best-scored checkpoint where it is not the final one, each the
             spec's layers as one module (`mlflow.pytorch.load_model("models:/<id>")`), its step and held-out
             scores as params
Each plan is a run of experiment "plans", like the Prefect plan flow's: decision, expected samples (and liveput),
decision_ms, interval, alive, plan.json and alternatives.json, tagged ``parcae.training_run_id``.

How it is sent: the hooks only queue (points, records, operations) with a
`trainer.observe.tracking_sender.MlflowSender`, whose daemon thread logs them every `flush_every_s`, retries while the
store is down, coalesces per-step points beyond `max_pending` (counted: `tracking_dropped_metrics`) and gives up
`close_timeout_s` after the job ended; this module is the `RunContent` it sends — what each event becomes on the run.
Reconfiguration, plan and checkpoint entries are never coalesced.

Preemption of the driver: `on_error` flushes everything queued and ends the run FAILED (KILLED for
KeyboardInterrupt / SystemExit); SIGTERM and an exit without `on_end` end it KILLED (the sender's handlers).
SIGKILL loses at most `flush_every_s` of metrics and leaves the run RUNNING: reopening it with `run_id=` when the
job is resumed records the interruption (parcae.resumed, resumes, interrupted_at_step), and the resumed job
re-logs every step after its checkpoint; a step logged twice keeps both points (the later timestamp is current).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import tracking as store  # first: it switches MLflow's telemetry off before MLflow is imported

# Imported here, not lazily in the logging thread: a flush at interpreter exit (atexit, after SIGTERM) cannot import
# modules that register their own exit hooks (concurrent.futures: "can't register atexit after shutdown").
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.entities import Metric  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking.context import registry as _run_context  # noqa: E402, F401  (tracking.context_tags, at exit too)

from liveput import strategy_key, strategy_text
from trainer.config import JobConfig  # noqa: E402
from trainer.observe.logged_model import log_trained_model  # noqa: E402
from trainer.observe.observer import JobObserver, PlanInfo, StepInfo
from trainer.observe.timeline import StepTimeline, expected_available, number, timeline_figure
from trainer.observe.tracking_sender import MlflowSender, RunEnd, transient  # noqa: E402
from trainer.runtime.checkpoint import find_shards, record_path  # noqa: E402
from trainer.runtime.export import export_from_uri, export_state_dict  # noqa: E402
from trainer.runtime.validation import Monitor  # noqa: E402

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

TRAINING_EXPERIMENT: Final = store.TRAINING_EXPERIMENT
PLANS_EXPERIMENT: Final = store.PLANS_EXPERIMENT
#: Tag on a plan run: the training run it was made for.
TRAINING_RUN_TAG: Final = "parcae.training_run_id"
#: Tags on the training run.
JOB_TAG: Final = "parcae.job"
PLAN_RUNS_TAG: Final = "parcae.plan_runs"
ERROR_TAG: Final = "parcae.error"
RESUMED_TAG: Final = "parcae.resumed"
MIGRATIONS_TAG: Final = "parcae.migrations."  # + kind
#: Tags of the observer that also go on the plan runs (they say which orchestration run made them).
_SHARED_TAG_PREFIXES: Final = ("parcae.prefect", "prefect.")
#: The columns of the migrations table (`MIGRATION_TABLE`), from each reconfiguration record.
MIGRATION_COLUMNS: Final = ("step", "kind", "trigger", "source", "notice", "prepared", "strategy", "pause_s",
                            "hold_s", "spread_s", "pause_parts", "bytes_moved", "steps_lost", "lost", "preempted",
                            "joined")  # fmt: skip
MIGRATION_TABLE: Final = "migrations_table.json"
FINAL_ARTIFACTS: Final = "final"  # the run's folder of the final layers


def migration_table(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The reconfiguration records as columns (`MIGRATION_COLUMNS`; a strategy as "DxP", lists as text, the pause
    split along its last-ready member — `critical_s` — as "last_step 5.4 ms, reach 0.2 ms, ..."), for
    `MlflowClient.log_table`."""

    def cell(rec: Mapping[str, Any], key: str) -> Any:
        if key == "pause_parts":
            parts = rec.get("critical_s")
            return ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in parts.items()) if isinstance(parts, Mapping) else None
        value = rec.get(key)
        if key == "strategy" and isinstance(value, (list, tuple)) and len(value) == 2:
            return strategy_key(value)
        if isinstance(value, (list, tuple)):
            return ",".join(str(v) for v in value)
        return value

    return {key: [cell(r, key) for r in records] for key in MIGRATION_COLUMNS}


def _kind_key(kind: str) -> str:
    return kind.replace("-", "_").replace(" ", "_")


def _param_value(value: Any) -> str:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return strategy_key(value)
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    return json.dumps(value, default=str, sort_keys=True)


#: on_start values that are tags, not params (a param cannot change, and a resumed job listens elsewhere).
_NOT_PARAMS: Final = frozenset({"job", "host", "port", "config"})  # (the config is the run's job.json)
#: The artifact that holds the job's `JobConfig.to_dict()` (on_start's ``"config"``); a resume's is resume<n>.job.json.
JOB_ARTIFACT: Final = "job.json"


#: on_start values whose param says they are where the job started, not what it ran (the strategy changes).
_START_NAMES: Final = {"strategy": "start_strategy"}


def start_params(info: Mapping[str, Any]) -> dict[str, str]:
    """The params of a training run from on_start's info: every value but None, the job name and the coordinator's
    address (tags) and the whole config (an artifact), a (D, P) pair as "DxP", collections as JSON; the strategy
    the job started on as ``start_strategy`` (the strategy of each step is the metrics dp_D and dp_P)."""
    return {_START_NAMES.get(k, k): _param_value(v) for k, v in info.items() if v is not None and k not in _NOT_PARAMS}


#: A running job that takes plans handed in from outside registers itself with these tags on its MLflow run:
#: ``parcae.accepts_plans`` ("true"), where its coordinator listens (``parcae.coordinator``), where an authorised
#: client reads its token (``parcae.token_file``: a path, never the token), its wall-clock interval, its runtime
#: profile and, for a live fleet, where its history is recorded (``parcae.trace_store``, ``parcae.fleet_tag``).
ACCEPTS_PLANS_TAG: Final = "parcae.accepts_plans"
#: Who decided a plan: on the job's own plan runs, "handed" (a plan handed in) or the job's planner (its
#: fallback, when none came in time); on a plan-interval flow's, "plan-interval".
DECIDED_BY_TAG: Final = "parcae.decided_by"


def start_tags(info: Mapping[str, Any]) -> dict[str, str]:
    """The tags of a training run from on_start's info: the job, where its coordinator listens, the resume step,
    and — for a job that takes handed plans — its registration (`ACCEPTS_PLANS_TAG`)."""
    tags = {JOB_TAG: str(info.get("job") or "job")}
    if info.get("host") is not None and info.get("port") is not None:
        tags["parcae.coordinator"] = f"{info['host']}:{info['port']}"
    if info.get("resumed_from") is not None:
        tags["parcae.resumed_from_step"] = str(info["resumed_from"])
    if info.get("accepts_plans"):
        tags[ACCEPTS_PLANS_TAG] = "true"
        history = info.get("fleet_history") or {}
        for tag, value in (("parcae.token_file", info.get("token_file")),
                           ("parcae.interval_seconds", info.get("interval_seconds")),
                           ("parcae.profile_path", info.get("profile")),
                           ("parcae.trace_store", history.get("store")), ("parcae.fleet_tag", history.get("job_tag")),
                           ("parcae.fleet_max", (info.get("fleet") or {}).get("max_instances"))):  # fmt: skip
            if value is not None:  # paths absolute: a client elsewhere in the machine reads them (the store's is)
                paths = ("parcae.token_file", "parcae.profile_path")
                tags[tag] = str(Path(value).resolve()) if tag in paths else str(value)
    return tags


def run_description(info: Mapping[str, Any], tags: Mapping[str, str], plan_experiment: str = PLANS_EXPERIMENT) -> str:
    """The training run's description in the MLflow UI (Markdown): what the job trains, on what, planned how, and
    where in the run to look. From on_start's info and the observer's tags (a flow adds its trace and provider)."""
    fleet = info.get("fleet") or {}
    provider = tags.get("parcae.provider")
    if fleet.get("max_instances"):
        where = f"a live fleet of up to {fleet['max_instances']} instances"
    else:
        where = f"{info.get('workers')} workers" + (f" replaying trace {tags['parcae.trace']}" if "parcae.trace" in tags
                                                     else "")  # fmt: skip
    if provider:
        where += f" (provider `{provider}`)"
    planner = info.get("planner")
    planned = (f", re-planned every {info['interval_seconds']:g} s by the {planner} planner"
               if planner and info.get("interval_seconds") else "")  # fmt: skip
    batch = f" (global batch {info['global_batch']})" if info.get("global_batch") else ""
    return (
        f"Training job: **{info.get('model')}** for {info.get('steps')} steps{batch} on {where}{planned}.\n\n"
        "Where to look: *Model metrics* (per step: loss, samples_per_s, alive_instances, dp_D x dp_P; summaries such "
        "as final_loss and total_pause_s at the end); *Artifacts*: `timeline.png` (availability, D x P, throughput "
        "and each migration), `migrations_table.json` (a row per migration: kind, pause and where it went, steps "
        "lost, bytes), `plans.json`, `job.json` (every setting), `checkpoints/` and `final/` (the trained layers). "
        "Each plan is a "
        f"run of experiment `{plan_experiment}` tagged `{TRAINING_RUN_TAG}` = this run's id."
    )


def fleet_figure(rows: Sequence[Mapping[str, Any]], title: str = "") -> Figure:
    """A live fleet's history (`trainer.control.fleet.FleetRow`s): instances alive for each interval, and those
    requested, granted, refused and reclaimed during it, against the job's wall time."""
    fig = Figure(figsize=(10, 5), layout="constrained")
    FigureCanvasAgg(fig)
    alive, asks = fig.subplots(2, 1, sharex=True)
    # a row closes its interval at t: its counts cover (previous t, t], its alive the next interval; the job
    # starts at 0 with nothing alive, so the first interval is drawn from 0 like the others
    ts = [0.0] + [float(r["t"]) for r in rows]
    alive.fill_between(ts, [0] + [r["alive"] for r in rows], step="post", color="tab:blue", alpha=0.3,
                       label="alive")  # fmt: skip
    alive.set_ylabel("instances")
    alive.set_ylim(bottom=0)
    for key, colour in (("requested", "tab:gray"), ("granted", "tab:green"), ("refused", "tab:red"),
                        ("reclaimed", "tab:purple")):  # fmt: skip
        counts = [r[key] for r in rows]
        asks.step(ts, counts[:1] + counts, where="pre", color=colour, lw=1.2, label=key)
    asks.set_ylabel("per interval")
    asks.set_xlabel("seconds since the job started")
    for ax in (alive, asks):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle(title or "the live fleet")
    return fig


class MlflowJobObserver(JobObserver):
    """Logs one training job to MLflow from a background thread; see the module docstring for what and how.

    `tracking`: a tracking URI or a store folder (default: the `tracking` package's store). `run_id`: reopen that run
    (a job resumed after its driver was killed). `tags` go on the run, and the Prefect ones (``parcae.prefect*``,
    ``prefect.*``) on its plan runs too. The run's id is `run_id` once the thread created it (`flush()` waits).
    """

    def __init__(
        self,
        *,
        experiment: str = TRAINING_EXPERIMENT,
        run_name: str | None = None,
        tags: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        tracking: str | Path | None = None,
        flush_every_s: float = 1.0,
        log_checkpoints: bool = True,
        plan_experiment: str = PLANS_EXPERIMENT,
        throughput_window: int = 10,
        max_pending: int = 100_000,
        close_timeout_s: float = 60.0,
        handle_sigterm: bool = True,
    ) -> None:
        if not flush_every_s > 0:
            raise ValueError(f"flush_every_s must be > 0 seconds, got {flush_every_s}")
        if throughput_window < 1:
            raise ValueError(f"throughput_window must be >= 1 step interval, got {throughput_window}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1 metric point, got {max_pending}")
        if close_timeout_s < 0:
            raise ValueError(f"close_timeout_s must be >= 0 seconds, got {close_timeout_s}")
        self.uri = store.resolve_uri(tracking)
        self.experiment, self.plan_experiment, self.run_name = experiment, plan_experiment, run_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.run_id: str | None = run_id
        self.resuming = run_id is not None
        self.flush_every_s, self.log_checkpoints, self.max_pending = flush_every_s, log_checkpoints, max_pending
        self.close_timeout_s, self.handle_sigterm = close_timeout_s, handle_sigterm
        self.models: dict[str, str] = {}  # the run's logged models ("model", "best") by name -> model id

        self._sender = MlflowSender(self.uri, self, flush_every_s=flush_every_s, max_pending=max_pending,
                                    close_timeout_s=close_timeout_s, handle_sigterm=handle_sigterm,
                                    log=log)  # fmt: skip
        # shared with the driver's thread (under the sender's lock)
        self._info: dict[str, Any] | None = None
        self._global_batch = 0
        self._records: list[dict[str, Any]] = []
        self._epochs: set[Any] = set()
        self._kinds: dict[str, int] = {}
        self._records_dirty = False
        self._timeline = StepTimeline(throughput_window)  # step -> (alive, D*P, samples/s), for the figure
        self._first: tuple[int, float] | None = None  # (step, time) of the first step seen
        self._last: tuple[int, float, float] | None = None  # (step, loss, time) of the latest step seen
        self._skipped: set[int] | None = None  # the steps skipped for an overflow (a job that scales its loss)
        self._validated = False  # a held-out loss was logged (its best is a summary at the end)
        # the logging thread's own state
        self._run_ready = False
        self._plan_exp: str | None = None
        self._exp: str | None = None  # the training run's experiment id and name, once it exists
        self._run_name: str | None = None
        self._plans: list[dict[str, Any]] = []
        self._plans_dirty = False
        self._sender.start()

    # -- hooks: the driver's thread; enqueue and return ------------------------------------------------------
    def on_start(self, info: Mapping[str, Any]) -> None:
        with self._sender.lock:
            self._info = dict(info)
            self._global_batch = int(info.get("global_batch") or 0)
        self._sender.started()

    def on_step(self, step: StepInfo) -> None:
        d, p = step.strategy
        ts = int(step.time * 1000)
        with self._sender.lock:
            if self._sender.fatal is not None:
                return
            sps = self._timeline.add(step, self._global_batch)
            points = [
                ("loss", float(step.loss), ts, step.step),
                ("alive_instances", float(step.alive), ts, step.step),
                ("dp_D", float(d), ts, step.step),
                ("dp_P", float(p), ts, step.step),
            ]
            if sps is not None:
                points.append(("samples_per_s", sps, ts, step.step))
            if step.lr is not None:  # a spec's schedule of the step
                points.append(("lr", float(step.lr), ts, step.step))
            if step.loss_scale is not None:  # float16: the scale after the step, and the steps it skipped
                points.append(("loss_scale", float(step.loss_scale), ts, step.step))
                self._skipped = self._skipped or set()
                (self._skipped.add if step.skipped else self._skipped.discard)(step.step)  # (a step recomputed)
            self._sender.add(points)
            if self._first is None:
                self._first = (step.step, step.time)
            self._last = (step.step, float(step.loss), step.time)

    def on_validation(self, step: int, loss: float, metrics: Mapping[str, float] | None = None) -> None:
        ts = int(time.time() * 1000)
        points = [("val_loss", float(loss), ts, step)]
        points += [(f"val_{name}", float(v), ts, step) for name, v in (metrics or {}).items()]
        with self._sender.lock:
            if self._sender.fatal is None:
                self._sender.add(points)
                self._validated = True

    def on_plan(self, plan: PlanInfo) -> None:
        ts = int(time.time() * 1000)
        with self._sender.lock:
            if self._sender.fatal is not None:
                return
            self._sender.queue("plan", lambda: self._log_plan(plan))
            self._sender.extend([
                ("planned_D", float(plan.decision[0]), ts, plan.step),
                ("planned_P", float(plan.decision[1]), ts, plan.step),
                ("plan_decision_ms", 1000.0 * plan.decision_s, ts, plan.step),
            ])  # fmt: skip

    def on_reconfiguration(self, record: Mapping[str, Any]) -> None:
        rec = json.loads(json.dumps(dict(record), default=str))  # a copy the driver cannot mutate
        kind = str(rec.get("kind", "unknown"))
        with self._sender.lock:
            if self._sender.fatal is not None:
                return
            epoch = rec.get("epoch")
            if epoch is not None:
                if epoch in self._epochs:
                    return
                self._epochs.add(epoch)
            self._records.append(rec)
            self._kinds[kind] = self._kinds.get(kind, 0) + 1
            self._records_dirty = True  # (migrations.json and the tags at the next flush; per-migration values are
            # not step metrics: a line joining the pauses of steps 5 and 55 says nothing — the table at the end does)

    def on_checkpoint(self, step: int, directory: Path) -> None:
        with self._sender.lock:
            self._timeline.on_checkpoint(step, directory)  # on the timeline, whether or not its files are logged
        if not self.log_checkpoints:
            return
        directory = Path(directory)
        with self._sender.lock:
            if self._sender.fatal is None:
                self._sender.queue("checkpoint", lambda: self._log_checkpoint(step, directory))

    def on_end(self, result: Mapping[str, Any]) -> None:
        for rec in result.get("reconfigurations") or ():  # any record the driver did not report (deduplicated)
            if isinstance(rec, Mapping) and rec.get("epoch") is not None:
                self.on_reconfiguration(rec)
        layers = result.get("layers")
        if self.log_checkpoints and layers:  # the trained model itself, beside its checkpoints
            step = int(result.get("first_step") or 0) + len(result.get("loss") or [])
            scored = {int(v["step"]): {"loss": v["loss"], **v.get("metrics", {})} for v in result.get("validation", [])}
            best = (result.get("best_checkpoint") or {}).get("step")
            ckpt = (self._info or {}).get("checkpoint_dir")
            with self._sender.lock:
                if self._sender.fatal is None:
                    self._sender.queue("final layers", lambda: self._log_final(step, Path(layers)))
                    self._sender.queue("model", lambda: self._log_model("model", step, Path(layers), scored.get(step)))
                    if best is not None and best != step and ckpt:  # the best-scored checkpoint, another model
                        self._sender.queue(
                            "best model", lambda: self._log_model("best", best, Path(ckpt), scored.get(best))
                        )
        self._sender.close("FINISHED", result, None)

    def on_error(self, error: BaseException) -> None:
        status = "KILLED" if isinstance(error, (KeyboardInterrupt, SystemExit)) else "FAILED"
        text = f"{type(error).__name__}: {error}".rstrip(": ")
        self._sender.close(status, None, text)

    # -- public --------------------------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far is logged (blocks: not for the driver's hooks). False if that did
        not happen within `timeout` seconds or the run cannot be logged at all."""
        return self._sender.flush(timeout)

    @property
    def closed(self) -> bool:
        """Whether the run was ended (or the observer gave up on it)."""
        return self._sender.closed

    # -- the run's content: `trainer.observe.tracking_sender.RunContent`, called on the logging thread ----------------
    def started(self) -> bool:
        return self._info is not None

    def latest_step(self) -> int:
        return self._last[0] if self._last else 0

    def open_run(self, client: MlflowClient) -> bool:
        """Create the run (or reopen `run_id`) and log the start params; idempotent, so it can be retried."""
        if self._run_ready:
            return True
        info = dict(self._info or {})
        job = str(info.get("job") or "job")
        try:
            if self.run_id is None:
                exp = store.ensure_experiment(client, self.experiment)
                tags = {
                    **start_tags(info),
                    store.NOTE_TAG: run_description(info, self.tags, self.plan_experiment),
                    **self.tags,
                }
                run = client.create_run(exp, run_name=self.run_name or job, tags=store.context_tags(tags))
                self.run_id = run.info.run_id  # a retry below logs into this run, never creates another
            else:
                run = client.get_run(self.run_id)
            self._exp, self._run_name = run.info.experiment_id, run.info.run_name
        except MlflowException as exc:
            if transient(exc):
                raise
            what = f"run_id {self.run_id!r}" if self.resuming else f"experiment {self.experiment!r}"
            self._sender.set_fatal(f"cannot use {what} in {self.uri!r} ({store.short_error(exc)}); check the run "
                                   "id / name")  # fmt: skip
            return False
        except store.TrackingError as exc:  # a deleted experiment: the message says how to restore it
            self._sender.set_fatal(str(exc))
            return False
        params = start_params(info)
        if self.resuming:
            self._log_resume(client, run, info, params)
        else:
            store.log_batched(client, self.run_id, params=params, tags=start_tags(info))
            self._log_config(client, info, JOB_ARTIFACT)
        self._run_ready = True
        return True

    def _log_resume(self, client: MlflowClient, run: Any, info: Mapping[str, Any], params: Mapping[str, str]) -> None:
        """Reopen a run of an interrupted job: record the interruption and where it resumed from."""
        run_id = self.run_id
        assert run_id is not None
        n = int(run.data.metrics.get("resumes", 0)) + 1
        history = client.get_metric_history(run_id, "loss")
        last = max((m.step for m in history), default=None)
        start = info.get("resumed_from")
        previous = run.data.params
        new = {k: v for k, v in params.items() if k not in previous}
        new.update({f"resume{n}.{k}": v for k, v in params.items() if k in previous and previous[k] != v})
        if start is not None:
            new[f"resume{n}.from_step"] = str(start)
        tags = {**start_tags({"job": run.data.tags.get(JOB_TAG), **info}), **self.tags, RESUMED_TAG: "true",
                "parcae.resumes": n, "parcae.interrupted_status": run.info.status}  # fmt: skip
        if last is not None:
            tags["parcae.interrupted_at_step"] = last
        if ERROR_TAG in run.data.tags:  # the previous incarnation's error: kept, under another name
            tags["parcae.interrupted_by"] = run.data.tags[ERROR_TAG]
        client.update_run(run_id, status="RUNNING")
        store.log_batched(client, run_id, params=new, tags=tags)
        self._log_config(client, info, f"resume{n}.{JOB_ARTIFACT}")
        if ERROR_TAG in run.data.tags:
            client.delete_tag(run_id, ERROR_TAG)
        now, at = int(time.time() * 1000), int(start or 0)
        metrics = [Metric("resumes", float(n), now, at)]
        if last is not None:
            metrics.append(Metric("interrupted_at_step", float(last), now, at))
            if start is not None:
                metrics.append(Metric("steps_recomputed", float(max(0, last + 1 - int(start))), now, at))
        client.log_batch(run_id, metrics=metrics)  # last: a retry after a failure above does not count twice
        log.info("MLflow run %s reopened (resume %d, from step %s; last step logged %s)", run_id, n, start, last)

    def _log_config(self, client: MlflowClient, info: Mapping[str, Any], name: str) -> None:
        """The job's `JobConfig` as artifact `name`, when on_start's info carries it (an observer fed by hand may
        not); rewritten whole by a retry."""
        config = info.get("config")
        if config is not None:
            assert self.run_id is not None
            client.log_dict(self.run_id, config, name)

    def send_artifacts(self, client: MlflowClient) -> bool:
        run_id = self.run_id
        assert run_id is not None
        with self._sender.lock:
            records = list(self._records) if self._records_dirty else None
            kinds = dict(self._kinds)
            self._records_dirty = False
        try:
            if records is not None:
                client.log_dict(run_id, records, "migrations.json")  # type: ignore[arg-type]  # a list dumps as well
                store.log_batched(client, run_id, tags={f"{MIGRATIONS_TAG}{k}": v for k, v in kinds.items()})
            if self._plans_dirty:
                client.log_dict(run_id, self._plans, "plans.json")  # type: ignore[arg-type]  # (see above)
                store.log_batched(client, run_id, tags={PLAN_RUNS_TAG: len(self._plans)})
                self._plans_dirty = False
        except Exception:
            if records is not None:
                with self._sender.lock:
                    self._records_dirty = True
            raise
        return True

    def _log_plan(self, plan: PlanInfo) -> None:
        """One run of the plans experiment for one decision of the planning hook, tied to the training run."""
        client, run_id = self._sender.client, self.run_id
        assert client is not None and run_id is not None
        if self._plan_exp is None:
            self._plan_exp = store.ensure_experiment(client, self.plan_experiment)
        details = json.loads(json.dumps(dict(plan.details), default=str))
        job = str((self._info or {}).get("job") or "job")
        tags = {TRAINING_RUN_TAG: run_id, JOB_TAG: job, "decision": strategy_key(plan.decision),
                "planner": plan.planner, DECIDED_BY_TAG: str(details.get("source") or plan.planner)}  # fmt: skip
        tags.update({k: v for k, v in self.tags.items() if k.startswith(_SHARED_TAG_PREFIXES)})
        # the run's description in the UI: what was decided, and a link to the training run (the tag is only an id)
        training = self._run_name or job
        tags[store.NOTE_TAG] = (
            f"Interval {plan.interval} of training run [{training}](#/experiments/{self._exp}/runs/{run_id}): "
            f"{plan.alive} instances alive, {strategy_text(plan.current)} -> "
            f"{strategy_text(plan.decision)} (decided by {tags[DECIDED_BY_TAG]})."
        )
        params = {"interval": plan.interval, "step": plan.step, "planner": plan.planner,  # alive: a metric
                  "current_strategy": strategy_key(plan.current)}  # fmt: skip
        for key in ("model", "look_ahead", "interval_s", "trace"):
            if details.get(key) is not None:
                params[key] = details[key]
        metrics = store.plan_metrics(details)
        if "decision_ms" in metrics:
            metrics["optimizer_decision_ms"] = metrics["decision_ms"]
        metrics.update({"decision_ms": 1000.0 * plan.decision_s, "alive": float(plan.alive),
                        "decision_D": float(plan.decision[0]), "decision_P": float(plan.decision[1])})  # fmt: skip
        dicts = {"plan.json": details, "alternatives.json": {"alternatives": details.get("alternatives", [])}}
        plan_run = store.log_run(client, self._plan_exp, run_name=f"plan-{training}-i{plan.interval}", tags=tags,
                                 params=params, metrics=metrics, dicts=dicts)  # fmt: skip
        self._plans.append({"run_id": plan_run, "interval": plan.interval, "step": plan.step,
                            "forecast_n": expected_available(details),
                            "decision": list(plan.decision), "current": list(plan.current)})  # fmt: skip
        self._plans_dirty = True

    def _log_checkpoint(self, step: int, directory: Path) -> None:
        """Upload the shard files of the checkpoint of `step` under checkpoints/step-<step>/."""
        client, run_id = self._sender.client, self.run_id
        assert client is not None and run_id is not None
        files = find_shards(directory, step)
        if not files and directory.is_dir() and not any(directory.glob("step*.pt")):
            files = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            self._sender.failed += 1
            log.warning("MLflow run %s: no files of the checkpoint of step %d in %s (written on instances that do "
                        "not share this disk: the copy is at the job's checkpoint URI); nothing uploaded", run_id,
                        step, directory)  # fmt: skip
            return
        for f in files:
            if not f.exists():  # removed since (a checkpoint-restart to an earlier step clears later files)
                self._sender.failed += 1
                log.warning("MLflow run %s: checkpoint file %s vanished before its upload", run_id, f)
                continue
            client.log_artifact(run_id, str(f), f"checkpoints/step-{step}")

    def _log_final(self, step: int, directory: Path) -> None:
        """Upload the final layers (each stage's shard of step `step` and its hash record) under final/: what
        `parcae export` turns into one state dict."""
        client, run_id = self._sender.client, self.run_id
        assert client is not None and run_id is not None
        shards = find_shards(directory, step)
        if not shards:
            self._sender.failed += 1
            log.warning("MLflow run %s: no final layers of step %d in %s; nothing uploaded", run_id, step, directory)
            return
        for f in [*shards, *(p for p in map(record_path, shards) if p.exists())]:
            client.log_artifact(run_id, str(f), FINAL_ARTIFACTS)

    def _log_model(self, name: str, step: int, directory: Path, scores: Mapping[str, float] | None) -> None:
        """Log the checkpoint of `step` in `directory` as the run's logged model `name` (`log_trained_model`), once
        (a retry after the store went away does not log it again). A checkpoint written on instances that share no
        disk with this one is read from the job's checkpoint URI."""
        client, run_id = self._sender.client, self.run_id
        assert client is not None and run_id is not None and self._exp is not None
        if name in self.models:
            return
        config = JobConfig.from_dict((self._info or {})["config"])
        uri = config.checkpoint.uri
        if uri is not None and not find_shards(directory, step):
            exported = export_from_uri(uri, step)
        else:
            exported = export_state_dict(directory, step)
        self.models[name] = log_trained_model(client, self._exp, run_id, name, exported, config.train, scores)

    def finish(self, client: MlflowClient, final: RunEnd) -> bool:
        """End the run: final metrics, the timeline, tags, status. True when done (or not worth a retry)."""
        run_id = self.run_id
        if run_id is None or not self._run_ready:
            return False
        status, result, error = final
        with self._sender.lock:
            records, timeline, last, first = list(self._records), dict(self._timeline.steps), self._last, self._first
            skipped = None if self._skipped is None else len(self._skipped)
            validated, info = self._validated, dict(self._info or {})
            checkpoints = list(self._timeline.checkpoints)
            gb = self._global_batch
        try:
            now = int(time.time() * 1000)
            pauses = [p for p in (number(r.get("pause_s")) for r in records) if p is not None]
            metrics: dict[str, float] = {
                "reconfigurations": float(len(records)),
                "total_pause_s": sum(pauses),
                "max_pause_s": max(pauses, default=0.0),
                "total_steps_lost": sum(number(r.get("steps_lost")) or 0.0 for r in records),
                "total_bytes_moved": sum(number(r.get("bytes_moved")) or 0.0 for r in records),
            }
            for kind in sorted({str(r.get("kind", "unknown")) for r in records}):
                metrics[f"migrations_{_kind_key(kind)}"] = float(sum(str(r.get("kind", "unknown")) == kind
                                                                     for r in records))  # fmt: skip
            losses = (result or {}).get("loss") or []
            if losses:
                metrics["final_loss"] = float(losses[-1])
            elif last is not None:
                metrics["final_loss"] = last[1]
            throughput = (result or {}).get("throughput") or {}
            if number(throughput.get("samples_per_s")) is not None:
                metrics["mean_samples_per_s"] = float(throughput["samples_per_s"])
            elif gb and first and last and last[2] > first[1] and len(timeline) > 1:
                metrics["mean_samples_per_s"] = gb * (len(timeline) - 1) / (last[2] - first[1])
            if number((result or {}).get("wall_s")) is not None:
                metrics["wall_s"] = float(result["wall_s"])
            if skipped is not None:
                metrics["skipped_steps"] = float(skipped)
            cost = (result or {}).get("fleet_cost") or {}  # a live fleet's: runs compare in dollars too
            for key in ("instance_hours", "spot_usd", "on_demand_usd", "usd_per_million_samples"):
                if number(cost.get(key)) is not None:
                    metrics[f"fleet_{key}"] = float(cost[key])
            if validated:  # the best monitored held-out score of the run, its resumes' included (MLflow holds all)
                watched = Monitor(str(info.get("val_monitor", "loss")), str(info.get("val_mode", "min")))
                held_out = client.get_metric_history(run_id, f"val_{watched.name}")
                if held_out:
                    best = min(held_out, key=lambda m: (watched.rank(m.value), m.step))
                    metrics[f"best_val_{watched.name}"], metrics["best_val_step"] = float(best.value), float(best.step)
            if stopped := (result or {}).get("stopped_early"):  # the held-out loss ended the job at this step
                metrics["stopped_early_step"] = float(stopped["step"])
            # at step 0: MLflow charts a metric with one value at step 0 as a bar (a summary), and one at a later
            # step as a lone dot on the step axis (the "noise" charts)
            client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
            tags: dict[str, Any] = {}
            if error:
                tags[ERROR_TAG] = error
            if self._sender.dropped:
                tags["parcae.tracking.dropped"] = self._sender.dropped
            if self._sender.failed:
                tags["parcae.tracking.failed"] = self._sender.failed
            if cost.get("spot_prices") or cost.get("spot_prices_error"):  # which prices its fleet_spot_usd is at
                tags["parcae.fleet_spot_prices"] = cost.get("spot_prices") or f"bundled: {cost['spot_prices_error']}"
            store.log_batched(client, run_id, tags=tags)
            name = self._run_name or str((self._info or {}).get("job") or "job")  # the run's name, as the UI shows it
            if timeline:
                fig = timeline_figure(timeline, records, f"{name}: availability, D x P and throughput",
                                      list(self._plans), checkpoints)  # fmt: skip
                client.log_figure(run_id, fig, "timeline.png")
            if records:  # one row per reconfiguration, as the UI's table viewer shows it
                client.log_table(run_id, data=migration_table(records), artifact_file=MIGRATION_TABLE)
            fleet = (result or {}).get("fleet") or []
            if fleet:  # a live fleet's history: the table to query, the figure to look at
                columns = {k: [row[k] for row in fleet] for k in fleet[0]}
                client.log_table(run_id, data=columns, artifact_file="fleet.json")
                client.log_figure(run_id, fleet_figure(fleet, f"{name}: the live fleet"), "fleet.png")
            client.set_terminated(run_id, status)
        except Exception as exc:
            if transient(exc):
                self._sender.store_down(exc)
                return False
            log.exception("MLflow run %s: ending the run failed", run_id)
            with contextlib.suppress(Exception):  # a last try at the status; the failure is logged above
                client.set_terminated(run_id, status)
        log.info("MLflow run %s ended %s", run_id, status)
        return True


def training_runs(
    tracking: str | Path | None = None,
    *,
    experiment: str = TRAINING_EXPERIMENT,
    filter_string: str = "",
    max_results: int = 1000,
) -> pd.DataFrame:
    """The training runs, newest first, one row each: run_id, run_name, status, start_time, end_time and
    ``metrics.*``, ``params.*``, ``tags.*`` columns (as ``mlflow.search_runs``), without touching MLflow's global
    tracking URI. Empty if the experiment does not exist. Raises `tracking.TrackingError` when the store
    cannot be reached."""
    import pandas as pd

    uri = store.resolve_uri(tracking)
    store.check_reachable(uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    base = ["run_id", "run_name", "status", "start_time", "end_time"]
    if exp is None:
        return pd.DataFrame(columns=base)
    rows: list[dict[str, Any]] = []
    token = None
    while len(rows) < max_results:
        page = client.search_runs([exp.experiment_id], filter_string, max_results=min(1000, max_results - len(rows)),
                                  order_by=["attributes.start_time DESC"], page_token=token)  # fmt: skip
        for run in page:
            row: dict[str, Any] = {
                "run_id": run.info.run_id,
                "run_name": run.info.run_name,
                "status": run.info.status,
                "start_time": pd.to_datetime(run.info.start_time, unit="ms", utc=True),
                "end_time": pd.to_datetime(run.info.end_time, unit="ms", utc=True) if run.info.end_time else pd.NaT,
            }
            row.update({f"metrics.{k}": v for k, v in run.data.metrics.items()})
            row.update({f"params.{k}": v for k, v in run.data.params.items()})
            row.update({f"tags.{k}": v for k, v in run.data.tags.items()})
            rows.append(row)
        token = page.token
        if not token:
            break
    return pd.DataFrame(rows, columns=None) if rows else pd.DataFrame(columns=base)
