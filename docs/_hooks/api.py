"""mkdocs hook: the Python API pages (`reference/api/<package>.md`), one per package face, written at build time.

Each page is the face's docstring and one entry per name its `__all__` lists, rendered by mkdocstrings from the
docstrings of the modules that define them. The names come from the imported face (its `__all__` is computed,
which static analysis cannot read; importing a face is cheap: its names load on first use), so a name added to a
face appears here and one removed disappears. Nothing is committed: the pages are generated files of the build.
"""

from __future__ import annotations

import importlib
from typing import Any

from mkdocs.structure.files import File, Files

PACKAGES = ("parcae", "trainer", "forecasting", "liveput")


def page(package: str) -> str:
    names = sorted(importlib.import_module(package).__all__, key=str.lower)
    members = "\n".join(f"        - {name}" for name in names)
    return (f"# `{package}`\n\nWhat code outside the package imports: `from {package} import …`, one of the "
            f"{len(names)} names below.\n\n::: {package}\n    options:\n      members:\n{members}\n")  # fmt: skip


def on_files(files: Files, config: Any) -> Files:
    for package in PACKAGES:
        files.append(File.generated(config, f"reference/api/{package}.md", content=page(package)))
    return files
