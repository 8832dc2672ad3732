"""Loss parts beside :class:`~lightning_adv.PPOLoss`'s RL term, each normalised by its own
token count.

- **cross-entropy on a second mask** (``ce_mask``, weight ``ce_coef``): ``-log π_θ`` of
  the tokens the mask marks, e.g. tool outputs (ECHO: the policy learns to predict the
  environment's replies while they stay out of the RL mask);
- **KL to a teacher** (``teacher_logprobs``, weight ``teacher_kl_coef``): the per-token
  KL estimate (``teacher_kl_estimator``, as ``kl_estimator``) of π_θ against the
  teacher's log-probs of the same tokens, on the loss mask's tokens.

Each part is a token mean over its own tokens, counted over the whole minibatch (and over
ranks with ``sync_across_ranks``), as prime-rl normalises its loss parts: the RL term's
normalisation never sees the other parts' tokens, so adding a part leaves the RL term's
value and gradient exactly as they were, and the weight of a part means the same whatever
the share of its tokens. Inputs are the aligned ``[B, T]`` tensors of ``PPOLoss``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv._checks import check_choice, check_number, fail
from lightning_adv.losses.aggregation import TokenCounts, aggregate, masked_mean
from lightning_adv.losses.rollout_correction import LOGP_TOLERANCE
from lightning_adv.ops.kl import LOSS_KL_ESTIMATORS, kl_estimate


@dataclass(frozen=True)
class LossParts:
    """The weights of the parts beside the RL term (0: the part is only logged, when its
    input is given)."""

    ce_coef: float = 0.0
    teacher_kl_coef: float = 0.0
    teacher_kl_estimator: str = "k3"
    sync_across_ranks: bool = True
    """count each part's tokens over ranks (as ``PPOLoss``'s ``sync_across_ranks``)"""

    def __post_init__(self) -> None:
        check_number("ce_coef", self.ce_coef, minimum=0.0)
        check_number("teacher_kl_coef", self.teacher_kl_coef, minimum=0.0)
        check_choice("teacher_kl_estimator", self.teacher_kl_estimator, LOSS_KL_ESTIMATORS)


@dataclass(frozen=True)
class PartInputs:
    """What the parts read of one ``PPOLoss`` call."""

    logprobs: Tensor
    """as passed (the cross-entropy tokens lie outside the loss mask)"""
    mask: Tensor
    """the loss mask in the arithmetic's dtype"""
    counts: TokenCounts
    """the loss mask's counts (the minibatch's)"""
    ce_mask: Optional[Tensor] = None
    teacher_logprobs: Optional[Tensor] = None


def ce_counts(ce_mask: Tensor, sync: bool) -> TokenCounts:
    """The counts of the cross-entropy tokens of a whole minibatch (a collective under
    torch.distributed with ``sync``)."""
    return TokenCounts(ce_mask.to(torch.promote_types(ce_mask.dtype, torch.float32)), sync)


def check_part_inputs(parts: LossParts, logprobs: Tensor, loss_mask: Tensor,
                      ce_mask: Optional[Tensor], teacher_logprobs: Optional[Tensor],
                      counts: Any) -> None:
    """Shapes, devices, 0/1 ``ce_mask``, the inputs each weight needs, and finite log-probs
    (<= 0) where a part reads them: ``logprobs`` at ``ce_mask``'s tokens,
    ``teacher_logprobs`` at the loss mask's. One error naming the input."""
    for name, tensor, coef in (("ce_mask", ce_mask, parts.ce_coef),
                               ("teacher_logprobs", teacher_logprobs, parts.teacher_kl_coef)):
        if tensor is None:
            if coef > 0:
                raise ValueError(f"PPOLoss {name}: required with "
                                 f"{'ce_coef' if name == 'ce_mask' else 'teacher_kl_coef'} > 0, "
                                 f"got None")
            continue
        if not isinstance(tensor, Tensor):
            fail(f"PPOLoss {name}", "a tensor", type(tensor).__name__)
        if tensor.shape != logprobs.shape or tensor.device != logprobs.device:
            fail(f"PPOLoss {name}", f"shape {tuple(logprobs.shape)} on {logprobs.device} (that "
                 f"of logprobs)", f"{tuple(tensor.shape)} on {tensor.device}")
    if ce_mask is not None:
        if ce_mask.dtype != torch.bool and bool(((ce_mask != 0) & (ce_mask != 1)).any()):
            fail("PPOLoss ce_mask", "only 0 and 1", f"values {ce_mask.unique()[:5].tolist()}")
        _check_logprobs("logprobs", logprobs, ce_mask > 0, "ce_mask's")
        if counts is not None and "ce" not in counts.parts:
            fail("PPOLoss counts", "PPOLoss.counts(loss_mask, ce_mask=...) of the minibatch "
                 "when ce_mask is given (the cross-entropy part has its own token count)",
                 "counts without ce_mask")
    if teacher_logprobs is not None:
        if not teacher_logprobs.is_floating_point():
            fail("PPOLoss teacher_logprobs", "a floating-point tensor", teacher_logprobs.dtype)
        _check_logprobs("teacher_logprobs", teacher_logprobs, loss_mask > 0, "the loss mask's")


def _check_logprobs(name: str, x: Tensor, active: Tensor, where: str) -> None:
    bad = active & ~(torch.isfinite(x.detach()) & (x.detach() <= LOGP_TOLERANCE))
    if bool(bad.any()):
        row, col = bad.nonzero()[0].tolist()
        fail(f"PPOLoss {name}", f"log-probs (<= 0, finite) at {where} tokens",
             f"{int(bad.sum())} bad tokens (first at ({row}, {col}): {x[row, col].item()})")


def add_loss_parts(loss: Tensor, result: dict[str, Tensor], parts: LossParts,
                   x: PartInputs) -> Tensor:
    """``loss`` (the RL term, logged as ``rl_loss``) plus the weighted parts whose inputs
    are given, each logged (``ce_loss``, ``ce_tokens``; ``teacher_kl``)."""
    logprobs, mask, counts = x.logprobs, x.mask, x.counts
    ce_mask, teacher_logprobs = x.ce_mask, x.teacher_logprobs
    if ce_mask is None and teacher_logprobs is None:
        return loss
    result["rl_loss"] = loss.detach()
    if ce_mask is not None:
        ce = ce_mask.to(mask.dtype)
        own = (counts.parts["ce"].part(ce) if "ce" in counts.parts
               else ce_counts(ce, parts.sync_across_ranks))
        nll = -torch.where(ce > 0, logprobs.to(mask.dtype), 0.0)
        result["ce_loss"] = masked_mean(nll, ce, own.local_tokens)
        result["ce_tokens"] = own.local_tokens.detach()
        if parts.ce_coef:
            loss = loss + parts.ce_coef * aggregate(nll, ce, "token-mean", own)
    if teacher_logprobs is not None:
        active = mask > 0
        kl = kl_estimate(torch.where(active, logprobs.to(mask.dtype), 0.0),
                         torch.where(active, teacher_logprobs.to(mask.dtype), 0.0),
                         parts.teacher_kl_estimator)
        result["teacher_kl"] = masked_mean(kl, mask, counts.local_tokens)
        if parts.teacher_kl_coef:
            loss = loss + parts.teacher_kl_coef * aggregate(kl, mask, "token-mean", counts)
    return loss
