"""Turning a dotted import path from the config into a checked callable."""

from __future__ import annotations

import importlib
import inspect
import re
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
                    positional: int = 1, *, label: str | None = None) -> None:
    """Check that ``fn(<positional args>, **kwargs)`` binds; errors name ``key`` and the
    function (``label``, default the quoted path). Built-in stages and user functions go
    through this same check."""
    label = label or repr(path)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust the call
    params = list(signature.parameters.values())
    takes_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    shown = f"{path.rsplit('.', 1)[-1]}{signature}"
    unknown = sorted(set(kwargs) - names) if not takes_var_kw else []
    if unknown:
        keywords = sorted(p.name for p in params[positional:]
                          if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        takes = f"it takes only {keywords}" if keywords else "it takes no kwargs"
        raise ValueError(f"{key}: {label} does not accept kwargs {unknown} ({takes}); its "
                         f"signature is {shown}")
    try:
        signature.bind(*([None] * positional), **kwargs)
    except TypeError as exc:
        raise ValueError(f"{key}: {label} cannot be called as fn(inputs, **kwargs) with kwargs "
                         f"{sorted(kwargs)}: {exc}; its signature is {shown}") from None


_DOTTED_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def is_dotted_path(name: str) -> bool:
    """True for ``pkg.module.attr``-shaped strings (at least one dot, identifiers only)."""
    return bool(_DOTTED_PATH.match(name))
