"""Dense peak TFLOP/s by GPU and precision; achieved TFLOP/s and MFU from them.

Pure: no TensorFlow, no Textual, no NVML. Achieved TFLOP/s is the trainer's FLOPs per
example (``trainer_runtime/flops.py``) times examples/s; MFU is that over the peak of
every replica's GPU summed. Rows are keyed by NVML's product name, matched whole after
normalising (lower case; "NVIDIA", "Tesla", "GeForce" dropped; "-" and "_" as spaces), so
"NVIDIA A10G" is not an "A10" nor "GH200" an "H200"; no match, a MIG slice or a CPU gives
no peak (the achieved figure, no percentage). Every figure is the dense peak (no 2:4
sparsity), from the source on its row, in the column of ``train.mixed_precision``:
``float32`` as TensorFlow runs it (TF32 on Ampere and later, plain FP32 before),
``float16`` FP16 tensor cores with FP32 accumulation, ``bfloat16`` BF16 (None without).
The A10G has no NVIDIA datasheet, so no row. No peak has been checked on a real GPU here
(docs/gpu-validation.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatch.sampling.counters import pcie_link_bytes_per_s
from trainer_runtime.protocol import GpuSample

PRECISIONS = ("float32", "float16", "bfloat16")
# train.mixed_precision -> the matmuls' precision (a table column).
_POLICY_PRECISION = {
    "float32": "float32",
    "mixed_float16": "float16",
    "mixed_bfloat16": "bfloat16",
}

_H100_URL = "https://www.nvidia.com/en-us/data-center/h100/"
_H200_URL = "https://www.nvidia.com/en-us/data-center/h200/"
_A100_URL = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
             "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_V100_URL = ("https://images.nvidia.com/content/technologies/volta/pdf/"
             "volta-v100-datasheet-update-us-1165301-r5.pdf")
_ADA_URL = ("https://images.nvidia.com/aem-dam/Solutions/geforce/ada/"
            "nvidia-ada-gpu-architecture.pdf")


@dataclass(frozen=True, slots=True)
class Peak:
    """One GPU's dense peak TFLOP/s per precision (None: no such tensor cores)."""

    product: str  # as its datasheet names it
    pattern: str  # regular expression, matched whole against the normalised NVML name
    float32: float | None
    float16: float | None
    bfloat16: float | None
    source: str  # where the figures are published

    def tflops(self, precision: str) -> float | None:
        if precision not in PRECISIONS:
            return None
        value: float | None = getattr(self, precision)
        return value


PEAKS: tuple[Peak, ...] = (
    # Hopper. Datasheets print sparse figures ("* With sparsity"); dense is half.
    # H100 SXM: TF32 989*, BF16/FP16 1,979*.
    Peak("H100 SXM", r"h100( sxm5?)?( \d+gb)?( hbm3)?", 494.5, 989.5, 989.5, _H100_URL),
    # H100 PCIe: TF32 756*, BF16/FP16 1,513*.
    Peak("H100 PCIe", r"h100( \d+gb)? pcie( \d+gb)?", 378.0, 756.5, 756.5, _H100_URL),
    # H100 NVL: TF32 835*, BF16/FP16 1,671* (per GPU).
    Peak("H100 NVL", r"h100 nvl", 417.5, 835.5, 835.5, _H100_URL),
    # H200 SXM: TF32 989*, BF16/FP16 1,979*.
    Peak("H200 SXM", r"h200( sxm)?( \d+gb)?( hbm3e)?", 494.5, 989.5, 989.5, _H200_URL),
    # H200 NVL: TF32 835*, BF16/FP16 1,671*.
    Peak("H200 NVL", r"h200 nvl", 417.5, 835.5, 835.5, _H200_URL),
    # Ampere. A100 (SXM4 and PCIe, 40 and 80 GB): TF32 156, BF16/FP16 312 (dense printed).
    Peak("A100", r"a100( (sxm4?|pcie|\d+gb))*", 156.0, 312.0, 312.0, _A100_URL),
    # A10: TF32 62.5, BF16/FP16 125 (dense printed beside the sparse).
    Peak("A10", r"a10", 62.5, 125.0, 125.0,
         "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
    # Ada. L4: TF32 120*, BF16/FP16 242*.
    Peak("L4", r"l4", 60.0, 121.0, 121.0, "https://www.nvidia.com/en-us/data-center/l4/"),
    # L40S: TF32 183 (366*), BF16/FP16 362.05 (733*).
    Peak("L40S", r"l40s", 183.0, 362.05, 362.05,
         "https://www.nvidia.com/en-us/data-center/l40s/"),
    # GeForce RTX 4090 (Ada whitepaper, appendix table): TF32 82.6, FP16 and BF16
    # with FP32 accumulate 165.2 (GeForce runs FP32 accumulation at half the FP16 rate).
    Peak("GeForce RTX 4090", r"rtx 4090", 82.6, 165.2, 165.2, _ADA_URL),
    # Volta: no TF32, no BF16. float32 is FP32; float16 is the tensor-core figure.
    Peak("V100 SXM2", r"v100 sxm2( \d+gb)?", 15.7, 125.0, None, _V100_URL),
    Peak("V100 PCIe", r"v100 pcie( \d+gb)?", 14.0, 112.0, None, _V100_URL),
    Peak("V100S PCIe", r"v100s pcie( \d+gb)?", 16.4, 130.0, None, _V100_URL),
    # Turing T4: FP32 8.1, mixed precision (FP16/FP32) 65.
    Peak("T4", r"t4", 8.1, 65.0, None,
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
         "t4-tensor-core-datasheet-951643.pdf"),
)

_COMPILED = tuple((re.compile(p.pattern), p) for p in PEAKS)
_DROPPED_WORDS = {"nvidia", "tesla", "geforce"}


def normalise(gpu_name: str) -> str:
    """An NVML product name as the table matches it: "NVIDIA A100-SXM4-80GB" -> "a100 sxm4 80gb"."""
    words = re.sub(r"[-_]", " ", gpu_name.lower()).split()
    return " ".join(w for w in words if w not in _DROPPED_WORDS)


def find_peak(gpu_name: str | None) -> Peak | None:
    """The table row for an NVML product name, or None (unknown, or a MIG slice)."""
    if not gpu_name:
        return None
    name = normalise(gpu_name)
    if re.search(r"\bmig\b", name):
        return None
    for pattern, peak in _COMPILED:
        if pattern.fullmatch(name):
            return peak
    return None


def precision_of(mixed_precision: Any) -> str:
    """The matmuls' precision for a ``train.mixed_precision`` value (unset: float32)."""
    if mixed_precision is None:
        return "float32"
    return _POLICY_PRECISION.get(str(mixed_precision), str(mixed_precision))


def settings_precision(settings: Mapping[str, Any]) -> str:
    """The matmuls' precision of a run's validated settings (``train.mixed_precision``)."""
    train = settings.get("train")
    return precision_of(train.get("mixed_precision") if isinstance(train, Mapping) else None)


def peak_tflops(gpu_names: Sequence[str | None], precision: str) -> float | None:
    """The summed dense peak of the replicas' GPUs (one name per replica), or None.

    None when there is no GPU (a CPU run), or when any one GPU's peak is not known
    at this precision: a partial sum would overstate the MFU.
    """
    if not gpu_names:
        return None
    total = 0.0
    for name in gpu_names:
        peak = find_peak(name)
        figure = peak.tflops(precision) if peak is not None else None
        if figure is None:
            return None
        total += figure
    return total


def achieved_tflops(flops_per_example: float | None,
                    examples_per_s: float | None) -> float | None:
    """Achieved TFLOP/s: FLOPs per example x examples/s / 1e12 (None if either is unknown)."""
    if flops_per_example is None or examples_per_s is None:
        return None
    if flops_per_example < 0 or examples_per_s < 0:
        return None
    return flops_per_example * examples_per_s / 1e12


def mfu_pct(flops_per_example: float | None, examples_per_s: float | None,
            gpu_names: Sequence[str | None], precision: str) -> float | None:
    """Model FLOPs utilisation in %: achieved over the replicas' summed peak, or None."""
    achieved = achieved_tflops(flops_per_example, examples_per_s)
    peak = peak_tflops(gpu_names, precision)
    if achieved is None or peak is None or peak <= 0:
        return None
    return 100.0 * achieved / peak


# ---- the interconnect's peak, for the all-reduce's bus bandwidth ---------------------
# Per link and per direction, by NVLink generation (nvmlDeviceGetNvLinkVersion), in
# bytes/s: NVIDIA's per-GPU totals (both directions) over the links they count:
# NVLink 1 (P100) 160 GB/s over 4 links; NVLink 2 (V100) 300 GB/s over 6; NVLink 3
# (A100) 600 GB/s over 12; NVLink 4 (H100) 900 GB/s over 18; NVLink 5 (Blackwell)
# 1.8 TB/s over 18. Sources: https://www.nvidia.com/en-us/data-center/nvlink/ and the
# P100 whitepaper (https://images.nvidia.com/content/pdf/tesla/whitepaper/
# pascal-architecture-whitepaper.pdf). Unvalidated against a real GPU here.
NVLINK_LINK_BYTES_PER_S = {1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9}


@dataclass(frozen=True, slots=True)
class LinkPeak:
    """The slowest link among a run's GPUs, per direction: what an all-reduce's bus
    bandwidth (nccl-tests' busbw) is measured against."""

    kind: str  # "NVLink" | "PCIe"
    bytes_per_s: float


def gpu_link_peak(gpu: GpuSample, *, nvlink: bool = True) -> LinkPeak | None:
    """One GPU's link to its peers (a sample's GPU): NVLink where it has active links of a
    known generation (links x per-link rate; not with nvlink False), else its PCIe link
    (generation x width); None when neither is known."""
    links, version = gpu.nvlink_links_active, gpu.nvlink_version
    per_link = NVLINK_LINK_BYTES_PER_S.get(version) if version is not None else None
    if nvlink and links is not None and links > 0 and per_link is not None:
        return LinkPeak("NVLink", links * per_link)
    pcie = pcie_link_bytes_per_s(gpu.pcie_gen, gpu.pcie_width)
    return None if pcie is None else LinkPeak("PCIe", pcie)


def link_peak(gpus: Sequence[GpuSample] | None, workers: int = 1) -> LinkPeak | None:
    """The peak of the link a run's all-reduce crosses, from one host's GPU sample.

    The run's GPUs are those NVML lists a process of the run on (every GPU when it
    lists none). The slowest of their links bounds the ring: all on NVLink gives the
    least NVLink figure, any GPU without it the least PCIe one. None with no GPU, a link
    not known, or a cluster (``workers`` > 1: the network between hosts is not one NVML
    can tell).
    """
    if workers > 1 or not gpus:
        return None
    present = [g for g in gpus if not g.lost]
    in_run = [g for g in present if any(p.in_run for p in g.processes)]
    peaks = [gpu_link_peak(g) for g in (in_run or present)]
    if not peaks or any(p is None for p in peaks):
        return None
    known = [p for p in peaks if p is not None]
    kinds = {p.kind for p in known}
    if kinds == {"NVLink"}:
        return min(known, key=lambda p: p.bytes_per_s)
    pcie = [gpu_link_peak(g, nvlink=False) for g in (in_run or present)]
    slowest = [p for p in pcie if p is not None]
    if len(slowest) != len(pcie):
        return None
    return min(slowest, key=lambda p: p.bytes_per_s)
