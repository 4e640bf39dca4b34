"""A supervisor of the stand-in trainer (tests/data/fake_trainer.py) in a process of its own.

``python -m tests.support.supervisor_process RUN_DIR SOCKET [--nofile-soft N]`` runs
``Supervisor(RUN_DIR, SOCKET, fresh=True)`` with the stand-in trainer
(GPUWATCH_TRAINER_MODULE=tests.data.fake_trainer)
under ``asyncio.run``, as ``python -m gpuwatch.supervisor`` runs the real one: tests that
load its socket from other processes get a supervisor whose event loop is its own, not
the test's. RUN_DIR holds config.yaml; the trainer's mode is $GPUWATCH_FAKE_TRAINER, and
the trainer runs from $GPUWATCH_USER_CWD (the repository root, for ``python -m tests...``).

--nofile-soft N lowers the open-files soft limit to N first, as a box whose default is
1,024 would start it (the supervisor raises it again when it opens its socket).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
from pathlib import Path

from gpuwatch.supervisor import Supervisor


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.supervisor_process")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("socket", type=Path)
    parser.add_argument("--nofile-soft", type=int, default=None)
    args = parser.parse_args()
    if args.nofile_soft is not None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile_soft, hard))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ["GPUWATCH_TRAINER_MODULE"] = "tests.data.fake_trainer"  # this process's own
    supervisor = Supervisor(args.run_dir.resolve(), args.socket, fresh=True)
    return asyncio.run(supervisor.run())


if __name__ == "__main__":
    raise SystemExit(main())
