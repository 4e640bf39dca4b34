"""The hook's patches on tf.distribute: custom training loops, and prefetch.

``strategy.run`` of a replica function that applies gradients is a training step.
Inside a tf.function, stamps around the distributed iterator's ``get_next`` and after
the step go to the host through a py_function; eagerly, the host times ``next``
itself. The loss is the script's own ``strategy.reduce`` of that step's result, when
it makes one: a step waits for it (``pending``) until the next step starts or the
script ends. While Keras' ``fit`` runs (``watch.keras_depth``), these patches stand by.

``data.prefetch`` adds ``prefetch`` to the dataset the script hands to
``experimental_distribute_dataset`` / ``distribute_datasets_from_function`` (which
``fit`` calls too).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer_runtime.flops import step_flops_per_example
from trainer_runtime.hook.patching import (
    DETERMINISM,
    deterministic,
    graph_state,
    one_line,
    wrap,
)

if TYPE_CHECKING:
    from trainer_runtime.hook.watching import LoopsWatch

TRACED = "strategy.run (tf.function)"
EAGER = "strategy.run (eager)"
_NO_STAMP = -1.0  # a stamp or count the graph could not take
# Why a traced step's input wait is not measured: its batch came from neither next() on a
# distributed iterator inside it nor one at the Python level before it.
NOT_FETCHED = ("its batch is not taken with next() on a distributed iterator: iterate "
               "strategy.experimental_distribute_dataset(ds)")


class CustomLoops:
    """The custom-loop side of one watched process: the step it is timing."""

    def __init__(self, watch: LoopsWatch) -> None:
        self.watch = watch
        self.last_end: float | None = None  # when the last step ended (time.time())
        self.eager_wait_s = 0.0  # eager loops: time in `next` since the last step
        self.eager_fetch_start: float | None = None  # when the step's first `next` began
        self.run_start: float | None = None  # when the last strategy.run began
        self.eager_wait_seen = False
        self.pending: dict[str, Any] | None = None  # a step waiting for its loss
        # The first traced step's graph and replicas: its FLOPs are counted as it first
        # runs (its graph is whole then), before that step is sent.
        self.step_graph: tuple[Any, int] | None = None
        self.flops_counted = False
        # autograph's generated modules in the temporary directory: removed at exit by its
        # atexit handlers, which the exit from inside a traced step skips (end_loop).
        self.generated: list[str] = []

    def install(self, tf: Any) -> None:
        from tensorflow.python.distribute import distribute_lib, input_lib

        self._note_generated_files()

        strategy_cls = distribute_lib.StrategyBase
        wrap(strategy_cls, "run", self._run)
        wrap(strategy_cls, "reduce", self._reduce)
        wrap(strategy_cls, "experimental_distribute_dataset", self._distribute_dataset)
        wrap(strategy_cls, "distribute_datasets_from_function", self._distribute_from_function)
        iterator_cls = input_lib.DistributedIteratorBase
        wrap(iterator_cls, "get_next", self._get_next)
        wrap(iterator_cls, "get_next_as_optional", self._get_next)

    # -- prefetch ----------------------------------------------------------------------

    def _prefetched(self, dataset: Any) -> Any:
        prefetch, tf = self.watch.prefetch, self.watch.tf
        if prefetch in (False, None) or tf is None:
            return dataset
        size = prefetch if isinstance(prefetch, int) and prefetch is not True \
            else tf.data.AUTOTUNE
        return dataset.prefetch(size)

    def _distribute_dataset(self, original: Callable[..., Any], strategy: Any, dataset: Any,
                            *args: Any, **kwargs: Any) -> Any:
        try:
            dataset = self._prefetched(dataset)
        except Exception as exc:
            self.watch.message = f"prefetch not added: {one_line(exc)}"
            self.watch.send_hook()
        return original(strategy, dataset, *args, **kwargs)

    def _distribute_from_function(self, original: Callable[..., Any], strategy: Any,
                                  dataset_fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.watch.prefetch in (False, None):
            return original(strategy, dataset_fn, *args, **kwargs)

        def with_prefetch(context: Any) -> Any:
            return self._prefetched(dataset_fn(context))

        return original(strategy, with_prefetch, *args, **kwargs)

    # -- the iterator, strategy.run, strategy.reduce ------------------------------------

    def _standing_by(self) -> bool:
        watch = self.watch
        return watch.keras_depth > 0 or watch.stopped or not watch.own_process

    def _get_next(self, original: Callable[..., Any], iterator: Any, *args: Any,
                  **kwargs: Any) -> Any:
        tf = self.watch.tf
        if self._standing_by() or tf is None:
            return original(iterator, *args, **kwargs)
        if not tf.executing_eagerly():
            if deterministic():
                return original(iterator, *args, **kwargs)  # no stamps: TensorFlow refuses them
            graph = tf.compat.v1.get_default_graph()
            t0 = tf.timestamp()
            with tf.control_dependencies([t0]):
                out = original(iterator, *args, **kwargs)
            flat = [x for x in tf.nest.flatten(out, expand_composites=True) if tf.is_tensor(x)]
            with tf.control_dependencies(flat):
                t1 = tf.timestamp()
            graph_state(graph)["fetch"] = (t0, t1)
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
        # While it runs, the updates its function applies are this step's (updates.py
        # stands by).
        self.watch.run_depth += 1
        try:
            return self._run_step(original, strategy, fn, *args, **kwargs)
        finally:
            self.watch.run_depth -= 1

    def _run_step(self, original: Callable[..., Any], strategy: Any, fn: Any, *args: Any,
                  **kwargs: Any) -> Any:
        watch, tf = self.watch, self.watch.tf
        if self._standing_by() or tf is None:
            return original(strategy, fn, *args, **kwargs)
        applied = watch.applies
        watch.applied_by = None  # the first optimizer this step applies (its count numbers)
        self.run_start = time.time()
        if not tf.executing_eagerly() and not deterministic():
            # When the step began, if no fetch is timed in this graph (no deps: it runs
            # as the traced function starts).
            graph_state(tf.compat.v1.get_default_graph())["run_start"] = tf.timestamp()
        out = original(strategy, fn, *args, **kwargs)
        if watch.applies == applied:
            return out  # no gradients applied: an evaluation, not a training step
        try:
            watch.note_strategy(strategy)
            call_args = args[0] if args else kwargs.get("args", ())
            if tf.executing_eagerly():
                self._eager_step(strategy, out, call_args)
            else:
                self._graph_step(strategy, out, call_args)
        except Exception as exc:
            watch.message = f"a step could not be measured: {one_line(exc)}"
            watch.send_hook()
        return out

    def _examples(self, strategy: Any, call_args: Any) -> Any:
        """The update's examples (the leading size of the first tensor of the step's
        arguments, summed over the local replicas, and over every worker's as the runtime
        counts a cluster's: each worker trains as many), or None."""
        tf = self.watch.tf
        for part in tf.nest.flatten(call_args):
            locals_ = strategy.experimental_local_results(part)
            if locals_ and all(tf.is_tensor(x) and x.shape.rank for x in locals_):
                local = tf.add_n([tf.shape(x, out_type=tf.int64)[0] for x in locals_])
                in_sync = int(strategy.num_replicas_in_sync)
                if in_sync != len(locals_) and in_sync % len(locals_) == 0:
                    local = local * (in_sync // len(locals_))  # workers x this worker's
                return local
        return None

    def _graph_step(self, strategy: Any, out: Any, call_args: Any) -> None:
        tf = self.watch.tf
        state = graph_state(tf.compat.v1.get_default_graph())
        fetch = state.pop("fetch", None)
        run_start = state.pop("run_start", None)
        is_deterministic = deterministic()
        if self.step_graph is None:
            self.step_graph = (tf.compat.v1.get_default_graph(),
                               int(strategy.num_replicas_in_sync))
        if fetch is not None:
            self.watch.set_loop(TRACED)
        # Else the step's runs say (_host_wait): a batch taken with next() at the Python
        # level (`for x in dist_dataset: step(x)`) is timed on the host.
        flat = [x for x in tf.nest.flatten(out, expand_composites=True) if tf.is_tensor(x)]
        examples = self._examples(strategy, call_args)
        none = tf.constant(_NO_STAMP, tf.float64)
        count = tf.cast(examples, tf.float64) if examples is not None else none
        # The optimizer's count after this step's update (read after it: the function
        # orders reads of a variable after the writes traced before them).
        iterations = self._iterations_tensor()
        if is_deterministic:  # the step's end as the host sees it, when its results are ready
            with tf.control_dependencies(flat):
                tf.py_function(self._on_graph_step_host, [count, iterations], Tout=[])
            return
        with tf.control_dependencies(flat):
            t_end = tf.timestamp()
        began = fetch[0] if fetch else run_start if run_start is not None else none
        values = [t_end, fetch[0] if fetch else none, fetch[1] if fetch else none, began,
                  count, iterations]
        tf.py_function(self._on_graph_step, values, Tout=[])
        state["step_end"] = t_end

    def _host_wait(self, *, in_graph: bool) -> tuple[float | None, float | None]:
        """A traced step whose batch was not fetched inside it: the host's time in next()
        on a distributed iterator since the step before (the batch the script took at the
        Python level and passed in), and when that began; (None, None) if it took none,
        and the screen says the wait is not measurable, and why."""
        fetched = self.eager_fetch_start
        wait_s, self.eager_wait_s, self.eager_fetch_start = self.eager_wait_s, 0.0, None
        if fetched is not None:
            self.watch.set_loop(TRACED)
            return wait_s * 1000.0, fetched
        self.watch.set_loop(TRACED, DETERMINISM if in_graph else NOT_FETCHED)
        return None, None

    def _iterations_tensor(self) -> Any:
        """The step's optimizer's iterations, read in the step's graph (float64), or -1."""
        tf = self.watch.tf
        optimizer = self.watch.applied_by
        try:
            return tf.cast(tf.identity(optimizer.iterations), tf.float64)
        except Exception:
            return tf.constant(_NO_STAMP, tf.float64)

    def _eager_iterations(self) -> int | None:
        """The step's optimizer's count, read while the steps' numbers are not yet set (a
        read waits for the device: once, not every step)."""
        if self.watch.hello_sent or self.last_end is not None:
            return None
        try:
            return int(self.watch.applied_by.iterations.numpy())
        except Exception:
            return None

    def _on_graph_step_host(self, examples: Any, iterations: Any) -> None:
        count = int(float(examples)) if float(examples) >= 0 else 0
        wait_ms, _fetched = self._host_wait(in_graph=True)
        self._step_ended(time.time(), wait_ms, count, eager=False, start=None,
                         iterations=_count(iterations))

    def _on_graph_step(self, t_end: Any, t0: Any, t1: Any, began: Any, examples: Any,
                       iterations: Any) -> None:
        end = float(t_end)
        start = float(began) if float(began) >= 0 else None
        if float(t0) >= 0:
            wait_ms: float | None = (float(t1) - float(t0)) * 1000.0
        else:
            wait_ms, fetched = self._host_wait(in_graph=False)
            start = fetched if fetched is not None else start
        count = int(float(examples)) if float(examples) >= 0 else 0
        self._step_ended(end, wait_ms, count, eager=False, start=start,
                         iterations=_count(iterations))

    def _eager_step(self, strategy: Any, out: Any, call_args: Any) -> None:
        self.watch.set_loop(EAGER, "" if self.eager_wait_seen else NOT_FETCHED)
        examples = self._examples(strategy, call_args)
        wait_ms = self.eager_wait_s * 1000.0 if self.eager_wait_seen else None
        self.eager_wait_s = 0.0
        start, self.eager_fetch_start = self.eager_fetch_start or self.run_start, None
        self._step_ended(time.time(), wait_ms, int(examples) if examples is not None else 0,
                         eager=True, start=start, iterations=self._eager_iterations())

    def _reduce(self, original: Callable[..., Any], strategy: Any, *args: Any,
                **kwargs: Any) -> Any:
        out = original(strategy, *args, **kwargs)
        tf = self.watch.tf
        if self._standing_by() or tf is None:
            return out
        try:
            if not (tf.is_tensor(out) and out.shape.rank == 0 and out.dtype.is_floating):
                return out
            if tf.executing_eagerly():
                self._loss(float(out))
            else:
                state = graph_state(tf.compat.v1.get_default_graph())
                step_end = state.pop("step_end", None)
                if step_end is not None:  # this step's loss, after its stamps
                    tf.py_function(self._on_graph_loss, [tf.cast(out, tf.float64), step_end],
                                   Tout=[])
        except Exception as exc:
            self.watch.message = f"the loss could not be read: {one_line(exc)}"
            self.watch.send_hook()
        return out

    def _on_graph_loss(self, loss: Any, _step_end: Any) -> None:
        self._loss(float(loss))

    def _loss(self, loss: float) -> None:
        if self.pending is not None and self.pending.get("loss") is None:
            self.pending["loss"] = loss
            self.flush_pending()

    # -- steps -------------------------------------------------------------------------

    def _step_ended(self, end: float, wait_ms: float | None, examples: int, *,
                    eager: bool, start: float | None, iterations: int | None = None) -> None:
        """A step has ended; start: when it began (its fetch), for the loop's first step
        (the others begin where the one before ended: the loop's own host time counts);
        iterations: its optimizer's count after it, from which the steps go on (a
        restored optimizer's), as a GradientTape loop's and fit's do."""
        if not eager and not self.flops_counted and self.step_graph is not None:
            self.flops_counted = True
            graph, replicas = self.step_graph
            self.watch.flops_per_example = step_flops_per_example(
                graph, examples, replicas, "the strategy.run step")
        with self.watch.lock:
            self.flush_pending()
            begun = self.last_end if self.last_end is not None else start
            self.last_end = end
            # A first step with no start known (op determinism) is not timed, nor sent.
            self.pending = {"end": end,
                            "time_ms": None if begun is None else (end - begun) * 1000.0,
                            "wait_ms": wait_ms, "examples": examples, "loss": None,
                            "eager": eager, "iterations": iterations}

    def flush_pending(self) -> None:
        """Send the step that waits for its loss (it has it, or the next step started, or
        the script ends)."""
        pending, self.pending = self.pending, None
        if pending is None or pending["time_ms"] is None:
            return  # nothing waits, or a first step with no start known: not sent
        watch = self.watch
        if not watch.hello_sent and pending["iterations"] is not None:
            # The first step sent: the steps go on from its optimizer's count before it.
            watch.step = max(watch.step, pending["iterations"] - 1)
        watch.report(step_time_ms=max(0.0, pending["time_ms"]),
                     input_wait_ms=pending["wait_ms"], examples=pending["examples"],
                     loss=pending["loss"], lr=None, end=pending["end"], epoch=None)
        if watch.stopped:
            self.end_loop(eager=pending["eager"])

    def end_loop(self, *, eager: bool) -> None:
        """The loop reached max_steps: end the script. Eagerly, as sys.exit(0) from the
        step would (its finally blocks and atexit run); from inside a traced step there is
        no way back to the script, so the process exits at once (exit 0), removing the
        files autograph's skipped atexit handlers would have."""
        self.watch.emitter.close(2.0)
        if eager:
            raise SystemExit(0)
        self.remove_generated()
        os._exit(0)

    def remove_generated(self) -> None:
        """Remove autograph's generated modules and the bytecode Python cached for them
        (which autograph never removes: /tmp/__pycache__ kept every script's), and that
        __pycache__ if nothing else is left in it."""
        caches = set()
        for path in self.generated:
            with contextlib.suppress(OSError):
                os.remove(path)
            with contextlib.suppress(ValueError, NotImplementedError, OSError):
                cached = importlib.util.cache_from_source(path)
                os.remove(cached)
                caches.add(os.path.dirname(cached))
        for folder in caches:
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only if empty
        self.generated.clear()

    def _note_generated_files(self) -> None:
        """Keep the names of the modules autograph writes to the temporary directory
        (tensorflow.python.autograph.pyct.loader.load_source, which its own load_ast calls
        by name). Where that private function is not there, nothing is kept."""
        try:
            from tensorflow.python.autograph.pyct import loader
        except ImportError:
            return
        original = getattr(loader, "load_source", None)
        if not callable(original):
            return
        generated = self.generated

        def load_source(source: Any, delete_on_exit: bool) -> Any:
            module, file_name = original(source, delete_on_exit)
            if delete_on_exit:
                generated.append(file_name)
            return module, file_name

        loader.load_source = load_source


def _count(value: Any) -> int | None:
    """A count a step's graph read (float64), or None where it could not (-1)."""
    number = float(value)
    return int(number) if number >= 0 else None
