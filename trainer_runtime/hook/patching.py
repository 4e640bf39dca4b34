"""How the hook patches: after an import, a method of a class, and the small helpers
its patches share. Nothing here imports TensorFlow."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# Why input wait is not measured when the script turned on op determinism.
DETERMINISM = ("op determinism is on (tf.config.experimental.enable_op_determinism): "
               "TensorFlow refuses timestamps in the graph")


def deterministic() -> bool:
    """Whether the script turned on op determinism (tf.timestamp then fails at run time)."""
    from tensorflow.python.framework import config

    return bool(config.is_op_determinism_enabled())


def one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a named module has executed (its first import)."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.callbacks = callbacks
        self._busy: set[str] = set()

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name not in self.callbacks or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            return None
        finally:
            self._busy.discard(name)
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        callback = self.callbacks.pop(name)
        run_module = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            callback(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def wrap(owner: type, name: str, wrapper: Callable[..., Any]) -> None:
    """owner.name = a method that calls wrapper(original, self, *args, **kwargs)."""
    original = owner.__dict__.get(name) or getattr(owner, name)
    if getattr(original, "__gpuwatch__", False):
        return

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, self, *args, **kwargs)

    method.__name__ = getattr(original, "__name__", name)
    method.__qualname__ = getattr(original, "__qualname__", name)
    method.__doc__ = getattr(original, "__doc__", None)
    method.__wrapped__ = original  # type: ignore[attr-defined]
    method.__gpuwatch__ = True  # type: ignore[attr-defined]
    setattr(owner, name, method)


_GRAPH_STATE: dict[int, dict[str, Any]] = {}


def graph_state(graph: Any) -> dict[str, Any]:
    """What a traced step leaves for the next patch in the same graph (its fetch stamps,
    its end stamp)."""
    return _GRAPH_STATE.setdefault(id(graph), {})
