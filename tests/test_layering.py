"""Layering holds: TensorFlow only in trainer_runtime, Textual only in gpuwatch/app."""

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
        "gpuwatch.cli", "gpuwatch.app", "gpuwatch.supervisor", "gpuwatch.headless",
        "gpuwatch.config", "gpuwatch.sampling", "gpuwatch.export", "gpuwatch.tboard",
    )
    assert "tensorflow" not in loaded
    assert "keras" not in loaded


def test_non_app_modules_never_import_textual() -> None:
    loaded = _imported_modules(
        "gpuwatch.cli", "gpuwatch.supervisor", "gpuwatch.headless", "gpuwatch.config",
        "gpuwatch.runstate", "gpuwatch.advisor", "gpuwatch.sampling", "gpuwatch.client",
        "gpuwatch.settings_form", "gpuwatch.export", "gpuwatch.tboard",
        "gpuwatch.snapshot", "gpuwatch.sketch", "gpuwatch.series", "gpuwatch.breakdown",
    )
    assert "textual" not in loaded


def test_help_path_imports_nothing_heavy() -> None:
    # `gpuwatch --help` must be instant: the CLI module itself loads no heavy library.
    loaded = _imported_modules("gpuwatch.cli")
    assert not loaded & {"textual", "tensorflow", "pydantic", "yaml", "pynvml", "psutil"}


def test_protocol_and_schema_are_tensorflow_free() -> None:
    loaded = _imported_modules("trainer_runtime.protocol", "trainer_runtime.schema")
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
