"""Watching a person's own TensorFlow script from inside it (`gpuwatch run -- python x.py`).

sitecustomize.py calls start() at interpreter start-up. Nothing here imports
TensorFlow: a finder on sys.meta_path waits until the script imports it (and Keras'
TensorFlow trainer), then patches, on the classes, only what a training loop goes
through, and sends the runtime's own frames (hello, step, done; and ``hook``: what
is watched, or why not) over the telemetry fd:

- Keras 3 ``fit`` (TESTED_KERAS): the train function Keras would build, built here
  the same way (strategy.run of the model's own train_step, Keras' reduction, the
  same steps per execution, the same jit setting) with host stamps in the graph
  around each batch's fetch and after each step, and the loss tracker's sums read
  after each step: the loss *of that batch* (Keras' logs hold the epoch's running
  mean), its examples, its input wait and its time. Outside that range: a per-batch
  callback, and the screen says input wait is not measurable.
- Custom loops: ``strategy.run`` of a replica function that applies gradients is a
  training step. Inside a tf.function, stamps around the distributed iterator's
  ``get_next`` and after the step go to the host through a py_function; eagerly,
  the host times ``next`` itself. The loss is the script's own
  ``strategy.reduce`` of that step's result, when it makes one.
- ``data.prefetch`` (`p` in the dashboard): ``prefetch`` is added to the dataset the
  script hands to ``experimental_distribute_dataset`` / ``distribute_datasets_from_function``
  (which ``fit`` calls too).

Nothing here changes what the script computes; every patch falls back to the
original call if anything of its own fails, and the hook event says so.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from trainer_runtime import protocol
from trainer_runtime.telemetry import NullEmitter, SocketEmitter

# Keras versions whose TensorFlow trainer builds its train function as watched here
# (``TensorFlowTrainer._make_function``: an inner tf.function of strategy.run and an
# outer one over the iterator; keras-team/keras v3.7 to v3.15).
TESTED_KERAS = ((3, 7), (3, 15))
KERAS_TRAINER = "keras.src.backend.tensorflow.trainer"
KERAS_OPTIMIZER = "keras.src.optimizers.base_optimizer"
# Why input wait is not measured when the script turned on op determinism.
DETERMINISM = ("op determinism is on (tf.config.experimental.enable_op_determinism): "
               "TensorFlow refuses timestamps in the graph")

_watch: Watch | None = None


def start(fd: str | None, settings_json: str | None) -> None:
    """Called once by sitecustomize; never raises."""
    global _watch
    try:
        settings = json.loads(settings_json or "{}")
        emitter: Any = NullEmitter()
        if fd is not None:
            os.set_inheritable(int(fd), False)  # the script's own subprocesses do not get it
            emitter = SocketEmitter.from_fd(int(fd))
        _watch = Watch(settings, emitter)
        _watch.install()
    except BaseException as exc:
        print(f"gpuwatch: the hook is off: {type(exc).__name__}: {exc}", file=sys.stderr)


def _deterministic() -> bool:
    """Whether the script turned on op determinism (tf.timestamp then fails at run time)."""
    from tensorflow.python.framework import config

    return bool(config.is_op_determinism_enabled())


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def _keras_version(text: str) -> tuple[int, int] | None:
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a named module has executed (its first import)."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.callbacks = callbacks
        self._busy: set[str] = set()

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name not in self.callbacks or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            return None
        finally:
            self._busy.discard(name)
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        callback = self.callbacks.pop(name)
        run_module = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            callback(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


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
        # Hook state, as the hook event says it.
        self.tensorflow = False
        self.keras_version = ""
        self.loop = ""
        self.input_wait = ""
        self.strategy = ""
        self.message = "waiting for the script to import TensorFlow"
        # Steps.
        self.step = 0
        self.position = 0
        self.epoch = 0
        self.hello_sent = False
        self.param_count = 0
        self.param_bytes = 0
        self.stopped = False  # max_steps reached
        self.keras_depth = 0  # inside Keras' fit/evaluate/predict: strategy-level patches stand by
        self.applies = 0  # optimizer applications traced or run so far (custom loops)
        self.last_end: float | None = None  # when the last step ended (time.time())
        self.eager_wait_s = 0.0  # eager loops: time in `next` since the last step
        self.eager_fetch_start: float | None = None  # when the step's first `next` began
        self.run_start: float | None = None  # when the last strategy.run began
        self.eager_wait_seen = False
        self.pending: dict[str, Any] | None = None  # a custom-loop step waiting for its loss
        self.tf: Any = None
        # What ends the script's training at max_steps: fit sets one (stop_training); a
        # custom loop's step ends the process (_end_loop).
        self.on_max_steps: Callable[[], None] | None = None

    # -- wiring ----------------------------------------------------------------------

    def install(self) -> None:
        sys.meta_path.insert(0, _AfterImport({
            "tensorflow": self._guard(self.on_tensorflow, "TensorFlow"),
            KERAS_TRAINER: self._guard(self.on_keras_trainer, "Keras' trainer"),
            KERAS_OPTIMIZER: self._guard(self.on_keras_optimizer, "Keras' optimizer"),
        }))
        atexit.register(self.at_exit)
        self.send_hook()

    def _guard(self, patch: Callable[[ModuleType], None], what: str
               ) -> Callable[[ModuleType], None]:
        def guarded(module: ModuleType) -> None:
            try:
                patch(module)
            except Exception as exc:
                self.message = f"could not instrument {what}: {_one_line(exc)}"
                self.send_hook()
        return guarded

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
        try:
            self.flush_pending()
            if not self.stopped:
                self.emit(protocol.Done(attempt=self.attempt, reason="exited", step=self.step,
                                        worker=self.worker))
            self.emitter.close(2.0)
        except Exception:
            pass

    # -- TensorFlow ----------------------------------------------------------------

    def on_tensorflow(self, tf: ModuleType) -> None:
        from tensorflow.python.distribute import distribute_lib, input_lib

        self.tf = tf
        self.tensorflow = True
        self.message = "TensorFlow imported: no training loop seen yet"
        strategy_cls = distribute_lib.StrategyBase
        _wrap(strategy_cls, "run", self._run)
        _wrap(strategy_cls, "reduce", self._reduce)
        _wrap(strategy_cls, "experimental_distribute_dataset", self._distribute_dataset)
        _wrap(strategy_cls, "distribute_datasets_from_function", self._distribute_from_function)
        iterator_cls = input_lib.DistributedIteratorBase
        _wrap(iterator_cls, "get_next", self._get_next)
        _wrap(iterator_cls, "get_next_as_optional", self._get_next)
        self.send_hook()

    def _prefetched(self, dataset: Any) -> Any:
        if self.prefetch in (False, None) or self.tf is None:
            return dataset
        size = self.prefetch if isinstance(self.prefetch, int) and self.prefetch is not True \
            else self.tf.data.AUTOTUNE
        return dataset.prefetch(size)

    def _distribute_dataset(self, original: Callable[..., Any], strategy: Any, dataset: Any,
                            *args: Any, **kwargs: Any) -> Any:
        try:
            dataset = self._prefetched(dataset)
        except Exception as exc:
            self.message = f"prefetch not added: {_one_line(exc)}"
            self.send_hook()
        return original(strategy, dataset, *args, **kwargs)

    def _distribute_from_function(self, original: Callable[..., Any], strategy: Any,
                                  dataset_fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.prefetch in (False, None):
            return original(strategy, dataset_fn, *args, **kwargs)

        def with_prefetch(context: Any) -> Any:
            return self._prefetched(dataset_fn(context))

        return original(strategy, with_prefetch, *args, **kwargs)

    # -- custom loops: the iterator, strategy.run, strategy.reduce -------------------

    def _standing_by(self) -> bool:
        return self.keras_depth > 0 or self.stopped or not self.own_process

    def _get_next(self, original: Callable[..., Any], iterator: Any, *args: Any,
                  **kwargs: Any) -> Any:
        tf = self.tf
        if self._standing_by() or tf is None:
            return original(iterator, *args, **kwargs)
        if not tf.executing_eagerly():
            if _deterministic():
                return original(iterator, *args, **kwargs)  # no stamps: TensorFlow refuses them
            graph = tf.compat.v1.get_default_graph()
            t0 = tf.timestamp()
            with tf.control_dependencies([t0]):
                out = original(iterator, *args, **kwargs)
            flat = [x for x in tf.nest.flatten(out, expand_composites=True) if tf.is_tensor(x)]
            with tf.control_dependencies(flat):
                t1 = tf.timestamp()
            _graph_state(graph)["fetch"] = (t0, t1)
            return out
        t0 = time.perf_counter()
        if self.eager_fetch_start is None:
            self.eager_fetch_start = time.time()
        try:
            return original(iterator, *args, **kwargs)
        finally:
            self.eager_wait_s += time.perf_counter() - t0
            self.eager_wait_seen = True

    def _run(self, original: Callable[..., Any], strategy: Any, fn: Any, *args: Any,
             **kwargs: Any) -> Any:
        tf = self.tf
        if self._standing_by() or tf is None:
            return original(strategy, fn, *args, **kwargs)
        applied = self.applies
        self.run_start = time.time()
        if not tf.executing_eagerly() and not _deterministic():
            # When the step began, if no fetch is timed in this graph (no deps: it runs
            # as the traced function starts).
            _graph_state(tf.compat.v1.get_default_graph())["run_start"] = tf.timestamp()
        out = original(strategy, fn, *args, **kwargs)
        if self.applies == applied:
            return out  # no gradients applied: an evaluation, not a training step
        try:
            self._note_strategy(strategy)
            call_args = args[0] if args else kwargs.get("args", ())
            if tf.executing_eagerly():
                self._eager_step(strategy, out, call_args)
            else:
                self._graph_step(strategy, out, call_args)
        except Exception as exc:
            self.message = f"a step could not be measured: {_one_line(exc)}"
            self.send_hook()
        return out

    def _examples(self, strategy: Any, call_args: Any) -> Any:
        """The batch's examples (the leading size of the first tensor of the step's
        arguments, summed over the local replicas), or None."""
        tf = self.tf
        for part in tf.nest.flatten(call_args):
            locals_ = strategy.experimental_local_results(part)
            if locals_ and all(tf.is_tensor(x) and x.shape.rank for x in locals_):
                return tf.add_n([tf.shape(x, out_type=tf.int64)[0] for x in locals_])
        return None

    def _graph_step(self, strategy: Any, out: Any, call_args: Any) -> None:
        tf = self.tf
        graph = tf.compat.v1.get_default_graph()
        state = _graph_state(graph)
        fetch = state.pop("fetch", None)
        run_start = state.pop("run_start", None)
        loop = "strategy.run (tf.function)"
        deterministic = _deterministic()
        self.set_loop(loop, "" if fetch is not None else DETERMINISM if deterministic else
                      "the step's batch does not come from next() on a distributed "
                      "iterator inside the tf.function")
        flat = [x for x in tf.nest.flatten(out, expand_composites=True) if tf.is_tensor(x)]
        examples = self._examples(strategy, call_args)
        if deterministic:  # the step's end as the host sees it, when its results are ready
            with tf.control_dependencies(flat):
                count = (tf.cast(examples, tf.float64) if examples is not None
                         else tf.constant(-1.0, tf.float64))
                tf.py_function(self._on_graph_step_host, [count], Tout=[])
            return
        with tf.control_dependencies(flat):
            t_end = tf.timestamp()
        values = [t_end,
                  fetch[0] if fetch else tf.constant(-1.0, tf.float64),
                  fetch[1] if fetch else tf.constant(-1.0, tf.float64),
                  fetch[0] if fetch else run_start if run_start is not None
                  else tf.constant(-1.0, tf.float64),
                  tf.cast(examples, tf.float64) if examples is not None
                  else tf.constant(-1.0, tf.float64)]
        tf.py_function(self._on_graph_step, values, Tout=[])
        state["step_end"] = t_end

    def _on_graph_step_host(self, examples: Any) -> None:
        count = int(float(examples)) if float(examples) >= 0 else 0
        self._step_ended(time.time(), None, count, eager=False, start=None)

    def _on_graph_step(self, t_end: Any, t0: Any, t1: Any, began: Any, examples: Any
                       ) -> None:
        end = float(t_end)
        wait_ms = (float(t1) - float(t0)) * 1000.0 if float(t0) >= 0 else None
        count = int(float(examples)) if float(examples) >= 0 else 0
        self._step_ended(end, wait_ms, count, eager=False,
                         start=float(began) if float(began) >= 0 else None)

    def _eager_step(self, strategy: Any, out: Any, call_args: Any) -> None:
        self.set_loop("strategy.run (eager)", "" if self.eager_wait_seen else
                      "the loop does not take its batches with next() on a distributed "
                      "iterator")
        examples = self._examples(strategy, call_args)
        wait_ms = self.eager_wait_s * 1000.0 if self.eager_wait_seen else None
        self.eager_wait_s = 0.0
        start, self.eager_fetch_start = self.eager_fetch_start or self.run_start, None
        self._step_ended(time.time(), wait_ms, int(examples) if examples is not None else 0,
                         eager=True, start=start)

    def _reduce(self, original: Callable[..., Any], strategy: Any, *args: Any,
                **kwargs: Any) -> Any:
        out = original(strategy, *args, **kwargs)
        tf = self.tf
        if self._standing_by() or tf is None:
            return out
        try:
            if not (tf.is_tensor(out) and out.shape.rank == 0 and out.dtype.is_floating):
                return out
            if tf.executing_eagerly():
                if self.pending is not None and self.pending.get("loss") is None:
                    self.pending["loss"] = float(out)
                    self.flush_pending()
            else:
                state = _graph_state(tf.compat.v1.get_default_graph())
                step_end = state.pop("step_end", None)
                if step_end is not None:  # this step's loss, after its stamps
                    tf.py_function(self._on_graph_loss, [tf.cast(out, tf.float64), step_end],
                                   Tout=[])
        except Exception as exc:
            self.message = f"the loss could not be read: {_one_line(exc)}"
            self.send_hook()
        return out

    def _on_graph_loss(self, loss: Any, _step_end: Any) -> None:
        if self.pending is not None and self.pending.get("loss") is None:
            self.pending["loss"] = float(loss)
            self.flush_pending()

    def _step_ended(self, end: float, wait_ms: float | None, examples: int, *,
                    eager: bool, start: float | None) -> None:
        """A step has ended; start: when it began (its fetch), for the loop's first step
        (the others begin where the one before ended: the loop's own host time counts)."""
        with self.lock:
            self.flush_pending()
            begun = self.last_end if self.last_end is not None else start
            self.last_end = end
            # A first step with no start known (op determinism) is not timed, nor sent.
            self.pending = {"end": end,
                            "time_ms": None if begun is None else (end - begun) * 1000.0,
                            "wait_ms": wait_ms, "examples": examples, "loss": None,
                            "eager": eager}

    def flush_pending(self) -> None:
        """Send the custom loop's step that waits for its loss (it has it, or the next
        step started, or the script ends)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        if pending["time_ms"] is None:
            return  # a first step with no start known (op determinism): not sent
        self.report(step_time_ms=max(0.0, pending["time_ms"]), input_wait_ms=pending["wait_ms"],
                    examples=pending["examples"], loss=pending["loss"], lr=None,
                    end=pending["end"])
        if self.stopped:
            self._end_loop(eager=pending["eager"])

    def _end_loop(self, *, eager: bool) -> None:
        """A custom loop reached max_steps: end the script. Eagerly, as sys.exit(0) from
        the step would (its finally blocks and atexit run); from inside a traced step
        there is no way back to the script, so the process exits at once (exit 0)."""
        self.emitter.close(2.0)
        if eager:
            raise SystemExit(0)
        os._exit(0)

    # -- what every loop reports -----------------------------------------------------

    def _note_strategy(self, strategy: Any) -> None:
        if not self.strategy:
            self.strategy = type(strategy).__name__
            self._strategy_obj = strategy

    def report(self, *, step_time_ms: float, input_wait_ms: float | None, examples: int,
               loss: float | None, lr: float | None, end: float) -> None:
        if self.stopped:
            return
        if not self.hello_sent:
            self.send_hello(examples)
        self.step += 1
        self.position += examples
        finite = loss is not None and loss == loss and abs(loss) != float("inf")
        self.emit(protocol.Step(
            attempt=self.attempt, step=self.step, micro_step=self.step, epoch=self.epoch,
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
        strategy = getattr(self, "_strategy_obj", None) or tf.distribute.get_strategy()
        replicas = int(strategy.num_replicas_in_sync)
        try:
            devices = [str(d) for d in strategy.extended.worker_devices]
        except Exception:
            devices = []
        kind = "gpu" if any("GPU" in d.upper() for d in devices) else "cpu"
        self.emit(protocol.Hello(
            attempt=self.attempt, pid=os.getpid(), tf_version=str(tf.__version__),
            replicas=replicas, device_kind=kind, devices=devices,
            param_count=self.param_count, param_bytes=self.param_bytes,
            global_batch_size=examples, accumulation_steps=1,
            per_replica_batch=examples // max(1, replicas), start_step=0, start_micro_step=0,
            worker=self.worker,
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

    # -- Keras -----------------------------------------------------------------------

    def on_keras_optimizer(self, module: ModuleType) -> None:
        watch = self

        def apply(original: Callable[..., Any], optimizer: Any, grads: Any,
                  trainable_variables: Any = None, *args: Any, **kwargs: Any) -> Any:
            watch.applies += 1
            if trainable_variables is not None and not watch.param_count:
                try:
                    watch.count_params([v for v in trainable_variables])
                except Exception:
                    pass
            return original(optimizer, grads, trainable_variables, *args, **kwargs)

        _wrap(module.BaseOptimizer, "apply", apply)

    def on_keras_trainer(self, module: ModuleType) -> None:
        from keras.src.version import __version__ as keras_version

        self.keras_version = str(keras_version)
        trainer = module.TensorFlowTrainer
        version = _keras_version(self.keras_version)
        tested = (version is not None and TESTED_KERAS[0] <= version <= TESTED_KERAS[1]
                  and hasattr(trainer, "_make_function"))
        watch = self
        from trainer_runtime.hook import fit as fit_hook

        def in_keras(original: Callable[..., Any], model: Any, *args: Any, **kwargs: Any
                     ) -> Any:
            watch.keras_depth += 1
            try:
                return original(model, *args, **kwargs)
            finally:
                watch.keras_depth -= 1

        def fit(original: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                args, kwargs = prepare_fit(model, args, kwargs)
            except Exception as exc:
                model._gpuwatch_graphed = False
                watch.set_loop("fit", "not measured", f"fit not watched: {_one_line(exc)}")
                return in_keras(original, model, *args, **kwargs)
            stop = watch.on_max_steps
            watch.on_max_steps = lambda: setattr(model, "stop_training", True)
            watch.flush_pending()
            try:
                return in_keras(original, model, *args, **kwargs)
            finally:
                watch.on_max_steps = stop

        def prepare_fit(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            watch._note_strategy(model.distribute_strategy)
            watch.count_params(model.trainable_weights)
            graphed = tested and not _deterministic()
            model._gpuwatch_graphed = graphed
            if graphed:
                watch.set_loop("fit")
            else:
                why = DETERMINISM if tested else (
                    f"Keras {watch.keras_version} is outside the tested "
                    f"{TESTED_KERAS[0][0]}.{TESTED_KERAS[0][1]} to "
                    f"{TESTED_KERAS[1][0]}.{TESTED_KERAS[1][1]}")
                watch.set_loop("fit (callback)", f"{why}: steps come from a per-batch callback")
                args, kwargs = fit_hook.with_callback(watch, model, args, kwargs)
            return args, kwargs

        _wrap(trainer, "fit", fit)
        _wrap(trainer, "evaluate", in_keras)
        _wrap(trainer, "predict", in_keras)
        if tested:
            def make_train_function(original: Callable[..., Any], model: Any,
                                    force: bool = False) -> Any:
                if model.train_function is not None and not force:
                    return model.train_function
                if (watch.keras_depth == 0 or watch.stopped  # train_on_batch: Keras' own
                        or not getattr(model, "_gpuwatch_graphed", False)):
                    return original(model, force)
                try:
                    model.train_function = fit_hook.train_function(watch, model)
                except Exception as exc:
                    watch.set_loop("fit", "not measured: " + _one_line(exc))
                    return original(model, force)
                return model.train_function

            _wrap(trainer, "make_train_function", make_train_function)
        self.send_hook()


_GRAPH_STATE: dict[int, dict[str, Any]] = {}


def _graph_state(graph: Any) -> dict[str, Any]:
    """What a traced step leaves for the next patch in the same graph (its fetch stamps,
    its end stamp)."""
    return _GRAPH_STATE.setdefault(id(graph), {})


def _wrap(owner: type, name: str, wrapper: Callable[..., Any]) -> None:
    """owner.name = a method that calls wrapper(original, self, *args, **kwargs)."""
    original = owner.__dict__.get(name) or getattr(owner, name)
    if getattr(original, "__gpuwatch__", False):
        return

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, self, *args, **kwargs)

    method.__name__ = getattr(original, "__name__", name)
    method.__qualname__ = getattr(original, "__qualname__", name)
    method.__doc__ = getattr(original, "__doc__", None)
    method.__wrapped__ = original  # type: ignore[attr-defined]
    method.__gpuwatch__ = True  # type: ignore[attr-defined]
    setattr(owner, name, method)
