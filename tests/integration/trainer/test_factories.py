"""Your own model and data through factories; built-ins; precision and XLA switches."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.integration.trainer.conftest import make_config

pytestmark = pytest.mark.slow

P = "tests.data.plugins"


def _trainer(strategy: Any, devices: Any, **sections: Any) -> Any:
    from trainer_runtime.loop import Trainer

    return Trainer(make_config(**sections), strategy, devices)


def test_model_and_data_factories_train(strategy: Any, devices: Any) -> None:
    trainer = _trainer(strategy, devices,
                       model={"factory": f"{P}:tiny_model", "kwargs": {"units": 5}},
                       data={"factory": f"{P}:ramp_dataset", "kwargs": {"features": 6},
                             "classes": 2})
    assert trainer.input_shape == (6,)
    assert trainer.param_count == 6 * 5 + 5 + 5 * 2 + 2
    steps = trainer.run_updates(3)
    assert all(math.isfinite(s.loss) for s in steps)


@pytest.mark.parametrize(("section", "spec", "message"), [
    ("model", "nope_mod.x:f",
     "model.factory 'nope_mod.x:f': cannot import module 'nope_mod.x' "
     "(No module named 'nope_mod')"),
    ("model", f"{P}:missing", f"model.factory '{P}:missing': module '{P}' has no attribute "
     "'missing'"),
    ("model", f"{P}:raises", f"model.factory '{P}:raises' raised RuntimeError: boom"),
    ("model", f"{P}:not_a_model", f"model.factory '{P}:not_a_model' returned list, "
     "expected a keras.Model"),
    ("data", "nope_mod.x:f", "data.factory 'nope_mod.x:f': cannot import module 'nope_mod.x' "
     "(No module named 'nope_mod')"),
    ("data", f"{P}:raises", f"data.factory '{P}:raises' raised RuntimeError: boom"),
    ("data", f"{P}:not_a_model", f"data.factory '{P}:not_a_model' returned list, "
     "expected a tf.data.Dataset of (features, labels)"),
])
def test_bad_factory_names_itself(strategy: Any, devices: Any, section: str, spec: str,
                                  message: str) -> None:
    from trainer_runtime.factories import FactoryError

    with pytest.raises(FactoryError) as info:
        _trainer(strategy, devices, **{section: {"factory": spec}})
    assert str(info.value) == message


@pytest.mark.parametrize("name", ["convnet", "resnet"])
def test_builtin_image_models_train(strategy: Any, devices: Any, name: str) -> None:
    trainer = _trainer(strategy, devices, model={"name": name},
                       data={"input_shape": [8, 8, 3], "examples": 256})
    assert all(math.isfinite(s.loss) for s in trainer.run_updates(2))


def test_image_model_on_flat_input_is_a_config_error(strategy: Any, devices: Any) -> None:
    from trainer_runtime.models import ModelConfigError

    with pytest.raises(ModelConfigError, match=r"data\.input_shape"):
        _trainer(strategy, devices, model={"name": "convnet"})


@pytest.mark.parametrize(("precision", "jit"), [
    ("mixed_float16", False), ("mixed_bfloat16", True), ("float32", True)])
def test_precision_and_jit_train(strategy: Any, devices: Any, precision: str, jit: bool) -> None:
    import keras

    try:
        trainer = _trainer(strategy, devices, train={"mixed_precision": precision,
                                                     "jit_compile": jit, "accumulation_steps": 2})
        if precision == "mixed_float16":
            assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
        assert all(math.isfinite(s.loss) for s in trainer.run_updates(2))
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_gpu_only_cross_device_ops_fall_back_on_cpu() -> None:
    import tensorflow as tf

    from trainer_runtime.devices import cross_device_ops_for

    for choice in ("nccl", "hierarchical_copy"):
        ops, note = cross_device_ops_for(choice, "cpu")
        assert isinstance(ops, tf.distribute.ReductionToOneDevice)
        assert choice in note and "reduce_to_one" in note


def test_a_keras_guide_model_without_input_shape_or_classes_trains(
    strategy: Any, devices: Any
) -> None:
    # def guide_model(embed_dim=32): keras.Sequential([...]) - no input_shape parameter,
    # no Input layer: the runtime passes only embed_dim and builds the model itself.
    trainer = _trainer(strategy, devices,
                       model={"factory": f"{P}:guide_model", "kwargs": {"embed_dim": 12}},
                       data={"classes": 4})
    assert trainer.param_count == 16 * 12 + 12 + 12 * 4 + 4
    steps = trainer.run_updates(3)
    assert all(math.isfinite(s.loss) for s in steps)
    assert [s.examples for s in steps] == [64, 64, 64]
