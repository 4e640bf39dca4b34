"""`gpuwatch doctor`: the TensorFlow probe for real (a subprocess), NVML through the fake."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import time

import pytest

from gpuwatch.cli.doctor import (
    GPU_INSTALL_HINT,
    GpuReport,
    NvmlReport,
    TfReport,
    diagnose,
    probe_nvml,
    probe_tensorflow,
    run,
)
from tests.support.fake_nvml import (
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    FakeGpu,
    FakeNVML,
    fake_h100_box,
)
from trainer_runtime.schema import RunConfig

HAS_TF = importlib.util.find_spec("tensorflow") is not None
needs_tf = pytest.mark.skipif(not HAS_TF, reason="TensorFlow is not installed in this interpreter")


@pytest.fixture(scope="module")
def real_tf() -> TfReport:
    """The real probe, run once: importing TensorFlow takes seconds."""
    return probe_tensorflow()


def doctor(argv: list[str], **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    code = run(argv, out=out, **kwargs)
    return code, out.getvalue()


@needs_tf
def test_tensorflow_probe_runs_in_a_subprocess_and_reports_the_build(real_tf) -> None:
    # Compared with the installed distribution's metadata, so this test process
    # never imports TensorFlow itself.
    from importlib import metadata

    distributions = {}
    for name in ("tensorflow-cpu", "tensorflow"):
        try:
            distributions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    assert real_tf.error is None
    assert real_tf.version in distributions.values()
    if "tensorflow-cpu" in distributions and "tensorflow" not in distributions:
        assert real_tf.built_with_cuda is False
        assert real_tf.gpus == []


def test_gpuwatch_doctor_module_does_not_import_tensorflow() -> None:
    import subprocess

    code = "import sys, gpuwatch.cli.doctor; print('tensorflow' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


@needs_tf
def test_no_gpu_box_says_cpu_replicas_and_exits_zero() -> None:
    # The real thing end to end: real TF subprocess, real pynvml (no driver here).
    code, text = doctor([])
    if "NVML library not found" not in text and "no NVIDIA GPU" not in text.lower():
        pytest.skip("this machine has an NVIDIA driver; the no-GPU path needs a box without")
    assert code == 0
    assert "logical CPU replicas" in text
    assert "tensorflow" in text and "sees 0 GPU(s)" in text


@needs_tf
def test_gpus_but_cpu_only_tensorflow_fails_with_the_install_hint(real_tf, monkeypatch) -> None:
    if real_tf.built_with_cuda:
        pytest.skip("this TensorFlow is a CUDA build; the case needs tensorflow-cpu")
    monkeypatch.setattr("gpuwatch.cli.doctor.probe_tensorflow", lambda **_: real_tf)
    code, text = doctor([], nvml=fake_h100_box(2))
    assert code == 1
    assert "NVML sees 2 GPU(s) but TensorFlow" in text
    assert GPU_INSTALL_HINT in text


def test_tensorflow_missing_fails_with_the_install_hint() -> None:
    # -S drops site-packages: a real interpreter in which TensorFlow cannot be found.
    code, text = doctor(
        [],
        nvml=FakeNVML(init_error=NVML_ERROR_LIBRARY_NOT_FOUND),
        tf_command=[sys.executable, "-S", "-m", "trainer_runtime.doctor"],
    )
    assert code == 1
    assert "TensorFlow cannot be imported" in text and "ModuleNotFoundError" in text
    assert "pip install 'gpuwatch[cpu]'" in text


def test_tensorflow_probe_is_time_limited() -> None:
    started = time.monotonic()
    report = probe_tensorflow(
        timeout_s=1.0, command=[sys.executable, "-c", "import time; time.sleep(60)"]
    )
    assert time.monotonic() - started < 30
    assert report.version is None and "timed out after 1 s" in (report.error or "")


def test_nvml_report_lists_supported_and_unavailable_fields() -> None:
    nvml = fake_h100_box(2)
    nvml.gpus[1].errors["nvmlDeviceGetPowerUsage"] = NVML_ERROR_NOT_SUPPORTED
    nvml.gpus[1].mig = True
    tf = TfReport(version="2.21.0", gpus=["/physical_device:GPU:0"] * 2, built_with_cuda=True)
    report = probe_nvml(nvml, settle_s=0.0)
    assert report.driver_version == "550.54.15" and report.cuda_driver_version == "12.4"
    first, second = report.gpus
    assert "power_w" in first.supported and "pcie_tx_bytes_per_s" in first.supported
    assert second.unavailable["power_w"] == "not supported"
    assert "MIG" in second.unavailable["util_gpu_pct"]
    assert diagnose(tf, report)[0] == 0


def test_json_output(monkeypatch) -> None:
    tf = TfReport(version="2.21.0", gpus=["/physical_device:GPU:0"], built_with_cuda=True)
    monkeypatch.setattr("gpuwatch.cli.doctor.probe_tensorflow", lambda **_: tf)
    code, text = doctor(["--json"], nvml=FakeNVML([FakeGpu()]))
    payload = json.loads(text)
    assert code == 0 and payload["ok"] is True
    assert payload["nvml"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert payload["tensorflow"]["version"] == "2.21.0"


def _nv(*gpus: GpuReport, unavailable: str | None = None) -> NvmlReport:
    return NvmlReport(unavailable=unavailable, cuda_driver_version="12.4", gpus=list(gpus))


def _gpu(index: int = 0, lost: bool = False) -> GpuReport:
    return GpuReport(index, "H100", lost, False, [], {}, "counter")


def test_cuda_build_that_sees_no_gpu_blames_cuda_libraries_or_driver() -> None:
    tf = TfReport(version="2.21.0", gpus=[], built_with_cuda=True, cuda_version="12.5.1")
    code, lines = diagnose(tf, _nv(_gpu()))
    assert code == 1
    assert "CUDA libraries are missing" in lines[0] and GPU_INSTALL_HINT in lines[1]


def test_all_gpus_lost_is_a_problem_some_lost_is_a_note() -> None:
    tf = TfReport(version="2.21.0", gpus=["g0"], built_with_cuda=True)
    assert diagnose(tf, _nv(_gpu(0, lost=True)))[0] == 1
    code, lines = diagnose(tf, _nv(_gpu(0), _gpu(1, lost=True)))
    assert code == 0 and any("lost" in line for line in lines)


def test_tf_gpus_without_nvml_train_but_say_readings_are_missing() -> None:
    tf = TfReport(version="2.21.0", gpus=["g0"], built_with_cuda=True)
    code, lines = diagnose(tf, _nv(unavailable="no permission to open the NVIDIA devices"))
    assert code == 0 and "cannot read them" in lines[0]


def test_no_gpu_names_the_schemas_default_cpu_replicas() -> None:
    tf = TfReport(version="2.21.0", gpus=[], built_with_cuda=False)
    code, lines = diagnose(tf, _nv(unavailable="NVML library not found"))
    default = RunConfig().strategy.cpu_replicas
    assert code == 0 and f"(strategy.cpu_replicas, default {default})" in lines[0]


# Real processes (a supervisor, a trainer, sshd or tmux): after the quick tests.
pytestmark = pytest.mark.slow


def test_doctor_names_the_home_and_what_stops_the_other_commands_there(
    tmp_path, monkeypatch
) -> None:
    # Every other command refuses an unusable home in one line; doctor says which it is.
    kwargs = {"nvml": FakeNVML(init_error=NVML_ERROR_LIBRARY_NOT_FOUND),
              "tf_command": [sys.executable, "-S", "-m", "trainer_runtime.doctor"]}
    monkeypatch.setenv("GPUWATCH_HOME", str(tmp_path))
    _, text = doctor([], **kwargs)
    assert f"  home         {tmp_path}\n" in text
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("GPUWATCH_HOME", str(not_a_folder))
    _, text = doctor([], **kwargs)
    assert (f"  home         {not_a_folder} (unusable: GPUWATCH_HOME={not_a_folder} is not a "
            "directory)\n") in text


def test_the_readings_listed_are_gpu_samples_sent_fields_but_what_the_gpu_is() -> None:
    from dataclasses import fields

    from gpuwatch.cli.doctor import READINGS as listed
    from trainer_runtime.protocol import GpuSample, wire_field_names

    not_readings = {f.name for f in fields(GpuSample) if f.metadata.get("reading") is False}
    assert not_readings == {"index", "name", "uuid", "lost", "mig", "pcie_source",
                            "nvlink_links_active", "nvlink_version"}
    assert listed == tuple(n for n in wire_field_names(GpuSample) if n not in not_readings)
    assert listed[0] == "util_gpu_pct" and listed[-1] == "processes"
