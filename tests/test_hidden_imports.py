"""Tests of the lint rule that keeps the import contracts honest (.ci/check_hidden_imports.py): a project module loaded
by its name, past the contracts, is found; a face's lazy names and a user's module are not."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / ".ci"))

from check_hidden_imports import hidden_imports  # noqa: E402


def test_a_project_module_loaded_by_name_is_found_outside_a_face(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('import importlib\nX = importlib.import_module("pkg.b")\n')  # a face: allowed
    (pkg / "a.py").write_text(
        "import importlib\n"
        'R = importlib.import_module("pkg.b")\n'
        'S = __import__(f"pkg.{R}")\n'
        "def user(name):\n"
        "    return importlib.import_module(name)\n"  # a user's module: not a literal
        'J = importlib.import_module("json")\n'  # not the project's
    )
    (pkg / "b.py").write_text("")
    assert hidden_imports(tmp_path) == [
        "pkg/a.py:2: pkg.a loads 'pkg.b' by name",
        "pkg/a.py:3: pkg.a loads 'pkg.' by name",
    ]
