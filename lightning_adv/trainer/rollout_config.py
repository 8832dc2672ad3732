"""How a training step's episodes are sampled beyond ``ppo.n_samples`` independent
responses per prompt: ``ppo.dynamic_sampling`` (DAPO), ``ppo.vine`` (VinePPO's Monte Carlo
step values) and ``ppo.tree`` (tree rollouts). Each section is a frozen dataclass that
checks itself, naming the key; :class:`~lightning_adv.trainer.config.PPOConfig` holds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lightning_adv._checks import check_bool, check_choice, check_int, check_number, fail


@dataclass(frozen=True)
class DynamicSamplingConfig:
    """DAPO dynamic sampling of a training step's prompt groups."""

    enabled: bool = False
    """drop prompt groups whose rewards are all equal and sample more prompts"""
    max_rounds: int = 4
    """rounds of sampling per step, the first included; then train on what there is"""

    def __post_init__(self) -> None:
        check_bool("ppo.dynamic_sampling.enabled", self.enabled)
        check_int("ppo.dynamic_sampling.max_rounds", self.max_rounds)


#: where ``ppo.vine`` cuts a response into steps
VINE_BOUNDARIES = ("every_n_tokens", "newline", "low_prob")


@dataclass(frozen=True)
class VineConfig:
    """VinePPO's Monte Carlo step values: continuations sampled from each step boundary of
    every response (the batch keys ``mc_returns`` and ``step_ids`` of estimator ``vine``)."""

    k: int = 4
    """continuations sampled from each step boundary (the state before each step)"""
    boundaries: str = "every_n_tokens"
    """where steps begin: every_n_tokens (every n generated tokens), newline (after each
    token whose text holds a newline) or low_prob (at each token sampled with probability
    below low_prob)"""
    every_n_tokens: int = 4
    """the step length of boundaries every_n_tokens (read by no other rule)"""
    low_prob: Optional[float] = None
    """the probability threshold of boundaries low_prob, in (0, 1) (null otherwise)"""

    def __post_init__(self) -> None:
        check_int("ppo.vine.k", self.k)
        check_choice("ppo.vine.boundaries", self.boundaries, VINE_BOUNDARIES)
        check_int("ppo.vine.every_n_tokens", self.every_n_tokens)
        if self.boundaries == "low_prob":
            check_number("ppo.vine.low_prob", self.low_prob, positive=True, maximum=1.0)
            if self.low_prob == 1.0:
                fail("ppo.vine.low_prob", "a probability in (0, 1)", self.low_prob)
        elif self.low_prob is not None:
            fail("ppo.vine.low_prob", f"null with boundaries {self.boundaries!r} (the threshold "
                 f"of boundaries: low_prob)", self.low_prob)


#: where ``ppo.tree`` branches: after every segment_tokens tokens, or at the most surprising
#: token of each path
TREE_BRANCH_AT = ("fixed", "entropy")


@dataclass(frozen=True)
class TreeConfig:
    """Tree rollouts: each prompt's ``branches ** depth`` responses sampled as a tree of
    segments, every shared prefix sampled once (the batch key ``tree_node_ids`` of the tree
    estimators; docs/guides/trees.md, "Sampling trees in the trainer")."""

    segment_tokens: int = 4
    """branch_at fixed: the tokens of every segment but the last (which runs to the end of
    the response); branch_at entropy: the fewest tokens a segment keeps before a branch"""
    branches: int = 2
    """children of every node that branches"""
    depth: int = 2
    """segments on a root-to-leaf path (1: flat sampling)"""
    branch_at: str = "fixed"
    """fixed: every path branches after each segment_tokens tokens; entropy (TreeRL's
    entropy-guided branching): each path is sampled to its end, then branches before its
    most surprising token (the highest -log p under the temperature-scaled distribution,
    before top-k and top-p; segment_tokens or more into its last segment), the sampled
    continuation kept as one of the branches"""

    def __post_init__(self) -> None:
        check_int("ppo.tree.segment_tokens", self.segment_tokens)
        check_int("ppo.tree.branches", self.branches, minimum=2)
        check_int("ppo.tree.depth", self.depth)
        check_choice("ppo.tree.branch_at", self.branch_at, TREE_BRANCH_AT)

    @property
    def leaves(self) -> int:
        """Responses per prompt when no path ends early."""
        return self.branches ** self.depth
