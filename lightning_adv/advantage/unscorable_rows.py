"""Unscorable rows: a NaN outcome reward marks a row its reward function could not score.

``actor.unscorable_rewards: error`` (default) refuses such a batch, naming the rows.
``exclude`` leaves the rows out of the computation altogether: the pipeline runs on the
other rows (with the meta shrunk to match), so no group or batch statistic, built-in or
user stage ever sees them; the unscorable rows are then put back with advantage 0, KL and
total rewards 0, returns equal to their own values (the critic gets no signal) and their
real aligned loss mask and log-probs, so they count in token means like any
zero-advantage row (as TRL does). The output's ``unscorable`` ([B] bool) marks them.

A batch whose rows are all unscorable is an error, except under torch.distributed while
another rank holds a scored row: then this rank runs the pipeline on a stand-in (rewards
0) inside :func:`~lightning_adv.distributed.contributing_nothing`, so it joins every
collective as a rank without rows, and returns every row as unscorable (advantage 0).

With ``[B, K]`` rewards a row is unscorable when every column is NaN (no reward function
could score it, TRL's rule); a row with only some NaN columns is an error. Every row of
a logical rollout must agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_adv.config import ActorConfig
from lightning_adv.distributed import any_across_ranks, distributed
from lightning_adv.batch.grouping import BatchMeta, RolloutGroup


def unscorable_rows(batch: Any, config: ActorConfig) -> Optional[Tensor]:
    """[B] bool of the rows whose outcome reward is NaN, or None when there are none (or the
    batch is malformed: ``validate_batch`` reports that). Raises under the default
    ``unscorable_rewards: error``."""
    rewards = batch.get("rewards") if isinstance(batch, Mapping) else None
    if not isinstance(rewards, Tensor) or not rewards.is_floating_point() \
            or rewards.ndim not in (1, 2) or bool(torch.isfinite(rewards.sum())):
        return None
    nan = rewards.isnan()
    rows = nan.all(dim=1) if rewards.ndim == 2 else nan
    if rewards.ndim == 2:
        partial = nan.any(dim=1) & ~rows
        if bool(partial.any()):
            raise ValueError(f"rollout batch 'rewards': rows {_first(partial)} have NaN in some "
                             f"reward columns but not all; a row is either scored by every reward "
                             f"function or unscorable (all NaN)")
    if not bool(rows.any()):
        return None
    if config.unscorable_rewards == "error":
        raise ValueError(f"rollout batch 'rewards': rows {_first(rows)} are NaN (could not be "
                         f"scored); set actor.unscorable_rewards: exclude to leave such rows out "
                         f"of every statistic with advantage 0")
    return rows


def check_some_row_scored(rows: Optional[Tensor], batch: Any, config: ActorConfig) -> None:
    """Under ``exclude``: refuse a batch whose rows are all unscorable (``rows`` from
    :func:`unscorable_rows`). Under torch.distributed the ranks agree first (one flag,
    every rank, every call): a rank whose rows are all unscorable goes on while another
    rank holds a scored row (it then joins the collectives contributing nothing), and
    when no rank does, every rank raises together instead of one hanging its peers."""
    if config.unscorable_rewards != "exclude":
        return
    none_scored = rows is not None and bool(rows.all())
    if distributed():
        ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
        device = ids.device if isinstance(ids, Tensor) else None
        if any_across_ranks(not none_scored, device):
            return
        where = f"on every one of the {dist.get_world_size()} ranks"
    elif not none_scored:
        return
    else:
        where = f"({rows.numel()} rows)"
    raise ValueError(f"rollout batch 'rewards': every row is NaN (unscorable), nothing to "
                     f"compute advantages from {where}")


def _first(rows: Tensor) -> list[int]:
    return rows.nonzero().flatten().tolist()[:10]


def select_rows(batch: Mapping[str, Any], rows: Tensor) -> dict[str, Any]:
    """The batch restricted to ``rows`` ([B] bool): every tensor (and list) with one entry
    per row is indexed; other values are shared."""
    n = rows.shape[0]
    index = rows.nonzero().flatten()
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, Tensor) and value.ndim >= 1 and value.shape[0] == n:
            out[key] = value.index_select(0, index.to(value.device))
        elif isinstance(value, list) and len(value) == n:
            out[key] = [v for v, keep in zip(value, rows.tolist()) if keep]
        else:
            out[key] = value
    return out


def select_meta(meta: Optional[BatchMeta], rows: Tensor) -> Optional[BatchMeta]:
    """``meta`` for the kept ``rows``: prompts without a kept row disappear, each rollout
    group keeps its kept rollouts (whose rows must all be kept or all dropped), and
    ``unscorable_members`` counts the rollouts each prompt lost."""
    if meta is None:
        return None
    kept = rows.tolist()
    sizes, seqlens, groups, left_out, start = [], [], [], [], 0
    before = meta.unscorable_members or [0] * meta.n_trajs
    for i, size in enumerate(meta.traj_group_sizes):
        mine = kept[start:start + size]
        group = meta.rollout_groups[i] if meta.rollout_groups is not None else None
        counts, refs, offset = [], [], start
        row_counts = group.row_counts if group is not None else [1] * size
        for j, rows_of_rollout in enumerate(row_counts):
            flags = kept[offset:offset + rows_of_rollout]
            if len(set(flags)) > 1:
                raise ValueError(f"rollout batch 'rewards': rows {offset}..{offset + rows_of_rollout - 1} "
                                 f"of one logical rollout disagree on being scorable (NaN); give "
                                 f"every row of a rollout its reward, or NaN on all of them")
            if flags[0]:
                counts.append(rows_of_rollout)
                refs.append(group.rewards[j] if group is not None else None)
            offset += rows_of_rollout
        if sum(mine):
            sizes.append(sum(mine))
            left_out.append(before[i] + len(row_counts) - len(counts))
            if meta.traj_seqlens is not None:
                seqlens.append(meta.traj_seqlens[i])
            groups.append(RolloutGroup(tuple(counts), tuple(refs)) if group is not None else None)
        start += size
    return BatchMeta(n_trajs=len(sizes), traj_group_sizes=sizes,
                     traj_seqlens=seqlens if meta.traj_seqlens is not None else None,
                     rollout_groups=groups if meta.rollout_groups is not None else None,
                     unscorable_members=left_out)


def replace_rows(batch: Mapping[str, Any], stand_in: Mapping[str, Any],
                 stand_out: Mapping[str, Any], filler: Mapping[str, Tensor]) -> dict[str, Any]:
    """The output when every row is unscorable: the keys of the pipeline's output on a
    ``stand_in`` batch (computed only to take part in the collectives), each row from
    ``filler`` (zeros for keys it lacks), as :func:`merge_rows` gives dropped rows.
    Pass-throughs are the caller's tensors again."""
    out = dict(batch)
    n = next(iter(filler.values())).shape[0]
    for key, value in stand_out.items():
        if key in stand_in and value is stand_in[key]:
            continue  # a pass-through: out holds the caller's tensor
        if not isinstance(value, Tensor) or value.ndim == 0 or value.shape[0] != n:
            out[key] = value
        elif key in filler:
            out[key] = filler[key].to(device=value.device, dtype=value.dtype)
        else:
            out[key] = torch.zeros_like(value)
    return out


def merge_rows(batch: Mapping[str, Any], selected: Mapping[str, Any],
               kept_out: Mapping[str, Any], kept: Tensor,
               filler: Mapping[str, Tensor]) -> dict[str, Any]:
    """The full-batch output from the pipeline's output for the ``selected`` (kept) rows
    and ``filler`` (the same keys, for the other rows; zeros for keys it lacks). Keys the
    pipeline passed through unchanged are the caller's tensors again."""
    out = dict(batch)
    index = kept.nonzero().flatten()
    dropped = (~kept).nonzero().flatten()
    for key, value in kept_out.items():
        if key in selected and value is selected[key]:
            continue  # a pass-through: out holds the caller's tensor
        if not isinstance(value, Tensor) or value.ndim == 0 or value.shape[0] != index.numel():
            out[key] = value
            continue
        full = value.new_zeros((kept.shape[0],) + tuple(value.shape[1:]))
        full[index.to(value.device)] = value
        if key in filler:
            full[dropped.to(value.device)] = filler[key].to(value.dtype)
        out[key] = full
    return out
