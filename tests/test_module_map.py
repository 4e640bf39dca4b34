"""docs/internals.md is the one module map, and it stays true; so does every path a
docstring, a comment or a doc names.

A module added, moved or removed without the map said so fails here; so does a
docstring that cites a file that is not there.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpuwatch", "trainer_runtime")
MAP_SECTIONS = ("## Module map", "## The supervisor's parts")


def modules() -> list[Path]:
    """Every module of the two packages (their __init__.py aside: a package is named by
    its folder)."""
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
                  if "__pycache__" not in path.parts and path.name != "__init__.py")


def map_text() -> str:
    text = (ROOT / "docs" / "internals.md").read_text(encoding="utf-8")
    found = []
    for heading in MAP_SECTIONS:
        assert heading in text, f"docs/internals.md has no {heading!r}"
        found.append(text.split(heading, 1)[1].split("\n## ", 1)[0])
    return "\n".join(found)


def named(text: str) -> set[str]:
    """What the text names in backticks: `core.py`, `widgets/`, `header`."""
    return set(re.findall(r"`([\w/.]+)`", text))


def test_the_map_names_every_module():
    names = named(map_text())
    missing = [str(path.relative_to(ROOT)) for path in modules()
               if path.name not in names and path.stem not in names
               and not any(name.endswith("/" + path.name) for name in names)]
    assert not missing, f"modules docs/internals.md's map does not name: {missing}"


def test_every_module_the_map_names_exists():
    files = {path.name for path in modules()}
    folders = {path.parent.name for path in modules()}
    names = named(map_text())
    gone = sorted(name for name in names if name.endswith(".py")
                  and name.rsplit("/", 1)[-1] not in files | {"__init__.py"})
    gone += sorted(name for name in names if name.endswith("/")
                   and name.rstrip("/").rsplit("/", 1)[-1] not in folders | set(PACKAGES))
    assert not gone, f"docs/internals.md's map names what is not there: {gone}"


# A path of this repository as prose writes one: gpuwatch/cli/start.py, tests/support/, docs/x.md.
PATH = re.compile(r"(?<![\w/.-])((?:gpuwatch|trainer_runtime|tests|bench|docs|demo)/[\w/.-]*\w)")


def texts() -> list[Path]:
    found = [path for package in (*PACKAGES, "bench") for path in (ROOT / package).rglob("*.py")
             if "__pycache__" not in path.parts]
    return [*found, *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]


def test_every_path_a_docstring_comment_or_doc_names_exists():
    gone = []
    for path in texts():
        for match in PATH.finditer(path.read_text(encoding="utf-8")):
            cited = match.group(1).rstrip(".")
            if not (ROOT / cited).exists():
                gone.append(f"{path.relative_to(ROOT)}: {cited}")
    assert not gone, "paths that are not there:\n" + "\n".join(gone)


# Folders of tests/ that mirror no package: the slow end-to-end tests, the GPU box's,
# and what the tests share. The house's own checks (this module among them) sit at the top.
NOT_MIRRORS = {"integration", "gpu", "support", "data"}


def test_the_tests_mirror_the_packages():
    """A module's quick tests are in the folder named after its package (tests/runs/ for
    gpuwatch/runs/, tests/trainer_runtime/ for trainer_runtime/); every module with a test
    marked slow (real processes) is under tests/integration/ (or tests/gpu/). The trainer's
    in-process tests share tests/integration/trainer/ and its fixtures, quick ones too."""
    tests = ROOT / "tests"
    packages = {path.name for path in (ROOT / "gpuwatch").iterdir()
                if (path / "__init__.py").exists()} | {"trainer_runtime"}
    folders = {path.name for path in tests.iterdir()
               if path.is_dir() and (path / "__init__.py").exists()}
    assert folders - NOT_MIRRORS <= packages, folders - NOT_MIRRORS - packages
    misplaced = []
    for path in sorted(tests.rglob("test_*.py")):
        where = path.relative_to(tests).parts
        slow = "pytest.mark" + ".slow" in path.read_text(encoding="utf-8")
        if where[0] == "gpu" or where[:2] == ("integration", "trainer"):
            continue
        if slow != (where[0] == "integration"):
            misplaced.append(f"{path.relative_to(ROOT)} (slow: {slow})")
    assert not misplaced, misplaced
