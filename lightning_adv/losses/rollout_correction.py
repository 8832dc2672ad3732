"""Rollout correction: importance weights and rejection masks for tokens sampled by a policy
other than the one whose log-probs the loss starts from, as verl 0.9.1's
``compute_rollout_correction_and_rejection_mask`` (same names, same numbers).

``old`` is the policy the PPO ratio is taken against (π_old: recomputed by the trainer, or
the rollout policy itself in bypass mode), ``rollout`` the policy the tokens were drawn
from (π_rollout: an older copy, a bf16 copy, an inference engine), ``ρ = π_old/π_rollout``
per token (``log ρ = old - rollout``):

- ``rollout_is``: ``"token"`` weights ``ρ_t``; ``"sequence"`` weights ``∏_t ρ_t`` on
  every token of the sequence (the log-sum clamped to ±20 first). A float
  ``rollout_is_threshold`` truncates the weights at it (TIS); ``"lower_upper"`` zeroes
  the weights outside ``[lower, upper]`` (IcePop). ``rollout_is_batch_normalize``
  divides them by their mean (over tokens, or over sequences at sequence level; over all
  ranks under torch.distributed). Weights are detached: they change the measure, not the
  objective.
- ``rollout_rs``: a comma list of divergence filters, every one of which a token must
  pass to stay in the loss mask: ``token_k1|k2|k3`` per token, ``seq_sum_*``,
  ``seq_mean_*``, ``seq_max_k2|k3`` per sequence (a sequence filter rejects the whole
  sequence). With ``d = log ρ`` clamped to ±20: ``k1 = -d``, ``k2 = d²/2``,
  ``k3 = e^d - 1 - d``. ``rollout_rs_threshold`` holds one threshold per filter (or one
  for all), comma-separated: ``k1`` filters take ratio bounds ``lower_upper`` on
  ``π_rollout/π_old`` (one number ``u``: ``1/u_u``), the others an upper bound.

Where this differs from verl, and why:

- Metrics over sequences (``*_seq_*``, ``chi2_seq``, the perplexities, the sequence IS
  level's max, min and fractions) are taken over sequences with an active token; verl
  averages over every row, so a fully masked row counts as a sequence with weight 1.
  Token-level numbers, the weights and the mask are verl's. The values are 0-dim tensors
  (no host sync), keyed as verl's without its ``rollout_corr/`` prefix.
- Thresholds are checked where verl accepts anything positive: a truncation cap below 1
  or a band (IcePop, ``k1``) that excludes 1 would scale or drop every on-policy token.
- A mask without active tokens is allowed (verl raises): the weights are 0, the mask is
  returned as it is, and the metrics that need a token are left out.
- ``k3_kl`` exponentiates the log-ratio clamped to ±20 (verl's is unclamped), so one
  wild token cannot make the batch's metric infinite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_adv._checks import check_bool, check_choice, fail
from lightning_adv.losses.rollout_diagnostics import is_metrics, offpolicy_metrics, rs_metrics

ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_FILTERS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2",
                      "seq_sum_k3", "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2",
                      "seq_max_k3")
LOSS_TYPES = ("ppo_clip", "reinforce")
#: Log-ratios are clamped to ±SAFETY_BOUND before ``exp`` (verl's bound).
SAFETY_BOUND = 20.0
#: Log-probs may exceed 0 by float rounding this much (a sampler's float32 log-softmax).
LOGP_TOLERANCE = 1e-3

Threshold = Union[float, str]


class RejectionFilter(NamedTuple):
    """One ``rollout_rs`` filter: its name and bounds (``lower`` only for ``k1``)."""

    name: str
    lower: Optional[float]
    upper: float

    @property
    def sequence_level(self) -> bool:
        return not self.name.startswith("token_")


def _number(key: str, text: str, spec: Threshold) -> float:
    try:
        value = float(text)
    except ValueError:
        fail(key, "a number or 'lower_upper' numbers (e.g. 2.0 or '0.5_2.0')", spec)
    if not math.isfinite(value) or value <= 0:
        fail(key, "positive finite numbers", spec)
    return value


def parse_is_threshold(spec: Threshold, key: str = "rollout_is_threshold"
                       ) -> tuple[float, Optional[float]]:
    """``(upper, lower)``: a number truncates at ``upper >= 1`` (TIS, lower None);
    ``"lower_upper"`` keeps weights in ``[lower, upper]`` with ``lower <= 1 <= upper``."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        fail(key, "a number (TIS cap) or a 'lower_upper' string (IcePop band)", spec)
    text = str(spec).strip()
    if "_" in text:
        low_text, _, high_text = text.partition("_")
        lower, upper = _number(key, low_text, spec), _number(key, high_text, spec)
        if not lower <= 1.0 <= upper:
            fail(key, "an IcePop band 'lower_upper' with lower <= 1 <= upper (a band without "
                 "1 drops every on-policy token)", spec)
        return upper, lower
    upper = _number(key, text, spec)
    if upper < 1.0:
        fail(key, "a truncation cap >= 1 (a cap below 1 scales every on-policy token down)",
             spec)
    return upper, None


def parse_rejection(rollout_rs: Optional[str], thresholds: Optional[Threshold],
                    key: str = "rollout_rs", threshold_key: str = "rollout_rs_threshold"
                    ) -> list[RejectionFilter]:
    """The filters of ``rollout_rs`` (duplicates dropped, order kept) with their bounds."""
    if rollout_rs is None:
        if thresholds is not None:
            fail(threshold_key, f"null without {key} (no filter to apply it to)", thresholds)
        return []
    if not isinstance(rollout_rs, str):
        fail(key, f"a comma list of filters from {', '.join(ROLLOUT_RS_FILTERS)}", rollout_rs)
    names = list(dict.fromkeys(n.strip() for n in rollout_rs.split(",") if n.strip()))
    unknown = [n for n in names if n not in ROLLOUT_RS_FILTERS]
    if not names or unknown:
        fail(key, f"a comma list of filters from {', '.join(ROLLOUT_RS_FILTERS)}",
             unknown[0] if unknown else rollout_rs)
    if thresholds is None:
        fail(threshold_key, f"a threshold for each filter of {key} {rollout_rs!r}", None)
    if isinstance(thresholds, bool) or not isinstance(thresholds, (int, float, str)):
        fail(threshold_key, "a number or a comma list of thresholds", thresholds)
    specs = [s.strip() for s in str(thresholds).split(",") if s.strip()]
    if len(specs) not in (1, len(names)):
        fail(threshold_key, f"one threshold for all filters or one per filter ({len(names)})",
             thresholds)
    specs = specs * len(names) if len(specs) == 1 else specs
    return [_filter(name, spec, f"{threshold_key} (filter {name})")
            for name, spec in zip(names, specs)]


def _filter(name: str, spec: str, key: str) -> RejectionFilter:
    if name.endswith("k1"):
        if "_" in spec:
            low_text, _, high_text = spec.partition("_")
            lower, upper = _number(key, low_text, spec), _number(key, high_text, spec)
        else:
            upper = _number(key, spec, spec)
            lower = 1.0 / upper
        if not lower <= 1.0 <= upper:
            fail(key, "ratio bounds 'lower_upper' with lower <= 1 <= upper (or one number "
                 "u >= 1 for 1/u_u)", spec)
        return RejectionFilter(name, lower, upper)
    if "_" in spec:
        fail(key, f"one upper bound for {name} (only k1 filters take 'lower_upper')", spec)
    return RejectionFilter(name, None, _number(key, spec, spec))


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """verl's ``algorithm.rollout_correction`` (same keys), checked when built.

    ``rollout_is`` defaults to None here (verl's config class defaults to ``"sequence"``):
    nothing is weighted unless asked for."""

    rollout_is: Optional[str] = None
    """importance weights per ``token`` or ``sequence`` (null: no weights)"""
    rollout_is_threshold: Threshold = 2.0
    """a number truncates the weights at it (TIS); ``"lower_upper"`` zeroes those outside
    the band (IcePop)"""
    rollout_is_batch_normalize: bool = False
    """divide the weights by their batch mean"""
    rollout_rs: Optional[str] = None
    """comma list of rejection filters (token_k1 ... seq_max_k3); null: none"""
    rollout_rs_threshold: Optional[Threshold] = None
    """one threshold per filter, comma-separated (or one for all)"""
    bypass_mode: bool = False
    """true: the rollout policy is the old policy (two policies, verl's bypass mode);
    false: decoupled (three policies: the IS weight is π_old/π_rollout)"""
    loss_type: str = "ppo_clip"
    """bypass mode's loss: ppo_clip (the ratio is taken against the rollout policy) or
    reinforce (the IS weight π_θ/π_rollout, detached, times the policy gradient)"""

    KEY: ClassVar[str] = "rollout_correction"

    def __post_init__(self) -> None:
        k = self.KEY
        check_choice(f"{k}.rollout_is", self.rollout_is, (None, *ROLLOUT_IS_LEVELS))
        parse_is_threshold(self.rollout_is_threshold, f"{k}.rollout_is_threshold")
        check_bool(f"{k}.rollout_is_batch_normalize", self.rollout_is_batch_normalize)
        parse_rejection(self.rollout_rs, self.rollout_rs_threshold, f"{k}.rollout_rs",
                        f"{k}.rollout_rs_threshold")
        check_bool(f"{k}.bypass_mode", self.bypass_mode)
        check_choice(f"{k}.loss_type", self.loss_type, LOSS_TYPES)
        if self.loss_type == "reinforce" and not self.bypass_mode:
            fail(f"{k}.loss_type", "'ppo_clip' unless bypass_mode is true (reinforce is "
                 "bypass mode's loss, as verl)", self.loss_type)
        if self.bypass_mode and self.loss_type == "ppo_clip" and self.rollout_is is not None:
            fail(f"{k}.rollout_is", "null with bypass_mode and loss_type ppo_clip: the PPO "
                 "ratio is already taken against the rollout policy, IS weights would apply "
                 "the same correction twice", self.rollout_is)

    def kwargs(self) -> dict:
        """The keyword arguments of :func:`rollout_correction`."""
        return dict(rollout_is=self.rollout_is, rollout_is_threshold=self.rollout_is_threshold,
                    rollout_is_batch_normalize=self.rollout_is_batch_normalize,
                    rollout_rs=self.rollout_rs, rollout_rs_threshold=self.rollout_rs_threshold)


class RolloutCorrection(NamedTuple):
    """What :func:`rollout_correction` returns."""

    weights: Optional[Tensor]
    """[B, T] detached IS weights, 0 off the mask (None without ``rollout_is``)"""
    loss_mask: Tensor
    """[B, T] the loss mask after rejection (the input's dtype)"""
    metrics: dict[str, Tensor]
    """verl's metrics (its names, without the ``rollout_corr/`` prefix), 0-dim tensors"""


def check_logprobs(name: str, value: Tensor, shape: torch.Size, active: Tensor) -> None:
    """A floating tensor of ``shape`` whose active entries are log-probs (<= 0, finite)."""
    if not isinstance(value, Tensor) or not value.is_floating_point():
        fail(name, "a floating-point [B, T] tensor of log-probs",
             getattr(value, "dtype", type(value).__name__))
    if value.shape != shape:
        fail(name, f"shape {tuple(shape)} (that of the loss mask)", tuple(value.shape))
    bad = active & ~(value <= LOGP_TOLERANCE)  # NaN fails the comparison too
    if bool(bad.any()):
        rows = bad.any(1).nonzero().flatten().tolist()[:10]
        fail(name, "log-probs (<= 0) at active positions (probabilities or logits passed?)",
             f"values above 0 or NaN in rows {rows}")


def rollout_correction(old_logprobs: Tensor, rollout_logprobs: Tensor, loss_mask: Tensor, *,
                       rollout_is: Optional[str] = None, rollout_is_threshold: Threshold = 2.0,
                       rollout_is_batch_normalize: bool = False,
                       rollout_rs: Optional[str] = None,
                       rollout_rs_threshold: Optional[Threshold] = None) -> RolloutCorrection:
    """IS weights, the loss mask after rejection, and verl's metrics; see the module
    docstring. ``old_logprobs``, ``rollout_logprobs`` and ``loss_mask`` are ``[B, T]`` in
    one convention (any positions outside the mask are never read)."""
    check_choice("rollout_is", rollout_is, (None, *ROLLOUT_IS_LEVELS))
    upper, lower = parse_is_threshold(rollout_is_threshold)
    check_bool("rollout_is_batch_normalize", rollout_is_batch_normalize)
    filters = parse_rejection(rollout_rs, rollout_rs_threshold)
    if not isinstance(loss_mask, Tensor) or loss_mask.ndim != 2:
        fail("loss_mask", "a [B, T] tensor", getattr(loss_mask, "shape", type(loss_mask).__name__))
    if loss_mask.dtype != torch.bool and bool(((loss_mask != 0) & (loss_mask != 1)).any()):
        # a fractional mask would weight tokens: rejection multiplies it, the metrics average it
        bad = loss_mask[(loss_mask != 0) & (loss_mask != 1)].unique()[:5].tolist()
        fail("loss_mask", "only 0 and 1 (or a bool tensor)", f"values {bad}")
    active = loss_mask > 0
    check_logprobs("old_logprobs", old_logprobs, loss_mask.shape, active)
    check_logprobs("rollout_logprobs", rollout_logprobs, loss_mask.shape, active)
    dtype = torch.promote_types(torch.promote_types(old_logprobs.dtype, rollout_logprobs.dtype),
                                torch.float32)
    mask = loss_mask.to(dtype)
    with torch.no_grad():
        old = torch.where(active, old_logprobs.detach().to(dtype), 0.0)
        rollout = torch.where(active, rollout_logprobs.detach().to(dtype), 0.0)
        log_ratio = old - rollout
        metrics: dict[str, Tensor] = {}
        weights = None
        if rollout_is is not None:
            weights, metrics = _is_weights(log_ratio, mask, rollout_is, upper, lower)
            if rollout_is_batch_normalize:
                weights = _batch_normalize(weights, mask, rollout_is, metrics)
        kept = loss_mask
        if filters:
            keep, rs = _rejection(log_ratio, mask, filters)
            metrics.update(rs)
            kept = (loss_mask * keep.to(loss_mask.dtype)) if loss_mask.dtype != torch.bool \
                else loss_mask & keep
        if bool(active.any()):
            metrics.update(offpolicy_metrics(old, rollout, mask))
    return RolloutCorrection(weights, kept, metrics)


def raw_is_weights(log_ratio: Tensor, mask: Tensor, level: str) -> tuple[Tensor, Tensor]:
    """The untruncated weights (0 off the mask) of ``log ρ`` per token or, at sequence
    level, of its masked sum per row (clamped to ±20); and the log-ratio they come from
    (``[B, T]``, or ``[B, 1]`` per sequence)."""
    if level == "token":
        return log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() * mask, log_ratio
    per_sequence = (log_ratio * mask).sum(-1, keepdim=True)
    raw = per_sequence.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().expand_as(log_ratio) * mask
    return raw, per_sequence


def bounded_weights(raw: Tensor, upper: float, lower: Optional[float]) -> Tensor:
    """TIS (``lower`` None): truncated at ``upper``; IcePop: 0 outside ``[lower, upper]``."""
    if lower is None:
        return raw.clamp(max=upper)
    return torch.where((raw >= lower) & (raw <= upper), raw, 0.0)


def _is_weights(log_ratio: Tensor, mask: Tensor, level: str, upper: float,
                lower: Optional[float]) -> tuple[Tensor, dict[str, Tensor]]:
    raw, log_for_metrics = raw_is_weights(log_ratio, mask, level)
    weights = bounded_weights(raw, upper, lower)
    return weights, is_metrics(weights, raw, log_for_metrics, mask, level, upper, lower)


def _batch_normalize(weights: Tensor, mask: Tensor, level: str,
                     metrics: dict[str, Tensor]) -> Tensor:
    """Divide by the weights' mean over tokens (sequences at sequence level), over all
    ranks under torch.distributed; unchanged when that mean is ~0."""
    if level == "token":
        totals = torch.stack([(weights * mask).sum(), mask.sum()])
    else:
        tokens = mask.sum(-1)
        per_sequence = (weights * mask).sum(-1) / tokens.clamp(min=1.0)
        totals = torch.stack([per_sequence.sum(), (tokens > 0).sum().to(weights.dtype)])
    if dist.is_available() and dist.is_initialized():
        totals = totals.clone()
        dist.all_reduce(totals)
    mean = totals[0] / totals[1].clamp(min=1.0)
    if float(mean) > 1e-8:
        metrics["rollout_is_batch_norm_factor"] = mean
        return weights / mean
    metrics["rollout_is_batch_norm_factor"] = torch.ones_like(mean)
    return weights


def _rejection(log_ratio: Tensor, mask: Tensor, filters: list[RejectionFilter]
               ) -> tuple[Tensor, dict[str, Tensor]]:
    """The keep mask (bool [B, T]) of every filter together, and verl's metrics."""
    d = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -d, "k2": 0.5 * d.square(), "k3": d.exp() - 1.0 - d}
    active = mask > 0
    tokens = mask.sum(-1)
    nonempty = tokens > 0
    keep_all = torch.ones_like(active)
    metrics: dict[str, Tensor] = {}
    for f in filters:
        stat = per_token[f.name[-2:]]
        if f.name.startswith("seq_sum"):
            sequence = (stat * mask).sum(-1)
        elif f.name.startswith("seq_mean"):
            sequence = (stat * mask).sum(-1) / tokens.clamp(min=1.0)
        elif f.name.startswith("seq_max"):
            sequence = torch.where(active, stat, float("-inf")).amax(-1)
            sequence = torch.where(nonempty, sequence, 0.0)
        else:
            sequence = None
        value = stat if sequence is None else sequence[:, None].expand_as(stat)
        if f.lower is not None:  # k1: bounds on log(π_rollout/π_old)
            keep = (value >= math.log(f.lower)) & (value <= math.log(f.upper))
        else:
            keep = value <= f.upper
        keep_all = keep_all & keep
        metrics.update(rs_metrics(f, stat if sequence is None else value, sequence, mask, keep))
    rejected = (~keep_all & active)
    n = mask.sum()
    if bool(n > 0):
        metrics["rollout_rs_masked_fraction"] = rejected.to(mask.dtype).sum() / n
        metrics["rollout_rs_seq_masked_fraction"] = (
            rejected.any(-1) & nonempty).to(mask.dtype).sum() / nonempty.sum()
    return keep_all, metrics
