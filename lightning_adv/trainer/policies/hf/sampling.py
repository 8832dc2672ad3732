"""Sampling episodes from a Hugging Face policy with a KV cache, into the trainer's episodes.

:func:`hf_generate` is an incremental decoding loop over ``past_key_values`` (the model's
``cache``), batched over every episode of the step:

- Each step feeds every unfinished row the tokens it has not read yet, **left-padded**
  to the longest such run (the first step: the prompts; then the token sampled last, or
  after a turn, that token plus the environment's reply). Padding columns have attention
  mask 0 and rows carry explicit ``position_ids`` (their own token count), so a row's
  logits equal those of a forward pass over its tokens alone; the last column always
  holds every row's newest token, so only its logits are computed.
- A row's turn ends at an EOS token (the tokenizer's and the model's generation config's),
  at a ``task.stop_strings`` match in the turn's decoded text, or at ``max_new_tokens``;
  then the task's environment may answer (loss mask 0, ``turn_ids`` -1) and the row goes on.
- The episodes keep only real tokens, so :func:`~lightning_adv.trainer.rollout.batch.build_batch`
  writes them left-aligned and right-padded: the SPEC §1 batch.

Tokens are drawn with the step's ``torch.Generator`` from the temperature-scaled logits,
optionally restricted by top-k and top-p (transformers' own logits warpers, applied as
``generate`` applies them); 0 and 1.0 (the defaults) turn them off, unlike ``generate``'s
top_k=50. The behaviour log-prob stored for a token is that of the temperature-scaled
*full* distribution, the one the training forward pass computes (as TRL and verl do:
their old log-probs come from a forward pass too), so the first PPO step's ratio is 1;
its log-prob *as sampled*, in the distribution after top-k and top-p (renormalized), is
the episode's ``rollout_logprobs`` (the rollout policy of off-policy correction).
``SamplingParams.kv_cache`` false re-reads every row's whole history at each step (the same samples,
slower): the benchmark's baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.trainer.tasks.episode import Episode, start_episodes, turn_so_far
from lightning_adv.trainer.policies.base import (
    GenerationRequest, SamplingParams, finite_or_raise)
from lightning_adv.trainer.tasks.base import Turn
from lightning_adv.exceptions import TaskError
from lightning_adv.trainer.tasks.runtime import TaskRuntime


def _warpers(params: SamplingParams) -> list[Any]:
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    warpers: list[Any] = []
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=params.top_p))
    return warpers


class _Rows:
    """The tokens each row has read and will read next: one left-padded chunk per step."""

    def __init__(self, policy: Any, size: int, pad_id: int, device: torch.device, cached: bool):
        self.policy, self.pad_id, self.device, self.cached = policy, pad_id, device, cached
        self.read = [0] * size
        self.pending: list[list[int]] = [[] for _ in range(size)]
        self.masks: list[Tensor] = []
        self.history: list[tuple[Tensor, Tensor]] = []  # (ids, positions) when not cached
        self.cache: Any = None

    def prefill_shared(self) -> Tensor:
        """The first step with a KV cache: each distinct prompt among the rows' pending
        tokens is read once and its keys and values given to every row reading it
        (:mod:`~lightning_adv.trainer.policies.hf.prompt_sharing`); every row's next-token logits."""
        distinct: dict[tuple[int, ...], int] = {}
        prompt_of_row = [distinct.setdefault(tuple(p), len(distinct)) for p in self.pending]
        width = max(len(p) for p in distinct)
        ids = [[self.pad_id] * (width - len(p)) + list(p) for p in distinct]
        mask = [[0] * (width - len(p)) + [1] * len(p) for p in distinct]
        positions = [[0] * (width - len(p)) + list(range(len(p))) for p in distinct]
        ids, mask, positions = (torch.tensor(x, dtype=torch.long, device=self.device)
                                for x in (ids, mask, positions))
        logits, self.cache = self.policy.decode_step(ids, mask, positions, None)
        index = torch.tensor(prompt_of_row, device=self.device)
        self.cache.reorder_cache(index)
        self.masks.append(mask[index])
        self.read = [len(p) for p in self.pending]
        self.pending = [[] for _ in self.pending]
        return logits[index, -1].float()

    def next_logits(self, active: Sequence[int]) -> Tensor:
        """Feed every active row its pending tokens; the next-token logits of those rows."""
        if self.cached and self.cache is None and len(active) == len(self.pending) > 1:
            return self.prefill_shared()
        width = max(len(self.pending[r]) for r in active)
        ids, mask, positions = [], [], []
        for r, chunk in enumerate(self.pending):  # rows not active have nothing pending
            n, start = len(chunk), self.read[r]
            ids.append([self.pad_id] * (width - n) + chunk)
            mask.append([0] * (width - n) + [1] * n)
            # padding takes the row's next position: any valid one would do, it is masked
            positions.append([start] * (width - n) + list(range(start, start + n)))
            self.read[r] += n
        self.pending = [[] for _ in self.pending]
        ids, mask, positions = (torch.tensor(x, dtype=torch.long)
                                for x in (ids, mask, positions))
        ids, mask, positions = (t.to(self.device) for t in (ids, mask, positions))
        self.masks.append(mask)
        attention = torch.cat(self.masks, dim=1)
        if self.cached:
            logits, self.cache = self.policy.decode_step(ids, attention, positions, self.cache)
        else:
            self.history.append((ids, positions))
            all_ids = torch.cat([h[0] for h in self.history], dim=1)
            all_positions = torch.cat([h[1] for h in self.history], dim=1)
            logits, _ = self.policy.decode_step(all_ids, attention, all_positions, None)
        return logits[torch.tensor(list(active), device=logits.device), -1].float()


@torch.no_grad()
def hf_generate(policy: Any, runtime: TaskRuntime, request: GenerationRequest,
                gen: torch.Generator) -> list[list[Episode]]:
    """Sample ``request.n_samples`` episodes for each prompt index; returns one list per
    prompt. Greedy sampling is top-k 1 at temperature 1: the draw is the argmax."""
    params = (SamplingParams(top_k=1, kv_cache=request.sampling.kv_cache)
              if request.sampling.greedy else request.sampling)
    n_samples, max_new_tokens = request.n_samples, request.max_new_tokens
    vocab = runtime.vocab
    device = next(policy.parameters()).device
    episodes = start_episodes(runtime, request.indices, n_samples, request.prefixes)
    rows = _Rows(policy, len(episodes), vocab.pad_id, device, params.kv_cache)
    for r, ep in enumerate(episodes):
        rows.pending[r] = list(ep.tokens)
    warpers = _warpers(params)
    stops = tuple(runtime.config.stop_strings)
    turn_tokens: list[list[int]] = [turn_so_far(ep) for ep in episodes]  # (a prefix)
    while True:
        active = [r for r, ep in enumerate(episodes) if not ep.done]
        if not active:
            break
        _check_window(runtime, episodes, rows, active)
        scaled = rows.next_logits(active) / params.temperature
        logp = finite_or_raise(torch.log_softmax(scaled, dim=-1), "policy logits")
        for warper in warpers:
            scaled = warper(None, scaled)
        sampled = torch.log_softmax(scaled, dim=-1) if warpers else logp  # what is drawn from
        picked = torch.multinomial(sampled.exp().cpu(), 1, generator=gen)
        picked_logp = logp.gather(1, picked.to(logp.device)).squeeze(1).tolist()
        as_sampled = sampled.gather(1, picked.to(logp.device)).squeeze(1).tolist()
        for j, r in enumerate(active):
            ep, token = episodes[r], int(picked[j])
            ep.append_generated(token, picked_logp[j], as_sampled[j])
            turn_tokens[r].append(token)
            eos = token in vocab.eos_ids
            stop = _stop_string(vocab, turn_tokens[r], stops) if stops and not eos else None
            if eos or stop is not None or len(turn_tokens[r]) >= max_new_tokens:
                reply = _end_turn(ep, turn_tokens[r], eos, stop, runtime)
                turn_tokens[r] = []
                rows.pending[r] = [] if ep.done else [token] + reply
            else:
                rows.pending[r] = [token]
    return [episodes[i * n_samples: (i + 1) * n_samples] for i in range(len(request.indices))]


def _stop_string(vocab: Any, tokens: list[int], stops: tuple[str, ...]) -> Optional[str]:
    text = vocab.decode(tokens)
    return next((s for s in stops if s in text), None)


def _end_turn(ep: Episode, tokens: list[int], eos: bool, stop: Optional[str],
              runtime: TaskRuntime) -> list[int]:
    """Record the finished turn; the environment's reply tokens (appended to the episode),
    or [] when the episode is over."""
    vocab = runtime.vocab
    text = vocab.decode(tokens[:-1] if eos else tokens)
    turn = Turn(text=text, tokens=tuple(vocab.token_text(t) for t in tokens), eos=eos, stop=stop)
    return ep.end_turn(turn, runtime)


def _check_window(runtime: TaskRuntime, episodes: list[Episode], rows: _Rows,
                  active: list[int]) -> None:
    window = runtime.context_window
    if window is None:
        return
    for r in active:
        if rows.read[r] + len(rows.pending[r]) + 1 > window:
            raise TaskError(f"{runtime.where}: episode of prompt {episodes[r].index} reached the "
                            f"model's context window ({window} tokens) after "
                            f"{len(episodes[r].turns)} turns; lower ppo.max_new_tokens or the "
                            f"task's turns")
