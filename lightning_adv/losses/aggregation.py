"""Per-token losses reduced to one number, as verl's ``agg_loss``, with token and sequence
counts that stay global under torch.distributed (see :class:`TokenCounts`)."""

from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


class TokenCounts:
    """Active tokens and non-empty sequences of a minibatch, local and over all ranks.

    ``scale`` is the world size (1 outside torch.distributed): DDP averages gradients over
    ranks, so a loss divided by global counts and multiplied by it has the gradient of
    the loss over the global batch.
    """

    def __init__(self, mask: Tensor, sync: bool):
        self.row_tokens = mask.sum(1)
        local = torch.stack([self.row_tokens.sum(), (self.row_tokens > 0).sum().to(mask.dtype)])
        self.local_tokens = local[0]
        self.scale = 1
        if sync and dist.is_available() and dist.is_initialized():
            local = local.clone()
            dist.all_reduce(local)  # one collective for both counts
            self.scale = dist.get_world_size()
        self.tokens, self.sequences = local[0], local[1]

    def part(self, mask: Tensor) -> "TokenCounts":
        """The counts of one micro-batch ``mask`` of this minibatch: its own rows and
        local tokens, the minibatch's (global) totals as the normalizers."""
        part = copy.copy(self)
        part.row_tokens = mask.sum(1)
        part.local_tokens = part.row_tokens.sum()
        return part


def aggregate(values: Tensor, mask: Tensor, mode: str, counts: TokenCounts,
              loss_scale_factor: Optional[float] = None) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar as verl's ``agg_loss``, with counts
    global under DDP (see :class:`TokenCounts`).

    - ``token-mean``: sum over all active tokens / active tokens;
    - ``seq-mean-token-sum``: per-sequence token sums, averaged over sequences that have
      an active token;
    - ``seq-mean-token-mean``: per-sequence token means, averaged likewise;
    - ``seq-mean-token-sum-norm``: sum over all active tokens / ``loss_scale_factor``
      (Dr.GRPO's constant; no division by the number of sequences, as verl).
    """
    # where, not a product: a masked position holding inf or NaN must not reach the sum
    masked = torch.where(mask > 0, values, 0.0)
    if mode == "token-mean":
        # The trainer's operation order (sum, then times world / count), kept so the two
        # agree to the last bit.
        return masked.sum() * (counts.scale / counts.tokens.clamp(min=1.0))
    if mode == "seq-mean-token-sum":
        return masked.sum() * (counts.scale / counts.sequences.clamp(min=1.0))
    if mode == "seq-mean-token-mean":
        per_sequence = masked.sum(1) / counts.row_tokens.clamp(min=1.0)
        return per_sequence.sum() * (counts.scale / counts.sequences.clamp(min=1.0))
    if mode == "seq-mean-token-sum-norm":
        return masked.sum() * (counts.scale / loss_scale_factor)
    raise ValueError(f"loss_agg_mode: expected one of {LOSS_AGG_MODES}, got {mode!r}")


def masked_mean(values: Tensor, mask: Tensor, count: Tensor) -> Tensor:
    """Local token mean for the diagnostics (0 when the minibatch has no active token)."""
    return (torch.where(mask > 0, values, 0.0).sum() / count.clamp(min=1.0)).detach()
