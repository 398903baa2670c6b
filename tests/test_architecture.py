"""The package's shape, checked: imports run one way, modules and functions stay small.

docs/architecture.md describes the layers; these tests keep the code honest about them. They
read the source with :mod:`ast` (nothing is imported), so they are fast and see function-level
imports too.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jemeval"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _targets(module: str, node: ast.AST) -> list[str]:
    """The jemeval modules an import statement depends on.

    ``from .pkg import sub`` depends on ``pkg.sub`` when ``sub`` is a module, else on ``pkg``
    (a name defined in its ``__init__``). A parent package that Python imports implicitly is not
    counted: that would make every package with re-exports a "cycle".
    """
    if isinstance(node, ast.Import):
        return [_known(alias.name) for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if _is_package(module) else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        out.append(sub if sub in MODULES else _known(source))
    return out


def _known(name: str) -> str:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(name, node):
                    if target and target != name and target.startswith("jemeval"):
                        graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_module_or_function_level():
    assert _cycles(import_graph()) == []


def _imports(module_prefix: str) -> set[tuple[str, str]]:
    graph = import_graph()
    return {(m, t) for m, ts in graph.items() if m == module_prefix or m.startswith(module_prefix + ".") for t in ts}


@pytest.mark.parametrize("layer, forbidden", [
    # presentation sits on top: nothing below the command line imports it
    ("jemeval.evaluation", "jemeval.cli"),
    ("jemeval.training", "jemeval.cli"),
    ("jemeval.builtins", "jemeval.cli"),
    ("jemeval.sampling", "jemeval.cli"),
    ("jemeval.formats", "jemeval.cli"),
    ("jemeval.runtime", "jemeval.cli"),
    # the core knows nothing of the commands built on it
    ("jemeval.sampling", "jemeval.evaluation"),
    ("jemeval.sampling", "jemeval.training"),
    ("jemeval.formats", "jemeval.evaluation"),
    ("jemeval.formats", "jemeval.training"),
    ("jemeval.energy", "jemeval.sampling"),
    ("jemeval.runtime", "jemeval.sampling"),
    # evaluation and training reach built-in components only through the registry
    ("jemeval.evaluation", "jemeval.builtins"),
    ("jemeval.training", "jemeval.builtins"),
    ("jemeval.evaluation", "jemeval.training"),
])
def test_layers_import_one_way(layer, forbidden):
    if not any(m == layer or m.startswith(layer + ".") for m in MODULES):
        pytest.skip(f"{layer} does not exist")
    bad = sorted((m, t) for m, t in _imports(layer) if t == forbidden or t.startswith(forbidden + "."))
    assert bad == [], f"{layer} must not import {forbidden}: {bad}"


def test_no_function_over_the_limit():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name} ({lines} lines)")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_module_over_the_limit():
    big = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {n: c for n, c in big.items() if c > MAX_MODULE_LINES} == {}


def test_architecture_doc_names_every_module():
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    missing = []
    for name, path in MODULES.items():
        rel = path.relative_to(PACKAGE.parent).as_posix()
        short = rel.removeprefix("jemeval/")
        if path.name == "__init__.py" and name != "jemeval":
            continue  # a package is named by its folder
        if rel not in doc and short not in doc and path.name not in doc:
            missing.append(rel)
    assert missing == [], f"docs/architecture.md does not mention: {missing}"
