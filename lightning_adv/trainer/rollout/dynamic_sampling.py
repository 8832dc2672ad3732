"""DAPO's dynamic sampling: a training step keeps only prompt groups whose rewards are not
all equal (a group of equal rewards has no group-relative signal) and samples more
prompts until the step's share of groups carry signal (Yu et al., 2025, DAPO,
arXiv:2503.14476).

``ppo.dynamic_sampling: {enabled: true, max_rounds: N}``: round 1 samples the loader's
prompts; each further round samples the prompts still missing divided by the share of
groups kept so far (at most the step's share), drawn from the prompt pool by a generator
seeded by (seed, step, rank), so a run is reproducible and every rank fills its own
share. After N rounds the step trains on what it has: the groups with signal,
topped up with filtered groups (in sampling order) to the step's size, and warns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_adv.trainer.config import DynamicSamplingConfig  # noqa: F401 -- its old home




@dataclass
class DynamicSamplingResult:
    """The groups to train on and what it took to find them."""

    groups: list[Any]
    first_round: list[Any]
    """the groups of round 1 (the loader's prompts): an unbiased sample of the policy"""
    rounds: int
    sampled: int
    """groups sampled over all rounds"""
    filtered: int
    """sampled groups whose rewards were all equal"""
    short: bool = False
    """the rounds ran out before the step's share of groups carried signal"""
    topped_up: list[Any] = field(default_factory=list)

    @property
    def filtered_fraction(self) -> float:
        return self.filtered / self.sampled if self.sampled else 0.0


def has_signal(group: Sequence[Any]) -> bool:
    """The group's scored rewards are not all equal (DAPO keeps groups with std > 0).
    Unscorable episodes (NaN, ``actor.unscorable_rewards: exclude``) are left out, as the
    advantage module leaves them out of the group: NaN != NaN must not count as a spread."""
    return len({ep.reward for ep in group if not math.isnan(ep.reward)}) > 1


def sample_with_signal(first: Sequence[int], sample: Callable[[list[int]], list[Any]],
                       draw: Callable[[int], list[int]], max_rounds: int) -> DynamicSamplingResult:
    """Sample ``first``, then ``draw(n)`` more prompts per round (``n``: the groups still
    missing over the fraction kept so far, at most ``len(first)``), until ``len(first)``
    groups with signal or ``max_rounds`` rounds."""
    quota = len(first)
    kept: list[Any] = []
    dropped: list[Any] = []
    indices, rounds, sampled, first_round = list(first), 0, 0, []
    while True:
        rounds += 1
        groups = sample(indices)
        if rounds == 1:
            first_round = groups
        sampled += len(groups)
        for group in groups:
            (kept if has_signal(group) else dropped).append(group)
        if len(kept) >= quota or rounds >= max_rounds:
            break
        missing = quota - len(kept)
        indices = draw(min(quota, math.ceil(missing * sampled / max(len(kept), 1))))
    result = DynamicSamplingResult(kept[:quota], first_round, rounds, sampled, len(dropped))
    if len(kept) < quota:
        result.short = True
        result.topped_up = dropped[: quota - len(kept)]
        result.groups = kept + result.topped_up
    return result
