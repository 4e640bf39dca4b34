"""gpuwatch's count of the GPUs CUDA will use, against CUDA's own, under CUDA_VISIBLE_DEVICES.

`gpuwatch.sampling.visible_gpu_count` (what the command line checks `strategy.replicas`
against, before any trainer starts) reads CUDA_VISIBLE_DEVICES the way CUDA does,
without loading CUDA. Here each value is given to a fresh process that asks the CUDA
driver (cuInit, cuDeviceGetCount: what TensorFlow's device discovery calls) how many
devices it sees; the two counts must agree for every value.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuwatch.sampling import visible_gpu_count

pytestmark = pytest.mark.gpu

DRIVER_COUNT = r"""
import ctypes, sys
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    print("nolib", exc)
    sys.exit(0)
rc = cuda.cuInit(0)
count = ctypes.c_int(0)
if rc == 0:
    rc = cuda.cuDeviceGetCount(ctypes.byref(count))
print(count.value if rc == 0 else 0, rc)
"""


def cuda_driver_count(visible: str | None) -> tuple[int, int]:
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    out = subprocess.run([sys.executable, "-c", DRIVER_COUNT], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    if out[0] == "nolib":
        pytest.skip("the CUDA driver library (libcuda.so.1) cannot be loaded")
    return int(out[0]), int(out[1])


def test_visible_gpu_count_agrees_with_the_cuda_driver(
    nvidia_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        raw = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
               for i in range(count)]
        uuids = [u.decode() if isinstance(u, bytes) else str(u) for u in raw]  # older: bytes
    finally:
        pynvml.nvmlShutdown()
    first = uuids[0]
    bare = first.removeprefix("GPU-")
    values: list[str | None] = [
        None, "", "0", "-1", "-0", "+0", "00", " 0", "0 ", "0 ,0", "0x0", "²", str(count),
        f"0,{count}", f"{count},0", "0,0", "0,", ",0", "0,-1,0", "0,nonsense", "nonsense,0",
        "nonsense",
        first, first.lower(), first[:8], first[:5], "GPU-", "GPU", bare, bare[:4],
        f"{first},0", f"0,{first}", f"{first},{first}", f"{first[:8]},{first}",
        f"{first},{count}", f"{first},nonsense", "GPU-ffffffff", f"GPU-ffffffff,{first}",
        "MIG-0", "MIG-", "MIG", "MIG-nonsense", f"MIG-{first}", "0,MIG-0", "MIG-0,0",
        f"MIG-0,{first}", f" {first}", f"{first} ", f"{first[:8]} ,0", f"\t{first[:8]}",
        f"0,{first[:8]},{first}", f"{first},0,0", f"0,MIG-{bare[:4]},{first}",
        "4294967296", "-4294967296", "9223372036854775808", "0" * 5000, "0," + "9" * 5000,
        f"0,{first[:8]},0", f"{first},0,{first}", "18446744073709551616", "4294967297",
        "-4294967295", "4294967296,0", "2147483648",
    ]
    if count > 1:
        values += ["1", "1,0", "0,1", f"{uuids[1]},{first}", "0,1,0"]
    rows = []
    for visible in values:
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        ours = visible_gpu_count()
        theirs, code = cuda_driver_count(visible)
        rows.append((visible, ours, theirs, code))
    print(f"\n{count} GPU(s); CUDA_VISIBLE_DEVICES -> gpuwatch, CUDA driver (its return code)")
    for visible, ours, theirs, code in rows:
        mark = "" if ours == theirs else "   <-- differs"
        shown = visible
        if visible is not None and len(visible) > 60:
            shown = f"{visible[:20]}... ({len(visible)} characters)"
        print(f"  {shown!r:>48}: {ours} {theirs} ({code}){mark}")
    assert [r for r in rows if r[1] != r[2]] == []
