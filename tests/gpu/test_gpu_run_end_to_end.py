"""`gpuwatch run` on a real GPU: the supervisor's own sampling, end to end.

A PyTorch script (no TensorFlow: "watched from outside, device sampling only", as the
help says) holds a known 4 GiB block on GPU 0 and keeps it busy with matmuls. It runs
under `gpuwatch run --headless` exactly as a person would start it; then `gpuwatch
export --what samples` must show, while it ran: GPU 0 busy (utilization >= 80 %), the
script's own pid listed on GPU 0 as the run's with at least the 4 GiB it holds, and the
run's CPU measured. The supervisor, its sampler at 2 Hz, the run's process tree, the
record and the export are the real ones; only the load is known.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 4 * 2**30
LOAD_S = 12.0

SCRIPT = textwrap.dedent(
    f"""
    import os, time, torch
    open("pid", "w").write(str(os.getpid()))
    block = torch.empty({BLOCK}, dtype=torch.uint8, device="cuda:0")
    block.fill_(1)
    a = torch.randn(8192, 8192, device="cuda:0")
    b = torch.randn(8192, 8192, device="cuda:0")
    end = time.monotonic() + {LOAD_S}
    while time.monotonic() < end:
        for _ in range(4):
            torch.matmul(a, b)
        torch.cuda.synchronize()
    print("load done", flush=True)
    """
)


def gpuwatch(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUWATCH_HOME=str(home))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def test_a_torch_script_under_gpuwatch_run_is_sampled_on_its_gpu(
    tmp_path: Path, torch_cuda: Any
) -> None:
    # `gpuwatch run` reads and checks settings (gpuwatch.config): pydantic and PyYAML.
    pytest.importorskip("pydantic", reason="gpuwatch run needs pydantic (pip install pydantic)")
    pytest.importorskip("yaml", reason="gpuwatch run needs PyYAML (pip install pyyaml)")
    (tmp_path / "load.py").write_text(SCRIPT)
    home = tmp_path / "home"
    done = gpuwatch(tmp_path, home, "run", "--headless", "--", sys.executable, "load.py")
    print("\n" + done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr
    assert "not a TensorFlow program" in done.stdout + done.stderr
    started = re.search(r"run (\S+) started", done.stdout + done.stderr)
    assert started, "gpuwatch run printed no run id"
    run_id = started.group(1)
    script_pid = int((tmp_path / "pid").read_text())

    exported = gpuwatch(tmp_path, home, "export", "--what", "samples", "--format", "jsonl", run_id)
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
    gpu0 = [r for r in rows if r["gpu.index"] == 0]
    assert gpu0, f"no GPU 0 sample in the record ({rows[:1]})"
    assert all(r["nvml"] is None for r in gpu0), gpu0[0]["nvml"]

    def ours(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [p for p in row["gpu.processes"] or [] if p.get("in_run")]

    loaded = [r for r in gpu0 if ours(r) and (ours(r)[0].get("used_bytes") or 0) >= BLOCK]
    print(f"{len(gpu0)} samples of GPU 0, {len(loaded)} with the script's block on it")
    print("util", [r["gpu.util_gpu_pct"] for r in loaded])
    print("run processes", [ours(r) for r in loaded[:2]])
    print("run cpu %", [r["host.run_cpu_pct"] for r in loaded])
    # The load held the GPU ~LOAD_S s; the record keeps samples about once a second.
    assert len(loaded) >= LOAD_S / 3
    assert {p["pid"] for r in loaded for p in ours(r)} == {script_pid}
    assert statistics.median(r["gpu.util_gpu_pct"] for r in loaded) >= 80
    assert all(r["gpu.mem_used_bytes"] >= BLOCK for r in loaded)
    run_cpu = [r["host.run_cpu_pct"] for r in loaded if r["host.run_cpu_pct"] is not None]
    assert run_cpu and statistics.median(run_cpu) > 10  # the script's host thread spins

    listed = gpuwatch(tmp_path, home, "ls")
    assert re.search(rf"{re.escape(run_id)}\s+load\.py\s+finished", listed.stdout), listed.stdout
