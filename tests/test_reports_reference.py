"""docs/reference/reports.md lists the fields of every JSON report: each command is run here and its keys are the
page's, so a field added, renamed or dropped in the code fails until the page says so. Fields the page marks "only
..." may be absent from a given report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _trainer_fixtures import warm_starts  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from parcae.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "reference" / "reports.md").read_text()
PLAN_INPUT = {
    "model": "gpt-1.5b",
    "interval_s": 60,
    "state": {"strategy": [4, 8], "migrating": False, "leftover_ms": 0},
    "forecast": [{"prev_available": 32, "events": [[0, 0, 0.7], [0, 2, 0.2], [1, 0, 0.1]]}, {"prev_available": 30}],
}


def table(heading: str, index: int = 0) -> tuple[set[str], set[str]]:
    """The fields of the `index`-th table under `heading`: (all of them, those not marked "only ...")."""
    section = PAGE.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    tables = re.findall(r"\| Field \| What it holds \|\n\|---\|---\|\n((?:\|.*\n)+)", section)
    rows = [re.match(r"\| `([a-z_]+)` \| (.*) \|", line) for line in tables[index].splitlines()]
    assert all(rows), tables[index]
    fields = {m.group(1) for m in rows if m}
    return fields, {m.group(1) for m in rows if m and not m.group(2).startswith("only ")}


def check(keys: set[str], documented: tuple[set[str], set[str]], what: str) -> None:
    every, always = documented
    assert keys <= every, f"{what}: fields the page does not list: {sorted(keys - every)}"
    assert always <= keys, f"{what}: fields the page lists that the report lacks: {sorted(always - keys)}"


def run(*args: str) -> str:
    res = CliRunner().invoke(app, ["-q", *args])
    assert res.exit_code == 0, res.output
    return res.stdout


def test_the_train_report_s_fields_are_the_page_s(tmp_path: Path, warm_starts: None) -> None:
    out = tmp_path / "train.json"
    # p3 from interval 49 scaled to 3 instances: 3, 3, then 2 — a preemption, so a reconfiguration to report
    run("train", "--workers", "3", "--steps", "8", "--trace", "p3", "--start-interval", "49", "--interval-seconds",
        "0.2", "--planner", "rule", "--out-dir", str(tmp_path / "job"), "--json", str(out))  # fmt: skip
    doc = json.loads(out.read_text())
    check(set(doc), table("`parcae train --json OUT.json`"), "train")
    assert doc["reconfigurations"] and doc["plans"]
    for record in doc["reconfigurations"]:
        check(set(record), table("`parcae train --json OUT.json`", 1), "a reconfiguration")
    for plan in doc["plans"]:
        check(set(plan), table("`parcae train --json OUT.json`", 2), "a plan")
    assert set(doc["throughput"]) == {"steps_per_s", "samples_per_s", "train_s"}


def test_the_simulate_report_s_fields_are_the_page_s(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    run("simulate", "--trace", "p3", "--start-hour", "1.5", "--end-hour", "1.6", "-p", "parcae", "-p", "reactive",
        "--json", str(out))  # fmt: skip
    doc = json.loads(out.read_text())
    check(set(doc), table("`parcae simulate --json OUT.json`"), "simulate")
    for name, summary in doc["policies"].items():
        check(set(summary), table("`parcae simulate --json OUT.json`", 1), f"policy {name}")


@pytest.mark.parametrize("command", ["forecast", "plan"])
def test_the_printed_reports_fields_are_the_page_s(command: str, tmp_path: Path) -> None:
    if command == "forecast":
        doc = json.loads(run("forecast", "predict", "--trace", "p3", "--at", "400"))
        check(set(doc), table("`parcae forecast predict`"), "forecast predict")
    else:
        (tmp_path / "plan.json").write_text(json.dumps(PLAN_INPUT))
        doc = json.loads(run("plan", str(tmp_path / "plan.json")))
        check(set(doc), table("`parcae plan`"), "plan")
        step_fields = re.search(r"\| `steps` \| one per interval: (.*?) \(", PAGE)
        assert step_fields is not None
        assert set(doc["steps"][0]) == set(re.findall(r"`([a-z_]+)`", step_fields.group(1)))
