"""Outcome reward shaping: one reward per row, before scaling and normalization.

Besides ``identity`` (the default), this family ships the group baselines of estimators
that cannot be written as a ``NormConfig``: OPO's length-weighted baseline and GPG's
corrected group baseline. Both need the prompt groups of ``meta`` (build the batch with
``concat_batch``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_adv.contracts import OutcomeResult, OutcomeRewardInputs
from lightning_adv.distributed import all_reduce_sum
from lightning_adv.stages.registry import register_stage
from lightning_adv.validators import check_bool, positive_number


@register_stage("outcome_reward_shaping")
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


def _group_sum(values: Tensor, groups: Tensor, n_groups: int) -> Tensor:
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, groups, values)


@register_stage("outcome_reward_shaping")
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


@register_stage("outcome_reward_shaping",
                kwarg_checks={"std_normalize": check_bool, "eps": positive_number})
def gpg(inputs: OutcomeRewardInputs, *, std_normalize: bool = False, eps: float = 1e-5) -> OutcomeResult:
    """GPG: ``alpha * (r_i - mean_g(r)) / F``, ``alpha = B / (B - M)``.

    ``F`` is 1, or the group's unbiased std plus ``eps`` with ``std_normalize``. ``M`` counts
    the rows of groups whose rewards are all equal (they carry no gradient) and ``B`` all
    rows; both are summed over the data-parallel group. ``alpha`` rescales the valid rows
    so the batch gradient is not diluted (``alpha = 1`` when no row is valid). Source: Chu
    et al., 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning" (arXiv:2504.02546), Accurate Gradient Estimation.
    """
    groups, n = _prompt_groups(inputs, "gpg")
    r = inputs.data["rewards"].double()
    ones = torch.ones_like(r)
    count = _group_sum(ones, groups, n)
    mean = _group_sum(r, groups, n) / count
    centred = r - mean[groups]
    if std_normalize:
        var = _group_sum(centred * centred, groups, n) / (count - 1).clamp_min(1.0)
        std = torch.where(count > 1, var.sqrt(), torch.ones_like(var))
        centred = centred / (std[groups] + eps)
    spread = (_group_sum((centred != 0).double(), groups, n) > 0)[groups]
    totals = all_reduce_sum(torch.stack([ones.sum(), (~spread).double().sum()]))
    valid = totals[0] - totals[1]
    alpha = torch.where(valid > 0, totals[0] / valid.clamp_min(1.0), torch.ones_like(valid))
    return OutcomeResult(rewards=(alpha * centred).float())

