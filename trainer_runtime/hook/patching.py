"""How the hook patches: after an import, a method of a class, and the small helpers
its patches share. Nothing here imports TensorFlow."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
from collections.abc import Callable, Sequence
from types import ModuleType, TracebackType
from typing import Any

# Why input wait is not measured when the script turned on op determinism.
DETERMINISM = ("op determinism is on (tf.config.experimental.enable_op_determinism): "
               "TensorFlow refuses timestamps in the graph; without it the wait is measured")


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


# The hook's own files: their frames are left out of a traceback the script shows.
HOOK_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def without_hook_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback with the hook's frames (its patches' wrappers, between the script's
    call and the library's code) left out, the others in their order."""
    kept: list[TracebackType] = []
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(HOOK_DIR):
            kept.append(tb)
        tb = tb.tb_next
    out: TracebackType | None = None
    for entry in reversed(kept):
        out = TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def excepthook_without_hook_frames(
    previous: Callable[[type[BaseException], BaseException, TracebackType | None], Any],
) -> Callable[[type[BaseException], BaseException, TracebackType | None], Any]:
    """sys.excepthook for the watched script: the traceback it prints on an uncaught
    error is the script's and its libraries', with no frame of gpuwatch's hook in it (its
    wrappers sit in every patched call, and made gpuwatch look to blame), chained errors
    too. Any trouble here and the error is printed as it was."""

    def excepthook(kind: type[BaseException], value: BaseException,
                   tb: TracebackType | None) -> Any:
        try:
            seen: set[int] = set()
            pending: list[BaseException | None] = [value]
            while pending:
                exc = pending.pop()
                if exc is None or id(exc) in seen:
                    continue
                seen.add(id(exc))
                exc.__traceback__ = without_hook_frames(exc.__traceback__)
                pending += [exc.__cause__, exc.__context__]
            tb = value.__traceback__
        except Exception:
            pass
        return previous(kind, value, tb)

    excepthook.__gpuwatch__ = True  # type: ignore[attr-defined]
    return excepthook
