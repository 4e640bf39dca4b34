"""Agents on other hosts: a LocalAgent run there over the user's own ssh (or srun), linked by stdio.

Two halves of one link:

* The agent process, run on the worker host as
  ``PYTHON -m gpuwatch.supervisor.remote --run-id ID --index I``. Its worker's
  directory is resolved there, under the account it runs as: that account's own
  gpuwatch home (``$GPUWATCH_HOME``, else ``~/.local/state/gpuwatch`` of *its*
  home), ``runs/ID/workers/I/``, made 0700 (runs.agent_worker_dir); never this
  host's path, which need not exist there (``alice@gpu-b`` has another home).
  ``--run-dir DIR`` names the directory instead. It runs a
  LocalAgent (trainer + that host's sampler) and speaks newline-delimited JSON
  frames (trainer_runtime.protocol's encoding, limits and FrameBuffer) on its
  stdin/stdout. stdout carries only frames; everything else goes to stderr.
  When stdin reaches EOF (the ssh link dropped, the supervisor went away) it
  stops its trainer (SIGTERM, grace, SIGKILL) and exits: nothing stays behind.
* RemoteAgent, on the supervisor's side: an Agent (agent.py) as LocalAgent is, backed by that
  process through an AgentLink (link.py: the launcher process, reading and
  writing its stdio, replies, the log copy). The agent is as untrusted as a
  trainer: every relayed event is re-checked with parse_event (trainer events
  only; attempt and worker are re-stamped here), bad frames are counted, and a
  link that ends while a trainer runs becomes a TrainerExit that says the link
  was lost.

No port of ours listens anywhere and nothing is authenticated here: the link is
whatever ``ssh``/``srun`` gives (their keys, config, ProxyJump).

What the run needs of a worker's files comes over the link: its trainer's log
(``log`` frames, appended to workers/<i>/trainer.log here, so ``gpuwatch logs``
reads it), and a crash's last log lines (in ``exit``). Its scratch checkpoints stay
there: a resume finds them at the same place, as the run id and the index are the
same (the chief's real ones are here, in the run directory).

Link frames (each with "v" and "type"):
  supervisor -> agent
    prepare   reply ready (or error: the worker's directory cannot be made there)
    start     attempt (int), config_text (str: attempt-N.yaml's text), fresh (bool),
              launch ({index, workers, env} or null); reply started or error
    stop      grace_s (float)
  agent -> supervisor
    ready     host (str), port (int: held free until start), pid (int: the agent's),
              marker (str: a token written to DIR/.gpuwatch-agent),
              dir (str: the worker's directory there)
    started   attempt (int), pid (int: the trainer's)
    event     frame (a trainer event frame as event_frame writes it)
    sample    fields (host, gpus, nvml: a device sample of the agent's host)
    log       lines (list[str]: new lines of the trainer's log; bounded)
    exit      returncode, done_reason, error, log_lines, oom_killed (a TrainerExit)
    error     message (str: one line; e.g. the trainer could not start)

The agent process is agent_process.py, RemoteAgent remote_agent.py; this module is
only what runs there (``-m gpuwatch.supervisor.remote``).
"""

import sys

from gpuwatch.supervisor.agent_process import main

if __name__ == "__main__":
    sys.exit(main())
