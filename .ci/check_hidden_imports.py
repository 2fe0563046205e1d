"""The import contracts see import statements only: no module loads a project module by its name instead.

Owns: finding, in package code, every ``importlib.import_module("pkg.module")`` and ``__import__("pkg.module")``
whose argument is a string naming a project module (a literal, or an f-string that begins with one), outside a
package's face (its ``__init__.py``, whose lazy names (PEP 562) load their homes by name, below it). Such a call is an
arrow that import-linter and grimp cannot draw: ``trainer/config.py`` looked the provider registry up that way, and
the cycle config -> providers -> runtime -> config passed the acyclic contract until 2026-12-07. A user's module
(``module:function`` specs) is loaded by a name that is not a literal, and is not the project's.
Run by ``make lint`` (``python .ci/check_hidden_imports.py``; exit 1 on a finding). Stdlib only.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from check_private_imports import package_files, root_packages


def _named(arg: ast.expr) -> str | None:
    """The module name a call's first argument spells out, as far as it is written in the call."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value)
    return None


def hidden_imports(repo: Path) -> list[str]:
    """``path:line: importer loads module by name`` for each hidden import in package code."""
    roots = set(root_packages(repo))
    found = []
    for path, importer in package_files(repo):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            fn = node.func
            called = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
            name = _named(node.args[0]) if called in ("import_module", "__import__") else None
            if name is not None and name.split(".")[0] in roots:
                found.append(f"{path.relative_to(repo)}:{node.lineno}: {importer} loads {name!r} by name")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to scan")
    found = hidden_imports(parser.parse_args(argv).repo.resolve())
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} import(s) hidden from the import contracts: import the module (the contracts then "
              "judge the arrow), or move the code so that the arrow runs down", file=sys.stderr)  # fmt: skip
        return 1
    print("no module loads a project module by name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
