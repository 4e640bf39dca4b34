"""`gpuwatch doctor`: can this machine train on its GPUs, and what can gpuwatch read?

Checks, in order: the Python interpreter; TensorFlow and the GPUs it sees (in a
time-limited subprocess, ``python -m trainer_runtime.doctor``, so gpuwatch
itself never imports TensorFlow); NVML, the driver and CUDA driver versions;
each GPU and which readings it supports. Exits non-zero with a plain reason when
training on GPUs cannot work; a machine with no GPU at all is fine (training
runs on logical CPU replicas) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TextIO

from gpuwatch.sampling import DeviceSampler, cuda_version_text
from gpuwatch.sampling.nvml import PENDING_REASONS
from trainer_runtime.protocol import GpuSample
from trainer_runtime.schema import StrategyConfig

TF_PROBE_TIMEOUT_S = 120.0  # importing TF takes ~4 s on a quiet box, far more on a loaded one
DEFAULT_CPU_REPLICAS = StrategyConfig().cpu_replicas  # what a config without the key gets
GPU_INSTALL_HINT = "pip install 'gpuwatch[gpu]'"
CPU_INSTALL_HINT = "pip install 'gpuwatch[cpu]'"
# The readings a GpuSample carries, in the order they are shown: its sent fields but
# those that say what the GPU is or how its links are read (metadata "reading": False).
READINGS = tuple(
    spec.name for spec in fields(GpuSample)
    if spec.metadata.get("reading", True) and spec.metadata.get("wire", True)
)
_REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class TfReport:
    """What the trainer's interpreter says about TensorFlow."""

    version: str | None = None
    gpus: list[str] = field(default_factory=list)
    built_with_cuda: bool | None = None
    cuda_version: str | None = None
    error: str | None = None


@dataclass
class GpuReport:
    index: int
    name: str | None
    lost: bool
    mig: bool
    supported: list[str]
    unavailable: dict[str, str]
    pcie_source: str | None


@dataclass
class NvmlReport:
    unavailable: str | None = None
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[GpuReport] = field(default_factory=list)


def probe_tensorflow(
    timeout_s: float = TF_PROBE_TIMEOUT_S, command: list[str] | None = None
) -> TfReport:
    """Ask the trainer's interpreter (this one) what TensorFlow sees, within a time limit."""
    command = command or [sys.executable, "-m", "trainer_runtime.doctor"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # trainer_runtime must be importable even when gpuwatch runs from a checkout.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return TfReport(error=f"importing TensorFlow timed out after {timeout_s:g} s")
    except OSError as exc:
        return TfReport(error=f"could not run {command[0]}: {exc}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return TfReport(error=f"TensorFlow probe failed (exit {done.returncode}): {tail}")
    try:
        data: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        return TfReport(error=f"TensorFlow probe printed bad JSON: {exc}")
    return TfReport(
        version=data.get("tensorflow"),
        gpus=list(data.get("gpus") or []),
        built_with_cuda=data.get("built_with_cuda"),
        cuda_version=data.get("cuda_version"),
        error=data.get("error"),
    )


def probe_nvml(nvml: Any | None = None, settle_s: float = 0.6) -> NvmlReport:
    """NVML versions and, per GPU, which readings come back (two samples apart)."""
    sampler = DeviceSampler(nvml=nvml)
    try:
        report = NvmlReport(
            unavailable=sampler.nvml_unavailable,
            driver_version=sampler.driver_version,
            nvml_version=sampler.nvml_version,
            cuda_driver_version=cuda_version_text(sampler.cuda_driver_version),
        )
        if sampler.gpu_count == 0:
            return report
        sampler.sample()
        # Rates need a second read; the PCIe window worker needs one pass.
        time.sleep(settle_s)
        for gpu in sampler.sample().gpus:
            reasons = dict(gpu.unavailable)
            supported, unavailable = [], {}
            for name in READINGS:
                value = getattr(gpu, name)
                reason = reasons.get(name)
                if name == "processes":
                    reason = reasons.get("processes")
                    value = None if reason else value
                if value is not None or reason in PENDING_REASONS:
                    supported.append(name)
                else:
                    unavailable[name] = reason or reasons.get("all") or "n/a"
            report.gpus.append(
                GpuReport(
                    index=gpu.index,
                    name=gpu.name,
                    lost=gpu.lost,
                    mig=gpu.mig,
                    supported=supported,
                    unavailable=unavailable,
                    pcie_source=gpu.pcie_source,
                )
            )
        return report
    finally:
        sampler.close()


def diagnose(tf: TfReport, nv: NvmlReport) -> tuple[int, list[str]]:
    """The verdict: (exit code, plain sentences)."""
    nvml_gpus = [g for g in nv.gpus if not g.lost]
    if tf.version is None:
        hint = GPU_INSTALL_HINT if nv.gpus else CPU_INSTALL_HINT
        return 1, [
            f"TensorFlow cannot be imported by {sys.executable}: {tf.error or 'unknown error'}.",
            f"Install it into this environment: {hint}",
        ]
    if nv.gpus and not nvml_gpus:
        return 1, [
            f"All {len(nv.gpus)} GPU(s) NVML knows are lost (fell off the bus): "
            "the GPUs need a reset or the machine a reboot."
        ]
    if nvml_gpus and not tf.gpus:
        if tf.built_with_cuda is False:
            return 1, [
                f"NVML sees {len(nvml_gpus)} GPU(s) but TensorFlow {tf.version} sees none: "
                "this TensorFlow is a CPU-only build (tensorflow-cpu).",
                f"Install the CUDA build: {GPU_INSTALL_HINT}",
            ]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        problem = [
            f"NVML sees {len(nvml_gpus)} GPU(s) but TensorFlow {tf.version} (CUDA "
            f"{tf.cuda_version or '?'}) sees none: its CUDA libraries are missing or the "
            f"driver (CUDA {nv.cuda_driver_version or '?'}) is too old for them.",
            f"Install TensorFlow with its CUDA libraries: {GPU_INSTALL_HINT}",
        ]
        if visible is not None:
            problem.append(f"CUDA_VISIBLE_DEVICES is set to {visible!r}: check it.")
        return 1, problem
    lines: list[str] = []
    if nvml_gpus:
        lines.append(f"Training can use {len(tf.gpus)} GPU(s) with TensorFlow {tf.version}.")
        if len(tf.gpus) < len(nvml_gpus):
            lines.append(
                f"TensorFlow sees {len(tf.gpus)} of the {len(nvml_gpus)} "
                f"GPU{'s' if len(nvml_gpus) != 1 else ''} NVML sees "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})."
            )
        lost = len(nv.gpus) - len(nvml_gpus)
        if lost:
            lines.append(f"{lost} GPU(s) are lost (fell off the bus) and will not be used.")
        if any(g.mig for g in nvml_gpus):
            lines.append("MIG is enabled: whole-GPU utilization shows n/a.")
        return 0, lines
    if tf.gpus:
        return 0, [
            f"Training can use {len(tf.gpus)} GPU(s) with TensorFlow {tf.version}, "
            f"but gpuwatch cannot read them: {nv.unavailable}."
        ]
    return 0, [
        f"No NVIDIA GPU here ({nv.unavailable or 'none found'}): training will use logical "
        f"CPU replicas (strategy.cpu_replicas, default {DEFAULT_CPU_REPLICAS}), and "
        "MirroredStrategy still runs one replica per logical device."
    ]


def _home_line() -> str:
    """Where runs are kept, and what stops every other command there, if anything does."""
    from gpuwatch.runs.folders import gpuwatch_home, home_problem

    problem = home_problem()
    return f"{gpuwatch_home()}" + (f" (unusable: {problem})" if problem else "")


def render(tf: TfReport, nv: NvmlReport, code: int, verdict: list[str], out: TextIO) -> None:
    def row(label: str, text: str) -> None:
        out.write(f"  {label:<12} {text}\n")

    out.write("gpuwatch doctor\n")
    row("python", f"{platform.python_version()} ({sys.executable})")
    row("home", _home_line())
    if tf.version is None:
        row("tensorflow", f"not importable: {tf.error}")
    else:
        build = (
            f"CUDA {tf.cuda_version} build"
            if tf.built_with_cuda
            else "CPU-only build"
            if tf.built_with_cuda is False
            else "build unknown"
        )
        row("tensorflow", f"{tf.version} ({build}), sees {len(tf.gpus)} GPU(s)")
        for name in tf.gpus:
            row("", name)
    if nv.unavailable and not nv.gpus:
        row("nvml", f"unavailable: {nv.unavailable}")
    else:
        row("nvml", f"{nv.nvml_version or '?'}")
        row("driver", f"{nv.driver_version or '?'} (CUDA driver {nv.cuda_driver_version or '?'})")
    for gpu in nv.gpus:
        state = " LOST" if gpu.lost else " (MIG)" if gpu.mig else ""
        row(f"GPU {gpu.index}", f"{gpu.name or '?'}{state}")
        if gpu.lost:
            continue
        row("", "reads: " + ", ".join(gpu.supported))
        if gpu.pcie_source:
            source = "cumulative counters" if gpu.pcie_source == "counter" else "20 ms window"
            row("", f"PCIe from {source}")
        if gpu.unavailable:
            na = "; ".join(f"{name} ({why})" for name, why in gpu.unavailable.items())
            row("", f"n/a: {na}")
    out.write(("OK: " if code == 0 else "PROBLEM: ") + " ".join(verdict) + "\n")


def run(
    argv: list[str] | None = None,
    *,
    nvml: Any | None = None,
    tf_command: list[str] | None = None,
    out: TextIO | None = None,
) -> int:
    """main() with the seams tests need: a fake NVML, another TF probe command, an output."""
    parser = argparse.ArgumentParser(
        prog="gpuwatch doctor",
        description="Check that this machine can train on its GPUs and what gpuwatch can read.",
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--timeout",
        type=float,
        default=TF_PROBE_TIMEOUT_S,
        help="seconds to wait for TensorFlow to import (default %(default)s)",
    )
    args = parser.parse_args(argv)
    out = out or sys.stdout
    tf = probe_tensorflow(timeout_s=args.timeout, command=tf_command)
    nv = probe_nvml(nvml)
    code, verdict = diagnose(tf, nv)
    if args.json:
        payload = {
            "python": platform.python_version(),
            "tensorflow": asdict(tf),
            "nvml": asdict(nv),
            "ok": code == 0,
            "verdict": verdict,
        }
        out.write(json.dumps(payload, indent=2) + "\n")
    else:
        render(tf, nv, code, verdict, out)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point for `gpuwatch doctor`."""
    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
