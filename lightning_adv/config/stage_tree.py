"""The stage tree of the design note: a whole-computation function, or one function per
stage, each a built-in name or a dotted import path with JSON kwargs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from lightning_adv._checks import fail
from lightning_adv.config.nested import _own_kwargs, check_json_kwargs, convert_field, nested_config
from lightning_adv.dotted_path import is_dotted_path
from lightning_adv.stages.registry import check_stage_choice

STAGE_FIELDS = ("outcome_reward_shaping", "estimator", "process_adv_shaping")


@dataclass(frozen=True)
class StageSpec:
    """One stage of the pipeline: a built-in name or a dotted import path, plus kwargs."""

    implementation: str = "auto"
    """built-in name ("auto", "token_gae", ...) or dotted path of a function (pkg.mod.fn)"""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments bound to the function; JSON values only"""

    KEY: ClassVar[str] = "StageSpec"
    """how errors name this config when it is built on its own (its parent re-keys them)"""

    def __post_init__(self) -> None:
        convert_field(self, "kwargs", _own_kwargs(self.kwargs))
        self.validate(self.KEY)

    def validate(self, key: str) -> None:
        if not isinstance(self.implementation, str) or not self.implementation:
            fail(f"{key}.implementation", "a non-empty string", self.implementation)
        check_json_kwargs(f"{key}.kwargs", self.kwargs)

    @property
    def is_builtin(self) -> bool:
        """A built-in (or registered) name rather than a dotted import path."""
        return not is_dotted_path(self.implementation)


@dataclass(frozen=True)
class AdvantageConfig:
    """The stage tree of the design note: a whole-computation function, or per-stage ones."""

    compute: Union[StageSpec, str] = field(default_factory=lambda: StageSpec("default"))
    """the whole computation: "default" (the staged pipeline) or a dotted path replacing it"""
    outcome_reward_shaping: Union[StageSpec, str, None] = None
    """outcome shaping: null/auto/identity or a dotted path; gets OutcomeRewardInputs"""
    estimator: Union[StageSpec, str, None] = None
    """temporal estimator: null/auto (follow gae_timestep_unit), token_gae, turn_gae or a dotted path"""
    process_adv_shaping: Union[StageSpec, str, None] = None
    """process shaping: null/auto (call-time PRM mode, else additive), additive, gvpo, process_weighted or a dotted path"""

    KEY: ClassVar[str] = "advantage"
    """how errors name this config when it is built on its own (its parent re-keys them)"""

    def __post_init__(self) -> None:
        compute = nested_config(StageSpec, f"{self.KEY}.compute", self.compute, "implementation")
        convert_field(self, "compute", StageSpec("default") if compute is None else compute)
        for name in STAGE_FIELDS:
            convert_field(self, name, nested_config(StageSpec, f"{self.KEY}.{name}", getattr(self, name),
                                         "implementation"))
        self.validate(self.KEY)

    def validate(self, key: str) -> None:
        for name in ("compute",) + STAGE_FIELDS:
            spec = getattr(self, name)
            if spec is None:
                continue
            if not isinstance(spec, StageSpec):
                fail(f"{key}.{name}", "null, a stage name or {implementation: ..., kwargs: {...}}",
                     spec)
            check_stage_choice(f"{key}.{name}", name, spec.implementation, spec.kwargs)
        staged = [n for n in STAGE_FIELDS if getattr(self, n) is not None]
        if self.is_replaced and staged:
            raise ValueError(
                f"{key}.compute: a full replacement ({self.compute.implementation!r}) cannot be "
                f"combined with stage configuration; set {', '.join(f'{key}.{n}' for n in staged)} "
                f"to null or use compute: default")

    @property
    def is_replaced(self) -> bool:
        """True when ``compute`` names a user function instead of the default pipeline."""
        return self.compute.implementation != "default"


