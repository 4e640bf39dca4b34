"""What every command shares: its exit codes, and a problem said in one line on stderr."""

from __future__ import annotations

import sys

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def err(message: str) -> None:
    print(f"gpuwatch: {message}", file=sys.stderr)
