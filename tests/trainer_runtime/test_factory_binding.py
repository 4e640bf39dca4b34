"""Factories get only the parameters they declare (trainer_runtime.factories.call_factory).

No TensorFlow needed: the binding is plain Python, checked here with the signatures
people write (the Keras guides', the positional style, **kwargs) and the ones they get
wrong (a kwarg the factory does not take, a parameter nobody supplies).
"""

from __future__ import annotations

from typing import Any

import pytest

from trainer_runtime.factories import FactoryError, call_factory

MODEL = {"input_shape": (28, 28, 1), "classes": 10}
DATA = {"input_context": "CTX", "per_replica_batch_size": 64}


def calls(fn: Any, offered: dict[str, Any], kwargs: dict[str, Any] | None = None,
          key: str = "model.factory") -> Any:
    return call_factory(key, "pkg.mod:fn", fn, offered, kwargs or {})


def test_the_documented_signature_gets_everything() -> None:
    def build_model(input_shape: Any, classes: int, width: int = 8) -> Any:
        return input_shape, classes, width

    assert calls(build_model, MODEL, {"width": 16}) == ((28, 28, 1), 10, 16)


def test_a_keras_guide_model_without_input_shape_or_classes_gets_only_its_kwargs() -> None:
    def build_model(embed_dim: int = 32) -> Any:
        return embed_dim

    assert calls(build_model, MODEL) == 32
    assert calls(build_model, MODEL, {"embed_dim": 16}) == 16


def test_required_positional_parameters_with_other_names_take_the_conventional_order() -> None:
    def make_dataset(ctx: Any, batch: int) -> Any:
        return ctx, batch

    assert calls(make_dataset, DATA, key="data.factory") == ("CTX", 64)


def test_a_defaulted_parameter_keeps_its_default_and_kwargs_take_the_rest() -> None:
    seen: dict[str, Any] = {}

    def make_dataset(ctx: Any, batch_size: int = 32, **rest: Any) -> Any:
        seen.update(rest)
        return ctx, batch_size

    # batch_size is not a name gpuwatch passes: it keeps 32 (the trainer's batch
    # check then stops the run, naming 32 and 64); **rest receives the real size.
    assert calls(make_dataset, DATA, key="data.factory") == ("CTX", 32)
    assert seen == {"per_replica_batch_size": 64}


def test_var_kwargs_take_every_value_once() -> None:
    def anything(*args: Any, **kwargs: Any) -> Any:
        return args, kwargs

    args, kwargs = calls(anything, MODEL, {"depth": 3})
    assert args == () and kwargs == {"input_shape": (28, 28, 1), "classes": 10, "depth": 3}


def test_keyword_only_and_positional_only_parameters() -> None:
    def build(input_shape: Any, /, *, classes: int, scale: float = 1.0) -> Any:
        return input_shape, classes, scale

    assert calls(build, MODEL, {"scale": 2.0}) == ((28, 28, 1), 10, 2.0)


def test_a_kwarg_the_factory_does_not_take_names_the_config_key() -> None:
    def build_model(embed_dim: int = 32) -> Any:
        return embed_dim

    with pytest.raises(FactoryError) as refused:
        calls(build_model, MODEL, {"embed_dims": 16})
    assert str(refused.value) == (
        "model.kwargs.embed_dims: model.factory 'pkg.mod:fn' has no parameter 'embed_dims' "
        "(it takes: embed_dim)"
    )


def test_a_required_parameter_nobody_supplies_is_named() -> None:
    def build_model(input_shape: Any, classes: int, vocabulary: list[str]) -> Any:
        return vocabulary

    with pytest.raises(FactoryError) as refused:
        calls(build_model, MODEL)
    assert str(refused.value) == (
        "model.factory 'pkg.mod:fn': its parameter 'vocabulary' is neither one gpuwatch "
        "passes (input_shape, classes) nor in model.kwargs"
    )


def test_what_a_factory_raises_is_a_factory_error_with_the_cause() -> None:
    def build_model(**_: Any) -> Any:
        raise MemoryError("cannot allocate 10 TB")

    with pytest.raises(FactoryError, match="raised MemoryError: cannot allocate 10 TB"):
        calls(build_model, MODEL)


def test_a_value_asked_for_by_name_is_not_given_again_by_position() -> None:
    def build_model(n_classes: int, input_shape: Any) -> Any:
        return n_classes, input_shape

    assert calls(build_model, MODEL) == (10, (28, 28, 1))

    def make_dataset(batch: int, input_context: Any) -> Any:
        return batch, input_context

    assert calls(make_dataset, DATA, key="data.factory") == (64, "CTX")


def test_a_positional_only_parameter_after_a_defaulted_one_is_refused_not_misplaced() -> None:
    def make_dataset(ctx: Any = None, per_replica_batch_size: int = 1, /) -> Any:
        return ctx, per_replica_batch_size

    with pytest.raises(FactoryError, match="positional-only parameter 'per_replica_batch_size'"):
        calls(make_dataset, DATA, key="data.factory")
