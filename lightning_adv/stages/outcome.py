"""Outcome reward shaping: one reward per row, before scaling and normalization.

Besides ``identity`` (the default), this family ships the baselines of estimators that
cannot be written as a ``NormConfig``: OPO's length-weighted baseline, GPG's corrected
group baseline, pass@k GRPO's best-of-group reward, a group mean over the batch std
(TRL's batch scaling) and ReMax's greedy baseline, plus the per-sequence KL penalty of
TRL's RLOO. The group ones need the prompt groups of ``meta`` (build the batch with
``concat_batch``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.stages.types import OutcomeResult, OutcomeRewardInputs
from lightning_adv.distributed import all_reduce_sum
from lightning_adv.batch.grouping import BatchMeta
from lightning_adv._checks import check_bool, non_negative_number, positive_number
from lightning_adv.stages.registry import register_stage


@register_stage("outcome_reward_shaping", auto=True)
def identity(inputs: OutcomeRewardInputs) -> OutcomeResult:
    """Keep the (length-penalized) task rewards; an integer tensor stays integer."""
    return OutcomeResult(rewards=inputs.data["rewards"])


def _prompt_groups(inputs: OutcomeRewardInputs, name: str) -> tuple[Tensor, int]:
    """Each row's prompt-group index, and the number of groups."""
    rewards = inputs.data["rewards"]
    if inputs.meta is None:
        raise ValueError(f"outcome_reward_shaping {name!r}: needs the prompt groups of meta; "
                         f"build the batch with concat_batch or pass a BatchMeta")
    return inputs.meta.index(rewards.device).traj_of_row, inputs.meta.n_trajs


@dataclass(frozen=True)
class _Rollouts:
    """The logical rollouts of a batch: the members of the prompt groups. A rollout split
    over several rows (``RolloutGroup.row_counts``) is one member, whose reward is its first
    row's (the reference rollout-aware normalization uses too)."""

    rewards: Tensor
    """[R] float64, each rollout's reward"""
    group: Tensor
    """[R] prompt-group index of each rollout"""
    n_groups: int
    member: Tensor
    """[B] rollout index of each row"""


def _rollouts(inputs: OutcomeRewardInputs, name: str) -> _Rollouts:
    rewards = inputs.data["rewards"]
    if inputs.meta is None:
        raise ValueError(f"outcome_reward_shaping {name!r}: needs the prompt groups of meta; "
                         f"build the batch with concat_batch or pass a BatchMeta")
    device = rewards.device
    counts = torch.tensor(inputs.meta.rollout_row_counts, device=device)
    sizes = torch.tensor(inputs.meta.logical_group_sizes, device=device)
    member = torch.repeat_interleave(torch.arange(len(counts), device=device), counts)
    group = torch.repeat_interleave(torch.arange(len(sizes), device=device), sizes)
    return _Rollouts(rewards.double()[counts.cumsum(0) - counts], group, len(sizes), member)


def check_row_tensor(where: str, x: Any, rewards: Tensor) -> None:
    """An optional [B] float batch key: shape, device, dtype and finiteness."""
    if not isinstance(x, Tensor) or tuple(x.shape) != tuple(rewards.shape):
        raise ValueError(f"{where}: expected a tensor of shape {list(rewards.shape)} (one value "
                         f"per row), got {list(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    if x.device != rewards.device:
        raise ValueError(f"{where}: expected a tensor on {rewards.device}, got {x.device}")
    if not x.is_floating_point():
        raise ValueError(f"{where}: expected a floating-point tensor, got {x.dtype}")
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        raise ValueError(f"{where}: expected finite values, got NaN/Inf in rows "
                         f"{bad.nonzero().flatten().tolist()[:10]}")


def _group_sum(values: Tensor, groups: Tensor, n_groups: int) -> Tensor:
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, groups, values)


@register_stage("outcome_reward_shaping", replaces_critic=True, baseline="group")
def opo_baseline(inputs: OutcomeRewardInputs) -> OutcomeResult:
    """OPO: ``r_i - b``, with the length-weighted group baseline ``b = sum(l_j r_j) / sum(l_j)``.

    ``l`` is the number of generated tokens of each row; a group without generated tokens
    uses the plain mean. Source: Hao et al., 2025, "On-Policy RL with Optimal Reward
    Baseline" (arXiv:2505.23585), the baseline that minimizes gradient variance for
    sequence-level rewards.
    """
    groups, n = _prompt_groups(inputs, "opo_baseline")
    r = inputs.data["rewards"].double()
    lengths = inputs.data["loss_mask"].bool().sum(dim=1).double()
    weight = _group_sum(lengths, groups, n)
    weighted = _group_sum(lengths * r, groups, n) / weight.clamp_min(1.0)
    plain = _group_sum(r, groups, n) / _group_sum(torch.ones_like(r), groups, n)
    baseline = torch.where(weight > 0, weighted, plain)
    return OutcomeResult(rewards=(r - baseline[groups]).float())


@register_stage("outcome_reward_shaping", replaces_critic=True, baseline="group",
                kwarg_checks={"std_normalize": check_bool, "eps": positive_number})
def gpg(inputs: OutcomeRewardInputs, *, std_normalize: bool = False, eps: float = 1e-5) -> OutcomeResult:
    """GPG: ``alpha * (r_i - mean_g(r)) / F``, ``alpha = B / (B - M)``.

    ``F`` is 1, or the group's unbiased std plus ``eps`` with ``std_normalize``. ``M`` counts
    the responses of groups whose rewards are all equal (they carry no gradient) and ``B``
    all responses; both are summed over the data-parallel group. ``alpha`` rescales the
    valid responses so the batch gradient is not diluted (``alpha = 1`` when none is
    valid). Group statistics are over logical rollouts (a rollout split over several rows
    counts once). Source: Chu et al., 2025, "GPG: A Simple and Strong Reinforcement
    Learning Baseline for Model Reasoning" (arXiv:2504.02546), Accurate Gradient Estimation.
    """
    roll = _rollouts(inputs, "gpg")
    groups, n, ref = roll.group, roll.n_groups, roll.rewards
    ones = torch.ones_like(ref)
    count = _group_sum(ones, groups, n)
    mean = _group_sum(ref, groups, n) / count
    centred_ref = ref - mean[groups]
    scale = torch.ones_like(mean)
    if std_normalize:
        var = _group_sum(centred_ref * centred_ref, groups, n) / (count - 1).clamp_min(1.0)
        scale = torch.where(count > 1, var.sqrt(), torch.ones_like(var)) + eps
    spread = (_group_sum((centred_ref != 0).double(), groups, n) > 0)[groups]
    totals = all_reduce_sum(torch.stack([ones.sum(), (~spread).double().sum()]))
    valid = totals[0] - totals[1]
    alpha = torch.where(valid > 0, totals[0] / valid.clamp_min(1.0), torch.ones_like(valid))
    row_group = groups[roll.member]
    centred = (inputs.data["rewards"].double() - mean[row_group]) / scale[row_group]
    return OutcomeResult(rewards=(alpha * centred).float())



def _group_counts(groups: Tensor, n_groups: int, like: Tensor) -> Tensor:
    return _group_sum(torch.ones_like(like), groups, n_groups)


@register_stage("outcome_reward_shaping", replaces_critic=True, baseline="group",
                kwarg_checks={"std_normalize": check_bool, "eps": positive_number})
def passk_baseline(inputs: OutcomeRewardInputs, *, std_normalize: bool = True,
                   eps: float = 1e-6) -> OutcomeResult:
    """Pass@k GRPO: in each prompt group only the best response gets a non-zero reward,
    ``(r_max - r_second) / (std_g + eps)`` (``r_max - r_second`` without
    ``std_normalize``; unbiased group std); every other response gets 0.

    Responses are logical rollouts: every row of the best one gets its reward. Of
    responses tied for the maximum, the first one is the best, and it gets 0 (``r_max =
    r_second``). A group of one response has no second best: an error, unless exclusion
    of unscorable responses shrank it to one (``meta.shrunk_to_one``), which gets 0.
    Source: verl's ``grpo_passk`` estimator (pass@k training; verl cites arXiv:2503.19595).
    """
    roll = _rollouts(inputs, "passk_baseline")
    groups, n, r = roll.group, roll.n_groups, roll.rewards
    count = _group_counts(groups, n, r)
    shrunk = torch.tensor(inputs.meta.shrunk_to_one, dtype=torch.bool, device=r.device)
    if bool(((count < 2) & ~shrunk).any()):
        single = ((count < 2) & ~shrunk).nonzero().flatten().tolist()
        raise ValueError(f"outcome_reward_shaping 'passk_baseline': pass@k needs at least two "
                         f"responses per prompt group; groups {single[:10]} have one (sample "
                         f"more responses per prompt, e.g. ppo.n_samples >= 2)")
    rollouts = torch.arange(r.shape[0], device=r.device)
    top = torch.full((n,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(
        0, groups, r, "amax")
    # The best response: the first one of its group that reaches the maximum.
    first_best = torch.full((n,), r.shape[0], device=r.device).scatter_reduce(
        0, groups, torch.where(r == top[groups], rollouts, r.shape[0]), "amin")
    best = rollouts == first_best[groups]
    second = torch.full((n,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(
        0, groups, torch.where(best, -torch.inf, r), "amax")
    gap = top - second
    if std_normalize:
        mean = _group_sum(r, groups, n) / count
        var = _group_sum((r - mean[groups]) ** 2, groups, n) / (count - 1).clamp_min(1.0)
        gap = gap / (var.sqrt() + eps)
    gap = torch.where(count >= 2, gap, 0.0)  # a shrunk group's lone member: no second best
    per_rollout = torch.where(best, gap[groups], 0.0)
    return OutcomeResult(rewards=per_rollout[roll.member].float())


@register_stage("outcome_reward_shaping", replaces_critic=True, baseline="group",
                kwarg_checks={"std_unbiased": check_bool, "eps": positive_number})
def group_mean_batch_std(inputs: OutcomeRewardInputs, *, std_unbiased: bool = True,
                         eps: float = 1e-4) -> OutcomeResult:
    """``(r_i - mean_g r) / (std_batch r + eps)``: a group-mean baseline scaled by the
    standard deviation of the raw rewards over the whole batch, around the batch mean
    (TRL's ``scale_rewards="batch"``, which cites the PPO Lite paper, arXiv:2508.08221).
    Means and std are over logical rollouts (a rollout split over several rows counts
    once). The batch sums are reduced over the data-parallel group, so the std is global
    under DDP; a batch of one response has std 1 (unbiased) like the pipeline's
    normalization.
    """
    roll = _rollouts(inputs, "group_mean_batch_std")
    groups, n, ref = roll.group, roll.n_groups, roll.rewards
    group_mean = _group_sum(ref, groups, n) / _group_counts(groups, n, ref)
    centred = inputs.data["rewards"].double() - group_mean[groups[roll.member]]
    total, squares, count = all_reduce_sum(torch.stack([
        ref.sum(), (ref * ref).sum(), torch.tensor(float(ref.shape[0]), dtype=ref.dtype,
                                                   device=ref.device)]))
    mean = total / count
    spread = (squares - count * mean * mean).clamp_min(0.0)
    dof = count - 1 if std_unbiased else count
    std = torch.where(dof > 0, (spread / dof.clamp_min(1.0)).sqrt(), torch.ones_like(spread))
    return OutcomeResult(rewards=(centred / (std + eps)).float())


def _aligned_old_and_ref(inputs: OutcomeRewardInputs, name: str) -> tuple[Tensor, Tensor, Tensor]:
    """The next-token aligned loss mask, old log-probs and ``ref_logp`` of the batch
    (old: the recomputed ``prox_logp`` where the pipeline uses it, as SPEC §3 step 5)."""
    data, config = inputs.data, inputs.config
    if data.get("ref_logp") is None:
        raise ValueError(f"outcome_reward_shaping {name!r}: rollout batch has no 'ref_logp' (the "
                         f"reference policy's log-probs, next-token convention); the sequence KL "
                         f"penalty needs them")
    mask = torch.roll(data["loss_mask"].float(), -1, dims=-1)
    if config.recompute_logprob and not config.use_decoupled_loss \
            and data.get("prox_logp") is not None:
        old = data["prox_logp"].double()
    else:
        old = torch.roll(data["logprobs"].double(), -1, dims=-1)
    return mask.double(), old * mask, data["ref_logp"].double() * mask


def _per_rollout(per_row: Tensor, meta: Optional[BatchMeta]) -> tuple[Tensor, Tensor]:
    """Each logical rollout's sum of ``per_row``, and each row's rollout index."""
    if meta is None or meta.rollout_groups is None:
        return per_row, torch.arange(per_row.shape[0], device=per_row.device)
    counts = torch.tensor(meta.rollout_row_counts, device=per_row.device)
    member = torch.repeat_interleave(torch.arange(len(counts), device=per_row.device), counts)
    return _group_sum(per_row, member, len(counts)), member


@register_stage("outcome_reward_shaping", requires=("ref_logp",),
                kwarg_checks={"beta": non_negative_number})
def sequence_kl(inputs: OutcomeRewardInputs, *, beta: float = 0.05) -> OutcomeResult:
    """``r_i - beta * sum_t (logprobs_t - ref_logp_t)`` over the row's generated tokens: the
    KL penalty of TRL's RLOO trainer (first-order log ratio, summed per sequence) folded
    into the outcome reward, so a group baseline after it (RLOO's leave-one-out) sees the
    penalized rewards and every token gets one advantage per sequence.

    A logical rollout split over several rows is penalized by the KL of all its rows, on
    every row; explicit reference rewards (``RolloutGroup.rewards``) are penalized by the
    same sum (``normalization_rewards``). Use it with ``kl_ctl: 0``, or the KL counts twice.
    """
    rewards = inputs.data["rewards"]
    mask, old, ref = _aligned_old_and_ref(inputs, "sequence_kl")
    kl, member = _per_rollout(((old - ref) * mask).sum(dim=1), inputs.meta)
    shaped = (rewards.double() - beta * kl[member]).float()
    meta = inputs.meta
    references = None
    if meta is not None and meta.rollout_groups is not None and any(
            r is not None for r in meta.explicit_reference_rewards):
        counts = torch.tensor(meta.rollout_row_counts, device=rewards.device)
        first = rewards[counts.cumsum(0) - counts]
        given = torch.tensor([float("nan") if r is None else r
                              for r in meta.explicit_reference_rewards],
                             dtype=torch.float64, device=rewards.device)
        base = torch.where(given.isnan(), first.double(), given)
        references = (base - beta * kl).float()
    return OutcomeResult(rewards=shaped, normalization_rewards=references)


@register_stage("outcome_reward_shaping", requires=("reward_baselines",), replaces_critic=True,
                baseline="greedy")
def remax_baseline(inputs: OutcomeRewardInputs) -> OutcomeResult:
    """ReMax: ``r_i - b_i``, ``b_i`` the reward of one greedy response to the row's prompt
    (batch key ``reward_baselines``, [B]; the built-in trainer samples it with
    ``ppo.greedy_baseline``). Source: Li et al., 2024, "ReMax: A Simple, Effective, and
    Efficient Reinforcement Learning Method for Aligning Large Language Models"
    (arXiv:2310.10505), as verl's ``remax`` estimator computes it.
    """
    rewards = inputs.data["rewards"]
    baselines = inputs.data.get("reward_baselines")
    where = "outcome_reward_shaping 'remax_baseline': rollout batch 'reward_baselines'"
    if baselines is None:
        raise ValueError(f"outcome_reward_shaping 'remax_baseline': rollout batch has no "
                         f"'reward_baselines' (the reward of one greedy response per prompt, "
                         f"[B]); the built-in trainer samples it with ppo.greedy_baseline: true")
    check_row_tensor(where, baselines, rewards)
    return OutcomeResult(rewards=(rewards.double() - baselines.double()).float())


@register_stage("outcome_reward_shaping", replaces_critic=True, baseline="group",
                kwarg_checks={"eps": non_negative_number})
def maxrl(inputs: OutcomeRewardInputs, *, eps: float = 0.0) -> OutcomeResult:
    """MaxRL: ``(r_i - mean_g r) / (mean_g r + eps)``, the group-mean baseline divided by
    the group mean instead of the std; a group whose mean is <= 0 gets 0.

    Normalizing by the mean makes the policy gradient that of a truncated maximum
    likelihood objective: a prompt solved with probability p weighs about 1/p. Rewards are
    meant to be non-negative (binary pass/fail, canonically); a group of all-zero rewards
    carries no signal. Group means are over logical rollouts (a rollout split over
    several rows counts once), so a group of one response gets 0. ``eps = 0`` is
    prime-rl's ``max_rl``; ``eps = 1e-6`` is SkyRL's ``maxrl`` for groups of two or more
    with a positive mean (SkyRL gives a lone response its raw reward). Source: arXiv
    2602.02710 (MaxRL).
    """
    roll = _rollouts(inputs, "maxrl")
    groups, n, ref = roll.group, roll.n_groups, roll.rewards
    mean = (_group_sum(ref, groups, n) / _group_counts(groups, n, ref))[groups[roll.member]]
    rewards = inputs.data["rewards"].double()
    scaled = torch.where(mean > 0, (rewards - mean) / (mean + eps), 0.0)
    return OutcomeResult(rewards=scaled.float())
