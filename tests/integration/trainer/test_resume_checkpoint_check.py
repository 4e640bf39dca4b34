"""gpuwatch's look at a checkpoint before a resume (gpuwatch/runs/resume.py, no TensorFlow there)
against checkpoints TensorFlow itself writes: a whole one passes, and each damage it
calls fatal is one TensorFlow cannot restore from either (it trains from step 0, or stops)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tensorflow as tf

from gpuwatch.runs.resume import INDEX_MAGIC, checkpoint_problem, has_checkpoint


def saved(run_dir: Path, steps: tuple[int, ...] = (10, 20)) -> tf.train.CheckpointManager:
    """A CheckpointManager as the trainer keeps one: run_dir/checkpoints, ckpt-<step>."""
    step = tf.Variable(0, dtype=tf.int64)
    weights = tf.Variable(tf.ones((4, 4)))
    ckpt = tf.train.Checkpoint(step=step, weights=weights)
    manager = tf.train.CheckpointManager(ckpt, str(run_dir / "checkpoints"), max_to_keep=3)
    for number in steps:
        step.assign(number)
        manager.save(checkpoint_number=number)
    return manager


def restored_step(run_dir: Path) -> int | None:
    """The step TensorFlow restores from run_dir/checkpoints as the trainer does; None when
    it finds no checkpoint to restore."""
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(step=step, weights=tf.Variable(tf.zeros((4, 4))))
    manager = tf.train.CheckpointManager(ckpt, str(run_dir / "checkpoints"), max_to_keep=3)
    if not manager.latest_checkpoint:
        return None
    ckpt.restore(manager.latest_checkpoint).expect_partial()
    return int(step.numpy())


def test_a_whole_checkpoint_passes_and_its_index_ends_in_the_footer(tmp_path: Path) -> None:
    saved(tmp_path)
    assert (tmp_path / "checkpoints" / "ckpt-20.index").read_bytes()[-8:] == INDEX_MAGIC
    assert has_checkpoint(tmp_path) and checkpoint_problem(tmp_path) is None
    assert restored_step(tmp_path) == 20


def test_no_checkpoint_is_no_problem_and_none_to_restore(tmp_path: Path) -> None:
    assert not has_checkpoint(tmp_path) and checkpoint_problem(tmp_path) is None
    (tmp_path / "checkpoints").mkdir()
    assert not has_checkpoint(tmp_path) and checkpoint_problem(tmp_path) is None
    assert restored_step(tmp_path) is None


@pytest.mark.parametrize("damage", ["index-garbage", "index-gone", "footer", "no-data"])
def test_each_damage_it_refuses_is_one_tensorflow_cannot_resume_from(
    tmp_path: Path, damage: str
) -> None:
    saved(tmp_path, steps=(20,))
    folder = tmp_path / "checkpoints"
    if damage == "index-garbage":
        (folder / "checkpoint").write_text("hello world\n")
    elif damage == "index-gone":
        (folder / "checkpoint").unlink()
    elif damage == "footer":
        index = folder / "ckpt-20.index"
        index.write_bytes(index.read_bytes()[:-8] + os.urandom(8))
    else:
        for data in folder.glob("ckpt-20.data-*"):
            data.unlink()
    assert checkpoint_problem(tmp_path) is not None
    try:
        step = restored_step(tmp_path)
    except Exception:  # any failure to restore is what is asserted
        step = None
    assert step is None, "TensorFlow restored it: gpuwatch should not have refused"
