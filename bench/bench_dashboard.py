"""What does watching cost? The real dashboard on a pseudo-terminal against a busy run.

A fake supervisor (this process: the real EventLog and ClientHub on an AF_UNIX
socket, so the dashboard subscribes exactly as it does to a run) replays a run of
8 GPUs: a hello, 100 steps a second with plausible jittering figures, and a
device sample of all 8 GPUs once a second. The dashboard is the CLI's own entry
point (`gpuwatch.app.run_dashboard`) in a child process on a pty of the given
size (TERM=xterm-256color). After a warm-up, for `--seconds`, the bench counts
every byte the dashboard writes to the pty (Textual draws on stderr; both go
there) and the CPU time (user + system) of the dashboard and its children.

"Current within 0.5 s": the pty's bytes drive a small terminal emulator (cursor
moves, text; enough for what Textual writes), and each step sent is timed until
the screen's "step N" shows it or a later one. The lag reported is the largest
over the steps sent in the window (the last second left out).

Prints each run, the medians per size, and a last line
`result: cpu_pct=X kib_per_s=Y` (medians of the first size; targets X <= 2.0, Y <= 10).

    .venv/bin/python bench/bench_dashboard.py [--runs 3] [--seconds 30] [--sizes 80x24,160x48]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import codecs
import contextlib
import fcntl
import math
import os
import random
import re
import signal
import statistics
import struct
import sys
import tempfile
import termios
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatch.sampling import sample_event  # noqa: E402
from gpuwatch.sampling.types import DeviceSample  # noqa: E402
from gpuwatch.supervisor.eventlog import EventLog  # noqa: E402
from gpuwatch.supervisor.hub import Client, ClientHub  # noqa: E402
from trainer_runtime.protocol import (  # noqa: E402  # noqa: E402
    Attempt,
    GpuSample,
    Hello,
    HostSample,
    InvalidCommand,
    Run,
    Sample,
    StatusChange,
    Step,
    Subscribe,
    encode,
    parse_command,
)

GPUS = 8
STEPS_PER_S = 100.0
SAMPLES_PER_S = 1.0
RUN_ID = "0612-bench"
BATCH = 1024
PARAM_BYTES = 102_000_000  # a ResNet-50-sized model
GIB = 1024**3
# The dashboard: the entry point `gpuwatch attach` uses, on a pty that is its
# controlling terminal (as a shell's child has).
DASHBOARD = """
import fcntl, sys, termios
from pathlib import Path
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
if len(sys.argv) > 4:  # --profile: SIGUSR1 starts cProfile, SIGUSR2 writes the stats
    import cProfile, signal
    profiler = cProfile.Profile()
    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
    signal.signal(signal.SIGUSR2, lambda *_: (profiler.disable(), profiler.dump_stats(sys.argv[4])))
from gpuwatch.app import run_dashboard
run_dashboard(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
"""
STEP_ON_SCREEN = re.compile(r"\bstep (\d[\d,]*)")


# ---- the dashboard on a pty, started and ended the same way by each bench -------


def set_size(fd: int, width: int, height: int) -> None:
    """The pty's window size, as a terminal emulator sets it."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))


async def start_dashboard(
    home: Path, run_id: str, socket_path: Path, width: int, height: int, *extra: str
) -> tuple[asyncio.subprocess.Process, int]:
    """The real dashboard (DASHBOARD) in its own session on a new pty of width x height,
    attached to run_id's socket; the child and the pty's master end (all it writes)."""
    master, slave = os.openpty()
    set_size(slave, width, height)
    env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(ROOT), GPUWATCH_HOME=str(home))
    env.pop("NO_COLOR", None)
    env.pop("TEXTUAL", None)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DASHBOARD, str(home), run_id, str(socket_path), *extra,
        stdin=slave, stdout=slave, stderr=slave, env=env, cwd=str(home),
        start_new_session=True,
    )
    os.close(slave)
    return child, master


async def end_dashboard(child: asyncio.subprocess.Process, master: int) -> None:
    """The dashboard's whole session killed and waited for, its pty closed."""
    asyncio.get_running_loop().remove_reader(master)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    await child.wait()
    os.close(master)


# ---- the screen: just enough of a terminal for what Textual writes -------------


class Screen:
    """Rows of cells fed with a terminal's byte stream: text, cursor moves, erases."""

    CSI = re.compile(r"\x1b\[([0-9;?<>=]*)([ -/]*)([@-~])")
    OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
    OTHER_ESC = re.compile(r"\x1b[()][0-9A-Za-z]|\x1b[=>78DEHMNOc]")

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.rows = [[" "] * width for _ in range(height)]
        self.x = self.y = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # an escape sequence cut by the end of a chunk

    def feed(self, data: bytes) -> None:
        text = self._pending + self._decoder.decode(data)
        self._pending = ""
        i, n = 0, len(text)
        while i < n:
            char = text[i]
            if char == "\x1b":
                match = (
                    self.CSI.match(text, i)
                    or self.OSC.match(text, i)
                    or self.OTHER_ESC.match(text, i)
                )
                if match is None:
                    if n - i < 64:  # unfinished: wait for the rest
                        self._pending = text[i:]
                        return
                    i += 1  # not a sequence we know: skip the ESC
                    continue
                if match.re is self.CSI:
                    self._csi(match.group(1), match.group(3))
                i = match.end()
            elif char == "\r":
                self.x = 0
                i += 1
            elif char == "\n":
                self.y = min(self.y + 1, self.height - 1)
                i += 1
            elif char == "\b":
                self.x = max(0, self.x - 1)
                i += 1
            elif char < " ":
                i += 1
            else:
                self._put(char)
                i += 1

    def _put(self, char: str) -> None:
        if unicodedata.combining(char):
            return
        wide = unicodedata.east_asian_width(char) in ("W", "F")
        if self.x < self.width and 0 <= self.y < self.height:
            self.rows[self.y][self.x] = char
            if wide and self.x + 1 < self.width:
                self.rows[self.y][self.x + 1] = ""
        self.x += 2 if wide else 1

    def _csi(self, params: str, final: str) -> None:
        if params.startswith("?"):
            return  # modes (alternate screen, mouse, synchronized output)
        args = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else []

        def arg(k: int, default: int) -> int:
            return args[k] if len(args) > k and args[k] else default

        if final in "Hf":
            self.y = min(arg(0, 1), self.height) - 1
            self.x = min(arg(1, 1), self.width) - 1
        elif final == "A":
            self.y = max(0, self.y - arg(0, 1))
        elif final == "B":
            self.y = min(self.height - 1, self.y + arg(0, 1))
        elif final == "C":
            self.x = min(self.width - 1, self.x + arg(0, 1))
        elif final == "D":
            self.x = max(0, self.x - arg(0, 1))
        elif final == "G":
            self.x = min(arg(0, 1), self.width) - 1
        elif final == "d":
            self.y = min(arg(0, 1), self.height) - 1
        elif final == "J" and arg(0, 0) == 2:
            self.rows = [[" "] * self.width for _ in range(self.height)]
        elif final == "K":
            row, mode = self.rows[self.y], arg(0, 0)
            span = range(self.x, self.width) if mode == 0 else range(self.width)
            if mode == 1:
                span = range(0, self.x + 1)
            for k in span:
                row[k] = " "

    def lines(self) -> list[str]:
        return ["".join(row) for row in self.rows]

    def step_shown(self) -> int | None:
        for line in self.lines():
            match = STEP_ON_SCREEN.search(line)
            if match:
                return int(match.group(1).replace(",", ""))
        return None


# ---- the fake supervisor: a replayed feed of an 8-GPU run ---------------------------


def settings() -> dict[str, Any]:
    return {
        "name": "bench-8gpu",
        "model": {"name": "resnet50"},
        "data": {"prefetch": "autotune", "parallel_calls": "autotune"},
        "train": {"global_batch_size": BATCH, "accumulation_steps": 1, "max_steps": 10**7},
        "strategy": {"cpu_replicas": 2},
    }


class StandIn:
    """A supervisor's side of a run's socket for a bench: the real EventLog and ClientHub,
    answering `subscribe` (and refusing anything else); events published as recorded."""

    def __init__(self, run_dir: Path, socket_path: Path, run_id: str) -> None:
        self.run_id = run_id
        self.events = EventLog(run_dir)
        self.hub = ClientHub(socket_path, self.events, self.answer)
        self.subscribed = asyncio.Event()

    async def answer(self, frame: dict[str, Any], client: Client) -> bytes:
        try:
            command = parse_command(frame)
        except InvalidCommand as exc:
            return encode("err", id=exc.command_id, message=str(exc))
        if isinstance(command, Subscribe):
            next_seq = self.hub.subscribe(client, command.from_seq)
            self.subscribed.set()
            return encode("ack", id=command.id, next_seq=next_seq, run_id=self.run_id)
        return encode("err", id=command.id, message=f"the bench does not {command.TYPE}")

    def record(self, event: Any, t: float | None = None) -> None:
        seq, _t, data = self.events.append(event, t=t)
        self.hub.publish(seq, data)


class Feed(StandIn):
    """Steps at STEPS_PER_S and an 8-GPU sample each second, recorded and published."""

    def __init__(self, run_dir: Path, socket_path: Path, seed: int, steps_per_s: float) -> None:
        super().__init__(run_dir, socket_path, RUN_ID)
        self.steps_per_s = steps_per_s
        self.random = random.Random(seed)
        self.sent_at: list[float] = []  # monotonic time each step was published, by step - 1

    def start_run(self) -> None:
        config = settings()
        self.record(
            Run(
                run_id=RUN_ID,
                name="bench-8gpu",
                config_path="bench.yaml",
                supervisor_pid=os.getpid(),
                host="gpu-box-3",
                settings=config,
                created=time.time(),
            )
        )
        self.record(Attempt(attempt=1, settings=config, fresh=True, reason="start"))
        self.record(StatusChange(attempt=1, status="starting"))
        self.record(
            Hello(
                attempt=1,
                pid=os.getpid(),
                tf_version="2.21.0",
                replicas=GPUS,
                device_kind="gpu",
                devices=[f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(GPUS)],
                param_count=PARAM_BYTES // 4,
                param_bytes=PARAM_BYTES,
                global_batch_size=BATCH,
                accumulation_steps=1,
                per_replica_batch=BATCH // GPUS,
                start_step=0,
                start_micro_step=0,
                host="gpu-box-3",
            )
        )
        self.record(StatusChange(attempt=1, status="running"))

    def step(self, number: int) -> Step:
        rnd = self.random
        step_ms = max(5.0, rnd.gauss(10.0, 0.6))
        wait_ms = max(0.0, rnd.gauss(0.4, 0.15))
        return Step(
            attempt=1,
            step=number,
            micro_step=number,
            epoch=number * BATCH // 1_281_167,
            loss=round(6.9 * math.exp(-number / 4000.0) + 0.9 + rnd.gauss(0.0, 0.05), 5),
            lr=0.1,
            examples=BATCH,
            step_time_ms=round(step_ms, 3),
            input_wait_ms=round(wait_ms, 3),
            grad_sync_bytes=PARAM_BYTES * 2.0 * (GPUS - 1) / GPUS,
            position=number * BATCH,
            compute_ms=round(step_ms - wait_ms - 1.2, 3),
        )

    def sample(self) -> Sample:
        rnd = self.random
        gpus = tuple(
            GpuSample(
                index=i,
                name="NVIDIA H100 80GB HBM3",
                uuid=f"GPU-bench-{i}",
                util_gpu_pct=min(100.0, rnd.gauss(93.0, 3.0)),
                util_mem_pct=rnd.gauss(41.0, 3.0),
                mem_used_bytes=int(61.3 * GIB + rnd.randrange(0, 400) * 2**20),
                mem_total_bytes=80 * GIB,
                temperature_c=float(rnd.randrange(58, 67)),
                power_w=rnd.gauss(610.0, 25.0),
                power_limit_w=700.0,
                sm_clock_mhz=1980,
                pcie_gen=5,
                pcie_width=16,
                pcie_tx_bytes_per_s=rnd.gauss(1.3e9, 0.2e9),
                pcie_rx_bytes_per_s=rnd.gauss(3.4e9, 0.4e9),
                nvlink_tx_bytes_per_s=rnd.gauss(41e9, 3e9),
                nvlink_rx_bytes_per_s=rnd.gauss(41e9, 3e9),
                pcie_source="counter",
                nvlink_links_active=18,
            )
            for i in range(GPUS)
        )
        host = HostSample(
            cpu_pct=rnd.gauss(38.0, 4.0),
            per_cpu_pct=tuple(rnd.gauss(38.0, 10.0) for _ in range(32)),
            mem_used_bytes=int(210 * GIB),
            mem_total_bytes=1024 * GIB,
            load_1m=rnd.gauss(12.0, 0.5),
            run_cpu_pct=rnd.gauss(900.0, 40.0),
            run_rss_bytes=int(48 * GIB),
        )
        return sample_event(DeviceSample(time.time(), host, gpus, None))

    async def run(self) -> None:
        """Steps on a fixed schedule (no drift), a sample each second, until cancelled."""
        self.start_run()
        start = time.monotonic()
        number = 0
        next_sample = start
        while True:
            now = time.monotonic()
            due = int((now - start) * self.steps_per_s)
            while number < due:
                number += 1
                self.record(self.step(number))
                self.sent_at.append(time.monotonic())
            if now >= next_sample:
                self.record(self.sample())
                next_sample += 1.0 / SAMPLES_PER_S
            next_step = start + (number + 1) / self.steps_per_s if self.steps_per_s else next_sample
            await asyncio.sleep(min(next_step, next_sample) - time.monotonic())


# ---- one run -------------------------------------------------------------------


@dataclass
class Measured:
    cpu_pct: float
    kib_per_s: float
    max_lag_s: float
    median_lag_s: float
    steps_checked: int
    bytes_total: int
    shown: list[tuple[float, int]] = field(default_factory=list)
    screen: list[str] = field(default_factory=list)


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU of a process and of its children (live and reaped)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def lags(
    sent_at: list[float], shown: list[tuple[float, int]], start: float, end: float
) -> list[float]:
    """For each step sent in [start, end): seconds until the screen showed it or a later one."""
    times = [t for t, _ in shown]
    best_so_far: list[int] = []  # the highest step shown up to each change
    high = 0
    for _, step in shown:
        high = max(high, step)
        best_so_far.append(high)
    out = []
    for index, sent in enumerate(sent_at):
        if not start <= sent < end:
            continue
        number = index + 1
        # The first change at or after `sent` whose highest step reached `number`.
        k = bisect.bisect_left(best_so_far, number)
        k = max(k, bisect.bisect_left(times, sent))
        if k < len(times) and best_so_far[k] >= number:
            out.append(max(0.0, times[k] - sent))
        else:
            out.append(math.inf)
    return out


async def one_run(width: int, height: int, args: argparse.Namespace, seed: int) -> Measured:
    seconds, warmup_s, profile = args.seconds, args.warmup, args.profile
    with tempfile.TemporaryDirectory(prefix="gpuwatch-bench-") as tmp:
        home = Path(tmp)
        run_dir = home / "runs" / RUN_ID
        run_dir.mkdir(parents=True)
        socket_path = home / "sock" / f"{RUN_ID}.sock"
        feed = Feed(run_dir, socket_path, seed, args.steps_per_s)
        await feed.hub.open()
        feeder = asyncio.create_task(feed.run())

        child, master = await start_dashboard(
            home, RUN_ID, socket_path, width, height, *([profile] if profile else [])
        )
        proc = psutil.Process(child.pid)
        screen = Screen(width, height)
        counting = False
        counted = 0
        shown: list[tuple[float, int]] = []
        last_step = None
        loop = asyncio.get_running_loop()

        def readable() -> None:
            nonlocal counted, last_step
            try:
                data = os.read(master, 1 << 16)
            except OSError:
                loop.remove_reader(master)
                return
            now = time.monotonic()
            if counting:
                counted += len(data)
            screen.feed(data)
            step = screen.step_shown()
            if step is not None and step != last_step:
                last_step = step
                shown.append((now, step))

        loop.add_reader(master, readable)
        try:
            await asyncio.wait_for(feed.subscribed.wait(), 30.0)
            await asyncio.sleep(warmup_s)
            if child.returncode is not None:
                raise RuntimeError(f"the dashboard exited early: {child.returncode}")
            cpu_before, start = cpu_seconds(proc), time.monotonic()
            counting = True
            if profile:
                child.send_signal(signal.SIGUSR1)
            await asyncio.sleep(seconds)
            counting = False
            if profile:
                child.send_signal(signal.SIGUSR2)
                await asyncio.sleep(1.0)
            cpu_after, end = cpu_seconds(proc), time.monotonic()
            bytes_total = counted
            if child.returncode is not None:
                raise RuntimeError(f"the dashboard exited early: {child.returncode}")
        finally:
            await end_dashboard(child, master)
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            feed.hub.close()
            deadline = time.monotonic() + 5.0
            while feed.hub.clients and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.1)  # let the connection's task see its end
            feed.events.close()
        elapsed = end - start
        step_lags = lags(feed.sent_at, shown, start, end - 1.0)
        return Measured(
            cpu_pct=100.0 * (cpu_after - cpu_before) / elapsed,
            kib_per_s=bytes_total / 1024.0 / elapsed,
            max_lag_s=max(step_lags) if step_lags else math.inf,
            median_lag_s=statistics.median(step_lags) if step_lags else math.inf,
            steps_checked=len(step_lags),
            bytes_total=bytes_total,
            shown=shown,
            screen=screen.lines(),
        )


def parse_size(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    return int(width), int(height)


async def main_async(args: argparse.Namespace) -> int:
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    medians: dict[tuple[int, int], tuple[float, float, float]] = {}
    print(
        f"dashboard on a pty; feed: {GPUS} GPUs, {args.steps_per_s:.0f} steps/s, "
        f"{SAMPLES_PER_S:.0f} sample/s; {args.seconds:.0f} s measured after {args.warmup:.0f} s",
        flush=True,
    )
    for width, height in sizes:
        runs = []
        for k in range(args.runs):
            m = await one_run(width, height, args, seed=k)
            runs.append(m)
            if args.show and k == 0:
                print("\n".join(m.screen))
            print(
                f"{width}x{height} run {k + 1}: cpu {m.cpu_pct:5.2f}% of a core  "
                f"{m.kib_per_s:6.2f} KiB/s ({m.bytes_total / 1024:.0f} KiB)  "
                f"lag max {m.max_lag_s:.3f} s, median {m.median_lag_s:.3f} s "
                f"over {m.steps_checked} steps; {len(m.shown)} screen updates of the step",
                flush=True,
            )
        med = (
            statistics.median(m.cpu_pct for m in runs),
            statistics.median(m.kib_per_s for m in runs),
            max(m.max_lag_s for m in runs),
        )
        medians[(width, height)] = med
        print(
            f"{width}x{height} median: cpu {med[0]:.2f}% of a core, {med[1]:.2f} KiB/s; "
            f"largest lag {med[2]:.3f} s",
            flush=True,
        )
    cpu, kib, _ = medians[sizes[0]]
    print(f"result: cpu_pct={cpu:.2f} kib_per_s={kib:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument(
        "--sizes", default="80x24,160x48", help="WxH[,WxH]; the first gives the result"
    )
    parser.add_argument("--steps-per-s", type=float, default=STEPS_PER_S)
    parser.add_argument("--profile", help="write the dashboard's cProfile stats here")
    parser.add_argument("--show", action="store_true", help="print the first run's last screen")
    args = parser.parse_args()
    if args.profile:
        args.profile = str(Path(args.profile).resolve())
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
