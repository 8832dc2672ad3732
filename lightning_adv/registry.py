"""One registry mechanism for named functions: the stages of the advantage pipeline and the
policy losses each keep a :class:`Registry` of :class:`Entry` subclasses.

Registration sits on the function (``@register_stage(...)``, ``@register_policy_loss(...)``),
built-ins included, so the facts about a function (its kwargs with their checks, what it
reads, ...) are written once, next to it, and every consumer reads them from its entry.

The built-ins register when their module is imported. A registry knows those modules (a
tuple of module names, not of function names) and imports them on its first lookup or
listing: importing the config stays light, and a name is resolved only when it is used.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Optional, TypeVar

KwargCheck = Callable[[str, Any], None]


@dataclass(frozen=True)
class Entry:
    """One registered function and the facts every entry has."""

    name: str
    fn: Callable[..., Any]
    kwarg_checks: Mapping[str, KwargCheck] = field(default_factory=dict)
    """the keyword arguments it takes, each with the check of its value"""
    builtin: bool = False
    """defined in one of the package's own modules (trusted: no contract checks)"""

    @property
    def path(self) -> str:
        """The dotted path of the function (how errors name it)."""
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


EntryT = TypeVar("EntryT", bound=Entry)


class Registry(Generic[EntryT]):
    """Named entries of one kind; ``builtin_modules`` are imported on the first lookup."""

    def __init__(self, what: str, builtin_modules: tuple[str, ...]):
        self.what = what
        self.builtin_modules = builtin_modules
        self._entries: dict[str, EntryT] = {}
        self._loaded = False

    def _load(self) -> None:
        if not self._loaded:
            for module in self.builtin_modules:
                importlib.import_module(module)
            self._loaded = True  # only once every module imported: a failure shows again

    def add(self, entry: EntryT, caller: str) -> None:
        if not entry.builtin:
            self._load()  # a user's name must not take a built-in's before it loads
        old = self._entries.get(entry.name)
        if old is not None:
            raise ValueError(f"{caller}: {self.what} {entry.name!r} is already registered "
                             f"(by {old.path}); pick another name for {entry.path}")
        self._entries[entry.name] = entry

    def remove(self, name: str, caller: str) -> None:
        entry = self._entries.get(name)
        if entry is None or entry.builtin:
            raise ValueError(f"{caller}: {self.what} {name!r} was not registered by "
                             f"{caller.replace('unregister', 'register')} (built-ins stay)")
        del self._entries[name]

    def get(self, name: str) -> Optional[EntryT]:
        self._load()
        return self._entries.get(name)

    def __getitem__(self, name: str) -> EntryT:
        entry = self.get(name)
        if entry is None:
            raise KeyError(name)
        return entry

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def entries(self) -> Iterator[EntryT]:
        """Built-ins first (in their modules' order), then the user's, in registration order."""
        self._load()
        entries = list(self._entries.values())
        return iter([e for e in entries if e.builtin] + [e for e in entries if not e.builtin])

    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries())


def decorator(caller: str, name: Any, register: Callable[[Callable[..., Any], str], None]):
    """The decorator of ``@caller(name, ...)``: ``register(fn, name or fn.__name__)``.

    A bare ``@caller`` (``name`` is then the function) registers the function under its own
    name. Mistakes that would pass silently (a name that cannot be selected, something not
    a function) are errors naming the argument, what was expected and what was given.
    """
    if callable(name) and not isinstance(name, str):  # the bare @caller form
        fn, name = name, None
        register(_checked_function(caller, fn), fn.__name__)
        return fn
    check_name(caller, name)

    def decorate(fn: Any) -> Any:
        fn = _checked_function(caller, fn)
        register(fn, name or fn.__name__)
        return fn
    return decorate


def check_name(caller: str, name: Any) -> None:
    if name is None:
        return
    if not isinstance(name, str) or not name.isidentifier():
        why = (" (a dotted name is read as an import path, so it could never select this "
               "function)" if isinstance(name, str) and "." in name else "")
        raise ValueError(f"{caller} name: expected None (the function's own name) or a name "
                         f"like my_stage, letters, digits and _ only{why}, got {name!r}")


def _checked_function(caller: str, fn: Any) -> Callable[..., Any]:
    if not (inspect.isfunction(fn) or inspect.isbuiltin(fn) or inspect.ismethod(fn)
            or callable(fn) and hasattr(fn, "__name__") and hasattr(fn, "__module__")):
        raise TypeError(f"{caller}: expected to decorate a function fn(inputs, **kwargs), got "
                        f"{fn!r} (a {type(fn).__name__})")
    return fn


def check_kwarg_checks(caller: str, label: str, fn: Callable[..., Any],
                       kwarg_checks: Any) -> dict[str, KwargCheck]:
    """``kwarg_checks`` as a dict, each key a keyword parameter of ``fn``'s signature."""
    if kwarg_checks is None:
        return {}
    if not isinstance(kwarg_checks, Mapping) or not all(callable(c) for c in kwarg_checks.values()):
        raise TypeError(f"{caller} kwarg_checks: expected a mapping of keyword argument -> "
                        f"check(key, value), got {kwarg_checks!r}")
    keywords = set(list(inspect.signature(fn).parameters)[1:])
    unknown = sorted(set(kwarg_checks) - keywords)
    if unknown:
        raise ValueError(f"{caller}: {label} has checks for kwargs {unknown} that its "
                         f"signature does not take (it takes {sorted(keywords)})")
    return dict(kwarg_checks)


def is_builtin(fn: Callable[..., Any], registry: Registry[Any]) -> bool:
    return getattr(fn, "__module__", None) in registry.builtin_modules
