"""The per-run daemon: owns the run directory, runs the trainer, samples devices, serves dashboards.

Started by `gpuwatch train` as ``python -m gpuwatch.supervisor --run-dir DIR [--fresh]``,
detached from the terminal, so training outlives the dashboard and the SSH
session. One asyncio loop does everything but device sampling (a thread per
agent: NVML calls may block). Every event is appended to ``events.jsonl``
(flushed) before it is sent to anyone: the file is the record of truth and
replay reads it. A dashboard that attaches starts from the supervisor's snapshot of
the run's state and replays only the events after it.

Never imports TensorFlow: the trainer is a child process in its own process
group, talking over a socketpair.

The parts, each usable alone:
  eventlog.py   events.jsonl (seq = line number), events.idx (seek), replay in chunks,
                state.json
  snapshots.py  the run folded as a dashboard folds it (RunState), snapshot.json
  recorder.py   one order for every event: event log, fold, dashboards, TensorBoard
  agent.py      one trainer process and its host's device sampler; Agent, what any agent is
  summarize.py  pure: past 8 workers, a worker's steps as one summary a second, lean samples
  trainer_start.py  starting a trainer here: trainer.log, its command, a spare or cold start
  spare.py      a trainer process waiting with TensorFlow imported, for the next attempt
  remote.py     an agent on another host (ssh, srun): the link and its frames; runs the agent
  agent_process.py  the agent process there: a LocalAgent whose callbacks are frames
  remote_agent.py   RemoteAgent: an Agent here, over that agent's link
  link.py       the supervisor's end of a remote agent's stdio link
  cluster.py    pure: a cluster run's workers, their launchers and TF_CONFIG
  worker_role.py  pure: what one worker's trainer needs to join its cluster
  workers.py    the run's agents as one group: made, started chief first, stopped
  exits.py      pure: how a trainer's exit becomes the run's status
  exit_policy.py  an attempt's workers' exits as one status; a failure stops them all
  live.py       live settings changes: sent to every trainer, held frames, the answers
  hub.py        the socket: connections, peer uid, subscribe, fan-out, back-pressure
  commands.py   typed commands (parse_command) carried out and answered
  core.py       the Supervisor: life cycle, signals, linger; orchestrates the parts
"""

from gpuwatch.supervisor.agent import AgentStartError, LocalAgent
from gpuwatch.supervisor.commands import Commands
from gpuwatch.supervisor.core import Supervisor, main
from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.exits import TrainerExit, describe_crash, exit_status
from gpuwatch.supervisor.hub import Client, ClientHub, peer_allowed, peer_credentials

__all__ = [
    "AgentStartError",
    "Client",
    "ClientHub",
    "Commands",
    "EventLog",
    "LocalAgent",
    "Supervisor",
    "TrainerExit",
    "describe_crash",
    "exit_status",
    "main",
    "peer_allowed",
    "peer_credentials",
]
