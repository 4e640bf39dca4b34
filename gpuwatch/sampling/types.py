"""The immutable readings the sampler hands out: one host, one entry per GPU.

The host's and each GPU's are declared once, in the protocol
(``trainer_runtime/protocol/samples.py``), since a sample event carries them: every
reading is ``float | int | None``; ``None`` means "not available", never zero.
``DeviceSample`` is one call's whole: a time, the host, the GPUs, why there is no NVML.
"""

from __future__ import annotations

from dataclasses import dataclass

# The readings are the protocol's: a sample event carries them as they are.
from trainer_runtime.protocol import GpuSample, HostSample

__all__ = ["DeviceSample"]


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """Everything one call to DeviceSampler.sample() saw."""

    t: float
    host: HostSample
    gpus: tuple[GpuSample, ...]
    # None when NVML works; otherwise a plain sentence saying why there are no GPUs.
    nvml: str | None
