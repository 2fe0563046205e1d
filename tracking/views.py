"""Saved views of the MLflow runs table: the columns each parcae experiment is read by.

MLflow has no API for the runs table's default columns (they are a per-browser choice), but since 3.15 it keeps
*saved views* on the server: an experiment tag ``mlflow.sharedViewState.<view id>`` whose value is an envelope
``{name, createdAt, updatedAt, state}`` around the JSON of the runs page's state (its ``selectedColumns``, each
``params.`name```, ``metrics.`name``` or ``tags.`name```). The page's *Views* menu lists them, and
``#/experiments/<id>/runs?viewStateShareKey=<view id>`` opens one. Each experiment parcae creates gets a view named
"parcae" with the columns its runs are compared by (`tracking.store.VIEWS`), and its description links to it
(`view_link`).

Owns: `RunsView`, `view_tag`, `view_link`. Must not touch: the store (`tracking.store.ensure_experiment`
writes the tag), what the runs log (the names here must be the metrics and params their writers log).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

#: The experiment tag prefix of a saved view (MLflow's ``SHARE_VIEW_STATE`` prefix, as its UI reads it).
VIEW_TAG_PREFIX: Final = "mlflow.sharedViewState."
#: The id (and name) of the view parcae saves on its experiments.
VIEW_ID: Final = "parcae"


@dataclass(frozen=True)
class RunsView:
    """The columns of a saved view, in order: params, then metrics, then tags."""

    params: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()

    def columns(self) -> list[str]:
        """The columns as the MLflow UI keys them (``params.`model```)."""
        groups = (("params", self.params), ("metrics", self.metrics), ("tags", self.tags))
        return [f"{kind}.`{name}`" for kind, names in groups for name in names]

    def tag_value(self, created_ms: int) -> str:
        """The view's experiment tag value: MLflow's saved-view envelope around the page state (plain JSON, which
        its UI reads as it reads its own compressed form)."""
        state = json.dumps({"selectedColumns": self.columns()}, separators=(",", ":"))
        return json.dumps({"name": VIEW_ID, "createdAt": created_ms, "updatedAt": created_ms, "state": state},
                          separators=(",", ":"))  # fmt: skip


def view_tag() -> str:
    """The experiment tag that holds parcae's view."""
    return f"{VIEW_TAG_PREFIX}{VIEW_ID}"


def view_link(experiment_id: str) -> str:
    """The MLflow UI route (relative to its root, as a description's markdown links it) that opens parcae's view of
    the experiment."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_ID}"
