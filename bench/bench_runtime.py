"""Bench: the runtime (telemetry on / off) against plain Keras model.fit, same job.

Not a test: prints examples/s per way (median and spread over interleaved
repeats) and a last line ``result: ratio_vs_keras_fit=X ratio_telemetry=Y``.
Same model (784-512-512-10 MLP), same synthetic data, same global batch (256),
same MirroredStrategy (2 CPU replicas here, every GPU where present).
"""

from __future__ import annotations

import os
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

    def run_ours(telemetry: bool) -> float:
        trainer.emitter = emitter if telemetry else NullEmitter()
        trainer.step_frames = telemetry
        t0 = time.perf_counter()
        for _ in range(STEPS // SPE):
            trainer.run_updates(SPE)
        return STEPS * CONFIG.train.global_batch_size / (time.perf_counter() - t0)

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
    emitter.close()
    frames_read = int((reader.communicate(timeout=60)[0] or "0").strip() or 0)
    print(f"telemetry: {emitter.sent} frames sent, {frames_read} read by the reader process, "
          f"{emitter.dropped} dropped")
    on = results["runtime, telemetry on + reader"]
    off = results["runtime, telemetry off"]
    fit = results["keras model.fit"]
    # Ratios within a repeat (runs minutes apart see different load), then the
    # median over repeats.
    vs_fit = statistics.median(a / b for a, b in zip(on, fit, strict=True))
    vs_off = statistics.median(a / b for a, b in zip(on, off, strict=True))
    print("per-repeat on/off: " + " ".join(f"{a / b:.3f}" for a, b in zip(on, off, strict=True)))
    print(f"result: ratio_vs_keras_fit={vs_fit:.3f} ratio_telemetry={vs_off:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
