"""Tree-structured rollouts: each row is one root-to-leaf path of a tree of segments
sampled from its prompt (Tree-GRPO, TreePO, TreeRL). This module reads the structure
off the batch and checks it; the estimators live in
:mod:`lightning_adv.stages.tree_estimators`.

The batch contract (docs/guides/trees.md):

- ``tree_node_ids`` [B, T] integers, token-aligned like ``turn_ids``: on every generated
  token (loss mask 1), the id (>= 0) of the tree node (segment) it was generated in.
  Ids are scoped by prompt group. Tokens with loss mask 0 (prompt, tool output, padding)
  are never read. A node's generated tokens are one run of the row's generated tokens
  (a masked span inside it does not split it).
- A row passes its nodes in order; the node before a node is its parent, and the first
  node's parent is the root of the row's tree (the prompt). So a node has the same
  parent, and the same tokens, in every row that passes it: that is what is checked.
- ``tree_ids`` [B] integers >= 0, optional: the tree of each row within its prompt group,
  for methods that sample several trees per prompt (Tree-GRPO); without it each prompt
  group is one tree.
- Each row ends at a leaf: no two rows end at the same node, and no row continues past
  a node where another row ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

KEY = "rollout batch 'tree_node_ids'"


@dataclass(frozen=True)
class TreePaths:
    """The trees of a batch. Nodes are numbered over the batch (0 .. n_nodes - 1)."""

    paths: Tensor
    """[B, D] long: the node at each depth of each row (depth 0 is the root's child),
    -1 past the row's leaf"""
    lengths: Tensor
    """[B] long: nodes per row"""
    parent: Tensor
    """[n_nodes] long: each node's parent node, -1 for a child of its tree's root"""
    row_tree: Tensor
    """[B] long: each row's tree, numbered over the batch"""
    token_node: Tensor
    """[B, T] long, token-aligned: the node of each generated token, -1 elsewhere"""
    token_depth: Tensor
    """[B, T] long, token-aligned: the depth of that node on the row, -1 elsewhere"""
    n_nodes: int


def _fail(where: str, what: str) -> None:
    # ``where`` names the caller and the key: "estimator 'x': rollout batch 'tree_node_ids'"
    raise ValueError(f"{where}: {what}")


def _rows(mask: Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()[:10]


def _runs(ids: Tensor, active: Tensor) -> tuple[Tensor, Tensor]:
    """The first generated token of each run of equal ids among a row's generated tokens,
    and each generated token's run (0, 1, ... in the row; -1 elsewhere)."""
    width = ids.shape[1]
    at = torch.where(active, torch.arange(width, device=ids.device), -1).cummax(dim=1).values
    before = torch.nn.functional.pad(at[:, :-1], (1, 0), value=-1)
    previous = torch.where(before >= 0, ids.gather(1, before.clamp(min=0)), -1)
    starts = active & (ids != previous)
    run = torch.where(active, starts.long().cumsum(dim=1) - 1, -1)
    return starts, run


def _local_paths(ids: Tensor, active: Tensor, where: str) -> tuple[Tensor, Tensor, Tensor]:
    """[B, D] node ids of each row in order (-1 past its end), each row's node count and
    each generated token's position in the row's path."""
    if bool((active & (ids < 0)).any()):
        _fail(where, f"expected an id >= 0 on every generated token, got negative ids in rows "
                     f"{_rows((active & (ids < 0)).any(dim=1))}")
    empty = ~active.any(dim=1)
    if bool(empty.any()):
        _fail(where, f"expected every row to pass at least one node, got rows {_rows(empty)} "
                     f"without a generated token")
    starts, run = _runs(ids, active)
    lengths = starts.sum(dim=1)
    depth = int(lengths.max())
    paths = torch.full((ids.shape[0], depth + 1), -1, dtype=torch.long, device=ids.device)
    paths.scatter_(1, torch.where(starts, run, depth), torch.where(starts, ids, -1))
    paths = paths[:, :depth]
    ordered = paths.sort(dim=1).values
    again = ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any(dim=1)
    if bool(again.any()):
        _fail(where, f"expected each node's generated tokens to be one contiguous run of the "
                     f"row's generated tokens, got rows {_rows(again)} that come back to a node "
                     f"after leaving it")
    return paths, lengths, run


def _numbered(pairs: Tensor) -> tuple[Tensor, int]:
    unique, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    return inverse, unique.shape[0]


@dataclass(frozen=True)
class _NodeNames:
    """How errors name a node: its id as the batch gives it, and its prompt group."""

    local: Tensor
    group: Tensor

    def __call__(self, node: int) -> str:
        return f"node {int(self.local[node])} of prompt group {int(self.group[node])}"


def _parents(global_paths: Tensor, row_tree: Tensor, name: _NodeNames, n_nodes: int,
             where: str) -> Tensor:
    """Each node's parent (-1 - tree for a root's child): the same in every row."""
    present = global_paths >= 0
    above = torch.cat([(-1 - row_tree)[:, None], global_paths[:, :-1]], dim=1)
    nodes, parents = global_paths[present], above[present]
    low = torch.full((n_nodes,), n_nodes, dtype=torch.long, device=global_paths.device)
    low = low.scatter_reduce(0, nodes, parents, "amin")
    high = torch.full_like(low, -n_nodes - 1).scatter_reduce(0, nodes, parents, "amax")
    if bool((low != high).any()):
        node = int((low != high).nonzero()[0])
        rows = (global_paths == node).any(dim=1)
        _fail(where, f"expected each node to have one parent, got {name(node)} "
                     f"after different nodes (or in different trees) in rows {_rows(rows)}")
    return low


def _check_leaves(global_paths: Tensor, lengths: Tensor, n_nodes: int, name: _NodeNames,
                  where: str) -> None:
    leaf = global_paths.gather(1, (lengths - 1)[:, None]).squeeze(1)
    ends = torch.zeros(n_nodes, dtype=torch.long, device=leaf.device).index_add_(
        0, leaf, torch.ones_like(leaf))
    if bool((ends > 1).any()):
        node = int((ends > 1).nonzero()[0])
        _fail(where, f"expected each row to end at its own leaf, got rows {_rows(leaf == node)} "
                     f"all ending at {name(node)}")
    goes_on = global_paths[:, 1:] >= 0
    inner = global_paths[:, :-1][goes_on]
    passed = torch.zeros(n_nodes, dtype=torch.bool, device=leaf.device)
    passed[inner] = True
    if bool(passed[leaf].any()):
        row = int(passed[leaf].nonzero()[0])
        node = int(leaf[row])
        _fail(where, f"expected each row to end at a leaf, got row {row} ending at "
                     f"{name(node)}, which rows "
                     f"{_rows(((global_paths[:, :-1] == node) & goes_on).any(dim=1))} continue "
                     f"past")


def _check_shared_tokens(token_node: Tensor, run: Tensor, global_paths: Tensor,
                         input_ids: Tensor, n_nodes: int, name: _NodeNames, where: str) -> None:
    """Rows passing a node hold the same tokens there (as many, and the same ids)."""
    active = run >= 0
    sizes = torch.zeros(global_paths.shape, dtype=torch.long, device=run.device).scatter_add_(
        1, run.clamp(min=0), active.long())
    present = global_paths >= 0
    nodes = global_paths[present]
    big = torch.iinfo(torch.long).max
    shortest = torch.full((n_nodes,), big, dtype=torch.long, device=run.device).scatter_reduce(
        0, nodes, sizes[present], "amin")
    longest = torch.zeros(n_nodes, dtype=torch.long, device=run.device).scatter_reduce(
        0, nodes, sizes[present], "amax")
    if bool((shortest != longest).any()):
        node = int((shortest != longest).nonzero()[0])
        passing = (global_paths == node).any(dim=1)
        _fail(where, f"expected rows passing {name(node)} to hold the same "
                     f"tokens there, got rows {_rows(passing)} with "
                     f"{sorted(set(sizes[global_paths == node].tolist()))} generated tokens of it")
    offset = _offsets(run)
    table = torch.zeros(n_nodes, int(longest.max()), dtype=input_ids.dtype,
                        device=input_ids.device)
    table[token_node[active], offset[active]] = input_ids[active]
    differ = active & (input_ids != table[token_node.clamp(min=0), offset])
    if bool(differ.any()):
        node = int(token_node[differ][0])
        _fail(where, f"expected rows passing {name(node)} to hold the same "
                     f"tokens there, got different input_ids in rows "
                     f"{_rows((global_paths == node).any(dim=1))}")


def _offsets(run: Tensor) -> Tensor:
    """Each generated token's place in its node (0, 1, ...; 0 elsewhere): the row's
    generated tokens so far minus those before the node's first token."""
    active = run >= 0
    count = active.long().cumsum(dim=1)
    before = torch.nn.functional.pad(run.cummax(dim=1).values[:, :-1], (1, 0), value=-1)
    start = torch.where(active & (run != before), count - 1, 0).cummax(dim=1).values
    return torch.where(active, count - 1 - start, 0)


def node_means(paths: TreePaths, values: Tensor) -> Tensor:
    """``values`` ([B, T], token-aligned) with each generated token's value replaced by the
    mean, over the rows passing its node, of their values at the same place in the node
    (what a sum over those rows gives the token, divided by their count); 0 elsewhere."""
    active = paths.token_node >= 0
    offset = _offsets(paths.token_depth)
    width = int(offset.max()) + 1
    cell = paths.token_node.clamp(min=0) * width + offset
    sums = torch.zeros(paths.n_nodes * width, dtype=torch.float64, device=values.device)
    sums.index_add_(0, cell[active], values.double()[active])
    counts = torch.zeros_like(sums).index_add_(0, cell[active], torch.ones_like(
        values, dtype=torch.float64)[active])
    means = sums[cell] / counts[cell].clamp(min=1)
    return torch.where(active, means, 0.0).to(values.dtype)


def check_tree_ids(tree_ids: Optional[Tensor], row_group: Tensor, where: str) -> Tensor:
    """Each row's tree numbered over the batch: ``tree_ids`` within each prompt group, or
    one tree per group without them."""
    if tree_ids is None:
        return row_group
    key = f"{where}: rollout batch 'tree_ids'"
    if not isinstance(tree_ids, Tensor) or tuple(tree_ids.shape) != tuple(row_group.shape):
        shape = list(tree_ids.shape) if isinstance(tree_ids, Tensor) else type(tree_ids).__name__
        raise ValueError(f"{key}: expected a tensor of shape {list(row_group.shape)} (the tree of "
                         f"each row within its prompt group), got {shape}")
    if tree_ids.device != row_group.device:
        raise ValueError(f"{key}: expected a tensor on {row_group.device}, got {tree_ids.device}")
    if tree_ids.dtype == torch.bool or tree_ids.is_floating_point() or tree_ids.is_complex():
        raise ValueError(f"{key}: expected an integer tensor, got {tree_ids.dtype}")
    if bool((tree_ids < 0).any()):
        raise ValueError(f"{key}: expected ids >= 0, got negative ids in rows "
                         f"{_rows(tree_ids < 0)}")
    return _numbered(torch.stack([row_group, tree_ids.long()], dim=1))[0]


def tree_paths(node_ids: Tensor, loss_mask: Tensor, input_ids: Tensor, row_group: Tensor,
               tree_ids: Optional[Tensor] = None, where: str = "tree", key: str = KEY
               ) -> TreePaths:
    """The checked trees of a batch (module docstring): ``node_ids``, ``loss_mask`` and
    ``input_ids`` token-aligned [B, T]; ``row_group`` [B] each row's prompt group. An
    error names ``where`` and ``key`` (what ``node_ids`` is called there)."""
    active = loss_mask.bool()
    ids = torch.where(active, node_ids.long(), -1)
    row_tree = check_tree_ids(tree_ids, row_group, where)
    where = f"{where}: {key}"
    paths, lengths, run = _local_paths(ids, active, where)
    present = paths >= 0
    group = row_group[:, None].expand_as(paths)
    numbered, n_nodes = _numbered(torch.stack([group[present], paths[present]], dim=1))
    global_paths = torch.full_like(paths, -1)
    global_paths[present] = numbered
    group_of_node = torch.zeros(n_nodes, dtype=torch.long, device=ids.device)
    group_of_node[numbered] = group[present]
    local_of_node = torch.zeros_like(group_of_node)
    local_of_node[numbered] = paths[present]
    name = _NodeNames(local_of_node, group_of_node)
    parent = _parents(global_paths, row_tree, name, n_nodes, where)
    _check_leaves(global_paths, lengths, n_nodes, name, where)
    token_node = torch.where(active, global_paths.gather(1, run.clamp(min=0)), -1)
    _check_shared_tokens(token_node, run, global_paths, input_ids, n_nodes, name, where)
    return TreePaths(global_paths, lengths, parent.clamp(min=-1), row_tree, token_node, run,
                     n_nodes)
