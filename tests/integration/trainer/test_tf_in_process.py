"""TensorFlow started in-process by one test module leaves the next its two CPU replicas.

An xdist worker once wrote a checkpoint with TensorFlow in one module, and a later module's
session ``devices`` fixture could no longer split the CPU (``assert 1 == 2``): the suite
passed or failed by which modules a worker was handed first. tests/support/tf_devices.py
splits the CPU at TensorFlow's import, whoever imports it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support import tf_devices

pytestmark = pytest.mark.slow

# An op first, as a module that writes a checkpoint does; the trainer tests' split after.
_OP_THEN_SPLIT = """
import sys
{install}
import tensorflow as tf
float(tf.reduce_sum(tf.ones([4])))
from trainer_runtime.devices import setup_devices
print(len(setup_devices({replicas}).names))
"""


def _replicas_after_an_op(install: bool) -> int:
    code = _OP_THEN_SPLIT.format(
        # A look that imports nothing first, as test_doctor's and the CLI's: the hook
        # must still split the CPU at the import that follows (it once was used up).
        install=("from tests.support import tf_devices; tf_devices.install()\n"
                 "import importlib.util; assert importlib.util.find_spec('tensorflow')"
                 if install else ""),
        replicas=tf_devices.TEST_CPU_REPLICAS)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, env={"TF_CPP_MIN_LOG_LEVEL": "2",
                                                       "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.split()[-1])


def test_an_op_before_the_devices_fixture_still_leaves_two_replicas() -> None:
    assert _replicas_after_an_op(install=True) == tf_devices.TEST_CPU_REPLICAS
    # The failure it prevents is real: without the hook the CPU stays whole.
    assert _replicas_after_an_op(install=False) == 1


def test_this_test_process_splits_tensorflow_at_its_import() -> None:
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        assert len(tf.config.list_logical_devices("CPU")) == tf_devices.TEST_CPU_REPLICAS
    else:
        assert any(isinstance(finder, tf_devices._SplitOnImport) for finder in sys.meta_path)
