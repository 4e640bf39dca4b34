"""gpuwatch run's hook inside real, unmodified scripts (tests/data/scripts), under
MirroredStrategy over 2 logical CPU devices: each figure it sends is checked against
the script's own (the loss it prints or computes, the examples it trained on, a known
injected read latency, its final weights without the hook)."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.hooked import Hooked, Started, printed_losses, run_hooked, script, start_hooked
from trainer_runtime import protocol

Preload = Callable[..., Started]

LOOPS = ("fit", "graph", "eager")
PREFETCHES: tuple[bool | str, ...] = (False, "autotune")


def _latency_ms(loop: str) -> float:
    # Far above a step's compute: a few ms traced; eagerly some 36 ms on one box, 40-60 ms
    # with single steps of 123 ms on a slower, noisy one (the distributed iterator reads
    # the next batch during the step, so the wait is the latency less the step's compute:
    # one such step waited 77 ms of a 200 ms read, under the bound of half).
    return 400.0 if loop == "eager" else 80.0


def _slow_reads_argv(loop: str) -> list[str]:
    latency_ms = _latency_ms(loop)
    if loop == "fit":
        return script("fit_mirrored.py", "--dataset", "--epochs", "1", "--examples", "640",
                      "--read-ms", str(latency_ms))
    return script("loop_mirrored.py", "--steps", "10", "--read-ms", str(latency_ms),
                  *(["--eager"] if loop == "eager" else []))


TIMED_FIT = script("fit_mirrored.py", "--epochs", "1", "--time-epochs", "6")
BURSTY_READS = script("loop_mirrored.py", "--steps", "128", "--from-function", "--read-ms", "4",
                      "--burst", "32", "--width", "1024", "--batch", "256", "--no-read-ahead")
BURST_MS = 4 * 32  # what each burst costs
BURST_PREFETCHES: tuple[bool | int, ...] = (False, 16)
SLOWER_READS = script("loop_mirrored.py", "--steps", "12", "--read-ms", "30")

# What this module's `alone` tests run preloaded: (test, argv, options).
ALONE_PRELOADS: list[tuple[str, list[str], dict[str, Any]]] = [
    ("test_fit_steps_add_up_to_the_scripts_own_clock_across_epochs", TIMED_FIT, {}),
    *(("test_a_known_read_latency_shows_as_input_wait", _slow_reads_argv(loop), {})
      for loop in LOOPS),
    *(("test_prefetch_hides_a_bursty_read_and_the_wait_falls", BURSTY_READS,
       {"prefetch": prefetch}) for prefetch in BURST_PREFETCHES),
    *(("test_prefetch_cannot_hide_a_read_slower_than_the_step_and_the_figure_says_so",
       SLOWER_READS, {"prefetch": prefetch}) for prefetch in PREFETCHES),
]


@pytest.fixture(scope="module")
def preloaded(request: pytest.FixtureRequest) -> Iterator[Preload]:
    """Starts a hooked script that imports TensorFlow and Keras (seconds that measure
    nothing), then waits; the script runs at finish(). An `alone` test's body
    (tests/support/alone.py) so times the script, not the import.

    The module's `alone` tests run one after another in one hold of the suite's lock,
    set-ups included: so at the first one's set-up, beside other tests, every script the
    selected ones run (ALONE_PRELOADS) starts and imports, side by side, and each test
    takes its own; none imports inside the hold."""
    selected = {getattr(item, "originalname", item.name) for item in request.session.items
                if item.module is request.module}
    pool: list[tuple[list[str], dict[str, Any], Started]] = []
    started: list[Started] = []

    def fill() -> None:
        for test, argv, options in ALONE_PRELOADS:
            if test in selected:
                pool.append((argv, options, start_hooked(argv, preload=True, wait=False,
                                                         **options)))
        started.extend(run for _, _, run in pool)
        for _, _, run in pool:
            run.wait_ready()

    def start(argv: list[str], **options: Any) -> Started:
        if not started:
            fill()
        for index, (pooled_argv, pooled_options, run) in enumerate(pool):
            if (pooled_argv, pooled_options) == (argv, options):
                del pool[index]
                return run
        started.append(start_hooked(argv, preload=True, **options))
        return started[-1]

    yield start
    for run in started:
        run.kill()


def _contiguous(steps: list[protocol.Step]) -> None:
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))


@pytest.mark.parametrize("spe", [1, 4])
def test_fit_steps_are_every_batch_with_that_batchs_own_loss(tmp_path: Path, spe: int) -> None:
    # lr 0: the weights never move, so the script can compute each batch's loss itself.
    losses = tmp_path / "losses.json"
    ran = run_hooked(script("fit_mirrored.py", "--spe", str(spe), "--epochs", "2",
                            "--lr", "0", "--losses-out", str(losses)))
    assert ran.returncode == 0, ran.output
    expected = json.loads(losses.read_text())
    steps = ran.steps
    _contiguous(steps)
    assert len(steps) == len(expected) == 16  # 512 examples / 64, twice
    assert [s.examples for s in steps] == [64] * 16
    assert steps[-1].position == 2 * 512
    assert [s.epoch for s in steps] == [0] * 8 + [1] * 8
    assert [s.loss for s in steps] == pytest.approx(expected, rel=1e-5)
    # Not Keras' running mean: that would drift towards the epoch's mean.
    assert steps[1].loss != pytest.approx((expected[0] + expected[1]) / 2, rel=1e-6)
    assert all(s.input_wait_ms is not None and s.input_wait_ms >= 0 for s in steps)
    hello = ran.of(protocol.Hello)[0]
    assert (hello.replicas, hello.device_kind, hello.global_batch_size) == (2, "cpu", 64)
    assert hello.param_count == 32 * 64 + 64 + 64 * 10 + 10
    hook = ran.hook
    assert (hook.loop, hook.input_wait, hook.strategy) == ("fit", "", "MirroredStrategy")
    assert ran.of(protocol.Done)[-1].reason == "exited"


ScheduledFit = Callable[..., tuple[Hooked, Path]]


@pytest.fixture(scope="module")
def scheduled_fit(tmp_path_factory: pytest.TempPathFactory) -> ScheduledFit:
    """fit_mirrored.py with a learning rate that decays every step, run once per module for
    each (spe, hooked) asked: its result and the final weights it wrote. The learning-rate
    test reads the hooked runs; the weights test compares spe 1's with the same run
    unhooked (one TensorFlow start-up fewer than a run of its own)."""
    runs: dict[tuple[int, bool], tuple[Hooked, Path]] = {}

    def run(spe: int, hooked: bool = True) -> tuple[Hooked, Path]:
        if (spe, hooked) not in runs:
            out = tmp_path_factory.mktemp("scheduled-fit") / "weights.npz"
            ran = run_hooked(script("fit_mirrored.py", "--spe", str(spe), "--epochs", "2",
                                    "--lr", "0.1", "--lr-decay", "0.5",
                                    "--weights-out", str(out)), hooked=hooked)
            runs[spe, hooked] = ran, out
        return runs[spe, hooked]

    return run


@pytest.mark.parametrize("spe", [1, 4])
def test_fit_steps_carry_the_learning_rate_each_step_used(
    spe: int, scheduled_fit: ScheduledFit,
) -> None:
    # A schedule that decays every step: step k (from 1) trains at 0.1 * 0.5 ** (k - 1),
    # the rate Keras computes from the optimizer's iterations before that step's update.
    ran, _ = scheduled_fit(spe)
    assert ran.returncode == 0, ran.output
    steps = ran.steps
    assert len(steps) == 16
    assert [s.lr for s in steps] == pytest.approx(
        [0.1 * 0.5 ** (s.step - 1) for s in steps], rel=1e-6)


@pytest.fixture
def timed_fit(preloaded: Preload) -> Started:
    return preloaded(TIMED_FIT)


@pytest.mark.alone
def test_fit_steps_add_up_to_the_scripts_own_clock_across_epochs(timed_fit: Started) -> None:
    # Keras spends real time between epochs (a new iterator, callbacks): it lands on each
    # epoch's first step, so the steps of the epochs the script times itself add up to its
    # own clock, and examples over their time is the rate it prints.
    ran = timed_fit.finish()
    assert ran.returncode == 0, ran.output
    printed = float(ran.output.split("examples_per_s=")[1].split()[0])
    # The second fit's epochs, numbered as Keras numbers them (from 0 again).
    assert [s.epoch for s in ran.steps[:8]] == [0] * 8
    timed = ran.steps[8:]
    assert [s.epoch for s in timed] == [e for e in range(6) for _ in range(8)]
    seconds = sum(s.step_time_ms for s in timed) / 1000.0
    assert sum(s.examples for s in timed) / seconds == pytest.approx(printed, rel=0.05)


@pytest.mark.parametrize("eager", [False, True])
def test_a_custom_loop_reports_every_step_with_the_loss_it_printed(eager: bool) -> None:
    ran = run_hooked(script("loop_mirrored.py", "--steps", "8", *(["--eager"] * eager)))
    assert ran.returncode == 0, ran.output
    printed = printed_losses(ran.output)
    steps = ran.steps
    _contiguous(steps)
    assert len(steps) == len(printed) == 8
    assert [s.loss for s in steps] == pytest.approx(printed, abs=2e-6)
    assert [s.examples for s in steps] == [64] * 8
    assert ran.hook.loop == ("strategy.run (eager)" if eager else "strategy.run (tf.function)")
    assert ran.hook.input_wait == ""
    # Its epochs are the script's own, which the hook does not see: none, never "epoch 0".
    assert all(s.epoch is None for s in steps)


def test_fits_epochs_are_numbered_as_keras_numbers_them_from_initial_epoch() -> None:
    # fit(epochs=3, initial_epoch=1) trains Keras' epochs 1 and 2 ("Epoch 2/3", "3/3").
    ran = run_hooked(script("fit_mirrored.py", "--epochs", "3", "--initial-epoch", "1"))
    assert ran.returncode == 0, ran.output
    assert [s.epoch for s in ran.steps] == [1] * 8 + [2] * 8


@pytest.fixture
def slow_reads(loop: str, preloaded: Preload) -> Started:
    """The test's loop reading each batch at _latency_ms(loop), preloaded."""
    return preloaded(_slow_reads_argv(loop))


@pytest.mark.alone
@pytest.mark.parametrize("loop", LOOPS)
def test_a_known_read_latency_shows_as_input_wait(loop: str, slow_reads: Started) -> None:
    latency_ms = _latency_ms(loop)
    ran = slow_reads.finish()
    assert ran.returncode == 0, ran.output
    # After warm-up: the first step traces the graph (or runs slowly, eagerly), and
    # meanwhile the distributed iterator's own buffer reads ahead the next batches.
    later = ran.steps[4:]
    assert later
    for s in later:
        assert s.input_wait_ms is not None and s.input_wait_ms <= s.step_time_ms + 0.5
    if loop == "fit":
        # Keras' traced step computes in a few ms against the 80 ms read.
        waits = [s.input_wait_ms for s in later]
        assert all(w is not None and w >= latency_ms / 2 for w in waits), waits
        return
    # The batch a step takes was read while the step before did the rest of its work
    # (its time less its wait): the read cannot take less than the injected latency, so a
    # step's wait is at least the read less that rest. A fixed half of the read failed
    # where a loaded box's eager steps took 260-350 ms of a 400 ms read (x5 at 53aa576:
    # waits of 52-345 ms).
    steps = ran.steps
    told = 0
    for before, s in zip(steps[3:], later, strict=False):
        assert before.input_wait_ms is not None
        rest_ms = before.step_time_ms - before.input_wait_ms
        least = latency_ms - rest_ms - TUTORIAL_SLACK_MS
        assert s.input_wait_ms is not None and s.input_wait_ms >= least, (s, before)
        told += least > latency_ms / 4
    # A step whose rest came near the read cannot tell a wait from none: most must.
    assert told >= len(later) / 2, [(s.step_time_ms, s.input_wait_ms) for s in steps]


# The tutorial loop's read per batch: far above the step's compute where the box is quiet
# (a few ms traced; eagerly 40-120 ms, 330 ms on a loaded box: h-1 at ab3427a, x1 at
# e858ac0), so once the iterator's own read-ahead is spent each step waits most of it.
TUTORIAL_READ_MS = {"graph": 60.0, "eager": 600.0}
# What a step's wait may fall short of the read less the step before's compute: the loop's
# own Python (the print, the hook's bookkeeping) between the script's clock and next().
TUTORIAL_SLACK_MS = 25.0


@pytest.mark.parametrize("loop", ["graph", "eager"])
def test_the_tutorials_loop_times_the_batch_it_takes_at_the_python_level(loop: str) -> None:
    # The distributed-training tutorial's loop: `for x in dist_dataset: step(x)` over
    # strategy.experimental_distribute_dataset, the step a tf.function handed its batch
    # (or, eagerly, strategy.run called from Python). The batch comes from next() on the
    # distributed iterator in Python; the hook times that on the host. Each batch reads
    # in TUTORIAL_READ_MS, one read at a time, with tf.data's own read-ahead off. The
    # distributed iterator still reads a few batches ahead (3 seen), filled while the first
    # steps run; once that is spent the reads run back to back, so the batch a step takes
    # was read while the step before computed: its wait is the read less that compute,
    # which the script times itself. The bound comes from the same run, not from how fast
    # the box is (a fixed "half the read" failed where a loaded box's eager step took 330
    # ms of a 600 ms read: x1 at e858ac0).
    read_ms = TUTORIAL_READ_MS[loop]
    ran = run_hooked(script("loop_mirrored.py", "--steps", "12", "--python-next",
                            "--read-ms", str(read_ms), "--no-read-ahead",
                            *(["--eager"] if loop == "eager" else [])))
    assert ran.returncode == 0, ran.output
    kind = "tf.function" if loop == "graph" else "eager"
    assert (ran.hook.loop, ran.hook.input_wait) == (f"strategy.run ({kind})", "")
    steps = ran.steps
    _contiguous(steps)
    assert len(steps) == 12
    assert [s.loss for s in steps] == pytest.approx(printed_losses(ran.output), abs=2e-6)
    assert all(s.input_wait_ms is not None for s in steps)
    computed = [float(line.split()[5]) for line in ran.output.splitlines()
                if line.startswith("step ") and " compute_ms " in line]
    assert len(computed) == 12
    told = 0
    for s in steps[-4:]:  # past the iterator's own read-ahead
        assert s.input_wait_ms is not None, s
        assert s.input_wait_ms <= s.step_time_ms + 0.5, s
        least = read_ms - computed[s.step - 2] - TUTORIAL_SLACK_MS
        assert s.input_wait_ms >= least, (s, computed[s.step - 2])
        told += least > read_ms / 4
    # A step whose compute came near the read cannot tell a wait from none: most must.
    assert told >= 3, computed


def test_a_traced_step_handed_tensors_says_why_its_wait_is_not_measured() -> None:
    # No iterator at all: the script slices its arrays and hands the step tensors. The
    # steps are counted; the wait is said not to be measured, and how the loop could be.
    ran = run_hooked(script("loop_mirrored.py", "--steps", "6", "--tensors"))
    assert ran.returncode == 0, ran.output
    assert ran.hook.loop == "strategy.run (tf.function)"
    assert ran.hook.input_wait.startswith("its batch is not taken with next() on a "
                                          "distributed iterator: iterate strategy."), ran.hook
    steps = ran.steps
    _contiguous(steps)
    assert len(steps) == 6 and all(s.input_wait_ms is None for s in steps)


def _traceback(output: str) -> list[str]:
    """The traceback the script printed: from its head to the error's line."""
    lines = output.splitlines()
    start = lines.index("Traceback (most recent call last):")
    return lines[start:]


def test_an_error_inside_fit_shows_the_scripts_traceback_without_the_hooks_frames() -> None:
    # A callback of the script's raises inside fit, which the hook wraps: the traceback
    # Python prints is the one the script prints unwatched, frame for frame (the hook's
    # wrappers sat between the script's call and Keras', and made gpuwatch look to blame).
    argv = script("fit_mirrored.py", "--epochs", "1", "--raise-at-batch", "3")
    watched, plain = run_hooked(argv), run_hooked(argv, hooked=False)
    for ran in (watched, plain):
        assert ran.returncode == 1, ran.output
    shown = _traceback(watched.output)
    assert shown[-1] == "RuntimeError: the script's own error at batch 3", shown
    assert not any("trainer_runtime" in line or "gpuwatch" in line for line in shown), shown
    frames = [line for line in shown if line.lstrip().startswith("File ")]
    assert any("fit_mirrored.py" in line and "on_train_batch_end" in line for line in frames)
    assert frames == [line for line in _traceback(plain.output)
                      if line.lstrip().startswith("File ")]


def _waits(started: Started) -> list[float]:
    ran = started.finish()
    assert ran.returncode == 0, ran.output
    waits = [s.input_wait_ms for s in ran.steps[4:]]
    assert waits and all(w is not None for w in waits)
    return [w for w in waits if w is not None]


def _burst_excess(waits: dict[int, float], burst_steps: range) -> list[float]:
    """How much longer than a step's usual wait each burst's step waited (ms)."""
    usual = statistics.median(waits.values())
    return [waits[step] - usual for step in burst_steps]


def _time_before(times: dict[int, float], step: int, steps: int) -> float:
    """The time (ms) the `steps` steps before `step` took."""
    return sum(times[step - back] for back in range(1, steps + 1))


@pytest.fixture
def bursty_reads(preloaded: Preload) -> dict[object, Started]:
    """The custom loop on reads that bunch up (see the test), without and with prefetch."""
    return {prefetch: preloaded(BURSTY_READS, prefetch=prefetch)
            for prefetch in BURST_PREFETCHES}


@pytest.mark.alone
def test_prefetch_hides_a_bursty_read_and_the_wait_falls(
    bursty_reads: dict[object, Started],
) -> None:
    # Every 32nd per-replica batch costs 128 ms, the others nothing: steps 17, 33, ..., 113
    # each meet a burst after warm-up. tf.data's own read-ahead is off in the script (its
    # autotuner reads ahead to a depth the machine's load moves: under a CPU burner it hid
    # all but 8 ms of a burst, h-1 at ab3427a), so what hides a burst is known, and each
    # bound comes from the run's own step times, not from the speed of the box:
    # - without prefetch, only distribute_datasets_from_function's iterator reads ahead, up
    #   to 2 batches: a burst's step waits at least the burst less the 3 steps before it (2,
    #   and one of slack), and no more than the burst (seen: 84-98 ms beyond the usual
    #   wait, steps of some 20 ms);
    # - `--set data.prefetch=16` on the same unmodified script keeps 16 batches read ahead,
    #   refilled by the 15 cheap ones between bursts: a burst's step waits no more than what
    #   the 15 steps before it could not cover (here nothing: seen 0-3 ms).
    # Medians over the 7 bursts: one step the box holds up is not the read's doing.
    bursts = range(17, 128, 16)
    excess: dict[object, list[float]] = {}
    times: dict[object, dict[int, float]] = {}
    for prefetch in BURST_PREFETCHES:  # one after the other: each alone
        ran = bursty_reads[prefetch].finish()
        assert ran.returncode == 0, ran.output
        waits = {s.step: s.input_wait_ms for s in ran.steps[4:] if s.input_wait_ms is not None}
        assert len(waits) == 124
        excess[prefetch] = _burst_excess(waits, bursts)
        times[prefetch] = {s.step: s.step_time_ms for s in ran.steps}
    without, with_prefetch = excess[False], excess[16]
    floors = [BURST_MS - _time_before(times[False], step, 3) for step in bursts]
    ceilings = [max(0.0, BURST_MS - _time_before(times[16], step, 15)) for step in bursts]
    assert statistics.median(e - f for e, f in zip(without, floors, strict=True)) >= 0, \
        (without, floors)
    assert max(without) <= BURST_MS + 20, without
    assert statistics.median(e - c for e, c in zip(with_prefetch, ceilings, strict=True)) <= 10, \
        (with_prefetch, ceilings)
    # And so the wait falls: to a third or less of the bursts' cost without prefetch.
    assert sum(with_prefetch) <= sum(without) / 3, excess


@pytest.fixture
def slower_reads(preloaded: Preload) -> dict[object, Started]:
    """The custom loop reading each batch in 30 ms, without and with prefetch."""
    return {prefetch: preloaded(SLOWER_READS, prefetch=prefetch) for prefetch in PREFETCHES}


@pytest.mark.alone
def test_prefetch_cannot_hide_a_read_slower_than_the_step_and_the_figure_says_so(
    slower_reads: dict[object, Started],
) -> None:
    # A 30 ms read against a step of a few ms: with or without prefetch(AUTOTUNE) added
    # to the script's dataset, every step waits for its batch.
    without = statistics.mean(_waits(slower_reads[False]))
    with_prefetch = statistics.mean(_waits(slower_reads["autotune"]))
    assert without > 20 and with_prefetch > 20
    assert with_prefetch == pytest.approx(without, rel=0.3)


def test_the_hook_does_not_change_what_the_script_computes(
    scheduled_fit: ScheduledFit,
) -> None:
    # Bit for bit, with a learning-rate schedule the hook reads at every step.
    weights = {}
    for hooked in (False, True):
        ran, out = scheduled_fit(1, hooked=hooked)
        assert ran.returncode == 0, ran.output
        with np.load(out) as arrays:
            weights[hooked] = [arrays[k] for k in sorted(arrays.files)]
    for plain, watched in zip(weights[False], weights[True], strict=True):
        assert np.array_equal(plain, watched)


def test_op_determinism_falls_back_to_a_callback_and_says_input_wait_is_not_measurable(
    tmp_path: Path,
) -> None:
    losses = tmp_path / "losses.json"
    ran = run_hooked(script("fit_mirrored.py", "--deterministic", "--epochs", "1", "--lr", "0",
                            "--losses-out", str(losses)))
    assert ran.returncode == 0, ran.output
    assert ran.hook.loop == "fit (callback)"
    assert "op determinism" in ran.hook.input_wait
    steps = ran.steps
    _contiguous(steps)
    assert [s.input_wait_ms for s in steps] == [None] * 8
    assert [s.loss for s in steps] == pytest.approx(json.loads(losses.read_text()), rel=1e-5)


def test_a_keras_outside_the_tested_range_falls_back_to_a_callback_and_says_so(
    tmp_path: Path,
) -> None:
    # The installed Keras made to look untested: the range the hook checks is narrowed in
    # the watched process before the script runs (the script itself is unchanged).
    narrowed = ("import runpy, sys; from trainer_runtime.hook import keras_patches; "
                "keras_patches.TESTED_KERAS = ((3, 0), (3, 1)); sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
    losses = tmp_path / "losses.json"
    argv = script("fit_mirrored.py", "--epochs", "1", "--lr", "0", "--losses-out", str(losses))
    ran = run_hooked([argv[0], "-c", narrowed, *argv[1:]])
    assert ran.returncode == 0, ran.output
    hook = ran.hook
    assert hook.loop == "fit (callback)"
    assert f"Keras {hook.keras_version} is outside the tested 3.0 to 3.1" in hook.input_wait
    steps = ran.steps
    _contiguous(steps)
    assert [s.input_wait_ms for s in steps] == [None] * 8
    assert [s.examples for s in steps] == [64] * 8
    assert [s.loss for s in steps] == pytest.approx(json.loads(losses.read_text()), rel=1e-5)


def test_max_steps_ends_fit_and_a_custom_loop_cleanly(tmp_path: Path) -> None:
    # Each script's temporary directory is left empty: autograph's generated modules and
    # their cached bytecode go, even where the traced loop ends from inside its step
    # (skipping atexit).
    def private_tmp(name: str) -> tuple[Path, dict[str, str]]:
        tmp = tmp_path / name
        tmp.mkdir()
        return tmp, {**os.environ, "TMPDIR": str(tmp)}

    tmp, env = private_tmp("fit")
    fit = run_hooked(script("fit_mirrored.py", "--epochs", "3"), max_steps=5, env=env)
    assert fit.returncode == 0 and "trained" in fit.output, fit.output
    assert [s.step for s in fit.steps] == [1, 2, 3, 4, 5]
    assert fit.of(protocol.Done)[-1].reason == "max_steps"
    assert list(tmp.iterdir()) == [], "left in the temporary directory"
    for eager in (False, True):
        tmp, env = private_tmp(f"loop-{eager}")
        loop = run_hooked(script("loop_mirrored.py", "--steps", "20",
                                 *(["--eager"] * eager)), max_steps=3, env=env)
        assert loop.returncode == 0, loop.output
        assert [s.step for s in loop.steps] == [1, 2, 3]
        assert [d.reason for d in loop.of(protocol.Done)] == ["max_steps"]
        assert list(tmp.iterdir()) == [], "left in the temporary directory"


def test_a_script_that_raises_keeps_its_steps_and_its_traceback() -> None:
    ran = run_hooked(script("loop_mirrored.py", "--steps", "8", "--raise-at", "4"))
    assert ran.returncode == 1
    assert "RuntimeError: the script's own error at step 4" in ran.output
    assert [s.step for s in ran.steps] == [1, 2, 3]


@pytest.mark.parametrize(("strategy", "name"), [
    ("one-device", "OneDeviceStrategy"),
    ("multi-worker", "MultiWorkerMirroredStrategy"),
])
def test_other_strategies_are_named_with_their_replicas_and_steps(strategy: str,
                                                                  name: str) -> None:
    ran = run_hooked(script("loop_mirrored.py", "--steps", "6", "--strategy", strategy))
    assert ran.returncode == 0, ran.output
    printed = printed_losses(ran.output)
    _contiguous(ran.steps)
    assert [s.loss for s in ran.steps] == pytest.approx(printed, abs=2e-6)
    assert [s.examples for s in ran.steps] == [64] * 6
    hello = ran.of(protocol.Hello)[0]
    assert hello.replicas == 1 and hello.devices and hello.device_kind == "cpu"
    assert ran.hook.strategy == name and ran.hook.input_wait == ""


def test_a_script_without_a_strategy_is_watched_on_the_default_one() -> None:
    ran = run_hooked(script("loop_mirrored.py", "--steps", "5", "--no-strategy"))
    assert ran.returncode == 0, ran.output
    assert [s.step for s in ran.steps] == [1, 2, 3, 4, 5]
    assert ran.of(protocol.Hello)[0].replicas == 1
    assert ran.hook.strategy == "no strategy"
    # A plain tf.data iterator, not a distributed one: said, not guessed.
    assert [s.input_wait_ms for s in ran.steps] == [None] * 5
    assert "distributed iterator" in ran.hook.input_wait


def test_the_scripts_own_sitecustomize_still_runs_and_the_path_is_clean(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    probe = ("import os, sys; print('THEIRS=' + os.environ.get('THEIRS', '-')); "
             "print('PYTHONPATH=' + os.environ.get('PYTHONPATH', '')); "
             "print('HOOKED=' + str(any('hook' in p and 'site' in p for p in sys.path)))")
    import os
    import sys

    env = dict(os.environ, PYTHONPATH=str(own))
    ran = run_hooked([sys.executable, "-c", probe], env=env)
    assert ran.returncode == 0, ran.output
    assert "THEIRS=ran" in ran.output
    assert f"PYTHONPATH={own}\n" in ran.output  # a grandchild Python is not hooked again
    assert "HOOKED=False" in ran.output
    assert ran.hook.installed and not ran.hook.tensorflow


def test_a_hook_that_cannot_load_leaves_the_script_running_unwatched(tmp_path: Path) -> None:
    # A package of the person's that shadows ours: the hook cannot import itself.
    shadow = tmp_path / "shadow" / "trainer_runtime"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise RuntimeError('not gpuwatch')\n")
    import os
    import sys

    env = dict(os.environ, PYTHONPATH=str(shadow.parent))
    ran = run_hooked([sys.executable, "-c", "print('the script ran')"], env=env)
    assert ran.returncode == 0
    assert "the script ran" in ran.output
    assert not ran.hook.installed
    assert "could not load" in ran.hook.message and "not gpuwatch" in ran.hook.message


# Real scripts under the hook (TensorFlow): after the quick tests.
pytestmark = pytest.mark.slow
