"""Import-graph check for handlers/: no import circle, and no import from the serving code into the project's tools.

    python -m scripts.import_graph            # exit 0 when clean; exit 1 with each circle's files and import lines
    python -m scripts.import_graph --json     # the same findings for machines

Arrows inside handlers/ point down (core <- text/generation engines <- dialects <- entry modules). A circle held
apart only by an import inside a function still couples the modules both ways, so this check reads every module with
`ast` and counts module-level AND function-level imports of project modules as edges; a circle is reported whichever
kind of import closes it. `from package import name` is an edge to `package.name` when that is a submodule, else to
`package`; relative imports are resolved against the importing module.

What is not an edge: an import under `if TYPE_CHECKING:` (annotations only, never executed, so it cannot close a
circle at run time; such a type belongs in the lower layer all the same). Importing `a.b.c` also runs the `__init__`
of `a.b`; that counts as an edge to `a.b`, except from a module inside `a.b` itself (a package importing its own
submodules is not a circle).

The handlers run inside TorchServe workers, where scripts/, loadtests/ and tests/ are not packaged into the archive,
so any import of those from handlers/ is reported as well.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "handlers"
FORBIDDEN = ("scripts", "loadtests", "tests")


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported project module, dotted
    file: str  # importing file, relative to the root
    line: int
    text: str  # the import statement as written
    in_function: bool


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name, its file being __init__.py)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """(import node, inside a function) for every executed import; `if TYPE_CHECKING:` bodies are skipped."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, in_function))
            elif isinstance(child, ast.If) and is_type_checking(child.test):
                for other in child.orelse:
                    visit(ast.Module(body=[other], type_ignores=[]), in_function)
            else:
                visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(tree, False)
    return found


def absolute_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The dotted module a `from ... import` names, relative levels resolved against the importing module."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    # Level 1 is the importing module's own package: the module itself when it is a package's __init__.
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = parts[:keep]
    if node.module:
        base.append(node.module)
    return ".".join(base)


def named_modules(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The dotted names an import statement loads (project or not)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = absolute_base(module, is_package, node)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def with_packages(target: str, source: str, known: set[str]) -> list[str]:
    """The target and the package __init__s above it that importing it runs, less the source's own packages."""
    parts = target.split(".")
    chain = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    own = {".".join(source.split(".")[:i]) for i in range(1, source.count(".") + 1)}
    return [name for name in chain if name in known and name not in own and name != source]


def scan(root: Path, package: str) -> tuple[list[Edge], list[Edge]]:
    """(edges between the package's modules, imports of forbidden top-level packages)."""
    files = module_files(root, package)
    known = set(files)
    edges: list[Edge] = []
    forbidden: list[Edge] = []
    for module, path in files.items():
        source_text = path.read_text()
        tree = ast.parse(source_text, filename=str(path))
        lines = source_text.splitlines()
        is_package = path.name == "__init__.py"
        rel = str(path.relative_to(root))
        for node, in_function in imports_of(tree):
            text = lines[node.lineno - 1].strip()
            for name in named_modules(module, is_package, node, known):
                top = name.split(".")[0]
                if top in FORBIDDEN:
                    forbidden.append(Edge(module, name, rel, node.lineno, text, in_function))
                for target in with_packages(name, module, known):
                    edges.append(Edge(module, target, rel, node.lineno, text, in_function))
    # `from a import x, y` names a once per imported name: one edge per statement and target is enough.
    return list(dict.fromkeys(edges)), forbidden


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module an import chain from ``start`` reaches (itself only through a chain back to it)."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def strongly_connected(nodes: set[str], edges: list[Edge]) -> list[list[str]]:
    """The circles: groups of modules that each reach all the others (or a module that reaches itself), each sorted,
    largest first. A few hundred modules at most, so plain reachability per module is fast enough and easy to read."""
    graph: dict[str, set[str]] = {node: set() for node in nodes}
    for edge in edges:
        graph[edge.source].add(edge.target)
    reach = {node: reachable(graph, node) for node in graph}
    components: set[tuple[str, ...]] = set()
    for node in graph:
        if node in reach[node]:
            components.add(tuple(sorted(other for other in reach[node] if node in reach[other])))
    return sorted((list(c) for c in components), key=lambda c: (-len(c), c))


def check(root: Path = ROOT, package: str = PACKAGE) -> dict:
    """The findings: circles (each with its modules and the import lines inside it) and forbidden imports."""
    edges, forbidden = scan(root, package)
    nodes = set(module_files(root, package))
    circles = []
    for component in strongly_connected(nodes, edges):
        members = set(component)
        inside = [e for e in edges if e.source in members and e.target in members]
        circles.append({"modules": component, "imports": [asdict(e) for e in inside]})
    return {"circles": circles, "forbidden": [asdict(e) for e in forbidden]}


def report(findings: dict) -> str:
    out = []
    for number, circle in enumerate(findings["circles"], 1):
        out.append(f"circle {number}: {len(circle['modules'])} modules import each other")
        for edge in circle["imports"]:
            where = " (inside a function)" if edge["in_function"] else ""
            out.append(f"  {edge['file']}:{edge['line']}: {edge['text']}  -> {edge['target']}{where}")
    if findings["forbidden"]:
        out.append(f"imports from {PACKAGE}/ into {', '.join(FORBIDDEN)} (not in the model archive):")
        for edge in findings["forbidden"]:
            out.append(f"  {edge['file']}:{edge['line']}: {edge['text']}")
    return "\n".join(out) if out else f"{PACKAGE}/: no import circle, no import of {', '.join(FORBIDDEN)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.import_graph",
        description="Report import circles inside handlers/ (function-level imports count) and imports from "
        "handlers/ into scripts/, loadtests/ or tests/. Exit 1 when there is any, else 0.",
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="project root (default: this checkout)")
    parser.add_argument("--package", default=PACKAGE, help=f"package to check under the root (default: {PACKAGE})")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    findings = check(args.root, args.package)
    print(json.dumps(findings, indent=2) if args.json else report(findings))
    return 1 if findings["circles"] or findings["forbidden"] else 0


if __name__ == "__main__":
    sys.exit(main())
