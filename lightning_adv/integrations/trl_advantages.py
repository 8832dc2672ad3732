"""The TRL-free half of :mod:`lightning_adv.integrations.trl`: this project's advantages of
TRL's GRPO batch layout and the mapping of TRL's settings, importable without TRL (the
trainer itself, :class:`~lightning_adv.integrations.trl.AdvantageGRPOTrainer`, subclasses
TRL's ``GRPOTrainer`` and so imports TRL). ``lightning_adv.integrations.trl`` re-exports
every name here."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.advantage.module import AdvantageModule
from lightning_adv.batch.grouping import RolloutGroup
from lightning_adv.config import ActorConfig, NormConfig
from lightning_adv.integrations.response_batch import response_advantages
from lightning_adv.losses.ppo_loss import PPOLoss
from lightning_adv.recipes import recipe

__all__ = ["grpo_advantages", "trl_grpo_config", "rollout_groups_of", "map_trl_args",
           "check_trl_setup", "TRL_STD_EPS"]

#: TRL 1.16's GRPO advantage: (r - mean_g) / (std_g + 1e-4), unbiased std (nanstd).
TRL_STD_EPS = 1e-4


def trl_grpo_config(**overrides: Any) -> ActorConfig:
    """Recipe ``grpo`` with TRL's constants (std epsilon 1e-4, rewards not clipped): its
    advantages equal TRL's ``scale_rewards="group"`` ones to float rounding."""
    norm = NormConfig(mean_level="group", std_level="group", eps=TRL_STD_EPS)
    return recipe("grpo", reward_norm=norm, reward_clip=float("inf"), **overrides)


def rollout_groups_of(rollout_ids: Sequence[Any], group_sizes: Sequence[int]
                      ) -> Optional[list[Optional[RolloutGroup]]]:
    """Logical rollouts from a per-row ``rollout_id`` (rows of one episode are contiguous
    and share it); None when no row carries one."""
    if all(r is None for r in rollout_ids):
        return None
    groups: list[Optional[RolloutGroup]] = []
    start = 0
    for size in group_sizes:
        ids = list(rollout_ids[start:start + size])
        counts = []
        for i, rid in enumerate(ids):
            if rid is None:
                raise ValueError(f"rollout_id: row {start + i} has none while other rows of the "
                                 f"batch do; give every row its episode's id")
            if i and rid == ids[i - 1]:
                counts[-1] += 1
            elif rid in ids[:i]:
                raise ValueError(f"rollout_id: the rows of episode {rid!r} are not contiguous "
                                 f"(rows {start}..{start + size - 1})")
            else:
                counts.append(1)
        groups.append(RolloutGroup(tuple(counts)))
        start += size
    return groups


def grpo_advantages(module: AdvantageModule, rewards_per_func: Tensor, completion_mask: Tensor,
                    num_generations: int, *, process_rewards: Optional[Tensor] = None,
                    rollout_ids: Optional[Sequence[Any]] = None) -> Tensor:
    """``module``'s ``[B, T]`` advantages of TRL's completions: ``rewards_per_func`` is
    ``[B, K]`` (one column per reward function, NaN where a function did not score; the
    module's ``reward_weights``/``reward_aggregation`` combine them), the rows of one prompt
    are ``num_generations`` consecutive rows (TRL's layout), ``completion_mask`` the tokens
    the loss trains on (TRL's ``completion_mask * tool_mask``). ``process_rewards``
    ``[B, T]`` are per-token rewards (the module's process stage shapes the advantages
    with them); ``rollout_ids`` a per-row episode id for logical rollouts."""
    b, t = completion_mask.shape
    if num_generations < 1 or b % num_generations:
        raise ValueError(f"num_generations: expected a positive divisor of the batch's "
                         f"{b} rows, got {num_generations}")
    if rewards_per_func.ndim != 2 or rewards_per_func.shape[0] != b:
        raise ValueError(f"rewards_per_func: expected a [{b}, K] tensor, got "
                         f"{list(rewards_per_func.shape)}")
    columns = rewards_per_func[:, 0] if rewards_per_func.shape[1] == 1 \
        and module.config.reward_weights is None else rewards_per_func
    group_ids = [i // num_generations for i in range(b)]
    groups = None
    if rollout_ids is not None:
        groups = rollout_groups_of(list(rollout_ids), [num_generations] * (b // num_generations))
    advantages, _ = response_advantages(
        module, "TRL GRPOTrainer", torch.zeros(b, t, device=completion_mask.device),
        completion_mask, group_ids, per_token_rewards=False, reward_columns=columns,
        process_rewards=process_rewards, rollout_groups=groups)
    return advantages


def map_trl_args(config: ActorConfig, args: Any, reward_weights: Optional[Tensor]) -> ActorConfig:
    """``config`` with TRL's reward settings mapped on (module docstring); the ones that
    cannot be mapped are refused, naming the field."""
    scale = getattr(args, "scale_rewards", "group")
    if scale not in ("group", True):
        alternative = {"batch": "grpo_batch_std", "none": "dr_grpo", False: "dr_grpo"}.get(scale)
        raise ValueError(f"GRPOConfig.scale_rewards: {scale!r} cannot be mapped: this trainer's "
                         f"advantages come from its ActorConfig; leave scale_rewards at 'group' "
                         f"and select recipe({alternative!r}) instead")
    changes: dict[str, Any] = {}
    aggregation = getattr(args, "multi_objective_aggregation", "sum_then_normalize")
    if aggregation != config.reward_aggregation:
        changes["reward_aggregation"] = aggregation
    if reward_weights is not None and reward_weights.numel() > 1 or (
            reward_weights is not None and float(reward_weights[0]) != 1.0):
        changes["reward_weights"] = [float(w) for w in reward_weights.tolist()]
    return dataclasses.replace(config, **changes) if changes else config


def check_trl_setup(num_processes: int, args: Any, ppo_loss: Optional[PPOLoss]) -> None:
    """What the trainer cannot do, refused when it is built (before any generation)."""
    if num_processes > 1:
        raise NotImplementedError(
            f"AdvantageGRPOTrainer: more than one process (accelerate num_processes "
            f"{num_processes}) is not supported yet: a prompt's generations may sit on other "
            f"ranks, whose completion masks this trainer does not gather")
    if ppo_loss is not None and ppo_loss.current_kl_coef > 0 and not getattr(args, "beta", 0.0):
        raise ValueError(f"GRPOConfig.beta: 0 with ppo_loss kl_coef {ppo_loss.current_kl_coef}: "
                         f"TRL computes the reference log-probs only when beta > 0; set beta > 0 "
                         f"(TRL's own KL term is then replaced by PPOLoss's)")
    if ppo_loss is not None and ppo_loss.current_kl_coef == 0 and getattr(args, "beta", 0.0):
        raise ValueError(f"GRPOConfig.beta: {args.beta} with ppo_loss kl_coef 0: ppo_loss replaces "
                         f"TRL's loss, KL term included; give PPOLoss(kl_coef={args.beta}) (and "
                         f"kl_estimator: TRL's is k3) instead")
