"""Run one elastic job end to end: a coordinator, the instances of a provider, a schedule, and optionally a live
planner, observers and a resume from the job's last checkpoint.

Owns: `run_job(config, schedule)` and `train(config)` (what `parcae train` and the train flow run): validating the
job, the local capacity, the resume point (`trainer.control.resume`), the coordinator, the provider's instances,
the `trainer.control.driver.Driver` that applies the schedule, and the job's result and report. Must not touch:
what the driver decides (`trainer.control.driver`), migration planning (`trainer.runtime.migration`), training
(`trainer.runtime.worker`), where instances come from (`trainer.providers`).

Where to look next: `docs/driver.md` (how a schedule, notices, kills, live planning, observers and resume are
driven, in detail), `trainer.config.JobConfig` (every setting), `trainer.control.events` (the schedule format).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forecasting import jsonio
from liveput import DEFAULT_INTERVAL_S
from trainer.config import JobConfig
from trainer.control.coordinator import Coordinator
from trainer.control.driver import Driver, JobError, LivePlanning
from trainer.control.dry_run import ScheduleError, check_schedule, schedule_state
from trainer.control.events import EventGroup, Schedule, group_events, load_events, parse_events
from trainer.control.fleet import FleetController, cloud_spot, fleet_cost
from trainer.control.fleet_driver import FleetDriver
from trainer.control.planning import Planner, plan_info_dict
from trainer.control.resume import check_same_job, clear_for_resume, resume_point
from trainer.control.schedules import LocalTraceProvider, trace_strategy
from trainer.observe.fleet_history import FleetHistoryWriter
from trainer.observe.observer import JobObserver, ObserverList
from trainer.providers import provider_of
from trainer.providers.agent import AgentInstances, RemoteJob
from trainer.providers.fleet import Fleet, FleetSetup
from trainer.providers.local import LocalProcessProvider
from trainer.runtime import checkpoint, keys, loss_scale
from trainer.runtime.checkpoint_mirror import (
    FINAL,
    CheckpointMirror,
    MirrorError,
    StepCommitter,
    gather_shards,
    mirror_for,
)
from trainer.runtime.devices import resolve_device
from trainer.runtime.model import layer_names, model_fingerprint, spec_of
from trainer.runtime.model import n_layers as layer_count
from trainer.runtime.pipeline import parameters_checksum
from trainer.runtime.store import TOKEN_FILE, new_token, write_token_file
from trainer.runtime.trainspec import check_job
from trainer.runtime.validation import Patience, Validation, metrics_of

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


def run_job(
    config: JobConfig,
    schedule: Schedule | None,
    *,
    observer: JobObserver | None = None,
    planner: Planner | None = None,
    remote: RemoteJob | None = None,
) -> dict[str, Any]:
    """Train `config` (its steps, model, checkpoints, control plane, ...) on `schedule`: its `workers` initial
    instances starting at its `strategy` = (D, P), then its `events`; or, for a live fleet (`config.fleet`, no
    schedule), on what its provider grants, planned every wall-clock interval.

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
         epoch, "latest_checkpoint": step, "throughput": {"steps_per_s", "samples_per_s",
         "train_s"} (of the steps this run trained), "events": the coordinator's log, "states": {worker id: its
         state transitions}, "exit_codes": {worker id: code of its last process}, "wall_s": seconds,
         and, for a job that scales its loss (float16), "loss_scale": {"final", "skipped_steps"}, and for a spec with
         `validation`, "validation": [{"step", "loss"} of each boundary scored, the final layers' last] and
         "best_checkpoint": {"step", "val_loss", "monitor", "mode", "value"} of the scored checkpoint with the
         best held-out score (`Validation.monitor`, the loss by default), which retention keeps (None: no checkpoint
         was scored), and for a job its held-out scores stopped early
         (`Validation.patience`), "stopped_early": {"step", "best_step", "monitor", "mode", "best", "patience",
         "min_delta"}}
    """
    t0 = time.monotonic()
    model, train_cfg, steps, job = config.model, config.train, config.steps, config.job
    chosen = provider_of(config)  # (its name, its options and what it runs: checked before anything starts)
    mirror = mirror_for(config.checkpoint.uri) if config.checkpoint.uri is not None else None
    if mirror is not None:
        check_checkpoint_uri(mirror)
    if config.fleet.live:  # the fleet, not a schedule, decides what exists
        if planner is None:
            raise ScheduleError("a live fleet is planned every interval: give a planner (parcae train --planner)")
        restore, note = _resume(config, mirror)
        most = config.fleet.max_instances
        assert most is not None, "FleetConfig.live means max_instances is set"
        start = _Start(ids=range(0), next_id=0, strategy=(1, 1), peak=most)
    else:
        if schedule is None:
            raise ScheduleError("a job without a live fleet needs a schedule (trainer.control.events.Schedule)")
        replay = _Replay.checked(config, schedule, planner)
        restore, note = _resume(config, mirror)
        start = replay.start(restore)
    out = Path(config.out_dir)
    layers_dir, ckpt_dir = Path(config.layers_dir), Path(config.checkpoint_dir)
    peak = start.peak
    max_processes = config.provider.max_processes or peak
    if remote is None:
        _check_local_capacity(peak)
    bind, token = ((remote.host, remote.port), remote.token) if remote is not None else (None, new_token())
    token_file = write_token_file(out / TOKEN_FILE, token)  # for clients that hand plans in (`hand_plan`)
    _write_job_file(out, config)
    coord = Coordinator(config, token=token, bind=bind)
    scoring = spec_of(model, train_cfg).validation if train_cfg.validate else None
    if restore and scoring is not None and scoring.patience is not None:  # (the count, from the scores kept)
        kept = {**checkpoint.held_out(ckpt_dir, job=job), **(mirror.held_out(job=job) if mirror is not None else {})}
        coord.seed_patience(Patience.since({s: scoring.score(r.scores) for s, r in kept.items()
                                            if scoring.monitor in r.scores}, restore))  # fmt: skip
    if planner is not None and getattr(planner, "accepts_handed", False):
        coord.accept_handed_plans(planner.name)
    provider: LocalProcessProvider | AgentInstances
    build_fleet = chosen.fleet
    if config.fleet.live and remote is not None:  # a fleet elsewhere (AWS): its agents run the workers
        if remote.fleet is None:
            coord.abort("the provider runs no live fleet")
            raise ScheduleError(f"provider {config.provider.name!r} runs no live fleet elsewhere")
        provider = remote.fleet(coord.store)
    elif config.fleet.live and build_fleet is not None:
        interval_s = config.availability.interval_seconds
        setup = FleetSetup(coord.host, coord.port, coord.token, coord.store.driver_key, config.provider.start_method,
                           peak, interval_s, train_cfg.seed)  # fmt: skip
        try:
            built = build_fleet(config.provider.options, setup)
        except BaseException:
            coord.abort("the fleet could not start")
            raise
        assert isinstance(built, LocalProcessProvider | AgentInstances), "a fleet is a provider of instances too"
        provider = built
    elif remote is not None:
        provider = remote.instances(coord.store)
    else:
        provider = LocalProcessProvider(coord.host, coord.port, coord.token, config.provider.start_method,
                                        driver_key=coord.store.driver_key)  # fmt: skip
    obs = ObserverList([observer])
    timeout_s = config.control.timeout_s
    deadline = math.inf if timeout_s is None else t0 + timeout_s  # no hidden deadline: a job runs until it is done
    # a live fleet's instances come from its provider, planned every interval; a replay's from the schedule
    kind = FleetDriver if config.fleet.live else Driver
    driver = kind(coord, provider, start.groups, LivePlanning(planner, start.intervals, start.steps_per_interval),
                  deadline=deadline, max_processes=max_processes, observer=obs)  # fmt: skip
    if mirror is not None:
        driver.committer = StepCommitter(mirror, config.checkpoint.keep, job=job,
                                         on_upload=driver.prune_local if config.checkpoint.keep else None)  # fmt: skip
    info = {
        "job": job, "model": model.name, "model_args": dict(model.args) or None,
        "model_fingerprint": model_fingerprint(model)[:16], "workers": len(start.ids), "strategy": start.strategy,
        "steps": steps, "stage_cut": coord.sizes.cut_source,
        "global_batch": train_cfg.global_batch, "checkpoint_dir": str(ckpt_dir), "resumed_from": restore or None,
        "host": coord.host, "port": coord.port, "token_file": str(token_file), "resume_note": note,
        "planner": planner.name if planner is not None else None,
        "accepts_plans": bool(getattr(planner, "accepts_handed", False)),
        "interval_seconds": config.availability.interval_seconds, "profile": config.planning.profile,
        "steps_per_interval": start.steps_per_interval, "notice_grace_s": config.control.notice_grace_s,
        "config": config.to_dict(),
        **({"val_monitor": scoring.monitor, "val_mode": scoring.mode} if scoring is not None else {}),
    }  # fmt: skip
    fleet, history = None, None
    try:
        if config.fleet.live:
            info["fleet"] = dataclasses.asdict(config.fleet)
            interval_s = config.availability.interval_seconds
            # a compressed market's interval stands for the trace's own (60 s): in its history and in its cost
            priced_s = DEFAULT_INTERVAL_S if isinstance(provider, Fleet) and provider.compressed else interval_s
            if config.fleet.record_history:
                tag = f"{job}@{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{coord.port}"
                history = FleetHistoryWriter(config.fleet.trace_store, tag, config.provider.name,
                                             priced_s, peak)  # fmt: skip
                info["fleet_history"] = {"store": history.summary()["store"], "job_tag": tag}
            fleet = FleetController(config.fleet, interval_s, time.monotonic(), on_row=history)
            assert isinstance(driver, FleetDriver)
            driver.run_fleet(fleet, config.availability.interval_seconds, info, restore_step=restore)
        else:
            driver.run(start.ids, start.strategy, info, next_id=start.next_id, restore_step=restore,
                       assignment=start.assignment)  # fmt: skip
        t_train = time.time() - float(coord.store.get(keys.epoch_decided(1)))
        records = coord.final_records()  # every member of the epoch in force reported its final layers
        if set(records) != set(coord.in_force.members):
            raise JobError(f"workers {sorted(set(coord.in_force.members) - set(records))} ended without reporting "
                           "their final layers")  # fmt: skip
        end = coord.read_end(records)  # (steps, or sooner where the held-out loss stopped the job early)
        coord.finish()
        driver.wait(lambda: all(c is not None for c in provider.exitcodes().values()), "every process to end")
        driver.observe(final=True)
        # the final layers, one shard per stage: on this disk, or (instances with disks of their own) fetched
        # from the checkpoint URI's final/ folder, where each stage's writer put its shard
        last = coord.in_force
        final_mirror = mirror.child(FINAL) if mirror is not None else None
        try:
            shards = gather_shards(layers_dir, end, coord.shards_of(end, last.number), layer_names(model),
                                   final_mirror, layers_dir)  # fmt: skip
            final = checkpoint.load(shards, config=model, job=job)
        except checkpoint.CheckpointError as e:  # trained, but the final layers cannot be read here: say which
            raise JobError(f"the job trained its {end} steps, but its final layers cannot be loaded: {e}") from None
        trained = end - restore
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
            **loss_scale_report(final.layers, coord.skipped_steps()),
            **(
                {
                    "validation": [
                        {"step": s, "loss": v["loss"], **({"metrics": m} if (m := metrics_of(v)) else {})}
                        for s, v in held_out
                    ]
                }
                if (held_out := coord.validations(records))
                else {}
            ),
            "layers": str(layers_dir),
            "replicas": records,
            "latest_checkpoint": coord.latest_checkpoint(),
            "throughput": {
                "steps_per_s": trained / t_train,
                "samples_per_s": samples / t_train,
                "train_s": t_train,
            },
            "events": coord.log,
            "states": {w: coord.states(w) for w in sorted(provider.exitcodes())},
            "exit_codes": dict(sorted(provider.exitcodes().items())),
            "wall_s": time.monotonic() - t0,
        }
        if driver.committer is not None:
            driver.committer.close()  # every complete checkpoint committed before the job says it is done
            copies = driver.committer.summary()
            copies["errors"] += coord.checkpoint_failures()
            result["checkpoint_uri"] = copies
        if "validation" in result:  # the checkpoint retention keeps beside the newest (`checkpoint.best_validated`)
            best = (mirror.best_validated(job=job) if mirror is not None
                    else checkpoint.best_validated(ckpt_dir, layer_names(model), job=job))  # fmt: skip
            result["best_checkpoint"] = None if best is None else best_checkpoint(*best)
        if end < steps:  # the held-out loss stopped it (`Validation.patience`): where, and on which best
            result["stopped_early"] = stopped_early(end, coord.patience(), scoring)
        if fleet is not None:
            result["fleet"] = [row.to_dict() for row in fleet.rows]
            result["fleet_totals"] = dict(fleet.totals)
            trained = len(result["loss"]) * train_cfg.global_batch
            own_type = chosen.instance_type(config.provider.options)
            assert isinstance(provider, Fleet)  # (a live fleet's provider)
            billed = cloud_spot(fleet, provider, own_type, time.time() - time.monotonic())
            result["fleet_cost"] = fleet_cost(fleet.instance_seconds_by_type, own_type, trained,
                                              priced_s / interval_s, billed)  # fmt: skip
            if history is not None:
                history.close()
                result["fleet_history"] = history.summary()
    except BaseException as e:  # noqa: BLE001 — KeyboardInterrupt/SystemExit too: observers flush, then re-raise
        why = "the job was interrupted" if isinstance(e, KeyboardInterrupt) else f"run_job failed: {type(e).__name__}"
        coord.abort(why)
        if history is not None:  # the fleet's intervals queued for the trace store, written before the job ends
            history.close()
        err = JobError(str(e)) if isinstance(e, TimeoutError) else e
        obs.on_error(err)
        if err is e:
            raise
        raise err from None
    finally:
        provider.stop()
    obs.on_end(result)
    return result


def stopped_early(end: int, count: Patience | None, held_out: Validation | None) -> dict[str, Any]:
    """`run_job`'s "stopped_early": the boundary the job ended at, the best monitored held-out score the count waited
    on and the settings that stopped it."""
    if count is None or held_out is None or count.stop_at != end:
        raise JobError(f"the job ended at step {end}, before its last, but no early stop was counted there")
    best = held_out.value(count.best) if math.isfinite(count.best) else None  # (None: no score was a number)
    return {"step": end, "best_step": count.best_step, "monitor": held_out.monitor, "mode": held_out.mode,
            "best": best, "patience": held_out.patience, "min_delta": held_out.min_delta}  # fmt: skip


def best_checkpoint(step: int, held: checkpoint.HeldOut) -> dict[str, Any]:
    """`run_job`'s "best_checkpoint": the step, its held-out loss, and the score that made it the best."""
    return {"step": step, "val_loss": held.loss, "monitor": held.monitor.name, "mode": held.monitor.mode,
            "value": held.value}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Start:
    """Where the driver begins: the instances alive (`ids`; the next one added gets `next_id`), the strategy and
    layer assignment they start on, the schedule's events still to come, the live planner's interval boundaries
    and the most instances the job has at once (`peak`). A live fleet starts with none of these: it decides."""

    ids: Sequence[int]
    next_id: int
    strategy: tuple[int, int]
    peak: int
    assignment: Any = None
    groups: Sequence[EventGroup] = ()
    intervals: Sequence[int] = ()
    steps_per_interval: int = 0


@dataclasses.dataclass(frozen=True)
class _Replay:
    """A replayed schedule, checked against the job before anything starts (`checked`), then started where the
    schedule is at the resume step (`start`)."""

    config: JobConfig
    schedule: Schedule
    groups: list[EventGroup]
    strategy: tuple[int, int]
    planned: bool
    rule: Any = None

    @classmethod
    def checked(cls, config: JobConfig, schedule: Schedule, planner: Planner | None) -> _Replay:
        model, train_cfg = config.model, config.train
        evs = parse_events(list(schedule.events))
        spi = schedule.steps_per_interval
        rule = None
        if planner is not None:
            if spi < 1:
                raise ScheduleError(f"a job with a live planner needs steps_per_interval >= 1, got {spi}")
            planned = sorted({(e.kind, e.step) for e in evs if e.kind in ("plan", "checkpoint-restart")})
            if planned:
                raise ScheduleError(
                    f"a job with a live planner ({planner.name}) takes availability events only (add, preempt, "
                    f"kill); the schedule has {', '.join(f'{k} at step {st}' for k, st in planned)}: drop them "
                    "(e.g. trace_schedule(..., plans=False))"
                )
            rule = lambda n: trace_strategy(n, layer_count(model), train_cfg.global_batch)  # noqa: E731
        elif spi:
            raise ScheduleError(f"steps_per_interval={spi} needs a planner (planner=...)")
        groups = group_events(evs)
        strategy = (int(schedule.strategy[0]), int(schedule.strategy[1]))
        check_schedule(model, train_cfg, schedule.workers, strategy, config.steps, groups, strategy_for=rule)
        return cls(config, schedule, groups, strategy, planner is not None, rule)

    def start(self, restore: int) -> _Start:
        model, train_cfg, steps, workers = (
            self.config.model,
            self.config.train,
            self.config.steps,
            self.schedule.workers,
        )
        ids: Sequence[int] = range(workers)
        next_id, strategy, assignment, groups = workers, self.strategy, None, self.groups
        if restore:  # start where the schedule was at the resume step, drop earlier events
            state = schedule_state(model, train_cfg, workers, strategy, steps, groups, restore,
                                   strategy_for=self.rule)  # fmt: skip
            ids, next_id = state.alive, state.next_id
            strategy, assignment = (state.epoch.D, state.epoch.P), state.epoch.assignment
            groups = [g for g in groups if g.step >= restore]
        spi = self.schedule.steps_per_interval
        intervals = [b for b in range(spi, steps, spi) if b >= restore] if self.planned else []
        return _Start(ids=ids, next_id=next_id, strategy=strategy, assignment=assignment, groups=groups,
                      intervals=intervals, steps_per_interval=spi,
                      peak=max(len(ids), peak_instances(len(ids), groups)))  # fmt: skip


def _resume(config: JobConfig, mirror: CheckpointMirror | None) -> tuple[int, str | None]:
    """The step the job starts at and what resume found: 0 and None without `config.checkpoint.resume`, whose
    out_dir must then hold no earlier job's files. With `mirror` (the checkpoint URI's), once the out_dir is known
    to be this job's, the newest complete checkpoint there is fetched first (a fresh machine)."""
    out, model, job, steps = Path(config.out_dir), config.model, config.job, config.steps
    layers_dir, ckpt_dir = Path(config.layers_dir), Path(config.checkpoint_dir)
    if not config.checkpoint.resume:
        for d in (layers_dir, ckpt_dir):
            if d.exists() and any(d.iterdir()):
                raise ScheduleError(f"{d} already holds files (of an earlier job?); give a fresh output folder "
                                    "(--out-dir), or resume (--resume) to continue that job from its last "
                                    "checkpoint")  # fmt: skip
        return 0, None
    if (out / JOB_FILE).is_file():  # written by an earlier run of this job (`_write_job_file`)
        check_same_job(jsonio.loads(jsonio.read(out / JOB_FILE)), config, out / JOB_FILE)
    fetched = mirror.fetch_latest(ckpt_dir, layer_names(model), job=job) if mirror is not None else None
    found = resume_point(ckpt_dir, layers_dir, model, job, steps)
    restore = found[0] if found else 0
    clear_for_resume(layers_dir, ckpt_dir, restore)
    note = (f"resumed from the checkpoint of step {restore} in {ckpt_dir} ({len(found[1])} files); "
            f"steps 0..{restore - 1} were trained by an earlier run" if found else
            f"resume: {ckpt_dir} holds no complete checkpoint of job {job!r}; started from step 0")  # fmt: skip
    if found and found[2]:
        note += f" (skipped {'; '.join(found[2])})"
    if fetched is not None and mirror is not None:
        note += f"; the checkpoint of step {fetched} was fetched from {mirror.uri}"
    return restore, note


def check_checkpoint_uri(mirror: CheckpointMirror) -> None:
    """Before the job trains: the checkpoint URI takes an object and gives it back (`CheckpointMirror.probe`), or a
    `MirrorError` that names the URI, why and the fix — a job whose every copy fails would otherwise train for
    hours and keep no checkpoint where its instances' disks do not die with them."""
    from botocore.exceptions import BotoCoreError, ClientError  # (only a URI's check needs boto)

    from trainer.providers.aws_errors import S3_GRANTS, aws_error, no_credentials

    try:
        mirror.probe()
    except MirrorError:
        raise
    except (BotoCoreError, ClientError) as exc:
        why = str(aws_error(f"writing to {mirror.uri}", exc, fix=no_credentials("a checkpoint URI on S3", S3_GRANTS)))
        raise MirrorError(f"checkpoint.uri (--checkpoint-uri) {mirror.uri}: the job could not keep a checkpoint "
                          f"there: {why}") from None  # fmt: skip
    except OSError as exc:
        raise MirrorError(f"checkpoint.uri (--checkpoint-uri) {mirror.uri}: the job could not keep a checkpoint "
                          f"there: {exc}. Fix: make the folder writable, or give another URI") from None  # fmt: skip


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
    strategy = av.strategy or trace_strategy(av.workers, layer_count(config.model))
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
    chosen = provider_of(config)
    check_job(config)  # the spec imports, cuts, feeds and scores before any process starts
    if config.provider.name == "local":  # the workers run here: a device this machine lacks is refused now
        resolve_device(config.train.device, 0)
    remote = chosen.job(config.provider.options)  # None: local worker processes
    schedule = None if config.fleet.live else job_schedule(config, planned=planner is not None)
    result = run_job(config, schedule, observer=observer, planner=planner, remote=remote)
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


def loss_scale_report(layers: Mapping[str, Mapping[str, Any]], skipped: list[int]) -> dict[str, Any]:
    """`{"loss_scale": {"final": the scale the final layers hold, "skipped_steps": [...]}}` for a job that scales its
    loss (float16), else nothing."""
    final = {scale.value for state in layers.values() if (scale := loss_scale.from_state(state)) is not None}
    if len(final) > 1:  # (every rank checks the scales agree at every step: a bug if they do not here)
        raise RuntimeError(f"the final layers hold different loss scales: {sorted(final)}")
    return {"loss_scale": {"final": final.pop(), "skipped_steps": skipped}} if final else {}


def job_report(result: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON a CLI writes: the loss per step (from `first_step`: a resumed job's first), throughput, each
    reconfiguration (kind, trigger, pause_s, bytes_moved, steps_lost, ...), each live plan, the resume point and the
    final parameter checksum."""
    keep = ("epoch", "kind", "trigger", "notice", "source", "step", "strategy", "bounds", "preempted", "lost",
            "joined", "pause_s", "hold_s", "detect_s", "bytes_moved", "steps_lost", "restore_step", "notice_to_exit_s",
            "abandoned", "prepared")  # fmt: skip
    return {
        "loss": list(result["loss"]),
        "first_step": result.get("first_step", 0),
        "resumed_from": result.get("resumed_from"),
        "throughput": dict(result["throughput"]),
        "reconfigurations": [{k: r[k] for k in keep} for r in result["reconfigurations"]],
        "plans": [dict(p) for p in result.get("plans", [])],
        "final_checksum": result["final_checksum"],
        "wall_s": result["wall_s"],
        **({"fleet": [dict(r) for r in result["fleet"]]} if "fleet" in result else {}),
        **({"fleet_history": dict(result["fleet_history"])} if "fleet_history" in result else {}),
        **({"fleet_cost": dict(result["fleet_cost"])} if "fleet_cost" in result else {}),
        **({"checkpoint_uri": dict(result["checkpoint_uri"])} if "checkpoint_uri" in result else {}),
        **({"loss_scale": dict(result["loss_scale"])} if "loss_scale" in result else {}),
        **({"validation": [dict(v) for v in result["validation"]]} if "validation" in result else {}),
        **({"best_checkpoint": result["best_checkpoint"]} if "best_checkpoint" in result else {}),
        **({"stopped_early": dict(result["stopped_early"])} if "stopped_early" in result else {}),
    }
