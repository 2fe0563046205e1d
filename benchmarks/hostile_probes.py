"""Hostile probes: bad but realistic inputs a user gives the command line, and how each checkout answers them.

The issue "Long jobs that are safe to leave running" (issue 12) tried 130 hostile inputs on main; this re-runs the
same categories as a fixed list of ~70 probes, each one subprocess `python -m parcae.cli ...` (or
`python -m parcae.settings FILE`) with its cwd a fresh temp folder and PYTHONPATH the checkout under test, so one
script compares any two trees (e.g. a `git worktree` of the commit before a change, and the working tree):

- trace files (`simulate --trace FILE`, `forecast evaluate|predict --trace FILE`): counts and timestamps too large,
  a span of 10**15 ms, NaN/inf, random bytes, Latin-1, empty, header only, a 200k-deep JSON, a year 2999;
- numeric flags: `simulate --interval-seconds 1e-6|0|-60|nan`, `--global-batch 999999999999|0`, `--look-ahead`,
  `--start-hour nan`, an empty window, `--bamboo-overhead 1.5`; `train --interval-seconds 0|nan`, `--steps 0`,
  `--workers 0`, `--seed 2**70`;
- plan JSON (`plan FILE`): 200k nested `[`, Infinity/NaN, an `interval_s` that overflows the plan, wrong types,
  missing fields, random bytes, a 50 MB file, K = 100,000, a 5000-digit integer, empty stdin;
- events and profile files (`train --events FILE`, `train --planner liveput --profile FILE --trace p3`);
- outputs (`train --json /dev/null/x/report.json`, `--out-dir` that is a file, `simulate --json|--plot` unwritable);
- resume: `--resume` on a finished 2-step job with the same, a smaller and a larger `--steps`, and the finished
  folder again without `--resume`;
- settings: `python -m parcae.settings prefect.yaml` with random bytes, and with the first `train` deployment's
  parameters set to `model: huge-gpt`, `planner: oracle`, `workers: 0`, `steps: -5` (together and one by one).

Every probe says what the right answer is: "refuse" (the input is wrong: a non-zero exit), "ok" (it must work) or
"either" (a clear refusal or a correct result). Each outcome is classified:

- traceback: "Traceback (most recent call last)" in the output (plain or typer's rich box), or a line starting with
  a Python exception's name (MemoryError, RecursionError, OverflowError, UnicodeDecodeError, ...);
- timeout: still running at the limit (60 s; the process group is killed);
- silent: exit 0 where a refusal was expected, or exit 0 with output that is not strict JSON where JSON was asked
  for (`Infinity`, `NaN`, nothing);
- clear: a non-zero exit with a short message (at most 8 lines besides log lines), no traceback, naming the file or
  the option; or, where success is right, exit 0 with valid output;
- unclear: anything else (a long message, one that names neither, a refusal of what should work, a refusal that
  came only after the job had trained, a death by signal).

Every probe is bounded: 60 s, `train` with --workers 1 and at most 3 steps, an address-space limit of 12 GiB per
probe process. Printed: per category, the counts of each class for each tree side by side; then every probe whose
class differs between trees; then every probe of the last tree that is not clear, with its message.

    python benchmarks/hostile_probes.py --tree before=/tmp/parcae-before --tree after=. [--json OUT.json]
                                        [--only CATEGORY] [--timeout 60]
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import datetime as dt
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CLASSES = ("clear", "traceback", "silent", "timeout", "unclear")
RANDOM_BYTES = random.Random(12).randbytes(4096)  # NUL bytes and invalid UTF-8, the same on every run
MAX_MESSAGE_LINES = 8
ADDRESS_SPACE = 12 * 2**30
SIM_P3 = ("--trace", "p3", "-p", "ideal", "--start-hour", "10", "--end-hour", "10.1")
TRAIN = ("--workers", "1", "--steps", "2", "--out-dir", "{d}/job")
PLAN = {"model": "gpt-1.5b", "forecast": [{"prev_available": 32}]}
README_PLAN = {"model": "gpt-1.5b", "interval_s": 60,
               "state": {"strategy": [4, 8], "migrating": False, "leftover_ms": 0},
               "forecast": [{"prev_available": 32, "events": [[0, 0, 0.7], [0, 2, 0.2], [1, 0, 0.1]]},
                            {"prev_available": 30}]}  # fmt: skip


@dataclass
class Ctx:
    """Where one probe runs: its folder `d` (the cwd), the tree under test, the environment, a per-tree cache."""

    d: Path
    tree: Path
    env: dict[str, str]
    cache: Path


@dataclass(frozen=True)
class Probe:
    category: str
    name: str
    argv: tuple[str, ...]  # after `python -m`; "{d}" is the probe's folder
    expect: str = "refuse"  # refuse | ok | either
    setup: Callable[[Ctx], None] | None = None
    names: tuple[str, ...] = ()  # a refusal is clear only if its message names one of these (case-insensitive)
    json_out: str | None = None  # "-": stdout must be strict JSON on exit 0; else a file under {d}
    stdin: bytes = b""
    late: str | None = None  # a path under {d}: if it exists after a refusal, the refusal came after the work


# ------------------------------------------------------------------------------------------------ set-ups


def write(name: str, content: bytes | str) -> Callable[[Ctx], None]:
    data = content.encode() if isinstance(content, str) else content

    def setup(ctx: Ctx) -> None:
        (ctx.d / name).write_bytes(data)

    return setup


def write_json(name: str, doc: Any) -> Callable[[Ctx], None]:
    return write(name, json.dumps(doc))


def finished_job(ctx: Ctx) -> None:
    """A finished 2-step job (checkpointed every step) in {d}/job: made once per tree, copied for each probe."""
    made = ctx.cache / "finished-job"
    if not (made / "job").exists():
        made.mkdir(parents=True, exist_ok=True)
        argv = ["parcae.cli", "train", "--workers", "1", "--steps", "2", "--checkpoint-every", "1",
                "--out-dir", "job"]  # fmt: skip
        out = run_argv(argv, made, ctx, b"", 120)
        if out["rc"] != 0:
            shutil.rmtree(made / "job", ignore_errors=True)
            raise RuntimeError(f"the 2-step job failed ({out['rc']}): {(out['stderr'] or out['stdout'])[-300:]}")
    shutil.copytree(made / "job", ctx.d / "job")


def prefect_yaml(change: Callable[[dict], None] | None = None) -> Callable[[Ctx], None]:
    """The tree's prefect.yaml beside a link to its flows/ (entrypoints resolve beside the file), the first
    `train` deployment's parameters changed by `change`."""

    def setup(ctx: Ctx) -> None:
        doc = yaml.safe_load((ctx.tree / "prefect.yaml").read_text())
        if change is not None:
            dep = next(d for d in doc["deployments"] if str(d.get("entrypoint", "")).endswith(":train"))
            change(dep.setdefault("parameters", {}))
        (ctx.d / "prefect.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        (ctx.d / "flows").symlink_to(ctx.tree / "flows")

    return setup


def both(*setups: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for s in setups:
            s(ctx)

    return setup


# ------------------------------------------------------------------------------------------------- probes


def cli(*args: str) -> tuple[str, ...]:
    return ("parcae.cli", *args)


def flag_names(flag: str) -> tuple[str, ...]:
    bare = flag.lstrip("-")
    return (flag, bare, bare.replace("-", "_"))


def trace(name: str, file: str, content: bytes | str, via: str = "simulate", expect: str = "refuse") -> Probe:
    if via == "simulate":
        argv = cli("simulate", "--trace", file, "-p", "ideal", "--json", "{d}/sim.json")
        out = "{d}/sim.json"
    elif via == "evaluate":
        argv = cli("forecast", "evaluate", "--trace", file, "--models", "persistence", "--horizon", "2",
                   "--json", "{d}/eval.json")  # fmt: skip
        out = "{d}/eval.json"
    else:
        argv = cli("forecast", "predict", "--trace", file, "--model", "persistence", "--horizon", "2")
        out = "-"
    return Probe("trace files", name, argv, expect, write(file, content), (file,), out)


def sim_flag(name: str, flag: str, *args: str) -> Probe:
    return Probe("numeric flags", name, cli("simulate", *SIM_P3, *args), names=flag_names(flag))


def train_flag(name: str, flag: str, *args: str, expect: str = "refuse") -> Probe:
    return Probe("numeric flags", name, cli("train", *TRAIN, *args), expect, names=flag_names(flag),
                 late="{d}/job/layers")  # fmt: skip


def plan(name: str, content: bytes | str | Any, *fields: str, expect: str = "refuse") -> Probe:
    setup = write("plan.json", content) if isinstance(content, (bytes, str)) else write_json("plan.json", content)
    return Probe("plan JSON", name, cli("plan", "{d}/plan.json"), expect, setup, ("plan.json", *fields), "-")


def on_demand(**params: Any) -> Callable[[dict], None]:
    return lambda p: p.update(params)


def _big_plan() -> bytes:
    body = json.dumps(PLAN).encode()
    return body[:-1] + b" " * (50 * 2**20) + b"}"  # valid JSON, 50 MiB of whitespace


def probes() -> list[Probe]:
    ok_csv = "".join(f"{i * 60000},{random.Random(i).randint(20, 32)}\n" for i in range(200))
    skypilot = lambda gap, data: json.dumps({"metadata": {"gap_seconds": gap}, "data": data})  # noqa: E731
    liveput = ("train", "--planner", "liveput", "--trace", "p3", "--workers", "1", "--steps", "2",
               "--out-dir", "{d}/job")  # fmt: skip
    resume = ("train", "--workers", "1", "--checkpoint-every", "1", "--out-dir", "{d}/job")
    settings = ("parcae.settings", "{d}/prefect.yaml")
    return [
        # ---- trace files
        trace("event CSV, ts_ms 10**30", "ts-1e30.csv", f"0,add,a\n{10**30},add,b\n"),
        trace("count CSV, count 10**19", "count-1e19.csv", f"0,1\n60000,{10**19}\n"),
        trace("count 10**19 (forecast evaluate)", "count-1e19.csv", f"0,1\n60000,{10**19}\n", via="evaluate"),
        trace("span 10**15 ms", "span-1e15.csv", f"0,1\n{10**15},2\n"),
        trace("span 10**15 ms (forecast predict)", "span-1e15.csv", f"0,1\n{10**15},2\n", via="predict"),
        trace("count NaN", "count-nan.csv", "0,1\n60000,nan\n"),
        trace("count inf", "count-inf.csv", "0,1\n60000,inf\n"),
        trace("timestamp NaN", "ts-nan.csv", "0,add,a\nnan,add,b\n"),
        trace("negative count", "count-negative.csv", "0,1\n60000,-5\n"),
        trace("random bytes", "random.bin", RANDOM_BYTES),
        trace("random bytes (forecast evaluate)", "random.bin", RANDOM_BYTES, via="evaluate"),
        trace("Latin-1, not UTF-8", "latin-1.csv", "0,1\n60000,2\n120000,3 café\n".encode("latin-1")),
        trace("empty file", "empty.csv", b""),
        trace("header only", "header-only.csv", "ts_ms,count\n"),
        trace("SkyPilot JSON, gap_seconds 1e300", "gap-1e300.json", skypilot(1e300, [1, 2])),
        trace(
            "SkyPilot JSON, 200k nested [", "deep.json", '{"metadata": {"gap_seconds": 60}, "data": ' + "[" * 200_000
        ),
        trace("GCP log, year 2999", "year-2999.txt", "2999-01-01, 00:00:00, 5\n"),
        trace("a valid count CSV (control)", "ok.csv", ok_csv, expect="ok"),
        # ---- numeric flags
        sim_flag("simulate --interval-seconds 1e-6", "--interval-seconds", "--interval-seconds", "1e-6"),
        sim_flag("simulate --interval-seconds 0", "--interval-seconds", "--interval-seconds", "0"),
        sim_flag("simulate --interval-seconds -60", "--interval-seconds", "--interval-seconds", "-60"),
        sim_flag("simulate --interval-seconds nan", "--interval-seconds", "--interval-seconds", "nan"),
        sim_flag("simulate --global-batch 999999999999", "--global-batch", "--global-batch", "999999999999"),
        sim_flag("simulate --global-batch 0", "--global-batch", "--global-batch", "0"),
        sim_flag("simulate --look-ahead 100000", "--look-ahead", "--look-ahead", "100000"),
        sim_flag("simulate --start-hour nan", "--start-hour", "--start-hour", "nan"),
        sim_flag("simulate --end-hour before --start-hour", "--end-hour", "--end-hour", "5"),
        sim_flag("simulate --bamboo-overhead 1.5", "--bamboo-overhead", "--bamboo-overhead", "1.5"),
        train_flag(
            "train --trace p3 --interval-seconds 0", "--interval-seconds", "--trace", "p3", "--interval-seconds", "0"
        ),
        train_flag(
            "train --trace p3 --interval-seconds nan",
            "--interval-seconds",
            "--trace",
            "p3",
            "--interval-seconds",
            "nan",
        ),
        Probe(
            "numeric flags",
            "train --steps 0",
            cli("train", "--workers", "1", "--steps", "0", "--out-dir", "{d}/job"),
            names=flag_names("--steps"),
        ),  # fmt: skip
        Probe(
            "numeric flags",
            "train --workers 0",
            cli("train", "--workers", "0", "--steps", "2", "--out-dir", "{d}/job"),
            names=flag_names("--workers"),
        ),  # fmt: skip
        train_flag("train --seed 2**70 (works)", "--seed", "--seed", str(2**70), expect="ok"),
        # ---- plan JSON
        plan("200k nested [", "[" * 200_000),
        plan("interval_s Infinity", json.dumps(PLAN)[:-1] + ', "interval_s": Infinity}', "interval_s"),
        plan(
            "an event's probability NaN",
            '{"model": "gpt-1.5b", "forecast": [{"prev_available": 32, "events": [[0, 0, NaN]]}]}',
            "events",
            "prob",
        ),  # fmt: skip
        plan("interval_s 1e308 (non-finite plan)", {**PLAN, "interval_s": 1e308}, "interval_s", expect="either"),
        plan("prev_available 10**23", {**PLAN, "forecast": [{"prev_available": 10**23}]}, "prev_available"),
        plan("prev_available a string", {**PLAN, "forecast": [{"prev_available": "32"}]}, "prev_available"),
        plan("forecast an object", {**PLAN, "forecast": {"prev_available": 32}}, "forecast"),
        plan("forecast missing", {"model": "gpt-1.5b"}, "forecast"),
        plan("model huge-gpt", {**PLAN, "model": "huge-gpt"}, "model", "huge-gpt"),
        plan(
            "probabilities sum to 0.5",
            {**PLAN, "forecast": [{"prev_available": 32, "events": [[0, 0, 0.5]]}]},
            "events",
            "prob",
            "sum",
        ),  # fmt: skip
        plan(
            "strategy 4x8 on 2 instances",
            {**PLAN, "state": {"strategy": [4, 8]}, "forecast": [{"prev_available": 2}]},
            "strategy",
            "prev_available",
        ),  # fmt: skip
        plan("random bytes", RANDOM_BYTES),
        plan("a 50 MB file (valid JSON)", _big_plan(), expect="either"),
        plan("K = 100,000 intervals", {**PLAN, "forecast": [{"prev_available": 32}] * 100_000}, "forecast", "K"),
        plan(
            "a 5000-digit integer", '{"model": "gpt-1.5b", "interval_s": 1' + "0" * 5000 + "}", "digits", "interval_s"
        ),  # fmt: skip
        Probe("plan JSON", "empty stdin", cli("plan"), names=("plan input", "stdin", "empty")),
        plan("the README's example (works)", README_PLAN, expect="ok"),
        # ---- events and profile files
        Probe(
            "events/profile",
            "train --events random bytes",
            cli("train", *TRAIN, "--events", "{d}/events.json"),
            setup=write("events.json", RANDOM_BYTES),
            names=("events.json",),
            late="{d}/job/layers",
        ),
        Probe(
            "events/profile",
            "train --events 200k nested [",
            cli("train", *TRAIN, "--events", "{d}/events.json"),
            setup=write("events.json", "[" * 200_000),
            names=("events.json",),
            late="{d}/job/layers",
        ),
        Probe(
            "events/profile",
            "train --events wrong fields",
            cli("train", *TRAIN, "--events", "{d}/events.json"),
            setup=write_json("events.json", [{"step": "one", "kind": "explode"}]),
            names=("events.json",),
            late="{d}/job/layers",
        ),  # fmt: skip
        Probe(
            "events/profile",
            "train --profile random bytes",
            cli(*liveput, "--profile", "{d}/profile.json"),
            setup=write("profile.json", RANDOM_BYTES),
            names=("profile.json",),
            late="{d}/job/layers",
        ),
        Probe(
            "events/profile",
            "train --profile {}",
            cli(*liveput, "--profile", "{d}/profile.json"),
            setup=write_json("profile.json", {}),
            names=("profile.json",),
            late="{d}/job/layers",
        ),
        # ---- outputs
        Probe(
            "outputs",
            "train --json /dev/null/x/report.json",
            cli("train", *TRAIN, "--json", "/dev/null/x/report.json"),
            names=("--json", "report.json"),
            late="{d}/job/layers",
        ),  # fmt: skip
        Probe(
            "outputs",
            "train --out-dir a file",
            cli("train", "--workers", "1", "--steps", "2", "--out-dir", "{d}/afile"),
            setup=write("afile", "not a folder\n"),
            names=("--out-dir", "afile"),
        ),  # fmt: skip
        Probe(
            "outputs",
            "simulate --json /dev/null/x/sim.json",
            cli("simulate", *SIM_P3, "--json", "/dev/null/x/sim.json"),
            names=("--json", "sim.json"),
        ),  # fmt: skip
        Probe(
            "outputs",
            "simulate --plot /dev/null/x/plot.png",
            cli("simulate", *SIM_P3, "--plot", "/dev/null/x/plot.png"),
            names=("--plot", "plot.png"),
        ),  # fmt: skip
        # ---- resume
        Probe(
            "resume",
            "--resume, finished job, same --steps 2",
            cli(*resume, "--steps", "2", "--resume"),
            setup=finished_job,
            names=("--resume", "--steps", "finished", "job"),
        ),
        Probe(
            "resume",
            "--resume, finished job, --steps 1",
            cli(*resume, "--steps", "1", "--resume"),
            setup=finished_job,
            names=("--resume", "--steps", "finished", "job"),
        ),
        Probe(
            "resume",
            "--resume, finished job, --steps 3 (continue)",
            cli(*resume, "--steps", "3", "--resume"),
            "either",
            finished_job,
            ("--resume", "--steps", "finished", "job"),
        ),
        Probe(
            "resume",
            "finished job's --out-dir without --resume",
            cli(*resume, "--steps", "2"),
            setup=finished_job,
            names=("--out-dir", "--resume", "job"),
        ),
        # ---- settings (prefect.yaml)
        Probe(
            "settings",
            "random-bytes prefect.yaml",
            settings,
            setup=write("prefect.yaml", RANDOM_BYTES),
            names=("prefect.yaml",),
        ),
        Probe("settings", "the project's prefect.yaml (works)", settings, "ok", prefect_yaml()),
        Probe(
            "settings",
            "huge-gpt, oracle, workers 0, steps -5",
            settings,
            setup=prefect_yaml(on_demand(model="huge-gpt", planner="oracle", workers=0, steps=-5)),
            names=("model", "planner", "workers", "steps"),
        ),
        Probe(
            "settings", "model: huge-gpt", settings, setup=prefect_yaml(on_demand(model="huge-gpt")), names=("model",)
        ),
        Probe(
            "settings", "planner: oracle", settings, setup=prefect_yaml(on_demand(planner="oracle")), names=("planner",)
        ),
        Probe("settings", "workers: 0", settings, setup=prefect_yaml(on_demand(workers=0)), names=("workers",)),
        Probe("settings", "steps: -5", settings, setup=prefect_yaml(on_demand(steps=-5)), names=("steps",)),
    ]


# --------------------------------------------------------------------------------------------- running


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_argv(argv: list[str], cwd: Path, ctx: Ctx, stdin: bytes, timeout: float) -> dict[str, Any]:
    """`python -m ARGV` in its own session; on timeout the whole process group is killed."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", *argv], cwd=cwd, env=ctx.env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=_limits)  # fmt: skip
    timed_out = False
    try:
        out, err = p.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    # workers left in the group (a refusal that forgot its children)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    return {"rc": p.returncode, "timed_out": timed_out, "wall_s": time.monotonic() - t0,
            "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}  # fmt: skip


_EXC_NAMES = sorted(n for n, v in vars(builtins).items()
                    if isinstance(v, type) and issubclass(v, BaseException) and not issubclass(v, Warning))  # fmt: skip
_EXC_LINE = re.compile(rf"^\s*(?:(?:{'|'.join(_EXC_NAMES)})\b(?::|$)|[A-Za-z_][\w]*(?:\.\w+)+(?:Error|Exception):)",
                       re.M)  # fmt: skip
_LOG_LINE = re.compile(r"^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d|\d\d:\d\d:\d\d\.\d+ \|) ")


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not _LOG_LINE.match(line)]


def _strict_json(text: str) -> str | None:
    """None if `text` is strict JSON, else why not."""

    def refuse(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError as exc:
        return f"not strict JSON ({str(exc)[:80]})"
    return None


def classify(probe: Probe, out: dict[str, Any], d: Path) -> tuple[str, str, str]:
    """(class, why, message)."""
    text = out["stdout"] + "\n" + out["stderr"]
    rc = out["rc"]
    refusal = _lines(out["stderr"]) or _lines(out["stdout"])
    message = "\n".join(refusal)
    if out["timed_out"]:
        return "timeout", f"still running after {out['wall_s']:.0f} s", message
    exc = _EXC_LINE.findall(text)
    if "Traceback (most recent call last)" in text or exc:
        last = [line.strip() for line in text.splitlines() if _EXC_LINE.match(line)] or _lines(text)[-1:]
        return "traceback", "traceback", (last[-1] if last else "")
    if rc == 0:
        if probe.expect == "refuse":
            return "silent", "exit 0 on a wrong input", message or "(no output)"
        if probe.json_out is not None:
            if probe.json_out == "-":
                why = _strict_json(out["stdout"])
            else:
                path = Path(probe.json_out.format(d=d))
                why = _strict_json(path.read_text(errors="replace")) if path.is_file() else f"no {path.name} written"
            if why:
                return "silent", f"exit 0, {why}", message
        return "clear", "ok (exit 0, valid output)", message
    if rc < 0:
        return "unclear", f"killed by signal {-rc}", message
    if probe.expect == "ok":
        return "unclear", f"exit {rc} where it should work", message
    if probe.late and Path(probe.late.format(d=d)).exists():
        return "unclear", f"refused only after the work ({Path(probe.late).name} written)", message
    if len(refusal) > MAX_MESSAGE_LINES:
        return "unclear", f"exit {rc}, {len(refusal)} lines of message", message
    low = message.lower()
    if probe.names and not any(n.lower() in low for n in probe.names):
        return "unclear", f"exit {rc}, the message names none of {', '.join(probe.names)}", message
    return "clear", f"exit {rc}, clear refusal", message


def run_tree(label: str, tree: Path, todo: list[Probe], timeout: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"hostile-probes-{label}-"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(tree), DO_NOT_TRACK="true", MLFLOW_DISABLE_TELEMETRY="true",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", COLUMNS="200",
               MLFLOW_TRACKING_URI=f"sqlite:///{root}/mlflow.db", PREFECT_HOME=str(root / "prefect-home"))  # fmt: skip
    cache = root / "cache"
    cache.mkdir()
    started = dt.datetime.now().astimezone()
    t0 = time.monotonic()
    results = []
    print(f"[{label}] {tree}: {len(todo)} probes, started {started:%Y-%m-%d %H:%M:%S %Z}", file=sys.stderr)
    for i, probe in enumerate(todo):
        d = root / f"{i:02d}"
        d.mkdir()
        ctx = Ctx(d, tree, env, cache)
        argv = [a.format(d=d) for a in probe.argv]
        try:
            if probe.setup is not None:
                probe.setup(ctx)
        except Exception as exc:  # noqa: BLE001 - a failed set-up is reported, not fatal
            cls, why, message, out = "unclear", "set-up failed", f"{type(exc).__name__}: {exc}", None
        else:
            out = run_argv(argv, d, ctx, probe.stdin, timeout)
            cls, why, message = classify(probe, out, d)
        results.append({"category": probe.category, "probe": probe.name, "class": cls, "why": why,
                        "expect": probe.expect, "exit": None if out is None else out["rc"],
                        "wall_s": None if out is None else round(out["wall_s"], 2),
                        "argv": ["python", "-m", *(a.replace(str(d), "{d}") for a in argv)],
                        "message": message.replace(str(d), "{d}")[:300]})  # fmt: skip
        print(f"[{label}] {i + 1:2d}/{len(todo)} {cls:9s} {results[-1]['wall_s'] or 0:5.1f}s  {probe.category}: "
              f"{probe.name}", file=sys.stderr)  # fmt: skip
        shutil.rmtree(d, ignore_errors=True)  # the 50 MB plan, jobs' layers
    shutil.rmtree(root, ignore_errors=True)
    return {"tree": str(tree), "git": _git(tree), "started": started.isoformat(timespec="seconds"),
            "wall_s": round(time.monotonic() - t0, 1), "results": results}  # fmt: skip


def _git(tree: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    status = git("status", "--short", "--untracked-files=no")
    return {"head": git("rev-parse", "--short", "HEAD"), "modified_files": len(status.splitlines()) if status else 0}


# ---------------------------------------------------------------------------------------------- tables


def _table(rows: list[list[str]], header: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in header + rows) for i in range(len(header[0]))]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([*(fmt(h) for h in header), sep, *(fmt(r) for r in rows)])


def summary(runs: dict[str, dict[str, Any]], todo: list[Probe]) -> str:
    labels = list(runs)
    categories = list(dict.fromkeys(p.category for p in todo))
    header = [["category", "probes"] + [(lab if c == "clear" else "") for lab in labels for c in CLASSES],
              ["", ""] + [c for _ in labels for c in CLASSES]]  # fmt: skip
    rows = []
    for cat in [*categories, "total"]:
        n = sum(1 for p in todo if cat in ("total", p.category))
        row = [cat, str(n)]
        for lab in labels:
            res = [r for r in runs[lab]["results"] if cat in ("total", r["category"])]
            row += [str(sum(r["class"] == c for r in res)) for c in CLASSES]
        rows.append(row)
    return _table(rows, header)


def differences(runs: dict[str, dict[str, Any]]) -> str:
    labels = list(runs)
    first = runs[labels[0]]["results"]
    rows = []
    for i, r in enumerate(first):
        classes = [runs[lab]["results"][i]["class"] for lab in labels]
        if len(set(classes)) > 1:
            rows.append([r["category"], r["probe"], *classes])
    if not rows:
        return "(no probe's class differs between trees)"
    return _table(rows, [["category", "probe", *labels]])


def not_clear(label: str, run: dict[str, Any]) -> str:
    bad = [r for r in run["results"] if r["class"] != "clear"]
    if not bad:
        return f"every probe of {label} is clear"
    lines = [f"not clear in {label} ({len(bad)}):"]
    for r in bad:
        msg = " | ".join(r["message"].splitlines())[:300] or "(no output)"
        lines.append(f"- [{r['class']}] {r['category']}: {r['probe']} — {r['why']}\n    {' '.join(r['argv'])}\n"
                     f"    exit {r['exit']}: {msg}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, metavar="[LABEL=]DIR",
                    help="a checkout to probe (repeatable); its code is imported through PYTHONPATH")  # fmt: skip
    ap.add_argument("--json", metavar="OUT.json", help="write every result per tree here")
    ap.add_argument("--only", action="append", metavar="CATEGORY", help="run only these categories")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per probe (default 60)")
    args = ap.parse_args()
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        ap.error("--timeout must be a positive number of seconds")

    trees: dict[str, Path] = {}
    for spec in args.tree:
        label, _, path = spec.rpartition("=")
        tree = Path(path).resolve()
        if not ((tree / "parcae" / "cli.py").is_file() or (tree / "parcae" / "cli" / "__init__.py").is_file()):
            ap.error(f"--tree {spec}: {tree} is not a parcae checkout (no parcae/cli.py or parcae/cli/)")
        trees[label or tree.name] = tree
    todo = [p for p in probes() if not args.only or p.category in args.only]
    if not todo:
        ap.error(f"--only: no probe in {args.only}")

    runs = {label: run_tree(label, tree, todo, args.timeout) for label, tree in trees.items()}
    print()
    for label, run in runs.items():
        g = run["git"]
        print(f"{label}: {run['tree']} (HEAD {g['head']}, {g['modified_files']} tracked files modified), "
              f"started {run['started']}, {run['wall_s']:.0f} s")  # fmt: skip
    print()
    print(summary(runs, todo))
    if len(runs) > 1:
        print()
        print("Probes whose class differs:")
        print(differences(runs))
    print()
    last = list(runs)[-1]
    print(not_clear(last, runs[last]))
    if args.json:
        Path(args.json).write_text(json.dumps({"probes": len(todo), "trees": runs}, indent=1) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
