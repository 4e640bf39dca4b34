"""A trainer's own temporary directory, gone when the trainer is.

TensorFlow writes to the temporary directory as it traces: autograph turns each Python
function it converts (a person's data factory's map functions; the built-in update graph
and pipeline are plain graph code, not converted) into a generated module,
``__autograph_generated_file*.py``, a few per function, and removes them at interpreter
exit. The trainer skips that exit (``__main__._exit_now``: finalisation can hang on
TensorFlow's threads), so such files would stay in /tmp for good. The trainer takes a
directory of its own there (``gpuwatch-trainer-<pid>-*``) for everything that goes to
the temporary directory, and removes it as it exits; the supervisor removes the one a
trainer it watched could not (killed by SIGKILL, the OOM killer) once it has reaped it.

Stdlib only: the supervisor imports it too.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

PREFIX = "gpuwatch-trainer-"


def take(pid: int) -> str | None:
    """Make this process's temporary directory and send Python's tempfile there; None
    (and tempfile left as it was) where the temporary directory takes nothing."""
    try:
        path = tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-")
    except OSError:
        return None
    tempfile.tempdir = path
    return path


def remove(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


def sweep(pid: int) -> int:
    """Remove what the trainer with this pid left in the temporary directory (it has
    exited, so nothing of it is in use); how many directories went."""
    gone = 0
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}{pid}-*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            gone += 1
    return gone
