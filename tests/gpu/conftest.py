"""Fixtures for tests that need a real NVIDIA GPU; each skips with the reason it cannot run.

These tests run on a GPU box that has PyTorch and nvidia-smi but maybe neither
TensorFlow nor Textual: they import only gpuwatch.sampling (nvidia-ml-py and
psutil), torch and the standard library.

    python -m pytest -o addopts= tests/gpu -m gpu -v -rs
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, in case the box runs without the repo's pyproject.
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU with NVML")


def _why_no_gpu() -> str | None:
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py (import pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML cannot start here ({exc}): no NVIDIA driver or GPU"
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
    return None if count > 0 else "NVML works but sees no NVIDIA GPU"


@pytest.fixture(scope="session")
def nvidia_gpu() -> None:
    reason = _why_no_gpu()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def nvidia_smi(nvidia_gpu: None) -> str:
    path = shutil.which("nvidia-smi")
    if path is None:
        pytest.skip("nvidia-smi is not on PATH: needed as the reference reading")
    return path


@pytest.fixture(scope="session")
def torch_cuda(nvidia_gpu: None) -> Any:
    torch = pytest.importorskip("torch", reason="PyTorch is needed to put a known load on the GPU")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch is installed but cannot use CUDA (CPU-only build or driver too old)")
    torch.cuda.init()
    # Create the CUDA context now, so its memory is not mistaken for the test's.
    torch.ones(1, device="cuda:0").sum().item()
    return torch


@pytest.fixture
def sampler(nvidia_gpu: None) -> Iterator[Any]:
    import os

    from gpuwatch.sampling import DeviceSampler

    made = DeviceSampler(run_pids=lambda: {os.getpid()})
    yield made
    made.close()


@pytest.fixture
def window_sampler(nvidia_gpu: None) -> Iterator[Any]:
    """A sampler over the real NVML with the PCIe byte counters hidden: it reads PCIe
    through the 20 ms window in its worker thread, the path of GPUs without them."""
    import os

    import pynvml

    from gpuwatch.sampling import DeviceSampler
    from tests.support.nvml_views import CountersHidden

    made = DeviceSampler(run_pids=lambda: {os.getpid()}, nvml=CountersHidden(pynvml))
    yield made
    made.close()
