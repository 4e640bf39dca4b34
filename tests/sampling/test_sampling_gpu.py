"""DeviceSampler against the fake pynvml: every reading, every degrade path, the counter maths."""

from __future__ import annotations

import inspect
import json
import sys
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.sampling import (
    DeviceSampler,
    cuda_version_text,
    cuda_visible_count,
    sample_event,
    visible_gpu_count,
)
from gpuwatch.sampling.counters import (
    counter_delta,
    counter_rate,
    max_unambiguous_interval_s,
    pcie_link_max_bytes_per_s,
)
from tests.support import fake_nvml as fake_module
from tests.support.fake_nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNKNOWN,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
    NVML_VALUE_TYPE_UNSIGNED_INT,
    FakeGpu,
    FakeNVML,
    fake_h100_box,
)
from tests.support.nvml_views import CountersHidden
from tests.support.sample_frames import sample_frame_fields
from trainer_runtime import protocol

GPU_FIELDS = {
    "index",
    "name",
    "uuid",
    "lost",
    "mig",
    "util_gpu_pct",
    "util_mem_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "pcie_gen",
    "pcie_width",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "processes",
}
HOST_FIELDS = {
    "cpu_pct",
    "per_cpu_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "load_1m",
    "run_cpu_pct",
    "run_rss_bytes",
}


def wait_for(condition: Callable[[], bool], deadline_s: float = 5.0) -> bool:
    """Poll a condition until it holds or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


@pytest.fixture
def make_sampler():
    made: list[DeviceSampler] = []

    def make(nvml: object, **kwargs: object) -> DeviceSampler:
        sampler = DeviceSampler(nvml=nvml, **kwargs)  # type: ignore[arg-type]
        made.append(sampler)
        return sampler

    yield make
    for sampler in made:
        sampler.close()


# -- the fake is faithful to pynvml ---------------------------------------------


def test_fake_constants_and_errors_match_real_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")
    for name, value in vars(fake_module).items():
        if name.startswith("NVML_") or name == "nvmlMemory_v2":
            assert getattr(pynvml, name) == value, name
    for name in fake_module.ERROR_CLASSES:
        assert issubclass(getattr(pynvml, name), pynvml.NVMLError), name
    # NVMLError(code) builds the subclass in both.
    assert type(pynvml.NVMLError(NVML_ERROR_GPU_IS_LOST)).__name__ == "NVMLError_GpuIsLost"
    assert type(fake_module.NVMLError(NVML_ERROR_GPU_IS_LOST)).__name__ == "NVMLError_GpuIsLost"
    assert fake_module.NVMLError(NVML_ERROR_GPU_IS_LOST).value == NVML_ERROR_GPU_IS_LOST


def test_fake_functions_exist_in_real_pynvml_with_compatible_arity() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")
    for name, method in inspect.getmembers(FakeNVML, inspect.isfunction):
        if not name.startswith("nvml"):
            continue
        real = getattr(pynvml, name)
        fake_params = list(inspect.signature(method).parameters)[1:]  # drop self
        real_params = list(inspect.signature(real).parameters)
        assert len(fake_params) == len(real_params), name


# -- readings ---------------------------------------------------------------------


def test_readings_come_through_with_units_converted(make_sampler) -> None:
    gpu = FakeGpu(
        util_gpu=87,
        util_mem=33,
        mem_used=3 * 2**30,
        mem_total=80 * 2**30,
        temperature=61,
        power_mw=312_500,
        power_limit_mw=700_000,
        sm_clock=1755,
        pcie_gen=4,
        pcie_width=8,
    )
    sample = make_sampler(FakeNVML([gpu])).sample()
    assert sample.nvml is None
    (reading,) = sample.gpus
    assert reading.name == "NVIDIA H100 80GB HBM3"
    assert (reading.util_gpu_pct, reading.util_mem_pct) == (87.0, 33.0)
    # v2 memory info: driver-reserved memory is not "used", as in nvidia-smi.
    assert (reading.mem_used_bytes, reading.mem_total_bytes) == (3 * 2**30, 80 * 2**30)
    assert reading.temperature_c == 61.0
    assert (reading.power_w, reading.power_limit_w) == (312.5, 700.0)
    assert reading.sm_clock_mhz == 1755
    assert (reading.pcie_gen, reading.pcie_width) == (4, 8)
    assert not reading.lost and not reading.mig


def test_memory_falls_back_to_v1_when_v2_is_missing(make_sampler) -> None:
    class OldDriver(FakeNVML):
        def nvmlDeviceGetMemoryInfo(self, handle, version=None):  # type: ignore[no-untyped-def]
            if version is not None:
                raise fake_module.NVMLError(fake_module.NVML_ERROR_FUNCTION_NOT_FOUND)
            return super().nvmlDeviceGetMemoryInfo(handle)

    gpu = FakeGpu(mem_used=2**30, mem_reserved=2**28)
    sampler = make_sampler(OldDriver([gpu]))
    for _ in range(2):
        reading = sampler.sample().gpus[0]
        assert reading.mem_used_bytes == 2**30 + 2**28  # v1 includes reserved


def test_frame_fields_have_the_agreed_names_and_encode_as_a_frame(make_sampler) -> None:
    nvml = fake_h100_box(2)
    nvml.gpus[0].processes = [(4242, 2**30)]
    sampler = make_sampler(nvml, run_pids=lambda: {4242})
    sampler.sample()
    nvml.advance(0.5)
    fields = sample_frame_fields(sampler.sample())
    assert set(fields) == {"host", "gpus", "nvml"}
    assert set(fields["host"]) >= HOST_FIELDS
    assert len(fields["gpus"]) == 2
    for gpu in fields["gpus"]:
        assert set(gpu) >= GPU_FIELDS
    assert fields["gpus"][0]["processes"] == [{"pid": 4242, "used_bytes": 2**30, "in_run": True}]
    frame = protocol.decode(protocol.encode("sample", **fields))
    assert frame["gpus"][1]["name"] == "NVIDIA H100 80GB HBM3"
    json.dumps(fields, allow_nan=False)


def test_processes_are_marked_in_run_by_host_pid(make_sampler) -> None:
    gpu = FakeGpu(processes=[(100, 5 * 2**20), (200, None)], graphics_processes=[(300, 1)])
    sampler = make_sampler(FakeNVML([gpu]), run_pids=lambda: {100, 300})
    procs = {p.pid: p for p in sampler.sample().gpus[0].processes}
    assert procs[100].in_run and procs[300].in_run and not procs[200].in_run
    assert procs[100].used_bytes == 5 * 2**20
    assert procs[200].used_bytes is None  # NVML could not say (e.g. WDDM): n/a, not 0


def test_a_failing_run_pids_callback_does_not_break_the_sample(make_sampler) -> None:
    def broken() -> set[int]:
        raise RuntimeError("process tree walk failed")

    gpu = FakeGpu(processes=[(100, 1)])
    sample = make_sampler(FakeNVML([gpu]), run_pids=broken).sample()
    assert sample.gpus[0].processes[0].in_run is False
    assert sample.host.run_cpu_pct is None


# -- PCIe and NVLink counters --------------------------------------------------------


def test_pcie_counters_are_differenced_over_nvml_timestamps(make_sampler) -> None:
    gpu = FakeGpu(pcie_tx_bytes=10**12, pcie_rx_bytes=5 * 10**11)
    nvml = FakeNVML([gpu])
    sampler = make_sampler(nvml)
    first = sampler.sample().gpus[0]
    assert first.pcie_tx_bytes_per_s is None and first.pcie_rx_bytes_per_s is None
    assert first.pcie_source == "counter"
    gpu.pcie_tx_bytes += 3 * 10**9
    gpu.pcie_rx_bytes += 10**9
    nvml.advance(0.5)
    second = sampler.sample().gpus[0]
    assert second.pcie_tx_bytes_per_s == pytest.approx(6e9)
    assert second.pcie_rx_bytes_per_s == pytest.approx(2e9)
    assert nvml.window_calls == 0  # the blocking window was never used


def test_narrow_pcie_counter_wrap_is_added_back(make_sampler) -> None:
    # A 32-bit counter on a slow link (gen1 x4, 1 GB/s) cannot wrap twice in a
    # second, so it is differenced modulo 2**32.
    gpu = FakeGpu(
        pcie_counter_type=NVML_VALUE_TYPE_UNSIGNED_INT,
        pcie_max_gen=1,
        pcie_max_width=4,
        pcie_tx_bytes=2**32 - 1000,
    )
    nvml = FakeNVML([gpu])
    sampler = make_sampler(nvml)
    assert sampler.sample().gpus[0].pcie_source == "counter"
    gpu.pcie_tx_bytes += 5000  # the fake reports it modulo 2**32: reads 4000
    nvml.advance(0.5)
    assert sampler.sample().gpus[0].pcie_tx_bytes_per_s == pytest.approx(10_000)


def test_narrow_pcie_counter_on_a_fast_link_uses_the_window_instead(make_sampler) -> None:
    # 32 bits on gen5 x16 wrap in ~68 ms: unusable at 2 Hz, so the window worker reads it.
    # A real H100 80GB HBM3 answers fields 197/198 so (valueType 1, unsigned int) with
    # driver 580.159.04 (docs/gpu-validation.md).
    gpu = FakeGpu(pcie_counter_type=NVML_VALUE_TYPE_UNSIGNED_INT, pcie_window_tx_kbps=1000)
    nvml = FakeNVML([gpu])
    sampler = make_sampler(nvml)
    assert sampler.sample().gpus[0].pcie_source == "window"
    assert wait_for(lambda: sampler.sample().gpus[0].pcie_tx_bytes_per_s == 1000 * 1024)


def test_counters_hidden_view_sends_the_sampler_to_the_window(make_sampler) -> None:
    # tests/gpu checks the window path on a GPU whose driver has the counters through
    # this view; here, that the view does hide them and nothing else.
    gpu = FakeGpu(pcie_window_tx_kbps=1000, pcie_window_rx_kbps=3000,
                  pcie_tx_bytes=10**12, nvlink_active=[True, True])
    nvml = FakeNVML([gpu])
    sampler = make_sampler(CountersHidden(nvml))
    first = sampler.sample().gpus[0]
    assert first.pcie_source == "window" and first.nvlink_links_active == 2
    assert wait_for(lambda: sampler.sample().gpus[0].pcie_rx_bytes_per_s == 3000 * 1024)
    assert sampler.sample().gpus[0].pcie_tx_bytes_per_s == 1000 * 1024
    assert nvml.window_calls > 0


def test_wide_counter_going_backwards_is_a_reset_not_a_rate(make_sampler) -> None:
    gpu = FakeGpu(pcie_tx_bytes=10**12)
    nvml = FakeNVML([gpu])
    sampler = make_sampler(nvml)
    sampler.sample()
    gpu.pcie_tx_bytes = 1000  # GPU reset / driver reload
    nvml.advance(0.5)
    reset = sampler.sample().gpus[0]
    assert reset.pcie_tx_bytes_per_s is None
    assert "reset" in dict(reset.unavailable)["pcie_tx_bytes_per_s"]
    gpu.pcie_tx_bytes += 500
    nvml.advance(0.5)
    assert sampler.sample().gpus[0].pcie_tx_bytes_per_s == pytest.approx(1000)


def test_nvlink_rates_sum_the_active_links_in_kib(make_sampler) -> None:
    gpu = FakeGpu(
        nvlink_active=[True, False, True],
        nvlink_tx_kib=[0, 0, 0],
        nvlink_rx_kib=[0, 0, 0],
    )
    nvml = FakeNVML([gpu])
    sampler = make_sampler(nvml)
    first = sampler.sample().gpus[0]
    assert first.nvlink_links_active == 2
    assert first.nvlink_tx_bytes_per_s is None
    gpu.nvlink_tx_kib = [1000, 7777, 3000]  # link 1 is down: its counter is ignored
    gpu.nvlink_rx_kib = [10, 0, 0]
    nvml.advance(2.0)
    second = sampler.sample().gpus[0]
    assert second.nvlink_tx_bytes_per_s == pytest.approx(4000 * 1024 / 2.0)
    assert second.nvlink_rx_bytes_per_s == pytest.approx(10 * 1024 / 2.0)


def test_no_nvlink_is_none_not_zero(make_sampler) -> None:
    nvml = FakeNVML([FakeGpu()])  # no links: field 91 not supported
    sampler = make_sampler(nvml)
    sampler.sample()
    nvml.advance(0.5)
    reading = sampler.sample().gpus[0]
    assert reading.nvlink_tx_bytes_per_s is None and reading.nvlink_rx_bytes_per_s is None
    assert reading.nvlink_links_active is None


def test_nvlink_field_not_supported_degrades_only_nvlink(make_sampler) -> None:
    gpu = FakeGpu(
        nvlink_active=[True],
        nvlink_tx_kib=[0],
        nvlink_rx_kib=[0],
        field_errors={NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: NVML_ERROR_NOT_SUPPORTED},
    )
    nvml = FakeNVML([gpu])
    sampler = make_sampler(nvml)
    sampler.sample()
    gpu.pcie_tx_bytes += 100
    nvml.advance(1.0)
    reading = sampler.sample().gpus[0]
    assert reading.nvlink_tx_bytes_per_s is None
    assert dict(reading.unavailable)["nvlink_tx_bytes_per_s"] == "not supported"
    assert reading.nvlink_rx_bytes_per_s == 0.0
    assert reading.pcie_tx_bytes_per_s == pytest.approx(100)


def test_window_fallback_never_makes_the_caller_wait(make_sampler) -> None:
    gate = threading.Event()  # the "20 ms" window stays open until the test says so
    gpus = [
        FakeGpu(
            field_errors={
                NVML_FI_DEV_PCIE_COUNT_TX_BYTES: NVML_ERROR_NOT_SUPPORTED,
                NVML_FI_DEV_PCIE_COUNT_RX_BYTES: NVML_ERROR_NOT_SUPPORTED,
            },
            pcie_window_tx_kbps=2000 + index,
            pcie_window_rx_kbps=500,
        )
        for index in range(8)
    ]
    nvml = FakeNVML(gpus, window_gate=gate)
    sampler = make_sampler(nvml)
    results = []
    caller = threading.Thread(target=lambda: results.extend([sampler.sample(), sampler.sample()]))
    caller.start()
    # The worker is stuck inside the window, and the caller still gets its samples.
    assert wait_for(lambda: nvml.window_calls >= 1)
    caller.join(timeout=5.0)
    assert not caller.is_alive(), "sample() waited on the PCIe window"
    for reading in results[1].gpus:
        assert reading.pcie_source == "window"
        assert reading.pcie_tx_bytes_per_s is None
        assert "not finished" in dict(reading.unavailable)["pcie_tx_bytes_per_s"]
    gate.set()
    assert wait_for(lambda: sampler.sample().gpus[7].pcie_tx_bytes_per_s is not None)
    assert wait_for(lambda: sampler.sample().gpus[0].pcie_tx_bytes_per_s == 2000 * 1024)
    last = sampler.sample().gpus
    assert last[7].pcie_tx_bytes_per_s == 2007 * 1024
    assert last[7].pcie_rx_bytes_per_s == 500 * 1024


def test_stale_window_reading_is_none(make_sampler) -> None:
    now = [0.0]
    gpu = FakeGpu(
        field_errors={NVML_FI_DEV_PCIE_COUNT_TX_BYTES: NVML_ERROR_NOT_SUPPORTED},
        pcie_window_tx_kbps=7,
    )
    nvml = FakeNVML([gpu])
    sampler = make_sampler(nvml, clock=lambda: now[0], window_max_age_s=5.0)
    assert wait_for(lambda: sampler.sample().gpus[0].pcie_tx_bytes_per_s == 7 * 1024)
    # Stop the worker finishing new passes, then let our clock run past the max age.
    gpu.errors["nvmlDeviceGetPcieThroughput"] = NVML_ERROR_UNKNOWN
    sampler._poller.close()  # type: ignore[union-attr]
    now[0] += 10.0
    stale = sampler.sample().gpus[0]
    assert stale.pcie_tx_bytes_per_s is None
    assert "stale" in dict(stale.unavailable)["pcie_tx_bytes_per_s"]


# -- degrade paths -------------------------------------------------------------------


def test_not_supported_degrades_one_field_and_is_not_asked_again(make_sampler) -> None:
    gpu = FakeGpu(errors={"nvmlDeviceGetPowerUsage": NVML_ERROR_NOT_SUPPORTED})
    nvml = FakeNVML([gpu])
    sampler = make_sampler(nvml)
    for _ in range(3):
        reading = sampler.sample().gpus[0]
        assert reading.power_w is None
        assert dict(reading.unavailable)["power_w"] == "not supported"
        assert reading.power_limit_w == 700.0 and reading.util_gpu_pct == 50.0
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 1


def test_no_permission_degrades_processes_only(make_sampler) -> None:
    gpu = FakeGpu(
        processes=[(1, 1)],
        errors={
            "nvmlDeviceGetComputeRunningProcesses": NVML_ERROR_NO_PERMISSION,
            "nvmlDeviceGetGraphicsRunningProcesses": NVML_ERROR_NO_PERMISSION,
        },
    )
    reading = make_sampler(FakeNVML([gpu])).sample().gpus[0]
    assert reading.processes == ()
    assert dict(reading.unavailable)["processes"] == "no permission"
    assert reading.mem_used_bytes == gpu.mem_used and reading.temperature_c == 45.0


def test_unknown_error_is_none_for_that_sample_and_retried(make_sampler) -> None:
    gpu = FakeGpu(errors={"nvmlDeviceGetTemperature": NVML_ERROR_UNKNOWN})
    nvml = FakeNVML([gpu])
    sampler = make_sampler(nvml)
    failed = sampler.sample().gpus[0]
    assert failed.temperature_c is None
    assert dict(failed.unavailable)["temperature_c"].startswith("error:")
    assert failed.util_gpu_pct == 50.0
    del gpu.errors["nvmlDeviceGetTemperature"]
    assert sampler.sample().gpus[0].temperature_c == 45.0


def test_a_non_nvml_exception_degrades_the_field_too(make_sampler) -> None:
    class Broken(FakeNVML):
        def nvmlDeviceGetClockInfo(self, handle, clock_type):  # type: ignore[no-untyped-def]
            raise OSError("ctypes went wrong")

    reading = make_sampler(Broken([FakeGpu()])).sample().gpus[0]
    assert reading.sm_clock_mhz is None
    assert reading.power_w == 250.0


def test_mig_gpu_reports_utilization_as_na_not_zero(make_sampler) -> None:
    nvml = FakeNVML([FakeGpu(mig=True), FakeGpu()])
    sample = make_sampler(nvml).sample()
    mig, plain = sample.gpus
    assert mig.mig is True
    assert mig.util_gpu_pct is None and mig.util_mem_pct is None
    assert "MIG" in dict(mig.unavailable)["util_gpu_pct"]
    assert mig.mem_used_bytes is not None and mig.temperature_c == 45.0
    assert plain.mig is False and plain.util_gpu_pct == 50.0
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 1  # only the non-MIG GPU was asked
    fields = sample_frame_fields(sample)["gpus"][0]
    assert fields["util_gpu_pct"] is None and fields["mig"] is True


def test_gpu_lost_mid_run_marks_that_gpu_and_keeps_the_others(make_sampler) -> None:
    nvml = fake_h100_box(3)
    sampler = make_sampler(nvml)
    assert not any(g.lost for g in sampler.sample().gpus)
    nvml.gpus[1].lost = True
    nvml.advance(0.5)
    sample = sampler.sample()
    assert [g.lost for g in sample.gpus] == [False, True, False]
    lost = sample.gpus[1]
    assert lost.name == "NVIDIA H100 80GB HBM3"  # still named, so the dashboard can say which
    assert lost.util_gpu_pct is None and lost.mem_used_bytes is None and lost.power_w is None
    assert sample.gpus[0].util_gpu_pct == 50.0 and sample.gpus[2].util_gpu_pct == 50.0
    calls_to_lost_gpu = nvml.calls_by_gpu[1]
    nvml.advance(0.5)
    again = sampler.sample()
    assert again.gpus[1].lost and again.gpus[0].util_gpu_pct == 50.0
    # A lost GPU is not asked again: its handle is dead until a reset.
    assert nvml.calls_by_gpu[1] == calls_to_lost_gpu
    fields = sample_frame_fields(again)["gpus"][1]
    assert fields["lost"] is True and fields["util_gpu_pct"] is None


def test_gpu_lost_seen_in_a_field_value_marks_it_lost(make_sampler) -> None:
    gpu = FakeGpu()
    nvml = FakeNVML([gpu, FakeGpu()])
    sampler = make_sampler(nvml)
    sampler.sample()
    gpu.field_errors[NVML_FI_DEV_PCIE_COUNT_TX_BYTES] = NVML_ERROR_GPU_IS_LOST
    sample = sampler.sample()
    assert sample.gpus[0].lost and not sample.gpus[1].lost


def test_gpu_lost_before_start_is_listed_as_lost(make_sampler) -> None:
    nvml = FakeNVML([FakeGpu(lost=True), FakeGpu()])
    sample = make_sampler(nvml).sample()
    assert [g.lost for g in sample.gpus] == [True, False]
    assert sample.nvml is None


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "library not found"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
        (NVML_ERROR_NO_PERMISSION, "no permission"),
    ],
)
def test_nvml_that_cannot_start_gives_no_gpus_and_says_why(make_sampler, code, words) -> None:
    nvml = FakeNVML(init_error=code)
    sampler = make_sampler(nvml)
    sample = sampler.sample()
    assert sample.gpus == ()
    assert sample.nvml is not None and words in sample.nvml.lower()
    assert sample.host.mem_total_bytes is not None  # the host is still sampled
    sampler.close()
    assert nvml.shutdown_calls == 0  # never initialised: nothing to shut down


def test_nvml_with_zero_gpus_says_so(make_sampler) -> None:
    sample = make_sampler(FakeNVML([])).sample()
    assert sample.gpus == () and "sees no NVIDIA GPU" in (sample.nvml or "")


def test_missing_nvidia_ml_py_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    sampler = DeviceSampler()
    sample = sampler.sample()
    sampler.close()
    assert sample.gpus == () and "nvidia-ml-py is not installed" in (sample.nvml or "")


@pytest.mark.parametrize(
    ("visible", "expected"),
    [(None, 4), ("1,3", 2), ("GPU-00000002", 1), ("2,7,0", 1), ("0,0", 0), ("", 0)],
)
def test_visible_gpu_count_reads_cuda_visible_devices_as_cuda_does(
    monkeypatch, visible: str | None, expected: int
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    nvml = fake_h100_box(4)
    assert visible_gpu_count(nvml) == expected
    assert nvml.shutdown_calls == 1


# What the CUDA driver answered (cuDeviceGetCount) for each CUDA_VISIBLE_DEVICES on a
# real one-GPU box: an H100 80GB HBM3, driver 580.159.04, 2026-11-27
# (tests/gpu/test_gpu_visible_devices.py printed it; docs/gpu-validation.md).
H100_UUID = "GPU-0a902a5d-2e51-3fb0-2d73-4bbb7c9253d1"
U, H = H100_UUID, H100_UUID.removeprefix("GPU-")
CUDA_DRIVER_ANSWERS = [
    ('', 0),
    ('0', 1),
    ('-1', 0),
    ('-0', 1),
    ('+0', 1),
    ('00', 1),
    (' 0', 1),
    ('0 ', 1),
    ('0 ,0', 0),
    ('0x0', 1),
    ('²', 0),
    ('1', 0),
    ('0,1', 1),
    ('1,0', 0),
    ('0,0', 0),
    ('0,', 1),
    (',0', 0),
    ('0,-1,0', 1),
    ('0,nonsense', 1),
    ('nonsense,0', 0),
    ('nonsense', 0),
    (f'{U}', 1),
    (f'gpu-{H}', 0),
    ('GPU-0a90', 1),
    ('GPU-0', 1),
    ('GPU-', 0),
    ('GPU', 0),
    (f'{H}', 1),
    ('0a90', 1),
    (f'{U},0', 1),
    (f'0,{U}', 1),
    (f'{U},{U}', 0),
    (f'GPU-0a90,{U}', 0),
    (f'{U},1', 1),
    (f'{U},nonsense', 1),
    ('GPU-ffffffff', 0),
    (f'GPU-ffffffff,{U}', 0),
    ('MIG-0', 1),
    ('MIG-', 0),
    ('MIG', 0),
    ('MIG-nonsense', 0),
    (f'MIG-{U}', 0),
    ('0,MIG-0', 1),
    ('MIG-0,0', 1),
    (f'MIG-0,{U}', 0),
    # A later machine's answers (the same driver), on whitespace around a UUID entry.
    (f' {U}', 0),
    (f'{U} ', 1),
    (f'{U[:8]} ,0', 0),
    (f'\t{U[:8]}', 0),
    # And from another: mixed forms, and indices past 32 bits.
    (f'0,{U[:8]},{U}', 1),
    (f'{U},0,0', 1),
    (f'0,MIG-{H[:4]},{U}', 1),
    ('4294967296', 1),
    ('-4294967296', 1),
    ('9223372036854775808', 1),
    ('0' * 5000, 1),
    ('0,' + '9' * 5000, 1),
]


@pytest.mark.parametrize(("visible", "cuda_count"), CUDA_DRIVER_ANSWERS)
def test_visible_gpu_count_gives_what_the_cuda_driver_gave(
    monkeypatch, visible: str, cuda_count: int
) -> None:
    assert cuda_visible_count(visible, 1, lambda: [H100_UUID]) == cuda_count  # raises nothing
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpu_count(FakeNVML([FakeGpu(uuid=H100_UUID)])) == cuda_count


FOUR_UUIDS = [f"GPU-{i:x}{i:07x}-1234-5678-9abc-def012345678" for i in range(4)]
C_SPACE = " \t\n\v\f\r"


def reference_count(entries: list[str], uuids: list[str]) -> int:
    """The driver's rules again, written apart from gpuwatch's (docs/gpu-validation.md):
    each entry to a device until one names none or changes form; a device twice, 0."""
    hexes = [u.partition("-")[2] for u in uuids]
    devices: list[int] = []
    forms: set[str] = set()
    for entry in entries:
        device: int | None = None
        if entry[:4] in ("GPU-", "MIG-"):
            forms.add("uuid")
            rest = entry[4:]
            hits = [i for i, h in enumerate(hexes)
                    if rest and (h.startswith(rest) or rest.startswith(h))]
            device = hits[0] if len(hits) == 1 else None
        else:
            forms.add("index")
            text = entry.lstrip(C_SPACE)
            negative = text[:1] == "-"
            text = text[1:] if text[:1] in ("+", "-") else text
            digits = ""
            for char in text:
                if char not in "0123456789":
                    break
                digits += char
            if digits:
                significant = digits.lstrip("0") or "0"  # Python converts <= 4,300 digits
                value = 2**64 - 1 if len(significant) > 20 else int(significant)
                value = 2**64 - 1 if value >= 2**64 else (-value if negative else value)
                low = value % 2**64 % 2**32
                device = low if low < len(uuids) else None
        if device is None or len(forms) > 1:
            break
        if device in devices:
            return 0
        devices.append(device)
    return len(devices)


INDEX_ENTRY = st.builds(
    lambda space, sign, zeros, n, junk: f"{space}{sign}{'0' * zeros}{n}{junk}",
    st.sampled_from(["", " ", "\t"]), st.sampled_from(["", "+", "-"]),
    st.integers(0, 3), st.integers(0, 5) | st.sampled_from([2**32, 2**32 + 1, 2**63, 2**64]),
    st.sampled_from(["", " ", "x", "a9"]),
)
UUID_ENTRY = st.builds(
    lambda space, form, uuid, length, junk: f"{space}{form}{uuid[4:4 + length]}{junk}",
    st.sampled_from(["", "", " "]), st.sampled_from(["GPU-", "MIG-", "gpu-"]),
    st.sampled_from(FOUR_UUIDS), st.integers(0, 40), st.sampled_from(["", " ", "z"]),
)
ENTRIES = st.one_of(INDEX_ENTRY, UUID_ENTRY,
                    st.sampled_from(["", "nonsense", "²", "0" * 5000, "9" * 5000]),
                    st.text(st.characters(blacklist_characters=","), max_size=6))


@given(entries=st.lists(ENTRIES, max_size=6), tail=st.lists(ENTRIES, max_size=3))
def test_any_cuda_visible_devices_counts_as_the_drivers_rules_do(
    entries: list[str], tail: list[str]
) -> None:
    got = cuda_visible_count(",".join(entries), 4, lambda: FOUR_UUIDS)
    assert got == reference_count(entries, FOUR_UUIDS)
    assert 0 <= got <= min(4, len(entries))  # no entry holds a comma
    # Nothing after an entry that names no device is read.
    assert cuda_visible_count(",".join([*entries, "nonsense", *tail]), 4,
                              lambda: FOUR_UUIDS) == got


def test_visible_gpu_count_is_zero_without_nvml(monkeypatch) -> None:
    assert visible_gpu_count(FakeNVML([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND)) == 0
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    assert visible_gpu_count() == 0


def test_real_pynvml_without_a_driver_says_why() -> None:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver; tests/gpu covers it")
    sampler = DeviceSampler()
    sample = sampler.sample()
    sampler.close()
    assert sample.gpus == ()
    assert sample.nvml and "NVML" in sample.nvml


# -- lifecycle -------------------------------------------------------------------------


def test_one_init_and_one_shutdown_with_the_worker_stopped(make_sampler) -> None:
    nvml = FakeNVML([FakeGpu(field_errors={NVML_FI_DEV_PCIE_COUNT_TX_BYTES: 3})])
    sampler = make_sampler(nvml)
    for _ in range(5):
        sampler.sample()
    poller = sampler._poller
    assert poller is not None and poller.alive
    sampler.close()
    sampler.close()
    assert nvml.init_calls == 1 and nvml.shutdown_calls == 1
    assert not poller.alive
    after = sampler.sample()
    assert after.gpus == () and after.nvml == "sampler closed"


def test_driver_versions_are_kept(make_sampler) -> None:
    sampler = make_sampler(FakeNVML(cuda_driver_version=12040))
    assert sampler.driver_version == "550.54.15"
    assert cuda_version_text(sampler.cuda_driver_version) == "12.4"
    assert cuda_version_text(12080) == "12.8"


# -- counter arithmetic ------------------------------------------------------------------


@given(
    width=st.sampled_from([16, 32]),
    start=st.integers(min_value=0),
    step=st.integers(min_value=0),
)
def test_counter_delta_recovers_any_single_wrap(width: int, start: int, step: int) -> None:
    start %= 1 << width
    step %= 1 << width
    assert counter_delta(start, (start + step) % (1 << width), width) == step


@given(previous=st.integers(0, 2**64 - 1), current=st.integers(0, 2**64 - 1))
def test_wide_counter_never_reports_a_wrap(previous: int, current: int) -> None:
    delta = counter_delta(previous, current, 64)
    assert delta == (current - previous if current >= previous else None)


def test_counter_rate_refuses_intervals_where_a_narrow_counter_may_wrap_twice() -> None:
    ceiling = 1e9  # bytes/s
    safe = max_unambiguous_interval_s(32, 1, ceiling)
    assert safe == pytest.approx(2**32 / 1e9)
    assert counter_rate(0, 1000, safe * 0.9, 32, 1, ceiling) == pytest.approx(1000 / (safe * 0.9))
    assert counter_rate(0, 1000, safe * 1.1, 32, 1, ceiling) is None
    assert counter_rate(0, 1000, 0.0, 64) is None
    assert counter_rate(0, 2, 0.5, 64, unit_bytes=1024) == pytest.approx(4096)


def test_pcie_link_ceiling() -> None:
    assert pcie_link_max_bytes_per_s(5, 16) == pytest.approx(63.0e9, rel=0.01)
    assert pcie_link_max_bytes_per_s(3, 16) == pytest.approx(15.75e9, rel=0.01)
    # Unknown link: assume the fastest, which only makes the wrap check stricter.
    assert pcie_link_max_bytes_per_s(None, 16) >= pcie_link_max_bytes_per_s(6, 16)


def test_nvlink_generation_is_read_once_from_the_first_active_link(make_sampler) -> None:
    gpu = FakeGpu(nvlink_active=[False, True, True], nvlink_tx_kib=[0, 0, 0],
                  nvlink_rx_kib=[0, 0, 0], nvlink_version=3)
    sampler = make_sampler(FakeNVML([gpu]))
    reading = sampler.sample().gpus[0]
    assert (reading.nvlink_links_active, reading.nvlink_version) == (2, 3)
    frame_gpu = sample_frame_fields(sampler.sample())["gpus"][0]
    assert frame_gpu["nvlink_version"] == 3 and frame_gpu["nvlink_links_active"] == 2


def test_a_sample_frame_gives_the_link_peak_the_all_reduce_is_measured_against(
    make_sampler,
) -> None:
    from gpuwatch.measures import peaks

    nvml = fake_h100_box(2)  # SXM H100s: 18 active NVLink 4 links each
    nvml.gpus[0].processes = nvml.gpus[1].processes = [(4242, 2**30)]
    sampler = make_sampler(nvml, run_pids=lambda: {4242})
    gpus = sample_event(sampler.sample()).gpus
    assert peaks.link_peak(gpus) == peaks.LinkPeak("NVLink", 18 * 25e9)


def test_an_nvlink_generation_nvml_cannot_tell_is_none(make_sampler) -> None:
    gpu = FakeGpu(nvlink_active=[True], nvlink_tx_kib=[0], nvlink_rx_kib=[0],
                  nvlink_version=None)
    reading = make_sampler(FakeNVML([gpu])).sample().gpus[0]
    assert reading.nvlink_links_active == 1 and reading.nvlink_version is None
