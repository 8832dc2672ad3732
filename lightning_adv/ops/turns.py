"""The policy turns of next-token-aligned rows: which turn each active position belongs
to, counted from 0 in each row, and where each turn ends.

A turn is the run of active positions (loss mask 1) that share a turn id; positions
with loss mask 0 inside it (a tool output the policy did not write) neither end nor
split it. Without turn ids, a turn is a maximal run of adjacent active positions (a
masked span separates turns: that is what turn ids are for). Turn ids at active
positions must be non-decreasing (``validate_turn_ids``), so "the turn changes" is
"the id is larger than the last active id before it".

Per-turn tables are ``[B, T]``: column k is the row's k-th turn (a row has at most T
turns), 0 past its last turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor


@dataclass(frozen=True)
class TurnSlots:
    """Turn bookkeeping of a ``[B, T]`` aligned loss mask."""

    rank: Tensor
    """[B, T] long: the turn (0, 1, ...) of each active position; -1 elsewhere"""
    counts: Tensor
    """[B] long: turns per row"""
    last: Tensor
    """[B, T] bool: the active position that ends its turn (its turn's last one)"""

    def table(self, values: Tensor) -> Tensor:
        """``[B, T]`` per-turn sums of ``values`` over each turn's active positions (float64)."""
        out = torch.zeros(values.shape, dtype=torch.float64, device=values.device)
        active = self.rank >= 0
        return out.scatter_add_(1, self.rank.clamp(min=0),
                                torch.where(active, values.double(), 0.0))

    def spread(self, per_turn: Tensor) -> Tensor:
        """A per-turn ``[B, T]`` table back on the positions: each active position gets
        its turn's entry, inactive positions 0."""
        got = per_turn.gather(1, self.rank.clamp(min=0))
        return torch.where(self.rank >= 0, got, torch.zeros((), dtype=got.dtype,
                                                           device=got.device))

    def present(self) -> Tensor:
        """``[B, T]`` bool: the turn slots a row has (``k < counts``)."""
        width = self.rank.shape[1]
        return torch.arange(width, device=self.rank.device)[None] < self.counts[:, None]


def turn_slots(loss_mask: Tensor, turn_ids: Optional[Tensor]) -> TurnSlots:
    """The turns of the aligned rows ``loss_mask`` (0/1) with aligned ``turn_ids`` (valid
    at active positions, see the module docstring), or contiguous runs without them."""
    active = loss_mask > 0
    if turn_ids is not None:
        ids = torch.where(active, turn_ids.long(), -1)
        before = torch.nn.functional.pad(ids.cummax(dim=1).values[:, :-1], (1, 0), value=-1)
        starts = active & (ids > before)
    else:
        previous = torch.nn.functional.pad(active[:, :-1], (1, 0), value=False)
        starts = active & ~previous
    rank = starts.long().cumsum(dim=1) - 1
    rank = torch.where(active, rank, -1)
    counts = starts.long().sum(dim=1)
    # The turn of the next active position (after t): a suffix minimum over the active
    # ranks; a position ends its turn when that is another turn (or there is none).
    width = loss_mask.shape[1]
    later = torch.where(active, rank, width).flip(1).cummin(dim=1).values.flip(1)
    next_rank = torch.nn.functional.pad(later[:, 1:], (0, 1), value=width)
    last = active & (next_rank != rank)
    return TurnSlots(rank, counts, last)
