"""Loading ``pkg.module:function`` plug-ins, with one clear line when that fails."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
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


def call_factory(key: str, spec: str, fn: Callable[..., Any], offered: Mapping[str, Any],
                 kwargs: Mapping[str, Any]) -> Any:
    """Call a factory with the parameters it declares; FactoryError if it cannot or it raises.

    ``offered`` are the runtime's values in their conventional order (model:
    input_shape, classes; data: input_context, per_replica_batch_size); ``kwargs``
    the config's ``<section>.kwargs``. A parameter named like a kwarg or an offered
    value gets it; a required positional parameter with another name gets the
    offered value of its position (``def make_dataset(ctx, batch)``); one with a
    default keeps it. ``**kwargs`` takes every value not yet given. So
    ``def build_model(embed_dim=32)``, as the Keras guides write them, gets neither
    input_shape nor classes.
    """
    section = key.split(".")[0]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        signature = None
    if signature is None:
        args, named = list(offered.values()), dict(kwargs)
    else:
        args, named = _bind(key, spec, section, signature, offered, kwargs)
    try:
        return fn(*args, **named)
    except Exception as exc:  # a plug-in may raise anything
        raise FactoryError(f"{key} {spec!r} raised {type(exc).__name__}: {exc}") from exc


def _bind(key: str, spec: str, section: str, signature: inspect.Signature,
          offered: Mapping[str, Any], kwargs: Mapping[str, Any]
          ) -> tuple[list[Any], dict[str, Any]]:
    params = [p for p in signature.parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_all = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    # Offered values no parameter asks for by name, in order: what the required
    # positional parameters with other names take (`def build_model(n_classes, input_shape)`
    # gets classes, not input_shape twice).
    names = {p.name for p in params}
    unclaimed = [name for name in offered if name not in names and name not in kwargs]
    args: list[Any] = []
    named: dict[str, Any] = {}
    given: set[str] = set()
    skipped_positional_only = False
    for param in params:
        is_positional = param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)
        if param.name in kwargs:
            value, source = kwargs[param.name], param.name
        elif param.name in offered:
            value, source = offered[param.name], param.name
        elif param.default is param.empty and is_positional and unclaimed:
            source = unclaimed.pop(0)
            value = offered[source]
        elif param.default is not param.empty:
            skipped_positional_only |= param.kind is param.POSITIONAL_ONLY
            continue
        else:
            raise FactoryError(
                f"{key} {spec!r}: its parameter {param.name!r} is neither one gpuwatch passes "
                f"({', '.join(offered)}) nor in {section}.kwargs")
        given.add(source)
        if param.kind is param.POSITIONAL_ONLY:
            if skipped_positional_only:
                raise FactoryError(
                    f"{key} {spec!r}: its positional-only parameter {param.name!r} comes after "
                    "one left to its default, so it cannot be given; make it a keyword")
            args.append(value)
        else:
            named[param.name] = value
    unknown = [name for name in kwargs if name not in given]
    if unknown and not takes_all:
        accepted = [p.name for p in params]
        raise FactoryError(
            f"{section}.kwargs.{unknown[0]}: {key} {spec!r} has no parameter {unknown[0]!r} "
            f"(it takes: {', '.join(accepted) or 'nothing'})")
    if takes_all:
        for name, value in (*offered.items(), *kwargs.items()):
            if name not in given and name not in named:
                named[name] = value
                given.add(name)
    return args, named
