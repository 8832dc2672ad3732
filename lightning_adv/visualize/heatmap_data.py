"""The data of a heatmap: the checked responses the drawing reads, and what it returns
(shared by :mod:`~lightning_adv.visualize.heatmap` and the drawing, which imports
matplotlib)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np



@dataclass(frozen=True)
class Quantity:
    """How one per-token quantity is drawn: the short name beside its strip, its colour map
    (a matplotlib name) and its scale: ``"signed"`` ``[-m, m]`` centred at 0 (a sign
    matters), ``"magnitude"`` ``[0, m]`` (never negative), ``"unit"`` ``[0, 1]`` (a flag);
    ``m`` the largest absolute value shown."""

    short: str
    colour_map: str
    scale: str


#: every quantity a heatmap draws: the advantage (the cells), then the strips in this order
QUANTITIES = {
    "advantage": Quantity("adv", "RdBu", "signed"),
    "process reward": Quantity("prm", "PiYG", "signed"),
    "value": Quantity("value", "BrBG", "signed"),
    "entropy": Quantity("ent", "viridis", "magnitude"),
    "log IS weight": Quantity("log w", "PuOr", "signed"),
    "rejected": Quantity("rej", "Greys", "unit"),
}
#: the strips given by name (``advantage_heatmap(strips=...)``); process rewards and values
#: have arguments of their own
NAMED_STRIPS = ("entropy", "log IS weight", "rejected")


@dataclass(frozen=True)
class TokenCell:
    """Where token ``position`` of input row ``row`` is drawn in :attr:`Heatmap.image`."""

    row: int
    position: int
    box: tuple[int, int, int, int]
    """pixel box ``(x0, y0, x1, y1)`` of the token's coloured cell, ``image[y0:y1, x0:x1]``
    (y down, as in the image array; strips not included)"""
    advantage: Optional[float] = None
    """the advantage its colour shows (a shared tree node's token: the mean over the rows
    through the node); None for a token the policy did not generate"""
    segment_start: bool = False
    """a tree segment starts at the cell (``tree_node_ids``): a mark on its left edge"""


@dataclass(frozen=True)
class Heatmap:
    """A drawn heatmap."""

    figure: Any
    """the ``matplotlib.figure.Figure`` (``figure.savefig("heatmap.svg")``)"""
    image: np.ndarray
    """the figure rendered as an ``[H, W, 3]`` ``uint8`` RGB array"""
    limit: float
    """the advantage colour scale: ``-limit`` is the darkest red, ``+limit`` the darkest blue"""
    cells: tuple[TokenCell, ...]
    """the drawn token cells (generated and environment tokens), in input order; a tree's
    shared tokens only in the first row that passes them"""


@dataclass(frozen=True)
class RowInputs:
    """:func:`~lightning_adv.visualize.advantage_heatmap`'s per-row arguments as given,
    unchecked (see it for each one): one object for the reader that checks them."""

    tokens: Any
    advantages: Any
    loss_mask: Any
    labels: Any = None
    process_rewards: Any = None
    values: Any = None
    turn_ids: Any = None
    strips: Any = None
    tree_node_ids: Any = None
    tree_groups: Any = None


@dataclass(frozen=True)
class Response:
    """One checked input row, token-aligned, cut to its shown positions."""

    label: str
    tokens: list[str]
    advantages: list[float]
    generated: list[bool]
    positions: list[int]
    """the shown positions: from the first generated token to the last token"""
    hidden: int
    """tokens after the shown ones (``max_tokens``)"""
    strips: dict[str, list[float]]
    turn_starts: set[int]
    """positions where a later policy turn starts"""
    drawn_before: int = 0
    """positions before this one are a tree's nodes that an earlier row drew: left empty"""
    segment_starts: set[int] = field(default_factory=set)
    """positions where one of the row's own tree segments starts"""
    new_tree: bool = False
    """the row starts a tree group other than the row above's: a line above it"""
