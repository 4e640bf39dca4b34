"""Run directories: where runs live, their ids, their sockets, and listing them.

Runs live under ``$GPUWATCH_HOME`` (default ``$XDG_STATE_HOME/gpuwatch``, i.e.
``~/.local/state/gpuwatch``): ``runs/<run-id>/`` holds the run's configs, events.jsonl
(the record of truth), logs, checkpoints, TensorBoard scalars and a cluster's
``workers/<i>/``; ``sock/<run-id>.sock`` is its supervisor's socket (dir 0700, socket
0600). A worker on another host keeps its files under that account's own GPUWATCH_HOME
(``agent_worker_dir``, 0700). Sockets are not under /run/user (logind deletes it at
logout); where a socket path would pass the AF_UNIX limit (108 bytes) they go to
``/tmp/gpuwatch-<uid>-<hash>/``, 0700 too. Each file: docs/internals.md, "Processes".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwatch.runstate import CURRENT_STEPS, WARMUP_STEPS
from gpuwatch.runstate.steps import median_value
from trainer_runtime.protocol import (
    MAX_FRAME_BYTES,
    TERMINAL_STATUSES,
    Attempt,
    Envelope,
    ProtocolError,
    Run,
    Scale,
    StatusChange,
    Step,
    decode,
    parse_event,
)

SOCKET_PATH_MAX = 100  # AF_UNIX allows 108 bytes with the NUL; keep a margin
RUN_ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no l/1/o/0/i: typeable over SSH


class RunError(Exception):
    """A run that cannot be found, or a prefix that names several."""


def gpuwatch_home() -> Path:
    explicit = os.environ.get("GPUWATCH_HOME")
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "gpuwatch"


def home_problem(home: Path | None = None) -> str | None:
    """Why gpuwatch's home cannot hold runs (one line), or None: it is a directory, or not
    there yet (made on the first run). Checked before any command reads or starts runs."""
    home = home or gpuwatch_home()
    named = (f"GPUWATCH_HOME={home}" if os.environ.get("GPUWATCH_HOME")
             else f"gpuwatch's home {home}")
    try:
        mode = os.stat(home).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:  # a path too long, a parent that is a file
        return f"{named}: {exc.strerror or exc}"
    if not stat.S_ISDIR(mode):
        return f"{named} is not a directory"
    root = home / "runs"
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.stat(root).st_mode):
            return f"{root} is not a directory (gpuwatch keeps its runs there)"
    return None


def runs_root(home: Path | None = None) -> Path:
    return (home or gpuwatch_home()) / "runs"


def new_run_id() -> str:
    """Short, typeable, sortable by start time: <yymmdd>-<4 random letters>."""
    stamp = time.strftime("%m%d")
    tail = "".join(secrets.choice(RUN_ID_ALPHABET) for _ in range(4))
    return f"{stamp}-{tail}"


def create_run_dir(home: Path | None = None) -> tuple[str, Path]:
    root = runs_root(home)
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        run_id = new_run_id()
        run_dir = root / run_id
        try:
            run_dir.mkdir()
        except FileExistsError:
            continue
        (run_dir / "checkpoints").mkdir()
        return run_id, run_dir
    raise RunError(f"could not make a new run directory under {root}")


def worker_dir(run_dir: Path, index: int) -> Path:
    """A worker's own directory: the chief's (worker 0) is the run's, worker i's workers/<i>/."""
    return run_dir if index == 0 else run_dir / "workers" / str(index)


def agent_worker_dir(run_id: str, index: int, home: Path | None = None) -> Path:
    """Worker `index`'s directory on the host (and account) its agent runs as: under that
    account's own gpuwatch home, as the run's would be there. ValueError for a run id that
    is not one plain directory name (it names a path below the runs directory, no more)."""
    if (
        not run_id
        or run_id in (".", "..")
        or "/" in run_id
        or not run_id.isprintable()
        or len(run_id) > 255
    ):
        raise ValueError(f"not a run id: {run_id!r}")
    if index < 0:
        raise ValueError(f"not a worker index: {index}")
    return worker_dir(runs_root(home) / run_id, index)


def ensure_private_tree(path: Path) -> Path:
    """Make directory path and any missing parents 0700 (XDG's rule for state directories:
    a worker's logs and checkpoints are its account's alone); one that exists is left as it
    is, if it is a directory of ours.

    OSError (e.g. EACCES, naming the directory it could not make) or RunError.
    """
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another agent of the run made it
            directory.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise RunError(f"{path} is not a directory")
    if info.st_uid != os.getuid():
        raise RunError(f"{path} belongs to uid {info.st_uid}, not to you ({os.getuid()})")
    return path


def ensure_private_dir(path: Path) -> Path:
    """Create a 0700 directory we own; refuse one that someone else owns or others can enter."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise RunError(f"{path} is not a directory")
    if info.st_uid != os.getuid():
        raise RunError(f"{path} belongs to uid {info.st_uid}, not to you ({os.getuid()})")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def socket_dir(home: Path | None = None) -> Path:
    base = (home or gpuwatch_home()).resolve()
    candidate = base / "sock"
    if len(os.fsencode(candidate)) + 20 <= SOCKET_PATH_MAX:
        return candidate
    digest = hashlib.sha1(str(base).encode()).hexdigest()[:10]
    return Path(f"/tmp/gpuwatch-{os.getuid()}-{digest}")


def socket_path_for(run_id: str, home: Path | None = None) -> Path:
    return socket_dir(home) / f"{run_id}.sock"


def supervisor_alive(pid: int | None, run_dir: Path) -> bool:
    """The supervisor of run_dir is this live pid (not a recycled pid of another program)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # cannot tell (no /proc): trust the pid
    return b"gpuwatch.supervisor" in cmdline and os.fsencode(run_dir.name) in cmdline


def pid_alive(pid: int | None) -> bool:
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclass(frozen=True)
class RunInfo:
    """What `gpuwatch ls` shows of one run, read from its directory."""

    run_id: str
    run_dir: Path
    name: str
    status: str
    attempt: int
    step: int
    # The dashboard's headline examples/s: the median of the latest attempt's last
    # CURRENT_STEPS steps after warm-up in the record's tail (ChiefRates).
    examples_per_s: float | None
    started: float | None
    supervisor_pid: int | None
    socket_path: Path | None
    exit_code: int | None = None
    message: str | None = None
    workers: int = 1  # a cluster run's workers (MultiWorkerMirroredStrategy); 1: one host
    scale: Scale | None = None  # a scaling probe's plan (gpuwatch scale), else None
    # A person's own command (gpuwatch run): its argv as recorded, else None.
    command: tuple[str, ...] | None = None
    examples_per_s_steps: int = 0  # the steps examples_per_s is over, for its label

    @property
    def live(self) -> bool:
        return self.status not in TERMINAL_STATUSES

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "name": self.name,
            "status": self.status,
            "attempt": self.attempt,
            "step": self.step,
            "examples_per_s": self.examples_per_s,
            "examples_per_s_steps": self.examples_per_s_steps,
            "started": self.started,
            "supervisor_pid": self.supervisor_pid,
            "exit_code": self.exit_code,
            "message": self.message,
            "workers": self.workers,
            "scale": None if self.scale is None else {
                "counts": self.scale.counts, "unit": self.scale.unit, "mode": self.scale.mode,
            },
            "command": None if self.command is None else list(self.command),
        }


def read_supervisor_info(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / "supervisor.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tail_lines(path: Path, max_bytes: int = 256 * 1024) -> list[bytes]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]  # the first may be cut
    return [line for line in lines if line.strip()]


def read_run_info(run_dir: Path) -> RunInfo:
    """Summarise a run from state.json (status), the tail of events.jsonl, and its supervisor."""
    run_id = run_dir.name
    name = run_id
    status = "starting"
    attempt = 0
    step = 0
    started: float | None = None
    exit_code: int | None = None
    message: str | None = None
    rates = ChiefRates()
    workers = 1
    command: tuple[str, ...] | None = None
    head, scale = _head_events(run_dir / "events.jsonl")
    if head is not None:
        envelope, run = head
        name = run.name or name
        started = envelope.t
        workers = workers_in(run.settings)
        command = command_in(run.settings)
    for raw in _tail_lines(run_dir / "events.jsonl"):
        try:
            _, event = parse_event(decode(raw))
        except ProtocolError:
            continue  # a torn last line, or a record this version does not know
        if isinstance(event, StatusChange):
            status, attempt = event.status, event.attempt
            exit_code, message = event.exit_code, event.message
        elif isinstance(event, Attempt):
            attempt = event.attempt
            workers = workers_in(event.settings)
            command = command_in(event.settings) or command
            rates.start(event.attempt)
        elif isinstance(event, Step) and event.worker == 0:  # the run's figures: the chief's
            step = event.step
            rates.add(event)
    # The supervisor writes state.json on every status change: the tail of a long
    # events.jsonl (8 GPUs of samples) may no longer hold the last status.
    try:
        state = json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        state = None
    if isinstance(state, dict) and isinstance(state.get("status"), str):
        status = state["status"]
        attempt = _as_int(state.get("attempt"), attempt)
        exit_code = _as_int(state.get("exit_code"), None)
        message = state.get("message") if isinstance(state.get("message"), str) else None
        step = max(step, _as_int(state.get("step"), 0) or 0)
    info = read_supervisor_info(run_dir)
    pid = info.get("pid") if isinstance(info.get("pid"), int) else None
    alive = supervisor_alive(pid, run_dir)
    if status not in TERMINAL_STATUSES and not alive:
        status = "lost"
        message = message or "the supervisor is gone (killed, or the machine restarted)"
    sock = info.get("socket")
    return RunInfo(
        run_id=run_id,
        run_dir=run_dir,
        name=name,
        status=status,
        attempt=attempt,
        step=step,
        examples_per_s=median_value(list(rates.latest)),
        started=started,
        supervisor_pid=pid if alive else None,
        socket_path=Path(sock) if sock else None,
        exit_code=exit_code,
        message=message,
        workers=workers,
        scale=scale,
        command=command,
        examples_per_s_steps=len(rates.latest),
    )


class ChiefRates:
    """The chief's examples/s of its latest attempt in a record's tail, as the dashboard's
    headline takes them: its last CURRENT_STEPS steps after warm-up.

    An attempt whose start is in the tail leaves out its first WARMUP_STEPS steps; one that
    began before the tail has had them already (a tail holds hundreds of steps).
    """

    def __init__(self) -> None:
        self.attempt = 0
        self.counted = 0  # the attempt's steps so far, warm-up included
        self.latest: deque[float] = deque(maxlen=CURRENT_STEPS)

    def start(self, attempt: int) -> None:
        """An attempt event: its steps follow, the first WARMUP_STEPS of them warm-up."""
        self.attempt, self.counted = attempt, 0
        self.latest.clear()

    def add(self, step: Step) -> None:
        if step.attempt < self.attempt:  # an older attempt's late step
            return
        if step.attempt > self.attempt:  # its attempt began before the tail
            self.attempt, self.counted = step.attempt, WARMUP_STEPS
            self.latest.clear()
        self.counted += 1
        rate = step.examples_per_s
        if self.counted > WARMUP_STEPS and rate is not None:
            self.latest.append(rate)


def workers_in(settings: dict[str, Any] | None) -> int:
    """How many workers a run's recorded settings ask for (1 without a cluster section)."""
    cluster = (settings or {}).get("cluster")
    workers = cluster.get("workers") if isinstance(cluster, dict) else None
    return len(workers) if isinstance(workers, list) and workers else 1


def command_in(settings: dict[str, Any] | None) -> tuple[str, ...] | None:
    """The argv of a person's own command in a run's recorded settings (gpuwatch run), or
    None: a run of the bundled runtime (or settings this version cannot read)."""
    command = (settings or {}).get("command")
    argv = command.get("argv") if isinstance(command, dict) else None
    if isinstance(argv, list) and argv and all(isinstance(arg, str) for arg in argv):
        return tuple(argv)
    return None


def _as_int(value: Any, default: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _head_events(path: Path) -> tuple[tuple[Envelope, Run] | None, Scale | None]:
    """The run event that opens events.jsonl, if it is there and whole, and the scaling
    probe's plan that follows it in a probe's record."""
    head: tuple[Envelope, Run] | None = None
    try:
        with open(path, "rb") as fh:
            envelope, event = parse_event(decode(fh.readline(MAX_FRAME_BYTES)))
            if not isinstance(event, Run):
                return None, None
            head = (envelope, event)
            _, second = parse_event(decode(fh.readline(MAX_FRAME_BYTES)))
    except (OSError, ProtocolError):
        return head, None
    return head, second if isinstance(second, Scale) else None


def list_runs(home: Path | None = None) -> list[RunInfo]:
    """Every run, newest first."""
    root = runs_root(home)
    if not root.is_dir():
        return []
    # A run is a folder with its record, a regular file (never read from a FIFO or a device).
    dirs = [d for d in root.iterdir() if d.is_dir() and (d / "events.jsonl").is_file()]
    infos = [read_run_info(d) for d in dirs]
    infos.sort(key=lambda i: (i.started or 0.0, i.run_id), reverse=True)
    return infos


def resolve_run(
    prefix: str | None, home: Path | None = None, *, live_only: bool = False
) -> RunInfo:
    """The run a person meant: a unique id prefix, or (None) the most recent live one."""
    if prefix is not None and not prefix.strip():
        # An unset shell variable ("gpuwatch stop $RUN") must not pick the only run.
        raise RunError(f"no run id given ({prefix!r}): gpuwatch ls lists runs")
    runs = list_runs(home)
    if prefix is None:
        live = [r for r in runs if r.live]
        if not live:
            raise RunError("no live run on this machine (gpuwatch ls lists all runs)")
        return live[0]
    matches = [r for r in runs if r.run_id.startswith(prefix)]
    exact = [r for r in matches if r.run_id == prefix]
    if exact:
        matches = exact
    if live_only:
        matches = [r for r in matches if r.live]
    if not matches:
        raise RunError(f"no run matches {prefix!r} (gpuwatch ls lists runs)")
    if len(matches) > 1:
        ids = ", ".join(r.run_id for r in matches[:6])
        raise RunError(f"{prefix!r} matches {len(matches)} runs: {ids}; type more of the id")
    return matches[0]
