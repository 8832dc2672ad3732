"""The metrics of :func:`~lightning_adv.losses.rollout_correction.rollout_correction`, under
verl 0.9.1's names (``rollout_corr_helper``'s ``compute_is_metrics``,
``compute_rs_metrics`` and ``compute_offpolicy_metrics``) and with its numbers, except that
statistics over sequences are taken over sequences with an active token (verl averages
some of them over every row). Every value is a 0-dim tensor of this rank's batch; the
synced, logged counterparts are :class:`~lightning_adv.metrics.off_policy_metrics.OffPolicyMetrics`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

if TYPE_CHECKING:
    from lightning_adv.losses.rollout_correction import RejectionFilter

#: Log-ratios are clamped to ±SAFETY_BOUND before ``exp`` (verl's bound).
SAFETY_BOUND = 20.0


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (torch.where(mask > 0, x, 0.0) * mask).sum() / mask.sum()


def _masked_std(x: Tensor, mask: Tensor) -> Tensor:
    """Population std over the mask (verl's ``E[x²] - E[x]²``, clamped at 0)."""
    if not bool(mask.sum() > 1):
        return torch.zeros((), dtype=x.dtype, device=x.device)
    mean = _masked_mean(x, mask)
    return (_masked_mean(x.square(), mask) - mean.square()).clamp(min=0.0).sqrt()


def _row_means(x: Tensor, mask: Tensor) -> Tensor:
    """Per-row token means of the rows with an active token."""
    tokens = mask.sum(-1)
    return ((torch.where(mask > 0, x, 0.0) * mask).sum(-1) / tokens.clamp(min=1.0))[tokens > 0]


def _std(values: Tensor) -> Tensor:
    """Unbiased std (torch's default, verl's), 0 for fewer than two values."""
    return values.std() if values.numel() > 1 else torch.zeros((), dtype=values.dtype,
                                                               device=values.device)


def is_metrics(weights: Tensor, raw: Tensor, log_for_metrics: Tensor, mask: Tensor, level: str,
               upper: float, lower: Optional[float]) -> dict[str, Tensor]:
    """``rollout_is_*``: the applied weights' statistics, the raw weights' fractions
    outside the bounds (a TIS run's low bound is ``1/upper``), effective sample size."""
    if not bool(mask.sum() > 0):
        return {}
    low = 1.0 / upper if lower is None else lower
    m: dict[str, Tensor] = {"rollout_is_mean": _masked_mean(weights, mask)}
    active = mask > 0
    if level == "sequence":
        per_sequence = log_for_metrics[:, 0][active.any(-1)]
        m["rollout_is_max"] = per_sequence.max().clamp(max=SAFETY_BOUND).exp()
        m["rollout_is_min"] = per_sequence.min().exp()
        m["rollout_is_ratio_fraction_high"] = (per_sequence > math.log(upper)).to(mask.dtype).mean()
        m["rollout_is_ratio_fraction_low"] = (per_sequence < math.log(low)).to(mask.dtype).mean()
    else:
        m["rollout_is_ratio_fraction_high"] = _masked_mean((raw > upper).to(mask.dtype), mask)
        m["rollout_is_ratio_fraction_low"] = _masked_mean((raw < low).to(mask.dtype), mask)
        m["rollout_is_max"] = weights[active].max()
        m["rollout_is_min"] = weights[active].min()
    bounded = weights.clamp(min=0.0, max=upper)
    m["rollout_is_std"] = _masked_std(bounded, mask)
    m["rollout_is_eff_sample_size"] = effective_sample_size((bounded * mask).sum(),
                                                            (bounded.square() * mask).sum(),
                                                            mask.sum())
    per_sequence_weights = _row_means(weights, mask)
    m["rollout_is_seq_mean"] = per_sequence_weights.mean()
    m["rollout_is_seq_std"] = _std(per_sequence_weights)
    m["rollout_is_seq_max"] = per_sequence_weights.max()
    m["rollout_is_seq_min"] = per_sequence_weights.min()
    m["rollout_is_seq_max_deviation"] = (per_sequence_weights - 1.0).abs().max()
    per_sequence_raw = _row_means(raw, mask)
    m["rollout_is_seq_fraction_high"] = (per_sequence_raw > upper).to(mask.dtype).mean()
    m["rollout_is_seq_fraction_low"] = (per_sequence_raw < low).to(mask.dtype).mean()
    if lower is not None:
        outside = (raw < lower) | (raw > upper)
        m["rollout_is_oob_ratio"] = _masked_mean(outside.to(mask.dtype), mask)
    return m


def effective_sample_size(weight_sum: Tensor, square_sum: Tensor, count: Tensor) -> Tensor:
    """Kish's effective sample size as a fraction of the sample, ``(Σw)² / (N Σw²)``
    (verl's ``1 / mean((w / mean w)²)``); 0 when every weight is 0 (verl divides by 0)."""
    return torch.where(square_sum > 0, weight_sum.square() / (count * square_sum).clamp(
        min=torch.finfo(square_sum.dtype).tiny), torch.zeros_like(square_sum))


def rs_metrics(f: "RejectionFilter", statistic: Tensor, per_sequence: Optional[Tensor],
               mask: Tensor, keep: Tensor) -> dict[str, Tensor]:
    """``rollout_rs_<filter>_*``: the filter's statistic (per token, or each token carrying
    its sequence's), its fractions beyond the bounds and the share it rejects."""
    if not bool(mask.sum() > 0):
        return {}
    p = f"rollout_rs_{f.name}"
    active, nonempty = mask > 0, mask.sum(-1) > 0
    k1 = f.lower is not None
    high = math.log(f.upper) if k1 else f.upper
    low = math.log(f.lower) if k1 else 0.0
    valid = (per_sequence[nonempty] if per_sequence is not None
             else _row_means(statistic, mask))
    m = {f"{p}_mean": _masked_mean(statistic, mask)}
    dtype = mask.dtype
    if per_sequence is not None:
        m[f"{p}_max"], m[f"{p}_min"] = valid.max(), valid.min()
        m[f"{p}_fraction_high"] = (valid > high).to(dtype).mean()
        m[f"{p}_fraction_low"] = (valid < low).to(dtype).mean() if k1 else torch.zeros_like(
            m[f"{p}_mean"])
    else:
        m[f"{p}_max"], m[f"{p}_min"] = statistic[active].max(), statistic[active].min()
        m[f"{p}_fraction_high"] = _masked_mean((statistic > high).to(dtype), mask)
        m[f"{p}_fraction_low"] = (_masked_mean((statistic < low).to(dtype), mask) if k1
                                  else torch.zeros_like(m[f"{p}_mean"]))
    m[f"{p}_std"] = _masked_std(statistic.clamp(min=low, max=high), mask)
    m[f"{p}_seq_mean"], m[f"{p}_seq_std"] = valid.mean(), _std(valid)
    m[f"{p}_seq_max"], m[f"{p}_seq_min"] = valid.max(), valid.min()
    m[f"{p}_seq_max_deviation"] = valid.abs().max()
    m[f"{p}_seq_fraction_high"] = (valid > high).to(dtype).mean()
    if k1:
        m[f"{p}_seq_fraction_low"] = (valid < low).to(dtype).mean()
    rejected = ~keep & active
    m[f"{p}_masked_fraction"] = _masked_mean(rejected.to(dtype), mask)
    m[f"{p}_seq_masked_fraction"] = (rejected.any(-1) & nonempty).to(dtype).sum() / nonempty.sum()
    return m


def offpolicy_metrics(old: Tensor, rollout: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """verl's ``compute_offpolicy_metrics``: perplexities, the mismatch KL (k1 and k3 of
    KL(π_rollout || π_old)), and χ² per token and per sequence."""
    log_ratio = (old - rollout).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    train, roll = _row_means(old, mask), _row_means(rollout, mask)
    diff = roll - train
    sequence_log_ratio = ((old - rollout) * mask).sum(-1)[mask.sum(-1) > 0]
    return {
        "training_ppl": (-train).exp().mean(),
        "training_log_ppl": (-train).mean(),
        "kl": _masked_mean(rollout - old, mask),
        "k3_kl": _masked_mean(log_ratio.exp() - log_ratio - 1, mask),
        "rollout_ppl": (-roll).exp().mean(),
        "rollout_log_ppl": (-roll).mean(),
        "log_ppl_diff": diff.mean(),
        "log_ppl_abs_diff": diff.abs().mean(),
        "log_ppl_diff_max": diff.max(),
        "log_ppl_diff_min": diff.min(),
        "ppl_ratio": diff.exp().mean(),
        "chi2_token": _masked_mean((2 * log_ratio).exp(), mask) - 1.0,
        "chi2_seq": (2 * sequence_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp().mean() - 1.0,
    }
