"""Hostile inputs (issue 12, point 6): every input bounded and checked before work starts.

Each case is one a hostile but realistic user tried on main, where it ended in a traceback (OverflowError,
MemoryError, RecursionError, UnicodeDecodeError) or a silent wrong result (`Infinity` in JSON output, "5
deployments OK" for deployments that cannot run). Each must now be one clear paragraph that names the file or the
field and says what to do, with no traceback. The bounds themselves are module constants (`MAX_INSTANCES`,
`MAX_INTERVALS`, `INTERVAL_S_RANGE` in `forecasting.traces`, `MAX_LOOK_AHEAD` in `liveput.optimizer`,
`MAX_MICRO_BATCHES` in `liveput.throughput`, `MAX_JSON_DEPTH`/`MAX_JSON_BYTES` in `forecasting.jsonio`,
`FLOW_PARAMETERS` in `parcae.settings`). The generated-input counterpart is `tests/test_fuzz_inputs.py`.
"""

from __future__ import annotations

import ast  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import _prefect_home  # noqa: F401 - before prefect (check_deployments loads the flows): a temporary PREFECT_HOME
import pytest  # noqa: E402
import yaml  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from forecasting import jsonio  # noqa: E402
from parcae import settings  # noqa: E402
from parcae.cli import app  # noqa: E402
from trainer.control.events import EventError, load_events  # noqa: E402
from trainer.observe.profile import ProfileFormatError, RuntimeProfile  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: Bytes no text format accepts (NUL bytes and invalid UTF-8 among them), the same on every run.
RANDOM_BYTES = random.Random(12).randbytes(4096)
PLAN = {"model": "gpt-1.5b", "forecast": [{"prev_available": 32}]}


@pytest.fixture(autouse=True)
def _no_shared_traces(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PARCAE_SHARED_TRACES", str(tmp_path_factory.mktemp("no-shared") / "absent"))


def assert_clear(message: str, *needles: str) -> None:
    """One paragraph (no blank line), no traceback, and every needle (the file or field, the bound, the fix)."""
    text = message.strip()
    assert text, "no message"
    assert "\n\n" not in text, text
    assert "Traceback" not in text and not re.match(r"\w+(Error|Exception):", text), text
    for needle in needles:
        assert needle in text, (needle, text)


def cli_error(*args: str, input: str | bytes | None = None) -> str:
    """Run the command line; it must exit 2 with one ``error: ...`` line on stderr. Returns that line."""
    result = CliRunner().invoke(app, list(args), input=input)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ------------------------------------------------------------------------------------------- 1. trace files

_SPAN = "more than the 10,000,000 a trace may have; choose a longer interval, or write the times relative"
TRACE_CASES = {
    # name: (file content, needles besides the file's name)
    "count-too-large.csv": (b"0,1\n1000,99999999999999999999999\n",
                            ("line 2", "count", "largest allowed, 1,000,000", "expected 'ts_ms,count'")),
    "timestamp-too-large.csv": (b"0,add,a\n99999999999999999999999999,add,b\n",
                                ("line 2", "timestamp", "largest allowed", "expected 'ts_ms,add|remove,node'")),
    "4000-digits.csv": (b"0,1\n" + b"7" * 4000 + b",2\n", ("line 2", "timestamp", "largest allowed")),
    "span-too-long.csv": (b"0,1\n9000000000000000,2\n", ("150,000,000,000 intervals of 60 s", _SPAN)),
    "aws-spot-instances-huge.csv": (b"0,1\n1e400,2\n", ("line 2", "time '1e400'", "largest allowed")),
    "gap-too-large.json": (b'{"metadata": {"gap_seconds": 1e300}, "data": [1, 2]}',
                           ("line 1", "gap_seconds", "not a positive number up to")),
    "gap-nan.json": (b'{"metadata": {"gap_seconds": NaN}, "data": [1]}', ("gap_seconds", "not a positive number")),
    "span-too-long.json": (b'{"metadata": {"gap_seconds": 9e15}, "data": [1, 2]}', (_SPAN,)),
    "count-too-large.json": (b'{"metadata": {"gap_seconds": 60}, "data": [1, 100000000000000000000000000000]}',
                             ("data[1]", "an integer from 0 to 1,000,000")),
    "deep.json": (b'{"metadata": {"gap_seconds": 60}, "data": ' + b"[" * 200_000,
                  ("line 1", "nested more than 64 deep", "flatten the document")),
    "line-too-long.csv": (b"0,1\n1," + b"2" * 5000 + b"\n", ("line 2", "more than the 4,096 a trace line may have")),
    "year-2999.txt": (b"2999-01-01, 00:00:00, 5\n", ("line 1", "outside the years 1900-2199", "YYYY-MM-DD")),
    "offset-past-9999.log": (b"1,9999-12-31T23:59:59-23:59,0\n", ("line 1", "outside the years", "tick,ISO8601")),
    "random.bin": (RANDOM_BYTES, ("binary data", "expected 'one of:")),
    "latin-1.csv": ("0,1\n60000,2\n120000,3 café\n".encode("latin-1"), ("line 3", "not UTF-8 text")),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TRACE_CASES))
def test_a_hostile_trace_file_is_one_clear_error(tmp_path: Path, name: str) -> None:
    content, needles = TRACE_CASES[name]
    path = tmp_path / name
    path.write_bytes(content)
    assert_clear(cli_error("simulate", "--trace", str(path), "-p", "ideal"), f"error: {path}", *needles)


# ---------------------------------------------------------------------------------- 2. numeric options


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--interval-seconds", "1e-6"), ("--interval-seconds", "in [1, 86400]", "got 1e-06")),
        (("--interval-seconds", "nan"), ("--interval-seconds", "in [1, 86400]")),
        (("--interval-seconds", "1e9"), ("--interval-seconds", "in [1, 86400]")),
        (("--global-batch", "999999999999"), ("--global-batch", "in [1, 4096] for gpt-1.5b", "smaller global batch")),
        (("--global-batch", "70000", "--model", "bert"), ("--global-batch", "in [1, 32768] for bert")),
        (("--look-ahead", "100000"), ("--look-ahead", "in [1, 1024]", "fewer intervals")),
    ],
)
def test_a_numeric_option_out_of_range_fails_before_work_starts(args, needles) -> None:
    assert_clear(cli_error("simulate", "-p", "ideal", *args), *needles)


@pytest.mark.parametrize("command", [("predict",), ("evaluate", "--trace", "p3", "--json", "out.json"), ("train",)])
def test_a_forecast_horizon_past_the_planners_look_ahead_is_refused(command) -> None:
    assert_clear(cli_error("forecast", *command, "--horizon", "100000"), "--horizon", "in [1, 1024]", "fewer")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--interval-seconds", "nan"), ("--interval-seconds", "positive number of seconds", "got nan")),
        (("--interval-seconds", "0"), ("--interval-seconds", "positive number of seconds")),
    ],
)
def test_train_numeric_options_fail_before_work_starts(args, needles, tmp_path) -> None:
    assert_clear(cli_error("train", "--trace", "p3", "--out-dir", str(tmp_path / "run"), *args), *needles)


@pytest.mark.parametrize(
    ("option", "value", "field"),
    [
        ("--workers", "0", "availability.workers"), ("--steps", "-1", "train.steps"),
        ("--global-batch", "0", "train.global_batch"), ("--checkpoint-every", "-1", "checkpoint.every"),
        ("--keep-checkpoints", "-1", "checkpoint.keep"), ("--look-ahead", "5000", "planning.look_ahead"),
        ("--start-interval", "-2", "availability.start_interval"), ("--timeout", "0", "control.timeout_s"),
        ("--min-instances", "0", "fleet.min_instances"),
    ],
)  # fmt: skip
def test_a_train_option_that_is_a_job_config_field_has_the_config_s_range(option, value, field, tmp_path) -> None:
    """One definition of each range: the command's error is the `JobConfig` section's own, naming the option."""
    import trainer

    section, _, name = field.partition(".")
    kind = {"availability": trainer.AvailabilityConfig, "train": trainer.TrainConfig,
            "planning": trainer.PlanningConfig, "checkpoint": trainer.CheckpointConfig,
            "control": trainer.ControlPlaneConfig, "fleet": trainer.FleetConfig}[section]  # fmt: skip
    with pytest.raises(trainer.ConfigError) as refused:
        kind(**{name: float(value) if name == "timeout_s" else int(value)})
    expected = str(refused.value).replace(field, option, 1)
    assert (
        cli_error("train", "--trace", "p3", "--out-dir", str(tmp_path / "run"), option, value) == f"error: {expected}"
    )


def test_a_job_that_never_checkpoints_is_accepted_by_the_command_as_by_the_flows() -> None:
    import trainer

    assert trainer.CheckpointConfig(every=0).every == 0  # the flows' and the command's rule: 0 is never
    assert "(0: never)" in CliRunner().invoke(app, ["train", "--help"]).output


# ------------------------------------------------------------------------------------------ 3. plan input


def _plan(**changes) -> str:
    return json.dumps({**PLAN, **changes})


PLAN_CASES = {
    "deep": ("[" * 200_000, ("line 1 column 65", "nested more than 64 deep", "flatten")),
    "a 5000-digit integer": ('{"model": "gpt-1.5b", "interval_s": 1' + "0" * 5000 + "}",
                             ("more than 4300 digits", "fewer digits")),
    "an integer too large for a float": (_plan(interval_s=10**400), ("interval_s", "number of seconds > 0")),
    "interval_s overflowing the plan": (_plan(interval_s=1e308), ("interval_s", "in [1, 86400]", "got 1e+308")),
    "a huge count": (_plan(forecast=[{"prev_available": 10**23}]),
                     ("forecast[0].prev_available", "integer from 0 to 1,000,000")),
    "a huge n_in": (_plan(forecast=[{"prev_available": 32, "events": [[10**15, 0, 1.0]]}]),
                    ("forecast[0].events[0][0] (n_in)", "from 0 to 1,000,000")),
    "K too long": (_plan(forecast=[{"prev_available": 32}] * 1025), ("forecast's length K", "in [1, 1024]")),
    "too many events": (_plan(forecast=[{"prev_available": 8, "events": [[0, 0, 0.001]] * 1001}]),
                        ("forecast[0].events", "1,001 entries", "more than the 1000", "merge")),
    "a megabyte field name": (json.dumps({**PLAN, "x" * 2**20: 1}), ("unknown field", "expected only model")),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(PLAN_CASES))
def test_a_hostile_plan_input_is_one_clear_error(case: str) -> None:
    text, needles = PLAN_CASES[case]
    message = cli_error("plan", input=text)
    assert len(message) < 400, message  # a megabyte input does not make a megabyte message
    assert_clear(message, "plan input", *needles)


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        (RANDOM_BYTES, ("not UTF-8 text", "save the file as UTF-8 JSON")),
        (b" " * (jsonio.MAX_JSON_BYTES + 1), ("larger than 16,777,216 bytes",)),
    ],
)
def test_a_hostile_plan_file_is_named(tmp_path: Path, content: bytes, needles) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    assert_clear(cli_error("plan", str(path)), f"plan input {path}", *needles)


def test_the_plan_is_strict_json_even_when_a_number_overflows(monkeypatch: pytest.MonkeyPatch) -> None:
    import parcae.cli.plan

    body = {"model": "gpt-1.5b", "steps": [{"expected_samples": float("inf")}], "total": float("nan")}
    monkeypatch.setattr(parcae.cli.plan, "plan_from_input", lambda doc, timing=False, plot=None: body)
    result = CliRunner().invoke(app, ["plan"], input=json.dumps(PLAN))
    assert result.exit_code == 0, result.output

    def refuse(token: str):
        raise AssertionError(f"{token} is not JSON")

    doc = json.loads(result.stdout, parse_constant=refuse)
    assert doc["steps"][0]["expected_samples"] is None and doc["total"] is None  # null, as the help says
    assert_clear(result.stderr, "warning: the plan", "steps[0].expected_samples", "total", "written as null")


# ------------------------------------------------------------------------------- 4. profiles and events

BAD_JSON_FILES = {
    "random bytes": (RANDOM_BYTES, "not UTF-8 text"),
    "deep": (b"[" * 200_000, "nested more than 64 deep"),
    "a 5000-digit integer": (b"[" + b"1" * 5000 + b"]", "more than 4300 digits"),
    "not JSON": (b"{not json", "JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSON_FILES))
@pytest.mark.parametrize(("load", "error"), [(RuntimeProfile.load, ProfileFormatError), (load_events, EventError)])
def test_a_hostile_profile_or_events_file_is_named(tmp_path: Path, case: str, load, error) -> None:
    content, needle = BAD_JSON_FILES[case]
    path = tmp_path / "input.json"
    path.write_bytes(content)
    with pytest.raises(error) as err:
        load(path)
    assert_clear(str(err.value), str(path), needle)


@pytest.mark.parametrize("option", ["--profile", "--events"])
def test_the_train_command_names_a_random_bytes_file(tmp_path: Path, option: str) -> None:
    path = tmp_path / "random.json"
    path.write_bytes(RANDOM_BYTES)
    extra = ["--planner", "liveput"] if option == "--profile" else []
    message = cli_error("train", *extra, option, str(path), "--out-dir", str(tmp_path / "job"), "--steps", "1")
    assert_clear(message, str(path), "not UTF-8 text", "save the file as UTF-8")


# ---------------------------------------------------------------------------------------- 5. prefect.yaml


def _deployments(tmp_path: Path, change) -> Path:
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    for dep in doc["deployments"]:
        change(dep)
    path = tmp_path / "prefect.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "flows").symlink_to(ROOT / "flows")  # entrypoints resolve beside the file
    return path


def _run_settings(path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, str]:
    monkeypatch.setattr(settings, "check_tracking", lambda: None)  # the deployments only, not the MLflow store
    code = settings.main([str(path)])
    return code, capsys.readouterr().err


def test_a_random_bytes_prefect_yaml_is_one_clear_error(tmp_path: Path, monkeypatch, capsys) -> None:
    path = tmp_path / "prefect.yaml"
    path.write_bytes(RANDOM_BYTES)
    code, err = _run_settings(path, monkeypatch, capsys)
    assert code == 2
    assert_clear(err, f"error: {path}", "is not UTF-8 text", "save it as UTF-8 YAML")
    assert err.count("\n") == 1


def test_deployments_that_cannot_run_are_refused_with_the_flows_own_checks(tmp_path: Path, monkeypatch, capsys):
    bad = {"model": "huge-gpt", "planner": "oracle", "workers": 0, "steps": -5}

    def change(dep):
        if dep["name"] == "on-demand":
            dep["parameters"].update(bad)
        if dep["name"] == "from-file":
            dep["parameters"].update(config_file="jobs/missing.toml")
        if dep["name"] == "every-minute":
            dep["parameters"].update(model="tiny-gpt", look_ahead=5000)  # a trainer model, not a planning one
        if dep["name"] == "hourly":
            dep["parameters"].update(horizon=0, interval_s=1e-6)

    code, err = _run_settings(_deployments(tmp_path, change), monkeypatch, capsys)
    assert code == 2 and "OK" not in err
    lines = err.splitlines()
    assert len(lines) == 9 and all(line.startswith("error: prefect.yaml: deployment '") for line in lines), err
    expected = [  # in the file's order, each deployment's in its flow's FLOW_PARAMETERS order
        ("'hourly'.parameters.horizon", "got 0", "an integer from 1 to 1,024"),
        ("'hourly'.parameters.interval_s", "got 1e-06", "a number of seconds in [1, 86400]"),
        ("'every-minute'.parameters.model", "unknown planning model 'tiny-gpt'", "gpt-1.5b", "runtime profile"),
        ("'every-minute'.parameters.look_ahead", "got 5000", "an integer from 1 to 1,024"),
        ("'on-demand'.parameters.model", "unknown trainer model 'huge-gpt'", "tiny-gpt"),
        ("'on-demand'.parameters.planner", "unknown planner 'oracle'", "choose one of liveput, rule, handed"),
        ("'on-demand'.parameters.workers", "got 0", "must be an integer >= 1"),  # as JobConfig checks it
        ("'on-demand'.parameters.steps", "got -5", "must be an integer >= 1"),
        ("'from-file'.parameters.config_file", "jobs/missing.toml: cannot read a job file", "No such file"),
    ]
    for line, needles in zip(lines, expected):
        assert_clear(line, *needles)


def test_every_flow_checks_its_parameters_with_the_table_the_deployments_check() -> None:
    from prefect.flows import load_flow_from_entrypoint

    flows = {}
    for path in sorted((ROOT / "flows").glob("*.py")):
        if path.stem in ("__init__", "deployments"):  # deployments: `make serve`'s deploy, not a flow
            continue
        flow = load_flow_from_entrypoint(f"{path}:{path.stem}")
        flows[flow.name] = flow
        assert f'flow_checks("{flow.name}"' in path.read_text()  # the flow runs them itself
    assert set(flows) == set(settings.FLOW_PARAMETERS)
    for name, table in settings.FLOW_PARAMETERS.items():
        unknown = set(table) - set(inspect.signature(flows[name].fn).parameters)
        assert not unknown, (name, unknown)  # a renamed parameter would silently lose its check


@pytest.mark.parametrize(
    ("entrypoint", "arguments", "needles"),
    [
        ("train:train", {"workers": 0, "steps": -5}, ("workers: must be an integer >= 1, got 0", "steps: ")),
        ("train:train", {"device": "gpu"}, ("device: must be auto, cpu or cuda, got 'gpu'",)),
        ("plan_interval:plan_interval", {"look_ahead": 0}, ("look_ahead: expected an integer from 1 to 1,024",)),
        ("retrain_forecaster:retrain_forecaster", {"horizon": -1}, ("horizon: ", "got -1")),
        ("collect_traces:collect_traces", {"price_hours": float("inf")}, ("price_hours: ", "got inf")),
        ("pipeline:pipeline", {"model": "huge-gpt"}, ("model: unknown trainer model 'huge-gpt'",)),
    ],
)
def test_a_flow_refuses_bad_arguments_before_it_works(tmp_path, monkeypatch, entrypoint, arguments, needles):
    from prefect.flows import load_flow_from_entrypoint

    file, name = entrypoint.split(":")
    flow = load_flow_from_entrypoint(f"{ROOT / 'flows' / file}.py:{name}")
    monkeypatch.setattr(settings, "check_tracking", lambda *a, **k: None)
    if "out_dir" in inspect.signature(flow.fn).parameters:
        arguments = {"out_dir": str(tmp_path / "job"), **arguments}
    with pytest.raises(settings.SettingError) as err:
        flow.fn(**arguments)  # the flow's own body, without a Prefect run: its first statement checks
    assert_clear(str(err.value).replace("\n- ", " - "), *needles)


# --------------------------------------------------------------------------------- 6. strict JSON output


def test_every_json_the_command_line_writes_is_strict() -> None:
    """Every ``json.dumps`` in parcae/ (and in forecasting/jsonio.py) either is `jsonio.dumps_strict`
    (allow_nan=False) or quotes a value in an error message (`cli._shown`); outputs go through `cli._strict_json`."""
    allowed = {("jsonio.py", "dumps_strict"), ("cli.py", "_shown")}
    found = []
    for path in [*sorted((ROOT / "parcae").rglob("*.py")), ROOT / "forecasting" / "jsonio.py"]:
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and ast.unparse(node.func) in ("json.dumps", "json.dump"):
                    found.append((path.name, fn.name))
                    strict = any(k.arg == "allow_nan" and ast.unparse(k.value) == "False" for k in node.keywords)
                    assert (path.name, fn.name) in allowed, (path.name, fn.name)
                    assert strict or fn.name == "_shown", (path.name, fn.name)
    assert ("jsonio.py", "dumps_strict") in found


def test_simulate_json_is_strict_when_a_summary_overflows(tmp_path: Path, monkeypatch) -> None:
    import parcae.cli.simulate

    monkeypatch.setattr(parcae.cli.simulate, "_summary", lambda result: {"samples": float("inf")})
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(
        app, ["simulate", "--start-hour", "10", "--end-hour", "10.1", "-p", "ideal", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text(), parse_constant=lambda token: pytest.fail(f"{token} in the JSON"))
    assert doc["policies"]["ideal"]["samples"] is None
    assert f"warning: --json {out}: policies.ideal.samples not finite; written as null" in result.stderr


def test_a_train_deployment_whose_job_config_cannot_be_built_is_refused(tmp_path: Path, monkeypatch, capsys):
    """The provider's options are checked by the JobConfig the train flow builds: a deployment with bad ones is
    refused before `prefect deploy`, not at its first run."""

    def change(dep):
        if dep["name"] == "on-demand":
            dep["parameters"].update(provider="hosts", provider_options={"hosts": ["gpu1"]})

    code, err = _run_settings(_deployments(tmp_path, change), monkeypatch, capsys)
    assert code == 2 and "OK" not in err
    assert_clear(err, "'on-demand'.parameters", "provider.options", "hosts and coordinator go together")
