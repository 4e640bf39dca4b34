"""Layering holds: TensorFlow only in trainer_runtime, Textual only in gpuwatch/app, and the
dashboard imports only what a client needs."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imported_modules(*modules: str) -> set[str]:
    """Import modules in a fresh interpreter and return the top-level names in sys.modules."""
    code = (
        "import importlib, json, sys\n"
        f"for name in {list(modules)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _static_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_cli_app_and_supervisor_never_import_tensorflow() -> None:
    loaded = _imported_modules(
        "gpuwatch.cli", "gpuwatch.app", "gpuwatch.supervisor", "gpuwatch.cli.headless",
        "gpuwatch.config", "gpuwatch.sampling", "gpuwatch.runs.export",
        "gpuwatch.supervisor.tboard",
    )
    assert "tensorflow" not in loaded
    assert "keras" not in loaded


def test_non_app_modules_never_import_textual() -> None:
    loaded = _imported_modules(
        "gpuwatch.cli", "gpuwatch.supervisor", "gpuwatch.cli.headless", "gpuwatch.config",
        "gpuwatch.runstate", "gpuwatch.advisor", "gpuwatch.sampling", "gpuwatch.follow.client",
        "gpuwatch.follow.link", "gpuwatch.follow.record_reader",
        "gpuwatch.config.settings_form", "gpuwatch.runs.export", "gpuwatch.supervisor.tboard",
        "gpuwatch.runstate.codec", "gpuwatch.measures.sketch", "gpuwatch.measures.series",
        "gpuwatch.measures.breakdown",
    )
    assert "textual" not in loaded


def test_help_path_imports_nothing_heavy() -> None:
    # `gpuwatch --help` must be instant: the CLI module itself loads no heavy library.
    loaded = _imported_modules("gpuwatch.cli")
    assert not loaded & {"textual", "tensorflow", "pydantic", "yaml", "pynvml", "psutil"}


def test_protocol_and_schema_are_tensorflow_free() -> None:
    loaded = _imported_modules("trainer_runtime.protocol", "trainer_runtime.schema",
                               "trainer_runtime.changes")
    assert not loaded & {"tensorflow", "keras", "textual", "gpuwatch"}


@pytest.mark.parametrize(
    ("package", "forbidden", "allowed_under"),
    [
        ("gpuwatch", "tensorflow", None),
        ("gpuwatch", "keras", None),
        ("gpuwatch", "textual", "gpuwatch/app"),
        ("gpuwatch", "pynvml", "gpuwatch/sampling"),
        ("trainer_runtime", "textual", None),
        ("trainer_runtime", "gpuwatch", None),
    ],
)
def test_static_imports_respect_the_layers(
    package: str, forbidden: str, allowed_under: str | None
) -> None:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if allowed_under and rel.startswith(allowed_under + "/"):
            continue
        if forbidden in _static_imports(path):
            offenders.append(rel)
    assert offenders == [], f"{forbidden} imported outside its layer: {offenders}"


# -- no import cycles between modules ------------------------------------------------------

PACKAGES = ("gpuwatch", "trainer_runtime")

# Imports (importer, imported) left out of the cycle check. Empty: every cycle that was
# there when the check came in is broken; keep it so.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()


def _module_files(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package by its __init__.py)."""
    files: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def _import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Each module of the packages -> the modules of the packages it imports.

    Every import statement counts: at the top, under ``if TYPE_CHECKING:``, inside a
    function. ``import a.b.c`` and ``from a.b import c`` (c a submodule) import a.b.c;
    ``from a.b import name`` (anything else) imports a.b, its __init__. Relative imports
    are resolved. The packages an import initialises on its way (a, a.b) are not edges:
    a package whose __init__ imports its own submodules is no cycle with them, but a
    submodule that takes a name through its package (``from a.b import name`` in a.b.x,
    when a/b/__init__.py imports a.b.x) is one: it imports its sibling directly instead.
    """
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in files)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                for alias in node.names:
                    if f"{module}.{alias.name}" in files:
                        edges.add(f"{module}.{alias.name}")
                    elif module in files:
                        edges.add(module)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_reads_every_kind_of_import(tmp_path: Path) -> None:
    sources = {
        "pkg/__init__.py": "from pkg.sub import thing\nfrom . import other\n",
        "pkg/sub.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.deep.leaf\n"
        ),
        "pkg/other.py": "def f():\n    from .sub import thing\n    from pkg import deep\n",
        "pkg/deep/__init__.py": "",
        "pkg/deep/leaf.py": "from .. import thing\nfrom ..other import f\nimport json\n",
        "outside.py": "import pkg\n",
    }
    for rel, text in sources.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert _import_graph(_module_files(tmp_path, ("pkg",))) == {
        "pkg": {"pkg.sub", "pkg.other"},
        "pkg.sub": {"pkg.deep.leaf"},  # under TYPE_CHECKING
        "pkg.other": {"pkg.sub", "pkg.deep"},  # inside a function, relative and absolute
        "pkg.deep": set(),
        "pkg.deep.leaf": {"pkg", "pkg.other"},  # a name of pkg's own: pkg's __init__
    }
    assert _cycles(_import_graph(_module_files(tmp_path, ("pkg",)))) == [
        ["pkg", "pkg.deep.leaf", "pkg.other", "pkg.sub"]
    ]


def test_no_module_takes_part_in_an_import_cycle() -> None:
    graph = _import_graph(_module_files())
    for importer, imported in KNOWN_CYCLE_EDGES:
        graph.get(importer, set()).discard(imported)
    cycles = _cycles(graph)
    shown = [
        ", ".join(f"{m} -> {o}" for m in cycle for o in sorted(graph[m]) if o in cycle)
        for cycle in cycles
    ]
    assert cycles == [], "import cycles (each module's imports inside it):\n" + "\n".join(shown)


# -- the dashboard imports only what a client needs -------------------------------------------

# What gpuwatch/app/ may import (every import counts: at the top, for types, in a function):
# the run as a client sees it. The links it follows a run through (gpuwatch.follow), the fold
# and what its figures mean (runstate, measures, advisor), the config's checks and words (the
# settings screen), the run folders (the runs menu), and the Textual-free half of
# trainer_runtime. Never the supervisor, the command line, the sampler, or how a run is
# started, resumed or exported: an ended run's resume is follow/link.py's to start.
APP_MAY_IMPORT = (
    "gpuwatch.app", "gpuwatch.follow", "gpuwatch.runstate", "gpuwatch.measures",
    "gpuwatch.advisor", "gpuwatch.config", "gpuwatch.runs.folders",
    "trainer_runtime.protocol", "trainer_runtime.schema", "trainer_runtime.changes",
)


def _app_may_import(module: str) -> bool:
    return any(module == allowed or module.startswith(allowed + ".")
               for allowed in APP_MAY_IMPORT)


def test_the_app_rule_tells_a_client_s_modules_from_the_rest() -> None:
    assert _app_may_import("gpuwatch.follow.link")
    assert _app_may_import("gpuwatch.runs.folders")
    assert not _app_may_import("gpuwatch.runs.spawn")
    assert not _app_may_import("gpuwatch.supervisor")
    assert not _app_may_import("gpuwatch.cli.headless")
    assert not _app_may_import("gpuwatch")  # a name of gpuwatch's own __init__


def test_the_dashboard_imports_only_what_a_client_needs() -> None:
    graph = _import_graph(_module_files())
    offenders = sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if module == "gpuwatch.app" or module.startswith("gpuwatch.app.")
        for imported in imports
        if not _app_may_import(imported)
    )
    assert offenders == [], "gpuwatch/app/ imports what a client does not need:\n" + "\n".join(
        offenders)


# -- no module over 700 lines ----------------------------------------------------------------

MAX_MODULE_LINES = 700


def test_no_module_is_over_700_lines() -> None:
    over = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            lines = len(path.read_text().splitlines())
            if lines > MAX_MODULE_LINES:
                over[rel] = lines
    assert over == {}, f"over {MAX_MODULE_LINES} lines: {over}"
