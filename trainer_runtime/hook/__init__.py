"""gpuwatch's hook in a person's own Python command (`gpuwatch run -- python train.py`).

The supervisor starts the command with HOOK_DIR first on its PYTHONPATH. Python
imports ``sitecustomize`` from there at start-up (site.py), before the script: it
takes its directory off ``sys.path`` and ``PYTHONPATH`` again (a grandchild Python is
not instrumented twice), chains to the ``sitecustomize`` that would have run without
it, reads its settings and telemetry fd from the environment (and removes them), and
waits for TensorFlow to be imported: only then does it patch anything (watch.py).

This package itself imports nothing beyond the standard library: the supervisor
imports it for HOOK_DIR and the environment's names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The directory that goes first on the command's PYTHONPATH: it holds sitecustomize.py.
HOOK_DIR = Path(__file__).resolve().parent / "site"
# The telemetry socket's fd in the command's process (a socketpair's child end).
ENV_FD = "GPUWATCH_HOOK_FD"
# The hook's settings, JSON (hook_settings): attempt, worker, prefetch, max_steps.
ENV_SETTINGS = "GPUWATCH_HOOK"


def hook_settings(
    *, attempt: int, prefetch: Any = False, max_steps: int | None = None, worker: int = 0
) -> str:
    """The ENV_SETTINGS value for one attempt: prefetch as data.prefetch holds it
    (False, True, "autotune" or a buffer size), max_steps as train.max_steps."""
    return json.dumps(
        {"attempt": attempt, "worker": worker, "prefetch": prefetch, "max_steps": max_steps},
        separators=(",", ":"),
    )
