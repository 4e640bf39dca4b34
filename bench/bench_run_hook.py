"""What `gpuwatch run` costs a person's own fit script: its examples/s and CPU time,
with and without.

The script (tests/data/scripts/fit_mirrored.py: model.fit under MirroredStrategy over
2 logical CPU devices, a tf.data pipeline) times its own epochs after a warm-up one
and prints the examples/s of its median epoch (a burst of load on this shared box
then moves one epoch, not the run); gpuwatch's figures play no part. Each pair runs
it plainly and under `gpuwatch run --headless` back to back, the order alternating.
Two shapes: "fast" (32-512-10, ~2 ms steps: where a per-step cost shows most) and
"seed" (the demo's 784-1024-1024-10). Printed per shape: the median of the per-pair
ratios (watched over plain) with a bootstrap 95% interval and the spread, and the
CPU seconds each side used (the script's, and under gpuwatch the supervisor's and
the headless follower's too, polled from /proc): the script's own CPU ratio is far
steadier here than wall-clock rates.

    python bench/bench_run_hook.py [--repeats 10] [--epochs 8] [--shapes fast,seed]
"""

from __future__ import annotations

import argparse
import os
import random
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
RATE = re.compile(r"median_epoch_examples_per_s=([0-9.]+)")


def _rate(text: str) -> float:
    found = RATE.findall(text)
    if not found:
        raise SystemExit(f"the script printed no median_epoch_examples_per_s:\n{text[-2000:]}")
    return float(found[-1])


def ci95(ratios: list[float], rounds: int = 10000) -> tuple[float, float]:
    """A bootstrap 95% interval of the median ratio: the pairs resampled with
    replacement."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


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


# The two shapes measured: a fast step (where a per-step cost shows most) and the seed
# demo's model (784-1024-1024-10, batch 256).
SHAPES = {
    "fast": ["--features", "32", "--width", "512", "--depth", "1", "--examples", "65536"],
    "seed": ["--features", "784", "--width", "1024", "--depth", "2", "--examples", "16384"],
}


def measure(shape: str, script_args: list[str], repeats: int, env: dict[str, str],
            home: Path) -> str:
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    rates: dict[str, list[float]] = {"plain": [], "watched": []}
    cpu: dict[str, list[dict[str, float]]] = {"plain": [], "watched": []}
    for i in range(repeats):
        order = ("plain", "watched") if i % 2 == 0 else ("watched", "plain")
        pair: dict[str, float] = {}
        used: dict[str, dict[str, float]] = {}
        for kind in order:
            pair[kind], used[kind] = (plain(script_args, env) if kind == "plain"
                                      else watched(script_args, env, home))
            rates[kind].append(pair[kind])
            cpu[kind].append(used[kind])
        ratios.append(pair["watched"] / pair["plain"])
        cpu_ratios.append(used["watched"].get("script", 0.0) / used["plain"]["script"])
        roles = " ".join(f"{k}={v:.2f}" for k, v in sorted(used["watched"].items()))
        print(f"{shape} pair {i + 1}: plain={pair['plain']:.1f} watched={pair['watched']:.1f} "
              f"ratio={ratios[-1]:.3f} cpu_s plain script={used['plain']['script']:.2f} "
              f"watched {roles} script_cpu_ratio={cpu_ratios[-1]:.3f}", flush=True)
    for kind in ("plain", "watched"):
        print(f"{shape} {kind}_examples_per_s_median={statistics.median(rates[kind]):.1f} "
              f"spread={min(rates[kind]):.1f}-{max(rates[kind]):.1f}")
    for role in ("script", "supervisor", "follower"):
        values = [u.get(role, 0.0) for u in cpu["watched"]]
        print(f"{shape} watched_cpu_s_{role}_median={statistics.median(values):.2f}")
    plain_script = statistics.median(u["script"] for u in cpu["plain"])
    print(f"{shape} plain_cpu_s_script_median={plain_script:.2f}")
    lo, hi = ci95(ratios)
    clo, chi = ci95(cpu_ratios)
    return (f"{shape}_ratio={statistics.median(ratios):.3f} {shape}_ci95={lo:.3f}-{hi:.3f} "
            f"{shape}_spread={min(ratios):.3f}-{max(ratios):.3f} "
            f"{shape}_script_cpu_ratio={statistics.median(cpu_ratios):.3f} "
            f"{shape}_script_cpu_ci95={clo:.3f}-{chi:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="pairs per shape")
    parser.add_argument("--epochs", type=int, default=8, help="timed epochs per run")
    parser.add_argument("--shapes", default="fast,seed", help="of: " + ",".join(SHAPES))
    args = parser.parse_args()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    found: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpuwatch-bench-") as tmp:
        for shape in args.shapes.split(","):
            script_args = ["--dataset", "--epochs", "1", "--time-epochs", str(args.epochs),
                           "--batch", "256", *SHAPES[shape]]
            found.append(measure(shape, script_args, args.repeats, env, Path(tmp)))
    print(f"result: {' '.join(found)} repeats={args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
