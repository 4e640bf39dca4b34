"""How fast does `gpuwatch --help` answer? (target: under 0.5 s)

Runs the installed console script 15 times and prints the median and worst
wall time. Lazy imports keep Textual, pydantic and TensorFlow out of this path.

    .venv/bin/python bench/bench_cli.py
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNS = 15


def main() -> int:
    exe = shutil.which("gpuwatch") or str(Path(sys.executable).with_name("gpuwatch"))
    timings = []
    for _ in range(RUNS):
        started = time.perf_counter()
        subprocess.run([exe, "--help"], capture_output=True, check=True)
        timings.append(time.perf_counter() - started)
    median = statistics.median(timings)
    print(f"gpuwatch --help: median {median * 1000:.0f} ms, worst {max(timings) * 1000:.0f} ms "
          f"over {RUNS} runs")
    print(f"result: help_median_s={median:.3f} target_s=0.5")
    return 0


if __name__ == "__main__":
    sys.exit(main())
