"""TensorFlow in a test process: the CPU split into the trainer tests' replicas on import.

The split into logical CPU devices (trainer_runtime.devices.setup_devices) can only be
made before TensorFlow runs its first op in a process, and an xdist worker runs whichever
modules it is handed: one that wrote a checkpoint or read back a TensorBoard file with
TensorFlow left the worker unable to split its CPU for a later module's 2-replica
strategy (an order-dependent error). So the split is made at the one moment every
in-process use of TensorFlow passes through, its import, whatever module imports it
first; the ``devices`` fixture then finds it made. Processes the tests start are not
affected: this hook lives in the test process only (tests/conftest.py installs it).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

# How many logical CPU replicas every in-process strategy of the tests gets.
TEST_CPU_REPLICAS = 2


def split_cpu(tf: Any, replicas: int = TEST_CPU_REPLICAS) -> None:
    """The CPU split as trainer_runtime.devices.setup_devices makes it on a box with no GPU,
    made now (TensorFlow imported, no op run). Here, not through setup_devices: TensorFlow's
    import may be that module's own, half done."""
    if tf.config.list_physical_devices("GPU"):
        return  # GPU replicas: setup_devices makes them visible itself
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])


class _SplitOnImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` as the other finders do, and splits the CPU once it is imported."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        # It stays on sys.meta_path: a look that imports nothing (importlib.util.find_spec,
        # as `gpuwatch doctor` and the CLI ask whether TensorFlow is installed) must not
        # use it up; once TensorFlow is imported, sys.modules answers first.
        if fullname != "tensorflow" or fullname in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        exec_module = loader.exec_module

        def exec_then_split(module: ModuleType) -> None:
            exec_module(module)
            split_cpu(module)

        loader.exec_module = exec_then_split
        return spec


def install() -> None:
    """Split the CPU when TensorFlow is first imported in this process (now, if it was)."""
    if "tensorflow" in sys.modules:
        split_cpu(sys.modules["tensorflow"])
        return
    if not any(isinstance(finder, _SplitOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _SplitOnImport())
