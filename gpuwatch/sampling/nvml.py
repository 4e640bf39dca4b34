"""NVML calls, each degraded on its own; the reasons a reading is missing; counting the GPUs.

Only gpuwatch.sampling talks to NVML (the ``pynvml`` module of nvidia-ml-py, or a fake
with the same names): this module, throughput.py and gpu.py. Rules they keep, learnt from
nvitop and NVML's docs:

- Each reading is fetched on its own; NotSupported / NoPermission / an unknown
  error makes *that* reading None and never loses the sample. NotSupported and
  NoPermission do not change while the process lives, so they are remembered
  and the call is not repeated every 0.5 s.
- NVML_ERROR_GPU_IS_LOST from any call marks the GPU lost for good (a GPU that
  fell off the bus needs a reset, which also invalidates the handle); the other
  GPUs carry on.
- On a MIG-enabled GPU whole-device utilization is not available: None, not 0.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Field ids (nvml.h); read from the module when it has them, these are the values.
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_DATA_TX_KIB = 138
FI_NVLINK_DATA_RX_KIB = 139
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198

NOT_SUPPORTED = "not supported"
NO_PERMISSION = "no permission"
GPU_LOST = "GPU is lost"
FIRST_SAMPLE = "rate needs a second sample"
NOT_UPDATED = "counter not updated yet"
WINDOW_PENDING = "PCIe window reading not finished yet"
# Reasons that mean "supported, just no figure yet" (doctor counts these as supported).
PENDING_REASONS = frozenset({FIRST_SAMPLE, NOT_UPDATED, WINDOW_PENDING})


class GpuLostError(Exception):
    """Raised inside a read when NVML says NVML_ERROR_GPU_IS_LOST."""


def nvml_code(nvml: Any, name: str, default: int) -> int:
    value = getattr(nvml, name, default)
    return value if isinstance(value, int) else default


def error_code(exc: BaseException) -> int | None:
    """The NVML error code of an exception raised by pynvml (or the fake)."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def describe_init_failure(nvml: Any, exc: BaseException) -> str:
    """A plain sentence for why nvmlInit failed, for the sample's ``nvml`` field."""
    code = error_code(exc)
    if code == nvml_code(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"
    if code == nvml_code(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "NVIDIA driver not loaded: NVML cannot reach any GPU"
    if code == nvml_code(nvml, "NVML_ERROR_NO_PERMISSION", 4):
        return "no permission to open the NVIDIA devices (/dev/nvidia*)"
    if code == nvml_code(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18):
        return "NVML library and kernel driver versions differ (driver updated, reboot needed)"
    return f"NVML failed to start: {exc}"


def visible_gpu_count(nvml: Any | None = None) -> int:
    """The NVIDIA GPUs CUDA will use: NVML's devices, narrowed by CUDA_VISIBLE_DEVICES as
    CUDA reads it (``cuda_visible_count``). Any NVML failure (no nvidia-ml-py, no
    library, no driver) counts as 0.

    ``nvml`` injects a fake pynvml module in tests; by default ``import pynvml``, lazily,
    so a box without the driver never pays for it.
    """
    if nvml is None:
        try:
            import pynvml as nvml_module
        except ImportError:
            return 0
        nvml = nvml_module
    try:
        nvml.nvmlInit()
    except Exception:
        return 0
    try:
        count = int(nvml.nvmlDeviceGetCount())
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return count
        return cuda_visible_count(visible, count, lambda: [_uuid(nvml, i) for i in range(count)])
    except Exception:
        return 0
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


# An index entry as CUDA reads it (strtoull, base 10): C whitespace, a sign, ASCII digits;
# whatever follows the digits is ignored ("0x0" and "0a90..." are device 0).
_CUDA_INDEX = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_CUDA_UUID_FORMS = ("GPU-", "MIG-")


def cuda_visible_count(visible: str, count: int, uuids: Callable[[], list[str]]) -> int:
    """How many of ``count`` devices CUDA makes visible under CUDA_VISIBLE_DEVICES=``visible``.

    As the CUDA driver answered it (cuDeviceGetCount) on H100s with driver 580.159.04
    (docs/gpu-validation.md). Entries are read left to right up to the first one that
    names no device: an empty entry, a word, an index out of range, a UUID prefix that
    matches none or several, or an entry of the other form than the list's first (a list
    of indices ends at a UUID, a list of UUIDs at an index). An index is read as strtoull
    reads it (leading whitespace, a sign, digits, anything after them ignored), and its
    low 32 bits are the device ("4294967296" is device 0). A UUID entry is "GPU-" or
    "MIG-" as written, with nothing before it, then a prefix of the device UUID's hex
    part, or the whole of it followed by anything. A device named twice among the
    entries read makes CUDA refuse the whole list: 0 devices. ``uuids`` gives NVML's
    device UUIDs ("GPU-..."), asked only when an entry needs them.
    """
    hexes: list[str] | None = None  # the devices' UUIDs without "GPU-", once needed
    chosen: set[int] = set()
    list_form: str | None = None
    for entry in visible.split(","):
        index: int | None = None
        form = "uuid" if entry.startswith(_CUDA_UUID_FORMS) else "index"
        list_form = list_form or form
        if form != list_form:
            break
        if form == "index":
            number = _CUDA_INDEX.match(entry)
            if number is not None:
                index = _index_in_range(number.group(1), count)
        else:
            named = entry[4:]
            if named:
                if hexes is None:
                    hexes = [uuid.partition("-")[2] for uuid in uuids()]
                matches = [i for i, hex_part in enumerate(hexes)
                           if hex_part.startswith(named) or named.startswith(hex_part)]
                index = matches[0] if len(matches) == 1 else None
        if index is None:
            break
        if index in chosen:
            return 0  # CUDA_ERROR_INVALID_DEVICE: the list names a device twice
        chosen.add(index)
    return len(chosen)


_ULLONG = 2**64


def _index_in_range(number: str, count: int) -> int | None:
    """A signed run of ASCII digits as CUDA takes it (strtoull, then the low 32 bits), as
    a device index below ``count``, or None. Never converts more digits than 2**64 has
    (Python refuses over 4,300)."""
    digits = number.lstrip("+-").lstrip("0") or "0"
    magnitude = int(digits) if len(digits) <= 20 else _ULLONG
    if magnitude >= _ULLONG:
        value = _ULLONG - 1  # strtoull saturates, whatever the sign
    else:
        value = (-magnitude) % _ULLONG if number.startswith("-") else magnitude
    low = value % 2**32
    return low if low < count else None


def _uuid(nvml: Any, index: int) -> str:
    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


_VALUE_MEMBER_AND_WIDTH: dict[str, tuple[str, int | None]] = {
    "NVML_VALUE_TYPE_DOUBLE": ("dVal", None),
    "NVML_VALUE_TYPE_UNSIGNED_INT": ("uiVal", 32),
    # c_ulong: 64 bits on Linux (LP64), 32 on Windows.
    "NVML_VALUE_TYPE_UNSIGNED_LONG": ("ulVal", ctypes.sizeof(ctypes.c_ulong) * 8),
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": ("ullVal", 64),
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": ("sllVal", 63),
    "NVML_VALUE_TYPE_SIGNED_INT": ("siVal", 31),
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": ("usVal", 16),
}
_VALUE_TYPE_DEFAULTS = {
    "NVML_VALUE_TYPE_DOUBLE": 0,
    "NVML_VALUE_TYPE_UNSIGNED_INT": 1,
    "NVML_VALUE_TYPE_UNSIGNED_LONG": 2,
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": 3,
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": 4,
    "NVML_VALUE_TYPE_SIGNED_INT": 5,
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": 6,
}


def field_value(nvml: Any, fv: Any) -> tuple[float | int, int | None]:
    """(value, counter width in bits or None for a double) of one nvmlFieldValue_t."""
    value_type = int(fv.valueType)
    for name, (member, width) in _VALUE_MEMBER_AND_WIDTH.items():
        if value_type == nvml_code(nvml, name, _VALUE_TYPE_DEFAULTS[name]):
            return getattr(fv.value, member), width
    raise ValueError(f"unknown NVML value type {value_type}")


@dataclass(frozen=True, slots=True)
class CounterRead:
    value: int
    width_bits: int
    nvml_us: int  # NVML's own timestamp of the read (microseconds), 0 if none
    clock_s: float  # our clock when we read it, used when NVML gives no timestamp


def reason_of(nvml: Any, exc: BaseException) -> str:
    code = error_code(exc)
    if code == nvml_code(nvml, "NVML_ERROR_NOT_SUPPORTED", 3):
        return NOT_SUPPORTED
    if code == nvml_code(nvml, "NVML_ERROR_NO_PERMISSION", 4):
        return NO_PERMISSION
    if code == nvml_code(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
        return "not in this driver's NVML"
    if code == nvml_code(nvml, "NVML_ERROR_GPU_IS_LOST", 15):
        return GPU_LOST
    return f"error: {exc}"


class NvmlCalls:
    """One GPU's NVML calls, each degraded on its own: None with a reason, never an error.

    ``reasons`` says why readings are missing from the sample being read (the
    reader starts a fresh dict per sample); ``sticky`` keeps the reasons that
    will not change while the process lives, so those calls are not repeated.
    NVML_ERROR_GPU_IS_LOST raises GpuLostError for the reader to catch.
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.sticky: dict[str, str] = {}
        self.reasons: dict[str, str] = {}
        self.lost_code = nvml_code(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        self._sticky_codes = {
            nvml_code(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
            nvml_code(nvml, "NVML_ERROR_NO_PERMISSION", 4),
            nvml_code(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
        }
        self._success = nvml_code(nvml, "NVML_SUCCESS", 0)

    def call(self, reading: str, function: str, *args: Any, **kwargs: Any) -> Any:
        """One NVML call for one reading; None (with a reason) instead of an error."""
        if reading in self.sticky:
            self.reasons[reading] = self.sticky[reading]
            return None
        try:
            fn = getattr(self.nvml, function)
        except AttributeError:
            self.sticky[reading] = self.reasons[reading] = "not in this nvidia-ml-py"
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # any failure degrades this reading only
            code = error_code(exc)
            if code == self.lost_code:
                raise GpuLostError from exc
            reason = reason_of(self.nvml, exc)
            if code in self._sticky_codes:
                self.sticky[reading] = reason
            self.reasons[reading] = reason
            return None

    def counter_read(self, fv: Any, now: float) -> CounterRead | str:
        """One nvmlFieldValue_t as a counter read, or why it is not one."""
        ret = int(fv.nvmlReturn)
        if ret == self.lost_code:
            raise GpuLostError
        if ret != self._success:
            code_reason = {
                nvml_code(self.nvml, "NVML_ERROR_NOT_SUPPORTED", 3): NOT_SUPPORTED,
                nvml_code(self.nvml, "NVML_ERROR_NO_PERMISSION", 4): NO_PERMISSION,
            }
            return code_reason.get(ret, f"error: NVML return code {ret}")
        value, width = field_value(self.nvml, fv)
        if width is None:
            return "counter is not an integer"
        return CounterRead(int(value), width, int(fv.timestamp), now)
