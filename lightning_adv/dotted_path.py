"""Turning a dotted import path from the config into a checked callable."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any


def import_object(path: str, key: str) -> Any:
    """Import ``pkg.mod.attr`` (or ``pkg.mod.Class.attr``): the longest importable module
    prefix, then attributes. Errors name the config key and the path."""
    parts = path.split(".")
    module = None
    error: Exception | None = None
    for split in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:split])
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # A missing dependency inside an existing module is the user's real problem.
            if exc.name and not name.startswith(exc.name) and error is None:
                error = exc
            continue
        except Exception as exc:  # the module exists but fails while importing
            raise ValueError(f"{key}: importing module {name!r} for {path!r} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        obj: Any = module
        for i, attr in enumerate(parts[split:], start=split):
            if not hasattr(obj, attr):
                raise ValueError(f"{key}: {path!r}: module or object {'.'.join(parts[:i])!r} "
                                 f"has no attribute {attr!r}")
            obj = getattr(obj, attr)
        return obj
    detail = f" ({type(error).__name__}: {error})" if error else ""
    raise ValueError(f"{key}: cannot import {path!r}: no module {'.'.join(parts[:-1])!r} is "
                     f"importable on this worker{detail}")


def resolve_callable(path: str, kwargs: Mapping[str, Any], key: str,
                     positional: int = 1) -> Callable[..., Any]:
    """Import ``path`` and check that ``fn(<positional args>, **kwargs)`` is a valid call."""
    fn = import_object(path, key)
    if not callable(fn):
        raise ValueError(f"{key}: {path!r} is a {type(fn).__name__}, not a callable")
    check_signature(fn, kwargs, key, path, positional)
    return fn


def check_signature(fn: Callable[..., Any], kwargs: Mapping[str, Any], key: str, path: str,
                    positional: int = 1) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust the call
    params = signature.parameters.values()
    takes_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    unknown = sorted(set(kwargs) - names) if not takes_var_kw else []
    if unknown:
        raise ValueError(f"{key}: {path!r} does not accept kwargs {unknown}; its signature is "
                         f"{path.rsplit('.', 1)[-1]}{signature}")
    try:
        signature.bind(*([None] * positional), **kwargs)
    except TypeError as exc:
        raise ValueError(f"{key}: {path!r} cannot be called as fn(inputs, **kwargs) with kwargs "
                         f"{sorted(kwargs)}: {exc}; its signature is "
                         f"{path.rsplit('.', 1)[-1]}{signature}") from None
