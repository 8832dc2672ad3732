"""Tree rollouts sampled by the built-in trainer (``ppo.tree``): each prompt's responses
are the root-to-leaf paths of a tree of segments, every shared prefix sampled once; the
batch key ``tree_node_ids`` that the tree estimators (``tree_grpo``, ``treepo``,
``treerl``) read (docs/guides/trees.md).

- ``branch_at: fixed`` (TreePO, Tree-GRPO): ``branches`` samples of the prompt, each cut
  after ``segment_tokens`` tokens; every path that has not ended branches there into
  ``branches`` continuations, and so on for ``depth`` segments, the last running to the
  response's end (or the token limit).
- ``branch_at: entropy`` (TreeRL's entropy-guided branching): ``branches`` whole responses;
  then, ``depth - 1`` times, every path branches before its most surprising token (the
  highest ``-log p`` under the temperature-scaled distribution, before top-k and top-p:
  a one-sample estimate of the entropy there, with no second pass) at least ``segment_tokens`` into its last segment, keeping
  its own continuation as one branch and sampling ``branches - 1`` more from there.

Every branch continues its parent's tokens through
:attr:`~lightning_adv.trainer.policies.base.GenerationRequest.prefixes` (each policy reads
that prefix once for all its continuations, the KV cache shared). A path that ends (EOS,
a stop string or the token limit) before its last segment is a leaf there, so a group
can have fewer than ``branches ** depth`` rows. The rows keep the log-probs their tokens
were sampled with, the shared ones from the call that sampled them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from lightning_adv.trainer.config import PPOConfig, TreeConfig
from lightning_adv.trainer.policies.base import GenerationRequest, Policy
from lightning_adv.trainer.rollout.recipe_inputs import check_sampled_key, check_single_turn
from lightning_adv.trainer.tasks.episode import Episode
from lightning_adv.trainer.tasks.runtime import TaskRuntime


@dataclass
class _Path:
    """A root-to-node path of one prompt's tree: the episode that ends there, the tree node
    of each of its generated tokens, and where its last segment starts."""

    slot: int
    """its prompt's position in the request"""
    episode: Episode
    nodes: list[int]
    segment_start: int

    @property
    def generated(self) -> list[int]:
        return [t for t, g in zip(self.episode.tokens, self.episode.generated) if g]


class _Tree:
    """The paths of every prompt's tree, with a node counter per prompt."""

    def __init__(self, n_prompts: int):
        self.next_node = [0] * n_prompts
        self.leaves: list[list[_Path]] = [[] for _ in range(n_prompts)]

    def new_node(self, slot: int) -> int:
        self.next_node[slot] += 1
        return self.next_node[slot] - 1

    def branch(self, parent: _Path, episode: Episode, cut: int) -> _Path:
        """The path through ``parent``'s first ``cut`` generated tokens and on with the
        tokens ``episode`` sampled from there (a new node), with the parent's log-probs
        on the shared tokens."""
        _carry_logprobs(parent.episode, episode, cut)
        new = sum(episode.generated) - cut
        return _Path(parent.slot, episode, parent.nodes[:cut] + [self.new_node(parent.slot)] * new,
                     cut)


def _carry_logprobs(source: Episode, target: Episode, n: int) -> None:
    """Copy the log-probs of ``source``'s first ``n`` generated tokens onto ``target``'s
    (which holds them as a prefix, log-prob 0: not sampled by its call)."""
    src = [i for i, g in enumerate(source.generated) if g][:n]
    dst = [i for i, g in enumerate(target.generated) if g][:n]
    for i, j in zip(src, dst):
        target.logprobs[j] = source.logprobs[i]
        target.rollout_logprobs[j] = source.rollout_logprobs[i]


def _root_paths(tree: _Tree, groups: Sequence[Sequence[Episode]]) -> list[_Path]:
    return [_Path(slot, ep, [tree.new_node(slot)] * sum(ep.generated), 0)
            for slot, group in enumerate(groups) for ep in group]


def _continue(policy: Policy, runtime: TaskRuntime, request: GenerationRequest,
              cuts: Sequence[tuple[_Path, int]], n: int, limit: int,
              gen: torch.Generator) -> list[list[Episode]]:
    """``n`` continuations of each path from its first ``cut`` generated tokens, in one
    call (none without a path: ``ppo.tree`` is refused under FSDP2, whose generate would
    be a collective every rank must join)."""
    if not cuts:
        return []
    return policy.generate(runtime, replace(
        request, indices=[path.episode.index for path, _ in cuts], n_samples=n,
        max_new_tokens=limit, last_values=False,
        prefixes=[path.generated[:cut] for path, cut in cuts]), gen)


def _fixed(policy: Policy, runtime: TaskRuntime, request: GenerationRequest,
           config: TreeConfig, tree: _Tree, gen: torch.Generator) -> None:
    limit = request.max_new_tokens
    frontier: list[_Path] = []
    for level in range(config.depth):
        last = level == config.depth - 1
        cap = limit if last else min(limit, (level + 1) * config.segment_tokens)
        if level == 0:
            frontier = _root_paths(tree, policy.generate(runtime, replace(
                request, n_samples=config.branches, max_new_tokens=cap, last_values=False), gen))
        else:
            cuts = [(path, len(path.nodes)) for path in frontier]
            grown = _continue(policy, runtime, request, cuts, config.branches, cap, gen)
            frontier = [tree.branch(path, ep, cut) for (path, cut), group in zip(cuts, grown)
                        for ep in group]
        growing = []
        for path in frontier:
            ended = not path.episode.truncated or len(path.nodes) >= limit
            (tree.leaves[path.slot] if ended or last else growing).append(path)
        frontier = growing


def _most_surprising(path: _Path, min_tokens: int) -> int:
    """The offset of the generated token with the highest -log-prob at least
    ``min_tokens`` into the path's last segment (-1: none, the segment is too short);
    the earliest of equals."""
    logprobs = [lp for lp, g in zip(path.episode.logprobs, path.episode.generated) if g]
    candidates = range(path.segment_start + min_tokens, len(logprobs))
    return min(candidates, key=lambda i: (logprobs[i], i), default=-1)


def _entropy(policy: Policy, runtime: TaskRuntime, request: GenerationRequest,
             config: TreeConfig, tree: _Tree, gen: torch.Generator) -> None:
    paths = _root_paths(tree, policy.generate(runtime, replace(
        request, n_samples=config.branches, last_values=False), gen))
    for _ in range(config.depth - 1):
        cuts = [(path, _most_surprising(path, config.segment_tokens)) for path in paths]
        for path, cut in cuts:
            if cut < 0:  # too short to branch: a leaf above the last level
                tree.leaves[path.slot].append(path)
        cuts = [(path, cut) for path, cut in cuts if cut >= 0]
        grown = _continue(policy, runtime, request, cuts, config.branches - 1,
                          request.max_new_tokens, gen)
        paths = []
        for (path, cut), group in zip(cuts, grown):
            kept = _Path(path.slot, path.episode, path.nodes[:cut] + [tree.new_node(path.slot)]
                         * (len(path.nodes) - cut), cut)
            paths += [kept] + [tree.branch(path, ep, cut) for ep in group]
    for path in paths:
        tree.leaves[path.slot].append(path)


@torch.no_grad()
def sample_tree(policy: Policy, runtime: TaskRuntime, request: GenerationRequest,
                config: TreeConfig, gen: torch.Generator) -> list[list[Episode]]:
    """Each prompt of ``request`` (whose ``n_samples`` is ignored) sampled as a tree under
    ``config``: one list of leaf episodes per prompt, in the order of their paths, each
    with its ``tree_node_ids`` and ``shared_tokens``."""
    tree = _Tree(len(request.indices))
    (_fixed if config.branch_at == "fixed" else _entropy)(policy, runtime, request, config,
                                                          tree, gen)
    groups = []
    for leaves in tree.leaves:
        leaves.sort(key=lambda path: path.nodes)
        counted: set[int] = set()
        for path in leaves:
            ep = path.episode
            nodes = iter(path.nodes)
            ep.tree_node_ids = [next(nodes) if g else -1 for g in ep.generated]
            ep.shared_tokens = sum(1 for node in path.nodes if node in counted)
            counted.update(path.nodes)
            ep.values = None  # read again by the scoring pass: a prefix's are not sampled
        groups.append([path.episode for path in leaves])
    return groups


def check_tree_options(needs: frozenset[str], ppo: PPOConfig, runtime: TaskRuntime) -> None:
    """``ppo.tree`` is set exactly when a stage reads ``tree_node_ids`` (a tree estimator),
    on a single-turn task."""
    check_sampled_key(needs, "tree_node_ids", "ppo.tree", ppo.tree is not None,
                      readers="a tree estimator: tree_grpo, treepo or treerl",
                      example="{segment_tokens: 2, branches: 2, depth: 2} with ppo.n_samples: 4",
                      unread="set actor.advantage.estimator to tree_grpo, treepo or treerl, "
                             "or ppo.tree: null")
    if ppo.tree is not None:
        check_single_turn("ppo.tree", runtime, "a tree branches")
