"""Per-token losses reduced to one number, as verl's ``agg_loss``, with token and sequence
counts that stay global under torch.distributed (see :class:`TokenCounts`)."""

from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                  "seq-mean-token-sum-norm")
#: Not a user-selectable mode: the mean over every row of the minibatch, empty ones
#: included (verl's ``geo_mean`` loss takes ``torch.mean`` of its per-sequence losses).
ROW_MEAN = "row-mean"


class TokenCounts:
    """Active tokens, non-empty sequences and rows of a minibatch, local and over all ranks.

    ``scale`` is the world size (1 outside torch.distributed): DDP averages gradients over
    ranks, so a loss divided by global counts and multiplied by it has the gradient of
    the loss over the global batch.
    """

    def __init__(self, mask: Tensor, sync: bool):
        self.row_tokens = mask.sum(1)
        local = torch.stack([self.row_tokens.sum(), (self.row_tokens > 0).sum().to(mask.dtype),
                             torch.tensor(float(mask.shape[0]), dtype=mask.dtype, device=mask.device)])
        self.local_tokens = local[0]
        self.scale = 1
        if sync and dist.is_available() and dist.is_initialized():
            local = local.clone()
            dist.all_reduce(local)  # one collective for all counts
            self.scale = dist.get_world_size()
        self.tokens, self.sequences, self.rows = local[0], local[1], local[2]
        self.parts: dict[str, TokenCounts] = {}
        """the counts of other loss parts' masks (``ce``: the cross-entropy tokens)"""

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
    - ``token-sum``: sum over all active tokens (no normalizer);
    - ``seq-mean-token-sum``: per-sequence token sums, averaged over sequences that have
      an active token;
    - ``seq-mean-token-mean``: per-sequence token means, averaged likewise;
    - ``seq-mean-token-sum-norm``: per-sequence token sums averaged over sequences that
      have an active token, divided by ``loss_scale_factor`` (Dr.GRPO's
      ``1/(G * max_tokens)``; verl 0.9.1's ``agg_loss``, TRL's ``dr_grpo``);
    - :data:`ROW_MEAN` (internal): per-sequence token sums averaged over *all* rows.
    """
    # where, not a product: a masked position holding inf or NaN must not reach the sum
    masked = torch.where(mask > 0, values, 0.0)
    if mode == "token-mean":
        # The trainer's operation order (sum, then times world / count), kept so the two
        # agree to the last bit.
        return masked.sum() * (counts.scale / counts.tokens.clamp(min=1.0))
    if mode == "token-sum":
        return masked.sum() * counts.scale
    if mode == "seq-mean-token-sum":
        return masked.sum() * (counts.scale / counts.sequences.clamp(min=1.0))
    if mode == "seq-mean-token-mean":
        per_sequence = masked.sum(1) / counts.row_tokens.clamp(min=1.0)
        return per_sequence.sum() * (counts.scale / counts.sequences.clamp(min=1.0))
    if mode == "seq-mean-token-sum-norm":
        return masked.sum() * (counts.scale / (counts.sequences.clamp(min=1.0) * loss_scale_factor))
    if mode == ROW_MEAN:
        return masked.sum() * (counts.scale / counts.rows.clamp(min=1.0))
    raise ValueError(f"loss_agg_mode: expected one of {LOSS_AGG_MODES}, got {mode!r}")


def masked_mean(values: Tensor, mask: Tensor, count: Tensor) -> Tensor:
    """Local token mean for the diagnostics (0 when the minibatch has no active token)."""
    return (torch.where(mask > 0, values, 0.0).sum() / count.clamp(min=1.0)).detach()
