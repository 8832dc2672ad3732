"""Checks of the rollout batch at the pipeline's boundary (SPEC §1), before any arithmetic.

:func:`validate_batch` returns the :class:`BatchFacts` every later step needs. Errors
name the batch key, what was expected and what was given; nothing here modifies the
caller's tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Optional

import torch
from torch import Tensor

from lightning_adv.meta import BatchMeta
from lightning_adv.workspace import scratch

REQUIRED_KEYS = ("input_ids", "attention_mask", "loss_mask", "logprobs", "rewards")
TOKEN_FLOAT_KEYS = ("logprobs", "values", "ref_logp", "prox_logp", "token_rewards",
                    "mopd_teacher_logp_sum")
MASK_KEYS = ("attention_mask", "loss_mask")


def present(batch: Mapping[str, Any], key: str) -> bool:
    return batch.get(key) is not None


@dataclass(frozen=True)
class BatchFacts:
    """Facts about a validated batch that every later step needs."""

    batch_size: int
    width: int
    device: torch.device
    seqlens: Tensor
    """[B] long: attended tokens per row"""
    is_truncated: Tensor
    """[B] bool: explicit ``is_truncated`` if given, else ``seqlen == T``"""
    aligned_loss_mask: Tensor
    """[B, T] float32 0/1: the loss mask moved to the next-token convention (position t
    is 1 when token t+1 was generated); a new tensor"""


def _fail(key: str, expected: str, got: Any, exc: type[Exception] = ValueError) -> NoReturn:
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


def _as_float32(x: Tensor, key: str) -> Tensor:
    """``x`` itself when float32, else a float32 copy in a scratch buffer: one conversion
    pass, after which every check below is a vectorized float32 reduction (on CPU integer
    reductions and comparisons producing bool tensors cost several times more)."""
    if x.dtype == torch.float32:
        return x
    return scratch(x.shape, torch.float32, x.device).copy_(x)


def _check_binary(key: str, x: Tensor, as_float: Tensor) -> None:
    """``x`` holds only 0 and 1; ``as_float`` is ``x`` in float32 (any element order)."""
    if x.dtype == torch.bool:
        return
    if x.dtype == torch.float32 or not x.is_floating_point():
        # Integers convert to 0.0 and 1.0 exactly when they are 0 and 1, so a [0, 1]
        # range decides; a float32 mask must also have no fractions (ceil(x) = x). NaN
        # fails the range check.
        low, high = torch.stack([as_float.amin(), as_float.amax()]).tolist()
        if low >= 0 and high <= 1 and (x.dtype != torch.float32 or x.numel() == 0 or
                                       float(_fractions(key, x).amax()) == 0):
            return
    elif bool(((x == 0) | (x == 1)).all()):  # float64/16: converting could round to 0/1
        return
    _fail(key, "only 0 and 1", f"values {torch.unique(x)[:6].tolist()}")


def _fractions(key: str, x: Tensor) -> Tensor:
    """``ceil(x) - x`` (zero exactly where x is an integer), in a scratch buffer."""
    out = scratch(x.shape, x.dtype, x.device)
    return torch.ceil(x, out=out).sub_(x)


def _mask_structure(attention: Tensor, loss: Tensor) -> tuple[Tensor, Tensor]:
    """Seqlens [B] and the next-token-aligned float32 loss mask (a new tensor: the
    module's ``loss_mask`` output), after checking that both masks are 0/1, that the
    attention mask is right-padded, that generated tokens lie inside it and that column
    0 is not generated.

    Each mask is read once into float32 (the aligned loss mask is that conversion,
    shifted); the checks are float32 row sums, two matrix-vector products and one
    product, exact for integer sums below 2**24. Elementwise boolean tensors are built
    only to name the rows of an error.
    """
    width = attention.shape[1]
    att = _as_float32(attention, "attention_mask")
    aligned = torch.empty(loss.shape, dtype=torch.float32, device=loss.device)
    aligned[:, :-1].copy_(loss[:, 1:])
    aligned[:, -1].copy_(loss[:, 0])  # torch.roll's wrap-around; checked to be 0 below
    _check_binary("attention_mask", attention, att)
    _check_binary("loss_mask", loss, aligned)
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
    product = scratch((loss.shape[0], width - 1), torch.float32, loss.device)
    inside = torch.mul(aligned[:, :-1], att[:, 1:], out=product).sum(dim=1)
    first = aligned[:, -1]
    outside = inside + first * att[:, 0] != aligned.sum(dim=1)
    if bool(outside.any()):
        _fail("loss_mask", "generated tokens only where attention_mask is 1",
              f"generated tokens on padding in rows {outside.nonzero().flatten().tolist()[:10]}")
    if bool(first.any()):
        _fail("loss_mask", "0 in column 0 (the first token is a prompt token; nothing predicts "
              "it)", f"1 in rows {first.nonzero().flatten().tolist()[:10]}")
    return seqlens.long(), aligned


def _check_required(batch: Any) -> tuple[int, int, torch.device]:
    """The batch is a mapping with the required keys and a [B, T] ``input_ids``."""
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
    return bs, width, ids.device


def _check_token_tensor(key: str, x: Any, bs: int, width: int, device: torch.device) -> None:
    """A [B, T] mask, float or turn-id tensor on the batch's device."""
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


def _check_rewards(rewards: Any, bs: int, device: torch.device) -> None:
    if not isinstance(rewards, Tensor) or tuple(rewards.shape) != (bs,):
        _fail("rewards", f"a tensor of shape [{bs}] (one outcome reward per row)", _shape(rewards))
    if rewards.device != device:
        _fail("rewards", f"a tensor on {device}", rewards.device)
    if rewards.dtype == torch.bool or rewards.is_complex():
        _fail("rewards", "a float or integer tensor (convert booleans with .float())", rewards.dtype)
    if rewards.is_floating_point():
        _check_finite("rewards", rewards)


def _truncation(truncated: Any, seqlens: Tensor, bs: int, width: int,
                device: torch.device) -> Tensor:
    """[B] bool: the explicit ``is_truncated`` (checked), else the legacy ``seqlen == T``."""
    if truncated is None:
        return seqlens == width
    if not isinstance(truncated, Tensor):
        _fail("is_truncated", f"a bool tensor of shape [{bs}]", type(truncated).__name__,
              TypeError)
    if tuple(truncated.shape) != (bs,):
        _fail("is_truncated", f"shape [{bs}]", list(truncated.shape))
    if truncated.device != device:
        _fail("is_truncated", f"a tensor on {device}", truncated.device)
    if truncated.is_floating_point() or truncated.is_complex():
        _fail("is_truncated", "a bool or integer tensor", truncated.dtype)
    _check_binary("is_truncated", truncated, truncated.float())
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


def validate_batch(batch: Any, meta: Optional[BatchMeta]) -> BatchFacts:
    """Check the batch and meta against SPEC §1 before any arithmetic touches them."""
    bs, width, device = _check_required(batch)
    for key in MASK_KEYS + TOKEN_FLOAT_KEYS + ("turn_ids",):
        if present(batch, key):
            _check_token_tensor(key, batch[key], bs, width, device)
    seqlens, aligned_loss_mask = _mask_structure(batch["attention_mask"], batch["loss_mask"])
    _check_rewards(batch["rewards"], bs, device)
    truncated = _truncation(batch.get("is_truncated"), seqlens, bs, width, device)
    _check_meta(meta, bs)
    return BatchFacts(bs, width, device, seqlens, truncated, aligned_loss_mask)
