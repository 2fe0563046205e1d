"""The import contract import-linter cannot state: no module uses another module's ``_private`` name.

Owns: finding, in package code and benchmarks/, every ``from m import _name`` and every ``m._name`` where ``m`` is a
project module other than the importer (tests/ may reach into privates: they pin the helpers down). Private
*modules* (``pkg/_impl.py``) are import-linter's ``private_modules`` contract in pyproject.toml, not this script's.
Run by ``make lint`` (``python .ci/check_private_imports.py``; exit 1 on a violation); benchmarks/structure.py counts
with the same scan. Stdlib only, so it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Top-level folders that hold no importable package code (tests may use privates; scripts are scanned apart).
NOT_PACKAGES = frozenset({"tests", "benchmarks"})
#: Script folders whose files import package code and are held to the same rule.
SCRIPT_DIRS = ("benchmarks",)


@dataclass(frozen=True)
class PrivateUse:
    """One use of another module's private name: where, by whom, of what."""

    path: Path
    line: int
    importer: str
    target: str  # "module._name"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} uses {self.target}"


def root_packages(repo: Path) -> list[str]:
    """The project's top-level packages: folders of the repo root with an ``__init__.py``, tests aside."""
    return sorted(
        p.name
        for p in repo.iterdir()
        if p.is_dir() and (p / "__init__.py").is_file() and p.name not in NOT_PACKAGES and not p.name.startswith(".")
    )


def package_files(repo: Path) -> Iterator[tuple[Path, str]]:
    """(path, dotted module name) of every module of the root packages."""
    for pkg in root_packages(repo):
        for path in sorted((repo / pkg).rglob("*.py")):
            parts = path.relative_to(repo).with_suffix("").parts
            yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def script_files(repo: Path) -> Iterator[tuple[Path, str]]:
    """(path, pseudo module name) of the scripts that import package code (benchmarks/)."""
    for d in SCRIPT_DIRS:
        for path in sorted((repo / d).rglob("*.py")):
            yield path, ".".join(path.relative_to(repo).with_suffix("").parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Scanner:
    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.modules = {name for _, name in package_files(repo)}
        self.roots = set(root_packages(repo))

    def _absolute(self, importer: str, is_package: bool, node: ast.ImportFrom) -> str | None:
        if not node.level:
            return node.module
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, node.module] if node.module else base)

    def _module_of(self, dotted: list[str]) -> str | None:
        """The longest project module that prefixes the attribute chain ``dotted``."""
        for n in range(len(dotted), 0, -1):
            name = ".".join(dotted[:n])
            if name in self.modules:
                return name
        return None

    def scan(self, path: Path, importer: str) -> Iterator[PrivateUse]:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        path = path.relative_to(self.repo)
        is_package = path.name == "__init__.py"
        bound: dict[str, list[str]] = {}  # local name -> the dotted project name it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in self.roots:
                        bound[alias.asname or alias.name.split(".")[0]] = (
                            alias.name.split(".") if alias.asname else [alias.name.split(".")[0]]
                        )
            elif isinstance(node, ast.ImportFrom):
                source = self._absolute(importer, is_package, node)
                if source is None or source.split(".")[0] not in self.roots:
                    continue
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if full in self.modules:  # a submodule: private modules are import-linter's contract
                        bound[alias.asname or alias.name] = full.split(".")
                    elif _is_private(alias.name) and source != importer:
                        yield PrivateUse(path, node.lineno, importer, full)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            chain: list[str] = []
            value: ast.expr = node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if not (isinstance(value, ast.Name) and value.id in bound):
                continue
            dotted = [*bound[value.id], *chain, node.attr]
            target = self._module_of(dotted[:-1])
            if target is not None and target != importer:
                yield PrivateUse(path, node.lineno, importer, ".".join(dotted))


def private_uses(repo: Path, *, scripts: bool = True) -> list[PrivateUse]:
    """Every use of another module's private name in package code (and in benchmarks/ when ``scripts``)."""
    scanner = _Scanner(repo)
    files = [*package_files(repo), *(script_files(repo) if scripts else ())]
    return sorted(
        {use for path, name in files for use in scanner.scan(path, name)},
        key=lambda u: (str(u.path), u.line, u.target),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to scan")
    args = parser.parse_args(argv)
    uses = private_uses(args.repo.resolve())
    for use in uses:
        print(use)
    if uses:
        print(
            f"{len(uses)} use(s) of another module's private name: make it public in that module's face, "
            "or move the code that needs it next to it",
            file=sys.stderr,
        )
        return 1
    print("no module uses another module's private name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
