"""The one registry of named stages: the built-ins (a table, :data:`BUILTIN_STAGES`) and
the stages users add with :func:`register_stage`.

The table is data: each built-in names its function by import path, the keyword
arguments it takes with their value checks, the optional batch keys it reads
(``requires``: a trainer computes them only when some stage asks, e.g.
``sum_pi_squared``) and whether it takes the place of a critic (``replaces_critic``: it
subtracts its own baseline, or ignores ``values``, so a value head next to it is a
misconfiguration). So the config checks a stage name and its kwargs without importing
any implementation, and the implementations do not import this module: the function
is imported when the :class:`~lightning_adv.AdvantageModule` is built (and its signature
checked against the declared kwargs; a test resolves every built-in).

A user stage registered by name::

    @register_stage("outcome_reward_shaping", kwarg_checks={"scale": positive_number})
    def my_scaling(inputs: OutcomeRewardInputs, *, scale: float = 2.0) -> OutcomeResult:
        ...

is then selected as ``outcome_reward_shaping: my_scaling``, like a built-in; its kwargs
are the keyword parameters of its signature. A stage named by dotted path
(``my_pkg.my_mod.fn``) needs no registration.

Each family also has one selector name that is not a function: ``default`` for
``compute`` (the staged pipeline) and ``auto`` for the stages (resolved by the module).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from lightning_adv._checks import (
    check_bool, fail, non_negative_number, positive_number, unit_interval)
from lightning_adv.dotted_path import check_signature, import_object, is_dotted_path

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
    """A named stage: where its function is, and what it takes and reads."""

    family: str
    name: str
    path: str
    """dotted import path of the function (``lightning_adv.stages.estimators.token_gae``)"""
    kwarg_checks: Mapping[str, KwargCheck] = field(default_factory=dict)
    """the keyword arguments it takes, each with the check of its value"""
    requires: tuple[str, ...] = ()
    """optional batch keys the stage reads (and raises without)"""
    reads: tuple[str, ...] = ()
    """optional batch keys the stage reads when the batch has them (``rollout_is_weights``)"""
    replaces_critic: bool = False
    """the stage subtracts its own baseline or ignores values: no critic is needed"""
    function: Optional[Callable[..., Any]] = None
    """the function itself, for a stage registered with :func:`register_stage`"""

    @property
    def fn(self) -> Callable[..., Any]:
        """The stage function (a built-in's is imported on first use)."""
        if self.function is not None:
            return self.function
        return import_object(self.path, f"built-in {self.family} {self.name!r}")


def _builtin(family: str, module: str, name: str, **options: Any) -> BuiltinStage:
    return BuiltinStage(family, name, f"lightning_adv.stages.{module}.{name}", **options)


def _table(*stages: BuiltinStage) -> dict[str, dict[str, BuiltinStage]]:
    table: dict[str, dict[str, BuiltinStage]] = {family: {} for family in SELECTORS}
    for stage in stages:
        table[stage.family][stage.name] = stage
    return table


_EPS = {"eps": positive_number}
_GIGPO = {"episode_weight": non_negative_number, "step_weight": non_negative_number,
          "step_gamma": unit_interval, "std_normalize": check_bool, **_EPS}
_OTB = {"handle_zero_tail": check_bool, **_EPS}
_GVPO_VALUES = {name: non_negative_number for name in ("negative_scale", "zero_penalty", "zero_eps")}

#: The built-in stages, family by family, in the order ``--help`` and errors list them.
BUILTIN_STAGES = _table(
    _builtin("outcome_reward_shaping", "outcome", "identity"),
    _builtin("outcome_reward_shaping", "outcome", "opo_baseline", replaces_critic=True),
    _builtin("outcome_reward_shaping", "outcome", "gpg", replaces_critic=True,
             kwarg_checks={"std_normalize": check_bool, **_EPS}),
    _builtin("outcome_reward_shaping", "outcome", "passk_baseline", replaces_critic=True,
             kwarg_checks={"std_normalize": check_bool, **_EPS}),
    _builtin("outcome_reward_shaping", "outcome", "group_mean_batch_std", replaces_critic=True,
             kwarg_checks={"std_unbiased": check_bool, **_EPS}),
    _builtin("outcome_reward_shaping", "outcome", "sequence_kl", requires=("ref_logp",),
             kwarg_checks={"beta": non_negative_number}),
    _builtin("outcome_reward_shaping", "outcome", "remax_baseline",
             requires=("reward_baselines",), replaces_critic=True),
    _builtin("outcome_reward_shaping", "outcome", "maxrl", replaces_critic=True,
             kwarg_checks={"eps": non_negative_number}),
    _builtin("estimator", "estimators", "token_gae"),
    _builtin("estimator", "estimators", "turn_gae"),
    _builtin("estimator", "estimators", "reinforce", replaces_critic=True),
    _builtin("estimator", "estimators", "optimal_token_baseline", requires=("sum_pi_squared",),
             reads=("rollout_is_weights",), replaces_critic=True, kwarg_checks=_OTB),
    _builtin("estimator", "estimators", "tir_optimal_token_baseline",
             requires=("sum_pi_squared",), reads=("rollout_is_weights",),
             replaces_critic=True, kwarg_checks=_OTB),
    _builtin("estimator", "turn_estimators", "turn_rloo", replaces_critic=True),
    _builtin("estimator", "turn_estimators", "turn_index_norm", replaces_critic=True,
             kwarg_checks={"std_normalize": check_bool, **_EPS}),
    _builtin("estimator", "turn_estimators", "gigpo", requires=("anchor_state_ids",),
             replaces_critic=True, kwarg_checks=_GIGPO),
    _builtin("process_adv_shaping", "process", "additive"),
    _builtin("process_adv_shaping", "process", "gvpo", kwarg_checks=_GVPO_VALUES),
    _builtin("process_adv_shaping", "process", "process_weighted"),
)
_REGISTERED: dict[str, dict[str, BuiltinStage]] = {family: {} for family in SELECTORS}


def register_stage(family: str, name: Optional[str] = None, *,
                   kwarg_checks: Optional[Mapping[str, KwargCheck]] = None,
                   requires: tuple[str, ...] = (), replaces_critic: bool = False,
                   reads: tuple[str, ...] = ()):
    """Decorator: register ``fn`` as the stage ``name`` (default ``fn.__name__``) of
    ``family``, selectable by that name like a built-in. ``kwarg_checks`` maps a keyword
    argument to ``check(key, value)``; ``requires`` names the optional batch keys it
    reads (and raises without); ``reads`` those it reads when present (a trainer then
    passes them, e.g. ``rollout_is_weights``); ``replaces_critic`` marks a stage that
    needs no critic."""
    if family not in SELECTORS:
        raise ValueError(f"register_stage: unknown stage family {family!r}; expected one of "
                         f"{', '.join(SELECTORS)}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        stage_name = name or fn.__name__
        if stage_name in BUILTIN_STAGES[family] or stage_name in _REGISTERED[family] \
                or stage_name == SELECTORS[family]:
            raise ValueError(f"register_stage: {family} {stage_name!r} is already registered")
        keywords = set(list(inspect.signature(fn).parameters)[1:])
        unknown = sorted(set(kwarg_checks or {}) - keywords)
        if unknown:
            raise ValueError(f"register_stage: {family} {stage_name!r} has checks for kwargs "
                             f"{unknown} that its signature does not take")
        path = f"{fn.__module__}.{fn.__qualname__}"
        _REGISTERED[family][stage_name] = BuiltinStage(
            family, stage_name, path, dict(kwarg_checks or {}), tuple(requires),
            tuple(reads), replaces_critic, function=fn)
        return fn
    return decorate


def unregister_stage(family: str, name: str) -> None:
    """Remove a stage registered with :func:`register_stage` (tests, notebooks that
    redefine one); built-ins cannot be removed."""
    if name not in _REGISTERED.get(family, {}):
        raise ValueError(f"unregister_stage: {family} {name!r} was not registered with "
                         f"register_stage")
    del _REGISTERED[family][name]


def builtin_stage(family: str, name: str) -> BuiltinStage:
    """The named stage ``name`` of ``family`` (a ``KeyError`` if there is none)."""
    if name in BUILTIN_STAGES[family]:
        return BUILTIN_STAGES[family][name]
    return _REGISTERED[family][name]


def builtin_names(family: str) -> tuple[str, ...]:
    """The selector, the built-ins and the registered stages of ``family``."""
    return (SELECTORS[family], *BUILTIN_STAGES[family], *_REGISTERED[family])


def check_stage_choice(key: str, family: str, implementation: str,
                       kwargs: Mapping[str, Any]) -> None:
    """Config-time check of one stage entry: a known name with kwargs it takes (and valid
    values), or a dotted path (resolved when the module is built)."""
    if is_dotted_path(implementation):
        return
    if implementation == SELECTORS[family]:
        if kwargs:
            raise ValueError(f"{key}: built-in {implementation!r} takes no kwargs, got kwargs "
                             f"{sorted(kwargs)}")
        return
    if implementation not in builtin_names(family):
        fail(key, f"one of {', '.join(builtin_names(family))} or a dotted import path "
             f"(my_pkg.my_mod.fn)", implementation)
    entry = builtin_stage(family, implementation)
    label = f"built-in {implementation!r}"
    if entry.function is not None:  # a registered user stage: its signature says
        check_signature(entry.function, kwargs, key, implementation, label=label)
    else:
        unknown = sorted(set(kwargs) - set(entry.kwarg_checks))
        if unknown:
            takes = (f"it takes only {sorted(entry.kwarg_checks)}" if entry.kwarg_checks
                     else "it takes no kwargs")
            raise ValueError(f"{key}: {label} does not accept kwargs {unknown} ({takes})")
    for name, value in kwargs.items():
        check = entry.kwarg_checks.get(name)
        if check is not None:
            check(f"{key}.kwargs.{name}", value)
