"""Reward and advantage normalization (SPEC §3, "Normalization"), as pure functions.

Statistics are float64. "batch" statistics reduce their sums and counts across the
data-parallel group when torch.distributed is initialized, so every rank gets the
numbers of a single process holding the global batch. "group" statistics never cross
ranks: a prompt group always lives on one rank.

Groups are vectorized as segment sums over rows instead of a Python loop per prompt.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Optional

import torch
from torch import Tensor

from lightning_adv.config import ActorConfig, NormConfig
from lightning_adv.stages.types import OutcomeResult
from lightning_adv.distributed import all_reduce_sum, any_across_ranks
from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.advantage.reward_terms import scale_rewards
from lightning_adv._checks import warn_caller
from lightning_adv.exceptions import GroupingError, SingletonGroupWarning


def check_group_members(key: str, norm: NormConfig, meta: Optional[BatchMeta],
                        action: str) -> None:
    """Warn (or raise, per ``actor.singleton_groups``) when every group of a group level of
    ``norm`` has one member: GRPO/RLOO/Dr.GRPO called without ``meta`` (``group_size`` 1),
    or a meta with one rollout per prompt. Each member then is its own group: a group mean
    subtracts the member itself and an unbiased group std is 1, so rewards become 0.
    A batch where only some groups have one member (filtered prompts) is left alone, and
    so is one where exclusion of unscorable rows (``meta.unscorable_members``) shrank groups
    of several members to one.

    Members are the logical rollouts of each prompt (``meta.logical_group_sizes``: its rows
    when it has no rollout group), or without meta the fixed ``group_size`` slices.
    """
    levels = [f"{name}_level" for name in ("mean", "std")
              if getattr(norm, f"{name}_level") == "group"]
    if action == "ignore" or not levels:
        return
    if meta is None:
        if norm.group_size != 1:
            return
        sizes = f"group_size {norm.group_size} and no meta"
    else:
        counts = meta.logical_group_sizes
        # Members left out as unscorable count: a group exclusion shrank to one member is
        # no config mistake (its member gets advantage 0: nothing to compare it with).
        left_out = meta.unscorable_members or [0] * len(counts)
        if any(c + out != 1 for c, out in zip(counts, left_out)):
            return
        sizes = f"member counts {counts[:8]}{' ...' if len(counts) > 8 else ''}"
    if "mean_level" not in levels:
        effect = "the group std is that of one member"
    elif key.endswith("reward_norm"):
        effect = "every reward is normalized to 0"
    else:
        effect = "each row is centred on its own tokens"
    message = (f"{key}: every group has one member ({sizes}), so its group-level "
               f"{' and '.join(levels)} normalize each member against itself ({effect}); "
               f"pass meta with the prompt groups (concat_batch or BatchMeta.traj_group_sizes), "
               f"set {key}.group_size to the rollouts per prompt, or set actor.singleton_groups "
               f"to 'raise' or 'ignore'")
    if action == "raise":
        raise ValueError(message)
    warn_caller(message, SingletonGroupWarning)


@contextlib.contextmanager
def norm_errors(key: str) -> Iterator[None]:
    """At the caller's boundary: grouping errors inside the block name ``key``
    (``actor.reward_norm.group_size: ...``) as one plain ``ValueError``."""
    try:
        yield
    except GroupingError as exc:
        raise ValueError(f"{key}{exc.field}: {exc.detail}") from None


def group_slices(batch_size: int, group_sizes: Optional[Sequence[int]],
                 group_size: int) -> list[int]:
    """Rows of each group: ``group_sizes`` if given, else fixed ``group_size`` slices."""
    if group_sizes is not None:
        sizes = list(group_sizes)
        if any((not isinstance(s, int)) or s <= 0 for s in sizes):
            raise GroupingError("", f"group sizes must all be positive integers, got {sizes}")
        if sum(sizes) != batch_size:
            raise GroupingError("", f"group sizes {sizes} sum to {sum(sizes)}, but the batch has "
                             f"{batch_size} rows")
        return sizes
    if batch_size % group_size:
        raise GroupingError(".group_size", f"{batch_size} rows do not split into groups of "
                         f"{group_size}; pass meta (traj_group_sizes) or change group_size")
    return [group_size] * (batch_size // group_size)


def _row_sum(x: Tensor) -> Tensor:
    return x.reshape(x.shape[0], -1).sum(dim=1)


def _expand(per_row: Tensor, like: Tensor) -> Tensor:
    return per_row.reshape((-1,) + (1,) * (like.ndim - 1)).expand_as(like)


def affine_parameters(x: Tensor, config: NormConfig, mask: Optional[Tensor] = None,
                      group_sizes: Optional[Sequence[int]] = None,
                      member_counts: Optional[Sequence[int]] = None) -> tuple[Tensor, Tensor]:
    """The baseline and divisor (``std + eps``) of ``x``, each broadcast to ``x``'s shape.

    ``mask`` selects the elements that count; ``group_sizes`` gives the rows of each
    group; ``member_counts`` (default: rows per group) only selects the singleton rules:
    a group of one member has its own element as leave-one-out mean and, with an unbiased
    std, a std of 1.
    """
    f64 = torch.float64
    xd = x.to(f64)
    md = mask.to(f64) if mask is not None else None
    masked = xd * md if md is not None else xd
    counts_per_row = (_row_sum(md) if md is not None
                      else torch.full((x.shape[0],), x[0].numel() if x.shape[0] else 0,
                                      dtype=f64, device=x.device))
    groups = None
    if "group" in (config.mean_level, config.std_level):
        sizes = group_slices(x.shape[0], group_sizes, config.group_size)
        groups = _group_index(tuple(sizes), None if member_counts is None else tuple(member_counts),
                              x.device)
    mean = _baseline(x, xd, md, masked, counts_per_row, config, groups)
    if config.std_level is None:
        return mean, torch.ones_like(x)
    # Std, from deviations to each element's own mean.
    dev = (masked - mean.to(f64) * md) if md is not None else (xd - mean.to(f64))
    sq = _row_sum(dev * dev)
    if config.std_level == "batch":
        stats = all_reduce_sum(torch.stack([sq.sum(), counts_per_row.sum()]))
        std = _std(stats[0], stats[1], config.std_unbiased).expand_as(x)
    else:
        std = _std(groups.total(sq), groups.total(counts_per_row), config.std_unbiased)
        if config.std_unbiased:
            std = torch.where(groups.row_members == 1, torch.ones_like(std), std)
        std = _expand(std, x).to(x.dtype)
    return mean, std + config.eps


def _baseline(x: Tensor, xd: Tensor, md: Optional[Tensor], masked: Tensor,
              counts_per_row: Tensor, config: NormConfig, groups: Optional["_GroupIndex"]) -> Tensor:
    """The mean (or leave-one-out mean) at the configured level, broadcast to ``x``."""
    if config.mean_level == "batch":
        stats = all_reduce_sum(torch.stack([_row_sum(masked).sum(), counts_per_row.sum()]))
        return _mean(xd, md, masked, stats[0], stats[1], config.mean_leave1out)
    if config.mean_level == "group":
        total = _expand(groups.total(_row_sum(masked)), x)
        count = _expand(groups.total(counts_per_row), x)
        mean = _mean(xd, md, masked, total, count, config.mean_leave1out)
        if config.mean_leave1out:
            singleton = _expand(groups.row_members == 1, x)
            mean = torch.where(singleton, xd, mean)
        return mean.to(x.dtype)  # group means are stored at x's precision, as in the legacy code
    return torch.zeros_like(x)


def _mean(xd: Tensor, md: Optional[Tensor], masked: Tensor, total: Tensor, count: Tensor,
          leave_one_out: bool) -> Tensor:
    if leave_one_out:
        if md is None:
            loo = (total - xd) / (count - 1).clamp_min(1.0)
        else:
            loo = torch.where(md > 0, (total - masked) / (count - md).clamp(min=1.0),
                              total / count.clamp_min(1.0))
        return torch.where(count <= 1, torch.zeros_like(loo), loo).expand_as(xd)
    plain = total / count.clamp_min(1.0)
    return torch.where(count == 0, torch.zeros_like(plain), plain).expand_as(xd)


def _std(sq: Tensor, count: Tensor, unbiased: bool) -> Tensor:
    if unbiased:
        return torch.where(count <= 1, torch.ones_like(sq), (sq / (count - 1).clamp_min(1.0)).sqrt())
    return torch.where(count == 0, torch.ones_like(sq), (sq / count.clamp_min(1.0)).sqrt())


def normalize(x: Tensor, config: NormConfig, mask: Optional[Tensor] = None,
              group_sizes: Optional[Sequence[int]] = None,
              member_counts: Optional[Sequence[int]] = None) -> Tensor:
    """``(x - mean) [* mask] / (std + eps)`` as float32; ``x`` unchanged if the mask is empty.
    Statistics in float64 (:func:`affine_parameters`)."""
    if mask is not None and not bool(any_across_ranks(bool(mask.any()), x.device)):
        return x.float()
    mean, scale = affine_parameters(x, config, mask, group_sizes, member_counts)
    centered = x - mean
    if mask is not None:
        centered = centered * mask
    return (centered / scale).float()


class _GroupIndex:
    """Each row's group and member count, built once per grouping (:func:`_group_index`)."""

    def __init__(self, sizes: tuple[int, ...], member_counts: Optional[tuple[int, ...]],
                 device: torch.device):
        self.n_groups = len(sizes)
        if member_counts is not None and (len(member_counts) != self.n_groups
                                          or any(c < 1 for c in member_counts)):
            raise GroupingError("", f"member counts {list(member_counts)} do not match the "
                             f"{self.n_groups} groups")
        members = torch.tensor(member_counts if member_counts is not None else sizes,
                               device=device)
        self.row_group = torch.repeat_interleave(torch.arange(self.n_groups, device=device),
                                                 torch.tensor(sizes, device=device))
        self.group_members = members
        self.row_members = members[self.row_group]

    def total(self, per_row: Tensor) -> Tensor:
        """Each row's group total of ``per_row`` (float64)."""
        total = torch.zeros(self.n_groups, dtype=torch.float64, device=per_row.device)
        return total.index_add_(0, self.row_group, per_row)[self.row_group]


@functools.lru_cache(maxsize=64)
def _group_index(sizes: tuple[int, ...], member_counts: Optional[tuple[int, ...]],
                 device: torch.device) -> _GroupIndex:
    # Rebuilding these index tensors in Python costs milliseconds at a thousand rows; a
    # training loop repeats the same grouping step after step. (Read-only once built.)
    return _GroupIndex(sizes, member_counts, device)


# ------------------------------------------------------------------ outcome rewards

def normalize_outcome_rewards(outcome: OutcomeResult, task_rewards: Tensor,
                              meta: Optional[BatchMeta], config: ActorConfig, *,
                              identity_outcome: bool, stage: str) -> Tensor:
    """Scaling, clipping and (rollout-aware) reward normalization (SPEC §3 step 3).

    ``task_rewards`` are the rewards before the length penalty: rows of one logical
    rollout must agree on them too when their references are derived. ``identity_outcome``
    says whether the outcome stage is the built-in ``identity`` (only then may explicit
    reference rewards be used without ``normalization_rewards``); ``stage`` names the
    outcome stage in errors.
    """
    scores = scale_rewards(outcome.rewards, config)
    norm = config.reward_norm
    if norm is None:
        return scores
    check_group_members("actor.reward_norm", norm, meta, config.singleton_groups)
    if meta is None or meta.rollout_groups is None:
        if outcome.normalization_rewards is not None:
            raise ValueError(f"{stage}: normalization_rewards need complete metadata "
                             f"(meta.rollout_groups from concat_batch)")
        sizes = meta.traj_group_sizes if meta is not None else None
        with norm_errors("actor.reward_norm"):
            return normalize(scores, norm, group_sizes=sizes)
    if norm.mean_level is None and norm.std_level is None:
        return scores.float()
    references, member = rollout_references(
        outcome, task_rewards, meta, identity_outcome=identity_outcome,
        compare_task_rewards=config.overlong_reward_penalty, stage=stage)
    with norm_errors("actor.reward_norm"):
        mean, scale = affine_parameters(scale_rewards(references, config), norm,
                                        group_sizes=meta.logical_group_sizes)
    if norm.std_level is not None:
        # Logical groups whose references all agree would divide by eps.
        scale = torch.where(scale <= 2 * norm.eps, torch.ones_like(scale), scale)
    return ((scores - mean[member]) / scale[member]).float()


def rollout_references(outcome: OutcomeResult, task_rewards: Tensor, meta: BatchMeta, *,
                       identity_outcome: bool, compare_task_rewards: bool,
                       stage: str) -> tuple[Tensor, Tensor]:
    """One reference reward per logical rollout, and each row's rollout index.

    The stage's ``normalization_rewards`` if given; else each rollout's explicit reference
    (``RolloutGroup.rewards``) or the reward of its first row, whose other rows must agree
    (on the task rewards too with ``compare_task_rewards``). The agreement is decided
    across data-parallel ranks, so every rank raises together.
    """
    rewards = outcome.rewards
    device = rewards.device
    index = meta.index(device)
    member = index.rollout_of_row
    if outcome.normalization_rewards is not None:
        return outcome.normalization_rewards, member
    supplied, starts = index.explicit_supplied, index.rollout_starts
    if index.any_explicit and not identity_outcome:
        raise ValueError(
            f"{stage}: the batch carries explicit reference rewards "
            f"(meta.rollout_groups[*].rewards) and reward normalization is on, so the stage "
            f"must return OutcomeResult.normalization_rewards (one value per logical "
            f"rollout, before bias/scaling/clip)")
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    if index.one_row_each and not index.any_explicit:
        # Each row is its own reference: nothing to compare here, but the other ranks'
        # agreement is still joined (a collective every rank must call).
        references, disagree = rewards.to(dtype), None
    else:
        references = rewards[starts].to(dtype)
        if index.any_explicit:
            references = torch.where(supplied, index.explicit_rewards.to(dtype), references)
        agree = rewards.to(dtype) == references[member]
        if compare_task_rewards:
            agree &= task_rewards == task_rewards[starts][member]
        disagree = ~agree if not index.any_explicit else ~supplied[member] & ~agree
    if any_across_ranks(disagree is not None and bool(disagree.any()), device):
        rows = [] if disagree is None else disagree.nonzero().flatten().tolist()
        where = (f"rows {rows[:10]}" if rows
                 else "rows on another data-parallel rank (none here)")
        raise ValueError(
            f"actor.reward_norm: {where} of a split rollout have different rewards; "
            f"supply an explicit reference reward (RolloutGroup.rewards) or return "
            f"OutcomeResult.normalization_rewards from the outcome stage")
    return references, member
