"""Process advantage shaping: direct process (PRM) rewards applied to normalized advantages.

Built-in modes return the advantages unchanged when the batch has no direct token
rewards. Returns are never touched.

The seed's call-time ``prm=`` argument (``module(batch, meta, prm=...)``) is resolved here
too (:func:`resolve_process_mode`), by the design note's rules: an explicit
``process_adv_shaping`` beats the call-time mode (``auto`` follows it, else
``additive``); explicit ``gvpo`` kwargs override the call-time GVPO values key by key; a
full replacement gets ``prm`` as is.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.stages.types import ProcessAdvantageInputs
from lightning_adv._checks import check_gvpo_kwargs, non_negative_number
from lightning_adv.config import ActorConfig, PRMAdvantageShapingConfig, check_process_mode
from lightning_adv.stages.registry import auto_stage, process_reward_modes, register_stage
from lightning_adv.stages.resolve import Stage


def direct_token_rewards(key: str, name: str, config: Any) -> None:
    """The stage reshapes the direct process rewards: they must stay direct."""
    if not config.token_rewards_as_adv:
        raise ValueError(f"{key}: {name!r} advantage shaping requires "
                         f"actor.token_rewards_as_adv=true (process rewards must stay direct), "
                         f"got token_rewards_as_adv=false")


def weighted_needs(key: str, name: str, config: Any) -> None:
    direct_token_rewards(key, name, config)
    if config.mask_no_eos_with_zero:  # the zeroed rows would read as process reward 0
        raise ValueError(f"{key}: {name!r} advantage shaping requires "
                         f"actor.mask_no_eos_with_zero=false, got true")


@register_stage("process_adv_shaping", reads=("token_rewards",), auto=True)
def additive(inputs: ProcessAdvantageInputs) -> Tensor:
    """``A + r`` (r is 0 off the loss mask)."""
    if inputs.token_rewards is None:
        return inputs.advantages
    return inputs.advantages + inputs.token_rewards


@register_stage("process_adv_shaping", reads=("token_rewards",), config_check=direct_token_rewards,
                kwarg_checks=dict.fromkeys(("negative_scale", "zero_penalty", "zero_eps"),
                                           non_negative_number))
def gvpo(inputs: ProcessAdvantageInputs, *, negative_scale: float = 0.2,
         zero_penalty: float = 0.4, zero_eps: float = 1e-6) -> Tensor:
    """Reshape failed tokens (active, process reward < 0): a negative advantage is scaled
    by ``1 + negative_scale``, an advantage within ``zero_eps`` of 0 becomes
    ``-zero_penalty``, a positive one becomes 0. Other tokens are unchanged."""
    if inputs.token_rewards is None:
        return inputs.advantages
    check_gvpo_kwargs("process_adv_shaping 'gvpo'", {
        "negative_scale": negative_scale, "zero_penalty": zero_penalty, "zero_eps": zero_eps})
    adv = inputs.advantages
    failed = (inputs.loss_mask > 0) & (inputs.token_rewards < 0)
    shaped = torch.where(adv < -zero_eps, adv * (1.0 + negative_scale),
                         torch.where(adv > zero_eps, torch.zeros_like(adv),
                                     torch.full_like(adv, -zero_penalty)))
    return torch.where(failed, shaped, adv)


@register_stage("process_adv_shaping", reads=("token_rewards",), config_check=weighted_needs)
def process_weighted(inputs: ProcessAdvantageInputs) -> Tensor:
    """Weight by process rewards p in [0, 1] on active tokens: ``A >= 0 -> A * p``;
    ``A < 0 -> p`` if ``p > 0`` else ``A``."""
    if inputs.token_rewards is None:
        return inputs.advantages
    adv, p = inputs.advantages, inputs.token_rewards
    active = inputs.loss_mask > 0
    out_of_range = active & ((p < 0) | (p > 1))
    if bool(out_of_range.any()):
        rows = out_of_range.any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"process_adv_shaping 'process_weighted': process rewards must lie in "
                         f"[0, 1] on active tokens; rows {rows[:10]} have values outside")
    shaped = torch.where(adv >= 0, adv * p, torch.where(p > 0, p, adv))
    return torch.where(active, shaped, adv)


def resolve_process_mode(prm: Any, config: ActorConfig,
                         stage: Optional[Stage]) -> Optional[tuple[str, dict[str, Any]]]:
    """Check ``prm`` and return the built-in process mode and kwargs that run for it, or
    None when no built-in runs (a user process stage, or a full replacement: ``stage``
    None)."""
    if prm is not None:
        if not isinstance(prm, PRMAdvantageShapingConfig):
            raise TypeError(f"prm: expected a PRMAdvantageShapingConfig or None, got "
                            f"{type(prm).__name__}")
        modes = process_reward_modes()
        if prm.mode not in modes:
            raise ValueError(f"prm.mode: expected one of {', '.join(modes)}, got {prm.mode!r}")
    if stage is None or not stage.builtin:
        return None
    mode = stage.implementation
    if mode == "auto":
        if prm is not None:
            check_process_mode("prm.mode", prm.mode, config)
        mode = prm.mode if prm is not None else auto_stage(stage.family, "token").name
    if mode != gvpo.__name__:  # only gvpo has legacy call-time values (auto takes no kwargs)
        return mode, dict(stage.kwargs) if mode == stage.implementation else {}
    legacy = prm if prm is not None else PRMAdvantageShapingConfig()
    return mode, {**legacy.gvpo_kwargs(), **stage.kwargs}
