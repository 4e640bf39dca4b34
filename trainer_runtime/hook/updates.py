"""The hook's count of optimizer updates outside ``strategy.run`` and Keras' ``fit``.

A ``GradientTape`` loop that calls ``optimizer.apply_gradients`` itself (eagerly or in a
``tf.function``, a whole loop in one included) trains as surely as ``fit``: each update
is a step. Keras' optimizer ``apply`` (keras_patches.patch_optimizer) hands such an
update here: eagerly, ``iterations`` is read when ``apply`` returns; traced, a
``py_function`` after the update in the same graph (so it runs each time the update
does) gets ``iterations`` and a ``tf.timestamp``. An update is a step when the
optimizer's ``iterations`` rose since the last one. Which optimizer sets the steps, and
how the batch's examples and input wait are taken: docs/own-scripts.md's table. While
``strategy.run`` (loops.py counts those) or ``fit`` runs, nothing here acts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer_runtime.flops import step_flops_per_example
from trainer_runtime.hook.patching import graph_state, one_line

if TYPE_CHECKING:
    from trainer_runtime.hook.watching import UpdatesWatch

EAGER = "eager"
TRACED = "tf.function"
_UNKNOWN = -1.0  # an examples count the graph could not take
# Why an update's input wait is not measured: no batch came from a next() the host saw
# (an iterator inside the tf.function, or tensors the script slices itself).
NOT_HOST_FETCHED = ("its batches are not taken with next() in Python: iterate a tf.data "
                    "dataset in Python and hand each batch to the step")


def _recording() -> bool:
    """Whether a GradientTape may be recording here (eagerly, or in the function being
    traced): a forward pass whose gradients an update will apply."""
    try:
        from tensorflow.python.eager import record
    except ImportError:  # no such internal in this TensorFlow: every top-level call counts
        return True
    return bool(record.could_possibly_record())


class PlainUpdates:
    """The updates a script applies itself, outside strategy.run and fit."""

    def __init__(self, watch: UpdatesWatch) -> None:
        self.watch = watch
        self.depth = 0  # inside the counted optimizer's apply (a LossScaleOptimizer's inner)
        self.call_depth = 0  # inside a top-level model call
        self.pace: int | None = None  # id() of the optimizer whose updates are the steps
        self.optimizers: dict[int, str] = {}  # every optimizer seen applying: its name
        self.iterations: dict[int, int] = {}  # each one's iterations at its last update
        # Another optimizer's last update, held until the next (_updated).
        self.held: tuple[int, tuple[int, float, int | None, float | None]] | None = None
        self.last_end: float | None = None
        self.first_seen: float | None = None  # the first update's apply began (host)
        self.batch: int | None = None  # eagerly: the last top-level model call's batch
        self.wait_s = 0.0  # the host's time in next() since the last update
        self.step_graph: Any = None  # the traced update's function graph (its FLOPs)
        self.flops_counted = False
        self.waited = False

    def watching(self) -> bool:
        watch = self.watch
        return (watch.tf is not None and watch.keras_depth == 0 and watch.run_depth == 0
                and not watch.stopped and watch.own_process)

    # -- the batch and its wait ----------------------------------------------------------

    def model_call(self, original: Callable[..., Any], model: Any, *args: Any,
                   **kwargs: Any) -> Any:
        if self.call_depth or not self.watching():
            return original(model, *args, **kwargs)
        if self.first_seen is None:
            self.first_seen = time.time()
        self.call_depth += 1
        try:
            out = original(model, *args, **kwargs)
        finally:
            self.call_depth -= 1
        try:
            # A training call's batch: one under a GradientTape (training=False there too:
            # a frozen BatchNorm's fine-tuning). An evaluation between updates, outside
            # any tape (the tutorial's test step, a validation batch of another size), is
            # not the update's batch.
            if _recording():
                self._note_batch(args[0] if args else kwargs.get("inputs"))
        except Exception:
            pass  # no examples known for this update: it is still counted
        return out

    def _note_batch(self, inputs: Any) -> None:
        tf = self.watch.tf
        for part in tf.nest.flatten(inputs):
            if tf.is_tensor(part) and part.shape.rank:
                if tf.executing_eagerly():
                    self.batch = int(tf.shape(part)[0])
                else:
                    graph = tf.compat.v1.get_default_graph()
                    graph_state(graph)["batch"] = tf.shape(part, out_type=tf.int64)[0]
                return
            if hasattr(part, "shape") and len(getattr(part, "shape", ())) and \
                    tf.executing_eagerly():
                self.batch = int(part.shape[0])  # a NumPy batch
                return

    def iterator_next(self, original: Callable[..., Any], iterator: Any) -> Any:
        """next() on a tf.data iterator, eagerly: the host waits for the batch here."""
        if not self.watching():
            return original(iterator)
        if self.first_seen is None:
            self.first_seen = time.time()
        t0 = time.perf_counter()
        try:
            return original(iterator)
        finally:
            self.wait_s += time.perf_counter() - t0
            self.waited = True

    def host_wait(self) -> float | None:
        """The host's wait for batches since the last update (ms), and it starts over;
        None if no batch was taken by next() on the host since (eager loops of the
        distributed iterator count here too: loops.py times them)."""
        loops = self.watch.loops
        waited = self.waited or loops.eager_fetch_start is not None
        wait_s = self.wait_s + loops.eager_wait_s
        self.wait_s, self.waited = 0.0, False
        loops.eager_wait_s, loops.eager_fetch_start = 0.0, None
        return wait_s * 1000.0 if waited else None

    # -- the update ----------------------------------------------------------------------

    def apply(self, original: Callable[..., Any], optimizer: Any, *args: Any,
              **kwargs: Any) -> Any:
        if self.depth or not self.watching():
            return original(optimizer, *args, **kwargs)
        if self.first_seen is None:
            self.first_seen = time.time()
        self.depth += 1
        try:
            out = original(optimizer, *args, **kwargs)
        finally:
            self.depth -= 1
        try:
            self._after(optimizer)
        except Exception as exc:
            self.watch.message = f"an update could not be counted: {one_line(exc)}"
            self.watch.send_hook()
        return out

    def _after(self, optimizer: Any) -> None:
        tf = self.watch.tf
        key = id(optimizer)
        name = str(getattr(optimizer, "name", "") or type(optimizer).__name__)
        if tf.executing_eagerly():
            wait_ms = self.host_wait()
            examples, self.batch = self.batch, None
            self._updated(key, name, int(optimizer.iterations.numpy()), time.time(),
                          examples, wait_ms, eager=True)
            return
        graph: Any = tf.compat.v1.get_default_graph()
        batch = None
        while graph is not None and batch is None:  # a cond branch: the step's graph
            batch = graph_state(graph).get("batch")
            graph = getattr(graph, "outer_graph", None)
        examples = tf.cast(batch, tf.float64) if batch is not None else \
            tf.constant(_UNKNOWN, tf.float64)
        iterations = tf.cast(tf.identity(optimizer.iterations), tf.float64)
        with tf.control_dependencies([iterations]):
            t_end = tf.timestamp()
        if self.step_graph is None:  # the traced function's own (a branch's or body's outer)
            outer = tf.compat.v1.get_default_graph()
            while hasattr(getattr(outer, "outer_graph", None), "outer_graph"):
                outer = outer.outer_graph
            self.step_graph = outer

        def on_update(iterations: Any, t_end: Any, examples: Any) -> None:
            count = float(examples)
            self._updated(key, name, int(float(iterations)), float(t_end),
                          int(count) if count >= 0 else None, self.host_wait(), eager=False)

        tf.py_function(on_update, [iterations, t_end, examples], Tout=[])

    def _updated(self, key: int, name: str, iterations: int, end: float,
                 examples: int | None, wait_ms: float | None, *, eager: bool) -> None:
        """An optimizer's update ran. The pace-setting optimizer's is a step; another's is
        held: if that optimizer applies again before the pace-setter does, it trains on
        alone (a new phase, a new optimizer) and sets the pace from its held update on;
        else it was the same step's second optimizer (a GAN's) and is not a step."""
        watch = self.watch
        with watch.lock:
            seen = self.iterations.get(key)
            if seen is not None and iterations <= seen:
                return  # no update happened (a loss-scale skip): no step
            self.iterations[key] = iterations
            self.optimizers.setdefault(key, name)
            if self.pace is None:
                self.pace = key
                watch.note_strategy(watch.tf.distribute.get_strategy())
            update = (iterations, end, examples, wait_ms)
            if key != self.pace:
                if self.held is None or self.held[0] != key:
                    self.held = (key, update)
                    return
                self.pace, held = key, self.held[1]
                self.held = None
                self._step(held, eager)
            else:
                self.held = None
            self._step(update, eager)
        if watch.stopped:  # max_steps: the script ends here, as a custom loop's does
            watch.loops.end_loop(eager=eager)

    def _step(self, update: tuple[int, float, int | None, float | None], eager: bool) -> None:
        iterations, end, examples, wait_ms = update
        watch = self.watch
        watch.set_loop(self._loop(eager), "" if wait_ms is not None else NOT_HOST_FETCHED)
        watch.loops.flush_pending()
        if not watch.hello_sent:
            # The steps go on from the optimizer's own count (a restored one's too).
            watch.step = max(watch.step, iterations - 1)
        if not eager and self.step_graph is not None and not self.flops_counted:
            self.flops_counted = True  # the traced update's, before its first step is sent
            watch.flops_per_example = step_flops_per_example(
                self.step_graph, examples or 0, 1, "the script's update")
        begun = self.last_end if self.last_end is not None else self.first_seen
        self.last_end = end
        watch.report(step_time_ms=max(0.0, (end - (begun or end)) * 1000.0),
                     input_wait_ms=wait_ms, examples=examples or 0, loss=None, lr=None,
                     end=end, epoch=None)

    # -- what the hook says --------------------------------------------------------------

    def _loop(self, eager: bool) -> str:
        """What the hook says it watches: whose updates are the steps, and how."""
        count = len(self.optimizers)
        name = self.optimizers.get(self.pace or 0, "optimizer")
        also = f"; {count} optimizers seen, its updates are the steps" if count > 1 else ""
        return f"{name} updates ({EAGER if eager else TRACED}{also})"
