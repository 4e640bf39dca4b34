"""Cost of DeviceSampler.sample() at 2 Hz: CPU per sample per GPU, longest caller block.

Prints figures and exits 0; not a test. Uses the real NVML where it works,
otherwise the fake 8-GPU box whose PCIe counters are "not supported" and whose
nvmlDeviceGetPcieThroughput sleeps 20 ms like the real window, so what is
measured is the worker-thread fallback (the expensive path). The output says
which. Serially, that fallback would block the caller 8 GPUs x 2 calls x 20 ms.

    .venv/bin/python bench/bench_sampler.py [--seconds 20] [--gpus 8] [--pcie-window]

--pcie-window, on a GPU whose driver has the PCIe counters, hides them
(tests/support/nvml_views.py) so the real 20 ms window is what the worker reads:
whether that call holds a lock in NVML that makes the caller's calls wait shows in
"caller blocked".
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuwatch.sampling import DeviceSampler
from tests.support.fake_nvml import (
    NVML_ERROR_NOT_SUPPORTED,
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    fake_h100_box,
)
from tests.support.nvml_views import CountersHidden

WINDOW_S = 0.020
PERIOD_S = 0.5  # the supervisor's 2 Hz


def real_nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        return int(pynvml.nvmlDeviceGetCount()) > 0
    finally:
        pynvml.nvmlShutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs when NVML is absent")
    parser.add_argument("--pcie-window", action="store_true",
                        help="real NVML: hide the PCIe counters, read the 20 ms window")
    args = parser.parse_args()

    nvml: object | None
    if real_nvml_works():
        if args.pcie_window:
            import pynvml

            nvml = CountersHidden(pynvml)
            source = "REAL NVML, PCIe counters hidden -> 20 ms window read by the worker thread"
        else:
            nvml = None
            source = "REAL NVML"
    else:
        nvml = fake_h100_box(args.gpus, window_s=WINDOW_S)
        for gpu in nvml.gpus:
            gpu.field_errors = {
                NVML_FI_DEV_PCIE_COUNT_TX_BYTES: NVML_ERROR_NOT_SUPPORTED,
                NVML_FI_DEV_PCIE_COUNT_RX_BYTES: NVML_ERROR_NOT_SUPPORTED,
            }
        source = (
            f"FAKE NVML, {args.gpus} GPUs, PCIe counters unsupported -> "
            f"{WINDOW_S * 1000:.0f} ms window read by the worker thread"
        )
    sampler = DeviceSampler(run_pids=lambda: {os.getpid()}, nvml=nvml)
    gpus = max(sampler.gpu_count, 1)
    walls: list[float] = []
    caller_cpu: list[float] = []
    pids_before = time.process_time()
    started = time.monotonic()
    next_at = started
    while time.monotonic() - started < args.seconds:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        sample = sampler.sample()
        walls.append(time.perf_counter() - wall0)
        caller_cpu.append(time.thread_time() - cpu0)
        next_at += PERIOD_S
        time.sleep(max(0.0, next_at - time.monotonic()))
    elapsed = time.monotonic() - started
    process_cpu = time.process_time() - pids_before
    window_reads = sum(1 for g in sample.gpus if g.pcie_tx_bytes_per_s is not None)
    worker_alive = sampler._poller is not None and sampler._poller.alive
    passes = sampler._poller.passes if sampler._poller is not None else 0
    sampler.close()

    n = len(walls)
    print(f"source:            {source}")
    python = sys.version.split()[0]
    print(f"machine:           {platform.node()} ({os.cpu_count()} CPUs), Python {python}")
    print(
        f"sampled:           {n} samples at 2 Hz over {elapsed:.1f} s, {sampler.gpu_count} GPU(s)"
    )
    print(f"nvml:              {sample.nvml or 'ok'}")
    print(
        "caller CPU/sample: "
        f"median {statistics.median(caller_cpu) * 1e3:.2f} ms, "
        f"per GPU {statistics.median(caller_cpu) / gpus * 1e3:.3f} ms"
    )
    print(
        "process CPU/sample (caller + PCIe worker + psutil): "
        f"{process_cpu / n * 1e3:.2f} ms, per GPU {process_cpu / n / gpus * 1e3:.3f} ms"
    )
    print(
        "caller blocked:    "
        f"median {statistics.median(walls) * 1e3:.2f} ms, "
        f"p99 {sorted(walls)[int(0.99 * (n - 1))] * 1e3:.2f} ms, "
        f"max {max(walls) * 1e3:.2f} ms (first call included)"
    )
    print(f"PCIe source:       {sorted({str(g.pcie_source) for g in sample.gpus})}")
    if nvml is not None:
        serial = sampler.gpu_count * 2 * WINDOW_S * 1e3
        print(f"serial window cost this avoids: {serial:.0f} ms per sample")
        print(
            f"PCIe worker: alive {worker_alive}, {passes} passes, "
            f"{window_reads}/{sampler.gpu_count} GPUs with a reading at the end"
        )
    print(f"threads at end:    {threading.active_count()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
