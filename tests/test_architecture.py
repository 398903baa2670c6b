"""The package's shape, checked: imports run one way, modules and functions stay small.

docs/architecture.md describes the layers; these tests keep the code honest about them. They
read the source with :mod:`ast` (nothing is imported), so they are fast and see function-level
imports too.

What counts as an import of module M by module N (the graph every check below reads):

- every ``import``/``from`` statement in N, at module level or inside a function (a function-level
  import runs the first time the function does: it hides a cycle, it does not remove it);
- ``import jemeval.a.b`` and ``from jemeval.a import b`` (``b`` a module) depend on ``jemeval.a.b``;
  ``from jemeval.a import name`` (``name`` defined or re-exported in ``a/__init__.py``) depends on
  the package ``jemeval.a``, whose own imports then carry the dependency further;
- relative imports are resolved like Python does (and refused: jemeval imports absolutely);
- the parent packages Python imports implicitly (``jemeval``, ``jemeval.a`` for ``jemeval.a.b``)
  are not counted: a package's ``__init__`` re-exporting its submodules would otherwise make every
  import of a submodule a "cycle";
- imports under ``if TYPE_CHECKING:`` never run, but they count, in the cycle check as in the layering
  rules: a module that names another's type depends on it as surely as one that calls it. A loop
  through a type-only import does not break an import, it tangles two modules' jobs (training/'s
  checkpointing -> parts -> config -> checkpointing was one; the shared type moved to a lower module,
  :mod:`jemeval.training.position`, instead). ``build_graph(..., runtime_only=True)`` still leaves them
  out, to tell a loop that would break an import from one that only tangles.
"""
from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jemeval"
DOC = PACKAGE.parent / "docs" / "architecture.md"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400


# -- reading the source ---------------------------------------------------------------------------
def find_modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``*.py`` of ``package`` (a package is its ``__init__``)."""
    mods = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


MODULES = find_modules(PACKAGE)


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_statements(tree: ast.AST):
    """``(node, in_function, type_checking_only)`` for every import statement of a module."""
    def visit(node, in_function, typing_only):
        for field, value in ast.iter_fields(node):
            for child in value if isinstance(value, list) else [value]:
                if not isinstance(child, ast.AST):
                    continue
                typing = typing_only or (isinstance(node, ast.If) and field == "body" and _is_type_checking(node.test))
                function = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    yield child, function, typing
                yield from visit(child, function, typing)

    yield from visit(tree, False, False)


def _source(modules: dict[str, Path], module: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if modules[module].name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known(modules: dict[str, Path], name: str) -> str:
    """The longest prefix of ``name`` that is one of ``modules`` ("" for a third-party module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def import_targets(modules: dict[str, Path], module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules of ``modules`` that one import statement of ``module`` depends on (see above)."""
    if isinstance(node, ast.Import):
        found = [_known(modules, alias.name) for alias in node.names]
    else:
        source = _source(modules, module, node)
        found = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else _known(modules, source)
                 for a in node.names]
    return [t for t in found if t and t != module]


def build_graph(modules: dict[str, Path], *, runtime_only: bool) -> dict[str, set[str]]:
    """Module -> the modules it imports; ``runtime_only`` leaves out ``if TYPE_CHECKING:`` imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node, _, typing in import_statements(_parse(path)):
            if not (runtime_only and typing):
                graph[name].update(import_targets(modules, name, node))
    return graph


@functools.cache
def import_graph(runtime_only: bool = False) -> dict[str, set[str]]:
    return build_graph(MODULES, runtime_only=runtime_only)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


# -- the package's imports ------------------------------------------------------------------------
def test_no_import_cycles_module_function_or_type_level():
    """No loop anywhere in jemeval, through module-level, function-level or ``TYPE_CHECKING`` imports."""
    assert find_cycles(import_graph()) == []


def test_imports_are_absolute():
    relative = [f"{name}:{node.lineno}" for name, path in MODULES.items()
                for node, _, _ in import_statements(_parse(path)) if isinstance(node, ast.ImportFrom) and node.level]
    assert relative == [], f"write `from jemeval.x import y`, not a relative import: {relative}"


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module defines itself (functions, classes, assignments), not those it imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def test_names_are_imported_from_the_module_that_defines_them():
    """Inside jemeval, ``from jemeval.pkg import name`` reads only what ``pkg/__init__`` itself defines:
    a re-export (or a lazy ``__getattr__`` name) hides the real dependency from readers and tools."""
    borrowed = []
    for name, path in MODULES.items():
        for node, _, _ in import_statements(_parse(path)):
            if not isinstance(node, ast.ImportFrom) or node.level:
                continue
            source = node.module or ""
            if source not in MODULES or MODULES[source].name != "__init__.py":
                continue
            own = _top_level_names(_parse(MODULES[source]))
            borrowed += [f"{name}:{node.lineno} {source}.{a.name}" for a in node.names
                         if f"{source}.{a.name}" not in MODULES and a.name not in own]
    assert borrowed == [], f"import these from their defining module: {borrowed}"


LAYERS = [
    # the core knows nothing of the commands built on it
    ("jemeval.sampling", "jemeval.evaluation"),
    ("jemeval.sampling", "jemeval.training"),
    ("jemeval.formats", "jemeval.evaluation"),
    ("jemeval.formats", "jemeval.training"),
    ("jemeval.energy", "jemeval.sampling"),
    ("jemeval.runtime", "jemeval.sampling"),
    # a cache stores what a capability derived; it does not call the capability
    ("jemeval.caches", "jemeval.evaluation"),
    ("jemeval.caches", "jemeval.training"),
    # evaluation and training reach built-in components only through the registry
    ("jemeval.evaluation", "jemeval.builtins"),
    ("jemeval.training", "jemeval.builtins"),
    ("jemeval.evaluation", "jemeval.training"),
    # evaluation computes and returns data; drawing it is the command line's job
    ("jemeval.evaluation", "jemeval.plots"),
    # reports sit above evaluation and plots: nothing below them reaches up
    ("jemeval.evaluation", "jemeval.reports"),
    ("jemeval.training", "jemeval.reports"),
    ("jemeval.plots", "jemeval.reports"),
    ("jemeval.caches", "jemeval.reports"),
    # the run context is core: every layer above takes it, it knows none of them
    ("jemeval.context", "jemeval.evaluation"),
    ("jemeval.context", "jemeval.training"),
    ("jemeval.context", "jemeval.reports"),
]


@pytest.mark.parametrize("layer, forbidden", LAYERS)
def test_layers_import_one_way(layer, forbidden):
    assert any(_within(m, layer) for m in MODULES), f"{layer} does not exist: update LAYERS"
    graph = import_graph()
    bad = sorted((m, t) for m, ts in graph.items() if _within(m, layer) for t in ts if _within(t, forbidden))
    assert bad == [], f"{layer} must not import {forbidden}: {bad}"


#: the modules directly in jemeval/ that may draw or present: the public API (lazy), ``python -m``, the
#: plugin commands' group; every other top-level module is the core and draws nothing
PRESENTATION_TOP_LEVEL = {"jemeval", "jemeval.__main__", "jemeval.command_group"}


def test_nothing_below_the_plots_imports_them():
    """Data and the core never draw: evaluation/, sampling/, formats/, energy/, runtime/, caches/ and
    the top-level modules (artifacts, results, data, ...) do not import plots/, even inside a function."""
    low = ("jemeval.evaluation", "jemeval.sampling", "jemeval.formats", "jemeval.energy", "jemeval.runtime",
           "jemeval.caches")
    top = [m for m, path in MODULES.items() if m.count(".") == 1 and path.name != "__init__.py"
           and m not in PRESENTATION_TOP_LEVEL]
    assert "jemeval.artifacts" in top and "jemeval.results" in top
    graph = import_graph()
    bad = sorted((m, t) for m, ts in graph.items() if (any(_within(m, p) for p in low) or m in top)
                 for t in ts if _within(t, "jemeval.plots") or _within(t, "jemeval.cli"))
    assert bad == [], f"these import plots/ or cli/ from below them: {bad}"


def test_nothing_below_the_command_line_imports_it():
    """Presentation sits on top: only ``python -m jemeval`` (``__main__``) reaches into jemeval.cli."""
    bad = sorted((m, t) for m, ts in import_graph().items() if not _within(m, "jemeval.cli")
                 and m != "jemeval.__main__" for t in ts if _within(t, "jemeval.cli"))
    assert bad == []


def test_foundations_import_nothing_above_them():
    """Every module may use errors and atomic writes, so they may use nothing (but errors) themselves."""
    graph = import_graph()
    assert graph.get("jemeval.errors", set()) == set()
    assert graph.get("jemeval.atomic", set()) <= {"jemeval.errors"}


def _cli_flags() -> set[str]:
    """Every flag of every ``jemeval`` command (the one check here that imports the package: the
    command line itself is the only exact list of its flags)."""
    import click

    from jemeval.cli import cli

    ctx, flags = click.Context(cli), set()

    def walk(command: click.Command) -> None:
        for param in command.params:
            flags.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name))

    walk(cli)
    return flags


def test_core_errors_name_parameters_not_flags():
    """Outside jemeval/cli an error names the Python parameter (``UsageError(..., param="lr")``); the
    command line rewrites it to the flag that sets it. A flag of another tool (torchrun's) is fine."""
    flags, found = _cli_flags(), []
    for name, path in MODULES.items():
        if _within(name, "jemeval.cli"):
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Raise) and node.exc is not None:
                for part in ast.walk(node.exc):
                    if isinstance(part, ast.Constant) and isinstance(part.value, str):
                        found += [f"{name}:{node.lineno} {f}" for f in
                                  re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", part.value) if f in flags]
    assert found == [], f"command-line flags in core error messages: {found}"


# -- size -----------------------------------------------------------------------------------------
def test_no_function_over_the_limit():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(_parse(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name} ({lines} lines)")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_module_over_the_limit():
    big = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    assert {n: c for n, c in big.items() if c > MAX_MODULE_LINES} == {}


# -- the map --------------------------------------------------------------------------------------
_TREE_PREFIX = re.compile(r"^[\s│├└─|`+\\-]*")
_TREE_NAME = re.compile(r"[A-Za-z_][\w.-]*/?")


def tree_paths(markdown: str) -> set[str]:
    """The file paths drawn as folder trees in ``markdown``'s fenced code blocks: a name indented
    deeper than a ``folder/`` line above it lies in that folder (``tree`` and hand-drawn styles)."""
    paths, stack, fenced = set(), [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced, stack = not fenced, []
            continue
        if not fenced:
            continue
        column = _TREE_PREFIX.match(line).end()
        name = _TREE_NAME.match(line, column)
        if name is None:
            continue
        while stack and stack[-1][0] >= column:
            stack.pop()
        path = "".join(folder for _, folder in stack) + name.group()
        if path.endswith("/"):
            stack.append((column, name.group()))
        else:
            paths.add(path)
    return paths


def undocumented(modules: dict[str, Path], doc: str) -> list[str]:
    """Modules the doc names neither by path (``sampling/sgld.py``, with or without ``jemeval/``)
    nor as a line of a folder tree. A bare file name is not enough: ``metrics.py`` is two modules."""
    drawn = {p.removeprefix("jemeval/") for p in tree_paths(doc)}
    missing = []
    for name, path in modules.items():
        short = path.relative_to(PACKAGE).as_posix() if path.is_relative_to(PACKAGE) else path.name
        if path.name == "__init__.py" and name != "jemeval":
            continue  # a package is named by its folder
        if short not in drawn and not re.search(rf"(?<![\w/.-])(jemeval/)?{re.escape(short)}(?![\w])", doc):
            missing.append(f"jemeval/{short}")
    return missing


def test_architecture_doc_names_every_module():
    assert DOC.exists(), "docs/architecture.md (the one-page map of the package) is missing"
    missing = undocumented(MODULES, DOC.read_text())
    assert missing == [], f"docs/architecture.md does not mention: {missing}"


# -- the checks above, checked on a package written for them ----------------------------------------
@pytest.fixture
def toy(tmp_path):
    files = {
        "__init__.py": "from toy.a import A\nVERSION = 1\n",
        "a.py": "from typing import TYPE_CHECKING\nfrom toy import b\nA = 1\n"
                "if TYPE_CHECKING:\n    from toy.c import C\n",
        "b.py": "import os\n\ndef f():\n    from . import c\n    return c\n",
        "c.py": "import toy.sub.d as d\nfrom toy import VERSION, A\nC = 3\n",
        "sub/__init__.py": "",
        "sub/d.py": "from ..b import f\nfrom . import e\nimport numpy\n",
        "sub/e.py": "import typing\nif typing.TYPE_CHECKING:\n    from toy.sub import d\nelse:\n    import toy.sub\n",
    }
    for rel, text in files.items():
        (tmp_path / "toy" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "toy" / rel).write_text(text)
    return find_modules(tmp_path / "toy")


def test_graph_resolves_every_import_form(toy):
    assert sorted(toy) == ["toy", "toy.a", "toy.b", "toy.c", "toy.sub", "toy.sub.d", "toy.sub.e"]
    graph = build_graph(toy, runtime_only=False)
    assert graph["toy"] == {"toy.a"}
    assert graph["toy.a"] == {"toy.b", "toy.c"}  # `from pkg import module`; the TYPE_CHECKING import
    assert graph["toy.b"] == {"toy.c"}  # function-level and relative; `os` is not ours
    assert graph["toy.c"] == {"toy.sub.d", "toy"}  # `import a.b as x`; names from a package __init__
    assert graph["toy.sub.d"] == {"toy.b", "toy.sub.e"}  # `from ..b`, `from . import e` in a module
    assert graph["toy.sub.e"] == {"toy.sub.d", "toy.sub"}  # typing.TYPE_CHECKING's body and its else
    runtime = build_graph(toy, runtime_only=True)
    assert runtime["toy.a"] == {"toy.b"} and runtime["toy.sub.e"] == {"toy.sub"}  # the else branch runs


def test_cycles_through_function_level_imports_count_and_type_checking_ones_only_in_the_full_graph(toy):
    # toy -> a -> b -(in a function)-> c -> toy, and c -> sub.d -> b
    assert find_cycles(build_graph(toy, runtime_only=True)) == [["toy", "toy.a", "toy.b", "toy.c", "toy.sub.d"]]
    # sub.d <-> sub.e exists only through e's TYPE_CHECKING import: the package check (the full graph) finds it
    assert ["toy.sub.d", "toy.sub.e"] not in find_cycles(build_graph(toy, runtime_only=True))
    everything = find_cycles(build_graph(toy, runtime_only=False))
    assert any({"toy.sub.d", "toy.sub.e"} <= set(c) for c in everything)
    assert find_cycles({"x": {"y"}, "y": {"z"}}) == []


def test_doc_check_needs_a_path_or_a_tree_line():
    tree = """A map.

```
jemeval/
├── errors.py          one-line errors
├── sampling/
│   ├── sgld.py        the SGLD update
│   └── buffer.py
└── evaluation/
    └── metrics.py
```
Also `builtins/metrics.py`, jemeval/data.py and plots.py; model.py alone names no nested module.
"""
    assert tree_paths(tree) == {"jemeval/errors.py", "jemeval/sampling/sgld.py", "jemeval/sampling/buffer.py",
                                "jemeval/evaluation/metrics.py"}
    flat = {f"jemeval.{p[:-3].replace('/', '.')}": PACKAGE / p for p in
            ["errors.py", "sampling/sgld.py", "sampling/buffer.py", "evaluation/metrics.py", "builtins/metrics.py",
             "data.py", "plots.py", "energy/model.py", "training/metrics.py"]}
    assert undocumented(flat, tree) == ["jemeval/energy/model.py", "jemeval/training/metrics.py"]
