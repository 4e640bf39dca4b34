"""Built-in models (mlp, convnet, resnet) and ``pkg.module:factory`` plug-ins.

Your own model (``model.factory`` + ``model.kwargs``) is called once, inside
``strategy.scope()``, before training starts::

    build_model(input_shape: tuple[int, ...], classes: int, **model.kwargs) -> keras.Model

It gets only the parameters it declares (``factories.call_factory``); ``input_shape`` is
the per-example feature shape, taken from the data. It maps features to ``classes``
logits (no softmax: the runtime trains with sparse categorical cross-entropy from
logits) and builds its layers inside the factory, so its variables are mirrored (the
whole contract: docs/factories.md). A factory that cannot be imported, raises, or returns
something other than a ``keras.Model`` stops the trainer with exit 2 and one ``error:``
line naming it.
"""

from __future__ import annotations

import keras

from trainer_runtime.factories import FactoryError, call_factory, load_factory
from trainer_runtime.schema import ModelConfig


class ModelConfigError(Exception):
    """A built-in model that cannot take this input shape."""


def _mlp(cfg: ModelConfig, input_shape: tuple[int, ...], classes: int) -> keras.Model:
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs) if len(input_shape) > 1 else inputs
    for units in cfg.hidden_units:
        x = keras.layers.Dense(units, activation="relu")(x)
        if cfg.dropout:
            x = keras.layers.Dropout(cfg.dropout)(x)
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="mlp")


def _image_input(name: str, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) != 3:
        raise ModelConfigError(
            f"model.name {name!r} needs data.input_shape [height, width, channels], "
            f"got {list(input_shape)}")


def _convnet(cfg: ModelConfig, input_shape: tuple[int, ...], classes: int) -> keras.Model:
    _image_input("convnet", input_shape)
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    if cfg.dropout:
        x = keras.layers.Dropout(cfg.dropout)(x)
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="convnet")


def _resnet(cfg: ModelConfig, input_shape: tuple[int, ...], classes: int) -> keras.Model:
    _image_input("resnet", input_shape)
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    for filters, stride in ((32, 1), (64, 2)):
        shortcut = x
        y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", activation="relu")(x)
        y = keras.layers.Conv2D(filters, 3, padding="same")(y)
        if stride != 1 or shortcut.shape[-1] != filters:
            shortcut = keras.layers.Conv2D(filters, 1, strides=stride)(shortcut)
        x = keras.layers.Activation("relu")(keras.layers.Add()([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    if cfg.dropout:
        x = keras.layers.Dropout(cfg.dropout)(x)
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="resnet")


BUILTINS = {"mlp": _mlp, "convnet": _convnet, "resnet": _resnet}


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], classes: int) -> keras.Model:
    """Call inside ``strategy.scope()``. Raises FactoryError / ModelConfigError."""
    if not cfg.factory:
        return BUILTINS[cfg.name](cfg, input_shape, classes)
    factory = load_factory("model.factory", cfg.factory)
    model = call_factory("model.factory", cfg.factory, factory,
                         {"input_shape": input_shape, "classes": classes}, cfg.kwargs)
    if not isinstance(model, keras.Model):
        raise FactoryError(
            f"model.factory {cfg.factory!r} returned {type(model).__name__}, "
            "expected a keras.Model")
    if not model.built:
        # A model written without an input shape (as the Keras guides do): build it
        # here, in the strategy's scope, so its variables exist before the first step.
        try:
            model.build((None, *input_shape))
        except Exception as exc:
            raise FactoryError(
                f"model.factory {cfg.factory!r} returned a model that cannot be built for "
                f"input shape {list(input_shape)} ({type(exc).__name__}: {exc})") from exc
    return model
