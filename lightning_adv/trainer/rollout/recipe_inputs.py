"""Batch keys some recipes read that the built-in trainer computes only when asked
(``AdvantageModule.required_batch_keys``, from the stages' ``register_stage(requires=...)``):

- ``sum_pi_squared`` (``optimal_token_baseline``): the sum over the vocabulary of the
  squared next-token probabilities at each position, from the behaviour policy's logits
  at the sampling temperature, next-token convention like ``ref_logp``;
- ``entropies`` (``top_entropy_mask``, ``gtpo``): the entropy of the policy's next-token
  distribution at the sampling temperature at each position, next-token convention,
  from the scoring pass (which then runs even where nothing else asks for a policy pass);
- ``reward_baselines`` (``remax_baseline``): the task reward of one greedy response per
  prompt (``ppo.greedy_baseline: true``); the greedy responses take no part in the
  update;
- ``ref_logp`` (``sequence_kl``): the frozen reference policy is loaded for it;
- ``anchor_state_ids`` (``gigpo``): on the tokens of each policy turn, an id of the state
  the turn was generated from: its whole context (the prompt, the earlier turns and the
  environment's replies), so two turns share an anchor state when they were generated
  from the same tokens (GiGPO's exact-match anchor states).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_adv.exceptions import TaskError


def baseline_rewards(groups: Sequence[Sequence[Any]]) -> list[float]:
    """The reward of each group's one greedy episode: ReMax's baselines. An unscorable
    greedy response (NaN under ``actor.unscorable_rewards: exclude``) is refused: a baseline
    must be a number, and dropping the prompt's sampled rows instead would hide it."""
    rewards = [group[0].reward for group in groups]
    bad = [group[0].index for group, r in zip(groups, rewards) if math.isnan(r)]
    if bad:
        raise TaskError(f"ppo.greedy_baseline: the reward function could not score (None or "
                        f"NaN) the greedy response to prompts {bad[:10]}, and ReMax's baseline "
                        f"(reward_baselines) needs a reward for every prompt's greedy response")
    return rewards


def anchor_state_ids(episodes: Sequence[Any], width: int) -> Tensor:
    """``[B, width]`` long, token-aligned: on each generated token the id of its turn's
    context (every token before the turn's first one), numbered in order of first
    appearance in the batch; -1 elsewhere."""
    ids: dict[tuple[int, ...], int] = {}
    rows = []
    for ep in episodes:
        row = [-1] * width
        first: dict[int, int] = {}
        for i, (turn, generated) in enumerate(zip(ep.turn_ids, ep.generated)):
            if generated:
                first.setdefault(turn, i)
                context = tuple(ep.tokens[:first[turn]])
                row[i] = ids.setdefault(context, len(ids))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.long)


def check_sampled_key(needs: frozenset[str], key: str, option: str, enabled: bool, *,
                      readers: str, example: str, unread: str) -> None:
    """A rollout option that samples batch ``key`` (``ppo.vine``, ``ppo.tree``) is set
    exactly when a stage reads the key: one error naming the option and the key either
    way. ``readers``: which stages read it; ``example``: a setting of the option;
    ``unread``: the fix when nothing reads it."""
    if key in needs and not enabled:
        raise ValueError(f"{option}: the advantage stages read the batch key {key!r} "
                         f"({readers}), which the trainer samples only under {option}; set "
                         f"{option}, e.g. {example}")
    if enabled and key not in needs:
        raise ValueError(f"{option}: {key!r} is sampled for the advantage stages, and no "
                         f"stage reads it; {unread}")


def check_single_turn(option: str, runtime: Any, what: str) -> None:
    """``option`` samples within the first policy turn only: a task of several turns is
    refused, naming both."""
    if runtime.task.max_turns > 1:
        raise ValueError(f"{option}: {what} within the first policy turn, and {runtime.where} "
                         f"has up to {runtime.task.max_turns} turns (sampling through the "
                         f"environment is not supported); use a single-turn task or "
                         f"{option}: null")


def check_greedy_baseline(needs: frozenset[str], greedy_baseline: bool) -> None:
    """``ppo.greedy_baseline`` must be on exactly when a stage reads ``reward_baselines``
    (off: an error naming the key; on for nothing: a warning, it costs a rollout)."""
    if "reward_baselines" in needs and not greedy_baseline:
        raise ValueError("ppo.greedy_baseline: the advantage stages read the batch key "
                         "'reward_baselines' (one greedy response's reward per prompt, ReMax's "
                         "baseline); set ppo.greedy_baseline: true")
    if greedy_baseline and "reward_baselines" not in needs:
        warnings.warn("ppo.greedy_baseline: true, but no advantage stage reads "
                      "'reward_baselines'; the greedy responses are sampled for nothing",
                      UserWarning, stacklevel=4)
