"""Rollout generation and the SPEC §1 batch.

:func:`generate` samples ``n_samples`` episodes per prompt with the policy, turn by turn:
the policy writes until ``<eos>`` or the per-turn token limit, then the task's
environment answers (its tokens are not generated: loss mask 0, turn id -1), until the
task ends the episode or ``max_turns`` is reached. Every random draw comes from the
generator passed in. :func:`build_batch` turns the scored episodes into the rollout
batch and its complete metadata (one prompt group per prompt).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.trainer.logprobs import scaled_log_softmax
from lightning_adv.trainer.episode import Episode, start_episodes
from lightning_adv.trainer.task_base import Sample, Turn
from lightning_adv.exceptions import TaskError
from lightning_adv.trainer.tasks import TaskRuntime, checked_user_number


@torch.no_grad()
def generate(policy: torch.nn.Module, runtime: TaskRuntime, indices: Sequence[int],
             n_samples: int, max_new_tokens: int, temperature: float,
             gen: torch.Generator, kv_cache: bool = True,
             greedy: bool = False, last_values: bool = True) -> list[list[Episode]]:
    """Sample ``n_samples`` episodes for each prompt index; returns one list per prompt.
    ``greedy`` takes the most likely token at every step instead (``gen`` is not used).

    With ``kv_cache`` each step reads only the tokens a row has not read yet (incremental
    decoding); without it, each step re-reads every row's whole prefix. Both sample the
    same tokens from the same generator; with a value head, the cached path also keeps the
    critic's values of every token, so scoring needs no second forward pass. The tokens
    sampled last are read (one more pass) only for their values; with ``last_values``
    false they are not, and the value after each episode's last token is 0 (the trainer
    sets it to 0 unless ``ppo.bootstrap_truncated``).
    """
    task, vocab = runtime.task, runtime.vocab
    device = next(policy.parameters()).device
    episodes = start_episodes(runtime, indices, n_samples)
    width = task.max_episode_len(max_new_tokens)
    rows_of_tokens = [ep.tokens + [vocab.pad_id] * (width - len(ep.tokens)) for ep in episodes]
    buffer = torch.tensor(rows_of_tokens, dtype=torch.long, device=device)
    reader = _CachedReader(policy, len(episodes), width) if kv_cache else None
    turn_tokens: list[list[int]] = [[] for _ in episodes]
    # The samples of a prompt share its tokens: the cache reads each prompt once.
    first = None if reader is None else reader.read_prompts(
        buffer, torch.tensor([len(ep.tokens) for ep in episodes], device=device), n_samples)

    while True:
        rows = [i for i, ep in enumerate(episodes) if not ep.done]
        if not rows:
            break
        lengths = torch.tensor([len(episodes[i].tokens) for i in rows], device=device)
        if reader is None:
            logits, _ = policy(buffer[rows, : int(lengths.max())])
            last = logits[torch.arange(len(rows), device=device), lengths - 1].float()
        elif first is not None:  # (every episode is active before its first token)
            last, first = first, None
        else:
            last = reader.read_active(buffer, rows, lengths)
        logp = finite_or_raise(scaled_log_softmax(last, temperature), "policy logits").cpu()
        picked = (logp.argmax(dim=-1) if greedy
                  else torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1))
        picked_logp = logp.gather(1, picked[:, None]).squeeze(1).tolist()
        buffer[rows, lengths] = picked.to(device)
        _take_tokens(buffer, episodes, rows, picked.tolist(), picked_logp, turn_tokens,
                     max_new_tokens, runtime)

    if reader is not None and reader.values is not None:
        reader.finish(buffer, episodes, read_last=last_values)
    groups = [episodes[i * n_samples: (i + 1) * n_samples] for i in range(len(indices))]
    return groups


class _CachedReader:
    """Incremental decoding for :func:`generate`: the policy's KV cache and, with a value
    head, the values of every token read."""

    def __init__(self, policy: torch.nn.Module, rows: int, width: int):
        from lightning_adv.trainer.policy import KVCache

        self.policy = policy
        self.cache = KVCache(policy, rows, width)
        self.values = (torch.zeros(rows, width + 1, device=self.cache.filled.device)
                       if policy.value_head is not None else None)

    def read_prompts(self, buffer: Tensor, lengths: Tensor, group: int) -> Tensor:
        """Read every row's first ``lengths`` tokens (its prompt); returns :meth:`read`'s
        logits of all rows. Consecutive rows in groups of ``group`` that hold the same
        prompt (a prompt's samples) are read once, as the group's first row, whose keys,
        values and logits the others copy: each row's numbers are its own pass's (rows
        never mix), with ``group`` times fewer rows through the model."""
        rows = len(lengths)
        everyone = torch.arange(rows, device=buffer.device)
        if group < 2 or rows % group:
            return self.read(buffer, everyone, lengths)
        width = int(lengths.max())
        grouped = buffer[:, :width].view(rows // group, group, width)
        same = (grouped == grouped[:, :1]).all() and (
            lengths.view(-1, group) == lengths.view(-1, group)[:, :1]).all()
        if not same:
            return self.read(buffer, everyone, lengths)
        leaders = everyone[::group]
        logits = self.read(buffer, leaders, lengths[leaders])
        for layer in self.cache.layers:
            for tensor in layer:  # [rows, ...]: each group's rows take its first row's
                view = tensor.view(rows // group, group, *tensor.shape[1:])
                view[:, 1:] = view[:, :1]
        self.cache.filled.copy_(lengths)
        if self.values is not None:
            view = self.values.view(rows // group, group, -1)
            view[:, 1:] = view[:, :1]
        return logits.repeat_interleave(group, dim=0)

    def read_active(self, buffer: Tensor, rows: list[int], lengths: Tensor) -> Tensor:
        """:meth:`read` for the unfinished ``rows``. Every row is fed (finished ones read
        nothing, a padded query): the cache is then used in place, not gathered."""
        everyone = self.cache.filled.clone()
        active = torch.tensor(rows, device=buffer.device)
        everyone[active] = lengths
        return self.read(buffer, torch.arange(len(everyone), device=buffer.device), everyone)[active]

    def read(self, buffer: Tensor, rows: Tensor, lengths: Tensor) -> Tensor:
        """The next-token logits after each row's last token, ``[R, V]``."""
        logits, values, positions = self.policy.forward_cached(buffer, rows, lengths, self.cache)
        if self.values is not None:
            self.values[rows[:, None], positions] = values.float()
        last = ((positions < self.cache.width).sum(1) - 1).clamp(min=0)  # last real new token
        return logits[torch.arange(len(rows), device=rows.device), last].float()

    def finish(self, buffer: Tensor, episodes: list[Episode], read_last: bool = True) -> None:
        """Read the tokens sampled last (never fed back) for their values (``read_last``;
        else their values stay 0), then store every episode's values."""
        if read_last:
            lengths = torch.tensor([len(ep.tokens) for ep in episodes], device=buffer.device)
            rows = (lengths > self.cache.filled).nonzero().flatten()
            if len(rows):
                self.read(buffer, rows, lengths[rows])
        for ep, values in zip(episodes, self.values.tolist()):
            ep.values = values[: len(ep.tokens)]


def _take_tokens(buffer: Tensor, episodes: list[Episode], rows: list[int], picked: list[int],
                 picked_logp: list[float], turn_tokens: list[list[int]], max_new_tokens: int,
                 runtime: TaskRuntime) -> None:
    """Append each of ``rows``' sampled token to its episode; a row whose turn ends (at
    ``<eos>`` or the token limit) gets the environment's reply, written into ``buffer``
    too (its ``[B, W]`` token rows; the sampled tokens the caller has written)."""
    width = buffer.shape[1]
    replies: list[int] = []  # flat buffer positions and tokens of the replies
    reply_tokens: list[int] = []
    for j, row in enumerate(rows):
        ep, token = episodes[row], picked[j]
        ep.append_generated(token, picked_logp[j])
        turn_tokens[row].append(token)
        if token != runtime.vocab.eos_id and len(turn_tokens[row]) < max_new_tokens:
            continue
        reply = _end_turn(ep, turn_tokens[row], runtime)
        end = row * width + len(ep.tokens)
        replies.extend(range(end - len(reply), end))
        reply_tokens.extend(reply)
        turn_tokens[row] = []
    if replies:
        buffer.view(-1)[torch.tensor(replies, device=buffer.device)] = torch.tensor(
            reply_tokens, device=buffer.device)


def _end_turn(ep: Episode, tokens: list[int], runtime: TaskRuntime) -> list[int]:
    """Close the episode's turn of ``tokens``; the environment's reply tokens, appended to
    the episode ([] when it is over)."""
    vocab = runtime.vocab
    turn = Turn(text=vocab.decode(tokens), tokens=tuple(map(vocab.token_text, tokens)),
                eos=tokens[-1] == vocab.eos_id)
    return ep.end_turn(turn, runtime)


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
    meta = BatchMeta(n_trajs=len(groups), traj_group_sizes=[len(group) for group in groups],
                     traj_seqlens=[max(len(ep.tokens) for ep in group) for group in groups],
                     rollout_groups=[None] * len(groups))
    return batch, meta


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


def finite_or_raise(x: Tensor, what: str) -> Tensor:
    # -1e9 logits of banned tokens give finite log-probs; NaN or inf means divergence.
    if not bool(torch.isfinite(x).all()):
        raise FloatingPointError(f"{what}: the policy produced non-finite values (diverged "
                                 f"training? lower ppo.lr or raise ppo.max_grad_norm clipping)")
    return x

