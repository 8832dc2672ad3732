"""Trees in a heatmap: rows that are root-to-leaf paths of trees of segments (the batch
key ``tree_node_ids``, docs/guides/trees.md), read for
:func:`~lightning_adv.visualize.advantage_heatmap`.

Node ids are compared between rows of one ``tree_groups`` key (a prompt group: node ids
are scoped by prompt group), and the rows of a group are consecutive. A row's tokens up to
the end of its last node that an earlier row of its group passes were drawn there: they
are left empty, so the row's first own segment starts at the column (and wrapped line)
where it branches off. A shared token is coloured by the mean of the advantages that the
rows through its node give it: what the loss's sum over those rows gives the token,
divided by their count. The checks are the batch contract's
(:func:`~lightning_adv.ops.trees.tree_paths`), plus -1 on every token not generated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_adv._checks import fail
from lightning_adv.ops.trees import node_means, tree_paths


@dataclass(frozen=True)
class RowTree:
    """How one row of a tree is drawn."""

    advantages: list[float]
    """the row's advantages, each shared token's the mean over the rows through its node"""
    drawn_before: int
    """positions before this one were drawn by an earlier row of the group: left empty"""
    segment_starts: set[int]
    """positions where one of the row's own segments starts (its first token excluded)"""
    first_of_group: bool


def read_trees(node_ids: list[list[float]], groups: Any, generated: list[list[bool]],
               tokens: list[list[str]], advantages: list[list[float]]) -> list[RowTree]:
    """Each row's :class:`RowTree` (module docstring); ``node_ids``, ``generated``,
    ``tokens`` and ``advantages`` per row, token-aligned, as long as the row's tokens."""
    keys = _group_keys(groups, len(tokens))
    for b, (ids, gen) in enumerate(zip(node_ids, generated)):
        for i, (v, g) in enumerate(zip(ids, gen)):
            if (g and not (math.isfinite(v) and v == int(v))) or (not g and v != -1):
                fail(f"advantage_heatmap tree_node_ids[{b}]", "an integer node id on every "
                     "generated token and -1 on every other token", f"{v} at position {i}")
    width = max(len(row) for row in tokens)
    node = torch.full((len(tokens), width), -1, dtype=torch.long)
    mask = torch.zeros(len(tokens), width, dtype=torch.bool)
    text_ids = torch.zeros(len(tokens), width, dtype=torch.long)
    values = torch.zeros(len(tokens), width, dtype=torch.float64)
    vocabulary: dict[str, int] = {}
    for b, row in enumerate(tokens):
        n = len(row)
        node[b, :n] = torch.tensor([int(v) for v in node_ids[b]], dtype=torch.long)
        mask[b, :n] = torch.tensor(generated[b], dtype=torch.bool)
        text_ids[b, :n] = torch.tensor([vocabulary.setdefault(t, len(vocabulary)) for t in row],
                                       dtype=torch.long)
        values[b, :n] = torch.tensor(advantages[b], dtype=torch.float64)
    paths = tree_paths(node, mask, text_ids, torch.tensor(keys, dtype=torch.long),
                       where="advantage_heatmap", key="tree_node_ids")
    means = torch.where(mask, node_means(paths, values), values).tolist()
    seen: set[int] = set()
    out = []
    for b, (row, nodes) in enumerate(zip(tokens, paths.token_node.tolist())):
        drawn_before, starts = _segments(nodes[: len(row)], seen)
        out.append(RowTree(means[b][: len(row)], drawn_before, starts,
                           b == 0 or keys[b] != keys[b - 1]))
    return out


def _segments(nodes: list[int], seen: set[int]) -> tuple[int, set[int]]:
    """A row's end of what earlier rows drew (the position after the last token of a node
    in ``seen``) and the starts of its own segments after its first token; adds its nodes
    to ``seen``."""
    drawn_before, starts, previous = 0, set(), None
    for i, n in enumerate(nodes):
        if n < 0:
            continue
        if n in seen:
            drawn_before = i + 1
        elif previous is not None and n != previous:
            starts.add(i)
        previous = n
    seen.update(n for n in nodes if n >= 0)
    return drawn_before, starts


def _group_keys(groups: Any, rows: int) -> list[int]:
    """``groups`` checked (one int or str per row, the rows of each group consecutive),
    numbered 0, 1, ... in order."""
    if isinstance(groups, torch.Tensor):
        groups = groups.tolist()
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence) \
            or len(groups) != rows:
        fail("advantage_heatmap tree_groups", f"one group (an int or str) per row ({rows}), "
             "given with tree_node_ids", groups)
    bad = [g for g in groups if isinstance(g, bool) or not isinstance(g, (int, str))]
    if bad:
        fail("advantage_heatmap tree_groups", "an int or str per row", bad[0])
    keys: dict[Any, int] = {}
    for b, group in enumerate(groups):
        if group in keys and groups[b - 1] != group:
            fail("advantage_heatmap tree_groups", "the rows of each group consecutive",
                 f"group {group!r} again at row {b}")
        keys.setdefault(group, len(keys))
    return [keys[g] for g in groups]
