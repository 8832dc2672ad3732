"""Critic-free estimators over tree-structured rollouts: each row is one root-to-leaf
path of a tree of segments sampled from its prompt, described by ``tree_node_ids``
(and ``tree_ids``; the contract is in :mod:`lightning_adv.ops.trees` and
docs/guides/trees.md).

A row's reward is everything that lands on it (the outcome score, folded process
rewards). Every generated token of the row gets the row's advantage, except in
``treerl`` (each node's tokens get the node's credit) and ``tree_grpo``'s per-token
form; the token KL penalty, if any, is added to each token's
advantage after the estimate, as in the turn estimators.

- ``tree_grpo``: Tree-GRPO's group normalisation within the prompt group (inter-tree)
  and within the row's tree (intra-tree), summed or applied one after the other.
- ``treepo``: TreePO's baselines at every depth: the prompt group's mean and the mean
  of each subtree the row passes, combined by subtree size or averaged.
- ``treerl``: TreeRL's node values (the mean leave-one-out leaf reward below a node),
  each node's tokens credited with its value's change from its parent's, plus its value.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_adv._checks import check_bool, check_choice, positive_number
from lightning_adv.ops.trees import TreePaths, tree_paths
from lightning_adv.stages.estimators import check_one_row_per_rollout
from lightning_adv.stages.registry import register_stage
from lightning_adv.stages.types import TemporalInputs, TemporalResult, required_key

_TREE_GRPO_COMBINE = ("sum", "sequential", "per_token")
_TREEPO_WEIGHTING = ("group_size", "average")
_TREERL_NORM = ("token", "step", "none")


def _choice(choices: tuple):
    def check(key, value):
        check_choice(key, value, choices)
    return check


def tree_rows(inputs: TemporalInputs, where: str) -> tuple[TreePaths, Tensor]:
    """The checked trees of the batch and each row's prompt group."""
    check_one_row_per_rollout(inputs, where, "each row is one root-to-leaf path")
    node_ids = required_key(inputs, "tree_node_ids", where,
                            "[B, T] integers, token-aligned like turn_ids: on each generated "
                            "token, the id of the tree node it was generated in; "
                            "docs/guides/trees.md")
    data = inputs.data
    row_group = inputs.meta.index(inputs.loss_mask.device).traj_of_row
    paths = tree_paths(node_ids, data["loss_mask"], data["input_ids"], row_group,
                       data.get("tree_ids"), where)
    return paths, row_group


def row_rewards(inputs: TemporalInputs) -> Tensor:
    """[B] float64: everything that lands on the row (outcome and folded process rewards)."""
    rewards = inputs.outcome_rewards.double()
    if inputs.process_rewards is not None:
        rewards = rewards + inputs.process_rewards.double()
    return rewards.sum(dim=1)


def _sums(values: Tensor, keys: Tensor, n: int) -> Tensor:
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, keys, values)


def _shrunk_rows(inputs: TemporalInputs, row_group: Tensor) -> Tensor:
    shrunk = torch.tensor(inputs.meta.shrunk_to_one, dtype=torch.bool, device=row_group.device)
    return shrunk[row_group]


def tree_result(inputs: TemporalInputs, row_group: Tensor, advantages: Tensor,
                returns: Tensor) -> TemporalResult:
    """Per-row (``[B]``) or per-token (``[B, T]``) advantages and per-row returns on the
    row's generated positions, KL added; a group that exclusion of unscorable rows shrank
    to one row gets advantage 0, as every group stage."""
    mask = inputs.loss_mask.double()
    if advantages.ndim == 1:
        advantages = advantages[:, None] * mask
    advantages = torch.where(_shrunk_rows(inputs, row_group)[:, None], 0.0, advantages * mask)
    rewards = inputs.outcome_rewards
    if inputs.process_rewards is not None:
        rewards = rewards + inputs.process_rewards
    return TemporalResult(advantages.float() + inputs.kl_rewards,
                          (returns[:, None] * mask).float(), rewards + inputs.kl_rewards)


def grpo_normalized(values: Tensor, keys: Tensor, eps: float) -> Tensor:
    """Tree-GRPO's (and verl's) GRPO normalisation of ``values`` within each key:
    ``(x - mean) / (std + eps)``, unbiased std; a key of one member has mean 0 and std 1
    (its value passes through, divided by ``1 + eps``)."""
    keys = torch.unique(keys, return_inverse=True)[1]
    n = int(keys.max()) + 1 if keys.numel() else 0
    count = _sums(torch.ones_like(values), keys, n)
    mean = _sums(values, keys, n) / count
    var = _sums((values - mean[keys]) ** 2, keys, n) / (count - 1).clamp(min=1)
    single = count[keys] == 1
    mean = torch.where(single, 0.0, mean[keys])
    std = torch.where(single, 1.0, var.sqrt()[keys])
    return (values - mean) / (std + eps)


def _token_pool_normalized(values: Tensor, active: Tensor, row_keys: Tensor,
                           eps: float) -> Tensor:
    """Tree-GRPO's per-token GRPO: every generated token's reward normalized by the mean
    and unbiased std of the rewards of all generated tokens of the rows sharing its key;
    a pool of one token has mean the token's own reward and std 1."""
    keys = row_keys[:, None].expand_as(values)[active]
    keys = torch.unique(keys, return_inverse=True)[1]
    pooled = values[active]
    n = int(keys.max()) + 1 if keys.numel() else 0
    count = _sums(torch.ones_like(pooled), keys, n)
    mean = _sums(pooled, keys, n) / count
    var = _sums((pooled - mean[keys]) ** 2, keys, n) / (count - 1).clamp(min=1)
    std = torch.where(count == 1, 1.0, var.sqrt())
    out = torch.zeros_like(values)
    out[active] = (pooled - mean[keys]) / (std[keys] + eps)
    return out


@register_stage("estimator", requires=("tree_node_ids",), reads=("tree_ids",),
                replaces_critic=True, baseline="group", timestep_unit="token",
                kwarg_checks={"combine": _choice(_TREE_GRPO_COMBINE), "eps": positive_number})
def tree_grpo(inputs: TemporalInputs, *, combine: str = "sum", eps: float = 1e-6) -> TemporalResult:
    """Tree-GRPO (Ji et al., 2025, arXiv:2509.21240), as its released code computes it.

    With ``g(x; key) = (x - mean_key x) / (std_key x + eps)`` (unbiased std; a key of one
    row has mean 0 and std 1) over the row rewards ``r``, the prompt group ``p`` (inter-tree)
    and the row's tree ``t`` (intra-tree, ``tree_ids``; one tree per prompt group without
    them): ``combine: sum`` gives ``g(r; p) + g(r; t)`` (their ``adv_estimator: tree``,
    which their training scripts run), ``combine: sequential`` gives ``g(g(r; p); t)``
    (``compute_tree_grpo_outcome_advantage``, ``adv_estimator: tree_2norm``).
    ``combine: per_token`` (``adv_estimator: tree_per_token``) normalizes every
    generated token's reward by the mean and std of the rewards of all generated tokens
    of the rows of the prompt group, plus the same over the tree (a pool of one token
    gives 0). Node ids are checked but only the trees are read.
    """
    where = "estimator 'tree_grpo'"
    paths, row_group = tree_rows(inputs, where)
    rewards = row_rewards(inputs)
    if combine == "per_token":
        active = inputs.loss_mask > 0
        tokens = inputs.outcome_rewards.double()
        if inputs.process_rewards is not None:
            tokens = tokens + inputs.process_rewards.double()
        advantages = (_token_pool_normalized(tokens, active, row_group, eps)
                      + _token_pool_normalized(tokens, active, paths.row_tree, eps))
    elif combine == "sum":
        advantages = grpo_normalized(rewards, row_group, eps) + grpo_normalized(
            rewards, paths.row_tree, eps)
    else:
        advantages = grpo_normalized(grpo_normalized(rewards, row_group, eps), paths.row_tree,
                                     eps)
    return tree_result(inputs, row_group, advantages, rewards)


def _subtree_terms(rewards: Tensor, paths: TreePaths, skip_constant: bool) -> tuple[Tensor, Tensor]:
    """For each row and depth, ``r - mean`` over the rows passing the row's node there
    (its subtree), and the subtree's size; size 0 where the term is left out: past the
    row's leaf, a subtree of one row, and (``skip_constant``) one whose rewards are equal."""
    present = paths.paths >= 0
    nodes = paths.paths.clamp(min=0)
    expanded = rewards[:, None].expand_as(nodes)[present]
    count = _sums(torch.ones_like(expanded), paths.paths[present], paths.n_nodes)
    mean = _sums(expanded, paths.paths[present], paths.n_nodes) / count.clamp(min=1)
    keep = present & (count[nodes] > 1)
    if skip_constant:
        high = torch.full_like(mean, -torch.inf).scatter_reduce(
            0, paths.paths[present], expanded, "amax")
        low = torch.full_like(mean, torch.inf).scatter_reduce(
            0, paths.paths[present], expanded, "amin")
        keep = keep & (high > low)[nodes]
    terms = torch.where(keep, rewards[:, None] - mean[nodes], 0.0)
    return terms, torch.where(keep, count[nodes], 0.0)


@register_stage("estimator", requires=("tree_node_ids",), replaces_critic=True,
                baseline="group", timestep_unit="token",
                kwarg_checks={"weighting": _choice(_TREEPO_WEIGHTING),
                              "skip_constant_subtrees": check_bool})
def treepo(inputs: TemporalInputs, *, weighting: str = "group_size",
           skip_constant_subtrees: bool = False) -> TemporalResult:
    """TreePO (Li et al., 2025, arXiv:2508.17445), as its released
    ``compute_tree_reinforce_plus_plus_baseline_outcome_advantage`` computes it before
    its whitening: ``A = sum_d w_d (r - mean_d)`` over the row's baselines ``mean_d``: the
    prompt group's mean reward (0 for a group of one row) and the mean reward of each
    subtree the row passes (the rows through its node at that depth) that holds another
    row; ``w_d`` is the baseline's row count over the sum of the counts (``weighting:
    group_size``, their default) or ``1 / number of baselines`` (``average``, their
    training script's setting). ``skip_constant_subtrees`` (their
    ``remove_no_std_subgroup``) leaves out subtrees whose rewards are all equal. TreePO
    then whitens over the batch's tokens: the ``treepo`` recipe's ``adv_norm``.
    """
    where = "estimator 'treepo'"
    paths, row_group = tree_rows(inputs, where)
    rewards = row_rewards(inputs)
    n_groups = int(row_group.max()) + 1
    count = _sums(torch.ones_like(rewards), row_group, n_groups)[row_group]
    mean = torch.where(count > 1, _sums(rewards, row_group, n_groups)[row_group] / count, 0.0)
    terms, sizes = _subtree_terms(rewards, paths, skip_constant_subtrees)
    terms = torch.cat([(rewards - mean)[:, None], terms], dim=1)
    sizes = torch.cat([count[:, None], sizes], dim=1)
    if weighting == "group_size":
        advantages = (terms * sizes).sum(dim=1) / sizes.sum(dim=1)
    else:
        advantages = terms.sum(dim=1) / (sizes > 0).sum(dim=1)
    return tree_result(inputs, row_group, advantages, rewards)


def _treerl_values(rewards: Tensor, paths: TreePaths, row_group: Tensor, tokens: Tensor,
                   norm: str) -> tuple[Tensor, Tensor]:
    """Each node's value ``V = mean of r' below it - m`` and each group's root value,
    ``r'`` the leave-one-out leaf rewards and ``m`` the group's mean of ``r'`` over its
    nodes' tokens (``token``), over its nodes and root (``step``), or 0 (``none``)."""
    n_groups = int(row_group.max()) + 1
    count = _sums(torch.ones_like(rewards), row_group, n_groups)
    total = _sums(rewards, row_group, n_groups)
    centred = rewards - (total[row_group] - rewards) / (count[row_group] - 1).clamp(min=1)
    present = paths.paths >= 0
    nodes = paths.paths[present]
    below = _sums(centred[:, None].expand_as(paths.paths)[present], nodes, paths.n_nodes)
    leaves = _sums(torch.ones_like(below)[nodes], nodes, paths.n_nodes)
    if norm == "none":
        mean = torch.zeros_like(total)
    else:   # a row's weight: its tokens, or its nodes plus the root (which TreeRL counts)
        weights = tokens if norm == "token" else (paths.lengths + 1).double()
        mean = _sums(centred * weights, row_group, n_groups) / _sums(weights, row_group, n_groups)
    node_group = torch.zeros(paths.n_nodes, dtype=torch.long, device=rewards.device)
    node_group[nodes] = row_group[:, None].expand_as(paths.paths)[present]
    values = below / leaves.clamp(min=1) - mean[node_group]
    return values, _sums(centred, row_group, n_groups) / count - mean


def _treerl_credit(values: Tensor, root: Tensor, paths: TreePaths, row_group: Tensor,
                   state_value: bool) -> Tensor:
    """[B, D] each node's credit on each row: ``V(node) - V(parent)``, where that is
    below 1e-8 in size (below the first node) the credit of the node before it, then
    ``+ V(node)`` with ``state_value``."""
    present = paths.paths >= 0
    own = torch.where(present, values[paths.paths.clamp(min=0)], 0.0)
    above = torch.cat([root[row_group][:, None], own[:, :-1]], dim=1)
    credit = own - above
    for depth in range(1, credit.shape[1]):   # TreeRL's fill_in_paths, node by node
        inherit = present[:, depth] & (credit[:, depth].abs() < 1e-8)
        credit[:, depth] = torch.where(inherit, credit[:, depth - 1], credit[:, depth])
    if state_value:
        credit = credit + own
    return torch.where(present, credit, 0.0)


@register_stage("estimator", requires=("tree_node_ids",), replaces_critic=True,
                baseline="group", timestep_unit="token",
                kwarg_checks={"overall_norm": _choice(_TREERL_NORM), "state_value": check_bool})
def treerl(inputs: TemporalInputs, *, overall_norm: str = "token",
           state_value: bool = True) -> TemporalResult:
    """TreeRL (Hou et al., ACL 2025, "TreeRL: LLM Reinforcement Learning with On-Policy
    Tree Search"), as its released ``leaf_normalize``
    and ``gather_paths`` compute it over every leaf (``use_all_terminals``).

    Leaf rewards are made leave-one-out, ``r'_i = r_i - mean of the other rows of the
    prompt group``; a node's value is ``V(n) = mean of r' over the rows through n - m``,
    ``m`` the group's mean of ``r'`` weighted by each row's generated tokens
    (``overall_norm: token``, theirs by default), by its nodes plus the root (``step``),
    or 0 (``none``); the root's value is ``mean r' - m``. Every token of node n on a row
    gets ``V(n) - V(parent)`` (where that is below 1e-8 in size, below the row's first
    node, the previous node's credit instead, as TreeRL's ``fill_in_paths``), plus
    ``V(n)`` with ``state_value`` (their ``use_state_value_reward``). One prompt group is
    one tree (``tree_ids`` is not read); a group of one row is an error, unless
    exclusion of unscorable rows shrank it to one (advantage 0).
    """
    where = "estimator 'treerl'"
    paths, row_group = tree_rows(inputs, where)
    counts = torch.bincount(row_group)
    single = (counts < 2) & ~torch.tensor(inputs.meta.shrunk_to_one, dtype=torch.bool,
                                          device=counts.device)
    if bool(single.any()):
        groups = single.nonzero().flatten().tolist()[:10]
        raise ValueError(f"{where}: TreeRL's leave-one-out leaf rewards need two or more rows per "
                         f"prompt group; groups {groups} have one")
    rewards = row_rewards(inputs)
    tokens = (paths.token_depth >= 0).sum(dim=1).double()
    values, root = _treerl_values(rewards, paths, row_group, tokens, overall_norm)
    credit = _treerl_credit(values, root, paths, row_group, state_value)
    # the credit of each position's next token's node (next-token alignment)
    depth = torch.roll(paths.token_depth, -1, dims=1)
    advantages = torch.where(depth >= 0, credit.gather(1, depth.clamp(min=0)), 0.0)
    return tree_result(inputs, row_group, advantages, rewards)
