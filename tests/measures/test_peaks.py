"""Dense peaks by NVML product name and precision; achieved TFLOP/s and MFU from them."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch.measures import peaks
from trainer_runtime.protocol import GpuProcess, GpuSample


@pytest.mark.parametrize(
    ("nvml_name", "precision", "tflops"),
    [
        # Datasheet figures marked "with sparsity", halved for dense.
        ("NVIDIA H100 80GB HBM3", "float32", 989 / 2),
        ("NVIDIA H100 80GB HBM3", "bfloat16", 1979 / 2),
        ("NVIDIA H100 PCIe", "float16", 1513 / 2),
        ("NVIDIA H100 NVL", "bfloat16", 1671 / 2),
        ("NVIDIA H200", "bfloat16", 1979 / 2),
        ("NVIDIA H200 NVL", "float32", 835 / 2),
        ("NVIDIA L4", "float16", 242 / 2),
        # Datasheet figures printed dense.
        ("NVIDIA A100-SXM4-80GB", "float32", 156),
        ("NVIDIA A100-SXM4-40GB", "bfloat16", 312),
        ("NVIDIA A100-PCIE-40GB", "float16", 312),
        ("NVIDIA A100 80GB PCIe", "float16", 312),
        ("NVIDIA A10", "float16", 125),
        ("NVIDIA GeForce RTX 4090", "float16", 165.2),
        ("NVIDIA GeForce RTX 4090", "float32", 82.6),
        ("Tesla V100-SXM2-16GB", "float32", 15.7),  # no TF32 on Volta: plain FP32
        ("Tesla V100-SXM2-32GB", "float16", 125),
        ("Tesla V100-PCIE-16GB", "float16", 112),
        ("Tesla V100S-PCIE-32GB", "float16", 130),
        ("Tesla T4", "float16", 65),
    ],
)
def test_a_known_gpu_has_its_published_dense_peak(nvml_name: str, precision: str,
                                                  tflops: float) -> None:
    assert peaks.peak_tflops([nvml_name], precision) == pytest.approx(tflops)


@pytest.mark.parametrize(
    "nvml_name",
    [
        "NVIDIA A10G",  # not an A10: no NVIDIA datasheet, not in the table
        "NVIDIA GH200 480GB",  # not an H200
        "NVIDIA GeForce RTX 4090 D",  # not a 4090
        "NVIDIA L40",  # not an L40S
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a slice: a fraction of the peak
        "Tesla V100-FHHL-16GB",  # another clock than the datasheet's boards
        "NVIDIA GeForce GTX 1080",
        "",
    ],
)
def test_an_unknown_gpu_has_no_peak(nvml_name: str) -> None:
    assert peaks.find_peak(nvml_name) is None
    assert peaks.peak_tflops([nvml_name], "float32") is None
    assert peaks.mfu_pct(1e9, 1e3, [nvml_name], "float32") is None


def test_a_cpu_run_has_no_peak_but_an_achieved_figure() -> None:
    assert peaks.peak_tflops([], "float32") is None
    assert peaks.mfu_pct(2e6, 5e5, [], "float32") is None
    assert peaks.achieved_tflops(2e6, 5e5) == pytest.approx(1.0)  # 2e6 * 5e5 / 1e12


def test_a_precision_without_tensor_cores_has_no_peak() -> None:
    assert peaks.peak_tflops(["Tesla V100-SXM2-16GB"], "bfloat16") is None
    assert peaks.peak_tflops(["Tesla T4"], "bfloat16") is None
    assert peaks.peak_tflops(["NVIDIA H100 80GB HBM3"], "float64") is None


def test_several_gpus_sum_their_peaks_and_one_unknown_gives_none() -> None:
    eight = ["NVIDIA H100 80GB HBM3"] * 8
    assert peaks.peak_tflops(eight, "bfloat16") == pytest.approx(8 * 1979 / 2)
    mixed = ["NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"]
    assert peaks.peak_tflops(mixed, "float32") == pytest.approx(156 + 156)
    # A partial sum would overstate MFU.
    assert peaks.peak_tflops(["NVIDIA A100-SXM4-80GB", "NVIDIA A10G"], "float32") is None
    assert peaks.peak_tflops(["NVIDIA A100-SXM4-80GB", None], "float32") is None


def test_mfu_is_achieved_over_the_summed_peak() -> None:
    # 1e9 FLOPs per example at 1e5 examples/s = 100 TFLOP/s; two A100s in bfloat16
    # peak at 2 x 312 = 624 TFLOP/s: 100 / 624 = 16.03 %.
    assert peaks.achieved_tflops(1e9, 1e5) == pytest.approx(100.0)
    mfu = peaks.mfu_pct(1e9, 1e5, ["NVIDIA A100-SXM4-80GB"] * 2, "bfloat16")
    assert mfu == pytest.approx(100 * 100 / 624)
    assert peaks.mfu_pct(None, 1e5, ["NVIDIA A100-SXM4-80GB"], "bfloat16") is None
    assert peaks.mfu_pct(1e9, None, ["NVIDIA A100-SXM4-80GB"], "bfloat16") is None


@pytest.mark.parametrize(
    ("policy", "precision"),
    [(None, "float32"), ("float32", "float32"), ("mixed_float16", "float16"),
     ("mixed_bfloat16", "bfloat16")],
)
def test_the_precision_is_the_runs_mixed_precision_setting(policy: str | None,
                                                           precision: str) -> None:
    assert peaks.precision_of(policy) == precision
    settings = {"train": {"mixed_precision": policy}} if policy else {"train": {}}
    assert peaks.settings_precision(settings) == precision
    assert peaks.settings_precision({}) == "float32"


def test_every_row_names_its_public_source_and_has_a_float32_figure() -> None:
    for row in peaks.PEAKS:
        assert row.source.startswith("https://"), row.product
        assert row.float32 is not None and row.float32 > 0, row.product
        assert row.float16 is not None and row.float16 >= row.float32, row.product


# ---- the link an all-reduce crosses -------------------------------------------------


def _gpu(**fields: Any) -> GpuSample:
    return GpuSample(**{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": None,
                        "lost": False, "processes": (), "pcie_gen": 5, "pcie_width": 16,
                        "nvlink_links_active": None, "nvlink_version": None, **fields})


def test_nvlink_peak_is_links_times_the_generations_per_link_rate() -> None:
    # An SXM H100: 18 NVLink 4 links, 900 GB/s both ways = 450 GB/s each way.
    gpus = [_gpu(index=i, nvlink_links_active=18, nvlink_version=4) for i in range(8)]
    peak = peaks.link_peak(gpus)
    assert peak == peaks.LinkPeak("NVLink", 450e9)
    # An A100 SXM: 12 NVLink 3 links, 600 GB/s both ways.
    assert peaks.link_peak([_gpu(nvlink_links_active=12, nvlink_version=3)]) == peaks.LinkPeak(
        "NVLink", 300e9)


def test_pcie_peak_is_generation_times_width_and_the_slowest_gpu_bounds_the_ring() -> None:
    # Gen4 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s each way.
    gen4 = 16e9 / 8 * 128 / 130 * 16
    assert peaks.link_peak([_gpu(pcie_gen=4)]) == peaks.LinkPeak("PCIe", pytest.approx(gen4))
    slow = [_gpu(index=0, pcie_gen=4), _gpu(index=1, pcie_gen=4, pcie_width=8)]
    assert peaks.link_peak(slow) == peaks.LinkPeak("PCIe", pytest.approx(gen4 / 2))
    # One GPU without NVLink: the ring crosses PCIe, so every GPU's PCIe link counts.
    mixed = [_gpu(index=0, nvlink_links_active=18, nvlink_version=4, pcie_gen=5),
             _gpu(index=1, pcie_gen=4)]
    assert peaks.link_peak(mixed) == peaks.LinkPeak("PCIe", pytest.approx(gen4))


def test_the_runs_own_gpus_are_the_ones_measured() -> None:
    run = GpuProcess(pid=7, used_bytes=1, in_run=True)
    gpus = [_gpu(index=0, pcie_gen=3, processes=()),
            _gpu(index=1, pcie_gen=5, processes=(run,)),
            _gpu(index=2, pcie_gen=5, processes=(run,))]
    assert peaks.link_peak(gpus) == peaks.LinkPeak("PCIe", pytest.approx(32e9 / 8 * 128 / 130 * 16))


@pytest.mark.parametrize("gpus,workers", [
    ([], 1),  # no GPU: the achieved figure alone
    (None, 1),
    ([_gpu(pcie_gen=None)], 1),  # a link NVML does not tell
    ([_gpu(nvlink_links_active=4, nvlink_version=9, pcie_gen=None)], 1),  # unknown generation
    ([_gpu(nvlink_links_active=18, nvlink_version=4)], 2),  # across hosts: not NVML's to tell
    ([_gpu(lost=True)], 1),
])
def test_no_peak_where_the_machine_does_not_tell(gpus: object, workers: int) -> None:
    assert peaks.link_peak(gpus, workers) is None  # type: ignore[arg-type]
