"""`parcae train`: short real jobs on local processes (scripted, a trace replay planned live by the liveput planner
on a runtime profile file, a resumed job), and the errors a user can make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _flow_fixtures import runtime_profile_file
from _trainer_fixtures import _no_orphans, _one_thread, warm_starts  # noqa: F401  (fixtures: _one_thread is autouse)
from typer.testing import CliRunner

from forecasting import TraceStore
from parcae import settings
from parcae.cli import app

pytestmark = pytest.mark.usefixtures("warm_starts")  # workers fork warm: `_trainer_fixtures.warm_worker_starts`


def test_train_writes_the_report_and_runs_the_job_again_from_its_settings_file(tmp_path):
    """The report; then `--config job.json` (the file each job writes in its out_dir, and its MLflow run records)
    trains the same job again, to the same final parameters; TOML too; an option that is a job setting beside it
    is refused."""
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    args = ["train", "--workers", "2", "--steps", "3", "--model-args", '{"n_layer": 2}', "--seed", "3"]
    res = CliRunner().invoke(app, [*args, "--out-dir", str(tmp_path / "run"), "--json", str(first)])
    assert res.exit_code == 0, res.output
    report = json.loads(first.read_text())
    assert len(report["loss"]) == 3
    assert {"throughput", "reconfigurations", "final_checksum"} <= set(report)
    job = tmp_path / "run" / "job.json"
    res = CliRunner().invoke(app, ["train", "--config", str(job), "--out-dir", str(tmp_path / "b"),
                                   "--json", str(again)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(again.read_text())["final_checksum"] == json.loads(first.read_text())["final_checksum"]
    assert json.loads((tmp_path / "b" / "job.json").read_text())["model"]["args"]["n_layer"] == 2
    res = CliRunner().invoke(app, ["train", "--config", str(job), "--workers", "3", "--steps", "5"])
    beside = "--workers (availability.workers), --steps (train.steps) cannot be given"
    assert res.exit_code == 2 and beside in res.output.replace("\n", ""), res.output
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nname = "tiny-gpt"\n\n[train]\nsteps = 0\n')
    res = CliRunner().invoke(app, ["train", "--config", str(toml), "--out-dir", str(tmp_path / "c")])
    assert res.exit_code == 2 and f"--config {toml}: train.steps" in res.output.replace("\n", ""), res.output
    for bad in (b"[model\n", b"\xff\xfe["):
        toml.write_bytes(bad)
        res = CliRunner().invoke(app, ["train", "--config", str(toml)])
        assert res.exit_code == 2 and "not TOML" in res.output and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(app, ["train", "--config", str(tmp_path / "first.json")])  # a report, not a job
    assert res.exit_code == 2 and "JobConfig: unknown fields" in res.output, res.output
    res = CliRunner().invoke(app, ["train", "--config", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "cannot read" in res.output and "missing.json" in res.output, res.output


def test_the_example_job_file_is_a_job_that_checks(monkeypatch):
    """examples/job.toml, as a user copies it: a `JobConfig` whose spec loads and checks (the digits CNN, the global
    batch its spec's rows, as `parcae train --config` takes a file that does not give one)."""
    import tomllib

    from trainer import JobConfig, check_job

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # (the model is named by its path from the repository's root)
    config = JobConfig.from_dict(tomllib.loads((repo / "examples" / "job.toml").read_text()))
    checked = check_job(config, batch_given=False)
    assert checked.model.name == "examples/digits_cnn.py:spec" and checked.model.args == {"channels": 16}
    assert checked.train.global_batch == 32 and checked.train.steps == 200 and checked.checkpoint.keep == 3
    assert checked.availability.trace == "p3" and checked.planning.planner == "rule"


def test_train_replays_a_live_fleet_s_history_from_the_trace_store(tmp_path, monkeypatch, _no_orphans):
    """A team replays the capacity its own fleet got (`fleet:<job tag>`, from the trace store) with its model: the
    job's plans follow the fleet's alive counts; a fleet recorded at other than the 60 s a replay cuts is refused."""
    store = TraceStore(tmp_path / "store")
    counts = [2, 1, 2, 2, 2, 2]  # interval i's count is the instances alive at the plan of interval i + 1
    store.append("fleet_intervals", [{"job_tag": tag, "provider": "aws", "interval": i, "interval_s": interval_s,
                                      "capacity": 2, "requested": 0, "granted": 0, "refused": 0, "reclaimed": 0,
                                      "alive": n, "timestamp": "2026-12-01T00:00:00Z"}
                                     for tag, interval_s in (("nightly@1", 60.0), ("fast@1", 1.0))
                                     for i, n in enumerate(counts)])  # fmt: skip
    monkeypatch.setenv("PARCAE_TRACE_STORE", str(tmp_path / "store"))
    out = tmp_path / "report.json"
    args = ["train", "--workers", "2", "--steps", "6", "--interval-seconds", "0.2", "--json", str(out)]
    res = CliRunner().invoke(app, [*args, "--trace", "fleet:nightly@1", "--out-dir", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    plans = report["plans"]
    assert len(plans) >= 2 and [p["alive"] for p in plans] == counts[: len(plans)], plans
    assert report["reconfigurations"], "the fall to 1 instance at interval 1 is a migration"
    res = CliRunner().invoke(app, [*args, "--trace", "fleet:fast@1", "--out-dir", str(tmp_path / "other")])
    assert res.exit_code == 2 and "fleet:fast@1 was recorded an interval every 1 s" in res.output, res.output
    assert "--trace" in res.output and "Traceback" not in res.output
    # the train flow's (and each deployment's) check of its trace parameter takes the same names
    assert settings.check_trace("fleet:nightly@1") == "fleet:nightly@1"
    for name, needle in (("fleet:fast@1", "recorded an interval every 1 s"), ("fleet:weekly@1", "no live fleet")):
        with pytest.raises(settings.SettingError, match=needle):
            settings.check_trace(name)


def test_train_rejects_events_and_trace_together(tmp_path):
    events = tmp_path / "events.json"
    events.write_text("[]")
    res = CliRunner().invoke(app, ["train", "--events", str(events), "--trace", "p3"])
    assert res.exit_code == 2 and "not both" in res.output


def test_train_names_a_bad_event(tmp_path):
    events = tmp_path / "events.json"
    events.write_text(json.dumps([{"step": 1, "kind": "teleport"}]))
    res = CliRunner().invoke(
        app, ["train", "--workers", "2", "--steps", "3", "--events", str(events), "--out-dir", str(tmp_path / "run")]
    )
    assert res.exit_code == 2, res.output
    assert "teleport" in res.output and "Traceback" not in res.output


def test_train_plot_in_an_unknown_format_is_refused_before_the_job(tmp_path):
    res = CliRunner().invoke(app, ["train", "--out-dir", str(tmp_path / "run"), "--plot", str(tmp_path / "t.bmpx")])
    assert res.exit_code == 2 and ".bmpx" in res.output and not (tmp_path / "run").exists()


def test_train_unknown_model(tmp_path):
    res = CliRunner().invoke(app, ["train", "--model", "gpt-17", "--out-dir", str(tmp_path / "run")])
    assert res.exit_code == 2 and "gpt-17" in res.output


def test_train_replays_a_trace_planned_by_liveput_on_a_profile(tmp_path, _no_orphans):
    """p3 scaled to 3 instances from interval 49 (3, 3, then 2 alive), one interval every 2 steps: liveput decides at
    each of the 3 boundaries, on a profile where 2x1 is by far the fastest (the rule would run two stages)."""
    profile = runtime_profile_file(tmp_path / "profile.json", fastest=(2, 1), max_instances=3)
    out = tmp_path / "report.json"
    res = CliRunner().invoke(
        app,
        [
            "train",
            "--workers",
            "3",
            "--steps",
            "8",
            "--trace",
            "p3",
            "--start-interval",
            "49",
            "--interval-seconds",
            "0.2",
            "--planner",
            "liveput",
            "--profile",
            str(profile),
            "--look-ahead",
            "3",
            "--out-dir",
            str(tmp_path / "run"),
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "plots" / "timeline.png"),
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    # the job's timeline, drawn as its MLflow run's is
    assert (tmp_path / "plots" / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {tmp_path / 'plots' / 'timeline.png'}" in res.output.replace("\n", "")
    plans = report["plans"]
    assert [(p["interval"], p["step"], p["alive"]) for p in plans] == [(1, 2, 3), (2, 4, 3), (3, 6, 2)]
    assert all(p["planner"] == "liveput" and p["decision"] == [2, 1] for p in plans), plans
    assert all(p["details"]["look_ahead"] == 3 and p["details"]["interval_s"] == 60.0 for p in plans)
    assert all(p["details"]["forecast"] == "persistence" for p in plans)
    assert "3 plans by liveput (2x1 (1-3)); forecasts: persistence" in res.output


def test_train_resume_continues_a_finished_job_only_with_more_steps(tmp_path, _no_orphans):
    run = tmp_path / "run"
    args = ["train", "--workers", "2", "--checkpoint-every", "2", "--out-dir", str(run)]
    first = CliRunner().invoke(app, [*args, "--steps", "3"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, [*args, "--steps", "5"])  # without --resume the folder is not reused
    assert again.exit_code == 2 and "resume" in again.output, again.output
    same = CliRunner().invoke(app, [*args, "--steps", "3", "--resume"])  # finished: nothing to retrain
    assert same.exit_code == 2 and "has finished: it trained 3 steps" in same.output, same.output
    out = tmp_path / "report.json"
    res = CliRunner().invoke(app, [*args, "--steps", "5", "--resume", "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())  # on from the finished run's final parameters, not its step-2 checkpoint
    assert report["resumed_from"] == 3 and report["first_step"] == 3 and len(report["loss"]) == 2
    assert "resumed from the checkpoint of step 3" in res.output


def test_train_planner_errors_name_the_fix(tmp_path):
    run = ["--trace", "p3", "--out-dir", str(tmp_path / "run")]
    res = CliRunner().invoke(app, ["train", "--planner", "oracle", *run])
    assert res.exit_code == 2 and "--planner must be one of rule, liveput, handed, got 'oracle'" in res.output
    res = CliRunner().invoke(app, ["train", "--planner", "liveput", *run])
    assert res.exit_code == 2 and "--profile PATH" in res.output and "`parcae profile`" in res.output, res.output
    bad = tmp_path / "not-a-profile.json"
    bad.write_text(json.dumps({"format": "something else"}))
    res = CliRunner().invoke(app, ["train", "--planner", "liveput", "--profile", str(bad), *run])
    assert res.exit_code == 2 and "--profile" in res.output and "not-a-profile.json" in res.output, res.output
    assert "Traceback" not in res.output
    missing = tmp_path / "missing.json"
    res = CliRunner().invoke(app, ["train", "--planner", "liveput", "--profile", str(missing), *run])
    assert res.exit_code == 2 and "missing.json" in res.output and "cannot read" in res.output, res.output
    profile = runtime_profile_file(tmp_path / "profile.json", fastest=(2, 1))
    res = CliRunner().invoke(app, ["train", "--planner", "liveput", "--profile", str(profile), "--model", "small-gpt",
                                   *run])  # fmt: skip
    assert res.exit_code == 2 and "'tiny-gpt', the job trains 'small-gpt'" in res.output, res.output


def test_a_failed_job_exits_1_and_a_usage_error_2(tmp_path):
    """The exit codes every command shares: 1 when the work fails (here the loss diverges), 2 for a mistake in how
    it was asked for; each with one `error:` line and no traceback."""
    runner = CliRunner()
    res = runner.invoke(app, ["train", "--model", "examples/digits_cnn.py:spec", "--model-args", '{"lr": 1e30}',
                              "--workers", "1", "--steps", "4", "--out-dir", str(tmp_path / "run")])  # fmt: skip
    assert res.exit_code == 1, res.output
    assert "error: the job failed: " in res.output and "training diverged" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["train", "--trace", "no-such-trace", "--out-dir", str(tmp_path / "other")])
    assert res.exit_code == 2 and "error: " in res.output and "no-such-trace" in res.output
    assert "Traceback" not in res.output


def test_train_help_lists_every_option_in_one_group():
    """`parcae train` has three dozen options: its --help lists them by what they are for (`TRAIN_PANELS`). Every
    option is in exactly one group, and no group names an option that is gone."""
    import typer

    from parcae.cli.train import TRAIN_PANELS

    command = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    options = sorted(str(p.name) for p in command.params if p.name != "help")
    assert sorted(name for names in TRAIN_PANELS.values() for name in names) == options
    res = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    headings = [line.rstrip(":") for line in res.output.splitlines() if line.endswith(":") and not line[0].isspace()]
    assert headings == [*TRAIN_PANELS, "Options"]  # then --help alone
    section = res.output.split("Checkpoints and outputs:\n", 1)[1].split("\n\n", 1)[0]
    assert "--checkpoint-uri" in section and "--resume" in section and "--model " not in section


def test_a_migration_that_broke_before_any_member_was_ready_is_shown_without_a_pause(tmp_path, monkeypatch):
    """A record's pause is None when its epoch broke before any member was ready (a rolled-back migration): the
    summary table shows "-" (it raised a TypeError at the end of a job that had trained)."""
    import trainer

    record = {"step": 7, "kind": "pipeline", "trigger": "planned", "strategy": [1, 2], "pause_s": None,
              "bytes_moved": 0, "steps_lost": 0, "abandoned": True}  # fmt: skip
    report = {"loss": [4.0, 3.9], "throughput": {"samples_per_s": 10.0}, "final_checksum": "0" * 64,
              "reconfigurations": [record], "plans": []}  # fmt: skip
    monkeypatch.setattr(trainer, "train", lambda *args, **kwargs: report)  # (the job's result, as it came back)
    res = CliRunner().invoke(app, ["train", "--workers", "2", "--steps", "2", "--out-dir", str(tmp_path / "job")])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.stdout.splitlines() if "pipeline" in line)
    assert row.split() == ["7", "pipeline", "planned", "1x2", "-", "0.00", "0"]


def test_the_summary_names_each_run_of_equal_plans_once_with_its_intervals():
    from parcae.cli.train import plan_runs

    decisions = [[1, 2]] * 3 + [[2, 2]] + [[1, 2]] * 40
    plans = [{"interval": i, "decision": d} for i, d in enumerate(decisions, start=1)]
    assert plan_runs(plans) == "1x2 (1-3), 2x2 (4), 1x2 (5-44)"
    assert plan_runs([]) == "none"
