"""The hook's patches on Keras 3 (TensorFlow backend): ``fit``, and the optimizer.

In the tested range (TESTED_KERAS), ``fit`` trains with the train function Keras would
build, built the same way with stamps (fit.py); outside it, or with op determinism on,
with a per-batch callback, and the screen says input wait is not measurable. While
``fit``, ``evaluate`` or ``predict`` runs, the custom-loop patches stand by. The
optimizer's ``apply`` tells a custom loop's training step from any other
``strategy.run``, and counts the model's parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from trainer_runtime.hook.patching import DETERMINISM, deterministic, one_line, wrap

if TYPE_CHECKING:
    from trainer_runtime.hook.watching import KerasWatch

# Keras versions whose TensorFlow trainer builds its train function as watched here
# (``TensorFlowTrainer._make_function``: an inner tf.function of strategy.run and an
# outer one over the iterator; keras-team/keras v3.7 to v3.15).
TESTED_KERAS = ((3, 7), (3, 15))
KERAS_TRAINER = "keras.src.backend.tensorflow.trainer"
KERAS_OPTIMIZER = "keras.src.optimizers.base_optimizer"
KERAS_MODEL = "keras.src.models.model"


def keras_version(text: str) -> tuple[int, int] | None:
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def _range() -> str:
    (low_major, low_minor), (high_major, high_minor) = TESTED_KERAS
    return f"{low_major}.{low_minor} to {high_major}.{high_minor}"


def _untested(version: str) -> str:
    return f"Keras {version} is outside the tested {_range()}"


def patch_optimizer(watch: KerasWatch, module: ModuleType) -> None:
    def apply(original: Callable[..., Any], optimizer: Any, grads: Any,
              trainable_variables: Any = None, *args: Any, **kwargs: Any) -> Any:
        watch.applies += 1
        if watch.applied_by is None:  # the step's first (a GAN's generator's, say)
            watch.applied_by = optimizer
        if trainable_variables is not None and not watch.param_count:
            try:
                watch.count_params(list(trainable_variables))
            except Exception:
                pass
        # An update outside strategy.run and fit is a step of its own (updates.py).
        return watch.updates.apply(original, optimizer, grads, trainable_variables, *args,
                                   **kwargs)

    wrap(module.BaseOptimizer, "apply", apply)


def patch_model(watch: KerasWatch, module: ModuleType) -> None:
    """A top-level model call outside fit and strategy.run: its batch's examples are the
    next update's (updates.py)."""
    wrap(module.Model, "__call__", watch.updates.model_call)


def patch_trainer(watch: KerasWatch, module: ModuleType) -> None:
    from keras.src.version import __version__

    from trainer_runtime.hook import fit as fit_hook

    watch.keras_version = str(__version__)
    trainer = module.TensorFlowTrainer
    version = keras_version(watch.keras_version)
    tested = (version is not None and TESTED_KERAS[0] <= version <= TESTED_KERAS[1]
              and hasattr(trainer, "_make_function"))

    def in_keras(original: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> Any:
        watch.keras_depth += 1
        try:
            return original(model, *args, **kwargs)
        finally:
            watch.keras_depth -= 1

    def fit(original: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            args, kwargs = prepare_fit(model, args, kwargs)
        except Exception as exc:
            model._gpuwatch_graphed = False
            watch.set_loop("fit", "not measured", f"fit not watched: {one_line(exc)}")
            return in_keras(original, model, *args, **kwargs)
        initial = kwargs.get("initial_epoch", args[11] if len(args) > 11 else 0)
        watch.epoch_start = int(initial or 0)  # Keras numbers this fit's epochs from it
        if not watch.hello_sent:  # the steps go on from a restored optimizer's count
            try:
                watch.step = max(watch.step, int(model.optimizer.iterations.numpy()))
            except Exception:
                pass
        stop = watch.on_max_steps
        watch.on_max_steps = lambda: setattr(model, "stop_training", True)
        watch.loops.flush_pending()
        try:
            return in_keras(original, model, *args, **kwargs)
        finally:
            watch.on_max_steps = stop

    def prepare_fit(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        watch.note_strategy(model.distribute_strategy)
        watch.count_params(model.trainable_weights)
        graphed = tested and not deterministic()
        model._gpuwatch_graphed = graphed
        if graphed:
            watch.set_loop("fit")
        else:
            why = DETERMINISM if tested else _untested(watch.keras_version)
            watch.set_loop("fit (callback)", f"steps come from a per-batch callback: {why}"
                           + ("" if tested else "; a Keras in that range measures it"))
            args, kwargs = fit_hook.with_callback(watch, model, args, kwargs)
        return args, kwargs

    wrap(trainer, "fit", fit)
    wrap(trainer, "evaluate", in_keras)
    wrap(trainer, "predict", in_keras)
    if tested:
        def make_train_function(original: Callable[..., Any], model: Any,
                                force: bool = False) -> Any:
            if model.train_function is not None and not force:
                return model.train_function
            if (watch.keras_depth == 0 or watch.stopped  # train_on_batch: Keras' own
                    or not getattr(model, "_gpuwatch_graphed", False)):
                return original(model, force)
            try:
                model.train_function = fit_hook.train_function(watch, model)
            except Exception as exc:
                watch.set_loop("fit", "not measured: " + one_line(exc))
                return original(model, force)
            return model.train_function

        wrap(trainer, "make_train_function", make_train_function)
    watch.send_hook()
