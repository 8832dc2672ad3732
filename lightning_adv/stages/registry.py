"""The one registry of built-in stages.

A built-in is a plain function registered with :func:`register_stage`; nothing else lists
it. The config checks a built-in's kwargs with the same signature check as a user
stage's (:func:`lightning_adv.dotted_path.check_signature`), then runs the value checks
given at registration (``kwarg_checks``, e.g. ``eps`` must be > 0)::

    @register_stage("outcome_reward_shaping", kwarg_checks={"eps": positive_number})
    def gpg(inputs: OutcomeRewardInputs, *, std_normalize: bool = False, eps: float = 1e-5):
        ...

A registration may also say which optional batch keys the stage reads (``requires``:
a trainer computes them only when some stage asks, e.g. ``sum_pi_squared``) and whether
the stage takes the place of a critic (``replaces_critic``: it subtracts its own
baseline, or ignores ``values``), so a value head next to it is a misconfiguration.

Each family also has one selector name that is not a function: ``default`` for
``compute`` (the staged pipeline) and ``auto`` for the stages (resolved by the module).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_adv.dotted_path import check_signature, is_dotted_path
from lightning_adv.validators import fail

#: The selector of each stage family (not a function: the module resolves it).
SELECTORS: dict[str, str] = {
    "compute": "default",
    "outcome_reward_shaping": "auto",
    "estimator": "auto",
    "process_adv_shaping": "auto",
}

KwargCheck = Callable[[str, Any], None]


@dataclass(frozen=True)
class BuiltinStage:
    """A registered built-in: its function and the value checks of its kwargs."""

    family: str
    name: str
    fn: Callable[..., Any]
    kwarg_checks: Mapping[str, KwargCheck] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    """optional batch keys the stage reads (and raises without)"""
    replaces_critic: bool = False
    """the stage subtracts its own baseline or ignores values: no critic is needed"""


_REGISTRY: dict[str, dict[str, BuiltinStage]] = {family: {} for family in SELECTORS}


def register_stage(family: str, name: str | None = None, *,
                   kwarg_checks: Mapping[str, KwargCheck] | None = None,
                   requires: tuple[str, ...] = (), replaces_critic: bool = False):
    """Decorator: register ``fn`` as the built-in ``name`` (default ``fn.__name__``) of
    ``family``. ``kwarg_checks`` maps a keyword argument to ``check(key, value)``;
    ``requires`` names the optional batch keys it reads; ``replaces_critic`` marks a stage
    that needs no critic."""
    if family not in _REGISTRY:
        raise ValueError(f"register_stage: unknown stage family {family!r}; expected one of "
                         f"{', '.join(_REGISTRY)}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        stage_name = name or fn.__name__
        if stage_name in _REGISTRY[family] or stage_name == SELECTORS[family]:
            raise ValueError(f"register_stage: {family} {stage_name!r} is already registered")
        keywords = set(list(inspect.signature(fn).parameters)[1:])
        unknown = sorted(set(kwarg_checks or {}) - keywords)
        if unknown:
            raise ValueError(f"register_stage: {family} {stage_name!r} has checks for kwargs "
                             f"{unknown} that its signature does not take")
        _REGISTRY[family][stage_name] = BuiltinStage(family, stage_name, fn,
                                                     dict(kwarg_checks or {}), tuple(requires),
                                                     replaces_critic)
        return fn
    return decorate


def builtin_stage(family: str, name: str) -> BuiltinStage:
    """The registered built-in ``name`` of ``family`` (a ``KeyError`` if there is none)."""
    return _REGISTRY[family][name]


def builtin_names(family: str) -> tuple[str, ...]:
    """The selector and the registered built-ins of ``family``, in registration order."""
    return (SELECTORS[family], *_REGISTRY[family])


def check_stage_choice(key: str, family: str, implementation: str,
                       kwargs: Mapping[str, Any]) -> None:
    """Config-time check of one stage entry: a known built-in with kwargs its function
    accepts (and valid values), or a dotted path (resolved when the module is built)."""
    if is_dotted_path(implementation):
        return
    if implementation == SELECTORS[family]:
        if kwargs:
            raise ValueError(f"{key}: built-in {implementation!r} takes no kwargs, got kwargs "
                             f"{sorted(kwargs)}")
        return
    entry = _REGISTRY[family].get(implementation)
    if entry is None:
        fail(key, f"one of {', '.join(builtin_names(family))} or a dotted import path "
             f"(my_pkg.my_mod.fn)", implementation)
    check_signature(entry.fn, kwargs, key, implementation, label=f"built-in {implementation!r}")
    for name, value in kwargs.items():
        check = entry.kwarg_checks.get(name)
        if check is not None:
            check(f"{key}.kwargs.{name}", value)
