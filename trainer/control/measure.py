"""Measuring a runtime profile: a `trainer.control.run.run_job` whose scripted schedule visits every strategy and
produces every migration kind, run twice — nothing prepared (the full costs the constants are fitted on), then every
migration prepared in the background (the downtime; the lead time is the difference) — turned into a
`trainer.observe.profile.RuntimeProfile`.

Owns: the schedule the job runs (`feasible_strategies`, `visit_order`, `visit_rounds`, `profile_schedule`: its docstring
describes the prologue, the visit and the final checkpoint-restart), turning the job's result into measurements
(`iteration_times`, `migrations_from_result`, `slowdown_pairs`), `measure` and the cache of measured profiles
(`profile_path`, `cached_profile`). Must not touch: processes, stores and training (`trainer.control.run` does that),
the fits (`trainer.observe.calibration`), the file format (`trainer.observe.profile`).

Iteration time of a strategy: the least over its visit epochs of `train_s / steps` (`Coordinator.epoch_spans`:
last member ready to first member arriving at the next boundary, so no migration pause is in it). The least, not
the median: on a shared machine interference only ever adds time, and one slowed epoch out of two would otherwise
decide near-ties between strategies. The first step after a migration stays in (the store keeps only an epoch's
bounds); a check with per-step timestamps found it within the step-to-step noise on tiny-gpt, except the job's very
first step, which falls in the prologue and is never used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from liveput import CostModel, Strategy, ThroughputProfile, strategy_key
from trainer.config import model_entry
from trainer.observe.calibration import RESTART, Migration, calibrate, fit_slowdown, split_lead_down
from trainer.observe.profile import ProfileError, RuntimeProfile, max_stages, runtime_spec

PROLOGUE_PREEMPT_STEP = 2  # the preemption with notice; the add follows one step later
LAYER_MS_SOURCE = (
    "forward + backward of one micro-batch per layer, one thread, median of 5 after a warm-up "
    "(trainer.observe.layer_times); the stages of the profile's job were cut by these times"
)
TOO_FEW = "workers must be >= 2 to measure migrations (an instance must leave and join), got {}"


def feasible_strategies(workers: int, n_layers: int, global_batch: int) -> list[Strategy]:
    """Every (D, P) with D * P <= workers, P <= max_stages(n_layers), D <= global_batch."""
    return [(d, p) for p in range(1, max_stages(n_layers) + 1) for d in range(1, global_batch + 1) if d * p <= workers]


def visit_order(strategies: Iterable[Strategy]) -> list[Strategy]:
    """The order the profile visits `strategies` in, so that the visit also produces every migration kind.

    The smallest P first with D descending (intra-stage migrations with distinct group counts), then each larger P
    with D ascending (a pipeline migration into it, then inter-stage ones). If that has no inter-stage pair, the
    first P group is re-entered one replica up after its descent. If the visit changed P, it ends with a pipeline
    migration back to its first strategy, so that every P is entered by a pipeline migration.
    """
    by_p: dict[int, list[int]] = {}
    for d, p in sorted(set(strategies)):
        by_p.setdefault(p, []).append(d)
    if not by_p:
        raise ProfileError("no strategy to visit")
    ps = sorted(by_p)
    order = [(d, ps[0]) for d in sorted(by_p[ps[0]], reverse=True)]
    for p in ps[1:]:
        order += [(d, p) for d in sorted(by_p[p])]
    if not any(a[1] == b[1] and b[0] > a[0] for a, b in zip(order, order[1:])):
        first = sorted(by_p[ps[0]])
        if len(first) >= 2:
            order.insert(len(first), (first[1], ps[0]))
    if len(ps) > 1 and order[-1] != order[0]:
        order.append(order[0])
    return order


def visit_rounds(order: Sequence[Strategy], rounds: int) -> list[Strategy]:
    """`order` visited `rounds` times in a row; a round that would start where the previous one ended (a visit that
    returns to its first strategy) starts one strategy later, so no plan repeats the strategy in force."""
    if rounds < 1:
        raise ProfileError(f"rounds must be >= 1, got {rounds}")
    out = list(order)
    for _ in range(rounds - 1):
        out += list(order[1:]) if out[-1] == order[0] else list(order)
    return out


@dataclass(frozen=True)
class ProfileSchedule:
    """The profile job: where it starts, its events (`trainer.control.events` format), its length, and where its parts
    are."""

    initial: Strategy
    events: tuple[dict[str, Any], ...]
    steps: int
    visit: tuple[Strategy, ...]
    main_start: int  # the first step of the visit (the add's step)
    restart_step: int


def profile_schedule(
    workers: int, visit: Sequence[Strategy], steps_per_strategy: int, global_batch: int
) -> ProfileSchedule:
    """The prologue (preempt with notice, then add), the visit, a checkpoint-restart, one last step.

    One job, `workers` processes, three parts:

    * prologue — start at W x 1 (W = workers, capped at the global batch); at step 2 the last member is preempted with
      notice (W-1 x 1, an intra-stage migration); at step 3 one instance is added and the job moves to the first
      strategy of the visit. The added process is started when the schedule reaches the add, right after the
      preemption's epoch is published, so the time from that publication to the add's epoch being published is the
      start-to-join time of a new instance (`rendezvous_ms`). Its start-up competes for the CPU with training, so the
      prologue's epochs and the preemption's pause are reported but not used for throughput or fits.
    * visit — every strategy for `steps_per_strategy` steps, ordered P = 1 first with D descending (each step an
      intra-stage migration with fewer groups), then every larger P with D ascending (pipeline migration into the P,
      then inter-stage migrations as replicas are added); an inter-stage revisit is inserted when no such pair exists,
      and a last pipeline migration returns to the first strategy so that every P is entered by a pipeline migration.
    * a checkpoint-restart at the end (every process exits and a fresh one loads the checkpoint), then one step.
    """
    if workers < 2:
        raise ProfileError(TOO_FEW.format(workers))
    if steps_per_strategy < 1:
        raise ProfileError(f"steps_per_strategy must be >= 1, got {steps_per_strategy}")
    d0 = min(workers, global_batch)
    if tuple(visit[0]) == (d0 - 1, 1):
        raise ProfileError(f"the visit cannot start at {d0 - 1}x1, the strategy the prologue's preemption leaves: the "
                           f"add would change nothing; include {d0}x1 or start elsewhere")  # fmt: skip
    s = PROLOGUE_PREEMPT_STEP
    events: list[dict[str, Any]] = [
        {"step": s, "kind": "preempt", "instances": [d0 - 1], "notice": True},
        {"step": s, "kind": "plan", "strategy": [d0 - 1, 1]},
        {"step": s + 1, "kind": "add", "workers": 1},
        {"step": s + 1, "kind": "plan", "strategy": list(visit[0])},
    ]
    s += 1
    main_start = s
    for strategy in visit[1:]:
        s += steps_per_strategy
        events.append({"step": s, "kind": "plan", "strategy": list(strategy)})
    s += steps_per_strategy
    events.append({"step": s, "kind": "checkpoint-restart"})
    return ProfileSchedule((d0, 1), tuple(events), s + 1, tuple(visit), main_start, s)


# ------------------------------------------------------------------------------------------------ measurements


def iteration_times(epochs: Sequence[Mapping[str, Any]], first_step: int) -> dict[Strategy, list[float]]:
    """ms per step of every epoch that starts at or after `first_step` and has a measured span, by strategy."""
    out: dict[Strategy, list[float]] = {}
    for e in epochs:
        steps = e["end_step"] - e["start_step"]
        if e["start_step"] < first_step or e["train_s"] is None or steps < 1:
            continue
        out.setdefault((int(e["strategy"][0]), int(e["strategy"][1])), []).append(1000.0 * e["train_s"] / steps)
    return out


def _party_bytes(epoch: Any, layer_bytes: Sequence[int]) -> int:
    """Bytes the busiest transfer party of `epoch` sends plus receives."""
    load: dict[int, int] = {}
    for t in epoch.transfers:
        for w in (t.src, t.dst):
            load[w] = load.get(w, 0) + layer_bytes[t.layer]
    return max(load.values(), default=0)


def migrations_from_result(result: Mapping[str, Any], planned: Sequence[Any], schedule: ProfileSchedule,
                           state_bytes: Callable[[int], Sequence[int]]) -> list[Migration]:  # fmt: skip
    """The job's reconfiguration records as `Migration`s, checked against the planned epochs (`check_schedule`);
    `state_bytes(step)` gives the bytes per layer of a migration before `step`."""
    by_number = {e.number: e for e in planned}
    spans = {e["epoch"]: e for e in result["epochs"]}
    add_step = schedule.main_start
    out = []
    for r in result["reconfigurations"]:
        n = r["epoch"]
        plan, prev = by_number.get(n), by_number.get(n - 1)
        if plan is None or prev is None or plan.kind.value != r["kind"] or list(r["strategy"]) != [plan.D, plan.P]:
            raise ProfileError(f"epoch {n} ({r['kind']} to {r['strategy']}) is not the planned one: the job did not "
                               "follow the profile's schedule")  # fmt: skip
        if r["pause_s"] is None:  # its members never got ready: a death or a timeout broke it (the job then trained on
            # in a recovery epoch that the schedule does not have)
            trouble = [e for e in result.get("events", []) if e.get("event") in ("dead", "recover")]
            raise ProfileError(f"epoch {n} ({r['kind']} to {r['strategy']}) broke before any of its members was ready"
                               f"{f' ({trouble[0]})' if trouble else ''}: the profile needs its schedule undisturbed; "
                               "run it again, on a quieter machine")  # fmt: skip
        phases = {k.removesuffix("_s") + "_ms": 1000.0 * v for k, v in r["phases_s"].items()}
        role = "main"
        if r["kind"] == RESTART:
            role = "restart"
        elif r["step"] == add_step:
            role = "add"
        elif r["preempted"]:
            role = "preempt"
        join_ms = None
        if role == "add":
            join_ms = 1000.0 * (spans[n]["decided_at"] - spans[n - 1]["decided_at"])
        survivors = tuple(
            sum(1 for w, (s, _) in prev.assignment.items() if s == k and w not in plan.preempted) for k in range(prev.P)
        )
        xfer = r["phases_s"].get("transfer_s")
        out.append(Migration(
            epoch=n, step=r["step"], kind=r["kind"], src=(prev.D, prev.P), dst=(plan.D, plan.P),
            pause_ms=1000.0 * r["pause_s"], role=role, add=role == "add", hold_ms=1000.0 * r["hold_s"],
            join_ms=join_ms, transfer_ms=1000.0 * xfer if plan.transfers and xfer is not None else None,
            transfer_bytes=_party_bytes(plan, state_bytes(plan.start_step)), bytes_moved=int(r["bytes_moved"]),
            survivors=survivors, phases_ms=phases, prepared=bool(r.get("prepared")),
        ))  # fmt: skip
    return out


def slowdown_pairs(full: Sequence[Mapping[str, Any]], prepared: Sequence[Mapping[str, Any]],
                   prepared_next: set[int], first_step: int) -> list[tuple[float, float]]:  # fmt: skip
    """(ms its last step took unprepared, ms longer it took prepared) of every visit epoch measured in both runs
    (`full`, `prepared`: their `epoch_spans`) whose next epoch was prepared during that last step (`prepared_next`:
    epoch numbers). The last step alone, and only of epochs of two steps or more: an epoch's whole time also holds
    its first step after a migration, warmer or colder in one run than in the other, and the noise of every other
    step (on a shared machine, more than a preparation costs)."""
    by_number = {e["epoch"]: e for e in prepared}
    out = []
    for e in full:
        q = by_number.get(e["epoch"])
        steps = e["end_step"] - e["start_step"]
        if (q is None or e["start_step"] < first_step or steps < 2 or e["epoch"] + 1 not in prepared_next
                or e.get("last_step_s") is None or q.get("last_step_s") is None):  # fmt: skip
            continue
        out.append((1000.0 * e["last_step_s"], 1000.0 * (q["last_step_s"] - e["last_step_s"])))
    return out


# ------------------------------------------------------------------------------------------------ measure (I/O)


def machine_info(start_method: str) -> dict[str, Any]:
    import torch

    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "cpu_count": os.cpu_count(), "usable_cores": usable, "torch_threads_per_worker": 1,
        "start_method": start_method, "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__,
    }  # fmt: skip


def device_label(device: Any) -> str:
    """A resolved torch device in words: "cpu", or "cuda (<the GPU's name>)"."""
    import torch

    if device.type != "cuda":
        return str(device.type)
    return f"cuda ({torch.cuda.get_device_name(device)})"


def measure(
    model: str = "tiny-gpt",
    workers: int = 4,
    *,
    steps_per_strategy: int = 6,
    rounds: int = 2,
    strategies: Iterable[Strategy] | None = None,
    seed: int = 0,
    model_args: Mapping[str, Any] | None = None,
    out_dir: str | os.PathLike[str],
    progress: Callable[[str], None] | None = None,
    start_method: str = "spawn",
    timeout_s: float = 300.0,
    command: str = "",
    device: str = "cpu",
) -> RuntimeProfile:
    """Measure the runtime profile of `model` on `workers` local processes in two jobs of one schedule (see the module
    docstring).

    `strategies`: the (D, P) to visit (default: every feasible one), `rounds` times (`visit_rounds`); `out_dir`: a fresh
    folder for the first job's files (the prepared job's go beside it, in `<out_dir>-prepared`); `progress(message)` is
    told what is happening; `start_method`: how worker processes start ("spawn" is cold, as a real new instance or
    restart; "forkserver" is a warm pool and makes rendezvous and restarts cheap); `device`: where the workers train
    (`TrainConfig.device`: "cpu", "cuda", or "auto", CUDA where it exists), as the jobs that plan with the profile
    will — a GPU job's iteration times and pauses are not a CPU's.
    """
    from trainer.config import (
        CheckpointConfig,
        ControlPlaneConfig,
        JobConfig,
        ProviderConfig,
        TrainConfig,
        model_config,
    )
    from trainer.control.dry_run import check_schedule
    from trainer.control.events import Schedule, group_events, parse_events
    from trainer.control.run import run_job
    from trainer.observe.layer_times import layer_times
    from trainer.runtime.devices import resolve_device
    from trainer.runtime.migration import layer_sizes
    from trainer.runtime.model import n_layers as layer_count
    from trainer.runtime.trainspec import check_job

    if workers < 2:
        raise ProfileError(TOO_FEW.format(workers))
    say = progress or (lambda _msg: None)
    where = resolve_device(device, 0)  # a device this machine lacks is refused before anything runs
    mcfg = model_config(model, seed=seed, **dict(model_args or {}))
    # the spec's own batch size (the built-in GPTs': TrainConfig's), checked before any process starts
    batch = check_job(JobConfig(out_dir=str(out_dir), model=mcfg, train=TrainConfig(seed=seed)),
                      batch_given=False).train.global_batch  # fmt: skip
    n_layers = layer_count(mcfg)
    feasible = feasible_strategies(workers, n_layers, batch)
    if strategies is None:
        chosen = feasible
    else:
        chosen = [(int(d), int(p)) for d, p in strategies]
        bad = [s for s in chosen if s not in feasible]
        if bad:
            d, p = bad[0]
            raise ProfileError(f"strategy {d}x{p} is not feasible on {workers} workers with {n_layers} layers "
                               f"(feasible: {', '.join(f'{a}x{b}' for a, b in feasible)})")  # fmt: skip
    order = visit_rounds(visit_order(chosen), rounds)
    sched = profile_schedule(workers, order, steps_per_strategy, batch)
    # (a spec's validation is not scored: its time is no migration's and no strategy's)
    tcfg = TrainConfig(seed=seed, steps=sched.steps, global_batch=batch, device=device, validate=False)
    t0 = time.monotonic()
    # the stages are cut by measured time, in the profile's job as in the jobs that plan with it: the iteration
    # times it records are those of the cut they will train with
    say(f"timing {model}'s layers")
    layer_ms = layer_times(mcfg, tcfg)
    tcfg = dataclasses.replace(tcfg, stage_costs=layer_ms)

    def run(prepare: bool, folder: Path) -> dict[str, Any]:
        job = JobConfig(out_dir=str(folder), model=mcfg, train=tcfg, checkpoint=CheckpointConfig(every=0),
                        control=ControlPlaneConfig(timeout_s=timeout_s, prepare=prepare),
                        provider=ProviderConfig(start_method=start_method, max_processes=workers))  # fmt: skip
        return run_job(job, Schedule(workers=workers, strategy=sched.initial, events=list(sched.events)))

    # the full costs first (nothing prepared: what the reference's decomposition describes, and what the constants
    # are fitted on), then the same schedule prepared in the background (its pauses are the downtime)
    say(f"profiling {model} on {workers} workers: {len(set(order))} strategies, {sched.steps} steps, nothing prepared")
    result = run(False, Path(out_dir))
    say(f"profiling {model} again, its migrations prepared in the background")
    prepared_result = run(True, Path(out_dir).with_name(Path(out_dir).name + "-prepared"))
    wall = time.monotonic() - t0
    say("fitting the cost model")
    planned = check_schedule(mcfg, tcfg, workers, sched.initial, sched.steps, group_events(parse_events(sched.events)))
    sizes = layer_sizes(mcfg)
    migrations = migrations_from_result(result, planned, sched, sizes.state_bytes)
    prepared = migrations_from_result(prepared_result, planned, sched, sizes.state_bytes)
    step_ms = iteration_times(result["epochs"], sched.main_start)
    missing = sorted(set(order) - set(step_ms))
    if missing:
        raise ProfileError(f"no iteration time measured for {', '.join(f'{d}x{p}' for d, p in missing)}")
    spec = runtime_spec(mcfg, tcfg.micro_batch)
    created = datetime.now(UTC).isoformat(timespec="seconds")
    machine = {**machine_info(start_method), "device": device_label(where)}
    label = f"parcae profile {created}: {model}, {workers} workers, {machine['usable_cores']} cores, {start_method}"
    throughput = ThroughputProfile(
        model=model, global_batch=tcfg.global_batch, micro_batch=tcfg.micro_batch,
        iteration_ms={s: min(v) for s, v in step_ms.items()}, min_p=1,
        source=f"{label}: least over the strategy's epochs of ms per step ({rounds} round(s) of the visit, "
               f"{steps_per_strategy} steps each)",
    )  # fmt: skip
    constants, fit = calibrate(spec, migrations, {p for _, p in throughput.iteration_ms}, label)
    split = split_lead_down(CostModel(spec, constants), migrations, prepared)
    prepared_next = {m.epoch for m in prepared if m.prepared}
    slowdown, slowdown_how = fit_slowdown(
        slowdown_pairs(result["epochs"], prepared_result["epochs"], prepared_next, sched.main_start)
    )
    measured = {
        "machine": machine,
        "job": {"model": model, "workers": workers, "steps": sched.steps, "steps_per_strategy": steps_per_strategy,
                "rounds": rounds, "seed": seed, "global_batch": tcfg.global_batch, "micro_batch": tcfg.micro_batch,
                "device": device, "device_type": where.type,
                "visit": [list(s) for s in order], "events": list(sched.events), "wall_s": wall,
                "loss_first_last": [result["loss"][0], result["loss"][-1]]},  # fmt: skip
        "layer_ms": list(layer_ms),
        "layer_ms_source": LAYER_MS_SOURCE,
        "step_ms": {strategy_key(s): v for s, v in sorted(step_ms.items(), key=lambda kv: (kv[0][1], kv[0][0]))},
        "warmup": "the first step after a migration is included (the store keeps epoch bounds only); the prologue, "
                  "with the job's first step, is excluded",
        "epochs": result["epochs"],
        "migrations": [m.to_dict() for m in migrations],
        "fit": fit["rows"],
        "calibration": {k: v for k, v in fit.items() if k != "rows"},
        "prepared": {"migrations": [m.to_dict() for m in prepared], "epochs": prepared_result["epochs"],
                     "split": split["rows"], "kinds": split["kinds"], "slowdown": slowdown,
                     "slowdown_source": slowdown_how,
                     "loss_first_last": [prepared_result["loss"][0], prepared_result["loss"][-1]]},
    }  # fmt: skip
    measured = json.loads(json.dumps(measured))  # plain JSON data, as `load` gives it back
    return RuntimeProfile(throughput, constants, spec, measured, created,
                          command or f"trainer.observe.profile.measure({model!r}, {workers}, steps_per_strategy="
                                     f"{steps_per_strategy}, rounds={rounds}, seed={seed}, "
                                     f"start_method={start_method!r})")  # fmt: skip


def profile_path(model: str, workers: int, runs: str | os.PathLike[str] = "runs",
                 model_args: Mapping[str, Any] | None = None, device_type: str = "cpu") -> Path:  # fmt: skip
    """Where a measured profile of ``model`` (with ``model_args``) on ``workers`` processes is cached:
    ``runs/profile-<model>-<workers>.json``; a ``module:function`` or a file path becomes a file-name-safe slug,
    args add a digest of themselves (another shape is another profile; a registered model's args that are its
    defaults do not: a job's config holds them all), and a GPU profile ends in ``-cuda``."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", model).strip("_.") or "model"
    entry = model_entry(model)
    defaults = {} if entry is None else entry.args
    shape = {k: v for k, v in (model_args or {}).items() if k not in defaults or defaults[k] != v}
    if shape:
        slug += "-" + hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:8]
    suffix = "" if device_type == "cpu" else f"-{device_type}"
    return Path(runs) / f"profile-{slug}-{workers}{suffix}.json"


def cached_profile(
    model: str, workers: int, path: str | os.PathLike[str] | None = None, *,
    progress: Callable[[str], None] | None = None, model_args: Mapping[str, Any] | None = None,
    device: str = "cpu",
) -> tuple[RuntimeProfile, str]:  # fmt: skip
    """The runtime profile at ``path`` (default `profile_path`) and where it came from; measured now (one job of
    ``workers`` processes on ``device``, under a minute for tiny-gpt) and written there when the file does not
    exist, so the next job reuses it. A file that is not a profile raises `ProfileFormatError` naming it."""
    from trainer.runtime.devices import device_type

    kind = device_type(device)  # (`measure` refuses a device this machine lacks)
    target = Path(path) if path else profile_path(model, workers, model_args=model_args, device_type=kind)
    if target.is_file():
        return RuntimeProfile.load(target), f"loaded {target}"
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.stem}-", dir=target.parent))
    try:
        profile = measure(model, workers, out_dir=scratch / "job", progress=progress, model_args=model_args,
                          device=device)  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    profile.to_json(target)
    return profile, f"measured now, cached in {target}"
