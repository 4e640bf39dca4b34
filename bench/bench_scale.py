"""64 workers under one dashboard: what the record, the supervisor and the dashboard cost.

The real supervisor (`gpuwatch train CONFIG --detach`) runs a cluster of --workers
workers at 40 updates a second, 8 GPUs each: worker 0 on this host (the chief, as
under `launcher: ssh` with localhost first), every other one through the real link (an
agent process, `python -m gpuwatch.supervisor.remote`, on the other end of an `ssh`
whose stdio carries the frames). Here `ssh` is a stand-in on PATH that runs the
remote command on this host, and each worker's trainer is bench/sim_worker.py (the
trainer's frames, no TensorFlow); each agent samples "its host" with a fake NVML of
8 H100s (tests/support/fake_nvml.py). Everything else is what a person runs: the
agents summarize (past 8 workers), the supervisor records and folds, and the real
dashboard (`gpuwatch attach`) runs on a pseudo-terminal.

Once every worker has said hello and the dashboard has run LIVE_SETTLE_S (its pace
settles), for --seconds: the bytes
events.jsonl grows by, the CPU seconds of the supervisor and of the dashboard (the
first half at 80x24, the second at 160x48). Meanwhile worker 17 becomes input-bound
(its input wait goes from ~1 to ~12 ms of a 25 ms step) at a known time, and a client
subscribed to the run folds its events as the dashboard does (RunState) and times how
long until the straggler rule (advisor.find_straggler) names it. At the end a second
dashboard attaches at 80x24 and is timed until its screen shows a step, beside the
simulated cluster and (attach_s) with it paused for those seconds: on a real cluster it
runs on other hosts. Then `gpuwatch stop`, and nothing is left.

The dashboard is measured twice. Beside the simulated cluster (above), where 128 processes
share this box's two cores with it, as no head node's dashboard does; and as on a head
node: the run's own events.jsonl replayed at its pace to a fresh dashboard with the
cluster gone (bench/head_node.py), after its first HEAD_SETTLE_S (its pace settles: over
its CPU budget it repaints less often, gpuwatch/app/repaint.py), 80x24 then 160x48. The
result's dashboard_cpu_pct is the head node's larger figure; both are printed.

Last line: `result: workers=64 events_kib_per_s=A supervisor_cpu_pct=B
dashboard_cpu_pct=C attach_s=D straggler_named_s=E` (targets: A <= 100, B <= 10,
C <= 2, D < 2, E <= 2).

    .venv/bin/python bench/bench_scale.py [--workers 64] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import pty
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import head_node  # noqa: E402
from bench_dashboard import Screen  # noqa: E402

from gpuwatch import advisor  # noqa: E402
from gpuwatch.follow.client import RunClient  # noqa: E402
from gpuwatch.runs import folders  # noqa: E402
from gpuwatch.runstate import RunState  # noqa: E402

STRAGGLER = 17
# The head-node replay: at each size the dashboard's pace settles in this long, then it is
# measured for half of HEAD_SECONDS.
HEAD_SETTLE_S = 25.0
# The live dashboard: measured from this long after it started (its pace settled).
LIVE_SETTLE_S = 30.0
HEAD_SECONDS = 40.0
SSH_STAND_IN = """#!/bin/sh
# ssh -T [options] -o BatchMode=yes -- HOST COMMAND: run COMMAND here, as sshd would.
while [ "$1" != "--" ]; do shift; done
shift 2
exec sh -c "$*"
"""
FAKE_PYNVML = """import sys
from tests.support.fake_nvml import fake_h100_box
sys.modules[__name__] = fake_h100_box(8)
"""
CONFIG = """name: scale-bench
model:
  name: mlp
  hidden_units: [32]
data:
  examples: {examples}
  input_shape: [32]
  classes: 4
train:
  global_batch_size: {batch}
cluster:
  launcher: ssh
  workers: {hosts}
  python: {python}
  timeout_s: 600
"""


def gpuwatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], env=env, text=True,
                          capture_output=True, timeout=120, check=False)


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far of the simulated cluster's processes: agents and workers."""
    roles = {"agents": 0.0, "workers": 0.0}
    for proc in psutil.process_iter(["cmdline", "cpu_times"]):
        line = " ".join(proc.info["cmdline"] or [])
        role = ("agents" if "gpuwatch.supervisor.remote" in line
                else "workers" if "bench.sim_worker" in line else None)
        if role is not None and proc.info["cpu_times"] is not None:
            roles[role] += proc.info["cpu_times"].user + proc.info["cpu_times"].system
    return roles


def hellos(events: Path) -> int:
    try:
        text = events.read_text()
    except OSError:
        return 0
    return len({json.loads(line)["worker"] for line in text.splitlines()
                if '"type": "hello"' in line or '"type":"hello"' in line})


def by_type(events: Path, start: int, end: int, seconds: float) -> str:
    """The record's bytes from `start` to `end`, per event type, per second."""
    with open(events, "rb") as fh:
        fh.seek(start)
        data = fh.read(end - start)
    sizes: dict[str, int] = {}
    for line in data.splitlines()[1:]:  # the first may be cut
        kind = json.loads(line).get("type", "?")
        sizes[kind] = sizes.get(kind, 0) + len(line) + 1
    return " ".join(f"{k}={v / 1024 / seconds:.1f}"
                    for k, v in sorted(sizes.items(), key=lambda kv: -kv[1]))


class Dashboard:
    """`gpuwatch attach RUN` on a pseudo-terminal, its bytes fed to a Screen."""

    def __init__(self, env: dict[str, str], run_id: str, width: int, height: int) -> None:
        self.master, slave = pty.openpty()
        self.resize(width, height)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch", "attach", run_id],
            env={**env, "TERM": "xterm-256color", "COLUMNS": str(width),
                 "LINES": str(height)},
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        )
        os.close(slave)
        self.started = time.monotonic()
        self.first_step_s: float | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def resize(self, width: int, height: int) -> None:
        self.screen = Screen(width, height)
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.screen.feed(data)
            if self.first_step_s is None and self.screen.step_shown() is not None:
                self.first_step_s = time.monotonic() - self.started

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)


class Watcher:
    """A client that folds the run's events as a dashboard does and notes when the
    straggler rule first names STRAGGLER."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.named_at: float | None = None
        self.events = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()

    async def _main(self) -> None:
        state = RunState()
        async with RunClient(self.socket_path) as client:
            await client.subscribe(0)
            last_check = 0.0
            while not self._stop.is_set():
                try:
                    batch = await asyncio.wait_for(client.next_batch(), 0.2)
                except TimeoutError:
                    batch = []
                for frame in batch:
                    state.apply(frame)
                self.events += len(batch)
                now = time.time()
                if self.named_at is None and now - last_check >= 0.1:
                    last_check = now
                    found = advisor.find_straggler(state.worker_summaries())
                    if found is not None and found.worker == STRAGGLER:
                        self.named_at = now

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--keep-record", type=Path, help="copy the run's events.jsonl here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwatch-scale-") as tmp_name:
        tmp = Path(tmp_name)
        home, bin_dir, nvml_dir = tmp / "home", tmp / "bin", tmp / "nvml"
        for path in (home, bin_dir, nvml_dir):
            path.mkdir()
        (bin_dir / "ssh").write_text(SSH_STAND_IN)
        (bin_dir / "ssh").chmod(0o755)
        (nvml_dir / "pynvml.py").write_text(FAKE_PYNVML)
        hosts = ["localhost", *(f"sim-{i:02d}" for i in range(1, args.workers))]
        config = tmp / "scale.yaml"
        config.write_text(CONFIG.format(hosts=json.dumps(hosts), batch=256 * args.workers,
                                        examples=512 * args.workers,
                                        python=shlex.quote(sys.executable)))
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
               "PYTHONPATH": f"{nvml_dir}:{ROOT}", "GPUWATCH_HOME": str(home),
               "GPUWATCH_TRAINER_MODULE": "bench.sim_worker",
               "GPUWATCH_SIM_WORKERS": str(args.workers),
               "GPUWATCH_SIM_STRAGGLER": str(STRAGGLER),
               "GPUWATCH_SIM_STRAGGLE_AT_FILE": str(tmp / "straggle_at")}
        (tmp / "straggle_at").write_text("inf")  # set once the run has settled
        return measure(args, env, config, tmp)


def measure(args: argparse.Namespace, env: dict[str, str], config: Path, tmp: Path) -> int:
    began = time.monotonic()
    started = gpuwatch(env, "train", str(config), "--detach")
    if started.returncode != 0:
        print(started.stdout + started.stderr, file=sys.stderr)
        return 1
    home = Path(env["GPUWATCH_HOME"])
    (info,) = folders.list_runs(home)
    events = info.run_dir / "events.jsonl"
    dashboards: list[Dashboard] = []
    watcher: Watcher | None = None
    try:
        deadline = time.monotonic() + 300
        while hellos(events) < args.workers:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {hellos(events)} of {args.workers} workers said hello")
            time.sleep(1.0)
        print(f"all {args.workers} workers up in {time.monotonic() - began:.1f} s", flush=True)
        # The simulated cluster runs on this host, where a real one runs on 64 others: it
        # yields the CPU to the supervisor and the dashboards (nice 19), so they are
        # measured as on a head node, not starved by 128 processes on 2 cores.
        for proc in simulated_cluster():
            with contextlib.suppress(psutil.Error):
                proc.nice(19)
        info = folders.read_run_info(info.run_dir)
        assert info.supervisor_pid is not None and info.socket_path is not None
        supervisor = info.supervisor_pid
        watcher = Watcher(info.socket_path)
        dashboard = Dashboard(env, info.run_id, 80, 24)
        dashboards.append(dashboard)
        time.sleep(LIVE_SETTLE_S)  # its first paint, the agents' first summaries, its pace
        if os.environ.get("BENCH_SCALE_PROFILE"):  # py-spy the dashboard meanwhile
            subprocess.Popen(["py-spy", "record", "-d", "20", "-o",
                              os.environ["BENCH_SCALE_PROFILE"], "-f", "raw", "-p",
                              str(dashboard.proc.pid)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        half = args.seconds / 2
        straggle_at = time.time() + half / 2
        (tmp / "straggle_at").write_text(str(straggle_at))
        size0, sup0, dash0, t0 = (events.stat().st_size, cpu_seconds(supervisor),
                                  cpu_seconds(dashboard.proc.pid), time.monotonic())
        roles0 = cpu_by_role()
        time.sleep(half)
        dash_mid, t_mid = cpu_seconds(dashboard.proc.pid), time.monotonic()
        dashboard.resize(160, 48)
        os.killpg(dashboard.proc.pid, signal.SIGWINCH)
        time.sleep(half)
        size1, sup1, dash1, t1 = (events.stat().st_size, cpu_seconds(supervisor),
                                  cpu_seconds(dashboard.proc.pid), time.monotonic())
        window = t1 - t0
        roles1 = cpu_by_role()
        print("the simulated cluster on this host, % of a core: " + " ".join(
            f"{k}={100.0 * (roles1[k] - roles0[k]) / window:.0f}" for k in roles1)
            + f"; load average {os.getloadavg()[0]:.1f}")
        kib_per_s = (size1 - size0) / 1024.0 / window
        supervisor_pct = 100.0 * (sup1 - sup0) / window
        dash_small = 100.0 * (dash_mid - dash0) / (t_mid - t0)
        dash_big = 100.0 * (dash1 - dash_mid) / (t1 - t_mid)
        named_s = (watcher.named_at - straggle_at) if watcher.named_at is not None else None
        dashboard.close()
        dashboards.clear()
        # The attach is timed with the simulated cluster paused (SIGSTOP, a few seconds):
        # on a real cluster it runs on other hosts, here its 128 processes would take most
        # of this box's two cores from a dashboard starting up. Measured both ways.
        attach_busy_s = time_attach(env, info.run_id, dashboards)
        cluster = simulated_cluster()
        for proc in cluster:
            with contextlib.suppress(psutil.Error):
                proc.suspend()
        try:
            attach_s = time_attach(env, info.run_id, dashboards)
        finally:
            for proc in cluster:
                with contextlib.suppress(psutil.Error):
                    proc.resume()
        second = dashboards[-1]
        print(f"attach: {attach_busy_s} s beside the simulated cluster, {attach_s} s with "
              "it paused")
        print("events.jsonl by type, KiB/s: " + by_type(events, size0, size1, window))
        print(f"events.jsonl: {kib_per_s:.1f} KiB/s over {window:.0f} s; supervisor "
              f"{supervisor_pct:.1f}% of a core; dashboard {dash_small:.2f}% at 80x24, "
              f"{dash_big:.2f}% at 160x48; the watcher folded {watcher.events} events")
        print("the second dashboard's screen:\n" + "\n".join(second.screen.lines()))
        for log_file in sorted(info.run_dir.glob("*.log")):
            warned = [line for line in log_file.read_text(errors="replace").splitlines()
                      if " WARNING " in line or " ERROR " in line]
            if warned:
                print(f"{log_file.name}: {len(warned)} warnings; the last: {warned[-3:]}")
        if args.keep_record is not None:
            shutil.copyfile(events, args.keep_record)
        record = head_node.read_record(events)
    finally:
        if watcher is not None:
            watcher.close()
        for dashboard in dashboards:
            dashboard.close()
        stop_everything(env, info.run_id, info.run_dir)
    # The dashboard as on a head node: the same run's record replayed at its pace to a
    # fresh dashboard with the simulated cluster gone (bench/head_node.py), measured after
    # its first HEAD_SETTLE_S, as a dashboard minutes old is.
    from_t = max(f["t"] for f in record if f.get("type") == "hello") + 2.0
    head_small, head_big = asyncio.run(head_node.replay(
        record, from_t, HEAD_SECONDS, [(80, 24), (160, 48)], warmup_s=HEAD_SETTLE_S))
    print(f"dashboard beside the simulated cluster: {dash_small:.2f}% at 80x24, "
          f"{dash_big:.2f}% at 160x48 (settled {LIVE_SETTLE_S:.0f} s, then "
          f"{args.seconds:.0f} s); as on a head node: "
          f"{head_small:.2f}% at 80x24, {head_big:.2f}% at 160x48")
    print(f"result: workers={args.workers} events_kib_per_s={kib_per_s:.1f} "
          f"supervisor_cpu_pct={supervisor_pct:.1f} "
          f"dashboard_cpu_pct={max(head_small, head_big):.2f} "
          f"attach_s={attach_s} "
          f"straggler_named_s={named_s if named_s is None else round(named_s, 2)}")
    return 0


def simulated_cluster() -> list[psutil.Process]:
    """The agents and simulated workers (the cluster that a real run has elsewhere)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if "gpuwatch.supervisor.remote" in line or "bench.sim_worker" in line:
            found.append(proc)
    return found


def time_attach(env: dict[str, str], run_id: str, dashboards: list[Dashboard]
                ) -> float | None:
    """Seconds from starting `gpuwatch attach` at 80x24 to a step on its screen (None:
    none within a minute); the dashboard stays open (closed with the others)."""
    dashboard = Dashboard(env, run_id, 80, 24)
    dashboards.append(dashboard)
    deadline = time.monotonic() + 60
    while dashboard.first_step_s is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return None if dashboard.first_step_s is None else round(dashboard.first_step_s, 2)


def stop_everything(env: dict[str, str], run_id: str, run_dir: Path) -> None:
    """gpuwatch stop, then wait until no process of the run is left (and say if one was)."""
    gpuwatch(env, "stop", run_id)
    deadline = time.monotonic() + 60
    tmp = str(Path(env["GPUWATCH_HOME"]).parent)
    while time.monotonic() < deadline:
        left = [p for p in psutil.process_iter(["cmdline"])
                if any(tmp in part for part in (p.info["cmdline"] or []))
                or "bench.sim_worker" in " ".join(p.info["cmdline"] or [])]
        if not left:
            return
        time.sleep(0.5)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    print(f"warning: {len(left)} processes outlived the stop; killed", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
