"""Temporal estimators: per-step rewards and values in, advantages and returns out."""

from __future__ import annotations

from typing import Optional

import torch

from lightning_adv.stages.types import TemporalInputs, TemporalResult
from lightning_adv.ops.gae import compute_token_gae, compute_turn_gae, turn_id_errors
from lightning_adv.stages.gae_lambda import compute_gae_lambda


def _with_process(rewards, inputs: TemporalInputs):
    return rewards if inputs.process_rewards is None else rewards + inputs.process_rewards


def token_gae(inputs: TemporalInputs) -> TemporalResult:
    """GAE over generated tokens. The KL penalty is part of each step's reward, so it is
    discounted inside the recursion and included in the critic's returns."""
    rewards = _with_process(inputs.kl_rewards + inputs.outcome_rewards, inputs)
    advantages, returns = compute_token_gae(
        rewards, inputs.values, inputs.loss_mask,
        bootstrap_values=inputs.bootstrap_values * inputs.is_truncated,
        discount=inputs.discount, gae_lambda=compute_gae_lambda(inputs, "token"))
    return TemporalResult(advantages, returns, rewards)


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
    value = inputs.data.get("sum_pi_squared") if inputs.data is not None else None
    if value is None:
        raise ValueError(f"{where}: rollout batch has no 'sum_pi_squared' ([B, T], next-token "
                         f"convention like ref_logp: the sum over the vocabulary of the squared "
                         f"next-token probabilities at each position); the built-in trainer "
                         f"computes it from its logits when this estimator is selected")
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
    """The batch's ``rollout_is_weights`` ([B, T], next-token convention), checked; None
    when the batch has none."""
    value = inputs.data.get("rollout_is_weights") if inputs.data is not None else None
    if value is None:
        return None
    mask = inputs.loss_mask
    key = f"{where}: rollout batch 'rollout_is_weights'"
    if not isinstance(value, torch.Tensor) or value.shape != mask.shape \
            or not value.is_floating_point() or value.device != mask.device:
        raise ValueError(f"{key}: expected a floating tensor of shape {list(mask.shape)} on "
                         f"{mask.device} (next-token convention like ref_logp), got "
                         f"{getattr(value, 'dtype', type(value).__name__)} "
                         f"{list(getattr(value, 'shape', []))}")
    active = mask > 0
    bad = active & ~(torch.isfinite(value) & (value >= 0))
    if bool(bad.any()):
        raise ValueError(f"{key}: expected finite weights >= 0 at generated positions, got "
                         f"others in rows {bad.any(dim=1).nonzero().flatten().tolist()[:10]}")
    return torch.where(active, value, torch.zeros_like(value)).double()


def _path_weights(inputs: TemporalInputs, sum_pi_squared: torch.Tensor, mask: torch.Tensor,
                  where: str) -> torch.Tensor:
    """``W_t = sum_{j<=t} ρ̄_j² (1 - 2 pi_j + sum_pi_squared_j)`` (``ρ̄ = 1`` without
    ``rollout_is_weights``)."""
    per_step = 1 - 2 * inputs.old_logprobs.double().exp() + sum_pi_squared
    is_weights = _checked_rollout_is_weights(inputs, where)
    if is_weights is not None:
        per_step = per_step * is_weights.square()
    return (per_step * mask).cumsum(dim=1)


def optimal_token_baseline(inputs: TemporalInputs, *, eps: float = 1e-8) -> TemporalResult:
    """Optimal token baseline: ``A_t = G_t - B_t`` with one baseline per response step of
    each prompt group, ``B_t = sum_g(G_t W_t) / (sum_g W_t + eps)``.

    ``G_t`` is the discounted return-to-go (KL, outcome and folded process rewards, as in
    ``reinforce``); ``W_t = sum_{j<=t} (1 - 2 pi_j + sum_pi_squared_j)`` over the row's
    generated positions, ``pi_j`` the old probability of the sampled token. Each response
    is one row (a logical rollout split over several rows is an error). Step t is
    counted from each row's first generated token, so rows of one prompt line up however
    their prompts are padded. A group of one row has baseline 0 (A = G, as verl), except
    one that exclusion of unscorable rows shrank to one (``meta.shrunk_to_one``): its
    baseline is its own return (A = 0), no scored peer to compare with. Values are not
    used. Source: verl's ``optimal_token_baseline`` estimator (Optimal Token Baseline).

    With the batch's ``rollout_is_weights`` ``ρ̄`` (next-token convention), each step's
    term is scaled by ``ρ̄²`` as verl does: the least-variance baseline under truncated IS,
    each member weighted by its own ratio (members of one group sampled by different
    policy versions keep a correct baseline).
    """
    where = "estimator 'optimal_token_baseline'"
    if inputs.meta is None:
        raise ValueError(f"{where}: needs the prompt groups of meta; build the batch with "
                         f"concat_batch or pass a BatchMeta")
    groups = inputs.meta.rollout_groups or []
    split = [i for i, g in enumerate(groups) if g is not None and g.n_rows > g.n_rollouts]
    if split:
        raise ValueError(f"{where}: the per-step baseline lines up whole responses, and these "
                         f"logical rollouts split over several rows (prompts {split[:10]}) are "
                         f"not; give each rollout one row")
    if inputs.old_logprobs is None:
        raise ValueError(f"{where}: TemporalInputs.old_logprobs is None (the pipeline passes the "
                         f"aligned old log-probs)")
    sum_pi_squared = _checked_sum_pi_squared(inputs, where)
    mask = inputs.loss_mask.double()
    rewards = _with_process(inputs.kl_rewards + inputs.outcome_rewards, inputs)
    zeros = torch.zeros_like(rewards)
    returns, _ = compute_token_gae(rewards, zeros, inputs.loss_mask, bootstrap_values=zeros[:, 0],
                                   discount=inputs.discount, gae_lambda=1.0)
    returns = returns.double() * mask
    weights = _path_weights(inputs, sum_pi_squared, mask, where)

    bs, width = mask.shape
    sizes = torch.tensor(inputs.meta.traj_group_sizes, device=mask.device)
    row_group = torch.repeat_interleave(torch.arange(len(sizes), device=mask.device), sizes)
    start = (mask > 0).double().argmax(dim=1, keepdim=True)  # each row's first generated step
    step = (torch.arange(width, device=mask.device) - start).clamp(min=0)
    cell = (row_group[:, None] * width + step).flatten()  # (group, step)
    active = mask.flatten() > 0
    numerator = torch.zeros(len(sizes) * width, dtype=torch.float64, device=mask.device)
    numerator.index_add_(0, cell[active], (returns * weights).flatten()[active])
    denominator = torch.zeros_like(numerator).index_add_(0, cell[active], weights.flatten()[active])
    baseline = (numerator[cell] / (denominator[cell] + eps)).reshape(bs, width)
    baseline = torch.where((sizes[row_group] > 1)[:, None], baseline, torch.zeros_like(baseline))
    shrunk = torch.tensor(inputs.meta.shrunk_to_one, dtype=torch.bool, device=mask.device)
    baseline = torch.where(shrunk[row_group][:, None], returns, baseline)
    advantages = ((returns - baseline) * mask).float()
    return TemporalResult(advantages, returns.float(), rewards)
