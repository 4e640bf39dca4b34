"""Loading ``pkg.module:function`` plug-ins, with one clear line when that fails."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class FactoryError(Exception):
    """A model/data factory that cannot be imported, raises, or returns the wrong type."""


def load_factory(key: str, spec: str) -> Callable[..., Any]:
    """Resolve ``spec`` ("pkg.module:function"); ``key`` names the config key in errors."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise FactoryError(f"{key} {spec!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module itself raising at import
        raise FactoryError(
            f"{key} {spec!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc})" if not isinstance(exc, ImportError)
            else f"{key} {spec!r}: cannot import module {module_name!r} ({exc})"
        ) from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise FactoryError(f"{key} {spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise FactoryError(f"{key} {spec!r}: {attr!r} is a {type(fn).__name__}, not callable")
    return fn
