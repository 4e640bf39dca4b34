"""The trainer tests' own temporary directory (tests/integration/trainer/conftest.py):
private to the
worker, removed after it, and searchable by all like /tmp, since the modules a worker runs
after the trainer tests make their folders in it too (the Slurm drill's munged refused a
socket below it while it was 0700)."""

from __future__ import annotations

import shutil
import stat
import tempfile
from pathlib import Path


def test_the_temporary_directory_is_the_tests_own_and_searchable_by_all() -> None:
    here = Path(tempfile.gettempdir())
    assert here.name.startswith("gpuwatch-tests-")
    mode = stat.S_IMODE(here.stat().st_mode)
    assert mode & 0o005 == 0o005 and not mode & 0o022, oct(mode)
    made = Path(tempfile.mkdtemp(prefix="searchable-"))
    try:
        made.chmod(0o755)
        # What munged checks: every directory above its socket can be searched by all.
        assert all(stat.S_IMODE(d.stat().st_mode) & 0o001 for d in [made, *made.parents])
    finally:
        shutil.rmtree(made)
