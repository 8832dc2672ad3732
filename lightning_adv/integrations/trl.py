"""This project's advantages (any recipe or stage, per-token process rewards, logical
rollouts) and optionally :class:`~lightning_adv.PPOLoss` inside TRL's ``GRPOTrainer``.

The hook is the smallest TRL 1.16 offers: its ``_compute_loss`` takes advantages of shape
``[B, T]`` as well as ``[B]`` ("to support subclasses"), so :class:`AdvantageGRPOTrainer`
(built on first use: importing this module does not import TRL) lets TRL generate and score
as usual, keeps the per-function rewards its ``_calculate_rewards`` returns, and replaces
the ``advantages`` of the batch with this project's ``[B, T]`` ones
(:func:`grpo_advantages`). With ``ppo_loss=PPOLoss(...)`` it also replaces TRL's loss by
this project's (the per-token log-probs still come from TRL's own forward pass).

    from lightning_adv.integrations.trl import AdvantageGRPOTrainer, trl_grpo_config
    trainer = AdvantageGRPOTrainer(model=..., reward_funcs=[...], args=GRPOConfig(...),
                                   train_dataset=..., advantage=recipe("rloo"))

TRL's settings that decide advantages are mapped or refused: ``reward_weights`` ->
``ActorConfig.reward_weights``; ``multi_objective_aggregation`` ->
``reward_aggregation``; ``scale_rewards`` other than ``"group"`` is refused (select the
recipe instead: ``grpo_batch_std`` for ``"batch"``, ``dr_grpo`` for ``"none"``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import torch
from torch import Tensor

from lightning_adv.advantage.module import AdvantageModule
from lightning_adv.batch.grouping import RolloutGroup
from lightning_adv.config import ActorConfig, NormConfig
from lightning_adv.integrations.response_batch import response_advantages
from lightning_adv.losses.ppo_loss import PPOLoss
from lightning_adv.recipes import recipe

__all__ = ["AdvantageGRPOTrainer", "grpo_advantages", "trl_grpo_config", "rollout_groups_of",
           "map_trl_args", "check_trl_setup"]

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


ProcessRewardFunc = Callable[..., Sequence[Sequence[float]]]


class _AdvantageMixin:
    """The methods :class:`AdvantageGRPOTrainer` adds to TRL's ``GRPOTrainer`` (the class
    is put together on first use, so this module imports without TRL)."""

    def __init__(self, *args: Any, advantage: Union[str, ActorConfig, AdvantageModule] = "grpo",
                 process_reward_funcs: Sequence[ProcessRewardFunc] = (),
                 ppo_loss: Optional[PPOLoss] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if isinstance(advantage, str):
            advantage = recipe(advantage)
        config = advantage.config if isinstance(advantage, AdvantageModule) else advantage
        if not isinstance(config, ActorConfig):
            raise TypeError(f"advantage: expected a recipe name, an ActorConfig or an "
                            f"AdvantageModule, got {type(advantage).__name__}")
        self.advantage_module = AdvantageModule(map_trl_args(config, self.args, self.reward_weights))
        self.process_reward_funcs = list(process_reward_funcs)
        self.ppo_loss = ppo_loss
        self._scored: Optional[tuple] = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions,
                                                      completion_ids_list)
        self._scored = (inputs, prompts, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        if self.accelerator.num_processes > 1:
            raise NotImplementedError(
                "AdvantageGRPOTrainer: more than one process (accelerate num_processes "
                f"{self.accelerator.num_processes}) is not supported yet: a prompt's "
                "generations may sit on other ranks, whose completion masks this trainer "
                "does not gather")
        output = super()._generate_and_score_completions(inputs)
        output["advantages"] = self.compute_advantages(output)
        return output

    def compute_advantages(self, output: dict) -> Tensor:
        """The ``[B, T]`` advantages of a generated batch (TRL's ``output``, whose
        ``advantages`` are still TRL's own)."""
        rows, prompts, completions, completion_ids, rewards_per_func = self._scored
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        mode = "train" if self.model.training else "eval"
        n = self.num_generations if mode == "train" else self.num_generations_eval
        process = self.process_rewards(rows, prompts, completions, completion_ids, mask)
        rollout_ids = [row.get("rollout_id") for row in rows]
        advantages = grpo_advantages(
            self.advantage_module, rewards_per_func.to(mask.device), mask.float(), n,
            process_rewards=process,
            rollout_ids=None if all(r is None for r in rollout_ids) else rollout_ids)
        self._metrics[mode]["la/advantage_mean"].append(
            float((advantages * mask).sum() / mask.sum().clamp(min=1)))
        return advantages

    def process_rewards(self, rows, prompts, completions, completion_ids, mask
                        ) -> Optional[Tensor]:
        """The per-token rewards of ``process_reward_funcs``, summed, ``[B, T]``."""
        if not self.process_reward_funcs:
            return None
        total = torch.zeros(mask.shape, device=mask.device)
        fields = {k: [row.get(k) for row in rows] for k in rows[0]
                  if k not in ("prompt", "completion")}
        for fn in self.process_reward_funcs:
            scores = fn(prompts=prompts, completions=completions,
                        completion_ids=completion_ids, **fields)
            name = getattr(fn, "__name__", repr(fn))
            if len(scores) != len(completion_ids):
                raise ValueError(f"process reward function {name}: expected one list per "
                                 f"completion ({len(completion_ids)}), got {len(scores)}")
            for i, (row, ids) in enumerate(zip(scores, completion_ids)):
                if len(row) != len(ids):
                    raise ValueError(f"process reward function {name}: completion {i}: "
                                     f"expected one reward per token ({len(ids)}), got "
                                     f"{len(row)}")
                total[i, :len(row)] += torch.as_tensor(row, dtype=total.dtype,
                                                       device=total.device)
        return total

    def _compute_loss(self, model, inputs):
        if self.ppo_loss is None:
            return super()._compute_loss(model, inputs)
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, ids, attention, inputs["completion_ids"].size(1), compute_entropy=True)
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        old = inputs.get("old_per_token_logps")
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages[:, None].expand_as(logps)
        out = self.ppo_loss(logps, logps.detach() if old is None else old, advantages, mask,
                            ref_logprobs=inputs.get("ref_per_token_logps"), entropy=entropies)
        mode = "train" if self.model.training else "eval"
        for key, value in out.items():
            if key not in ("loss", "num_tokens"):
                self._metrics[mode][f"la/{key}"].append(float(value))
        # TRL turns off HF's loss scaling: a loss is divided by the accumulation steps
        return out["loss"] / (self.current_gradient_accumulation_steps if mode == "train" else 1)


@functools.cache
def _trainer_class() -> type:
    from trl import GRPOTrainer  # the optional extra: pip install lightning_adv[trl]

    return type("AdvantageGRPOTrainer", (_AdvantageMixin, GRPOTrainer),
                {"__doc__": AdvantageGRPOTrainer.__doc__, "__module__": __name__})


class AdvantageGRPOTrainer:
    """TRL's ``GRPOTrainer`` with this project's advantages (and optionally loss).

    ``AdvantageGRPOTrainer(*args, advantage="grpo", process_reward_funcs=(), ppo_loss=None,
    **kwargs)``: ``args``/``kwargs`` are ``GRPOTrainer``'s; ``advantage`` a recipe name,
    an :class:`~lightning_adv.ActorConfig` or an :class:`~lightning_adv.AdvantageModule`'s
    config; ``process_reward_funcs`` functions called like TRL's reward functions
    (keyword arguments ``prompts``, ``completions``, ``completion_ids`` and the dataset's
    columns) returning one list of per-token rewards per completion (the config's process
    stage shapes the advantages with them); ``ppo_loss`` a
    :class:`~lightning_adv.PPOLoss` replacing TRL's loss. A dataset column ``rollout_id``
    makes consecutive rows with the same id one logical rollout. Constructing it returns
    an instance of a ``GRPOTrainer`` subclass (TRL is imported then)."""

    def __new__(cls, *args: Any, **kwargs: Any):
        return _trainer_class()(*args, **kwargs)
