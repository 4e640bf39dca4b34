"""A sampler's reading as the sample frame writes it: the JSON fields host, gpus, nvml."""

from __future__ import annotations

from typing import Any

from gpuwatch.sampling import sample_event
from gpuwatch.sampling.types import DeviceSample
from trainer_runtime.protocol import event_frame


def sample_frame_fields(sample: DeviceSample) -> dict[str, Any]:
    """The fields of the ``sample`` frame the supervisor writes for this reading."""
    frame = event_frame(sample_event(sample))
    return {key: frame[key] for key in ("host", "gpus", "nvml")}
