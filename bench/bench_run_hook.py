"""What `gpuwatch run` costs a person's own fit script: its examples/s and CPU time,
with and without.

The script (tests/data/scripts/fit_mirrored.py: model.fit under MirroredStrategy over
2 logical CPU devices, a tf.data pipeline, the seed's shape) times its own fit after
a warm-up epoch and prints examples_per_s=; gpuwatch's figures play no part. Each
repeat runs it plainly and under `gpuwatch run --headless` back to back, the order
alternating. Printed: the median of the per-pair examples/s ratios with their
spread, and the CPU seconds each side used (the script's, and under gpuwatch the
supervisor's and the headless follower's too, polled from /proc), whose ratio is
far steadier here than wall-clock rates.

    python bench/bench_run_hook.py [--repeats 8] [--epochs 15] [--examples 65536]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "data" / "scripts" / "fit_mirrored.py"
RATE = re.compile(r"examples_per_s=([0-9.]+)")


def _rate(text: str) -> float:
    found = RATE.findall(text)
    if not found:
        raise SystemExit(f"the script printed no examples_per_s:\n{text[-2000:]}")
    return float(found[-1])


class CpuSeconds:
    """CPU seconds (user + system) of every process whose command line names the script
    or gpuwatch, by role, polled every 50 ms while a run lasts (the last poll of each)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> CpuSeconds:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            for proc in psutil.process_iter(["pid", "cmdline"]):
                try:
                    line = " ".join(proc.info["cmdline"] or [])
                    if proc.pid == me:
                        continue
                    role = ("script" if str(SCRIPT) in line and "gpuwatch" not in line
                            else "supervisor" if "gpuwatch.supervisor" in line
                            else "follower" if "-m gpuwatch run" in line else None)
                    if role is not None:
                        times = proc.cpu_times()
                        self.seen[(role, proc.pid)] = times.user + times.system
                except psutil.Error:
                    pass
            self._stop.wait(0.05)

    def by_role(self) -> dict[str, float]:
        roles: dict[str, float] = {}
        for (role, _), seconds in self.seen.items():
            roles[role] = roles.get(role, 0.0) + seconds
        return roles


def plain(script_args: list[str], env: dict[str, str]) -> tuple[float, dict[str, float]]:
    with CpuSeconds() as cpu:
        out = subprocess.run([sys.executable, str(SCRIPT), *script_args], env=env,
                             capture_output=True, text=True, check=True, timeout=600)
    return _rate(out.stdout), cpu.by_role()


def watched(script_args: list[str], env: dict[str, str], home: Path
            ) -> tuple[float, dict[str, float]]:
    cmd = [sys.executable, "-m", "gpuwatch", "run", "--headless", "--",
           sys.executable, str(SCRIPT), *script_args]
    with CpuSeconds() as cpu:
        out = subprocess.run(cmd, env={**env, "GPUWATCH_HOME": str(home)},
                             capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"gpuwatch run failed ({out.returncode}):\n{out.stderr[-2000:]}")
    logs = sorted(home.glob("runs/*/trainer.log"), key=lambda p: p.stat().st_mtime)
    return _rate(logs[-1].read_text()), cpu.by_role()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=15, help="timed epochs per run")
    parser.add_argument("--examples", type=int, default=65536, help="examples per epoch")
    args = parser.parse_args()
    script_args = ["--dataset", "--epochs", "1", "--time-epochs", str(args.epochs),
                   "--examples", str(args.examples), "--batch", "256", "--width", "512"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    rates: dict[str, list[float]] = {"plain": [], "watched": []}
    cpu: dict[str, list[dict[str, float]]] = {"plain": [], "watched": []}
    with tempfile.TemporaryDirectory(prefix="gpuwatch-bench-") as tmp:
        for i in range(args.repeats):
            order = ("plain", "watched") if i % 2 == 0 else ("watched", "plain")
            pair: dict[str, float] = {}
            used: dict[str, dict[str, float]] = {}
            for kind in order:
                pair[kind], used[kind] = (plain(script_args, env) if kind == "plain"
                                          else watched(script_args, env, Path(tmp)))
                rates[kind].append(pair[kind])
                cpu[kind].append(used[kind])
            ratios.append(pair["watched"] / pair["plain"])
            cpu_ratios.append(sum(used["watched"].values()) / sum(used["plain"].values()))
            roles = " ".join(f"{k}={v:.2f}" for k, v in sorted(used["watched"].items()))
            print(f"repeat {i + 1}: plain={pair['plain']:.1f} watched={pair['watched']:.1f} "
                  f"ratio={ratios[-1]:.3f} cpu_s plain={used['plain'].get('script', 0):.2f} "
                  f"watched: {roles} cpu_ratio={cpu_ratios[-1]:.3f}", flush=True)
    print(f"plain_examples_per_s_median={statistics.median(rates['plain']):.1f} "
          f"spread={min(rates['plain']):.1f}-{max(rates['plain']):.1f}")
    print(f"watched_examples_per_s_median={statistics.median(rates['watched']):.1f} "
          f"spread={min(rates['watched']):.1f}-{max(rates['watched']):.1f}")
    for role in ("script", "supervisor", "follower"):
        values = [u.get(role, 0.0) for u in cpu["watched"]]
        print(f"watched_cpu_s_{role}_median={statistics.median(values):.2f}")
    plain_script = statistics.median(u.get("script", 0.0) for u in cpu["plain"])
    print(f"plain_cpu_s_script_median={plain_script:.2f}")
    print(f"result: ratio_watched_vs_plain={statistics.median(ratios):.3f} "
          f"spread={min(ratios):.3f}-{max(ratios):.3f} "
          f"cpu_ratio={statistics.median(cpu_ratios):.3f} "
          f"cpu_spread={min(cpu_ratios):.3f}-{max(cpu_ratios):.3f} repeats={len(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
