"""The built-in policy's sampler (:class:`~.tiny.TinyPolicy`).

:func:`generate` samples ``n_samples`` episodes per prompt with the policy, turn by turn:
the policy writes until ``<eos>`` or the per-turn token limit, then the task's
environment answers (its tokens are not generated: loss mask 0, turn id -1), until the
task ends the episode or ``max_turns`` is reached. Every random draw comes from the
generator passed in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_adv.trainer.policies.base import GenerationRequest, finite_or_raise
from lightning_adv.trainer.policies.tiny_network import small_log_softmax
from lightning_adv.trainer.tasks.base import Turn
from lightning_adv.trainer.tasks.episode import Episode, start_episodes, turn_so_far
from lightning_adv.trainer.tasks.runtime import TaskRuntime


@torch.no_grad()
def generate(policy: torch.nn.Module, runtime: TaskRuntime, request: GenerationRequest,
             gen: torch.Generator) -> list[list[Episode]]:
    """Sample ``request.n_samples`` episodes for each prompt index; returns one list per
    prompt. ``sampling.greedy`` takes the most likely token at every step instead (``gen``
    is not used).

    With ``sampling.kv_cache`` each step reads only the tokens a row has not read yet
    (incremental decoding); without it, each step re-reads every row's whole prefix. Both
    sample the same tokens from the same generator; with a value head, the cached path also
    keeps the critic's values of every token, so scoring needs no second forward pass. The
    tokens sampled last are read (one more pass) only for their values; with
    ``request.last_values`` false they are not, and the value after each episode's last
    token is 0 (the trainer sets it to 0 unless ``ppo.bootstrap_truncated``).
    """
    params, n_samples = request.sampling, request.n_samples
    task, vocab = runtime.task, runtime.vocab
    device = next(policy.parameters()).device
    episodes = start_episodes(runtime, request.indices, n_samples, request.prefixes)
    width = task.max_episode_len(request.max_new_tokens)
    rows_of_tokens = [ep.tokens + [vocab.pad_id] * (width - len(ep.tokens)) for ep in episodes]
    buffer = torch.tensor(rows_of_tokens, dtype=torch.long, device=device)
    reader = _CachedReader(policy, len(episodes), width) if params.kv_cache else None
    turns = _Turns(episodes, runtime, request.max_new_tokens)
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
        logp = finite_or_raise(small_log_softmax(last, params.temperature), "policy logits").cpu()
        picked = (logp.argmax(dim=-1) if params.greedy
                  else torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1))
        picked_logp = logp.gather(1, picked[:, None]).squeeze(1).tolist()
        buffer[rows, lengths] = picked.to(device)
        turns.take(buffer, rows, picked.tolist(), picked_logp)

    if reader is not None and reader.values is not None:
        reader.finish(buffer, episodes, read_last=request.last_values)
    groups = [episodes[i * n_samples: (i + 1) * n_samples] for i in range(len(request.indices))]
    return groups


class _CachedReader:
    """Incremental decoding for :func:`generate`: the policy's KV cache and, with a value
    head, the values of every token read."""

    def __init__(self, policy: torch.nn.Module, rows: int, width: int):
        from lightning_adv.trainer.policies.tiny_network import KVCache

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


class _Turns:
    """The episodes being sampled and each one's tokens of its current turn."""

    def __init__(self, episodes: list[Episode], runtime: TaskRuntime, max_new_tokens: int):
        self.episodes, self.runtime, self.max_new_tokens = episodes, runtime, max_new_tokens
        self.tokens: list[list[int]] = [turn_so_far(ep) for ep in episodes]  # (a prefix)

    def take(self, buffer: Tensor, rows: list[int], picked: list[int],
             picked_logp: list[float]) -> None:
        """Append each of ``rows``' sampled token to its episode; a row whose turn ends (at
        ``<eos>`` or the token limit) gets the environment's reply, written into ``buffer``
        too (its ``[B, W]`` token rows; the sampled tokens the caller has written)."""
        width = buffer.shape[1]
        replies: list[int] = []  # flat buffer positions and tokens of the replies
        reply_tokens: list[int] = []
        for j, row in enumerate(rows):
            ep, token = self.episodes[row], picked[j]
            ep.append_generated(token, picked_logp[j])
            self.tokens[row].append(token)
            if token != self.runtime.vocab.eos_id and len(self.tokens[row]) < self.max_new_tokens:
                continue
            reply = _end_turn(ep, self.tokens[row], self.runtime)
            end = row * width + len(ep.tokens)
            replies.extend(range(end - len(reply), end))
            reply_tokens.extend(reply)
            self.tokens[row] = []
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
