"""Multi-component outcome rewards: a ``[B, K]`` ``rewards`` tensor (one column per reward
function) becomes one reward per row before the pipeline runs.

``actor.reward_aggregation``:

- ``sum_then_normalize`` (default): the weighted sum ``sum_k w_k r_k``; the pipeline's
  reward normalization then treats it like any reward (TRL's default);
- ``normalize_then_sum``: each column is first normalized within its prompt group,
  ``(r_k - mean_g r_k) / (std_g r_k + eps)`` (unbiased std, over the logical rollouts of
  the prompt, ``eps`` = ``actor.reward_norm.eps``, 1e-5 without it), then weighted and
  summed (GDPO, arXiv:2601.05242; TRL's ``multi_objective_aggregation``).
  The recipe ``gdpo`` whitens that sum over the batch with ``reward_norm``.

A ``[B]`` tensor is a single column: ``[B]`` and ``[B, 1]`` give identical results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.config import ActorConfig, NormConfig
from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.advantage.normalization import normalize


def combine_reward_components(batch: Any, meta: Optional[BatchMeta],
                              config: ActorConfig) -> Any:
    """``batch`` with ``rewards`` reduced to one per row (a new dict), or ``batch`` itself
    when there is nothing to combine (a plain ``[B]`` tensor under the default
    aggregation, or anything ``validate_batch`` must reject)."""
    rewards = batch.get("rewards") if isinstance(batch, Mapping) else None
    if not isinstance(rewards, Tensor) or rewards.ndim not in (1, 2) or rewards.dtype == torch.bool:
        return batch
    weights = config.reward_weights
    if rewards.ndim == 1 and weights is None and config.reward_aggregation == "sum_then_normalize":
        return batch
    columns = rewards if rewards.ndim == 2 else rewards[:, None]
    k = columns.shape[1]
    if weights is None:
        if k != 1:
            raise ValueError(f"rollout batch 'rewards': expected shape [{columns.shape[0]}] (one "
                             f"outcome reward per row), or [B, K] (one column per reward function) "
                             f"with actor.reward_weights set to K numbers, got {list(rewards.shape)} "
                             f"and no actor.reward_weights (per-token rewards belong in "
                             f"'token_rewards')")
    elif len(weights) != k:
        raise ValueError(f"actor.reward_weights: expected {k} weights, one per column of rollout "
                         f"batch 'rewards' ({list(rewards.shape)}), got {len(weights)}: {weights}")
    if config.reward_aggregation == "normalize_then_sum":
        columns = _normalize_columns(columns, meta, config)
    elif weights is None:  # one column, weight 1: the [B] tensor as it is (integers stay)
        return {**batch, "rewards": columns[:, 0]}
    w = torch.tensor(weights if weights is not None else [1.0], dtype=torch.float64,
                     device=columns.device)
    return {**batch, "rewards": (columns.double() * w).sum(dim=1).float()}


def _normalize_columns(columns: Tensor, meta: Optional[BatchMeta], config: ActorConfig) -> Tensor:
    """Each column normalized within its prompt group, over one value per logical rollout."""
    if meta is None:
        raise ValueError("actor.reward_aggregation: 'normalize_then_sum' normalizes each reward "
                         "column within its prompt group and needs the batch's meta (build the "
                         "batch with concat_batch or pass a BatchMeta)")
    if columns.shape[0] != meta.batch_size:
        return columns  # validate_batch names the mismatch
    counts = torch.tensor(meta.rollout_row_counts, device=columns.device)
    member = torch.repeat_interleave(torch.arange(len(counts), device=columns.device), counts)
    references = columns[counts.cumsum(0) - counts]
    disagree = (columns != references[member]).any(dim=1)
    if bool(disagree.any()):
        raise ValueError(f"actor.reward_aggregation: rows {disagree.nonzero().flatten().tolist()[:10]}"
                         f" of a split rollout have different reward columns; every row of a "
                         f"logical rollout must carry the rollout's rewards")
    eps = config.reward_norm.eps if config.reward_norm is not None else NormConfig().eps
    norm = NormConfig(mean_level="group", std_level="group", std_unbiased=True, eps=eps)
    normalized = torch.stack([normalize(references[:, j].double(), norm,
                                        group_sizes=meta.logical_group_sizes)
                              for j in range(columns.shape[1])], dim=1)
    return normalized[member]
