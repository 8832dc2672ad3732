"""Checks of the rollout batch at the pipeline's boundary (SPEC §1), before any arithmetic.

:func:`validate_batch` returns the :class:`BatchFacts` every later step needs. Errors
name the batch key, what was expected and what was given; nothing here modifies the
caller's tensors.
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Optional

import torch
from torch import Tensor

from lightning_adv.config import ActorConfig
from lightning_adv.batch.grouping import BatchMeta
from lightning_adv._checks import warn_caller
from lightning_adv.exceptions import LogProbRangeWarning, UnknownBatchKeyWarning
from lightning_adv.stages.registry import STAGES

REQUIRED_KEYS = ("input_ids", "attention_mask", "loss_mask", "logprobs", "rewards")
TOKEN_FLOAT_KEYS = ("logprobs", "values", "ref_logp", "prox_logp", "token_rewards",
                    "turn_rewards", "mopd_teacher_logp_sum", "entropies")
#: Integer [B, T] keys, token-aligned: the turn of each generated token, the anchor
#: state it was generated from (GiGPO's step groups), its reasoning step (``vine``), and
#: the tree node it belongs to (the tree estimators).
TOKEN_ID_KEYS = ("turn_ids", "anchor_state_ids", "step_ids", "tree_node_ids")
MASK_KEYS = ("attention_mask", "loss_mask")
#: Log-probabilities: at most 0 (plus :data:`LOGP_TOLERANCE`) where they are read.
LOGP_KEYS = ("logprobs", "ref_logp", "prox_logp")
#: A log-prob computed as ``logit - logsumexp(logits)`` in float32 (a sampler's, or one
#: reduced across tensor-parallel shards) can round a few ulps of the logit above 0: about
#: 1e-5 for logits up to 100. 1e-3 leaves two orders of magnitude for that, and no
#: probability or logit array passes (a probability of 1.001 is not a rounding error).
LOGP_TOLERANCE = 1e-3
#: Entropies (``-sum p log p``, never negative) computed in float32 as
#: ``logsumexp - sum(p * logit)`` can round a few ulps below 0 for a near-certain token;
#: anything further below 0 is not an entropy.
ENTROPY_TOLERANCE = 1e-4
#: Every key the pipeline reads or writes (SPEC §1 and §5). Other keys pass through; one
#: that is a near miss of an absent known key is reported (:class:`UnknownBatchKeyWarning`).
KNOWN_KEYS = REQUIRED_KEYS + ("values", "ref_logp", "prox_logp", "turn_ids", "token_rewards",
                              "is_truncated", "mopd_teacher_logp_sum", "advantages", "returns",
                              "tot_rewards", "kl_rewards", "input_token_loss_mask",
                              "mopd_behavior_logprobs", "unnormalized_advantages",
                              # read by some stages (register_stage(requires=...)), or written
                              "reward_baselines", "sum_pi_squared", "rollout_is_weights",
                              "anchor_state_ids", "turn_rewards", "unscorable", "entropies",
                              "step_ids", "mc_returns", "tree_node_ids", "tree_ids",
                              # off-policy: the sampler's log-probs, the version that sampled
                              "rollout_logprobs", "policy_version")
#: How alike a key must be to a known key to count as a misspelling of it
#: (``difflib.SequenceMatcher.ratio``: ``ref_logprobs`` ~ ``ref_logp`` is 0.8).
NEAR_MISS_CUTOFF = 0.75


def present(batch: Mapping[str, Any], key: str) -> bool:
    return batch.get(key) is not None


@dataclass(frozen=True)
class BatchFacts:
    """Facts about a validated batch that every later step needs."""

    batch_size: int
    width: int
    device: torch.device
    seqlens: Optional[Tensor]
    """[B] long: attended tokens per row"""
    is_truncated: Optional[Tensor]
    """[B] bool: explicit ``is_truncated`` if given, else ``seqlen == T``"""
    aligned_loss_mask: Optional[Tensor]
    """[B, T] float32 0/1: the loss mask moved to the next-token convention (position t
    is 1 when token t+1 was generated); a new tensor"""


def _fail(key: str, expected: str, got: Any, exc: type[Exception] = ValueError) -> NoReturn:
    raise exc(f"rollout batch '{key}': expected {expected}, got {got}")


def _shape(x: Any) -> Any:
    return list(x.shape) if isinstance(x, Tensor) else type(x).__name__


def _check_finite(key: str, x: Tensor) -> None:
    """Raise naming the first NaN or Inf entry of ``x``, if any. A finite sum clears the
    tensor in one cheap reduction (a NaN or Inf entry makes the sum non-finite);
    ``isfinite`` over [B, T] costs ten times more on a CPU, so it runs only to name the
    entry (or to clear a sum that overflowed)."""
    if math.isfinite(float(x.sum())):
        return
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        index = tuple(bad.nonzero()[0].tolist())
        _fail(key, "finite values", f"{int(bad.sum())} NaN/Inf entries (first at {index}: "
              f"{x[index].item()})")


def aligned_loss_mask(loss: Tensor) -> Tensor:
    """The loss mask moved to the next-token convention, as a new float32 tensor:
    ``torch.roll(loss, -1, dims=1)`` (column 0, never generated, wraps to the end)."""
    return torch.roll(loss, -1, 1).float()


def _check_masks(attention: Tensor, loss: Tensor) -> None:
    """The mask rules of SPEC §1, in the order their messages are promised: both masks
    0/1, the attention mask right-padded, generated tokens only where attended, and
    column 0 (a prompt token nothing predicts) never generated."""
    for key, x in (("attention_mask", attention), ("loss_mask", loss)):
        if x.dtype != torch.bool and not bool(((x == 0) | (x == 1)).all()):
            _fail(key, "only 0 and 1", f"values {torch.unique(x)[:6].tolist()}")
    on = attention.bool()
    gaps = (on[:, 1:] & ~on[:, :-1]).any(dim=1)
    if bool(gaps.any()):
        _fail("attention_mask", "right padding only (1 on the first seqlen positions, then 0)",
              f"gaps in rows {gaps.nonzero().flatten().tolist()[:10]}")
    generated = loss.bool()
    outside = (generated & ~on).any(dim=1)
    if bool(outside.any()):
        _fail("loss_mask", "generated tokens only where attention_mask is 1",
              f"generated tokens on padding in rows {outside.nonzero().flatten().tolist()[:10]}")
    if bool(generated[:, 0].any()):
        _fail("loss_mask", "0 in column 0 (the first token is a prompt token; nothing predicts "
              "it)", f"1 in rows {generated[:, 0].nonzero().flatten().tolist()[:10]}")


def _check_required(batch: Any) -> tuple[int, int, torch.device]:
    """The batch is a mapping with the required keys and a [B, T] ``input_ids``."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"rollout batch: expected a dict of tensors, got {type(batch).__name__}")
    missing = [k for k in REQUIRED_KEYS if not present(batch, k)]
    if missing:
        others = [k for k in batch if isinstance(k, str) and k not in KNOWN_KEYS]
        hints = [f"{close[0]!r} for {k!r}" for k in missing
                 if (close := difflib.get_close_matches(k, others, 1, NEAR_MISS_CUTOFF))]
        hint = f"; the batch has {', '.join(hints)}: a misspelt key?" if hints else ""
        raise ValueError(f"rollout batch has no {', '.join(repr(k) for k in missing)} "
                         f"(required: {', '.join(REQUIRED_KEYS)}){hint}")
    ids = batch["input_ids"]
    if not isinstance(ids, Tensor) or ids.ndim != 2:
        _fail("input_ids", "a [B, T] tensor", _shape(ids))
    bs, width = ids.shape
    if bs < 1 or width < 2:
        _fail("input_ids", "at least one row and two columns (a prompt token and a generated "
              "token)", list(ids.shape))
    return bs, width, ids.device


def _check_token_tensor(key: str, x: Any, bs: int, width: int, device: torch.device) -> None:
    """A [B, T] mask, float or turn-id tensor on the batch's device (values are checked by
    :func:`validate_batch`'s combined transfer)."""
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
    elif x.is_complex():
        _fail(key, "a real tensor", x.dtype)
    elif key in TOKEN_ID_KEYS and x.is_floating_point() and not bool((x == x.round()).all()):
        # Float ids (legacy data) are compared for equality when folding process
        # rewards; a NaN or fractional id would silently split or merge turns.
        _fail(key, "integer values (an integer dtype is best)", "NaN or fractional ids")


def _check_rewards(rewards: Any, bs: int, device: torch.device) -> None:
    if not isinstance(rewards, Tensor) or tuple(rewards.shape) != (bs,):
        _fail("rewards", f"a tensor of shape [{bs}] (one outcome reward per row)", _shape(rewards))
    if rewards.device != device:
        _fail("rewards", f"a tensor on {device}", rewards.device)
    if rewards.dtype == torch.bool or rewards.is_complex():
        _fail("rewards", "a float or integer tensor (convert booleans with .float())", rewards.dtype)
    if rewards.is_floating_point():
        _check_finite("rewards", rewards)


def _check_mc_returns(returns: Any, bs: int, device: torch.device) -> None:
    """``[B, S, K]`` floats: K continuation returns from the state before each of a row's S
    steps (``vine``). NaN marks a continuation that is not there; which slots must hold
    numbers depends on the steps, checked by the stage."""
    layout = f"a float tensor of shape [{bs}, S, K] (K returns per step slot, NaN where none)"
    if not isinstance(returns, Tensor) or returns.ndim != 3 or returns.shape[0] != bs:
        _fail("mc_returns", layout, _shape(returns))
    if returns.shape[1] < 1 or returns.shape[2] < 1:
        _fail("mc_returns", f"{layout}, S and K at least 1", list(returns.shape))
    if not returns.is_floating_point():
        _fail("mc_returns", layout, returns.dtype)
    if returns.device != device:
        _fail("mc_returns", f"a tensor on {device} (input_ids' device)", returns.device)
    infinite = torch.isinf(returns)
    if bool(infinite.any()):
        index = tuple(infinite.nonzero()[0].tolist())
        _fail("mc_returns", "finite returns or NaN", f"{int(infinite.sum())} infinite entries "
              f"(first at {index}: {returns[index].item()})")


def _truncation(truncated: Any, seqlens: Optional[Tensor], bs: int, width: int,
                device: torch.device) -> Optional[Tensor]:
    """[B] bool: the explicit ``is_truncated`` (checked), else the legacy ``seqlen == T``
    (None without seqlens)."""
    if truncated is None:
        return None if seqlens is None else seqlens == width
    if not isinstance(truncated, Tensor):
        _fail("is_truncated", f"a bool tensor of shape [{bs}]", type(truncated).__name__,
              TypeError)
    if tuple(truncated.shape) != (bs,):
        _fail("is_truncated", f"shape [{bs}]", list(truncated.shape))
    if truncated.device != device:
        _fail("is_truncated", f"a tensor on {device}", truncated.device)
    if truncated.is_floating_point() or truncated.is_complex():
        _fail("is_truncated", "a bool or integer tensor", truncated.dtype)
    if truncated.dtype != torch.bool:
        low, high = torch.stack(torch.aminmax(truncated)).tolist()
        if not (low >= 0 and high <= 1):
            _fail("is_truncated", "only 0 and 1", f"values {torch.unique(truncated)[:6].tolist()}")
    return truncated.bool()


def _check_meta(meta: Optional[BatchMeta], bs: int) -> None:
    if meta is None:
        return
    if not isinstance(meta, BatchMeta):
        raise TypeError(f"meta: expected a BatchMeta (from concat_batch) or None, got "
                        f"{type(meta).__name__}")
    if meta.batch_size != bs:
        raise ValueError(f"meta.traj_group_sizes: {meta.traj_group_sizes} sum to "
                         f"{meta.batch_size} rows, but the rollout batch has {bs}")


def validate_batch(batch: Any, meta: Optional[BatchMeta],
                   config: Optional[ActorConfig] = None) -> BatchFacts:
    """Check the batch and meta against SPEC §1 before any arithmetic touches them.

    ``config`` says what to do about ``ref_logp``/``prox_logp`` above 0
    (``positive_ref_prox_logp``; default: warn).
    """
    bs, width, device = _check_required(batch)
    for key in MASK_KEYS + TOKEN_FLOAT_KEYS + TOKEN_ID_KEYS:
        if present(batch, key):
            _check_token_tensor(key, batch[key], bs, width, device)
    seqlens, aligned_loss_mask = _check_values(batch, config)
    _check_rewards(batch["rewards"], bs, device)
    if present(batch, "mc_returns"):
        _check_mc_returns(batch["mc_returns"], bs, device)
    truncated = _truncation(batch.get("is_truncated"), seqlens, bs, width, device)
    _check_meta(meta, bs)
    _report_near_miss_keys(batch)
    return BatchFacts(bs, width, device, seqlens, truncated, aligned_loss_mask)


def _check_values(batch: Mapping[str, Any],
                  config: Optional[ActorConfig]) -> tuple[Tensor, Tensor]:
    """The ``[B, T]`` value checks; returns seqlens and the aligned float32 loss mask."""
    for key in TOKEN_FLOAT_KEYS:
        if present(batch, key):
            _check_finite(key, batch[key])
    attention, loss = batch["attention_mask"], batch["loss_mask"]
    _check_masks(attention, loss)
    aligned = aligned_loss_mask(loss)
    if present(batch, "entropies"):
        _check_entropies(batch["entropies"])
    for key in LOGP_KEYS:
        if present(batch, key):
            action = "raise" if key == "logprobs" else (
                config.positive_ref_prox_logp if config is not None else "warn")
            # logprobs are token-aligned, ref_logp/prox_logp next-token aligned
            _check_logp_range(key, batch[key], loss if key == "logprobs" else aligned, action)
    return attention.bool().sum(dim=1), aligned


def _check_entropies(x: Tensor) -> None:
    """Entropies are not negative (beyond :data:`ENTROPY_TOLERANCE` of rounding) anywhere:
    a negative one is a log-prob or a signed quantity passed under the wrong key."""
    bad = x < -ENTROPY_TOLERANCE
    if bool(bad.any()):
        index = tuple(bad.nonzero()[0].tolist())
        _fail("entropies", f"non-negative values (entropies, up to {ENTROPY_TOLERANCE} of "
              f"rounding below 0)", f"{int(bad.sum())} negative entries (first at {index}: "
              f"{x[index].item():.4g}); were log-probs passed?")


def _check_logp_range(key: str, x: Tensor, read: Tensor, action: str) -> None:
    """Log-probs above :data:`LOGP_TOLERANCE` where the pipeline reads them (``read``, 0/1
    in ``x``'s alignment): the generated tokens for the token-aligned ``logprobs``, the
    positions predicting a generated token for the next-token ``ref_logp``/``prox_logp``.
    Elsewhere anything finite is allowed (masked out, as in the legacy code)."""
    if action == "ignore":
        return
    active = read.bool()
    bad = active & (x > LOGP_TOLERANCE)
    if not bool(bad.any()):
        return
    index = tuple(bad.nonzero()[0].tolist())
    where = "generated tokens" if key == "logprobs" else "positions predicting a generated token"
    count = int(bad.sum())
    message = (f"rollout batch '{key}': expected log-probabilities (<= 0, up to {LOGP_TOLERANCE} "
               f"of rounding) at {where}, got {count} value{'s' * (count != 1)} above that "
               f"(first at {index}: {x[index].item():.4g}); were probabilities or logits passed?")
    if key == "logprobs":
        raise ValueError(message)
    message += " (set actor.positive_ref_prox_logp to 'raise' or 'ignore')"
    if action == "raise":
        raise ValueError(message)
    warn_caller(message, LogProbRangeWarning)


@functools.lru_cache(maxsize=256)
def _near_misses(key: str) -> tuple[str, ...]:
    return tuple(difflib.get_close_matches(key, KNOWN_KEYS, 3, NEAR_MISS_CUTOFF))


def _report_near_miss_keys(batch: Mapping[str, Any]) -> None:
    """Warn about keys the pipeline does not read that look like a misspelt absent key
    (``ref_logprobs`` for ``ref_logp``). Other extra keys are the caller's own and pass
    through silently; a key whose closest known key is present is taken as the caller's own
    too (``old_logprobs`` beside ``logprobs``, although ``rollout_logprobs`` is also close)."""
    hints = []
    for key in batch:
        if not isinstance(key, str) or key in KNOWN_KEYS:
            continue
        close = _near_misses(key)
        if close and not present(batch, close[0]):
            hints.append(f"{key!r} (did you mean {close[0]!r}?)")
    if hints:
        warn_caller(f"rollout batch: {', '.join(hints)} {'is' if len(hints) == 1 else 'are'} "
                    f"not read by the pipeline and passed through unchanged",
                    UnknownBatchKeyWarning)


def reference_logp_problem(batch: Mapping[str, Any], config: ActorConfig,
                           kl_coef: float) -> Optional[str]:
    """The complaint when the KL penalty is on (``kl_coef``, this call's coefficient) but
    the batch has no ``ref_logp`` (the KL is then taken against log-prob 0, as in the
    legacy code); None when all is well."""
    if kl_coef == 0 or present(batch, "ref_logp") or config.missing_ref_logp == "ignore":
        return None
    close = [k for k in batch if isinstance(k, str) and k not in KNOWN_KEYS
             and "ref_logp" in _near_misses(k)]
    hint = f" (the batch has {close[0]!r}: a misspelt key?)" if close else ""
    return (f"actor.kl_ctl={kl_coef} but the rollout batch has no 'ref_logp'{hint}: the KL "
            f"penalty is taken against a reference log-prob of 0, which rewards unlikely tokens; "
            f"pass ref_logp, set actor.kl_ctl to 0, or set actor.missing_ref_logp to 'raise' or "
            f"'ignore'")


def unused_process_stage(batch: Mapping[str, Any], config: ActorConfig) -> Optional[str]:
    """The complaint when an explicit process stage that reads ``token_rewards`` (``gvpo``,
    ``process_weighted``: not the default ``additive``) meets a
    batch without ``token_rewards`` (the stage then returns the advantages unchanged)."""
    spec = config.advantage.process_adv_shaping
    entry = None if spec is None else STAGES["process_adv_shaping"].get(spec.implementation)
    # a named stage other than the default one, reading a key the batch lacks
    if entry is None or entry.auto or "token_rewards" not in entry.reads \
            or present(batch, "token_rewards"):
        return None
    return (f"actor.advantage.process_adv_shaping: {spec.implementation!r} is ignored: the "
            f"rollout batch has no 'token_rewards', so advantages are returned unshaped")
