"""The trainer's side of strategy.replicas (devices.setup_devices): the first N GPUs, N logical
CPU replicas with no GPU, and more GPUs than visible refused as a config error.

There is no GPU here: TensorFlow's device listing is replaced by one that reports GPUs,
and what setup_devices asks of it (which GPUs to make visible, memory growth) is recorded.
A real trainer at strategy.replicas=1 on CPU is in tests/integration/test_scale.py (its hello
says 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from trainer_runtime.schema import StrategyConfig


@dataclass(frozen=True)
class FakeDevice:
    name: str
    device_type: str = "GPU"


class FakeGpus:
    """tf.config's GPU calls over `count` GPUs, recording what is asked of them."""

    def __init__(self, count: int) -> None:
        self.physical = [FakeDevice(f"/physical_device:GPU:{i}") for i in range(count)]
        self.visible = list(self.physical)
        self.grown: list[str] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import tensorflow as tf

        real_physical = tf.config.list_physical_devices

        def physical(kind: str | None = None) -> list[Any]:
            return list(self.physical) if kind == "GPU" else real_physical(kind)

        def set_visible(devices: list[Any], kind: str | None = None) -> None:
            assert kind == "GPU"
            self.visible = list(devices)

        def logical(kind: str | None = None) -> list[Any]:
            assert kind == "GPU"
            return [FakeDevice(f"/device:GPU:{i}") for i in range(len(self.visible))]

        def grow(device: Any, enable: bool) -> None:
            self.grown.append(device.name)

        monkeypatch.setattr(tf.config, "list_physical_devices", physical)
        monkeypatch.setattr(tf.config, "set_visible_devices", set_visible)
        monkeypatch.setattr(tf.config, "list_logical_devices", logical)
        monkeypatch.setattr(tf.config.experimental, "set_memory_growth", grow)


def test_replicas_null_uses_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_runtime.devices import setup_devices

    gpus = FakeGpus(4)
    gpus.install(monkeypatch)
    devices = setup_devices(StrategyConfig())
    assert devices.kind == "gpu" and len(devices.names) == 4
    assert len(gpus.visible) == 4 and len(gpus.grown) == 4


def test_replicas_n_makes_the_first_n_gpus_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_runtime.devices import setup_devices

    gpus = FakeGpus(4)
    gpus.install(monkeypatch)
    devices = setup_devices(StrategyConfig(replicas=2))
    assert devices.names == ["/device:GPU:0", "/device:GPU:1"]
    assert [d.name for d in gpus.visible] == ["/physical_device:GPU:0", "/physical_device:GPU:1"]
    assert gpus.grown == ["/physical_device:GPU:0", "/physical_device:GPU:1"]


def test_more_gpus_than_visible_is_a_device_shortage(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_runtime.devices import DeviceShortage, setup_devices

    gpus = FakeGpus(2)
    gpus.install(monkeypatch)
    with pytest.raises(DeviceShortage, match=r"^strategy\.replicas: 4 GPUs asked for, but 2 are"):
        setup_devices(StrategyConfig(replicas=4))
    assert len(gpus.visible) == 2 and gpus.grown == []  # nothing touched


def test_no_gpu_splits_the_cpu_into_the_replicas_asked_for(devices: Any) -> None:
    # The session's split (2 logical CPUs) is already made: N of them are used.
    from trainer_runtime.devices import setup_devices

    assert len(setup_devices(StrategyConfig(replicas=1)).names) == 1
    assert len(setup_devices(StrategyConfig(replicas=None, cpu_replicas=2)).names) == 2
