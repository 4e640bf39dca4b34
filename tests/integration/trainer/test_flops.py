"""FLOPs per example counted in the traced update, against hand counts of the models.

The hand counts here are derived from the layer sizes alone, at 2 FLOPs per
multiply-add, forward and backward:

- a Dense layer of in -> out units: forward 2*in*out per example; backward 2*in*out
  for the weight gradient and 2*in*out for the input gradient;
- a Conv2D of C_in -> C_out channels, K_h x K_w kernel, H_out x W_out output:
  forward 2*H_out*W_out*K_h*K_w*C_in*C_out per example; the filter gradient and the
  input gradient cost as much each.

The first layer's input gradient is never computed: nothing needs the gradient of
the data. For a Dense layer TensorFlow's MatMul gradient does not even trace it;
for a Conv2D the tape traces a Conv2DBackpropInput that nothing reads, which
TensorFlow prunes when it runs the function, and the count leaves it out too.
So the first layer costs 2x its forward, every other layer 3x.
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.trainer.conftest import make_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


def dense_stack_flops(sizes: list[int]) -> float:
    """Hand count per example for Dense layers sizes[0] -> sizes[1] -> ... -> sizes[-1]."""
    total = 0.0
    for index, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        forward = 2.0 * n_in * n_out
        total += forward * (2 if index == 0 else 3)
    return total


def conv_forward_flops(h_out: int, w_out: int, k: int, c_in: int, c_out: int) -> float:
    return 2.0 * h_out * w_out * k * k * c_in * c_out


def _counted(trainer: Any) -> float | None:
    from trainer_runtime.flops import trainer_flops_per_example

    return trainer_flops_per_example(trainer)


@pytest.mark.parametrize(
    ("accumulation", "steps_per_execution", "jit", "batch", "precision"),
    [
        (1, 1, False, 64, "float32"),   # one update, both replicas unrolled
        (4, 1, False, 64, "float32"),   # four micro-steps unrolled in the graph
        (20, 1, True, 640, "float32"),  # 20 micro-steps: a tf.while loop, XLA gradients
        (1, 3, False, 64, "float32"),   # several updates per call: the tf.range loop
        (1, 1, False, 64, "mixed_float16"),  # loss scaling: the optimizer under a tf.cond
    ],
)
def test_mlp_flops_per_example_match_the_hand_count(strategy: Any, devices: Any,
                                                     accumulation: int,
                                                     steps_per_execution: int, jit: bool,
                                                     batch: int, precision: str) -> None:
    from trainer_runtime.loop import Trainer

    cfg = make_config(
        model={"hidden_units": [48, 24], "dropout": 0.0},
        data={"input_shape": [20], "classes": 10},
        train={"global_batch_size": batch, "accumulation_steps": accumulation,
               "steps_per_execution": steps_per_execution, "jit_compile": jit,
               "mixed_precision": precision},
    )
    try:
        trainer = Trainer(cfg, strategy, devices)
        counted = _counted(trainer)
    finally:
        import keras

        keras.mixed_precision.set_global_policy("float32")  # the next test's models
    hand = dense_stack_flops([20, 48, 24, 10])
    # 2*20*48*2 + 2*48*24*3 + 2*24*10*3 = 3840 + 6912 + 1440
    assert hand == 12192.0
    assert counted is not None
    assert counted == pytest.approx(hand, rel=0.05)
    # About 6 x parameters per example (the rule of thumb), less the first
    # layer's input gradient and give or take the biases, which have no matmul.
    weights = 20 * 48 + 48 * 24 + 24 * 10
    assert counted == pytest.approx(6 * weights - 2 * 20 * 48, rel=0.05)


def test_the_first_update_reuses_the_trace_the_count_made(strategy: Any, devices: Any) -> None:
    from trainer_runtime.loop import Trainer

    for steps_per_execution in (1, 2):
        cfg = make_config(train={"steps_per_execution": steps_per_execution})
        trainer = Trainer(cfg, strategy, devices)
        assert _counted(trainer) is not None
        fn = trainer.graph.function(steps_per_execution > 1)
        assert fn.experimental_get_tracing_count() == 1
        trainer.run_updates(steps_per_execution)
        trainer.run_updates(1)
        assert fn.experimental_get_tracing_count() == 1, "the loop traced the update again"


def test_convnet_flops_per_example_match_the_hand_count(strategy: Any, devices: Any) -> None:
    from trainer_runtime.loop import Trainer

    cfg = make_config(
        model={"name": "convnet", "dropout": 0.0},
        data={"input_shape": [8, 8, 3], "classes": 10},
        train={"global_batch_size": 32},
    )
    trainer = Trainer(cfg, strategy, devices)
    # Conv2D 3->32, 3x3 same on 8x8; max-pool to 4x4; Conv2D 32->64 3x3 same on 4x4;
    # global average pool to 64; Dense 64->10.
    conv1 = conv_forward_flops(8, 8, 3, 3, 32)
    conv2 = conv_forward_flops(4, 4, 3, 32, 64)
    dense = 2.0 * 64 * 10
    hand = 2 * conv1 + 3 * conv2 + 3 * dense
    assert hand == 1994496.0
    counted = _counted(trainer)
    assert counted is not None
    assert counted == pytest.approx(hand, rel=0.05)


def test_resnet_flops_per_example_match_the_hand_count(strategy: Any, devices: Any) -> None:
    """Strided convolutions and a 1x1 projection shortcut, counted as the layers say."""
    from trainer_runtime.loop import Trainer

    cfg = make_config(
        model={"name": "resnet", "dropout": 0.0},
        data={"input_shape": [8, 8, 3], "classes": 10},
        train={"global_batch_size": 32},
    )
    trainer = Trainer(cfg, strategy, devices)
    stem = conv_forward_flops(8, 8, 3, 3, 32)
    block1 = conv_forward_flops(8, 8, 3, 32, 32) * 2  # two 3x3 convs, identity shortcut
    block2 = (conv_forward_flops(4, 4, 3, 32, 64)     # 3x3 stride 2: 8x8 -> 4x4
              + conv_forward_flops(4, 4, 3, 64, 64)   # 3x3 on 4x4
              + conv_forward_flops(4, 4, 1, 32, 64))  # 1x1 stride-2 projection
    dense = 2.0 * 64 * 10
    hand = 2 * stem + 3 * (block1 + block2 + dense)
    counted = _counted(trainer)
    assert counted is not None
    assert counted == pytest.approx(hand, rel=0.05)


def test_demo_mlp_count_is_the_hand_count_and_takes_well_under_a_second(
        strategy: Any, devices: Any, caplog: pytest.LogCaptureFixture) -> None:
    import yaml

    from trainer_runtime.flops import update_flops_per_example
    from trainer_runtime.loop import Trainer
    from trainer_runtime.schema import RunConfig

    raw = yaml.safe_load((ROOT / "demo" / "demo.yaml").read_text())
    raw["checkpoint"] = {"enabled": False}
    cfg = RunConfig.model_validate(raw)
    assert cfg.model.hidden_units == [1024, 1024] and cfg.data.input_shape == [784]
    trainer = Trainer(cfg, strategy, devices)
    concrete = trainer.graph.trace_first(trainer.iterator, cfg.train.steps_per_execution)
    # Not alone: the count took 4-12 ms here, beside the suite; the bound is a second,
    # which no share of two busy cores stretches it to (run alone, its drain cost the
    # suite 11 s for a hold of 0.01 s: docs/benchmarks.md, "The suite's time").
    with caplog.at_level(logging.INFO, logger="trainer_runtime"):
        t0 = time.perf_counter()
        counted = update_flops_per_example(concrete)
        seconds = time.perf_counter() - t0
    hand = dense_stack_flops([784, 1024, 1024, 10])
    print(f"demo MLP: counted {counted:.6g} FLOPs per example, hand count {hand:.6g}, "
          f"counted in {seconds * 1000:.1f} ms")
    assert counted is not None
    assert counted == pytest.approx(hand, rel=0.05)
    assert seconds < 1.0
    assert any("FLOPs per example of the update" in r.getMessage() for r in caplog.records)


# ---- the walk itself, on small graphs --------------------------------------------


def _concrete(fn: Any, *specs: Any) -> Any:
    import tensorflow as tf

    return tf.function(fn).get_concrete_function(*specs)


def test_matmul_einsum_batch_matmul_and_nested_calls_are_counted() -> None:
    import tensorflow as tf

    from trainer_runtime.flops import count_concrete

    @tf.function
    def inner(x: Any, w: Any) -> Any:
        return tf.matmul(x, w, transpose_b=True)  # [8, 5] x [3, 5]^T: 2*8*3*5

    def outer(x: Any, w: Any, a: Any, b: Any) -> Any:
        y = inner(x, w)
        z = tf.einsum("bij,bjk->bik", a, b)  # 2*4*6*7*2
        v = tf.linalg.matmul(a, a, adjoint_b=True)  # [4,6,7] x [4,7,6]: 2*4*6*6*7
        return tf.reduce_sum(y) + tf.reduce_sum(z) + tf.reduce_sum(v)

    concrete = _concrete(outer, tf.TensorSpec([8, 5]), tf.TensorSpec([3, 5]),
                         tf.TensorSpec([4, 6, 7]), tf.TensorSpec([4, 7, 2]))
    counted = count_concrete(concrete)
    assert counted.unknown_ops == 0 and counted.counted_ops == 3
    assert counted.flops == 2 * 8 * 3 * 5 + 2 * 4 * 6 * 7 * 2 + 2 * 4 * 6 * 6 * 7
    # No input iterator read: no per-example figure.
    assert counted.examples == 0 and counted.per_example is None


def test_an_einsum_with_an_ellipsis_broadcasts_its_batch_dimensions() -> None:
    import tensorflow as tf

    from trainer_runtime.flops import count_concrete

    def f(a: Any, b: Any) -> Any:
        return tf.einsum("...ij,...jk->...ik", a, b)  # batch 3x2 (b broadcast): 2*6*4*5*7

    counted = count_concrete(_concrete(f, tf.TensorSpec([3, 2, 4, 5]),
                                       tf.TensorSpec([2, 5, 7])))
    assert counted.unknown_ops == 0 and counted.flops == 2 * 3 * 2 * 4 * 5 * 7


def test_a_loop_that_reads_a_batch_counts_its_body_once_per_batch_read() -> None:
    import tensorflow as tf

    from trainer_runtime.flops import count_concrete

    dataset = tf.data.Dataset.from_tensors(tf.ones([8, 6])).repeat()
    iterator = iter(dataset)
    w = tf.ones([6, 3])

    def f(it: Any) -> Any:
        total = tf.constant(0.0)
        for _ in tf.range(5):  # five batches of 8: each 2*8*6*3 FLOPs
            total += tf.reduce_sum(tf.matmul(next(it), w))
        return total

    counted = count_concrete(_concrete(f, iterator))
    assert counted.examples == 8 and counted.flops == 2 * 8 * 6 * 3
    assert counted.per_example == 2 * 6 * 3


def test_a_loop_that_reads_no_batch_runs_an_unknown_number_of_times() -> None:
    import tensorflow as tf

    from trainer_runtime.flops import count_concrete

    def f(x: Any, w: Any, n: Any) -> Any:
        for _ in tf.range(n):  # a recurrent step: how many is not in the graph
            x = tf.matmul(x, w)
        return x

    counted = count_concrete(_concrete(f, tf.TensorSpec([8, 4]), tf.TensorSpec([4, 4]),
                                       tf.TensorSpec([], tf.int32)))
    assert counted.unknown_ops == 1 and counted.per_example is None


def test_unknown_shapes_are_flagged_and_give_no_figure(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    import tensorflow as tf

    from trainer_runtime.flops import count_concrete, update_flops_per_example

    def f(x: Any, w: Any) -> Any:
        return tf.matmul(x, w) + tf.reduce_sum(tf.matmul(w, w))

    concrete = _concrete(f, tf.TensorSpec([None, 4]), tf.TensorSpec([4, 4]))
    counted = count_concrete(concrete)
    assert counted.unknown_ops == 1 and counted.counted_ops == 1
    assert counted.flops == 2 * 4 * 4 * 4  # what could be counted: the static matmul
    assert counted.per_example is None
    with caplog.at_level(logging.INFO, logger="trainer_runtime"):
        assert update_flops_per_example(concrete) is None
    assert any("unknown shapes" in r.getMessage() for r in caplog.records)


def test_a_graph_the_walk_cannot_read_gives_none_and_a_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    from trainer_runtime.flops import update_flops_per_example

    with caplog.at_level(logging.WARNING, logger="trainer_runtime"):
        assert update_flops_per_example(object()) is None
    assert any("not counted" in r.getMessage() for r in caplog.records)


def test_a_trace_that_fails_gives_none_and_the_trainer_goes_on(strategy: Any, devices: Any,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    from trainer_runtime.loop import Trainer

    trainer = Trainer(make_config(), strategy, devices)

    def broken(*args: Any) -> Any:
        raise RuntimeError("trace failed")

    monkeypatch.setattr(trainer.graph, "trace_first", broken)
    assert _counted(trainer) is None


# ---- a person's own script (gpuwatch run): the hook counts its traced step ------------


def test_a_fit_scripts_flops_per_example_are_the_runtimes_for_the_same_model(
        strategy: Any, devices: Any) -> None:
    # fit_mirrored.py's model is the runtime's mlp [64] on 32 features and 10 classes: the
    # hook counts fit's train function as it first runs (its batch dimension left unknown
    # by Keras' dataset of arrays is the batch seen), the runtime its own update.
    from tests.support.hooked import run_hooked, script
    from trainer_runtime import protocol
    from trainer_runtime.loop import Trainer

    runtime = _counted(Trainer(make_config(model={"hidden_units": [64]},
                                         data={"input_shape": [32], "classes": 10}),
                             strategy, devices))
    assert runtime == pytest.approx(dense_stack_flops([32, 64, 10]), rel=0.05)
    ran = run_hooked(script("fit_mirrored.py", "--epochs", "1"))
    assert ran.returncode == 0, ran.output
    (hello,) = ran.of(protocol.Hello)
    assert hello.flops_per_example == pytest.approx(runtime, rel=1e-9)


@pytest.mark.parametrize(("argv", "sizes"), [
    # strategy.run in a tf.function: the batch read inside it, or handed to it from Python
    (["loop_mirrored.py", "--steps", "6"], [32, 64, 64, 10]),
    (["loop_mirrored.py", "--steps", "6", "--python-next"], [32, 64, 64, 10]),
    # GradientTape and apply_gradients, no strategy: a step, the whole loop in one function
    (["tape_loops.py", "--shape", "function"], [16, 32, 4]),
    (["tape_loops.py", "--shape", "whole"], [16, 32, 4]),
], ids=["strategy-run", "python-next", "tape-step", "tape-whole-loop"])
def test_a_custom_loops_flops_per_example_are_the_hand_count(
        argv: list[str], sizes: list[int]) -> None:
    from tests.support.hooked import run_hooked, script
    from trainer_runtime import protocol

    ran = run_hooked(script(*argv))
    assert ran.returncode == 0, ran.output
    (hello,) = ran.of(protocol.Hello)
    assert hello.flops_per_example == pytest.approx(dense_stack_flops(sizes), rel=1e-9)


@pytest.mark.parametrize("outer", ["as listed", "reversed"])
@pytest.mark.parametrize("inner", ["as listed", "reversed"])
def test_a_distributed_iterators_partial_batch_cond_counts_the_branch_that_reads(
        strategy: Any, devices: Any, monkeypatch: pytest.MonkeyPatch, outer: str,
        inner: str) -> None:
    # next() on a distributed iterator inside a tf.function reads each replica's batch in
    # conds (an If, and a StatelessIf per replica inside it: the branch with the batch,
    # and one without). Every branch counts 0 FLOPs; the one counted must be the one that
    # reads, whatever order the graph lists its branches in (a protobuf map's: it differed
    # between processes, and one suite run counted half the examples: twice the FLOPs
    # per example). Each order of each level, here.
    import numpy as np
    import tensorflow as tf

    from trainer_runtime import flops

    listed = flops._called_functions
    flipped = {kind for kind, order in (("If", outer), ("StatelessIf", inner))
               if order == "reversed"}
    monkeypatch.setattr(flops, "_called_functions",
                        lambda op: listed(op)[::-1] if op.type in flipped else listed(op))
    weights = tf.Variable(np.ones((32, 8), "float32"))
    data = tf.data.Dataset.from_tensor_slices(np.ones((256, 32), "float32")).batch(64)
    iterator = iter(strategy.experimental_distribute_dataset(data))

    @tf.function
    def step(iterator: Any) -> Any:
        return strategy.run(lambda batch: tf.matmul(batch, weights), args=(next(iterator),))

    step(iterator)
    counted = flops.count_graph(step.get_concrete_function(iterator).graph, batch=32)
    assert counted.examples == 64, counted  # both replicas' reads of 32
    assert counted.per_example == pytest.approx(2 * 32 * 8)
