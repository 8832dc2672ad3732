"""Token and outcome reward terms computed from the batch: the DAPO length penalty, the
truncation penalty, reward scaling and clipping, and the KL penalty against the frozen
reference policy. New tensors only (SPEC §9)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from lightning_adv.config import ActorConfig
from lightning_adv.ops.kl import KL_BOUND, kl_estimate


def apply_length_penalty(rewards: Tensor, loss_mask: Tensor, config: ActorConfig) -> Tensor:
    """DAPO overlong penalty: ``min(-(len - (max_new_tokens - overlong_tokens)) / overlong_tokens
    * factor, 0)`` added to a copy of the rewards (float32, not clamped below ``-factor``).

    Integer rewards stay integer when no row is penalized; otherwise they become float
    instead of failing as the legacy in-place add did.
    """
    if not config.overlong_reward_penalty:
        return rewards
    lengths = loss_mask.bool().sum(dim=1)
    exceed = lengths - (config.max_new_tokens - config.overlong_tokens)
    penalty = ((-exceed).float() / config.overlong_tokens * config.overlong_penalty_factor)
    penalized = penalty <= 0
    if not rewards.is_floating_point():
        if not bool(penalized.any()):
            return rewards.clone()
        rewards = rewards.float()
    return rewards + torch.where(penalized, penalty, torch.zeros_like(penalty)).to(rewards.dtype)


def kl_penalty(old: Tensor, ref: Optional[Tensor], kl_coef: float, estimator: str) -> Tensor:
    """The KL penalty rewards ``-kl_coef * k(old, ref)`` (the estimators of
    :mod:`lightning_adv.ops.kl`, each estimate clamped to ±10: AReaL's bound of the reward
    penalty), as a new float32 tensor; ``ref=None`` is a reference log-prob of 0
    everywhere."""
    if kl_coef == 0:
        return torch.zeros_like(old, dtype=torch.float32)
    ref = torch.zeros_like(old) if ref is None else ref
    estimate = kl_estimate(old.float(), ref.float(), estimator)
    return estimate.clamp_(-KL_BOUND, KL_BOUND).mul_(-kl_coef)


def apply_truncated_reward(rewards: Tensor, is_truncated: Tensor, config: ActorConfig) -> Tensor:
    """ProRL's stop-properly penalty (``actor.truncated_reward``): rows cut by the length
    limit get ``reward * scale`` or ``value``; a new float tensor (the input when off)."""
    spec = config.truncated_reward
    if spec is None:
        return rewards
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    penalized = (rewards * spec.scale if spec.scale is not None
                 else torch.full_like(rewards, float(spec.value)))
    return torch.where(is_truncated, penalized, rewards)


def scale_rewards(rewards: Tensor, config: ActorConfig) -> Tensor:
    """``clip((r + reward_bias) * reward_scaling, low, high)`` (SPEC §3 step 3), with
    ``(low, high) = (-reward_clip, reward_clip)`` or the two numbers of ``reward_clip``."""
    low, high = config.reward_clip_range
    return ((rewards + config.reward_bias) * config.reward_scaling).clamp(min=low, max=high)
