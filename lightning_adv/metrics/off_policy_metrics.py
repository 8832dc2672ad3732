"""``OffPolicyMetrics``: how far the tokens a batch trains on are from the policy the loss
starts from, and what the rollout correction did about it, as one torchmetrics ``Metric``
(synced over ranks; the trainer logs it under ``offpolicy/``).

Updated with ``old_logprobs`` (π_old: the PPO ratio's denominator), ``rollout_logprobs``
(π_rollout: the sampler's) and the loss mask, optionally a
:class:`~lightning_adv.RolloutCorrectionConfig` and each row's staleness (policy versions
between the sampler and π_old). With ``ρ = π_old/π_rollout`` per token:

- ``mismatch_kl_k1``, ``mismatch_kl_k3``: token means of ``log(π_rollout/π_old)`` and of
  ``ρ - 1 - log ρ``, two estimates of KL(π_rollout || π_old) (verl's ``kl``, ``k3_kl``);
- ``chi2_token``, ``chi2_seq``: ``E[ρ²] - 1`` over tokens and ``E[(∏ρ)²] - 1`` over
  sequences, the variance of the token and sequence IS weights (verl's);
- ``is_weight_mean``, ``is_weight_min``, ``is_weight_max`` and ``ess``: the weights the
  correction applies (with ``rollout_is``; without it the raw token ratios ``ρ``), and
  Kish's effective sample size ``(Σw)²/(N Σw²)`` as a fraction of the tokens;
- ``ratio_frac_high``, ``ratio_frac_low`` (with a correction config): tokens whose raw
  weight lies above the cap (TIS truncates them) or below ``1/cap`` (the band's bounds for
  IcePop; verl's ``rollout_is_ratio_fraction_*`` at token level);
- ``is_masked_frac_high``, ``is_masked_frac_low``: tokens IcePop zeroes above / below
  its band;
- ``rejected_frac``, ``rejected_seq_frac``: tokens, and sequences with a token, that the
  ``rollout_rs`` filters removed;
- ``staleness_mean``, ``staleness_max``: policy versions behind, over rows.

Every value is a ratio of sums (or a min/max) reduced over ranks, so under DDP it equals
one process holding the union of the ranks' batches. A key is reported once some rank
contributed to it (the weight keys with a correction or without, the staleness keys when
staleness was given).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Union

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_adv._checks import fail
from lightning_adv.config.nested import nested_config
from lightning_adv.losses.rollout_correction import (
    SAFETY_BOUND, RolloutCorrectionConfig, bounded_weights, check_logprobs, parse_is_threshold,
    raw_is_weights, rollout_correction)
from lightning_adv.losses.rollout_diagnostics import effective_sample_size

SUMS = ("tokens", "k1_sum", "k3_sum", "ratio_square_sum", "sequences", "sequence_square_sum",
        "weight_tokens", "weight_sum", "weight_square_sum", "capped_tokens", "ratio_high",
        "ratio_low", "banded_tokens", "masked_high", "masked_low", "filtered_tokens", "rejected_tokens", "filtered_sequences",
        "rejected_sequences", "staleness_sum", "staleness_rows")


class OffPolicyMetrics(Metric):
    """Off-policy diagnostics of training batches, synced across ranks; see the module
    docstring. ``prefix`` is prepended to every key (default ``offpolicy/``)."""

    full_state_update = False
    higher_is_better = None
    is_differentiable = False

    def __init__(self, prefix: str = "offpolicy/", **kwargs: Any):
        kwargs.setdefault("dist_sync_on_step", True)
        super().__init__(**kwargs)
        if not isinstance(prefix, str):
            fail("OffPolicyMetrics prefix", "a string", prefix)
        self.prefix = prefix
        for name in SUMS:
            self.add_state(name, torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        for name, start, reduce in (("weight_min", float("inf"), "min"),
                                    ("weight_max", float("-inf"), "max"),
                                    ("staleness_max", float("-inf"), "max")):
            self.add_state(name, torch.tensor(start, dtype=torch.float64), dist_reduce_fx=reduce)

    def update(self, old_logprobs: Tensor, rollout_logprobs: Tensor, loss_mask: Tensor,
               correction: Union[None, RolloutCorrectionConfig, Mapping[str, Any]] = None,
               staleness: Union[None, int, float, Tensor] = None) -> None:
        """Add one batch (``[B, T]`` tensors in one convention; ``staleness``: one number
        or one per row)."""
        if not isinstance(loss_mask, Tensor) or loss_mask.ndim != 2:
            fail("OffPolicyMetrics loss_mask", "a [B, T] tensor",
                 getattr(loss_mask, "shape", type(loss_mask).__name__))
        active = loss_mask > 0
        check_logprobs("OffPolicyMetrics old_logprobs", old_logprobs, loss_mask.shape, active)
        check_logprobs("OffPolicyMetrics rollout_logprobs", rollout_logprobs, loss_mask.shape, active)
        cfg = self._config(correction)
        mask = active.double()
        with torch.no_grad():
            old = torch.where(active, old_logprobs.detach().double(), 0.0)
            rollout = torch.where(active, rollout_logprobs.detach().double(), 0.0)
            log_ratio = (old - rollout).clamp(-SAFETY_BOUND, SAFETY_BOUND)
            self._update_mismatch(log_ratio, old - rollout, mask)
            self._update_weights(log_ratio, mask, cfg)
            if cfg is not None and cfg.rollout_rs is not None:
                kept = rollout_correction(old, rollout, mask, **cfg.kwargs()).loss_mask
                rejected = (mask - kept).clamp(min=0.0)
                self.filtered_tokens += mask.sum()
                self.rejected_tokens += rejected.sum()
                self.filtered_sequences += (mask.sum(-1) > 0).double().sum()
                self.rejected_sequences += (rejected.sum(-1) > 0).double().sum()
        if staleness is not None:
            self.update_staleness(staleness, loss_mask.shape[0])

    @staticmethod
    def _config(correction: Any) -> Optional[RolloutCorrectionConfig]:
        if correction is None:
            return None
        cfg = nested_config(RolloutCorrectionConfig, "OffPolicyMetrics correction", correction)
        if not isinstance(cfg, RolloutCorrectionConfig):
            fail("OffPolicyMetrics correction", "None, a RolloutCorrectionConfig or a mapping",
                 correction)
        return cfg

    def _update_mismatch(self, log_ratio: Tensor, raw_log_ratio: Tensor, mask: Tensor) -> None:
        self.tokens += mask.sum()
        self.k1_sum += (-log_ratio * mask).sum()
        self.k3_sum += ((log_ratio.exp() - 1 - log_ratio) * mask).sum()
        self.ratio_square_sum += ((2 * log_ratio).exp() * mask).sum()
        rows = mask.sum(-1) > 0
        per_sequence = (raw_log_ratio * mask).sum(-1)[rows].clamp(-SAFETY_BOUND, SAFETY_BOUND)
        self.sequences += rows.double().sum()
        self.sequence_square_sum += (2 * per_sequence).exp().sum()

    def _update_weights(self, log_ratio: Tensor, mask: Tensor,
                        cfg: Optional[RolloutCorrectionConfig]) -> None:
        level = "token" if cfg is None or cfg.rollout_is is None else cfg.rollout_is
        raw, _ = raw_is_weights(log_ratio, mask, level)
        weights = raw
        if cfg is not None:
            upper, lower = parse_is_threshold(cfg.rollout_is_threshold)
            if cfg.rollout_is is not None:
                weights = bounded_weights(raw, upper, lower)
            active = mask > 0
            self.capped_tokens += mask.sum()
            self.ratio_high += (active & (raw > upper)).double().sum()
            self.ratio_low += (active & (raw < (1.0 / upper if lower is None else lower))).double().sum()
            if lower is not None and cfg.rollout_is is not None:
                self.banded_tokens += mask.sum()
                self.masked_high += (active & (raw > upper)).double().sum()
                self.masked_low += (active & (raw < lower)).double().sum()
        self.weight_tokens += mask.sum()
        self.weight_sum += (weights * mask).sum()
        self.weight_square_sum += (weights.square() * mask).sum()
        if bool(mask.sum() > 0):
            chosen = weights[mask > 0]
            self.weight_min = torch.minimum(self.weight_min, chosen.min())
            self.weight_max = torch.maximum(self.weight_max, chosen.max())

    def update_staleness(self, staleness: Union[int, float, Tensor], rows: int) -> None:
        """Add the staleness of ``rows`` rows (one number for all, or one per row)."""
        value = torch.as_tensor(staleness, dtype=torch.float64, device=self.staleness_sum.device)
        if value.ndim == 0:
            value = value.expand(rows)
        if value.shape != (rows,) or not bool(torch.isfinite(value).all()) or bool((value < 0).any()):
            fail("OffPolicyMetrics staleness", f"a number >= 0 or one per row ({rows})",
                 tuple(value.shape) if value.ndim else float(value))
        self.staleness_sum += value.sum()
        self.staleness_rows += rows
        if rows:
            self.staleness_max = torch.maximum(self.staleness_max, value.max())

    def compute(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        p = self.prefix
        if self.tokens > 0:
            out[p + "mismatch_kl_k1"] = self.k1_sum / self.tokens
            out[p + "mismatch_kl_k3"] = self.k3_sum / self.tokens
            out[p + "chi2_token"] = self.ratio_square_sum / self.tokens - 1.0
            out[p + "chi2_seq"] = self.sequence_square_sum / self.sequences - 1.0
            out[p + "is_weight_mean"] = self.weight_sum / self.weight_tokens
            out[p + "is_weight_min"], out[p + "is_weight_max"] = self.weight_min, self.weight_max
            out[p + "ess"] = effective_sample_size(self.weight_sum, self.weight_square_sum,
                                                   self.weight_tokens)
        if self.capped_tokens > 0:
            out[p + "ratio_frac_high"] = self.ratio_high / self.capped_tokens
            out[p + "ratio_frac_low"] = self.ratio_low / self.capped_tokens
        if self.banded_tokens > 0:
            out[p + "is_masked_frac_high"] = self.masked_high / self.banded_tokens
            out[p + "is_masked_frac_low"] = self.masked_low / self.banded_tokens
        if self.filtered_tokens > 0:
            out[p + "rejected_frac"] = self.rejected_tokens / self.filtered_tokens
            out[p + "rejected_seq_frac"] = self.rejected_sequences / self.filtered_sequences
        if self.staleness_rows > 0:
            out[p + "staleness_mean"] = self.staleness_sum / self.staleness_rows
            out[p + "staleness_max"] = self.staleness_max.clone()
        return {k: v.float() for k, v in out.items()}
