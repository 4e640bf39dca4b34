"""Resume continues the data where the checkpoint was taken; factories are held to their batch.

Ground truth for the built-in data: with GPUWATCH_RECORD_EXAMPLE_IDS set, the trainer
appends "first_position id id ..." for every batch it reads. An uninterrupted run gives
the reference id at every position; a SIGKILLed run and its resume must read the same
ids at the same positions, the resume starting exactly at the checkpoint's position.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_run_lifecycle_tf import newest_on_disk
from tests.integration.trainer.test_cli import Trainer
from trainer_runtime.data import RECORD_IDS_ENV

pytestmark = pytest.mark.slow

BATCH = 64
EXAMPLES = 1000  # not a multiple of the batch: updates straddle epochs


def _config(tmp_path: Path, name: str, batch: int = BATCH, accumulation: int = 1,
            **data: Any) -> Path:
    cfg = {
        "model": {"hidden_units": [32]},
        "data": {"examples": EXAMPLES, "input_shape": [16], "classes": 4, **data},
        "train": {"global_batch_size": batch, "accumulation_steps": accumulation,
                  "learning_rate": 0.01},
        "checkpoint": {"every_steps": 20, "keep": 5},
    }
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def _recorded(path: Path) -> dict[int, int]:
    """position -> example id, from a record file; a position read twice must agree."""
    ids: dict[int, int] = {}
    for line in path.read_text().splitlines():
        first, *batch = (int(word) for word in line.split())
        for offset, example in enumerate(batch):
            assert ids.setdefault(first + offset, example) == example
    return ids


def _run(run_dir: Path, config: Path, attempt: int, record: Path, *extra: str) -> Trainer:
    os.environ[RECORD_IDS_ENV] = str(record)
    try:
        return Trainer(run_dir, config, attempt, *extra)
    finally:
        del os.environ[RECORD_IDS_ENV]


# The reference run's length: the three attempts of the resume test end at step 90 (batch
# 64), then go on 20 updates of 128, that is to position 90 * 64 + 20 * 128 = 130 * 64.
REFERENCE_STEPS = 130


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, int]:
    """The ids of an uninterrupted run, 130 updates of 64 (over eight epochs of 1000)."""
    run_dir = tmp_path_factory.mktemp("reference")
    run = _run(run_dir, _config(run_dir, "cfg.json"), 1, run_dir / "ids",
               "--max-steps", str(REFERENCE_STEPS))
    assert run.finish() == 0
    ids = _recorded(run_dir / "ids")
    assert set(range(REFERENCE_STEPS * BATCH)) <= set(ids)
    # Each epoch is a permutation of all the examples, and epochs differ in order.
    for epoch in range(5):
        assert sorted(ids[p] for p in range(epoch * EXAMPLES, (epoch + 1) * EXAMPLES)) == list(
            range(EXAMPLES)) or epoch == 5
    assert [ids[p] for p in range(20)] != [ids[EXAMPLES + p] for p in range(20)]
    return ids


def test_resumes_after_a_sigkill_and_under_new_batch_settings_continue_steps_examples_and_loss(
    tmp_path: Path, reference: dict[int, int]
) -> None:
    """One run, three attempts: SIGKILLed past its checkpoint at step 40; resumed as it was
    to step 90; resumed again at batch 128 in 2 micro-batches to step 110. Each resume
    starts at its checkpoint's step, micro-step and example position, reads the examples
    an uninterrupted run reads there, and keeps the weights (the loss goes on)."""
    config = _config(tmp_path, "cfg.json")
    # The first attempt reads 20 ms a batch (the data and its order are the same): the
    # kill lands 13 steps, some 260 ms, before its next checkpoint at 60, even when this
    # test sees step 47 late. At full speed a loaded box once let it reach that checkpoint
    # first, and no step was left to lose.
    slow = _config(tmp_path, "slow.json", read_latency_ms=20)
    first = _run(tmp_path, slow, 1, tmp_path / "ids1")
    first.wait_frame(lambda f: f["type"] == "step" and f["step"] >= 47, "step 47")
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.finish()
    announced = first.of("checkpoint")[-1]["step"]
    assert announced >= 40 and first.of("step")[-1]["step"] > announced, "steps were lost"
    on_disk = newest_on_disk(tmp_path)

    # Attempt 2, after the SIGKILL: from the last checkpoint, the same settings. (The kill
    # may land after a save whose event it cut off: then that newer one, on disk.)
    second = _run(tmp_path, config, 2, tmp_path / "ids2", "--max-steps", "90")
    assert second.finish() == 0
    resume = second.of("resume")[0]
    checkpoint = resume["from_step"]
    assert announced <= checkpoint <= on_disk, (announced, resume, on_disk)
    assert resume["position"] == checkpoint * BATCH
    assert resume["data_order"] == "continued"
    done = second.of("done")[-1]
    assert (done["reason"], done["step"]) == ("max_steps", 90)

    before, after = _recorded(tmp_path / "ids1"), _recorded(tmp_path / "ids2")
    assert min(after) == checkpoint * BATCH, "the resume reads from the checkpoint's position"
    trained = [before[p] for p in range(checkpoint * BATCH)]
    trained += [after[p] for p in range(checkpoint * BATCH, 90 * BATCH)]
    assert trained == [reference[p] for p in range(90 * BATCH)]
    steps = second.of("step")
    assert [f["step"] for f in steps] == list(range(checkpoint + 1, 91))
    assert steps[0]["position"] == (checkpoint + 1) * BATCH
    assert [f["examples"] for f in steps] == [BATCH] * len(steps)
    assert steps[-1]["epoch"] == 90 * BATCH // EXAMPLES

    # Attempt 3: from the checkpoint attempt 2 wrote as it finished, at another batch and
    # accumulation (2 micro-batches of 64, where attempt 2 had 1 of 64).
    changed = _config(tmp_path, "b.json", batch=128, accumulation=2)
    third = _run(tmp_path, changed, 3, tmp_path / "ids3", "--max-steps", "110")
    assert third.finish() == 0
    resume = third.of("resume")[0]
    assert (resume["from_step"], resume["position"]) == (90, 90 * BATCH)
    assert resume["from_micro_step"] == 90
    assert third.of("hello")[0]["accumulation_steps"] == 2
    after = _recorded(tmp_path / "ids3")
    assert min(after) == 90 * BATCH
    span = range(90 * BATCH, 90 * BATCH + 20 * 128)
    assert span.stop == REFERENCE_STEPS * BATCH
    assert [after[p] for p in span] == [reference[p] for p in span]
    steps = third.of("step")
    assert [f["step"] for f in steps] == list(range(91, 111))
    assert steps[0]["micro_step"] == 92
    assert [f["examples"] for f in steps] == [128] * 20
    # The weights came back with the step: the loss had fallen by half and goes on from there.
    initial = first.of("step")[0]["loss"]
    recent = [f["loss"] for f in second.of("step")][-20:]
    assert max(recent) < initial / 2, (initial, recent)
    assert steps[0]["loss"] <= max(recent) * 1.5, (steps[0]["loss"], recent)


def _factory_config(tmp_path: Path, name: str, factory: str, batch: int = BATCH,
                    **kwargs: Any) -> Path:
    cfg = {
        "model": {"hidden_units": [16]},
        "data": {"factory": factory, "kwargs": kwargs, "classes": 4},
        "train": {"global_batch_size": batch, "learning_rate": 0.01},
        "checkpoint": {"every_steps": 10, "keep": 5},
    }
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def test_factory_pipeline_resumes_where_its_checkpoint_was_taken_and_restarts_under_a_new_batch(
    tmp_path: Path,
) -> None:
    record = tmp_path / "ids"
    factory = "tests.data.plugins:counting_dataset"
    config = _factory_config(tmp_path, "cfg.json", factory, record=str(record))
    first = Trainer(tmp_path, config, 1)
    first.wait_frame(lambda f: f["type"] == "step" and f["step"] >= 25, "step 25")
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.finish()
    announced = first.of("checkpoint")[-1]["step"]
    for pipeline in (0, 1):
        Path(f"{record}.{pipeline}").rename(f"{record}.{pipeline}.first")

    # The SIGKILL may land after a save whose event it cut off: the resume is from the
    # newest checkpoint on disk, which may be one past the last announced (seen once).
    on_disk = newest_on_disk(tmp_path)
    second = Trainer(tmp_path, config, 2, "--max-steps", str(on_disk + 5))
    assert second.finish() == 0
    resume = second.of("resume")[0]
    assert resume["data_order"] == "continued", resume
    checkpoint = resume["from_step"]
    assert announced <= checkpoint <= on_disk, (announced, resume, on_disk)
    per_replica = BATCH // 2
    for pipeline in (0, 1):
        batches = [[int(word) for word in line.split()]
                   for line in Path(f"{record}.{pipeline}").read_text().splitlines()]
        # Pipeline i holds ids i, i+2, ...: after `checkpoint` batches of 32 it is at
        # id 2 * 32 * checkpoint + i.
        start = 2 * per_replica * checkpoint + pipeline
        assert min(batches) == list(range(start, start + 2 * per_replica, 2)), pipeline

    # Attempt 3 asks for another batch: the pipeline's saved state (2 x 32) cannot serve it.
    bigger = _factory_config(tmp_path, "b.json", factory, batch=128, record=str(record))
    third = Trainer(tmp_path, bigger, 3, "--max-steps", str(on_disk + 7))
    assert third.finish() == 0
    resume = third.of("resume")[0]
    assert resume["data_order"] == "restarted"
    assert "2 x 32" in resume["data_note"] and "starts over" in resume["data_note"]


def test_factory_pipeline_tf_data_cannot_save_says_its_data_order_restarted(
    tmp_path: Path,
) -> None:
    config = _factory_config(tmp_path, "cfg.json", "tests.data.plugins:counting_dataset",
                             record=str(tmp_path / "ids"), stateful=True)
    first = Trainer(tmp_path, config, 1, "--max-steps", "10")
    assert first.finish() == 0
    second = Trainer(tmp_path, config, 2, "--max-steps", "12")
    assert second.finish() == 0
    resume = second.of("resume")[0]
    assert resume["data_order"] == "restarted"
    assert "PyFunc is stateful" in resume["data_note"], resume["data_note"]


@pytest.mark.parametrize(
    ("factory", "got"),
    [("tests.data.plugins:fixed_batch_dataset", 32),  # static shape: caught at build
     ("tests.data.plugins:half_batch_dataset", 32)],  # unknown shape: the first batch
)
def test_a_factory_batch_other_than_asked_exits_2_naming_both(
    tmp_path: Path, factory: str, got: int
) -> None:
    # Global batch 128 over 2 replicas: each factory is asked for 64 per replica.
    config = _factory_config(tmp_path, "cfg.json", factory, batch=128)
    run = Trainer(tmp_path, config, 1, "--max-steps", "5")
    assert run.finish() == 2
    stderr = run.proc.stderr.read() if run.proc.stderr else ""
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr[-2000:]
    assert f"of {got} examples per replica" in errors[0]
    assert "per_replica_batch_size=64" in errors[0]
    assert run.of("error")[0]["kind"] == "factory"
    assert not run.of("step"), "nothing is reported as trained"
    assert not list((tmp_path / "checkpoints").glob("ckpt-*")), "and nothing saved"


def test_a_checkpoint_on_disk_always_has_its_pipeline_state(
    strategy: Any, devices: Any, tmp_path: Path
) -> None:
    """A factory pipeline's saved iterators are written before the model's checkpoint of
    the same step, so a process killed between the two never leaves a ckpt-<step> whose
    resume restarts the data order (seen in a fresh-clone run, with the other order); the
    states of checkpoints no longer kept go with them."""
    from tests.integration.trainer.conftest import make_config
    from trainer_runtime.loop import Trainer as InProcessTrainer

    cfg = make_config(
        data={"factory": "tests.data.plugins:counting_dataset", "classes": 4},
        checkpoint={"enabled": True, "every_steps": 10, "keep": 2})
    trainer = InProcessTrainer(cfg, strategy, devices, run_dir=str(tmp_path))
    assert trainer.manager is not None
    data = tmp_path / "checkpoints" / "data"
    seen: list[tuple[int, bool]] = []
    save = trainer.manager.save

    def model_save(checkpoint_number: int) -> str:
        seen.append((checkpoint_number, (data / f"data-{checkpoint_number}.index").exists()))
        return save(checkpoint_number=checkpoint_number)

    trainer.manager.save = model_save  # type: ignore[method-assign]
    for _ in range(3):
        trainer.run_updates(2)
        trainer.save()
    assert seen == [(2, True), (4, True), (6, True)]
    assert sorted(p.name for p in data.glob("data-*.index")) == [
        "data-4.index", "data-6.index"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("ckpt-*.index")) == [
        "ckpt-4.index", "ckpt-6.index"]
