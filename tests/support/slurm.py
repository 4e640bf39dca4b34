"""A real single-host Slurm cluster of two emulated nodes, for the slurm launcher's drills.

The fixture `slurm_cluster` starts, all under the test's own directory and stopped
by their pids at the end:

* a private ``munged`` (its own key, socket, pid, log and seed files);
* ``slurmctld -D`` with a slurm.conf of its own (free ports, state, spool, logs);
* one ``slurmd -D -N nodeK`` per node: Debian's slurmd is built with
  MULTIPLE_SLURMD, so node1 and node2 are two daemons on this host
  (``NodeHostname`` this host, ``NodeAddr=127.0.0.1``, a port each).

Node names must resolve (TensorFlow's workers dial each other by them): if node1
and node2 do not, one /etc/hosts line maps them to 127.0.0.1, and exactly that line
is removed again. Clients find the cluster by ``SLURM_CONF`` (``SlurmCluster.env``).
At the end every job is cancelled, each daemon gets SIGTERM by its pid (SIGKILL
after a grace), and nothing of the cluster may be left (slurmstepd included).

If a binary is missing the test is skipped, saying so and how to get them
(``apt-get install -y slurmctld slurmd slurm-client munge``); if the cluster does not
come up, the test is skipped with the daemons' own last words.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.run_record import alive

NODES = ("node1", "node2")
INSTALL = "apt-get install -y slurmctld slurmd slurm-client munge"
BINARIES = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "salloc", "squeue", "scancel")
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 15.0
HOSTS_FILE = Path("/etc/hosts")


def find_binary(name: str) -> str | None:
    for directory in SBIN:
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)


def _free_ports(count: int) -> list[int]:
    """`count` consecutive TCP ports free a moment ago (slurm.conf's Port=[a-b] is a range)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if first + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("", port))
            return list(range(first, first + count))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def _resolves(name: str) -> bool:
    try:
        socket.gethostbyname(name)
    except OSError:
        return False
    return True


def processes_with(text: str, *, environ: bool = True) -> list[tuple[int, str]]:
    """Live processes (not zombies, not this one) whose command line holds `text`, or
    their environment (environ=True)."""
    found = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            env = b""
            if environ:
                with contextlib.suppress(OSError):
                    env = (entry / "environ").read_bytes()
            if (needle in cmdline or needle in env) and alive(int(entry.name)):
                found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(
                    "utf-8", "replace").strip()))
    return found


@dataclass
class SlurmCluster:
    """A running cluster: its directory, its clients' environment, its daemons by name."""

    home: Path
    conf: Path
    nodes: tuple[str, ...] = NODES
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF pointing here (no allocation's)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (sinfo, squeue, scancel...) against this cluster."""
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, env=self.env,
            stdin=subprocess.DEVNULL, check=False,
        )

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def jobs(self) -> list[str]:
        """Every job the controller knows, as `squeue` lists them (id, state)."""
        out = self.run("squeue", "-h", "-o", "%i %T").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def steps(self) -> list[str]:
        """Every job step running: `squeue -s` (id, node list)."""
        out = self.run("squeue", "-h", "-s", "-o", "%i %N").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def log_tail(self, lines: int = 5) -> str:
        parts = []
        # The daemons' own logs, and what they wrote before opening them (*.out).
        logs = self.home / "log"
        for path in sorted([*logs.glob("*.log"), *logs.glob("*.out")]):
            tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
            parts.append(f"{path.name}: {' | '.join(tail)}")
        return "; ".join(parts)


def _write_key(directory: Path) -> Path:
    directory.mkdir(mode=0o700)
    key = directory / "munge.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as fh:
        fh.write(os.urandom(1024))
    return key


def _slurm_conf(home: Path, munge_socket: Path, ctld_port: int, node_ports: list[int]) -> str:
    host = socket.gethostname().split(".")[0]
    return "\n".join([
        "ClusterName=gpuwatchtest",
        f"SlurmctldHost={host}",
        f"SlurmctldPort={ctld_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={home / 'state'}",
        f"SlurmdSpoolDir={home / 'spool' / '%n'}",
        f"SlurmctldPidFile={home / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={home / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={home / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={home / 'log' / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SchedulerParameters=batch_sched_delay=0",
        "EnforcePartLimits=ALL",
        "ReturnToService=2",
        "MailProg=/bin/true",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"NodeName=node[1-{len(node_ports)}] NodeHostname={host} NodeAddr=127.0.0.1 "
        f"Port=[{node_ports[0]}-{node_ports[-1]}] State=UNKNOWN",
        f"PartitionName=test Nodes=node[1-{len(node_ports)}] Default=YES MaxTime=INFINITE "
        "State=UP",
        "",
    ])


class _HostsLine:
    """One /etc/hosts line naming the nodes, if they do not resolve; removed at the end."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.line: str | None = None
        missing = [name for name in names if not _resolves(name)]
        if not missing:
            return
        line = f"127.0.0.1 {' '.join(missing)}  # gpuwatch test slurm cluster {os.getpid()}"
        try:
            text = HOSTS_FILE.read_text()
            with open(HOSTS_FILE, "a") as fh:
                fh.write(("" if text.endswith("\n") or not text else "\n") + line + "\n")
        except OSError as exc:
            pytest.skip(f"slurm: node names {missing} do not resolve and /etc/hosts is not "
                        f"writable here ({exc}); add '127.0.0.1 {' '.join(names)}' to it")
        self.line = line

    def remove(self) -> None:
        if self.line is None:
            return
        with contextlib.suppress(OSError):
            lines = HOSTS_FILE.read_text().splitlines(keepends=True)
            kept = [line for line in lines if line.rstrip("\n") != self.line]
            HOSTS_FILE.write_text("".join(kept))
        self.line = None


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each by its pid, wait, SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    paths = {name: find_binary(name) for name in BINARIES}
    missing = [name for name, path in paths.items() if path is None]
    if missing:
        pytest.skip(f"slurm: {', '.join(missing)} not found ({INSTALL})")
    if os.geteuid() != 0:
        pytest.skip("slurm: the test cluster runs its daemons as root (SlurmUser=root)")
    # Not under pytest's 0700 directories (nor a temporary directory a test set): munged
    # wants every directory above its socket searchable by all. A short path too
    # (sockets have length limits).
    home = Path(tempfile.mkdtemp(prefix="gpuwatch-slurm-", dir="/tmp"))
    home.chmod(0o755)
    kept_logs = tmp_path_factory.mktemp("slurm-logs")
    for sub in ("state", "spool", "run", "log", "munge-run"):
        (home / sub).mkdir()
    # munged refuses a socket directory others cannot search, and a key others can read.
    (home / "munge-run").chmod(0o755)
    key = _write_key(home / "munge-key")
    munge_socket = home / "munge-run" / "munge.socket"
    ctld_port, *node_ports = _free_ports(1 + len(NODES))
    conf = home / "slurm.conf"
    conf.write_text(_slurm_conf(home, munge_socket, ctld_port, node_ports))
    cluster = SlurmCluster(home, conf)
    hosts = _HostsLine(NODES)
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, argv: list[str]) -> None:
        with open(home / "log" / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=cluster.env, close_fds=True)
        started.append(proc)
        cluster.daemons[name] = proc

    try:
        start("munged", [
            str(paths["munged"]), "-F", f"--socket={munge_socket}", f"--key-file={key}",
            f"--log-file={home / 'log' / 'munged.log'}",
            f"--pid-file={home / 'run' / 'munged.pid'}",
            f"--seed-file={home / 'munge-key' / 'munged.seed'}",
        ])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not munge_socket.exists() and time.monotonic() < deadline:
            if cluster.daemons["munged"].poll() is not None:
                break
            time.sleep(0.05)
        if not munge_socket.exists():
            # Installed and root, yet not starting: a failure of ours, never a skip.
            pytest.fail(f"slurm: munged did not start: {cluster.log_tail()}")
        start("slurmctld", [str(paths["slurmctld"]), "-D", "-i", "-f", str(conf)])
        for node in NODES:
            start(f"slurmd-{node}", [str(paths["slurmd"]), "-D", "-N", node, "-f", str(conf)])
        deadline = time.monotonic() + START_TIMEOUT_S
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = cluster.node_states()
            if all(states.get(node) == "idle" for node in NODES):
                break
            dead = [name for name, proc in cluster.daemons.items() if proc.poll() is not None]
            if dead:
                break
            time.sleep(0.1)
        else:
            dead = []
        if not all(states.get(node) == "idle" for node in NODES):
            pytest.fail(f"slurm: the cluster did not come up (nodes {states}, exited "
                        f"{dead}): {cluster.log_tail()}")
        yield cluster
    finally:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            if "slurmctld" in cluster.daemons and cluster.daemons["slurmctld"].poll() is None:
                cluster.run("scancel", "--user", str(os.getuid()), "--full")
                deadline = time.monotonic() + STOP_GRACE_S
                while cluster.jobs() and time.monotonic() < deadline:
                    time.sleep(0.1)
        # Nodes first, then the controller, then munge (they authenticate until the end).
        order = [p for n, p in cluster.daemons.items() if n.startswith("slurmd")]
        _stop(order)
        _stop([cluster.daemons[n] for n in ("slurmctld", "munged") if n in cluster.daemons])
        hosts.remove()
        # The daemons' environment names this cluster's conf: slurmstepd and tasks too.
        left = processes_with(str(conf))
        deadline = time.monotonic() + STOP_GRACE_S
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = processes_with(str(conf))
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # The daemons' logs stay with pytest's own directories; the rest goes.
        with contextlib.suppress(OSError):
            shutil.copytree(home / "log", kept_logs, dirs_exist_ok=True)
        shutil.rmtree(home, ignore_errors=True)
        assert not left, f"slurm cluster processes left after the test: {left}"
