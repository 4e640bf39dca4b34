"""FLOPs per example of one training update, counted from its traced graph.

Every multiply-add of the dense linear algebra in the traced update (matmuls,
convolutions and their backprops, two-operand einsums), forward and backward alike, at
2 FLOPs each; elementwise ops, reductions and the all-reduce are left out, as model FLOPs
utilisation (MFU, the figure this feeds) is defined over the matmul FLOPs (PaLM,
appendix B). Function calls, loop bodies and branches are followed, and only ops that
run are counted. Per example is the counted FLOPs over the examples the same graph
reads. An op of a counted kind without static shapes makes the figure ``None``, never an
understated one, and ``update_flops_per_example`` never raises. Each op's formula and
the walk's rules: docs/internals.md, "Steps and counters".
"""

from __future__ import annotations

import contextvars
import logging
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("trainer_runtime")

_MATMULS = frozenset({"MatMul", "_FusedMatMul", "BatchMatMul", "BatchMatMulV2",
                      "BatchMatMulV3"})
# Conv op -> (input index of the forward output's gradient, or -1: the op's own
# output is the forward output; where the filter's shape is: input index, or -1: output).
_CONVS: dict[str, tuple[int, int]] = {
    "Conv2D": (-1, 1),
    "_FusedConv2D": (-1, 1),
    "Conv3D": (-1, 1),
    "Conv2DBackpropInput": (2, 1),
    "Conv3DBackpropInputV2": (2, 1),
    "Conv2DBackpropFilter": (2, -1),
    "Conv3DBackpropFilterV2": (2, -1),
}
_DEPTHWISE: dict[str, tuple[int, int]] = {
    "DepthwiseConv2dNative": (-1, 1),
    "DepthwiseConv2dNativeBackpropInput": (2, 1),
    "DepthwiseConv2dNativeBackpropFilter": (2, -1),
}
COUNTED_OPS = _MATMULS | set(_CONVS) | set(_DEPTHWISE) | {"Einsum"}
# Ops that hand the graph a batch from an input iterator (first output: features).
_READS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue",
                    "MultiDeviceIteratorGetNextFromShard"})
_BRANCHING = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})
_LOOPS = frozenset({"While", "StatelessWhile"})


@dataclass(frozen=True, slots=True)
class GraphFlops:
    """FLOPs counted in a graph (functions it calls included) and the examples it reads."""

    flops: float = 0.0
    examples: int = 0  # examples read at a static batch size
    counted_ops: int = 0
    unknown_ops: int = 0  # ops of a counted kind with shapes not static: left out
    unknown_reads: int = 0  # iterator reads whose batch size is not static

    def __add__(self, other: GraphFlops) -> GraphFlops:
        return GraphFlops(self.flops + other.flops, self.examples + other.examples,
                          self.counted_ops + other.counted_ops,
                          self.unknown_ops + other.unknown_ops,
                          self.unknown_reads + other.unknown_reads)

    @property
    def complete(self) -> bool:
        return self.unknown_ops == 0 and self.unknown_reads == 0 and self.examples > 0

    @property
    def per_example(self) -> float | None:
        """FLOPs per example read, or None when the count is not complete."""
        return self.flops / self.examples if self.complete else None


# While a count runs with a batch size given (count_graph's batch): the size of a leading
# dimension the trace left unknown (a dataset batched without drop_remainder, as Keras'
# fit of arrays has it). Any other unknown dimension stays unknown.
_LEADING: contextvars.ContextVar[int | None] = contextvars.ContextVar("leading", default=None)


def _dims(shape: Any) -> list[int] | None:
    """A static shape as ints, or None if its rank or any dimension is unknown (a leading
    one is the batch given to count_graph, if one is)."""
    try:
        dims = shape.as_list()
    except ValueError:  # unknown rank
        return None
    if dims and dims[0] is None:
        dims[0] = _LEADING.get()
    if any(d is None for d in dims):
        return None
    return [int(d) for d in dims]


def _attr(op: Any, name: str, default: Any) -> Any:
    try:
        return op.get_attr(name)
    except (ValueError, KeyError):
        return default


def _matmul_flops(op: Any) -> float | None:
    out = _dims(op.outputs[0].shape)
    a = _dims(op.inputs[0].shape)
    if out is None or a is None or len(a) < 2:
        return None
    if op.type in ("MatMul", "_FusedMatMul"):
        k = a[0] if _attr(op, "transpose_a", False) else a[1]
    else:  # BatchMatMul: [..., m, k] unless adj_x
        k = a[-2] if _attr(op, "adj_x", False) else a[-1]
    return 2.0 * math.prod(out) * k


def _conv_flops(op: Any, where: tuple[int, int], depthwise: bool) -> float | None:
    grad_at, filter_at = where
    forward_out = _dims((op.outputs[0] if grad_at < 0 else op.inputs[grad_at]).shape)
    filt = _dims((op.outputs[0] if filter_at < 0 else op.inputs[filter_at]).shape)
    if forward_out is None or filt is None or len(filt) < 3:
        return None
    # Filter: [spatial..., in_channels (per group), out_channels (or multiplier)].
    per_output = math.prod(filt[:-2]) if depthwise else math.prod(filt[:-1])
    return 2.0 * math.prod(forward_out) * per_output


_EINSUM_TERM = re.compile(r"[^,\->]+|\.\.\.")


def _einsum_flops(op: Any) -> float | None:
    equation = _attr(op, "equation", b"")
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    inputs_part = equation.replace(" ", "").split("->")[0]
    terms = inputs_part.split(",")
    if len(terms) != 2 or len(op.inputs) != 2:
        return 0.0 if len(terms) == 1 else None  # one operand: no multiply-adds
    sizes: dict[str, int] = {}
    ellipsis: list[int] = []
    for term, tensor in zip(terms, op.inputs, strict=True):
        dims = _dims(tensor.shape)
        if dims is None:
            return None
        labels = term.replace("...", "")
        if "..." in term:
            head, _, _ = term.partition("...")
            extra = len(dims) - len(labels)
            ell = dims[len(head):len(head) + extra]
            dims = dims[:len(head)] + dims[len(head) + extra:]
            # Broadcast the ellipsis dimensions (right-aligned).
            width = max(len(ellipsis), len(ell))
            a = [1] * (width - len(ellipsis)) + ellipsis
            b = [1] * (width - len(ell)) + ell
            ellipsis = [max(x, y) for x, y in zip(a, b, strict=True)]
        if len(labels) != len(dims):
            return None
        for label, size in zip(labels, dims, strict=True):
            sizes[label] = max(sizes.get(label, 1), size)
    return 2.0 * math.prod(sizes.values()) * math.prod(ellipsis)


def op_flops(op: Any) -> float | None:
    """FLOPs of one op of a counted kind (0 for any other op); None: shapes not static."""
    kind = op.type
    if kind in _MATMULS:
        return _matmul_flops(op)
    if kind in _CONVS:
        return _conv_flops(op, _CONVS[kind], depthwise=False)
    if kind in _DEPTHWISE:
        return _conv_flops(op, _DEPTHWISE[kind], depthwise=True)
    if kind == "Einsum":
        return _einsum_flops(op)
    return 0.0


def _called_functions(op: Any) -> list[str]:
    """Names of the functions an op calls (call ops, loop bodies, branches)."""
    names: list[str] = []
    for key, value in op.node_def.attr.items():
        if key == "cond":  # a While's condition: a comparison, called once more than its body
            continue
        if value.HasField("func") and value.func.name:
            names.append(value.func.name)
        names.extend(f.name for f in value.list.func)
    return names


def _live_ops(graph: Any) -> list[Any]:
    """The ops that run: those the graph's outputs, control outputs or stateful ops need.

    TensorFlow prunes the rest when it instantiates a function: e.g. the gradient
    tape traces a conv's input gradient for the first layer, which nothing reads.
    A graph with no declared outputs (not a function's) keeps all its ops.
    """
    ops = graph.get_operations()
    outputs = getattr(graph, "outputs", None)
    if outputs is None:
        return list(ops)
    todo = [t.op for t in outputs]
    todo.extend(getattr(graph, "control_outputs", None) or ())
    todo.extend(op for op in ops if op._is_stateful)
    live: set[Any] = set()
    while todo:
        op = todo.pop()
        if op in live or op.graph is not graph:  # a captured outer tensor: not this graph's
            continue
        live.add(op)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return [op for op in ops if op in live]


class _Counter:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.memo: dict[str, GraphFlops] = {}

    def _function_graph(self, name: str, graph: Any) -> Any:
        g = graph
        while g is not None:
            fn = g._get_function(name)  # the graph's function library (no public API)
            if fn is not None:
                return fn.graph
            g = getattr(g, "outer_graph", None)
        fn = self.root._get_function(name)
        if fn is None:
            raise LookupError(f"function {name} is not in the graph's library")
        return fn.graph

    def function(self, name: str, graph: Any) -> GraphFlops:
        found = self.memo.get(name)
        if found is None:
            self.memo[name] = GraphFlops()  # a recursive call counts nothing more
            found = self.memo[name] = self.graph(self._function_graph(name, graph))
        return found

    def graph(self, graph: Any) -> GraphFlops:
        total = GraphFlops()
        for op in _live_ops(graph):
            total = total + self.op(op, graph)
        return total

    def op(self, op: Any, graph: Any) -> GraphFlops:
        kind = op.type
        if kind in COUNTED_OPS:
            flops = op_flops(op)
            if flops is None:
                return GraphFlops(unknown_ops=1)
            return GraphFlops(flops=flops, counted_ops=1)
        if kind in _READS:
            dims = _dims(op.outputs[0].shape) if op.outputs else None
            if not dims:
                return GraphFlops(unknown_reads=1)
            return GraphFlops(examples=dims[0])
        called = _called_functions(op)
        if not called:
            return GraphFlops()
        parts = [self.function(name, graph) for name in called]
        if kind in _BRANCHING:
            # One branch runs: the largest is counted; of branches as large, the one that
            # reads the most (a distributed iterator's partial-batch cond: the branch with
            # the batch against the one without). Never the order the graph lists them in:
            # that order is a map's, and it differed from process to process (a count of
            # half the examples read, so twice the FLOPs per example, one run in three).
            return max(parts, key=lambda p: (p.flops, p.examples + p.unknown_reads,
                                             -p.unknown_ops))
        total = _sum(parts)
        if kind in _LOOPS and total.counted_ops and not (total.examples or total.unknown_reads):
            # A loop that reads no batch (a recurrent layer over time steps, or its
            # gradient): how often its body runs is not known here.
            return GraphFlops(unknown_ops=total.counted_ops + total.unknown_ops)
        return total


def _sum(parts: Iterable[GraphFlops]) -> GraphFlops:
    total = GraphFlops()
    for part in parts:
        total = total + part
    return total


def count_graph(graph: Any, batch: int | None = None) -> GraphFlops:
    """FLOPs and examples read in a (Func)Graph, following the functions it calls; batch:
    the size of every leading dimension the trace left unknown (a batch seen running)."""
    token = _LEADING.set(batch)
    try:
        return _Counter(graph).graph(graph)
    finally:
        _LEADING.reset(token)


def count_concrete(fn: Any, batch: int | None = None) -> GraphFlops:
    """FLOPs and examples read in a traced tf.function's concrete function."""
    return count_graph(fn.graph, batch)


def update_flops_per_example(concrete: Any, what: str = "the update",
                             batch: int | None = None) -> float | None:
    """FLOPs per example of a traced update (forward + backward), or None; never raises.
    batch: as count_graph's. concrete: a concrete function, or a FuncGraph.

    Logs the figure and the time the count took, or why there is none.
    """
    t0 = time.perf_counter()
    try:
        graph = getattr(concrete, "graph", concrete)
        counted = count_graph(graph, batch)
    except Exception as exc:  # a graph this walk does not understand: no figure
        log.warning("FLOPs per example of %s not counted (%s: %s)", what,
                    type(exc).__name__, " ".join(str(exc).split())[:200])
        return None
    ms = (time.perf_counter() - t0) * 1000.0
    figure = counted.per_example
    if figure is None:
        log.info("FLOPs per example of %s not known: %d ops of a counted kind with "
                 "unknown shapes, %d reads of unknown batch size, %d examples read "
                 "(%.3g FLOPs counted in %d ops; %.1f ms)", what, counted.unknown_ops,
                 counted.unknown_reads, counted.examples, counted.flops,
                 counted.counted_ops, ms)
        return None
    log.info("FLOPs per example of %s: %.4g (%d ops over %d examples read; counted in "
             "%.1f ms)", what, figure, counted.counted_ops, counted.examples, ms)
    return figure


def trainer_flops_per_example(trainer: Any) -> float | None:
    """FLOPs per example of a Trainer's update (forward + backward), traced now: the
    loop's first call reuses the trace (UpdateGraph.trace_first).

    None where it cannot be counted; never raises: a trace that fails here fails again,
    with its error, in the first update.
    """
    try:
        concrete = trainer.graph.trace_first(trainer.iterator,
                                             trainer.cfg.train.steps_per_execution)
    except Exception as exc:
        log.warning("FLOPs per example not counted: tracing the update failed (%s)",
                    type(exc).__name__)
        return None
    return update_flops_per_example(concrete)


def step_flops_per_example(graph: Any, examples: int, replicas: int = 1,
                           what: str = "the script's step") -> float | None:
    """FLOPs per example of a person's traced training step (the hook's: a fit train
    function, a strategy.run step, a GradientTape update), seen running with `examples`
    per step over `replicas`; None where it cannot be counted; never raises.

    A leading dimension the trace left unknown is the per-replica batch seen. A graph
    that reads its batches is per example read, as the runtime's update is; one handed
    its batch (no read in it) is one step: its FLOPs over the step's examples."""
    try:
        per_replica = examples // replicas if replicas > 0 and examples % replicas == 0 \
            else None
        counted = count_graph(graph, per_replica)
    except Exception as exc:
        log.warning("FLOPs per example of %s not counted (%s: %s)", what,
                    type(exc).__name__, " ".join(str(exc).split())[:200])
        return None
    if counted.unknown_ops or counted.unknown_reads or not counted.counted_ops:
        return None
    if counted.examples:
        return counted.flops / counted.examples
    return counted.flops / examples if examples > 0 else None
