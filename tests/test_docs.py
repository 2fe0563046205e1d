"""The user's documentation: the CLI reference is the Typer app's own (regenerated and compared: `make docs-cli`
after changing an option), every page under docs/ is in the site's nav, and the README fits on a screen or two.
`make docs` (in CI) builds the site itself, strict: a broken link fails it."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_reference_is_the_typer_app_s_own(tmp_path: Path) -> None:
    out = tmp_path / "cli.md"
    subprocess.run([sys.executable, "-m", "typer", "parcae.cli", "utils", "docs", "--name", "parcae", "--output",
                    str(out)], cwd=ROOT, check=True, capture_output=True, timeout=120)  # fmt: skip
    committed = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert out.read_text() == committed, "docs/reference/cli.md is out of date: run `make docs-cli` and commit it"


def _hook(name: str) -> Any:
    """The docs hook `docs/_hooks/<name>.py`, loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_hook", ROOT / "docs" / "_hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook


def test_every_page_is_in_the_nav_and_the_readme_fits_on_a_screen_or_two() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav: object) -> set[str]:
        if isinstance(nav, str):
            return {nav}
        if isinstance(nav, list):
            return set().union(*(pages(x) for x in nav))
        if isinstance(nav, dict):
            return set().union(*(pages(x) for x in nav.values()))
        return set()

    docs = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    docs.add("reference/job-config.md")  # written at build time by docs/_hooks/job_config.py
    docs.update(f"reference/api/{p}.md" for p in _hook("api").PACKAGES)  # and these by docs/_hooks/api.py
    docs.update({"reference/mlflow.md", "reference/prefect.md"})  # and these by docs/_hooks/records.py
    assert docs == pages(config["nav"]), f"pages outside the nav: {docs - pages(config['nav'])}"
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 150, f"README.md has {lines} lines: move the detail into docs/"


def test_the_api_pages_list_every_name_of_each_package_face() -> None:
    """`docs/_hooks/api.py` writes a page per package face whose mkdocstrings block lists exactly its `__all__`."""
    import importlib

    hook = _hook("api")
    assert set(hook.PACKAGES) == {"parcae", "trainer", "forecasting", "liveput"}
    for package in hook.PACKAGES:
        text = hook.page(package)
        listed = [line.strip()[2:] for line in text.splitlines() if line.startswith("        - ")]
        assert text.count(f"::: {package}\n") == 1
        assert sorted(listed) == sorted(importlib.import_module(package).__all__), package


def test_the_records_reference_names_every_experiment_and_every_deployment_s_parameters() -> None:
    """`docs/_hooks/records.py` writes what parcae logs to MLflow from the code that logs it, and a table per
    deployment of prefect.yaml with a row for every parameter of its flow."""
    import inspect

    import tracking

    hook = _hook("records")
    mlflow_page = hook.mlflow_page()
    for name in (*tracking.DESCRIPTIONS, "forecaster", "simulations"):
        assert f"| `{name}` |" in mlflow_page, name
    assert "mlflow.note.content" in mlflow_page and "migrations_table.json" in mlflow_page and "champion" in mlflow_page
    prefect_page = hook.prefect_page()
    for dep in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]:
        path, name = dep["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
        section = prefect_page.split(f"## `{flow.name}/{dep['name']}`")[1].split("\n## ")[0]
        for p in inspect.signature(flow.fn).parameters:
            assert f"| `{p}` |" in section, (dep["name"], p)
        for p, value in (dep.get("parameters") or {}).items():  # the deployment's own values are shown
            row = section.split(f"| `{p}` |")[1].split("\n")[0]
            assert row.endswith(f"`{json.dumps(value)}` |"), (p, value, row)


def test_the_job_config_reference_names_every_field_and_only_real_options() -> None:
    """The page the docs hook writes (`docs/_hooks/job_config.py`) has a row for every field of every section,
    and every `parcae train` option it names exists."""
    import dataclasses

    from parcae.cli.train import TRAIN_OPTIONS
    from trainer import JobConfig

    text = _hook("job_config").page()
    config = JobConfig()
    for f in dataclasses.fields(JobConfig):
        section = getattr(config, f.name)
        names = [g.name for g in dataclasses.fields(section)] if dataclasses.is_dataclass(section) else [f.name]
        for name in names:
            assert f"| `{name}` |" in text, f"{f.name}.{name} is not on the JobConfig page"
    reference = (ROOT / "docs" / "reference" / "cli.md").read_text()
    train = reference[reference.index("## `parcae train`") : reference.index("## `parcae profile`")]
    for option in {o for v in TRAIN_OPTIONS.values() for o in v.split("/")}:
        assert f"* `{option}" in train, f"TRAIN_OPTIONS names {option}, which parcae train does not have"
