"""Watching a person's own TensorFlow script from inside it (`gpuwatch run -- python x.py`).

sitecustomize.py calls start() at interpreter start-up. Nothing here imports TensorFlow:
a finder on sys.meta_path (patching.AfterImport) waits until the script imports it, then
patches, on the classes, only what a training loop goes through (keras_patches.py:
``fit``; loops.py: custom loops and the prefetch ``data.prefetch`` adds). Watch is what
the patches share: the settings, the telemetry, the hook event (what is watched, or why
not) and the steps, sent as the runtime's own frames over the telemetry fd; the patches
know it by watching.py's Protocols and never import this module. Nothing here changes
what the script computes: every patch falls back to the original call if anything of
its own fails, and the hook event says so.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from trainer_runtime import protocol
from trainer_runtime.hook import keras_patches
from trainer_runtime.hook.loops import CustomLoops
from trainer_runtime.hook.patching import (
    AfterImport,
    excepthook_without_hook_frames,
    one_line,
    wrap,
)
from trainer_runtime.hook.updates import PlainUpdates
from trainer_runtime.telemetry import HOOK_GATHER_S, NullEmitter, SocketEmitter

_watch: Watch | None = None


def start(fd: str | None, settings_json: str | None) -> None:
    """Called once by sitecustomize; never raises."""
    global _watch
    try:
        settings = json.loads(settings_json or "{}")
        emitter: Any = NullEmitter()
        if fd is not None:
            os.set_inheritable(int(fd), False)  # the script's own subprocesses do not get it
            emitter = SocketEmitter.from_fd(int(fd), gather_s=HOOK_GATHER_S)
        _watch = Watch(settings, emitter)
        _watch.install()
    except BaseException as exc:
        print(f"gpuwatch: the hook is off: {type(exc).__name__}: {exc}", file=sys.stderr)


def strategy_name(strategy: Any) -> str:
    """The strategy's public name (tf.distribute.MultiWorkerMirroredStrategy's class is
    CollectiveAllReduceStrategy), "no strategy" for TensorFlow's default one."""
    cls = type(strategy)
    if cls.__name__ == "_DefaultDistributionStrategy":
        return "no strategy"
    public = cls.__dict__.get("_tf_api_names") or ()
    return str(public[0]).rsplit(".", 1)[-1] if public else cls.__name__


class Watch:
    """One watched process: its settings, its telemetry, and the steps it has seen."""

    def __init__(self, settings: dict[str, Any], emitter: Any) -> None:
        self.attempt = int(settings.get("attempt") or 1)
        self.worker = int(settings.get("worker") or 0)
        self.prefetch = settings.get("prefetch", False)
        self.max_steps = settings.get("max_steps")
        self.emitter = emitter
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.tf: Any = None
        # Hook state, as the hook event says it.
        self.tensorflow = False
        self.keras_version = ""
        self.loop = ""
        self.input_wait = ""
        self.strategy = ""
        self.strategy_obj: Any = None
        self.message = "waiting for the script to import TensorFlow"
        # Steps.
        self.step = 0
        self.position = 0
        # fit's epoch, as Keras numbers it (initial_epoch first); a custom loop's steps
        # carry none: its epochs are the script's own, unseen.
        self.epoch = 0
        self.epoch_start: int | None = None  # set as fit starts: its first epoch's number
        self.hello_sent = False
        self.param_count = 0
        self.param_bytes = 0
        # FLOPs per example of the watched step, counted in its traced graph
        # (trainer_runtime.flops.step_flops_per_example) before its first step is sent.
        self.flops_per_example: float | None = None
        self.stopped = False  # max_steps reached
        self.keras_depth = 0  # inside Keras' fit/evaluate/predict: strategy-level patches stand by
        self.applies = 0  # optimizer applications traced or run so far (custom loops)
        self.applied_by: Any = None  # the first optimizer a strategy.run step applied
        self.run_depth = 0  # inside strategy.run (its updates are its step's)
        # What ends the script's training at max_steps: fit sets one (stop_training); a
        # custom loop's step ends the process (CustomLoops.end_loop).
        self.on_max_steps: Callable[[], None] | None = None
        self.loops = CustomLoops(self)
        self.updates = PlainUpdates(self)

    # -- wiring ----------------------------------------------------------------------

    def install(self) -> None:
        sys.meta_path.insert(0, AfterImport({
            "tensorflow": self._guard(self.on_tensorflow, "TensorFlow"),
            keras_patches.KERAS_TRAINER: self._guard(
                lambda module: keras_patches.patch_trainer(self, module), "Keras' trainer"),
            keras_patches.KERAS_OPTIMIZER: self._guard(
                lambda module: keras_patches.patch_optimizer(self, module),
                "Keras' optimizer"),
            keras_patches.KERAS_MODEL: self._guard(
                lambda module: keras_patches.patch_model(self, module), "Keras' model"),
        }))
        atexit.register(self.at_exit)
        if not getattr(sys.excepthook, "__gpuwatch__", False):
            sys.excepthook = excepthook_without_hook_frames(sys.excepthook)
        self.send_hook()

    def _guard(self, patch: Callable[[ModuleType], None], what: str
               ) -> Callable[[ModuleType], None]:
        def guarded(module: ModuleType) -> None:
            try:
                patch(module)
            except Exception as exc:
                self.message = f"could not instrument {what}: {one_line(exc)}"
                self.send_hook()
        return guarded

    def on_tensorflow(self, tf: ModuleType) -> None:
        self.tf = tf
        self.tensorflow = True
        self.message = "TensorFlow imported: no training loop seen yet"
        self.loops.install(tf)
        from tensorflow.python.data.ops import iterator_ops

        wrap(iterator_ops.OwnedIterator, "__next__", self.updates.iterator_next)
        self.send_hook()

    @property
    def own_process(self) -> bool:
        """Not a fork of the watched process (a data loader's): only the script reports."""
        return os.getpid() == self.pid

    def emit(self, event: protocol.Event, t: float | None = None) -> None:
        if self.own_process:
            self.emitter.emit(event, t)

    def send_hook(self) -> None:
        self.emit(protocol.Hook(
            attempt=self.attempt, installed=True, message=self.message,
            tensorflow=self.tensorflow, keras_version=self.keras_version, loop=self.loop,
            input_wait=self.input_wait, strategy=self.strategy,
        ))

    def set_loop(self, loop: str, input_wait: str = "", message: str = "") -> None:
        if (loop, input_wait) != (self.loop, self.input_wait):
            self.loop, self.input_wait = loop, input_wait
            self.message = message or f"watching {loop}"
            self.send_hook()

    def at_exit(self) -> None:
        # Registered before TensorFlow's handlers, so run after them: autograph's have
        # removed its modules, not the bytecode cached for them (the script's; a forked
        # child's exit leaves them to the script).
        if self.own_process:
            self.loops.remove_generated()
        try:
            self.loops.flush_pending()
            if not self.stopped:
                self.emit(protocol.Done(attempt=self.attempt, reason="exited", step=self.step,
                                        worker=self.worker))
            self.emitter.close(2.0)
        except Exception:
            pass

    # -- what every loop reports -----------------------------------------------------

    def note_strategy(self, strategy: Any) -> None:
        if not self.strategy:
            self.strategy = strategy_name(strategy)
            self.strategy_obj = strategy

    def report(self, *, step_time_ms: float, input_wait_ms: float | None, examples: int,
               loss: float | None, lr: float | None, end: float,
               epoch: int | None) -> None:
        if self.stopped:
            return
        if not self.hello_sent:
            self.send_hello(examples)
        self.step += 1
        self.position += examples
        finite = loss is not None and loss == loss and abs(loss) != float("inf")
        self.emit(protocol.Step(
            attempt=self.attempt, step=self.step, micro_step=self.step, epoch=epoch,
            loss=loss if finite else None, lr=lr, examples=examples,
            step_time_ms=step_time_ms,
            input_wait_ms=None if input_wait_ms is None else max(0.0, input_wait_ms),
            grad_sync_bytes=float(self.param_bytes), position=self.position,
            dropped=self.emitter.dropped, worker=self.worker,
        ), t=end)
        if self.max_steps is not None and self.step >= int(self.max_steps):
            self.stopped = True
            self.emit(protocol.Done(attempt=self.attempt, reason="max_steps", step=self.step,
                                    worker=self.worker))
            if self.on_max_steps is not None:
                self.on_max_steps()

    def send_hello(self, examples: int) -> None:
        self.hello_sent = True
        tf = self.tf
        strategy = self.strategy_obj or tf.distribute.get_strategy()
        replicas = int(strategy.num_replicas_in_sync)
        try:
            devices = [str(d) for d in strategy.extended.worker_devices]
        except Exception:
            devices = []
        kind = "gpu" if any("GPU" in d.upper() for d in devices) else "cpu"
        # A cluster's workers (MultiWorkerMirroredStrategy): the replicas in sync over this
        # worker's own.
        workers = replicas // len(devices) if devices and replicas % len(devices) == 0 else 1
        self.emit(protocol.Hello(
            attempt=self.attempt, pid=os.getpid(), tf_version=str(tf.__version__),
            replicas=replicas, device_kind=kind, devices=devices,
            param_count=self.param_count, param_bytes=self.param_bytes,
            global_batch_size=examples, accumulation_steps=1,
            per_replica_batch=examples // max(1, replicas), start_step=self.step,
            start_micro_step=self.step,
            worker=self.worker, workers=max(1, workers), host=protocol.host_name(),
            flops_per_example=self.flops_per_example,
        ))

    def count_params(self, variables: Sequence[Any]) -> None:
        if self.param_count:
            return
        count = size = 0
        for var in variables:
            n = 1
            for dim in var.shape:
                n *= int(dim)
            count += n
            size += n * int(getattr(getattr(var, "dtype", None), "size", 4) or 4)
        self.param_count, self.param_bytes = count, size
