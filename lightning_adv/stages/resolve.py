"""Stages as child modules of :class:`~lightning_adv.AdvantageModule`: one resolved
function and its bound kwargs each, so ``print(module)`` shows the pipeline. Names
resolve once, when the module is built (on every worker): a named stage maps to its
function (:mod:`lightning_adv.stages.registry`), a dotted path is imported; either way
the function's signature is checked against the kwargs by the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from torch import nn

from lightning_adv.dotted_path import check_signature, resolve_callable
from lightning_adv.stages.registry import auto_stage, builtin_stage

if TYPE_CHECKING:
    from lightning_adv.config import ActorConfig, StageSpec


class Stage(nn.Module):
    """One stage of the pipeline: ``fn(inputs, **kwargs)``.

    ``builtin`` stages (the package's own) are trusted; user stages, named by path or
    registered by name, are called through the contract checks of
    :mod:`lightning_adv.stages.contract_checks` by the module.
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
        if family == "process_adv_shaping":
            # the process mode is picked per call (call-time PRM selection, else the auto one)
            return Stage(family, "auto", None, {}, builtin=True)
        name = auto_stage(family, config.gae_timestep_unit).name
    entry = builtin_stage(family, name)
    fn = entry.fn
    check_signature(fn, kwargs, f"actor.advantage.{family}", name, label=f"built-in {name!r}")
    # A stage a user registered by name is still called through the contract checks.
    return Stage(family, name, fn, kwargs, builtin=entry.builtin)
