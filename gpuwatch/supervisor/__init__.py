"""The per-run daemon: owns the run directory, runs the trainer, samples devices, serves dashboards.

Started by `gpuwatch train` as ``python -m gpuwatch.supervisor --run-dir DIR [--fresh]``,
detached from the terminal, so training outlives the dashboard and the SSH session. One
asyncio loop does everything but device sampling (a thread per agent: NVML calls may
block). Every event is appended to ``events.jsonl`` (flushed) before it is sent to
anyone: the file is the record of truth and replay reads it; a dashboard that attaches
starts from the supervisor's snapshot and replays only the events after it. Never imports
TensorFlow: the trainer is a child process in its own process group, talking over a
socketpair. Its parts: docs/internals.md, "The supervisor's parts".
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
