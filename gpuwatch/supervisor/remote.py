"""Agents on other hosts: the entry point of the agent process, run over ssh or srun.

``PYTHON -m gpuwatch.supervisor.remote --run-id ID --index I`` runs a LocalAgent (the
trainer and that host's sampler) on the worker host and speaks newline-delimited JSON
frames (trainer_runtime.protocol's encoding and limits) on its stdio: stdout carries only
frames, everything else goes to stderr. Its worker's directory is resolved there, under
the account it runs as (runs.agent_worker_dir), never from this host's path; ``--run-dir``
names it instead. When stdin ends it stops its trainer and exits: nothing stays behind.
No port of ours listens and nothing is authenticated here: the link is whatever
``ssh``/``srun`` gives. The process is agent_process.py, the supervisor's side
remote_agent.py; the link's frames: docs/internals.md, "Cluster runs".
"""

import sys

from gpuwatch.supervisor.agent_process import main

if __name__ == "__main__":
    sys.exit(main())
