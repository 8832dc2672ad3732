"""One sampled episode as both samplers build it, token by token and turn by turn.

The built-in sampler (:func:`~lightning_adv.trainer.policies.tiny_sampling.generate`) and the Hugging
Face one (:func:`~lightning_adv.trainer.policies.hf.sampling.hf_generate`) keep an episode's
per-token lists in step through :meth:`Episode.append_generated` and
:meth:`Episode.append_reply`, and close a policy turn with :meth:`Episode.end_turn`
(which asks the task's environment for its reply).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from lightning_adv.trainer.tasks.base import Sample, Turn
from lightning_adv.trainer.tasks.runtime import TaskRuntime


@dataclass
class Episode:
    """One sampled episode: its tokens, what was generated, and how it was scored."""

    index: int
    """prompt index in the pool"""
    instance: Any
    tokens: list[int]
    generated: list[bool]
    """token i was sampled from the policy"""
    logprobs: list[float]
    """behaviour log-prob of token i (token-aligned), 0 off generated tokens: of the
    temperature-scaled full distribution, what the trainer's forward pass computes"""
    turn_ids: list[int]
    """policy turn of token i, -1 off generated tokens"""
    turns: list[Turn]
    rollout_logprobs: list[float] = dataclasses.field(default_factory=list)
    """log-prob of token i in the distribution it was drawn from (after temperature,
    top-k and top-p), 0 off generated tokens: the batch's ``rollout_logprobs``"""
    done: bool = False
    reward: float = 0.0
    token_rewards: Optional[list[float]] = None
    turn_rewards: Optional[list[float]] = None
    """the task's per-turn rewards (:meth:`Task.turn_rewards`), one per turn, or None"""
    sample: Optional[Sample] = None
    values: Optional[list[float]] = None
    """the critic's value after reading token i (next-token convention), when the sampler
    computed them (KV-cache decoding with a value head)"""
    step_ids: Optional[list[int]] = None
    """``ppo.vine``: the step of token i (token-aligned like ``turn_ids``, -1 off
    generated tokens)"""
    mc_returns: Optional[list[list[float]]] = None
    """``ppo.vine``: per step, the returns of the continuations sampled from the state
    before it (NaN: unscorable)"""
    continuation_tokens: int = 0
    """``ppo.vine``: tokens sampled in those continuations (not trained on)"""
    tree_node_ids: Optional[list[int]] = None
    """``ppo.tree``: the tree node (segment) of token i, numbered within its prompt's tree
    (token-aligned like ``turn_ids``, -1 off generated tokens)"""
    shared_tokens: int = 0
    """``ppo.tree``: generated tokens of this episode that an episode before it in its
    group sampled (the prefix they share, sampled once)"""

    @property
    def truncated(self) -> bool:
        return bool(self.turns) and not self.turns[-1].ended

    @property
    def sampled_tokens(self) -> int:
        """Tokens the sampler drew for this episode and no episode before it: its generated
        tokens less those it shares with an earlier row of its tree, plus its ``ppo.vine``
        continuations' (summed over a step: the step's generated-token cost)."""
        return sum(self.generated) - self.shared_tokens + self.continuation_tokens

    def append_generated(self, token: int, logp: float,
                         rollout_logp: Optional[float] = None) -> None:
        """A token the policy sampled, with its behaviour log-prob (full distribution) and
        its log-prob as sampled (default: the same), in the current turn."""
        self.tokens.append(token)
        self.generated.append(True)
        self.logprobs.append(logp)
        self.rollout_logprobs.append(logp if rollout_logp is None else rollout_logp)
        self.turn_ids.append(len(self.turns))

    def append_reply(self, tokens: Sequence[int]) -> None:
        """Tokens the policy did not generate (the environment's reply): loss mask 0,
        log-prob 0, turn id -1."""
        self.tokens.extend(tokens)
        self.generated.extend([False] * len(tokens))
        self.logprobs.extend([0.0] * len(tokens))
        self.rollout_logprobs.extend([0.0] * len(tokens))
        self.turn_ids.extend([-1] * len(tokens))

    def end_turn(self, turn: Turn, runtime: TaskRuntime) -> list[int]:
        """Close the policy turn ``turn``. The episode ends at the task's last turn or when
        the environment has no reply; otherwise the reply's tokens are appended (and
        returned, for the caller's token buffer) and its text recorded on the turn."""
        self.turns.append(turn)
        if len(self.turns) >= runtime.task.max_turns:
            self.done = True
            return []
        answer = runtime.reply_with_text(self.instance, tuple(self.turns), self.index)
        if answer is None:
            self.done = True
            return []
        text, reply = answer
        self.turns[-1] = dataclasses.replace(turn, reply=text)
        self.append_reply(reply)
        return reply


def start_episodes(runtime: TaskRuntime, indices: Sequence[int], n_samples: int,
                   prefixes: Optional[Sequence[Sequence[int]]] = None) -> list[Episode]:
    """``n_samples`` episodes per prompt index, each holding its prompt tokens, in order;
    with ``prefixes`` (one per index) also the tokens its first turn already holds, as
    generated tokens of log-prob 0 (:attr:`GenerationRequest.prefixes`)."""
    if prefixes is not None and len(prefixes) != len(indices):
        raise ValueError(f"GenerationRequest.prefixes: expected one per prompt index "
                         f"({len(indices)}), got {len(prefixes)}")
    episodes: list[Episode] = []
    for i, index in enumerate(indices):
        instance, prompt = runtime.instance(int(index))
        for _ in range(n_samples):
            ep = Episode(int(index), instance, list(prompt), [False] * len(prompt),
                         [0.0] * len(prompt), [-1] * len(prompt), [],
                         rollout_logprobs=[0.0] * len(prompt))
            for token in (prefixes[i] if prefixes is not None else ()):
                ep.append_generated(int(token), 0.0)
            episodes.append(ep)
    return episodes


def turn_so_far(ep: Episode) -> list[int]:
    """The tokens of the episode's open first turn when sampling starts: its prefix
    (:func:`start_episodes`), [] for an episode that starts from its prompt."""
    return [t for t, g in zip(ep.tokens, ep.generated) if g]
