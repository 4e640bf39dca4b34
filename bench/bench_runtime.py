"""Bench: the runtime (telemetry on / off) against plain Keras model.fit, same job.

Not a test: prints examples/s per way (median and spread over interleaved
repeats) and a last line ``result: ratio_vs_keras_fit=X ratio_telemetry=Y
ratio_telemetry_ci95=L-U cpu_ms_per_update_on=A cpu_ms_per_update_off=B
cpu_ratio_ci95=C-D``.

Resolving 1 %: 8 repeats of the three ways give per-repeat on/off ratios from about
0.92 to 1.08 on this noisy box, so ratio_telemetry comes from PAIRS short on/off pairs
instead (each pair back to back, the order alternating), as the median of the pairs'
ratios with a bootstrap 95 % interval; beside it the process's CPU time per update
(every thread: the telemetry sender's work shows there even when the wall clock hides
it).
Same model (784-512-512-10 MLP), same synthetic data, same global batch (256),
same MirroredStrategy (2 CPU replicas here, every GPU where present).
"""

from __future__ import annotations

import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorflow as tf

from trainer_runtime.data import make_dataset_fn
from trainer_runtime.devices import make_strategy, setup_devices
from trainer_runtime.loop import Trainer
from trainer_runtime.models import build_model
from trainer_runtime.schema import RunConfig
from trainer_runtime.telemetry import NullEmitter, SocketEmitter

STEPS = 200
REPEATS = 8
SPE = 10
PAIRS = 160  # on/off pairs of PAIR_STEPS each, for ratio_telemetry and its interval
PAIR_STEPS = 100

CONFIG = RunConfig.model_validate({
    "model": {"hidden_units": [512, 512]},
    "data": {"examples": 16384, "input_shape": [784], "prefetch": "autotune",
             "parallel_calls": "autotune"},
    "train": {"global_batch_size": 256, "steps_per_execution": SPE, "optimizer": "adam"},
    "checkpoint": {"enabled": False},
})


# The dashboard-like reader runs in its own process, as a real dashboard does (a
# thread here would also compete with the trainer for this interpreter's GIL).
READER = """
import socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
buf, frames = b"", 0
while data := sock.recv(65536):
    buf += data
    *lines, buf = buf.split(b"\\n")
    frames += len(lines)
print(frames)
"""


def start_reader(sock: socket.socket) -> subprocess.Popen[str]:
    """A separate process that reads the other end like a dashboard: frames on newlines."""
    proc = subprocess.Popen([sys.executable, "-c", READER, str(sock.fileno())],
                            pass_fds=(sock.fileno(),), stdout=subprocess.PIPE, text=True)
    sock.close()  # the reader holds its own copy
    return proc


def main() -> int:
    devices = setup_devices(CONFIG.strategy.cpu_replicas)
    strategy, _ = make_strategy(devices, CONFIG.strategy.cross_device_ops)
    print(f"devices: {devices.kind} x{len(devices.names)}; model 784-512-512-10, "
          f"global batch {CONFIG.train.global_batch_size}, {STEPS} steps x {REPEATS} repeats, "
          f"runtime steps_per_execution={SPE}")

    ours, theirs = socket.socketpair()
    reader = start_reader(theirs)
    emitter = SocketEmitter(ours, CONFIG.telemetry.buffer_frames)
    trainer = Trainer(CONFIG, strategy, devices, emitter=emitter)

    # Keras fit on the same pipeline, batched globally (fit distributes it itself).
    fit_cfg = CONFIG.model_copy(deep=True)
    ds = make_dataset_fn(fit_cfg.data, 0, CONFIG.train.global_batch_size)(
        tf.distribute.InputContext())
    with strategy.scope():
        model = build_model(CONFIG.model, (784,), CONFIG.data.classes)
        import keras

        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=1)  # >1 fails under MirroredStrategy (FACTS.md)

    cpu_ms: dict[bool, list[float]] = {True: [], False: []}  # per update, by telemetry on

    def run_ours(telemetry: bool, steps: int = STEPS) -> float:
        trainer.emitter = emitter if telemetry else NullEmitter()
        trainer.step_frames = telemetry
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps // SPE):
            trainer.run_updates(SPE)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        cpu_ms[telemetry].append(1000.0 * cpu / steps)
        return steps * CONFIG.train.global_batch_size / wall

    def run_fit() -> float:
        t0 = time.perf_counter()
        model.fit(ds, steps_per_epoch=STEPS, epochs=1, verbose=0)
        return STEPS * CONFIG.train.global_batch_size / (time.perf_counter() - t0)

    ways = {"runtime, telemetry on + reader": lambda: run_ours(True),
            "runtime, telemetry off": lambda: run_ours(False),
            "keras model.fit": run_fit}
    for fn in ways.values():  # warm-up: tracing, autotune, thread pools
        fn()
    results: dict[str, list[float]] = {name: [] for name in ways}
    # Interleaved: each repeat runs all three, the order rotating so that no way
    # always runs first (the box is noisy and shared; load drifts over minutes).
    for rep in range(REPEATS):
        order = list(ways.items())
        order = order[rep % 3:] + order[: rep % 3]
        for name, fn in order:
            results[name].append(fn())
    for name, values in results.items():
        print(f"{name:32s} median {statistics.median(values):8.0f} ex/s   "
              f"min {min(values):8.0f}  max {max(values):8.0f}   "
              f"runs {' '.join(f'{v:.0f}' for v in values)}")
    on = results["runtime, telemetry on + reader"]
    off = results["runtime, telemetry off"]
    fit = results["keras model.fit"]
    # Ratios within a repeat (runs minutes apart see different load), then the
    # median over repeats.
    vs_fit = statistics.median(a / b for a, b in zip(on, fit, strict=True))
    print("per-repeat on/off: " + " ".join(f"{a / b:.3f}" for a, b in zip(on, off, strict=True)))
    # The telemetry's cost to 1 %: many short pairs, back to back, the order alternating.
    cpu_ms[True].clear()
    cpu_ms[False].clear()
    ratios = []
    for pair in range(PAIRS):
        first = pair % 2 == 0
        a = run_ours(first, PAIR_STEPS)
        b = run_ours(not first, PAIR_STEPS)
        ratios.append(a / b if first else b / a)
    vs_off = statistics.median(ratios)
    low, high = bootstrap_median_ci(ratios)
    cpu_on, cpu_off = statistics.median(cpu_ms[True]), statistics.median(cpu_ms[False])
    # CPU per update, on over off, pair by pair (the pairs' runs are back to back).
    cpu_ratios = [a / b for a, b in zip(cpu_ms[True], cpu_ms[False], strict=True)]
    cpu_low, cpu_high = bootstrap_median_ci(cpu_ratios)
    print(f"{PAIRS} on/off pairs of {PAIR_STEPS} steps: median ratio {vs_off:.4f}, 95% "
          f"interval {low:.4f}-{high:.4f}, pairs {min(ratios):.3f}-{max(ratios):.3f}; CPU per "
          f"update (all threads) on {cpu_on:.2f} ms, off {cpu_off:.2f} ms, on/off median "
          f"{statistics.median(cpu_ratios):.4f} (95% {cpu_low:.4f}-{cpu_high:.4f})")
    emitter.close()
    frames_read = int((reader.communicate(timeout=60)[0] or "0").strip() or 0)
    print(f"telemetry: {emitter.sent} frames sent, {frames_read} read by the reader process, "
          f"{emitter.dropped} dropped")
    print(f"result: ratio_vs_keras_fit={vs_fit:.3f} ratio_telemetry={vs_off:.3f} "
          f"ratio_telemetry_ci95={low:.3f}-{high:.3f} cpu_ms_per_update_on={cpu_on:.3f} "
          f"cpu_ms_per_update_off={cpu_off:.3f} "
          f"cpu_ratio_ci95={cpu_low:.3f}-{cpu_high:.3f}")
    return 0


def bootstrap_median_ci(values: list[float], resamples: int = 4000) -> tuple[float, float]:
    """A 95 % interval for the median of values (percentile bootstrap, fixed seed)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


if __name__ == "__main__":
    sys.exit(main())
