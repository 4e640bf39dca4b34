"""A run's workers, planned from its config: pure functions, no process, no socket.

No ``cluster:`` section is one local worker in the run directory. A cluster is one
worker per entry of ``cluster.workers`` (worker 0, the chief, in the run directory;
worker i > 0 in ``workers/<i>/``), each run by an agent: local for this host, remote
(the user's own ``ssh``, or ``srun`` in a Slurm allocation) for the others and for
``user@localhost``. One agent per host samples its devices. Per attempt each worker gets
a WorkerLaunch: TF_CONFIG with every worker's address, chief first. Under slurm an
address is the node's Slurm name and a port its agent found free there, or
``cluster.ports[0]`` on every node: a fixed port for all (TensorFlow's
SlurmClusterResolver uses 8888) fails wherever two workers share a node. A person's own
command under slurm also gets the whole cluster's step variables (``slurm_step_env``).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpuwatch.config import ConfigError
from gpuwatch.runs.folders import worker_dir
from gpuwatch.supervisor.worker_role import WorkerLaunch, tf_config
from trainer_runtime.schema import LOCAL_HOSTS, RunConfig

AgentKind = Literal["local", "remote"]


class ClusterError(ConfigError):
    """A cluster that cannot be launched from here (e.g. slurm outside an allocation)."""


@dataclass(frozen=True)
class WorkerPlan:
    """One worker: where it runs, how it is reached, and where its files go.

    host: as the config gives it (user@host for ssh; "localhost" for a local worker;
    "slurm node i" until the agent on that node says its name).
    argv_prefix: the command that reaches the host (empty for a local worker); the
    trainer's own command follows it (``remote_argv``).
    sample: this worker's agent samples its host's devices (the first worker on each).
    """

    index: int
    host: str
    worker_dir: Path
    kind: AgentKind
    argv_prefix: tuple[str, ...] = ()
    sample: bool = True

    @property
    def hostname(self) -> str:
        """The host without its user@ part."""
        return self.host.rpartition("@")[2]

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def ssh_prefix(host: str, ssh_options: Sequence[str] = ()) -> tuple[str, ...]:
    """ssh to `host`, the person's options first (ssh keeps an option's first value).

    -T: no terminal (a pty would mangle frames and merge stderr into stdout);
    BatchMode: a detached supervisor has no terminal to type a password into; "--"
    ends ssh's options before the host, so no host is ever read as one (the schema
    refuses a leading "-" too). The remote command follows the host (remote_argv).
    """
    if not host or host.startswith("-"):
        raise ValueError(f"not an ssh destination: {host!r}")
    return ("ssh", "-T", *ssh_options, "-o", "BatchMode=yes", "--", host)


def srun_prefix(index: int) -> tuple[str, ...]:
    """srun one task on node `index` of the current allocation, beside other steps.

    --relative: the node by its place in the allocation; --overlap (Slurm 20.11+):
    the step may share the node with other steps (the batch script's, the other
    agents'); --kill-on-bad-exit: the step ends with its task. Not --unbuffered: srun
    runs the task under a pseudo-terminal then, which would rewrite the frames'
    newlines (the agent writes unbuffered anyway). srun execs the command itself (no
    shell): no quoting.
    """
    return (
        "srun", "--nodes=1", "--ntasks=1", f"--relative={index}", "--overlap",
        "--kill-on-bad-exit=1", "--quiet", "--",
    )


def through_a_shell(prefix: Sequence[str]) -> bool:
    """ssh joins what follows the host into one line for the remote shell."""
    return bool(prefix) and os.path.basename(prefix[0]) == "ssh"


def remote_argv(prefix: Sequence[str], command: Sequence[str]) -> list[str]:
    """The whole argv for a command on the host `prefix` reaches.

    ssh joins what follows the host into one line for the remote shell, so the
    command goes as one shell-quoted word there; srun runs its argv as given.
    """
    if through_a_shell(prefix):
        return [*prefix, shlex.join(command)]
    return [*prefix, *command]


def plan_workers(
    config: RunConfig, run_dir: Path, *, env: Mapping[str, str] | None = None
) -> list[WorkerPlan]:
    """The run's workers, chief first. env: the supervisor's (Slurm's variables), for slurm.

    ClusterError when the cluster cannot be launched from here.
    """
    cluster = config.cluster
    if cluster is None:
        return [WorkerPlan(0, "localhost", run_dir, "local")]
    count = cluster.count
    if cluster.launcher == "slurm":
        check_allocation(count, env or {})
        return [
            WorkerPlan(i, f"slurm node {i}", worker_dir(run_dir, i), "remote", srun_prefix(i))
            for i in range(count)
        ]
    plans: list[WorkerPlan] = []
    sampled: set[str] = set()
    for i, worker in enumerate(cluster.workers):
        # user@localhost is another account here: its own home, reached through ssh.
        local = cluster.launcher == "local" or (worker.is_local and worker.account is None)
        host = "localhost" if local else worker.host
        key = "localhost" if worker.is_local else worker.hostname  # one sampler per machine
        prefix = () if local else ssh_prefix(worker.host, cluster.ssh_options)
        plans.append(
            WorkerPlan(
                i,
                host,
                worker_dir(run_dir, i),
                "local" if local else "remote",
                prefix,
                sample=key not in sampled,
            )
        )
        sampled.add(key)
    return plans


def check_allocation(workers: int, env: Mapping[str, str]) -> None:
    """The supervisor is inside a Slurm allocation with a node for every worker."""
    if not env.get("SLURM_JOB_ID") or not env.get("SLURM_JOB_NODELIST"):
        raise ClusterError(
            "cluster.launcher slurm: not inside a Slurm allocation (SLURM_JOB_ID is not "
            "set); start gpuwatch under salloc or sbatch"
        )
    nodes_text = env.get("SLURM_JOB_NUM_NODES", "")
    if not nodes_text.isdigit():
        raise ClusterError(
            f"cluster.launcher slurm: SLURM_JOB_NUM_NODES is {nodes_text!r}, not a number"
        )
    nodes = int(nodes_text)
    if nodes < workers:
        raise ClusterError(
            f"cluster.workers: {workers} workers need {workers} nodes, but this allocation "
            f"(job {env['SLURM_JOB_ID']}) has {nodes}; ask salloc/sbatch for --nodes={workers}"
        )


def tf_addresses(
    plans: Sequence[WorkerPlan],
    prepared: Sequence[tuple[str, int]],
    *,
    ports: Sequence[int] | None = None,
    this_host: str = "localhost",
) -> list[str]:
    """Every worker's "host:port", chief first.

    prepared: each agent's (host, free port); ports: the config's, which win.
    When every worker is on this host, "localhost" will do; when some are
    elsewhere, they must dial this host by its name (this_host).
    """
    all_local = all(plan.hostname in LOCAL_HOSTS for plan in plans)
    addresses = []
    for plan, (host, port) in zip(plans, prepared, strict=True):
        if ports is not None:
            port = ports[plan.index]
        if plan.argv_prefix[:1] == ("ssh",):
            # The name the config gives: this host reaches it, so the others can too
            # (the agent's own gethostname() may not resolve anywhere else).
            host = plan.hostname
        if not all_local and host in LOCAL_HOSTS:
            host = this_host
        addresses.append(f"{host}:{port}")
    return addresses


def worker_launches(
    config: RunConfig,
    plans: Sequence[WorkerPlan],
    prepared: Sequence[tuple[str, int]],
    *,
    this_host: str = "localhost",
) -> list[WorkerLaunch | None]:
    """Each worker's launch for one attempt (None for a single-host run: no cluster env).

    prepared: each agent's (host, free port) for this attempt; under slurm the host is
    its node's name.
    """
    cluster = config.cluster
    if cluster is None:
        return [None for _ in plans]
    count = len(plans)
    ports = cluster.ports
    if cluster.launcher == "slurm" and ports is not None:
        ports = [ports[0]] * count  # the one port every node uses
    addresses = tf_addresses(plans, prepared, ports=ports, this_host=this_host)
    nodes = [host for host, _ in prepared]
    return [
        WorkerLaunch(plan.index, count, {
            "TF_CONFIG": tf_config(addresses, plan.index),
            **(slurm_step_env(nodes, plan.index)
               if cluster.launcher == "slurm" and config.command is not None else {}),
        })
        for plan in plans
    ]


def slurm_step_env(nodes: Sequence[str], index: int) -> dict[str, str]:
    """Slurm's step variables for worker `index` of a person's command on `nodes` (one task
    each, in order), as `srun --ntasks-per-node=1` across them would set them: each agent
    is a one-task step of its own, and a script that builds its cluster from Slurm
    (SlurmClusterResolver, a rank from SLURM_PROCID) sees the whole cluster instead."""
    count = len(nodes)
    return {
        "SLURM_PROCID": str(index),
        "SLURM_NODEID": str(index),
        "SLURM_LOCALID": "0",
        "SLURM_GTIDS": str(index),
        "SLURM_NTASKS": str(count),
        "SLURM_NPROCS": str(count),
        "SLURM_NNODES": str(count),
        "SLURM_STEP_NUM_TASKS": str(count),
        "SLURM_STEP_NUM_NODES": str(count),
        "SLURM_NODELIST": ",".join(nodes),
        "SLURM_STEP_NODELIST": ",".join(nodes),
        "SLURM_TASKS_PER_NODE": f"1(x{count})",
        "SLURM_STEP_TASKS_PER_NODE": f"1(x{count})",
    }
