"""Every optimizer update of a person's own loop is a step, whatever the loop's shape.

tests/data/scripts/tape_loops.py trains with GradientTape and apply_gradients and no
strategy.run, in the guides' shapes (eager, a tf.function step, the whole loop in one
tf.function, a LossScaleOptimizer that skips overflowing updates, two optimizers a step,
a new optimizer for a second phase, fit then a loop on the same optimizer), and prints
each optimizer's iterations at its end: the ground truth the steps shown must equal
(trainer_runtime/hook/updates.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.hooked import Hooked, run_hooked, script
from trainer_runtime import protocol

pytestmark = pytest.mark.slow

SHAPES = ("eager", "function", "whole", "lso", "two", "phases", "mixed")
FIT_STEPS = 4  # the mixed shape's fit: 4 batches before its loop


def iterations(ran: Hooked) -> dict[str, int]:
    """What the script printed: each optimizer's iterations at its end."""
    found = {}
    for line in ran.output.splitlines():
        if line.startswith("iterations "):
            name, _, value = line.removeprefix("iterations ").partition("=")
            found[name] = int(value)
    return found


def updates_made(shape: str, counts: dict[str, int], restored: int) -> int:
    """The updates the script made, by its optimizers' own counts: the pace-setting one's
    (a GAN's second optimizer's are the same steps), both phases' optimizers."""
    if shape == "phases":
        return counts["first"] - restored + counts["model"]
    return counts["model"] - restored


# Each shape once a run, its length and a restored optimizer's count drawn: a TensorFlow
# start-up per example (some 5 s), so one example a shape. After each update the script
# evaluates the model on 7 examples (training=False, and a plain call outside the tape), as
# the tutorial's test step does: the update's examples stay its batch's 32.
@pytest.mark.parametrize("shape", SHAPES)
@settings(max_examples=1, database=None)
@given(steps=st.integers(12, 20), restored=st.sampled_from([0, 5, 1000]))
def test_the_steps_shown_are_every_update_the_optimizers_count(
    shape: str, steps: int, restored: int
) -> None:
    argv = ["--shape", shape, "--steps", str(steps), "--restored", str(restored),
            "--eval-batch", "7"]
    if shape == "lso":
        # Mixed precision with a loss scale that overflows float16: the optimizer skips
        # the first updates (7 of 24 here) and halves the scale; a skipped one is no step.
        argv += ["--loss-scale", str(2.0 ** 24)]
    ran = run_hooked(script("tape_loops.py", *argv))
    assert ran.returncode == 0, ran.output
    counts = iterations(ran)
    made = updates_made(shape, counts, restored)
    shown = [s.step for s in ran.steps]
    # The steps go on from a restored optimizer's count; mixed's fit counts from it too.
    assert shown == list(range(restored + 1, restored + made + 1)), (counts, shown)
    if shape == "lso":
        assert made < steps, counts  # some updates were skipped, and not counted
    else:
        assert made == steps + (FIT_STEPS if shape == "mixed" else 0), counts
    (hello,) = ran.of(protocol.Hello)
    assert hello.start_step == restored
    assert all(s.examples == 32 for s in ran.steps)
    assert all(s.epoch is None for s in ran.steps[FIT_STEPS if shape == "mixed" else 0:])
    loop = ran.hook.loop
    pace = "sgd_finetune" if shape == "phases" else "sgd"
    assert loop.startswith(f"{pace} updates ("), loop
    assert ("optimizers seen, its updates are the steps" in loop) is (shape in ("two", "phases"))


def test_a_traced_step_handed_its_batch_shows_the_reads_wait() -> None:
    # Each batch reads in 10 ms (a sleep in the dataset), taken by the Python loop and handed
    # to the tf.function step: the host times next(). tf.data's read-ahead is off (its injected
    # prefetch and its autotuner, which reads ahead even without it, to a depth that varies), so
    # each read happens inside next(), whatever the machine's speed:
    # every step, the first too, waits at least the read, and never past the step.
    ran = run_hooked(script("tape_loops.py", "--shape", "function", "--steps", "16",
                            "--read-ms", "10", "--no-read-ahead"))
    assert ran.returncode == 0, ran.output
    assert ran.hook.input_wait == ""
    assert len(ran.steps) == 16
    for s in ran.steps:
        assert s.input_wait_ms is not None, s
        assert 10.0 <= s.input_wait_ms <= s.step_time_ms + 0.5, s


def test_a_loop_inside_one_tf_function_is_counted_and_says_why_its_wait_is_not() -> None:
    ran = run_hooked(script("tape_loops.py", "--shape", "whole", "--steps", "12"))
    assert ran.returncode == 0, ran.output
    assert [s.step for s in ran.steps] == list(range(1, 13))
    assert all(s.input_wait_ms is None for s in ran.steps)
    assert ran.hook.input_wait.startswith("its batches are not taken with next() in Python")


def test_max_steps_ends_a_tape_loop_as_it_ends_a_custom_loop() -> None:
    # The 6th update is the last: the traced loop's process exits 0 at once.
    ran = run_hooked(script("tape_loops.py", "--shape", "function", "--steps", "20"),
                     max_steps=6)
    assert ran.returncode == 0, ran.output
    assert [s.step for s in ran.steps] == list(range(1, 7))
    assert ran.of(protocol.Done)[-1].reason == "max_steps"


@pytest.mark.parametrize("loop", ["graph", "eager"])
def test_a_strategy_run_loops_steps_go_on_from_a_restored_optimizers_count(loop: str) -> None:
    # The distributed-training tutorial's loop (`for x in dist_dataset`, strategy.run in a
    # tf.function, or eagerly) on an optimizer a checkpoint left at 1000 updates: the
    # steps shown are 1001 on, the optimizer's own count at the end the last of them.
    ran = run_hooked(script("loop_mirrored.py", "--steps", "6", "--python-next",
                            "--restored", "1000", *(["--eager"] if loop == "eager" else [])))
    assert ran.returncode == 0, ran.output
    (hello,) = ran.of(protocol.Hello)
    assert hello.start_step == 1000
    at_end = int(next(line for line in ran.output.splitlines()
                      if line.startswith("iterations ")).split()[1])
    assert at_end == 1006
    assert [s.step for s in ran.steps] == list(range(1001, at_end + 1))
