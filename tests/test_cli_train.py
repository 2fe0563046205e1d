"""`parcae train`: a short real job on local processes, and the errors a user can make."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from parcae.cli import app


def test_train_writes_the_report(tmp_path):
    out = tmp_path / "report.json"
    res = CliRunner().invoke(app, ["train", "--workers", "2", "--steps", "3", "--out-dir", str(tmp_path / "run"),
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert len(report["loss"]) == 3
    assert {"throughput", "reconfigurations", "final_checksum"} <= set(report)


def test_train_rejects_events_and_trace_together(tmp_path):
    events = tmp_path / "events.json"
    events.write_text("[]")
    res = CliRunner().invoke(app, ["train", "--events", str(events), "--trace", "p3"])
    assert res.exit_code == 2 and "not both" in res.output


def test_train_names_a_bad_event(tmp_path):
    events = tmp_path / "events.json"
    events.write_text(json.dumps([{"step": 1, "kind": "teleport"}]))
    res = CliRunner().invoke(app, ["train", "--workers", "2", "--steps", "3", "--events", str(events),
                                   "--out-dir", str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    assert "teleport" in res.output and "Traceback" not in res.output


def test_train_unknown_model(tmp_path):
    res = CliRunner().invoke(app, ["train", "--model", "gpt-17", "--out-dir", str(tmp_path / "run")])
    assert res.exit_code == 2 and "gpt-17" in res.output
