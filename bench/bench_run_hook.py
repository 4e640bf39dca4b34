"""What `gpuwatch run` costs a person's own fit script: its examples/s with and without.

The script (tests/data/scripts/fit_mirrored.py: model.fit under MirroredStrategy over
2 logical CPU devices, arrays, the seed's shape) times its own fit after a warm-up
epoch and prints examples_per_s=; gpuwatch's figures play no part. Each repeat runs
it plainly and under `gpuwatch run --headless` back to back, the order alternating,
and the result is the median of the per-pair ratios with its spread.

    python bench/bench_run_hook.py [--repeats 6] [--epochs 3]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "data" / "scripts" / "fit_mirrored.py"
RATE = re.compile(r"examples_per_s=([0-9.]+)")


def _rate(text: str) -> float:
    found = RATE.findall(text)
    if not found:
        raise SystemExit(f"the script printed no examples_per_s:\n{text[-2000:]}")
    return float(found[-1])


def plain(script_args: list[str], env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, str(SCRIPT), *script_args], env=env,
                         capture_output=True, text=True, check=True, timeout=600)
    return _rate(out.stdout)


def watched(script_args: list[str], env: dict[str, str], home: Path) -> float:
    cmd = [sys.executable, "-m", "gpuwatch", "run", "--headless", "--",
           sys.executable, str(SCRIPT), *script_args]
    out = subprocess.run(cmd, env={**env, "GPUWATCH_HOME": str(home)}, capture_output=True,
                         text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"gpuwatch run failed ({out.returncode}):\n{out.stderr[-2000:]}")
    logs = sorted(home.glob("runs/*/trainer.log"), key=lambda p: p.stat().st_mtime)
    return _rate(logs[-1].read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per run")
    args = parser.parse_args()
    script_args = ["--epochs", "1", "--time-epochs", str(args.epochs), "--examples", "16384",
                   "--batch", "256", "--width", "512"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    ratios: list[float] = []
    rates: dict[str, list[float]] = {"plain": [], "watched": []}
    with tempfile.TemporaryDirectory(prefix="gpuwatch-bench-") as tmp:
        for i in range(args.repeats):
            order = ("plain", "watched") if i % 2 == 0 else ("watched", "plain")
            pair = {}
            for kind in order:
                pair[kind] = (plain(script_args, env) if kind == "plain"
                              else watched(script_args, env, Path(tmp)))
                rates[kind].append(pair[kind])
            ratios.append(pair["watched"] / pair["plain"])
            print(f"repeat {i + 1}: plain={pair['plain']:.1f} watched={pair['watched']:.1f} "
                  f"ratio={ratios[-1]:.3f}", flush=True)
    print(f"plain_examples_per_s_median={statistics.median(rates['plain']):.1f}")
    print(f"watched_examples_per_s_median={statistics.median(rates['watched']):.1f}")
    print(f"result: ratio_watched_vs_plain={statistics.median(ratios):.3f} "
          f"spread={min(ratios):.3f}-{max(ratios):.3f} repeats={len(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
