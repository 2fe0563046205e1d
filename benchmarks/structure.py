"""The shape of a checkout, as tables a closing note can quote before and after a refactor (issue 13).

Owns: measuring package code (the root packages: folders with an ``__init__.py``, tests/ and benchmarks/ aside)
— largest files, longest signatures (those along the job's path by name, wherever they live), import cycles inside
each package and imports that run up the layers (grimp), the number of definitions of each duplicated concept, the
longest module docstrings. Reads source only: imports none of the code it measures, changes nothing.
Next: the private-name scan is .ci/check_private_imports.py's (one definition, imported here); the contracts that
gate CI are pyproject.toml's [tool.importlinter].

    python benchmarks/structure.py [--repo DIR]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import grimp

HERE = Path(__file__).resolve().parents[1]

#: Rank of each root package, top floor first; an import from a lower rank to a higher one runs "up".
LAYERS: dict[str, int] = {
    "parcae": 3,
    "flows": 3,
    "tasks": 3,
    "trainer": 2,
    "forecasting": 1,
    "liveput": 1,
    "tracking": 0,
}
#: The packages that must stay usable without an orchestrator.
DOMAIN = ("forecasting", "liveput", "trainer", "tracking")


def _load_private_scan() -> ModuleType:
    """.ci/check_private_imports.py of this script's checkout (.ci is no package: load it by path)."""
    path = HERE / ".ci" / "check_private_imports.py"
    spec = importlib.util.spec_from_file_location("check_private_imports", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


scan = _load_private_scan()


@dataclass(frozen=True)
class Source:
    """One module of package code, parsed once."""

    path: Path  # relative to the repo
    module: str
    text: str
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.module.split(".")[0]


def sources(repo: Path) -> list[Source]:
    out = []
    for path, module in scan.package_files(repo):
        text = path.read_text(encoding="utf-8")
        out.append(Source(path.relative_to(repo), module, text, ast.parse(text, filename=str(path))))
    return out


def table(title: str, header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table under a heading: what an issue comment quotes as is."""
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    body = [("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |") for row in rows]
    return "\n".join([*lines, *(body or ["| " + " | ".join(["(none)", *[""] * (len(header) - 1)]) + " |"]), ""])


# -- files and docstrings ----------------------------------------------------------------------------------------
def largest_files(srcs: list[Source], n: int = 10) -> str:
    rows = sorted(((s.text.count("\n"), s.path) for s in srcs), key=lambda r: (-r[0], str(r[1])))[:n]
    total = sum(s.text.count("\n") for s in srcs)
    return table(f"Ten largest package files (of {len(srcs)} files, {total} lines)", ["lines", "file"], rows)


def longest_docstrings(srcs: list[Source], n: int = 5) -> str:
    rows = []
    for s in srcs:
        first = s.tree.body[0] if s.tree.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            rows.append(((first.end_lineno or first.lineno) - first.lineno + 1, s.path))
    rows.sort(key=lambda r: (-r[0], str(r[1])))
    return table("Longest module docstrings (lines, quotes included)", ["lines", "module"], rows[:n])


# -- signatures -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Function:
    source: Source
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    in_class: bool

    @property
    def params(self) -> int:
        a = self.node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if p is not None]
        bound = self.in_class and names[:1] in (["self"], ["cls"])
        return len(names) - bound

    @property
    def where(self) -> str:
        return f"{self.source.path}:{self.node.lineno}"

    def decorated_by(self, name: str) -> bool:
        """Whether a decorator's callee ends in `name` (``@flow``, ``@flow(...)``, ``@prefect.flow(...)``)."""
        for d in self.node.decorator_list:
            d = d.func if isinstance(d, ast.Call) else d
            if (isinstance(d, ast.Name) and d.id == name) or (isinstance(d, ast.Attribute) and d.attr == name):
                return True
        return False

    def command_name(self) -> str | None:
        """The name ``@command("x")``, ``@app.command("x")`` or ``@command(name="x")`` gives the function, if any."""
        for d in self.node.decorator_list:
            if not isinstance(d, ast.Call):
                continue
            f = d.func
            if not (
                (isinstance(f, ast.Name) and f.id == "command")
                or (isinstance(f, ast.Attribute) and f.attr == "command")
            ):
                continue
            named = [k.value for k in d.keywords if k.arg == "name"]
            for value in [*d.args[:1], *named]:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    return value.value
        return None


def functions(srcs: list[Source]) -> Iterator[Function]:
    def walk(source: Source, body: list[ast.stmt], prefix: str, in_class: bool) -> Iterator[Function]:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield Function(source, prefix + node.name, node, in_class)
                yield from walk(source, node.body, f"{prefix}{node.name}.<locals>.", False)
            elif isinstance(node, ast.ClassDef):
                yield from walk(source, node.body, f"{prefix}{node.name}.", True)

    for s in srcs:
        yield from walk(s, s.tree.body, "", False)


#: The job's path from the command line to the coordinator: (label, how to recognise the function).
JOB_PATH: tuple[tuple[str, Callable[[Function], bool]], ...] = (
    ("run_job", lambda f: f.qualname == "run_job"),
    ("train (trainer)", lambda f: f.qualname == "train" and f.source.package == "trainer"),
    (
        "train_cmd (CLI)",
        lambda f: f.source.package == "parcae" and (f.qualname == "train_cmd" or f.command_name() == "train"),
    ),
    ("train (flow)", lambda f: f.qualname == "train" and f.decorated_by("flow")),
    ("Coordinator.__init__", lambda f: f.qualname == "Coordinator.__init__"),
    ("train_job (task)", lambda f: f.qualname == "train_job"),
    ("training_planner (task)", lambda f: f.qualname == "training_planner"),
    ("job_planner", lambda f: f.qualname == "job_planner"),
)


def signatures(srcs: list[Source], n: int = 10) -> str:
    funcs = list(functions(srcs))
    path_rows: list[tuple[str, int | str, str]] = []
    for label, match in JOB_PATH:
        hits = [f for f in funcs if match(f)]
        path_rows += [(label, f.params, f.where) for f in hits] or [(label, "-", "not found")]
    top = sorted(funcs, key=lambda f: (-f.params, f.where))[:n]
    return "\n".join(
        [
            table(
                "Signatures along the job's path (parameters, self aside)", ["function", "params", "where"], path_rows
            ),
            table(
                f"Top {n} longest signatures in package code",
                ["params", "function", "where"],
                [(f.params, f.qualname, f.where) for f in top],
            ),
        ]
    )


# -- imports ----------------------------------------------------------------------------------------------------
def _on_path(repo: Path, packages: list[str]) -> None:
    """Put `repo` first on sys.path, and check grimp will read its packages (not an editable install's)."""
    sys.path.insert(0, str(repo))
    for pkg in packages:
        spec = importlib.util.find_spec(pkg)
        origin = Path(spec.origin).resolve() if spec and spec.origin else None
        if origin is None or not origin.is_relative_to(repo):
            raise SystemExit(f"package {pkg!r} resolves to {origin}, not under {repo}: run from a clean environment")


def shortest_cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """One shortest import cycle through each module that lies on one, among `modules` (deduplicated)."""
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    found: dict[frozenset[str], list[str]] = {}
    for start in sorted(modules):
        # breadth-first from start's imports back to start
        prev: dict[str, str] = {}
        frontier = [start]
        seen = {start}
        done = False
        while frontier and not done:
            nxt = []
            for m in frontier:
                for t in sorted(edges[m]):
                    if t == start:
                        cycle = [m]
                        while cycle[-1] != start:
                            cycle.append(prev[cycle[-1]])
                        cycle.reverse()
                        found.setdefault(frozenset(cycle), cycle)
                        done = True
                        break
                    if t not in seen:
                        seen.add(t)
                        prev[t] = m
                        nxt.append(t)
                if done:
                    break
            frontier = nxt
    return sorted(found.values(), key=lambda c: (len(c), c))


def cyclic_groups(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """The strongly connected groups (two modules or more) among `modules`: each is one knot to untie."""
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    reach: dict[str, set[str]] = {}
    for m in modules:
        seen: set[str] = set()
        todo = [m]
        while todo:
            for t in edges[todo.pop()] - seen:
                seen.add(t)
                todo.append(t)
        reach[m] = seen
    groups = {frozenset({m, *(n for n in reach[m] if m in reach[n])}) for m in modules if m in reach[m]}
    return sorted((sorted(g) for g in groups if len(g) > 1), key=lambda g: (-len(g), g))


def _short(module: str, package: str) -> str:
    return module[len(package) + 1 :] if module.startswith(package + ".") else module


def imports(repo: Path, packages: list[str]) -> str:
    _on_path(repo, packages)
    graph = grimp.build_graph(*packages, include_external_packages=True, cache_dir=None)
    cycle_rows, group_rows = [], []
    for pkg in packages:
        mods = {m for m in graph.modules if m == pkg or m.startswith(pkg + ".")}
        for cycle in shortest_cycles(graph, mods):
            cycle_rows.append((pkg, len(cycle), " → ".join(_short(m, pkg) for m in [*cycle, cycle[0]])))
        for group in cyclic_groups(graph, mods):
            group_rows.append((pkg, len(group), ", ".join(_short(m, pkg) for m in group)))
    up_rows = []
    for pkg in packages:
        rank = LAYERS.get(pkg)
        for importer in sorted(m for m in graph.modules if m == pkg or m.startswith(pkg + ".")):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                top = imported.split(".")[0]
                up = rank is not None and top in LAYERS and LAYERS[top] > rank
                orchestrator = pkg in DOMAIN and top == "prefect"
                if up or orchestrator:
                    lines = sorted(
                        d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)
                    )
                    up_rows.append(
                        (importer, imported, ", ".join(map(str, lines)), "prefect" if orchestrator else "up")
                    )
    return "\n".join(
        [
            table(
                "Cyclic groups inside each package (modules that all reach each other)",
                ["package", "modules", "group"],
                group_rows,
            ),
            table(
                "Import cycles inside each package (one shortest cycle per module on one)",
                ["package", "length", "cycle"],
                cycle_rows,
            ),
            table(
                "Imports that run up (domain → parcae/flows/tasks or a higher floor; domain → prefect)",
                ["importer", "imported", "lines", "why"],
                up_rows,
            ),
        ]
    )


# -- duplicated concepts ----------------------------------------------------------------------------------------
def _module_level_assignments(s: Source) -> Iterator[tuple[str, ast.expr | None, int]]:
    """(name, value, line) of each assignment at module or class level (not inside functions)."""

    def walk(body: list[ast.stmt]) -> Iterator[tuple[str, ast.expr | None, int]]:
        for node in body:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        yield t.id, node.value, node.lineno
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                yield node.target.id, node.value, node.lineno
            elif isinstance(node, (ast.ClassDef, ast.If, ast.Try)):
                yield from walk(node.body)

    yield from walk(s.tree.body)


def _literal(node: ast.expr | None) -> object:
    try:
        return ast.literal_eval(node) if node is not None else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.Call) and node.args:  # frozenset({...}), re.compile("..."), ...
            return _literal(node.args[0])
        return None


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (tuple, list, set, frozenset)):
        return [v for v in value if isinstance(v, str)]
    return []


@dataclass
class Concept:
    """One concept of issue 13 and where it is defined: each definition is a (place, note) pair."""

    name: str
    rule: str
    places: list[tuple[str, str]]

    def row(self) -> tuple[str, int, str, str]:
        notes = sorted({n for _, n in self.places if n})
        where = ", ".join(sorted({p for p, _ in self.places}))
        return self.name, len(self.places), "; ".join(notes) if notes else "", where or "-"


def _defaults(f: Function) -> Iterator[tuple[str, ast.expr]]:
    a = f.node.args
    positional = [*a.posonlyargs, *a.args]
    yield from zip((p.arg for p in positional[len(positional) - len(a.defaults) :]), a.defaults, strict=True)
    yield from ((p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None)


def _field_defaults(s: Source) -> Iterator[tuple[str, ast.expr, int]]:
    """Class-level ``name: T = default`` (dataclass fields): defaults as much as a parameter's."""
    for node in ast.walk(s.tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    yield stmt.target.id, stmt.value, stmt.lineno


def _persistence(srcs: list[Source]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Functions and classes with 'persist' in their name, as (definitions, adapters): an adapter calls another of them
    (a factory, a change of signature), so it adds no second definition of the forecast."""
    nodes = [(f.where, f.qualname, f.node) for f in functions(srcs) if "persist" in f.node.name.lower()]
    nodes += [
        (f"{s.path}:{n.lineno}", n.name, n)
        for s in srcs
        for n in ast.walk(s.tree)
        if isinstance(n, ast.ClassDef) and "persist" in n.name.lower()
    ]
    definitions, adapters = [], []
    for where, name, node in nodes:
        called = {
            c.func.id if isinstance(c.func, ast.Name) else c.func.attr
            for c in ast.walk(node)
            if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))
        }
        delegates = any("persist" in c.lower() and c != node.name for c in called)
        (adapters if delegates else definitions).append((where, name))
    return definitions, adapters


def _dp_holders(srcs: list[Source]) -> Iterator[tuple[str, str]]:
    """Classes other than ``Strategy`` with both D and P fields: a strategy under another name, or a concept built on
    one (the trainer's epoch geometry); listed so that a rename cannot hide a second definition."""
    for s in srcs:
        for n in ast.walk(s.tree):
            if isinstance(n, ast.ClassDef) and n.name != "Strategy":
                fields = {
                    t.target.id for t in n.body if isinstance(t, ast.AnnAssign) and isinstance(t.target, ast.Name)
                }
                if {"D", "P"} <= fields or {"d", "p"} <= fields:
                    yield f"{s.path}:{n.lineno}", n.name


def _kind_rule_functions(srcs: list[Source]) -> Iterator[tuple[str, str]]:
    """Functions that decide intra- vs inter-stage (mention both kinds): the migration-kind rule."""
    for f in functions(srcs):
        attrs = {n.attr for n in ast.walk(f.node) if isinstance(n, ast.Attribute)}
        nested = {
            g for g in ast.walk(f.node) if g is not f.node and isinstance(g, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        inner = {n.attr for g in nested for n in ast.walk(g) if isinstance(n, ast.Attribute)}
        if {"INTRA_STAGE", "INTER_STAGE"} <= attrs and not {"INTRA_STAGE", "INTER_STAGE"} <= inner:
            yield f.where, f.qualname


#: The names an interval length (the forecast's T, `DEFAULT_INTERVAL_S` in forecasting) goes by in signatures.
INTERVAL_NAMES = frozenset({"interval_s", "interval_seconds"})

#: The AWS constants forecasting/collect.py and the trainer's AWS provider (trainer/providers/) both defined,
#: recognised by value (names move).
AWS_CONSTANTS: tuple[tuple[str, Callable[[str, object], bool]], ...] = (
    ("job tag key 'parcae:job'", lambda name, v: v == "parcae:job"),
    (
        "live instance states {pending, running}",
        lambda name, v: isinstance(v, (tuple, set, frozenset, list)) and set(v) == {"pending", "running"},
    ),
    ("EC2 filter-values cap (200)", lambda name, v: v == 200 and "FILTER" in name.upper()),
    ("spot interruption status codes", lambda name, v: any("marked-for-" in x for x in _strings(v))),
    ("no-credentials hint", lambda name, v: any(x.startswith("no AWS credentials") for x in _strings(v))),
    ("no-region hint", lambda name, v: any(x.startswith("no AWS region") for x in _strings(v))),
)
#: The hints are also written by functions (a hint for what needs the credentials): recognised by how their text starts.
AWS_HINTS = {"no-credentials hint": "no AWS credentials", "no-region hint": "no AWS region"}


def _writes_text(node: ast.AST, prefix: str) -> bool:
    """Whether a string literal or f-string in `node` starts with `prefix`."""
    for n in ast.walk(node):
        first = n.values[0] if isinstance(n, ast.JoinedStr) and n.values else n
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith(prefix):
            return True
    return False


def concepts(repo: Path, srcs: list[Source]) -> str:
    funcs = list(functions(srcs))
    assigned = [(s, name, value, line) for s in srcs for name, value, line in _module_level_assignments(s)]
    classes = [(s, n) for s in srcs for n in ast.walk(s.tree) if isinstance(n, ast.ClassDef)]
    out: list[Concept] = []

    out.append(
        Concept(
            "Strategy",
            "class or alias named Strategy",
            [
                *((f"{s.path}:{n.lineno}", "class") for s, n in classes if n.name == "Strategy"),
                *((f"{s.path}:{line}", "alias") for s, name, _, line in assigned if name == "Strategy"),
            ],
        )
    )
    out.append(
        Concept("D x P under another name", "class with D and P fields, Strategy aside", list(_dp_holders(srcs)))
    )
    out.append(
        Concept(
            "persistence_forecast",
            "function named persistence_forecast",
            [(f.where, f.qualname) for f in funcs if f.node.name == "persistence_forecast"],
        )
    )
    definitions, adapters = _persistence(srcs)
    out.append(
        Concept(
            "persistence forecasting",
            "function or class with 'persist' in its name that calls no other one",
            definitions,
        )
    )
    out.append(
        Concept("persistence adapters", "function or class with 'persist' in its name that calls another one", adapters)
    )
    out.append(
        Concept(
            "PLANNERS",
            "assignment to PLANNERS",
            [(f"{s.path}:{line}", repr(_literal(v))) for s, name, v, line in assigned if name == "PLANNERS"],
        )
    )
    out.append(
        Concept("migration-kind rule", "function deciding INTRA_STAGE vs INTER_STAGE", list(_kind_rule_functions(srcs)))
    )
    out.append(
        Concept(
            "TRAINING_RUN_TAG",
            "assignment to TRAINING_RUN_TAG",
            [(f"{s.path}:{line}", repr(_literal(v))) for s, name, v, line in assigned if name == "TRAINING_RUN_TAG"],
        )
    )

    look = [(f"{f.where}", _literal(d)) for f in funcs for p, d in _defaults(f) if p == "look_ahead"]
    look += [(f"{s.path}:{line}", _literal(d)) for s in srcs for p, d, line in _field_defaults(s) if p == "look_ahead"]
    literal_look = [(w, v) for w, v in look if isinstance(v, int)]
    out.append(
        Concept(
            f"look_ahead literal defaults (distinct: {sorted({v for _, v in literal_look})})",
            "literal default of a look_ahead parameter or field",
            [(w, f"= {v}") for w, v in literal_look],
        )
    )
    out.append(
        Concept(
            "interval_s/interval_seconds = 60.0 in signatures",
            "literal default 60.0 of an interval length parameter",
            [
                (f.where, f.qualname)
                for f in funcs
                for p, d in _defaults(f)
                if p in INTERVAL_NAMES and _literal(d) == 60.0
            ],
        )
    )
    out.append(
        Concept(
            "interval_s = 60.0 in dataclass fields",
            "literal default 60.0 of an interval_s dataclass field",
            [
                (f"{s.path}:{line}", "")
                for s in srcs
                for p, d, line in _field_defaults(s)
                if p in INTERVAL_NAMES and _literal(d) == 60.0
            ],
        )
    )
    for label, match in AWS_CONSTANTS:
        hint = AWS_HINTS.get(label, "")
        out.append(
            Concept(
                f"AWS: {label}",
                "module constant recognised by value, or a function writing the hint",
                [(f"{s.path}:{line}", name) for s, name, v, line in assigned if match(name, _literal(v))]
                + [(f.where, f.qualname) for f in funcs if label in AWS_HINTS and _writes_text(f.node, hint)],
            )
        )

    uses = scan.private_uses(repo)
    packages = set(scan.root_packages(repo))
    by_kind = Counter("package code" if u.importer.split(".")[0] in packages else "benchmarks" for u in uses)
    per_importer: dict[str, set[str]] = defaultdict(set)
    for u in uses:
        per_importer[str(u.path)].add(u.target)
    rows = [c.row() for c in out]
    rows.append(
        (
            "cross-module uses of _private names",
            len(uses),
            ", ".join(f"{k}: {v}" for k, v in sorted(by_kind.items()))
            + f"; {sum(map(len, per_importer.values()))} distinct names",
            ", ".join(sorted(per_importer)) or "-",
        )
    )
    return table(
        "Definitions of each duplicated concept (issue 13)", ["concept", "count", "values / names", "where"], rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=HERE, help="the checkout to measure (default: this one)")
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    packages = scan.root_packages(repo)
    srcs = sources(repo)
    print(f"## Structure of {repo} (packages: {', '.join(packages)})\n")
    print(largest_files(srcs))
    print(signatures(srcs))
    print(imports(repo, packages))
    print(concepts(repo, srcs))
    print(longest_docstrings(srcs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
