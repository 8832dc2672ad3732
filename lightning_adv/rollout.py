"""The rollout batch at the pipeline's boundary: validation, length penalty and alignment.

Everything here produces new tensors; the caller's batch is never modified (SPEC §9).
Errors name the batch key, what was expected and what was given.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.config import ActorConfig
from lightning_adv.contracts import TemporalInputs
from lightning_adv.meta import BatchMeta

REQUIRED_KEYS = ("input_ids", "attention_mask", "loss_mask", "logprobs", "rewards")
TOKEN_FLOAT_KEYS = ("logprobs", "values", "ref_logp", "prox_logp", "token_rewards",
                    "mopd_teacher_logp_sum")
MASK_KEYS = ("attention_mask", "loss_mask")


class DroppedOutcomeRewardWarning(UserWarning):
    """An outcome reward landed on an inactive position and never reaches GAE (SPEC §9)."""


def shift_left(x: Tensor) -> Tensor:
    """Token-aligned -> next-token-aligned, exactly as ``torch.roll(x, -1, dims=-1)``."""
    return torch.roll(x, shifts=-1, dims=-1)


def present(batch: Mapping[str, Any], key: str) -> bool:
    return batch.get(key) is not None


@dataclass(frozen=True)
class RolloutInfo:
    """Facts about a validated batch that every later step needs."""

    batch_size: int
    width: int
    device: torch.device
    seqlens: Tensor
    """[B] long: attended tokens per row"""
    is_truncated: Tensor
    """[B] bool: explicit ``is_truncated`` if given, else ``seqlen == T``"""
    loss_mask: Tensor
    """[B, T] float32 0/1: the token-aligned loss mask"""


def _fail(key: str, expected: str, got: Any, exc: type[Exception] = ValueError) -> None:
    raise exc(f"rollout batch '{key}': expected {expected}, got {got}")


def _shape(x: Any) -> Any:
    return list(x.shape) if isinstance(x, Tensor) else type(x).__name__


def _check_finite(key: str, x: Tensor) -> None:
    # Fast path: a NaN or Inf element makes the sum non-finite, so a finite sum clears the
    # tensor with one reduction (isfinite over [B, T] costs ten times more). A non-finite
    # sum (a bad element, or an overflow) falls through to the exact check.
    if bool(torch.isfinite(x.sum())):
        return
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        index = tuple(bad.nonzero()[0].tolist())
        _fail(key, "finite values", f"{int(bad.sum())} NaN/Inf entries (first at {index}: "
              f"{x[index].item()})")


def _check_binary(key: str, x: Tensor) -> None:
    if x.dtype == torch.bool:
        return
    if not x.is_floating_point() and not x.is_complex():
        # Integers are 0/1 exactly when they lie in [0, 1]: one min/max pass.
        low, high = torch.aminmax(x)
        if bool((low >= 0) & (high <= 1)):
            return
    if not bool(((x == 0) | (x == 1)).all()):
        _fail(key, "only 0 and 1", f"values {torch.unique(x)[:6].tolist()}")


def _mask_structure(attention: Tensor, loss: Tensor) -> tuple[Tensor, Tensor]:
    """Seqlens [B] and the float token-aligned loss mask, once the masks are known to be 0/1.

    Checks that the attention mask is right-padded, that generated tokens lie inside it and
    that column 0 is not generated. The common (valid) case is decided with row sums and
    one small matrix product in float32, exact for integer sums below 2**24: elementwise
    boolean tensors over [B, T] cost several times more. They are built only to name the
    rows of an error.
    """
    width = attention.shape[1]
    att, active = attention.float(), loss.float()
    seqlens = att.sum(dim=1)
    # The s ones of a row sit at positions 0..s-1 exactly when their positions sum to
    # s(s-1)/2; positions split as 64*hi + lo keep every partial sum exact in float32.
    right_padded = False
    if width <= 32768:
        pos = torch.arange(width, device=att.device)
        # two matrix-vector products: a [T, 2] matrix would take a much slower GEMM path
        weighted = (att @ (pos // 64).float()).double() * 64 + (att @ (pos % 64).float()).double()
        s = seqlens.double()
        right_padded = bool((weighted == s * (s - 1) / 2).all())
    if not right_padded:
        on = attention.bool()
        gaps = (on[:, 1:] & ~on[:, :-1]).any(dim=1)
        if bool(gaps.any()):
            _fail("attention_mask", "right padding only (1 on the first seqlen positions, then 0)",
                  f"gaps in rows {gaps.nonzero().flatten().tolist()[:10]}")
    outside = (active * att).sum(dim=1) != active.sum(dim=1)
    if bool(outside.any()):
        _fail("loss_mask", "generated tokens only where attention_mask is 1",
              f"generated tokens on padding in rows {outside.nonzero().flatten().tolist()[:10]}")
    if bool(active[:, 0].any()):
        _fail("loss_mask", "0 in column 0 (the first token is a prompt token; nothing predicts "
              "it)", f"1 in rows {active[:, 0].nonzero().flatten().tolist()[:10]}")
    return seqlens.long(), active


def validate_batch(batch: Any, meta: Optional[BatchMeta], config: ActorConfig) -> RolloutInfo:
    """Check the batch and meta against SPEC §1 before any arithmetic touches them."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"rollout batch: expected a dict of tensors, got {type(batch).__name__}")
    missing = [k for k in REQUIRED_KEYS if not present(batch, k)]
    if missing:
        raise ValueError(f"rollout batch has no {', '.join(repr(k) for k in missing)} "
                         f"(required: {', '.join(REQUIRED_KEYS)})")
    ids = batch["input_ids"]
    if not isinstance(ids, Tensor) or ids.ndim != 2:
        _fail("input_ids", "a [B, T] tensor", _shape(ids))
    bs, width = ids.shape
    if bs < 1 or width < 2:
        _fail("input_ids", "at least one row and two columns (a prompt token and a generated "
              "token)", list(ids.shape))
    device = ids.device

    for key in MASK_KEYS + TOKEN_FLOAT_KEYS + ("turn_ids",):
        if not present(batch, key):
            continue
        x = batch[key]
        if not isinstance(x, Tensor):
            _fail(key, f"a tensor of shape [{bs}, {width}]", type(x).__name__)
        if tuple(x.shape) != (bs, width):
            _fail(key, f"shape [{bs}, {width}] (the padded sequence shape of input_ids)",
                  list(x.shape))
        if x.device != device:
            _fail(key, f"a tensor on {device} (input_ids' device)", x.device)
        if key in TOKEN_FLOAT_KEYS:
            if not x.is_floating_point():
                _fail(key, "a floating-point tensor", x.dtype)
            _check_finite(key, x)
        elif x.is_complex():
            _fail(key, "a real tensor", x.dtype)
        elif key == "turn_ids" and x.is_floating_point() and not bool((x == x.round()).all()):
            # Float ids (legacy data) are compared for equality when folding process
            # rewards; a NaN or fractional id would silently split or merge turns.
            _fail(key, "integer values (an integer dtype is best)", "NaN or fractional ids")
    for key in MASK_KEYS:
        _check_binary(key, batch[key])

    seqlens, loss_mask = _mask_structure(batch["attention_mask"], batch["loss_mask"])

    rewards = batch["rewards"]
    if not isinstance(rewards, Tensor) or tuple(rewards.shape) != (bs,):
        _fail("rewards", f"a tensor of shape [{bs}] (one outcome reward per row)", _shape(rewards))
    if rewards.device != device:
        _fail("rewards", f"a tensor on {device}", rewards.device)
    if rewards.dtype == torch.bool or rewards.is_complex():
        _fail("rewards", "a float or integer tensor (convert booleans with .float())", rewards.dtype)
    if rewards.is_floating_point():
        _check_finite("rewards", rewards)

    truncated = batch.get("is_truncated")
    if truncated is None:
        truncated = seqlens == width
    else:
        if not isinstance(truncated, Tensor):
            _fail("is_truncated", f"a bool tensor of shape [{bs}]", type(truncated).__name__,
                  TypeError)
        if tuple(truncated.shape) != (bs,):
            _fail("is_truncated", f"shape [{bs}]", list(truncated.shape))
        if truncated.device != device:
            _fail("is_truncated", f"a tensor on {device}", truncated.device)
        if truncated.is_floating_point() or truncated.is_complex():
            _fail("is_truncated", "a bool or integer tensor", truncated.dtype)
        _check_binary("is_truncated", truncated)
        truncated = truncated.bool()

    if meta is not None:
        if not isinstance(meta, BatchMeta):
            raise TypeError(f"meta: expected a BatchMeta (from concat_batch) or None, got "
                            f"{type(meta).__name__}")
        if meta.batch_size != bs:
            raise ValueError(f"meta.traj_group_sizes: {meta.traj_group_sizes} sum to "
                             f"{meta.batch_size} rows, but the rollout batch has {bs}")
    return RolloutInfo(bs, width, device, seqlens, truncated, loss_mask)


def apply_length_penalty(rewards: Tensor, loss_mask: Tensor, config: ActorConfig) -> Tensor:
    """DAPO overlong penalty: ``min(-(len - (max_new_tokens - overlong_tokens)) / overlong_tokens
    * factor, 0)`` added to a copy of the rewards (float32, not clamped below ``-factor``).

    Integer rewards stay integer when no row is penalized; otherwise they become float
    instead of failing as the legacy in-place add did.
    """
    if not config.overlong_reward_penalty:
        return rewards
    lengths = loss_mask.bool().sum(dim=1)
    exceed = lengths - (config.max_new_tokens - config.overlong_tokens)
    penalty = ((-exceed).float() / config.overlong_tokens * config.overlong_penalty_factor)
    penalized = penalty <= 0
    if not rewards.is_floating_point():
        if not bool(penalized.any()):
            return rewards.clone()
        rewards = rewards.float()
    return rewards + torch.where(penalized, penalty, torch.zeros_like(penalty)).to(rewards.dtype)


def kl_penalty(old: Tensor, ref: Tensor, kl_ctl: float, estimator: str) -> Tensor:
    """``-kl_ctl * clamp(k(old, ref), -10, 10)`` with Schulman's k1/k2/k3 estimators."""
    if kl_ctl == 0:
        return torch.zeros_like(old, dtype=torch.float32)
    d = old.float() - ref.float()  # a new tensor: the steps below work in place on it
    if estimator == "k2":
        d.square_().div_(2.0)
    elif estimator == "k3":
        log_ratio = d.neg_()
        d = log_ratio.exp().sub_(1).sub_(log_ratio)
    return d.clamp_(min=-10, max=10).mul_(-kl_ctl)


@dataclass(frozen=True)
class AlignedBatch:
    """The batch moved to the next-token convention, with KL and process rewards ready."""

    loss_mask: Tensor
    """[B, T] float 0/1"""
    turn_ids: Optional[Tensor]
    old_logp: Tensor
    ref_logp: Tensor
    prox_logp: Optional[Tensor]
    """the ``prox_logp`` output, or None to pass the input through (decoupled loss)"""
    mopd_behavior_logprobs: Optional[Tensor]
    kl_rewards: Tensor
    folded_token_rewards: Optional[Tensor]
    direct_token_rewards: Optional[Tensor]
    values: Tensor
    bootstrap_values: Tensor
    is_truncated: Tensor
    info: RolloutInfo


def align_batch(batch: Mapping[str, Any], info: RolloutInfo, config: ActorConfig,
                turn_ids_needed_by: Optional[str] = None) -> AlignedBatch:
    """SPEC §3 steps 4, 5, 6 (KL) and 7: aligned masks, log-probs, KL and process rewards.

    ``turn_ids_needed_by`` names the stage that needs ``turn_ids`` (for the error message).
    """
    rows = torch.arange(info.batch_size, device=info.device)
    mask = shift_left(info.loss_mask)
    turn_ids = None
    if present(batch, "turn_ids"):
        turn_ids = shift_left(batch["turn_ids"])
        turn_ids[:, -1] = -1
    elif turn_ids_needed_by is not None:
        raise ValueError(f"{turn_ids_needed_by}: rollout batch has no 'turn_ids' (turn GAE needs "
                         f"the turn index of every generated token, -1 elsewhere)")

    logprobs = batch["logprobs"]
    mopd = shift_left(logprobs).detach() * mask if present(batch, "mopd_teacher_logp_sum") else None
    if config.recompute_logprob and not config.use_decoupled_loss:
        if not present(batch, "prox_logp"):
            raise ValueError("rollout batch 'prox_logp': actor.recompute_logprob=true (and no "
                             "decoupled loss) uses the recomputed prox_logp as old log-probs, but "
                             "the batch has none; compute it before the advantages")
        old = batch["prox_logp"] * mask
    else:
        old = shift_left(logprobs).mul_(mask)
    prox = None if config.use_decoupled_loss else old
    ref = batch["ref_logp"] * mask if present(batch, "ref_logp") else torch.zeros_like(old)

    # The legacy code zeroes the KL at each row's last valid position before GAE. Both
    # log-probs are masked there (the position after the last token is never active, and
    # column 0 is never generated), so the KL is already 0 and the same tensor serves.
    kl = kl_penalty(old, ref, config.kl_ctl, config.kl_estimator)
    last_valid = (info.seqlens - 1).clamp(min=0)

    folded = direct = None
    if present(batch, "token_rewards"):
        token_rewards = batch["token_rewards"].float()
        if config.mask_no_eos_with_zero:
            token_rewards = torch.where(info.is_truncated[:, None], 0.0, token_rewards)
        shifted = shift_left(token_rewards)
        if config.token_rewards_as_adv:
            direct = shifted * mask
        else:
            folded = _fold_turn_rewards(token_rewards, shifted, batch, mask, turn_ids)

    values = batch["values"].float() if present(batch, "values") else torch.zeros_like(mask)
    bootstrap = values[rows, last_valid]
    return AlignedBatch(mask, turn_ids, old, ref, prox, mopd, kl, folded, direct,
                        values, bootstrap, info.is_truncated, info)


def _fold_turn_rewards(token_rewards: Tensor, shifted: Tensor, batch: Mapping[str, Any],
                       mask: Tensor, turn_ids: Optional[Tensor]) -> Tensor:
    """Each turn's (uniform) process reward, once, at the turn's last predicting position."""
    raw_active = batch["loss_mask"].bool()
    same_turn = raw_active[:, :-1] & raw_active[:, 1:]
    if present(batch, "turn_ids"):
        raw_turns = batch["turn_ids"]
        same_turn = same_turn & (raw_turns[:, :-1] == raw_turns[:, 1:])
    uneven = same_turn & (token_rewards[:, :-1] != token_rewards[:, 1:])
    if bool(uneven.any()):
        rows = uneven.any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"rollout batch 'token_rewards': actor.token_rewards_as_adv=false folds one "
                         f"process reward per turn into GAE, so token rewards must be uniform within "
                         f"each turn; rows {rows[:10]} change value inside a turn")
    continues = torch.zeros_like(mask)
    continues[:, :-1] = mask[:, 1:]
    if turn_ids is not None:
        continues[:, :-1] *= (turn_ids[:, :-1] == turn_ids[:, 1:]).float()
    return shifted * mask * (1 - continues)


def place_outcome(scores: Tensor, aligned: AlignedBatch, config: ActorConfig) -> Tensor:
    """Outcome score at ``max(seqlen - 2, 0)`` (the position predicting the last token)."""
    info = aligned.info
    rows = torch.arange(info.batch_size, device=info.device)
    position = (info.seqlens - 2).clamp(min=0)
    scores = scores.float()
    if config.mask_no_eos_with_zero:
        scores = torch.where(info.is_truncated, torch.zeros_like(scores), scores)
    outcome = torch.zeros_like(aligned.loss_mask)
    outcome[rows, position] = scores
    if config.dropped_outcome_reward != "ignore":
        dropped = aligned.loss_mask[rows, position] == 0
        if config.mask_no_eos_with_zero:
            dropped &= ~info.is_truncated
        if bool(dropped.any()):
            dropped_rows = dropped.nonzero().flatten().tolist()
            message = (f"outcome rewards of rows {dropped_rows[:20]}"
                       f"{' ...' if len(dropped_rows) > 20 else ''} land on an inactive position "
                       f"(the row ends with non-generated tokens or has no generated token) and do "
                       f"not reach GAE; set actor.dropped_outcome_reward to 'ignore' or 'raise'")
            if config.dropped_outcome_reward == "raise":
                raise ValueError(message)
            warnings.warn(message, DroppedOutcomeRewardWarning, stacklevel=3)
    return outcome


def temporal_inputs(aligned: AlignedBatch, outcome: Tensor, config: ActorConfig,
                    meta: Optional[BatchMeta]) -> TemporalInputs:
    return TemporalInputs(
        outcome_rewards=outcome, kl_rewards=aligned.kl_rewards,
        process_rewards=aligned.folded_token_rewards, values=aligned.values,
        loss_mask=aligned.loss_mask, turn_ids=aligned.turn_ids,
        bootstrap_values=aligned.bootstrap_values, is_truncated=aligned.is_truncated,
        discount=float(config.discount), timestep_unit=config.gae_timestep_unit,
        config=config, meta=meta)
