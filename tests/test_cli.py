"""Tests of the ``parcae`` command line (parcae.cli): simulate, plan, traces, and user errors.

Everything runs on the bundled p3 trace and files written into tmp_path; the shared traces folder is
pointed at an empty location so the results do not depend on ../shared being present.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from liveput.policies import POLICY_NAMES
from liveput.throughput import load_profile
from parcae.cli import app, format_migrations, results_tables

SUMMARY_KEYS = {
    "samples",
    "throughput",
    "cost_usd",
    "cost_per_million_samples",
    "instance_hours",
    "migration_s",
    "migrations",
    "decision_ms_median",
}

PLAN_INPUT = {
    "model": "gpt-1.5b",
    "interval_s": 60,
    "state": {"strategy": [0, 0], "migrating": False, "leftover_ms": 0},
    "forecast": [
        {"prev_available": 32},
        {"prev_available": 32, "events": [[0, 2, 0.3], [0, 0, 0.7]]},
        {"prev_available": 31, "events": [[2, 0, 0.5], [0, 1, 0.5]]},
        {"prev_available": 31},
    ],
}


@pytest.fixture(autouse=True)
def _no_shared_traces(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PARCAE_SHARED_TRACES", str(tmp_path_factory.mktemp("no-shared") / "absent"))


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner: CliRunner, *args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input)


def assert_user_error(result, *needles: str) -> None:
    """Exit 2, ``error: ...`` on stderr naming every needle, and no traceback anywhere."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("error: "), result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    assert "Traceback" not in result.output


# ------------------------------------------------------------------------------------------- simulate


def test_parcae_says_its_version_and_offers_shell_completion(runner):
    from importlib.metadata import version

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output == f"parcae {version('parcae')}\n"
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0 and "--install-completion" in res.output and "--version" in res.output


def test_quiet_keeps_results_and_errors_verbose_logs_and_no_color_is_honoured(runner):
    import logging
    import os
    import subprocess
    import sys

    predict = ["forecast", "predict", "--model", "persistence", "--at", "600", "--horizon", "3"]
    loud, quiet = runner.invoke(app, predict), runner.invoke(app, ["-q", *predict])
    assert loud.exit_code == quiet.exit_code == 0, (loud.output, quiet.output)
    assert "forecast of p3 after interval 600" in loud.stderr and quiet.stderr == ""
    assert quiet.stdout == loud.stdout and json.loads(quiet.stdout)["model"] == "persistence"
    assert_user_error(runner.invoke(app, ["-q", "simulate", "--trace", "nope"]), "unknown trace 'nope'")
    assert_user_error(runner.invoke(app, ["-q", "-v", "traces"]), "--quiet and --verbose contradict")
    names = ("parcae", "trainer", "forecasting", "liveput", "tracking")
    before = {n: (logging.getLogger(n).level, list(logging.getLogger(n).handlers)) for n in names}
    try:
        assert runner.invoke(app, ["-v", "traces"]).exit_code == 0
        assert logging.getLogger("trainer").getEffectiveLevel() == logging.INFO
    finally:  # the rest of the suite logs as it did
        for n, (level, handlers) in before.items():
            logging.getLogger(n).setLevel(level)
            logging.getLogger(n).handlers[:] = handlers
    # colour: red errors on a (forced) terminal, none under NO_COLOR (rich reads it)
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    argv = [sys.executable, "-m", "parcae.cli", "simulate", "--trace", "nope"]
    red = subprocess.run(argv, env={**env, "FORCE_COLOR": "1"}, capture_output=True, text=True)
    plain = subprocess.run(argv, env={**env, "FORCE_COLOR": "1", "NO_COLOR": "1"}, capture_output=True, text=True)
    assert "\x1b[" in red.stderr and "\x1b[" not in plain.stderr and "error: unknown trace" in plain.stderr


def test_simulate_writes_json_plot_and_table(runner, tmp_path):
    out_json = tmp_path / "nested" / "run.json"
    out_png = tmp_path / "plots" / "run.png"
    result = invoke(
        runner,
        "simulate",
        "--trace",
        "p3",
        "--start-hour",
        "10",
        "--end-hour",
        "10.5",
        "-p",
        "ideal",
        "--policy",
        "reactive",
        "-p",
        "parcae",
        "--json",
        str(out_json),
        "--plot",
        str(out_png),
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out_json.read_text())
    assert set(doc) == {"trace", "model", "window", "look_ahead", "migrations", "policies"}
    assert doc["trace"] == "p3"
    assert doc["model"] == "gpt-1.5b"
    assert doc["look_ahead"] == 8
    assert doc["window"] == {"first_interval": 600, "last_interval": 629}
    assert list(doc["policies"]) == ["ideal", "reactive", "parcae"]
    for summary in doc["policies"].values():
        assert set(summary) == SUMMARY_KEYS
    pol = doc["policies"]
    assert pol["ideal"]["samples"] > pol["reactive"]["samples"] > 0
    assert pol["ideal"]["migrations"] == {} and pol["ideal"]["decision_ms_median"] is None
    assert pol["parcae"]["decision_ms_median"] > 0
    assert pol["reactive"]["migrations"]["start"] == 1.0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    header, *table = result.stdout.splitlines()
    assert header.startswith("trace p3: intervals 600-629 (30 x 60 s, hours 10.00-10.50), model gpt-1.5b, K=8")
    assert "prices as of 20" in header
    text = "\n".join(table)
    for column in (
        "policy",
        "samples",
        "vs ideal",
        "samples/s",
        "instance-h",
        "cost $",
        "$/M samples",
        "migration s",
        "planner ms",
        "migrations",
    ):
        assert column in text
    ideal_row = next(line for line in table if line.split() and line.split()[0] == "ideal")
    assert "1.000" in ideal_row
    # the progress bar goes to stderr, never into the table
    assert "simulated 3 policies x 30 intervals" in result.stderr


def test_simulate_defaults_to_every_policy(runner):
    result = invoke(runner, "simulate", "--start-hour", "10", "--end-hour", "10.25", "--look-ahead", "2")
    assert result.exit_code == 0, result.output
    names = [line.split()[0] for line in result.stdout.splitlines()[1:] if line.split()]
    for name in POLICY_NAMES:
        assert name in names
    assert "K=2" in result.stdout.splitlines()[0]


def test_vs_ideal_without_running_ideal(runner, tmp_path):
    out = tmp_path / "r.json"
    result = invoke(
        runner, "simulate", "--start-hour", "10", "--end-hour", "10.25", "-p", "reactive", "--json", str(out)
    )
    assert result.exit_code == 0, result.output
    assert list(json.loads(out.read_text())["policies"]) == ["reactive"]  # the bound is not added to the JSON
    row = next(line for line in result.stdout.splitlines() if line.split() and line.split()[0] == "reactive")
    ratio = float(row.split()[2])
    assert 0 < ratio < 1


def test_simulate_prepares_migrations_with_the_trace_s_cloud_s_notice_unless_told_otherwise(runner, tmp_path):
    window = ("simulate", "--start-hour", "8", "--end-hour", "8.5", "-p", "parcae", "-p", "ideal")
    docs = {}
    for name, extra in {"aws": (), "gcp": ("--notice-seconds", "30"), "none": ("--notice-seconds", "0"),
                        "full": ("--full-stop",)}.items():  # fmt: skip
        out = tmp_path / f"{name}.json"
        result = invoke(runner, *window, *extra, "--json", str(out))
        assert result.exit_code == 0, result.output
        docs[name] = json.loads(out.read_text())
        assert f"migrations: {docs[name]['migrations']['summary']}" in " ".join(result.stdout.split())
    assert docs["aws"]["migrations"]["notice_s"] == 120.0  # p3 is an AWS trace
    assert docs["aws"]["migrations"]["prepared"] == ["addition", "notice", "planned"]
    assert docs["none"]["migrations"]["notice_s"] == 0.0
    assert docs["full"]["migrations"]["prepared"] == []
    samples = {k: d["policies"]["parcae"]["samples"] for k, d in docs.items()}
    assert samples["aws"] >= samples["gcp"] >= samples["none"] > samples["full"]
    assert len({d["policies"]["ideal"]["samples"] for d in docs.values()}) == 1  # the bound prepares nothing
    gcp = tmp_path / "gcp-v100.json"
    result = invoke(runner, "simulate", "--trace", "gcp-v100", "--start-hour", "1", "--end-hour", "1.25", "-p",
                    "ideal", "--json", str(gcp))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(gcp.read_text())["migrations"]["notice_s"] == 30.0


def _measured_profile(path, measured):
    """A tiny-gpt runtime profile as `parcae profile` writes one (test input): 2x1 the fastest of three strategies."""
    from liveput import CostConstants, ThroughputProfile
    from trainer import RuntimeProfile
    from trainer.observe.profile import runtime_spec

    throughput = ThroughputProfile("tiny-gpt", 16, 2, {(1, 1): 100.0, (2, 1): 60.0, (1, 2): 80.0}, source="test")
    constants = CostConstants(group_mode="groups", build_ms={1: 50.0, 2: 50.0})
    RuntimeProfile(throughput, constants, runtime_spec("tiny-gpt"), measured, "", "test input").to_json(path)
    return path


def test_simulate_runs_on_a_measured_runtime_profile(runner, tmp_path):
    """--profile: the runtime's own iteration times and cost model, prepared migrations slowed by the slowdown the
    profile measured; a profile without that measurement is named (and still simulates the full stop)."""
    window = ("simulate", "--start-hour", "8", "--end-hour", "8.5", "-p", "parcae", "-p", "ideal")
    prof = _measured_profile(tmp_path / "profile.json", {"prepared": {"slowdown": 0.25}})
    docs = {}
    for name, extra in {"prepared": (), "full": ("--full-stop",)}.items():
        out = tmp_path / f"{name}.json"
        result = invoke(runner, *window, "--profile", str(prof), *extra, "--json", str(out))
        assert result.exit_code == 0, result.output
        docs[name] = json.loads(out.read_text())
    assert docs["prepared"]["model"] == "tiny-gpt" and "tiny-gpt" in result.stdout
    assert docs["prepared"]["migrations"]["slowdown"] == 0.25 and docs["prepared"]["migrations"]["notice_s"] == 120.0
    assert docs["full"]["migrations"]["prepared"] == []
    # two instances at most are used (2x1, the profile's fastest): ideal trains 60 ms steps whenever two are alive
    assert docs["prepared"]["policies"]["ideal"]["samples"] == docs["full"]["policies"]["ideal"]["samples"] > 0
    parcae = {k: d["policies"]["parcae"]["samples"] for k, d in docs.items()}
    assert docs["prepared"]["policies"]["ideal"]["samples"] >= parcae["prepared"] >= parcae["full"] > 0
    old = _measured_profile(tmp_path / "old.json", {})
    assert_user_error(invoke(runner, *window, "--profile", str(old)), str(old), "measured.prepared.slowdown",
                      "--full-stop")  # fmt: skip
    assert invoke(runner, *window, "--profile", str(old), "--full-stop").exit_code == 0
    assert_user_error(invoke(runner, *window, "--profile", str(prof), "--global-batch", "32"), "--global-batch 32",
                      "global batch 16")  # fmt: skip
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert_user_error(invoke(runner, *window, "--profile", str(bad)), str(bad), "format")


def test_format_migrations():
    assert format_migrations({"inter-stage": 1.44, "pipeline": 4.0, "start": 1.0}) == (
        "pipeline 4, inter-stage 1.44, start 1"
    )
    assert format_migrations({"redundancy-failover": 2.8889, "checkpoint-restart": 0.1111}) == (
        "redundancy-failover 2.89, checkpoint-restart 0.11"
    )
    assert format_migrations({}) == "-"


def test_tables_split_on_narrow_consoles():
    from types import SimpleNamespace

    r = SimpleNamespace(
        samples=100237.9,
        throughput=27.84,
        instance_hours=14.63,
        cost_usd=8.96,
        cost_per_million_samples=89.34,
        migration_s=112.1,
        decision_ms_median=1.1,
        migrations={"pipeline": 3.0, "inter-stage": 0.933, "start": 1.0},
    )
    results = {"parcae-oracle": r, "ideal": r}
    assert len(results_tables(results, 103787.7, 250)) == 1
    narrow = results_tables(results, 103787.7, 80)
    assert len(narrow) >= 2
    assert all(t.columns[0].header == "policy" for t in narrow)
    assert sum(len(t.columns) - 1 for t in narrow) == 9  # every column exactly once besides policy


# ----------------------------------------------------------------------------------------------- plan


def _check_plan(out: dict, doc: dict) -> None:
    assert out["model"] == doc["model"]
    assert out["look_ahead"] == len(doc["forecast"])
    assert len(out["steps"]) == len(doc["forecast"])
    d, p = out["decision"]
    assert out["steps"][0]["strategy"] == [d, p]
    assert load_profile(doc["model"]).is_feasible(d, p)
    assert d * p <= doc["forecast"][0]["prev_available"]
    assert out["expected_samples"] > 0
    assert "decision_ms" not in out


def test_plan_from_file_and_stdin(runner, tmp_path):
    path = tmp_path / "in.json"
    path.write_text(json.dumps(PLAN_INPUT))
    from_file = invoke(runner, "plan", str(path))
    assert from_file.exit_code == 0, from_file.output
    _check_plan(json.loads(from_file.stdout), PLAN_INPUT)
    from_stdin = invoke(runner, "plan", input=json.dumps(PLAN_INPUT))
    assert from_stdin.exit_code == 0, from_stdin.output
    dash = invoke(runner, "plan", "-", input=json.dumps(PLAN_INPUT))
    assert from_file.stdout == from_stdin.stdout == dash.stdout


def test_plan_draws_the_example_plan(runner, tmp_path):
    """examples/plan.json, as Concepts draws it: the plan (the story the page tells) and its figure; an unknown
    image format is refused before planning."""
    example = str(Path(__file__).parents[1] / "examples" / "plan.json")
    out = tmp_path / "plan.png"
    result = invoke(runner, "plan", example, "--plot", str(out))
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert [s["strategy"] for s in plan["steps"]] == [[4, 8], [4, 8], [4, 8], [2, 13]]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = invoke(runner, "plan", example, "--plot", str(tmp_path / "plan.xyz"))
    assert bad.exit_code == 2 and "unknown image format" in bad.output


def test_plan_is_deterministic(runner):
    doc = {**PLAN_INPUT, "state": {"strategy": [2, 8], "migrating": True, "leftover_ms": 5000}}
    first = invoke(runner, "plan", input=json.dumps(doc))
    second = invoke(runner, "plan", input=json.dumps(doc))
    assert first.exit_code == 0, first.output
    assert first.stdout == second.stdout


def test_plan_defaults_and_timing(runner):
    doc = {"model": "gpt-1.5b", "forecast": [{"prev_available": 16}] * 3}
    result = invoke(runner, "plan", "--timing", input=json.dumps(doc))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["decision_ms"] >= 0
    assert out["look_ahead"] == 3 and len(out["steps"]) == 3
    d, p = out["decision"]
    assert d * p <= 16 and load_profile("gpt-1.5b").is_feasible(d, p)


def test_plan_warns_when_nothing_fits(runner):
    result = invoke(runner, "plan", input=json.dumps({"model": "gpt-1.5b", "forecast": [{"prev_available": 3}]}))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["decision"] == [0, 0]
    assert result.stderr.startswith("warning: no strategy of gpt-1.5b fits")


# --------------------------------------------------------------------------------------------- traces


def test_traces_lists_bundled(runner):
    result = invoke(runner, "traces")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[2:] if line.split()}
    assert rows["p3"] == "event-csv"
    assert rows["gcp-v100"] == "gcp-log"
    assert "p3.csv" in result.stdout


# --------------------------------------------------------------------------------------------- errors


def test_unknown_trace(runner):
    assert_user_error(invoke(runner, "simulate", "--trace", "no-such-trace"), "'no-such-trace'", "p3")


def test_malformed_trace_names_file_and_line(runner, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("0,add,a\n1000,add,b\n2000,explode,a\n")
    assert_user_error(invoke(runner, "simulate", "--trace", str(bad)), str(bad), "line 3", "explode")


def test_unknown_model(runner):
    assert_user_error(invoke(runner, "simulate", "--model", "gpt-99b", "-p", "ideal"), "'gpt-99b'", "gpt-1.5b")


def test_unknown_policy_is_rejected_before_simulating(runner):
    result = invoke(runner, "simulate", "-p", "ideal", "-p", "magic")
    assert_user_error(result, "'magic'", "parcae-oracle")
    assert "simulat" not in result.stderr.removeprefix("error: ")  # no progress bar: nothing ran


@pytest.mark.parametrize(
    ("hours", "needles"),
    [(("100", "101"), ("[100.0, 101.0)", "outside")), (("5", "4"), ("--start-hour (5)", "before --end-hour (4)"))],
)
def test_window_outside_trace(runner, hours, needles):
    result = invoke(runner, "simulate", "--start-hour", hours[0], "--end-hour", hours[1], "-p", "ideal")
    assert_user_error(result, *needles, "11.383")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--interval-seconds", "0"), "--interval-seconds"),
        (("--bamboo-overhead", "1.5"), "--bamboo-overhead"),
        (("--plot", "out.bmpx"), ".bmpx"),
        (("--mermaid", "out.md"), "--mermaid draws two policies"),
        (("--notice-seconds", "-1"), "--notice-seconds"),
        (("--notice-seconds", "inf"), "--notice-seconds"),
    ],
)
def test_bad_options(runner, args, needle):
    assert_user_error(invoke(runner, "simulate", "-p", "ideal", *args), needle)


def _bad_plan(**changes) -> dict:
    doc = json.loads(json.dumps(PLAN_INPUT))
    for key, value in changes.items():
        if value is None:
            doc.pop(key)
        else:
            doc[key] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "needles"),
    [
        (_bad_plan(model=None), ("model is missing",)),
        (_bad_plan(model="gpt-99b"), ("'gpt-99b'", "gpt-1.5b")),
        (_bad_plan(model=7), ("model must be a string", "7")),
        (_bad_plan(forecast=None), ("forecast", "missing")),
        (_bad_plan(forecast=[]), ("forecast", "non-empty")),
        (_bad_plan(forecast=[{"prev_available": "32"}]), ("forecast[0].prev_available", "integer", '"32"')),
        (_bad_plan(forecast=[{"prev_available": 32}, {}]), ("forecast[1].prev_available is missing",)),
        (
            _bad_plan(forecast=[{"prev_available": 8, "events": [[0, 1, 0.5], [0, 0, 0.4]]}]),
            ("forecast[0].events", "sum to 0.9", "expected 1"),
        ),
        (
            _bad_plan(forecast=[{"prev_available": 8, "events": [[0, 1]]}]),
            ("forecast[0].events[0]", "[n_in, n_out, prob]"),
        ),
        (
            _bad_plan(forecast=[{"prev_available": 8, "events": [[0, 9, 1.0]]}]),
            ("forecast[0].events[0]", "infeasible", "n_out=9", "prev_available=8"),
        ),
        (_bad_plan(state={"strategy": [3, 3]}), ("state.strategy", "3x3", "feasible")),
        (
            _bad_plan(state={"strategy": [4, 8]}, forecast=[{"prev_available": 30}]),
            ("infeasible forecast", "4x8", "32 instances", "forecast[0].prev_available is 30"),
        ),
        (_bad_plan(state={"strategy": [2, 8], "migrating": "yes"}), ("state.migrating", '"yes"')),
        (_bad_plan(state={"leftover_ms": -1}), ("state.leftover_ms", "-1")),
        (_bad_plan(interval_s=0), ("interval_s", "> 0")),
        (_bad_plan(forcast=[{"prev_available": 8}]), ("'forcast'",)),
        ([1, 2], ("JSON object", "array")),
    ],
)
def test_bad_plan_input(runner, doc, needles):
    assert_user_error(invoke(runner, "plan", input=json.dumps(doc)), *needles)


def test_plan_invalid_json_and_missing_file(runner, tmp_path):
    broken = '{"model": "gpt-1.5b",\n "forecast": [}'
    assert_user_error(invoke(runner, "plan", input=broken), "line 2", "invalid JSON")
    assert_user_error(invoke(runner, "plan", input=""), "empty")
    missing = tmp_path / "nope.json"
    assert_user_error(invoke(runner, "plan", str(missing)), str(missing), "no such file")


def test_real_bugs_still_raise(runner, monkeypatch):
    import liveput

    def boom(*args, **kwargs):
        raise ValueError("a bug, not a user mistake")

    monkeypatch.setattr(liveput, "simulate", boom)  # where the command looks it up: the face
    result = invoke(runner, "simulate", "--start-hour", "10", "--end-hour", "10.25", "-p", "ideal")
    assert result.exit_code == 1
    assert isinstance(result.exception, ValueError)
