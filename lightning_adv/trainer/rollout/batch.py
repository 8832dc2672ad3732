"""Scoring sampled episodes, and the SPEC §1 batch made of them.

:func:`score` gives each episode its outcome reward (the task's), its per-turn rewards and
its process rewards (the configured scorers'); :func:`build_batch` turns the scored
episodes into the rollout batch and its complete metadata (one prompt group per prompt).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.exceptions import TaskError
from lightning_adv.trainer.tasks.base import Sample
from lightning_adv.trainer.tasks.episode import Episode
from lightning_adv.trainer.tasks.runtime import TaskRuntime, checked_user_number


Scorer = tuple[str, Callable[..., Any], float, Mapping[str, Any]]
"""(config key, function, weight, kwargs) of one process scorer"""


def score(groups: list[list[Episode]], runtime: TaskRuntime,
          scorers: Sequence[Scorer] = ()) -> None:
    """Outcome rewards from the task and summed, weighted process rewards, per episode."""
    task = runtime.task
    known: dict[int, tuple[Any, Any]] = {}  # per prompt index: its text and target
    for group in groups:
        for sample_no, ep in enumerate(group):
            if ep.index not in known:  # the task's text, not a chat rendering
                known[ep.index] = runtime.prompt_text(ep.index), task.target(ep.instance)
            prompt, target = known[ep.index]
            if not isinstance(prompt, str):  # chat messages: the rendered text
                prompt = runtime.vocab.decode(ep.tokens[: _prompt_len(ep)])
            ep.sample = Sample(index=ep.index, instance=ep.instance, prompt=prompt,
                               turns=tuple(ep.turns), truncated=ep.truncated, target=target)
            ep.reward = runtime.reward(ep.sample, sample_no)
            ep.turn_rewards = runtime.turn_rewards(ep.sample, sample_no)
            if scorers:
                ep.token_rewards = _process_rewards(ep, sample_no, scorers)


def _prompt_len(ep: Episode) -> int:
    return ep.generated.index(True) if True in ep.generated else len(ep.tokens)


def _process_rewards(ep: Episode, sample_no: int, scorers: Sequence[Scorer]) -> list[float]:
    """Token-aligned process rewards: per-token or per-turn scores, weighted and summed."""
    assert ep.sample is not None
    turn_lengths = [len(t.tokens) for t in ep.turns]
    n_tokens = sum(turn_lengths)
    total = [0.0] * n_tokens
    for key, fn, weight, kwargs in scorers:
        values = fn(ep.sample, **kwargs)
        what = f"prompt {ep.index}, sample {sample_no} (response {ep.sample.response!r})"
        if isinstance(values, Tensor):
            values = values.flatten().tolist()
        if not isinstance(values, Sequence) or isinstance(values, str):
            raise TaskError(f"{key}: expected a list of floats (one per generated token or one "
                             f"per turn) for {what}, got {type(values).__name__}")
        if len(values) == n_tokens:
            per_token = [checked_user_number(v, key, what, f"process reward [{i}]")
                         for i, v in enumerate(values)]
        elif len(values) == len(turn_lengths):
            per_token = [checked_user_number(v, key, what, f"process reward of turn {i}")
                         for i, v in enumerate(values) for _ in range(turn_lengths[i])]
        else:
            raise TaskError(f"{key}: expected {n_tokens} values (one per generated token) or "
                             f"{len(turn_lengths)} (one per turn) for {what}, got {len(values)}")
        total = [t + weight * v for t, v in zip(total, per_token)]
    aligned = [0.0] * len(ep.tokens)
    positions = [i for i, g in enumerate(ep.generated) if g]
    for i, v in zip(positions, total):
        aligned[i] = v
    return aligned


def build_batch(groups: list[list[Episode]], *, multi_turn: bool,
                process_rewards: bool, rollout_logprobs: bool = False
                ) -> tuple[dict[str, Any], BatchMeta]:
    """The SPEC §1 rollout batch (without model outputs) and its complete metadata: what
    :func:`~lightning_adv.batch.grouping.concat_batch` makes of one right-padded batch per prompt
    group, built at once (one tensor per key); with ``rollout_logprobs`` also the sampler's
    log-probs as sampled (token-aligned, like ``logprobs``)."""
    episodes = [ep for group in groups for ep in group]
    width = max(len(ep.tokens) for ep in episodes)

    def pad(rows: list[list[Any]], dtype: torch.dtype, fill: Any = 0) -> Tensor:
        return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=dtype)

    batch = {
        "input_ids": pad([ep.tokens for ep in episodes], torch.long),
        "attention_mask": pad([[True] * len(ep.tokens) for ep in episodes], torch.bool, False),
        "loss_mask": pad([[int(g) for g in ep.generated] for ep in episodes], torch.int32),
        "logprobs": pad([ep.logprobs for ep in episodes], torch.float32, 0.0),
        "rewards": torch.tensor([ep.reward for ep in episodes], dtype=torch.float32),
        "is_truncated": torch.tensor([ep.truncated for ep in episodes], dtype=torch.bool),
    }
    if rollout_logprobs:
        batch["rollout_logprobs"] = pad([ep.rollout_logprobs for ep in episodes], torch.float32, 0.0)
    if multi_turn:  # -1 off generated tokens
        batch["turn_ids"] = pad([[t if g else -1 for t, g in zip(ep.turn_ids, ep.generated)]
                                 for ep in episodes], torch.long, -1)
    if process_rewards:
        batch["token_rewards"] = pad([ep.token_rewards or [] for ep in episodes],
                                     torch.float32, 0.0)
    if any(ep.turn_rewards is not None for ep in episodes):
        batch["turn_rewards"] = pad([turn_end_rewards(ep) for ep in episodes], torch.float32, 0.0)
    if all(ep.values is not None for ep in episodes):
        batch["values"] = pad([ep.values for ep in episodes], torch.float32, 0.0)
    if all(ep.mc_returns is not None for ep in episodes):  # ppo.vine
        batch["step_ids"] = pad([ep.step_ids or [] for ep in episodes], torch.long, -1)
        batch["mc_returns"] = mc_returns_table(episodes)
    if all(ep.tree_node_ids is not None for ep in episodes):  # ppo.tree
        batch["tree_node_ids"] = pad([ep.tree_node_ids or [] for ep in episodes], torch.long, -1)
    meta = BatchMeta(n_trajs=len(groups), traj_group_sizes=[len(group) for group in groups],
                     traj_seqlens=[max(len(ep.tokens) for ep in group) for group in groups],
                     rollout_groups=[None] * len(groups))
    return batch, meta


def mc_returns_table(episodes: list[Episode]) -> Tensor:
    """``[B, S, K]`` float32: row b's slot k the returns sampled from the state before its
    step k (``ppo.vine``), NaN past its last step."""
    slots = max(len(ep.mc_returns or ()) for ep in episodes)
    k = max((len(r) for ep in episodes for r in ep.mc_returns or ()), default=1)
    table = torch.full((len(episodes), slots, k), float("nan"), dtype=torch.float32)
    for b, ep in enumerate(episodes):
        for slot, returns in enumerate(ep.mc_returns or ()):
            table[b, slot, :len(returns)] = torch.tensor(returns, dtype=torch.float32)
    return table


def turn_end_rewards(ep: Episode) -> list[float]:
    """Token-aligned: each turn's reward at the turn's last generated token, 0 elsewhere."""
    out = [0.0] * len(ep.tokens)
    if ep.turn_rewards is None:
        return out
    last: dict[int, int] = {}
    for i, (turn, generated) in enumerate(zip(ep.turn_ids, ep.generated)):
        if generated:
            last[turn] = i
    for turn, position in last.items():
        out[position] = ep.turn_rewards[turn]
    return out
