"""This project's advantages (any recipe or stage, per-token process rewards, logical
rollouts) and optionally :class:`~lightning_adv.PPOLoss` inside TRL's ``GRPOTrainer``.

The hook is the smallest TRL 1.16 offers: its ``_compute_loss`` takes advantages of shape
``[B, T]`` as well as ``[B]`` ("to support subclasses"), so :class:`AdvantageGRPOTrainer`
(a ``GRPOTrainer`` subclass: importing this module imports TRL, the ``[trl]`` extra) lets
TRL generate and score as usual, keeps the per-function rewards its ``_calculate_rewards`` returns, and replaces
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

from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import torch
from torch import Tensor

from lightning_adv.advantage.module import AdvantageModule
from lightning_adv.config import ActorConfig
from lightning_adv.integrations.trl_advantages import (
    TRL_STD_EPS, check_trl_setup, grpo_advantages, map_trl_args, rollout_groups_of,
    trl_grpo_config)
from lightning_adv.losses.ppo_loss import PPOLoss
from lightning_adv.recipes import recipe

try:
    from trl import GRPOTrainer
except ImportError as exc:  # the trainer subclasses TRL's: without TRL there is no class
    raise ImportError(f"lightning_adv.integrations.trl needs TRL, the optional extra [trl]: "
                      f"pip install 'lightning_adv[trl]' (importing trl failed: {exc})",
                      name="trl") from exc

__all__ = ["AdvantageGRPOTrainer", "grpo_advantages", "trl_grpo_config", "rollout_groups_of",
           "map_trl_args", "check_trl_setup", "TRL_STD_EPS"]

ProcessRewardFunc = Callable[..., Sequence[Sequence[float]]]


class AdvantageGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with this project's advantages (and optionally loss).

    ``AdvantageGRPOTrainer(*args, advantage="grpo", process_reward_funcs=(), ppo_loss=None,
    **kwargs)``: ``args``/``kwargs`` are ``GRPOTrainer``'s; ``advantage`` a recipe name,
    an :class:`~lightning_adv.ActorConfig` or an :class:`~lightning_adv.AdvantageModule`'s
    config; ``process_reward_funcs`` functions called like TRL's reward functions
    (keyword arguments ``prompts``, ``completions``, ``completion_ids`` and the dataset's
    columns) returning one list of per-token rewards per completion (the config's process
    stage shapes the advantages with them); ``ppo_loss`` a
    :class:`~lightning_adv.PPOLoss` replacing TRL's loss. A dataset column ``rollout_id``
    makes consecutive rows with the same id one logical rollout. Override its methods
    (:meth:`compute_advantages`, :meth:`process_rewards`, or TRL's) in a subclass as with
    any ``GRPOTrainer``."""

    def __init__(self, *args: Any, advantage: Union[str, ActorConfig, AdvantageModule] = "grpo",
                 process_reward_funcs: Sequence[ProcessRewardFunc] = (),
                 ppo_loss: Optional[PPOLoss] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        check_trl_setup(self.accelerator.num_processes, self.args, ppo_loss)
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
