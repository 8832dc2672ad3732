"""Stages: the built-ins (one registry, :mod:`lightning_adv.stages.registry`) and their
resolution from the config.

A :class:`Stage` is a child module of :class:`~lightning_adv.AdvantageModule` wrapping one
resolved function and its bound kwargs, so ``print(module)`` shows the pipeline. Names
resolve once, when the module is built (on every worker): a built-in name maps to its
registered function, a dotted path is imported and its signature checked against the
kwargs by the same code that checks a built-in's kwargs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from torch import nn

from lightning_adv.dotted_path import resolve_callable
# Importing the built-in modules registers their functions.
from lightning_adv.stages import estimators, outcome, process  # noqa: F401
from lightning_adv.stages.registry import (
    SELECTORS, builtin_names, builtin_stage, check_stage_choice, register_stage)

if TYPE_CHECKING:
    from lightning_adv.config import ActorConfig, StageSpec

__all__ = ["Stage", "resolve_stage", "register_stage", "builtin_stage", "builtin_names",
           "check_stage_choice", "SELECTORS"]


class Stage(nn.Module):
    """One stage of the pipeline: ``fn(inputs, **kwargs)``.

    ``builtin`` stages are trusted; user stages are called through the contract checks of
    :mod:`lightning_adv.contracts` by the module.
    """

    def __init__(self, family: str, implementation: str, fn: Optional[Callable[..., Any]],
                 kwargs: dict[str, Any], builtin: bool):
        super().__init__()
        self.family = family
        self.implementation = implementation
        self.fn = fn
        self.kwargs = dict(kwargs)
        self.builtin = builtin

    @property
    def where(self) -> str:
        """How errors name this stage: ``advantage.estimator 'my_pkg.est'``."""
        return f"advantage.{self.family} {self.implementation!r}"

    def forward(self, inputs: Any) -> Any:
        return self.fn(inputs, **self.kwargs)

    def extra_repr(self) -> str:
        kwargs = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.implementation}({kwargs})" if kwargs else self.implementation


def resolve_stage(family: str, spec: Optional["StageSpec"], config: "ActorConfig") -> Stage:
    """Turn the config entry of one stage into a :class:`Stage` (``None`` means ``auto``)."""
    name = spec.implementation if spec is not None else "auto"
    kwargs = dict(spec.kwargs) if spec is not None else {}
    if spec is not None and not spec.is_builtin:
        fn = resolve_callable(name, kwargs, f"actor.advantage.{family}")
        return Stage(family, name, fn, kwargs, builtin=False)
    if name == "auto":
        if family == "outcome_reward_shaping":
            name = "identity"
        elif family == "estimator":
            name = "turn_gae" if config.estimator_unit == "turn" else "token_gae"
        else:  # the process mode is picked per call (call-time PRM selection, else additive)
            return Stage(family, "auto", None, {}, builtin=True)
    return Stage(family, name, builtin_stage(family, name).fn, kwargs, builtin=True)
