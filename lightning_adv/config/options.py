"""Small configs nested in ``ActorConfig``: normalization, the truncation penalty and the
legacy call-time process shaping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

from lightning_adv._checks import check_bool, check_choice, check_int, check_number

NORM_LEVELS = ("batch", "group", None)


def __getattr__(name: str):
    if name == "PRM_MODES":  # the built-in process-reward stages, from their registry (on first use)
        from lightning_adv.stages.registry import process_reward_modes
        return process_reward_modes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class NormConfig:
    """How rewards or advantages are centred and scaled (SPEC §3, "Normalization")."""

    mean_level: Optional[Literal["batch", "group"]] = "batch"
    """where the mean is taken: "batch", "group" (per prompt) or null (no centring)"""
    mean_leave1out: bool = False
    """subtract the mean of the other members (leave-one-out baseline) instead of the mean"""
    std_level: Optional[Literal["batch", "group"]] = "batch"
    """where the std is taken: "batch", "group" (per prompt) or null (no scaling)"""
    std_unbiased: bool = True
    """use the unbiased (n-1) standard deviation"""
    eps: float = 1e-5
    """added to the std before dividing (> 0, so an all-equal group cannot divide 0 by 0)"""
    group_size: int = 1
    """rows per group when the batch carries no metadata (fixed-size slices)"""

    KEY: ClassVar[str] = "NormConfig"
    """how errors name this config when it is built on its own (its parent re-keys them)"""

    def __post_init__(self) -> None:
        self.validate(self.KEY)

    def validate(self, key: str) -> None:
        check_choice(f"{key}.mean_level", self.mean_level, NORM_LEVELS)
        check_choice(f"{key}.std_level", self.std_level, NORM_LEVELS)
        check_bool(f"{key}.mean_leave1out", self.mean_leave1out)
        check_bool(f"{key}.std_unbiased", self.std_unbiased)
        check_number(f"{key}.eps", self.eps, positive=True)
        check_int(f"{key}.group_size", self.group_size)



@dataclass(frozen=True)
class PRMAdvantageShapingConfig:
    """Legacy call-time selection of process advantage shaping (``module(batch, meta, prm=...)``).

    It is checked when the module uses it, not when it is built: legacy callers build one
    per call, and its GVPO values matter only when GVPO shaping actually runs.
    """

    mode: str = "additive"
    """shaping applied to direct token rewards: a built-in process stage (additive, gvpo or
    process_weighted)"""
    negative_scale: float = 0.2
    """GVPO: extra weight (1 + b) on negative advantages of failed tokens"""
    zero_penalty: float = 0.4
    """GVPO: penalty given to failed tokens whose advantage is about zero"""
    zero_eps: float = 1e-6
    """GVPO: |advantage| <= zero_eps counts as zero"""

    def gvpo_kwargs(self) -> dict[str, float]:
        """The GVPO values as the ``gvpo`` stage's keyword arguments."""
        return {"negative_scale": self.negative_scale, "zero_penalty": self.zero_penalty,
                "zero_eps": self.zero_eps}


@dataclass(frozen=True)
class TruncatedRewardConfig:
    """The outcome reward of a row cut by the length limit (ProRL's stop-properly penalty):
    multiplied by ``scale`` or replaced by ``value``; set exactly one."""

    scale: Optional[float] = None
    """truncated rows get reward * scale (a number in [0, 1])"""
    value: Optional[float] = None
    """truncated rows get this reward (e.g. -0.5)"""

    KEY: ClassVar[str] = "TruncatedRewardConfig"
    """how errors name this config when it is built on its own (its parent re-keys them)"""

    def __post_init__(self) -> None:
        self.validate(self.KEY)

    def validate(self, key: str) -> None:
        if (self.scale is None) == (self.value is None):
            raise ValueError(f"{key}: expected exactly one of scale (truncated rows get reward * "
                             f"scale) or value (truncated rows get value), got "
                             f"scale={self.scale!r}, value={self.value!r}")
        if self.scale is not None:
            check_number(f"{key}.scale", self.scale, minimum=0.0, maximum=1.0)
        else:
            check_number(f"{key}.value", self.value)


