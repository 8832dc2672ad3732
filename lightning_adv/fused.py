"""Steps 4-8 of the default pipeline in one native pass, with the batch's value checks.

With a built-in token GAE estimator on the CPU, the alignment of the batch
(:func:`~lightning_adv.alignment.align_batch`), the KL penalty, the outcome score's
placement (:func:`~lightning_adv.alignment.place_outcome`) and the estimator
(:func:`~lightning_adv.stages.estimators.token_gae`) touch every ``[B, T]`` element a
dozen times as torch operations; ``la_token_pipeline`` in ``_native.c`` does them in one
pass over each row while the row is in cache, and checks the masks and float tensors in
the same pass (what :func:`~lightning_adv.batch_checks.validate_batch` checks with
reductions on the torch path). Same outputs, same numbers to float32 rounding
(``tests/test_fused_pipeline.py`` compares the two paths), same errors.

When: :func:`module_plan` decides once per module from its config and stages,
:func:`takes` per batch from its tensors (CPU, dtypes the loop reads, no key that needs
the torch path). Everything else runs the torch steps, as before.

The checks run after the [B]-sized steps 1-3 here (length penalty, outcome stage,
reward normalization), which only built-in code sees: a batch with several faults may
report another one first than the torch path would; a batch with one fault gets the
same error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv import native
from lightning_adv.alignment import AlignedBatch, report_dropped_outcomes
from lightning_adv.batch_checks import (
    LOGP_TOLERANCE, BatchFacts, _check_logp_range, _explain_mask_error, _report_non_finite,
    present)
from lightning_adv.config import ActorConfig
from lightning_adv.contracts import TemporalResult
from lightning_adv.kernels import _coefficient
from lightning_adv.stages import Stage, builtin_stage

#: Batch keys only the torch steps read (the fused pass does not take such a batch).
TORCH_ONLY_KEYS = ("prox_logp", "token_rewards", "mopd_teacher_logp_sum")
#: [B, T] float keys the fused pass reads, in the order the torch checks report them.
FLOAT_KEYS = ("logprobs", "values", "ref_logp")


@dataclass(frozen=True)
class FusedPlan:
    """What a module's config fixes for the fused pass."""

    discount: float
    coef: float
    """γλ as the torch kernel rounds it for float32 inputs"""
    kl_estimator: Optional[str]
    """None when ``kl_ctl`` is 0 (no KL penalty)"""
    kl_ctl: float
    zero_truncated_scores: bool
    needs_explicit_truncation: bool
    """``truncated_reward`` reads ``is_truncated`` before the pass: only an explicit one"""


def module_plan(config: ActorConfig, outcome: Stage, estimator: Stage,
                default_steps: bool) -> Optional[FusedPlan]:
    """The plan for a module, or None when its steps 4-8 must run as torch steps:
    ``default_steps`` is False when a subclass overrides a step the pass stands for."""
    if not (default_steps and native.available()):
        return None
    if config.advantage.is_replaced or not (outcome.builtin and estimator.builtin):
        return None
    if estimator.implementation != "token_gae" or isinstance(config.gae_lambda, str):
        return None
    if outcome.fn is None or "ref_logp" in builtin_stage(
            "outcome_reward_shaping", outcome.implementation).requires:
        return None  # an outcome stage reading [B, T] log-probs before they are checked
    if config.recompute_logprob and not config.use_decoupled_loss:
        return None  # old log-probs from prox_logp
    discount = float(config.discount)
    return FusedPlan(
        discount=discount,
        coef=_coefficient(discount, float(config.gae_lambda), torch.float32),
        kl_estimator=config.kl_estimator if config.kl_ctl != 0 else None,
        kl_ctl=float(config.kl_ctl),
        zero_truncated_scores=bool(config.mask_no_eos_with_zero),
        needs_explicit_truncation=config.truncated_reward is not None)


def takes(batch: Mapping[str, Any], plan: Optional[FusedPlan]) -> bool:
    """Whether the fused pass takes this batch (else :func:`validate_batch` checks its
    values and the torch steps run). Malformed batches go the torch way, whose structural
    checks name the problem."""
    if plan is None or not native.active() or not isinstance(batch, Mapping):
        return False
    try:
        tensors = [batch[key] for key in ("input_ids", "attention_mask", "loss_mask",
                                          "logprobs")]
    except KeyError:
        return False
    if any(present(batch, key) for key in TORCH_ONLY_KEYS):
        return False
    if plan.needs_explicit_truncation and not present(batch, "is_truncated"):
        return False
    for key in ("values", "ref_logp"):
        if present(batch, key):
            tensors.append(batch[key])
    if not all(isinstance(t, Tensor) and t.device.type == "cpu" for t in tensors):
        return False
    att, loss, logprobs = tensors[1:4]
    return (att.dtype in native.MASK_KINDS and loss.dtype in native.MASK_KINDS
            and all(t.dtype == torch.float32 for t in tensors[3:]))


def align_and_estimate(batch: Mapping[str, Any], facts: BatchFacts, scores: Tensor,
                       config: ActorConfig, plan: FusedPlan
                       ) -> tuple[AlignedBatch, TemporalResult]:
    """Steps 4-8 for a batch :func:`takes` accepted and :func:`validate_batch` checked
    with ``check_values=False``: the outputs of ``align_batch``, ``place_outcome`` and
    ``token_gae``, after the value checks (raised or warned as the torch path does)."""
    bs, width = facts.batch_size, facts.width
    att, loss = batch["attention_mask"].contiguous(), batch["loss_mask"].contiguous()
    logprobs = batch["logprobs"].contiguous()
    ref = batch["ref_logp"].contiguous() if present(batch, "ref_logp") else None
    values = batch["values"].contiguous() if present(batch, "values") \
        else torch.zeros((bs, width), dtype=torch.float32, device=native.CPU)
    explicit = facts.is_truncated
    outputs = native.token_pipeline(
        att, loss, logprobs, ref, values, scores.float().contiguous(),
        None if explicit is None else explicit.to(torch.uint8).contiguous(),
        zero_truncated_scores=plan.zero_truncated_scores, discount=plan.discount,
        coef=plan.coef, kl_ctl=plan.kl_ctl, kl_estimator=plan.kl_estimator,
        tolerance=LOGP_TOLERANCE)
    _decide_checks(batch, outputs.failed, outputs.mask, config)
    facts = replace(facts, seqlens=outputs.seqlens, is_truncated=outputs.is_truncated,
                    aligned_loss_mask=outputs.mask, values_checked=True)
    report_dropped_outcomes(outputs.dropped, config, stacklevel=4)
    kl = outputs.kl if outputs.kl is not None else torch.zeros(
        (bs, width), dtype=torch.float32, device=native.CPU)
    aligned = AlignedBatch(
        loss_mask=outputs.mask, turn_ids=None, old_logp=outputs.old_logp, ref_logp=outputs.ref_logp,
        prox_logp=None if config.use_decoupled_loss else outputs.old_logp,
        mopd_behavior_logprobs=None, kl_rewards=kl, folded_token_rewards=None,
        direct_token_rewards=None, values=values, bootstrap_values=outputs.bootstrap,
        is_truncated=outputs.is_truncated, facts=facts)
    return aligned, TemporalResult(outputs.advantages, outputs.returns, outputs.total_rewards)


def _decide_checks(batch: Mapping[str, Any], failed: frozenset[str], aligned_mask: Tensor,
                   config: ActorConfig) -> None:
    """The torch path's decisions, in its order, from the pass's flags: each failure is
    named by the same exact (slow) check the torch path runs to name it."""
    if not failed:
        return
    for key in FLOAT_KEYS:
        if f"{key}_not_finite" in failed:
            _report_non_finite(key, batch[key])
    if "masks" in failed:
        _explain_mask_error(batch["attention_mask"], batch["loss_mask"])
        # (the two checks are the same rules; a disagreement must not pass silently)
        raise ValueError("rollout batch: attention_mask/loss_mask break a mask rule of "
                         "SPEC §1 (0/1 values, right padding, generated tokens attended, "
                         "column 0 not generated) that the exact check could not name")
    if "logprobs_above" in failed:
        _check_logp_range("logprobs", batch["logprobs"], batch["loss_mask"], "raise")
    if "ref_logp_above" in failed:
        _check_logp_range("ref_logp", batch["ref_logp"], aligned_mask,
                          config.positive_ref_prox_logp)
