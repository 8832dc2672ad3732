"""Reward and advantage normalization (SPEC §3, "Normalization").

Statistics are float64. "batch" statistics reduce their sums and counts across the
data-parallel group when torch.distributed is initialized, so every rank gets the
numbers of a single process holding the global batch. "group" statistics never cross
ranks: a prompt group always lives on one rank.

Groups are vectorized as segment sums over rows instead of a Python loop per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor

from lightning_adv.config import NormConfig
from lightning_adv.distributed import all_reduce_sum, any_across_ranks


def group_slices(batch_size: int, group_sizes: Optional[Sequence[int]], group_size: int,
                 key: str) -> list[int]:
    """Rows of each group: ``group_sizes`` if given, else fixed ``group_size`` slices."""
    if group_sizes is not None:
        sizes = list(group_sizes)
        if any((not isinstance(s, int)) or s <= 0 for s in sizes):
            raise ValueError(f"{key}: group sizes must all be positive integers, got {sizes}")
        if sum(sizes) != batch_size:
            raise ValueError(f"{key}: group sizes {sizes} sum to {sum(sizes)}, but the batch has "
                             f"{batch_size} rows")
        return sizes
    if batch_size % group_size:
        raise ValueError(f"{key}.group_size: {batch_size} rows do not split into groups of "
                         f"{group_size}; pass meta (traj_group_sizes) or change group_size")
    return [group_size] * (batch_size // group_size)


def _row_sum(x: Tensor) -> Tensor:
    return x.reshape(x.shape[0], -1).sum(dim=1)


def _expand(per_row: Tensor, like: Tensor) -> Tensor:
    return per_row.reshape((-1,) + (1,) * (like.ndim - 1)).expand_as(like)


def affine_parameters(x: Tensor, config: NormConfig, mask: Optional[Tensor] = None,
                      group_sizes: Optional[Sequence[int]] = None,
                      member_counts: Optional[Sequence[int]] = None,
                      key: str = "norm") -> tuple[Tensor, Tensor]:
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
    levels = (config.mean_level, config.std_level)
    if "group" in levels:
        sizes = group_slices(x.shape[0], group_sizes, config.group_size, key)
        n_groups = len(sizes)
        if member_counts is None:
            members = torch.tensor(sizes, device=x.device)
        else:
            if len(member_counts) != n_groups or any(c < 1 for c in member_counts):
                raise ValueError(f"{key}: member counts {list(member_counts)} do not match the "
                                 f"{n_groups} groups")
            members = torch.tensor(list(member_counts), device=x.device)
        row_group = torch.repeat_interleave(torch.arange(n_groups, device=x.device),
                                            torch.tensor(sizes, device=x.device))
        row_members = members[row_group]

        def group_total(per_row: Tensor) -> Tensor:
            total = torch.zeros(n_groups, dtype=f64, device=x.device)
            return total.index_add_(0, row_group, per_row)[row_group]

    # Mean.
    if config.mean_level == "batch":
        stats = all_reduce_sum(torch.stack([_row_sum(masked).sum(), counts_per_row.sum()]))
        mean = _mean(xd, md, masked, stats[0], stats[1], config.mean_leave1out)
    elif config.mean_level == "group":
        total = _expand(group_total(_row_sum(masked)), x)
        count = _expand(group_total(counts_per_row), x)
        mean = _mean(xd, md, masked, total, count, config.mean_leave1out)
        if config.mean_leave1out:
            singleton = _expand(row_members == 1, x)
            mean = torch.where(singleton, xd, mean)
        mean = mean.to(x.dtype)  # group means are stored at x's precision, as in the legacy code
    else:
        mean = torch.zeros_like(x)

    # Std, from deviations to each element's own mean.
    if config.std_level is None:
        return mean, torch.ones_like(x)
    dev = (masked - mean.to(f64) * md) if md is not None else (xd - mean.to(f64))
    sq = _row_sum(dev * dev)
    if config.std_level == "batch":
        stats = all_reduce_sum(torch.stack([sq.sum(), counts_per_row.sum()]))
        std = _std(stats[0], stats[1], config.std_unbiased).expand_as(x)
    else:
        std = _std(group_total(sq), group_total(counts_per_row), config.std_unbiased)
        if config.std_unbiased:
            std = torch.where(row_members == 1, torch.ones_like(std), std)
        std = _expand(std, x).to(x.dtype)
    return mean, std + config.eps


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
              member_counts: Optional[Sequence[int]] = None, key: str = "norm") -> Tensor:
    """``(x - mean) [* mask] / (std + eps)`` as float32; ``x`` unchanged if the mask is empty."""
    if mask is not None and not bool(any_across_ranks(bool(mask.any()), x.device)):
        return x.float()
    mean, scale = affine_parameters(x, config, mask, group_sizes, member_counts, key)
    centered = x - mean
    if mask is not None:
        centered = centered * mask
    return (centered / scale).float()
