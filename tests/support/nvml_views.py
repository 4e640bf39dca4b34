"""Views of an NVML module (the real ``pynvml`` or the fake) that hide one feature.

Test-only. ``CountersHidden`` makes the PCIe byte counters (fields 197/198) read as
not supported, so a ``DeviceSampler`` over it falls back to the 20 ms
``nvmlDeviceGetPcieThroughput`` window read by its worker thread: how the window
path is checked on a GPU whose driver has the counters (tests/gpu,
bench/bench_sampler.py --pcie-window).
"""

from __future__ import annotations

from typing import Any

PCIE_COUNT_TX_BYTES = 197  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
PCIE_COUNT_RX_BYTES = 198  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


class CountersHidden:
    """``nvml`` itself, except that the PCIe byte counters come back not supported."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.hidden = {
            int(getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", PCIE_COUNT_TX_BYTES)),
            int(getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", PCIE_COUNT_RX_BYTES)),
        }
        self._not_supported = int(getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", NOT_SUPPORTED))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)

    def nvmlDeviceGetFieldValues(self, handle: Any, fields: Any) -> Any:
        values = self._nvml.nvmlDeviceGetFieldValues(handle, fields)
        for value in values:
            if int(value.fieldId) in self.hidden:
                value.nvmlReturn = self._not_supported
        return values
