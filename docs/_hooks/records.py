"""mkdocs hook: the reference of what parcae records, written at build time from the code that records it.

- `reference/mlflow.md`: the experiments (their descriptions as the code sets them), and what a training run, a
  plan run and a forecaster run hold, from the docstrings of the modules that log them (each module's docstring is
  its one definition of what it writes), and the registered model's description.
- `reference/prefect.md`: every deployment of `prefect.yaml` (its flow, schedule, description) and every
  parameter of its flow: type, the flow's default and the deployment's value.

Nothing is committed: a change to the code or to prefect.yaml changes the pages with it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import textwrap
from pathlib import Path
from typing import Any

import yaml
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


def _doc(module: str, start: str = "", stop: str = "") -> str:
    """A module's docstring, or the part of it from the line starting with `start` to the one starting with `stop`."""
    text = inspect.getdoc(importlib.import_module(module)) or ""
    if start:
        text = text[text.index(start) :]
    if stop:
        text = text[: text.index(stop)]
    return text.strip()


def _block(text: str) -> str:
    return "```text\n" + text + "\n```"


def mlflow_page() -> str:
    import tracking

    from forecasting import registry
    from parcae import simulations

    experiments = {
        **tracking.DESCRIPTIONS,
        registry.DEFAULT_EXPERIMENT: registry.EXPERIMENT_DESCRIPTION,
        simulations.SIMULATIONS_EXPERIMENT: simulations.SIMULATIONS_DESCRIPTION,
    }

    views = {
        **tracking.VIEWS,
        registry.DEFAULT_EXPERIMENT: registry.VIEW,
        simulations.SIMULATIONS_EXPERIMENT: simulations.SIMULATIONS_VIEW,
    }

    def view(name: str) -> str:
        v = views.get(name)
        if v is None:
            return "none"
        groups = (("params", v.params), ("metrics", v.metrics), ("tags", v.tags))
        return "; ".join(f"{kind} " + ", ".join(f"`{n}`" for n in names) for kind, names in groups if names)

    rows = "\n".join(f"| `{name}` | {text} | {view(name)} |" for name, text in experiments.items())
    return f"""# What parcae writes to MLflow

The store is `sqlite:///mlruns/mlflow.db` under the project unless `MLFLOW_TRACKING_URI` names another (a server:
`http://host:5000`). `mlflow ui --workers 1 --backend-store-uri sqlite:///mlruns/mlflow.db` shows it; every
experiment below is a model-training experiment (the UI's *Model training* view). This page is written from the
code that logs each record, when the site is built.

## Experiments

| Experiment | Its description in the UI | The columns of its saved view `{tracking.VIEW_ID}` |
|---|---|---|
{rows}

MLflow has no setting for the runs table's default columns (a choice each browser keeps), so the experiments parcae
creates carry a saved view, `{tracking.VIEW_ID}`, with the columns their runs are compared by (`tracking.views`):
the *Views* menu above the runs table lists it, and each experiment's description links to it
(`#/experiments/<id>/runs?viewStateShareKey={tracking.VIEW_ID}`). A view someone saves over it in the UI is kept.

## A training run (experiment `training`)

From `trainer.observe.tracking` (`MlflowJobObserver`), which logs it from the job's driver:

{_block(_doc("trainer.observe.tracking", "What the run holds", "How it is sent"))}

## A plan run (experiment `plans`)

A job's own planning hook logs one per interval (above); the `plan-interval` flow logs its plans the same way
(`tasks.tracking`):

{_block(_doc("tasks.tracking", "MLflow is reached"))}

## A forecaster run and the registry (experiment `forecaster`, model `{registry.DEFAULT_REGISTERED_NAME}`)

From `forecasting.registry`:

{_block(_doc("forecasting.registry"))}

The registered model's description: {registry.MODEL_DESCRIPTION}
"""


def _schedule(dep: dict[str, Any]) -> str:
    shown = []
    for s in dep.get("schedules") or []:
        if "interval" in s:
            shown.append(f"every {s['interval']} s")
        elif "cron" in s:
            shown.append(f"cron `{s['cron']}` ({s.get('timezone', 'UTC')})")
    return ", ".join(shown) or "none (run on demand)"


def _value(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    try:
        return f"`{json.dumps(value)}`"
    except TypeError:  # an object default (a dataclass): as Python shows it
        return f"`{value!r}`"


def prefect_page() -> str:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    parts = [
        "# The Prefect deployments",
        "",
        "`make serve` deploys each deployment of `prefect.yaml` on a local server with a process worker (see "
        "[Run the Prefect pipeline](../pipeline.md)). Each one runs a flow of `flows/` with the parameters below: "
        "the deployment's value where it sets one, else the flow's default; `prefect deployment run FLOW/NAME "
        "-p name=value` overrides one for a run. This page is written from `prefect.yaml` and the flows' "
        "signatures when the site is built.",
    ]
    for dep in spec["deployments"]:
        path, name = dep["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
        set_here = dep.get("parameters") or {}
        rows = []
        for p in inspect.signature(flow.fn).parameters.values():
            kind = "" if p.annotation is inspect.Parameter.empty else p.annotation  # a string: postponed annotations
            kind = kind if isinstance(kind, str) else inspect.formatannotation(kind)
            here = _value(set_here[p.name]) if p.name in set_here else ""
            rows.append(f"| `{p.name}` | `{kind}` | {_value(p.default)} | {here} |")
        summary = (inspect.getdoc(flow.fn) or "").split("\n\n")[0].replace("\n", " ")
        parts += [
            "",
            f"## `{flow.name}/{dep['name']}`",
            "",
            f"{dep.get('description', '')} Schedule: {_schedule(dep)}. Entry point: `{dep['entrypoint']}`.",
            "",
            textwrap.fill(summary, 118),
            "",
            "| Parameter | Type | Flow default | This deployment |",
            "|---|---|---|---|",
            *rows,
        ]
    return "\n".join(parts) + "\n"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "reference/mlflow.md", content=mlflow_page()))
    files.append(File.generated(config, "reference/prefect.md", content=prefect_page()))
    return files
