"""Temporal estimators: per-step rewards and values in, advantages and returns out."""

from __future__ import annotations

import torch

from lightning_adv.contracts import TemporalInputs, TemporalResult
from lightning_adv.kernels import compute_token_gae, compute_turn_gae, turn_id_errors
from lightning_adv.lambdas import compute_gae_lambda
from lightning_adv.stages.registry import register_stage


def _with_process(rewards, inputs: TemporalInputs):
    return rewards if inputs.process_rewards is None else rewards + inputs.process_rewards


@register_stage("estimator")
def token_gae(inputs: TemporalInputs) -> TemporalResult:
    """GAE over generated tokens. The KL penalty is part of each step's reward, so it is
    discounted inside the recursion and included in the critic's returns."""
    rewards = _with_process(inputs.kl_rewards + inputs.outcome_rewards, inputs)
    advantages, returns = compute_token_gae(
        rewards, inputs.values, inputs.loss_mask,
        bootstrap_values=inputs.bootstrap_values * inputs.is_truncated,
        discount=inputs.discount, gae_lambda=compute_gae_lambda(inputs, "token"))
    return TemporalResult(advantages, returns, rewards)


@register_stage("estimator")
def turn_gae(inputs: TemporalInputs) -> TemporalResult:
    """GAE over generated turns. The token KL penalty is added to the actor's advantages
    after the recursion, undiscounted, and stays out of the critic's returns."""
    if inputs.turn_ids is None:
        raise ValueError("estimator 'turn_gae': rollout batch has no 'turn_ids'")
    rewards = _with_process(inputs.outcome_rewards, inputs)
    with turn_id_errors("estimator 'turn_gae': rollout batch 'turn_ids' (shifted one step left)"):
        advantages, returns = compute_turn_gae(
            rewards, inputs.values, inputs.loss_mask, inputs.turn_ids,
            bootstrap_values=inputs.bootstrap_values * inputs.is_truncated,
            discount=inputs.discount, gae_lambda=compute_gae_lambda(inputs, "turn"))
    return TemporalResult(advantages + inputs.kl_rewards, returns, rewards + inputs.kl_rewards)


@register_stage("estimator", replaces_critic=True)
def reinforce(inputs: TemporalInputs) -> TemporalResult:
    """REINFORCE return-to-go over generated tokens, without a critic.

    Each step's reward is KL penalty + outcome (+ folded process reward), as in token GAE;
    the advantage of a token is its discounted return ``G_t = sum_k gamma^k r_(t+k)`` over
    the following active positions (values ignored, no bootstrap). Returns equal the
    advantages. With ``adv_norm`` at batch level this is REINFORCE++ (Hu, 2025,
    arXiv:2501.03262); with a group-mean reward baseline first, REINFORCE++-baseline.
    """
    rewards = _with_process(inputs.kl_rewards + inputs.outcome_rewards, inputs)
    zeros = torch.zeros_like(rewards)
    advantages, _ = compute_token_gae(rewards, zeros, inputs.loss_mask,
                                      bootstrap_values=zeros[:, 0], discount=inputs.discount,
                                      gae_lambda=1.0)
    return TemporalResult(advantages, advantages.clone(), rewards)

