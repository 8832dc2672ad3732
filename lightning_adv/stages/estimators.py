"""Temporal estimators: per-step rewards and values in, advantages and returns out."""

from __future__ import annotations

from typing import Optional

import torch

from lightning_adv.stages.types import TemporalInputs, TemporalResult, required_key
from lightning_adv.ops.gae import compute_token_gae, compute_turn_gae, turn_id_errors
from lightning_adv.stages.gae_lambda import compute_gae_lambda
from lightning_adv._checks import check_bool, positive_number
from lightning_adv.stages.registry import register_stage


def _with_process(rewards, inputs: TemporalInputs):
    return rewards if inputs.process_rewards is None else rewards + inputs.process_rewards


@register_stage("estimator", baseline="values", timestep_unit="token", reads_discount=True,
                reads_lambda=True, auto=True)
def token_gae(inputs: TemporalInputs) -> TemporalResult:
    """GAE over generated tokens. The KL penalty is part of each step's reward, so it is
    discounted inside the recursion and included in the critic's returns."""
    rewards = _with_process(inputs.kl_rewards + inputs.outcome_rewards, inputs)
    advantages, returns = compute_token_gae(
        rewards, inputs.values, inputs.loss_mask,
        bootstrap_values=inputs.bootstrap_values * inputs.is_truncated,
        discount=inputs.discount, gae_lambda=compute_gae_lambda(inputs, "token"))
    return TemporalResult(advantages, returns, rewards)


@register_stage("estimator", requires=("turn_ids",), baseline="values", timestep_unit="turn",
                reads_discount=True, reads_lambda=True, auto=True)
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


@register_stage("estimator", replaces_critic=True, timestep_unit="token", reads_discount=True)
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



def _checked_sum_pi_squared(inputs: TemporalInputs, where: str) -> torch.Tensor:
    """The batch's ``sum_pi_squared`` ([B, T], next-token convention), checked."""
    value = required_key(inputs, "sum_pi_squared", where,
                         "[B, T], next-token convention like ref_logp: the sum over the "
                         "vocabulary of the squared next-token probabilities at each position",
                         "; the built-in trainer computes it from its logits when this "
                         "estimator is selected")
    mask = inputs.loss_mask
    key = f"{where}: rollout batch 'sum_pi_squared'"
    if not isinstance(value, torch.Tensor) or value.shape != mask.shape:
        raise ValueError(f"{key}: expected a tensor of shape {list(mask.shape)}, got "
                         f"{list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}")
    if value.device != mask.device or not value.is_floating_point():
        raise ValueError(f"{key}: expected a floating-point tensor on {mask.device}, got "
                         f"{value.dtype} on {value.device}")
    active = mask > 0
    bad = active & ~((value >= 0) & (value <= 1 + 1e-6))  # NaN fails both comparisons
    if bool(bad.any()):
        raise ValueError(f"{key}: expected values in [0, 1] (a sum of squared probabilities) at "
                         f"generated positions, got others in rows "
                         f"{bad.any(dim=1).nonzero().flatten().tolist()[:10]}")
    return torch.where(active, value, torch.zeros_like(value)).double()


def _checked_rollout_is_weights(inputs: TemporalInputs, where: str) -> Optional[torch.Tensor]:
    """The batch's ``rollout_is_weights`` ([B, T], next-token convention), checked, or None."""
    value = inputs.data.get("rollout_is_weights") if inputs.data is not None else None
    if value is None:
        return None
    mask = inputs.loss_mask
    key = f"{where}: rollout batch 'rollout_is_weights'"
    if not isinstance(value, torch.Tensor) or value.shape != mask.shape:
        raise ValueError(f"{key}: expected a tensor of shape {list(mask.shape)} (one importance "
                         f"weight per position, next-token convention), got "
                         f"{list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}")
    if value.device != mask.device or not value.is_floating_point():
        raise ValueError(f"{key}: expected a floating-point tensor on {mask.device}, got "
                         f"{value.dtype} on {value.device}")
    bad = (mask > 0) & ~((value >= 0) & torch.isfinite(value))   # NaN fails both
    if bool(bad.any()):
        raise ValueError(f"{key}: expected finite weights >= 0 at generated positions, got others "
                         f"in rows {bad.any(dim=1).nonzero().flatten().tolist()[:10]}")
    return torch.where(mask > 0, value, torch.zeros_like(value)).double()


def check_one_row_per_rollout(inputs: TemporalInputs, where: str, why: str) -> None:
    """The batch has meta, and no logical rollout is split over several rows (``why``: what
    the stage needs whole rows for, for the error)."""
    if inputs.meta is None:
        raise ValueError(f"{where}: needs the prompt groups of meta; build the batch with "
                         f"concat_batch or pass a BatchMeta")
    groups = inputs.meta.rollout_groups or []
    split = [i for i, g in enumerate(groups) if g is not None and g.n_rows > g.n_rollouts]
    if split:
        raise ValueError(f"{where}: {why}, and these logical rollouts split over several rows "
                         f"(prompts {split[:10]}) are not; give each rollout one row")


def _otb_inputs_checked(inputs: TemporalInputs, where: str) -> None:
    check_one_row_per_rollout(inputs, where, "the per-step baseline lines up whole responses")
    if inputs.old_logprobs is None:
        raise ValueError(f"{where}: TemporalInputs.old_logprobs is None (the pipeline passes the "
                         f"aligned old log-probs)")


@register_stage("estimator", requires=("sum_pi_squared",), reads=("rollout_is_weights",),
                replaces_critic=True, baseline="group", timestep_unit="token", reads_discount=True,
                kwarg_checks={"handle_zero_tail": check_bool, "eps": positive_number})
def optimal_token_baseline(inputs: TemporalInputs, *, handle_zero_tail: bool = True,
                           eps: float = 1e-8) -> TemporalResult:
    """Optimal token baseline: ``A_t = G_t - B_t`` with one baseline per generated step of
    each prompt group, ``B_t = sum_g(G_t W_t) / (sum_g W_t + eps)``.

    ``G_t`` is the discounted return-to-go (KL, outcome and folded process rewards, as in
    ``reinforce``); ``W_t = sum_{j<=t} rho_j^2 (1 - 2 pi_j + sum_pi_squared_j)`` over the
    row's generated positions, ``pi_j`` the old probability of the sampled token and
    ``rho_j`` the batch's ``rollout_is_weights`` (1 without them). Step t is the row's
    t-th *generated* token: prompt padding and tokens the policy did not generate (tool
    outputs, environment replies) are not steps, so rows of one prompt line up however
    their prompts are padded and wherever their tool outputs sit (verl's
    ``tir_optimal_token_baseline``; verl's ``optimal_token_baseline`` counts columns,
    which is the same on single-turn batches). With ``handle_zero_tail`` (verl's
    default), the steps of a group's unique longest response past the second longest
    one get baseline 0 (A = G) instead of their own return. A group of one non-empty
    row has baseline 0 (A = G, as verl), except one that exclusion of unscorable rows
    shrank to one (``meta.shrunk_to_one``): its baseline is its own return (A = 0), no
    scored peer to compare with. Each response is one row (a logical rollout split over
    several rows is an error). Values are not used.
    """
    return _optimal_token_baseline(inputs, handle_zero_tail, eps, "optimal_token_baseline")


@register_stage("estimator", requires=("sum_pi_squared",), reads=("rollout_is_weights",),
                replaces_critic=True, baseline="group", timestep_unit="token", reads_discount=True,
                kwarg_checks={"handle_zero_tail": check_bool, "eps": positive_number})
def tir_optimal_token_baseline(inputs: TemporalInputs, *, handle_zero_tail: bool = True,
                               eps: float = 1e-8) -> TemporalResult:
    """verl's ``tir_optimal_token_baseline`` (tool-integrated): the estimator of
    :func:`optimal_token_baseline`, whose steps are counted over generated tokens; the
    name is kept for verl users."""
    return _optimal_token_baseline(inputs, handle_zero_tail, eps, "tir_optimal_token_baseline")


def _optimal_token_baseline(inputs: TemporalInputs, handle_zero_tail: bool, eps: float,
                            name: str) -> TemporalResult:
    where = f"estimator {name!r}"
    _otb_inputs_checked(inputs, where)
    sum_pi_squared = _checked_sum_pi_squared(inputs, where)
    is_weights = _checked_rollout_is_weights(inputs, where)
    mask = inputs.loss_mask.double()
    rewards = _with_process(inputs.kl_rewards + inputs.outcome_rewards, inputs)
    zeros = torch.zeros_like(rewards)
    returns, _ = compute_token_gae(rewards, zeros, inputs.loss_mask, bootstrap_values=zeros[:, 0],
                                   discount=inputs.discount, gae_lambda=1.0)
    returns = returns.double() * mask
    step_weight = 1 - 2 * inputs.old_logprobs.double().exp() + sum_pi_squared
    if is_weights is not None:
        step_weight = step_weight * is_weights ** 2
    weights = (step_weight * mask).cumsum(dim=1)
    baseline = _per_step_baseline(returns, weights, mask, inputs.meta, eps, handle_zero_tail)
    advantages = ((returns - baseline) * mask).float()
    return TemporalResult(advantages, returns.float(), rewards)


def _per_step_baseline(returns: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor,
                       meta, eps: float, handle_zero_tail: bool) -> torch.Tensor:
    """``sum_g(G W) / (sum_g W + eps)`` per (prompt group, generated step), [B, T]."""
    bs, width = mask.shape
    device = mask.device
    active = mask > 0
    sizes = torch.tensor(meta.traj_group_sizes, device=device)
    n_groups = len(sizes)
    row_group = torch.repeat_interleave(torch.arange(n_groups, device=device), sizes)
    step = (mask.cumsum(dim=1) - 1).clamp(min=0).long()   # the t-th generated token
    cell = (row_group[:, None] * width + step).flatten()[active.flatten()]
    numerator = torch.zeros(n_groups * width, dtype=torch.float64, device=device)
    numerator.index_add_(0, cell, (returns * weights)[active])
    denominator = torch.zeros_like(numerator).index_add_(0, cell, weights[active])
    all_cells = (row_group[:, None] * width + step).flatten()
    baseline = (numerator[all_cells] / (denominator[all_cells] + eps)).reshape(bs, width)
    lengths = mask.sum(dim=1)
    members = torch.zeros(n_groups, device=device).index_add_(0, row_group, (lengths > 0).float())
    baseline = torch.where((members[row_group] > 1)[:, None], baseline, torch.zeros_like(baseline))
    if handle_zero_tail:
        baseline = _zero_unique_tails(baseline, step, lengths, row_group, n_groups)
    shrunk = torch.tensor(meta.shrunk_to_one, dtype=torch.bool, device=device)
    return torch.where(shrunk[row_group][:, None], returns, baseline)


def _zero_unique_tails(baseline: torch.Tensor, step: torch.Tensor, lengths: torch.Tensor,
                       row_group: torch.Tensor, n_groups: int) -> torch.Tensor:
    """verl's ``handle_zero_tail``: where a group's longest response is unique, its steps
    from the second longest length on have baseline 0 (only it reaches them, so its own
    return would be its baseline)."""
    longest = torch.zeros(n_groups, dtype=lengths.dtype, device=lengths.device).scatter_reduce(
        0, row_group, lengths, "amax")
    is_longest = lengths == longest[row_group]
    n_longest = torch.zeros(n_groups, device=lengths.device).index_add_(0, row_group, is_longest.float())
    second = torch.zeros(n_groups, dtype=lengths.dtype, device=lengths.device).scatter_reduce(
        0, row_group, torch.where(is_longest, torch.zeros_like(lengths), lengths), "amax")
    unique = is_longest & (n_longest[row_group] == 1) & (lengths > second[row_group])
    tail = unique[:, None] & (step >= second[row_group][:, None])
    return torch.where(tail, torch.zeros_like(baseline), baseline)
