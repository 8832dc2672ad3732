"""The batch moved to the next-token convention (SPEC §3 steps 4-7): aligned masks and
log-probs, the KL penalty, process rewards (direct or folded per turn), the outcome score at
its position, and the estimator's :class:`~lightning_adv.stages.types.TemporalInputs`.

Everything here produces new tensors; the caller's batch is never modified (SPEC §9).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.batch.validation import BatchFacts, aligned_loss_mask, present
from lightning_adv.config import ActorConfig
from lightning_adv.stages.types import TemporalInputs
from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.advantage.reward_terms import kl_penalty
from lightning_adv.ops.gae import turn_id_errors, validate_turn_ids
from lightning_adv.ops.turns import TurnSlots, turn_slots
from lightning_adv.exceptions import DroppedOutcomeRewardWarning


def shift_left(x: Tensor) -> Tensor:
    """Token-aligned -> next-token-aligned, exactly as ``torch.roll(x, -1, dims=-1)``."""
    return torch.roll(x, shifts=-1, dims=-1)


def _masked_shift(x: Tensor, mask: Tensor) -> Tensor:
    """``shift_left(x) * mask``, a new tensor in ``x``'s dtype."""
    return shift_left(x).mul_(mask)


def next_token_aligned(batch: Mapping[str, Any], key: str) -> Tensor:
    """The batch's token-aligned ``key`` (``logprobs``, ``rollout_logprobs``) in the
    next-token convention, float32, 0 off the aligned loss mask: what the module does to
    each such key (for a caller that needs one before the module runs)."""
    return _masked_shift(batch[key].float(), aligned_loss_mask(batch["loss_mask"]))


@dataclass(frozen=True)
class AlignedBatch:
    """The batch moved to the next-token convention, with KL and process rewards ready."""

    loss_mask: Tensor
    """[B, T] float 0/1"""
    turn_ids: Optional[Tensor]
    old_logp: Tensor
    ref_logp: Optional[Tensor]
    """masked ``ref_logp``, or None when the batch has none (the KL then treats it as 0)"""
    prox_logp: Optional[Tensor]
    """the ``prox_logp`` output, or None to pass the input through (decoupled loss)"""
    mopd_behavior_logprobs: Optional[Tensor]
    rollout_logp: Optional[Tensor]
    """the sampler's ``rollout_logprobs`` (π_rollout of off-policy correction), aligned like
    ``logprobs``; None when the batch has none"""
    kl_rewards: Tensor
    folded_token_rewards: Optional[Tensor]
    """per-turn rewards, each at its turn's last active position: folded ``token_rewards``
    (``token_rewards_as_adv=false``) plus ``turn_rewards``; None without either"""
    direct_token_rewards: Optional[Tensor]
    values: Tensor
    bootstrap_values: Tensor
    is_truncated: Tensor
    facts: BatchFacts


def align_batch(batch: Mapping[str, Any], facts: BatchFacts, config: ActorConfig,
                kl_coef: float, turn_ids_needed_by: Optional[str] = None) -> AlignedBatch:
    """SPEC §3 steps 4, 5, 6 (KL) and 7: aligned masks, log-probs, KL and process rewards.

    ``kl_coef`` is the KL penalty's coefficient for this batch (``actor.kl_ctl``, or a
    trainer's KL controller's value). ``turn_ids_needed_by`` names the stage that needs
    ``turn_ids`` (for the error message).
    """
    rows = torch.arange(facts.batch_size, device=facts.device)
    mask = facts.aligned_loss_mask
    turn_ids = None
    if present(batch, "turn_ids"):
        turn_ids = shift_left(batch["turn_ids"])
        turn_ids[:, -1] = -1   # the last position predicts nothing (SPEC §1)
    elif turn_ids_needed_by is not None:
        raise ValueError(f"{turn_ids_needed_by}: rollout batch has no 'turn_ids' (turn GAE needs "
                         f"the turn index of every generated token, -1 elsewhere)")

    logprobs = batch["logprobs"]
    mopd = _masked_shift(logprobs.detach(), mask) if present(batch, "mopd_teacher_logp_sum") else None
    if config.recompute_logprob and not config.use_decoupled_loss:
        if not present(batch, "prox_logp"):
            raise ValueError("rollout batch 'prox_logp': actor.recompute_logprob=true (and no "
                             "decoupled loss) uses the recomputed prox_logp as old log-probs, but "
                             "the batch has none; compute it before the advantages")
        old = batch["prox_logp"] * mask
    else:
        old = _masked_shift(logprobs, mask)
    prox = None if config.use_decoupled_loss else old
    rollout = (_masked_shift(batch["rollout_logprobs"].float(), mask)
               if present(batch, "rollout_logprobs") else None)
    ref = batch["ref_logp"] * mask if present(batch, "ref_logp") else None

    # The legacy code zeroes the KL at each row's last valid position before GAE. Both
    # log-probs are masked there (the position after the last token is never active, and
    # column 0 is never generated), so the KL is already 0 and the same tensor serves.
    kl = kl_penalty(old, ref, kl_coef, config.kl_estimator)
    last_valid = (facts.seqlens - 1).clamp(min=0)

    folded, direct = _process_rewards(batch, facts, config, mask, turn_ids)

    values = batch["values"].float() if present(batch, "values") else torch.zeros_like(mask)
    bootstrap = values[rows, last_valid]
    return AlignedBatch(mask, turn_ids, old, ref, prox, mopd, rollout, kl, folded, direct,
                        values, bootstrap, facts.is_truncated, facts)


def optional_outputs(aligned: AlignedBatch) -> dict[str, Tensor]:
    """The aligned keys the module outputs only when the batch gives them: ``prox_logp``
    (the old log-probs, as in the legacy code), ``ref_logp``, ``mopd_behavior_logprobs``
    and ``rollout_logprobs`` (each moved to the next-token convention once, here)."""
    named = {"prox_logp": aligned.prox_logp, "ref_logp": aligned.ref_logp,
             "mopd_behavior_logprobs": aligned.mopd_behavior_logprobs,
             "rollout_logprobs": aligned.rollout_logp}
    return {key: value for key, value in named.items() if value is not None}


def _process_rewards(batch: Mapping[str, Any], facts: BatchFacts, config: ActorConfig,
                     mask: Tensor, turn_ids: Optional[Tensor]
                     ) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """SPEC §3 step 7 and the per-turn rewards: (folded per-turn rewards at each turn's
    last position, direct token rewards), each None when absent."""
    folded = direct = None
    slots = None
    if present(batch, "token_rewards") or present(batch, "turn_rewards"):
        if turn_ids is not None:
            with turn_id_errors("rollout batch 'turn_ids' (shifted one step left)"):
                validate_turn_ids(mask.bool(), turn_ids)
        slots = turn_slots(mask, turn_ids)
    if present(batch, "token_rewards"):
        token_rewards = _zero_truncated(batch["token_rewards"].float(), facts, config)
        shifted = shift_left(token_rewards)
        if config.token_rewards_as_adv:
            direct = shifted * mask
        else:
            folded = fold_turn_rewards(shifted, slots, "token_rewards", uniform_only=True)
    if present(batch, "turn_rewards"):
        per_turn = fold_turn_rewards(
            shift_left(_zero_truncated(batch["turn_rewards"].float(), facts, config)), slots,
            "turn_rewards", uniform_only=False)
        folded = per_turn if folded is None else folded + per_turn
    return folded, direct


def _zero_truncated(rewards: Tensor, facts: BatchFacts, config: ActorConfig) -> Tensor:
    if config.mask_no_eos_with_zero:
        return torch.where(facts.is_truncated[:, None], 0.0, rewards)
    return rewards


def fold_turn_rewards(shifted: Tensor, slots: TurnSlots, key: str, uniform_only: bool) -> Tensor:
    """Each turn's reward, once, at the turn's last active (aligned) position.

    A turn's reward is the value at its last generated token; its other generated tokens
    must hold the same value (broadcast over the turn), or, unless ``uniform_only``, all
    0 (the reward placed at the turn's end). Masked tokens inside a turn are not read.
    """
    active = slots.rank >= 0
    at_end = torch.where(slots.last, shifted.double(), 0.0)
    per_turn = slots.table(at_end)             # [B, T]: each turn's value at its end
    value = slots.spread(per_turn)
    same = active & (shifted.double() == value)
    zero = active & ~slots.last & (shifted == 0)
    tokens = slots.table(active.double())
    uniform = slots.table(same.double()) == tokens
    at_end_only = slots.table(zero.double()) == tokens - 1
    ok = uniform if uniform_only else uniform | at_end_only
    bad = slots.present() & ~ok
    if bool(bad.any()):
        rows = bad.any(dim=1).nonzero().flatten().tolist()
        if uniform_only:
            rule = ("actor.token_rewards_as_adv=false folds one process reward per turn into "
                    "the estimator, so token rewards must be uniform within each turn")
        else:
            rule = ("a turn's reward goes on every generated token of the turn, or on its last "
                    "one with 0 on the others")
        raise ValueError(f"rollout batch '{key}': {rule}; rows {rows[:10]} hold other values "
                         f"inside a turn (turns by turn_ids, or runs of generated tokens "
                         f"without them)")
    return torch.where(slots.last, shifted, torch.zeros((), dtype=shifted.dtype,
                                                        device=shifted.device))


def place_outcome(scores: Tensor, aligned: AlignedBatch, config: ActorConfig) -> Tensor:
    """Outcome score at ``max(seqlen - 2, 0)`` (the position predicting the last token)."""
    facts = aligned.facts
    position = (facts.seqlens - 2).clamp_(min=0)[:, None]
    scores = scores.float()
    if config.mask_no_eos_with_zero:
        scores = torch.where(facts.is_truncated, torch.zeros_like(scores), scores)
    outcome = torch.zeros_like(aligned.loss_mask)
    outcome.scatter_(1, position, scores[:, None])
    if config.dropped_outcome_reward != "ignore":
        dropped = aligned.loss_mask.gather(1, position)[:, 0] == 0
        if config.mask_no_eos_with_zero:
            dropped &= ~facts.is_truncated
        report_dropped_outcomes(dropped, config, stacklevel=4)
    return outcome


def report_dropped_outcomes(dropped: Tensor, config: ActorConfig, stacklevel: int) -> None:
    """Warn about (or, as configured, refuse) outcome scores that landed on an inactive
    position (``dropped``: [B] bool) and so never reach GAE."""
    if config.dropped_outcome_reward == "ignore" or not bool(dropped.any()):
        return
    dropped_rows = dropped.nonzero().flatten().tolist()
    message = (f"outcome rewards of rows {dropped_rows[:20]}"
               f"{' ...' if len(dropped_rows) > 20 else ''} land on an inactive position "
               f"(the row ends with non-generated tokens or has no generated token) and do "
               f"not reach GAE; set actor.dropped_outcome_reward to 'ignore' or 'raise'")
    if config.dropped_outcome_reward == "raise":
        raise ValueError(message)
    warnings.warn(message, DroppedOutcomeRewardWarning, stacklevel=stacklevel)


def temporal_inputs(aligned: AlignedBatch, outcome: Tensor, config: ActorConfig,
                    meta: Optional[BatchMeta],
                    data: Optional[Mapping[str, Any]] = None) -> TemporalInputs:
    return TemporalInputs(
        outcome_rewards=outcome, kl_rewards=aligned.kl_rewards,
        process_rewards=aligned.folded_token_rewards, values=aligned.values,
        loss_mask=aligned.loss_mask, turn_ids=aligned.turn_ids,
        bootstrap_values=aligned.bootstrap_values, is_truncated=aligned.is_truncated,
        discount=float(config.discount), timestep_unit=config.gae_timestep_unit,
        config=config, meta=meta, old_logprobs=aligned.old_logp, data=data)
