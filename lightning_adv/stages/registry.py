"""The one registry of named stages: each stage, built-in or a user's, is a function
registered with the decorator :func:`register_stage`, which carries every fact about it.

A stage registered by name::

    @register_stage("outcome_reward_shaping", kwarg_checks={"scale": positive_number})
    def my_scaling(inputs: OutcomeRewardInputs, *, scale: float = 2.0) -> OutcomeResult:
        ...

is then selected as ``outcome_reward_shaping: my_scaling``, like a built-in; its kwargs
are the keyword parameters of its signature. A stage named by dotted path
(``my_pkg.my_mod.fn``) needs no registration (and declares no facts).

The facts (:class:`StageEntry`) are read by the config checks, the module, the trainer and
the verl adapter; none of them lists stage names. The built-in stages register when their
modules (:data:`BUILTIN_MODULES`) are imported, which the registry does on its first lookup,
so ``import lightning_adv.config`` imports no stage implementation.

Each family also has one selector name that is not a function: ``default`` for
``compute`` (the staged pipeline) and ``auto`` for the stages (resolved by the module: the
family's stage registered with ``auto=True``, for estimators the one of the configured
``gae_timestep_unit``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from lightning_adv._checks import fail
from lightning_adv.dotted_path import check_signature, is_dotted_path
from lightning_adv.registry import (
    Entry, KwargCheck, Registry, check_kwarg_checks, check_name, decorator, is_builtin)

#: The selector of each stage family (not a function: the module resolves it).
SELECTORS: dict[str, str] = {
    "compute": "default",
    "outcome_reward_shaping": "auto",
    "estimator": "auto",
    "process_adv_shaping": "auto",
}
#: The modules that define the built-in stages (imported on the first lookup).
BUILTIN_MODULES = ("lightning_adv.stages.outcome", "lightning_adv.stages.estimators",
                   "lightning_adv.stages.turn_estimators", "lightning_adv.stages.vine",
                   "lightning_adv.stages.tree_estimators", "lightning_adv.stages.process",
                   "lightning_adv.stages.entropy_shaping")
#: What a stage subtracts from the return: the critic's ``values``, a baseline over the
#: prompt ``group``'s responses, a ``greedy`` response's reward, or the ``monte_carlo`` mean
#: return of continuations sampled from the same state (None: no baseline).
BASELINES = (None, "values", "group", "greedy", "monte_carlo")
TIMESTEP_UNITS = (None, "token", "turn")


@dataclass(frozen=True)
class StageEntry(Entry):
    """A named stage: its function and what it takes, reads and is."""

    family: str = ""
    requires: tuple[str, ...] = ()
    """optional batch keys the stage reads (and raises without): a trainer computes them
    only when some stage asks (``sum_pi_squared``, ``turn_ids``)"""
    reads: tuple[str, ...] = ()
    """optional batch keys it reads when the batch has them (``rollout_is_weights``)"""
    replaces_critic: bool = False
    """it subtracts its own baseline or ignores values: a critic next to it is not needed"""
    baseline: Optional[str] = None
    """what it subtracts from the return (:data:`BASELINES`)"""
    timestep_unit: Optional[str] = None
    """an estimator's step: each generated ``token`` or each ``turn``"""
    reads_discount: bool = False
    """it reads ``actor.discount``"""
    reads_lambda: bool = False
    """it reads ``actor.gae_lambda``"""
    auto: bool = False
    """the family's ``auto`` selector picks it (an estimator: for its ``timestep_unit``)"""
    config_check: Optional[Callable[[str, Any], None]] = None
    """``check(key, actor_config)``: the actor settings the stage cannot run with"""


#: One registry per family.
STAGES: dict[str, Registry[StageEntry]] = {
    family: Registry(f"{family} stage", BUILTIN_MODULES) for family in SELECTORS}


def register_stage(family: Any, name: Optional[str] = None, *,
                   kwarg_checks: Optional[Mapping[str, KwargCheck]] = None,
                   requires: tuple[str, ...] = (), reads: tuple[str, ...] = (),
                   replaces_critic: bool = False, baseline: Optional[str] = None,
                   timestep_unit: Optional[str] = None, reads_discount: bool = False,
                   reads_lambda: bool = False, auto: bool = False,
                   config_check: Optional[Callable[[str, Any], None]] = None):
    """Decorator: register ``fn`` as the stage ``name`` (default ``fn.__name__``) of
    ``family``, selectable by that name like a built-in. ``kwarg_checks`` maps a keyword
    argument to ``check(key, value)``; ``requires`` names the optional batch keys it reads
    (and raises without); ``reads`` those it reads when present (a trainer then passes
    them, e.g. ``rollout_is_weights``); ``replaces_critic`` marks a stage that needs no
    critic. The other facts (:class:`StageEntry`) describe the built-ins to the config
    checks, the trainer and the verl adapter."""
    if family not in SELECTORS:
        shown = f"the function {family.__name__}" if callable(family) else repr(family)
        raise ValueError(f"register_stage family: expected one of {', '.join(SELECTORS)} "
                         f"(@register_stage(\"estimator\")), got {shown}")
    for arg, value, allowed in (("baseline", baseline, BASELINES),
                                ("timestep_unit", timestep_unit, TIMESTEP_UNITS)):
        if value not in allowed:
            fail(f"register_stage {arg}", f"one of {allowed}", value)
    for arg, keys in (("requires", requires), ("reads", reads)):
        if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
            fail(f"register_stage {arg}", "a tuple of batch key names", keys)

    def register(fn: Callable[..., Any], stage_name: str) -> None:
        caller = "register_stage"
        if stage_name == SELECTORS[family]:
            fail(f"{caller} name", f"a name other than the selector {stage_name!r}", stage_name)
        checks = check_kwarg_checks(caller, f"{family} {stage_name!r}", fn, kwarg_checks)
        check_name(caller, stage_name)
        entry = StageEntry(
            stage_name, fn, checks, is_builtin(fn, STAGES[family]), family, tuple(requires),
            tuple(reads), replaces_critic, baseline, timestep_unit, reads_discount,
            reads_lambda, auto, config_check)
        STAGES[family].add(entry, caller)
    return decorator("register_stage", name, register)


def unregister_stage(family: str, name: str) -> None:
    """Remove a stage registered with :func:`register_stage` (tests, notebooks that
    redefine one); built-ins cannot be removed."""
    if family not in SELECTORS:
        fail("unregister_stage family", f"one of {', '.join(SELECTORS)}", family)
    STAGES[family].remove(name, "unregister_stage")


def builtin_stage(family: str, name: str) -> StageEntry:
    """The named stage ``name`` of ``family`` (a ``KeyError`` if there is none)."""
    return STAGES[family][name]


def process_reward_modes() -> tuple[str, ...]:
    """The built-in process stages that shape direct process rewards (they read
    ``token_rewards``): the modes the call-time PRM selection may name."""
    return tuple(e.name for e in STAGES["process_adv_shaping"].entries()
                 if e.builtin and "token_rewards" in e.reads)


def builtin_names(family: str) -> tuple[str, ...]:
    """The selector, the built-ins and the registered stages of ``family``."""
    return (SELECTORS[family], *STAGES[family].names())


def auto_stage(family: str, timestep_unit: str) -> Optional[StageEntry]:
    """The stage ``auto`` selects in ``family`` (None: the process stage is picked per call)."""
    for entry in STAGES[family].entries():
        if entry.auto and entry.timestep_unit in (None, timestep_unit):
            return entry
    return None


def selected_stage(config: Any, family: str) -> Optional[StageEntry]:
    """The named stage that runs for ``family`` under the actor ``config`` (``auto``
    resolved), or None: a dotted path, a replaced pipeline, or the per-call process mode."""
    spec = getattr(config.advantage, family)
    if spec is None or spec.implementation == SELECTORS[family]:
        return auto_stage(family, config.gae_timestep_unit)
    return STAGES[family].get(spec.implementation)


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
    entry = STAGES[family].get(implementation)
    if entry is None:
        fail(key, f"one of {', '.join(builtin_names(family))} or a dotted import path "
             f"(my_pkg.my_mod.fn)", implementation)
    label = f"built-in {implementation!r}"
    if not entry.builtin:  # a registered user stage: its signature says
        check_signature(entry.fn, kwargs, key, implementation, label=label)
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


def __getattr__(name: str) -> Any:
    if name == "BUILTIN_STAGES":  # the table this registry replaced
        warnings.warn("lightning_adv.stages.registry.BUILTIN_STAGES is deprecated: the stages "
                      "register with @register_stage; use builtin_names(family) and "
                      "builtin_stage(family, name)", DeprecationWarning, stacklevel=2)
        return {family: {e.name: e for e in registry.entries() if e.builtin}
                for family, registry in STAGES.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
