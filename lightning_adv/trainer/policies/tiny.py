"""The built-in policy: :class:`TinyPolicy`, the tiny causal transformer
(:class:`~.tiny_network.CausalTransformer`) as a :class:`~.base.Policy`.

Its shortcuts are its own business, each tested equal to the plain path of
:class:`~.base.Policy`:

- sampling with a KV cache that reads each prompt once (:mod:`.tiny_sampling`);
- scoring and the update's forward computed at the positions that are read only
  (:meth:`~.tiny_network.CausalTransformer.forward_selected`: a third of a padded batch's
  positions on the shipped configs);
- a reference pass that reads each shared prompt, and each prefix rows share beyond
  it, once, with a KV cache (:func:`shared_prefix_logprobs`);
- the written-out log-softmax over its few dozen tokens
  (:func:`~.tiny_network.small_log_softmax`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_adv.trainer.policies.base import (
    GenerationRequest, Policy, PromptGroups, ScoreRequest)
from lightning_adv.trainer.policies.logprobs import entropy_of_logprobs
from lightning_adv.trainer.policies.shared_prefixes import (
    MIN_SAVED_TOKENS, PrefixSegment, prefix_segments)
from lightning_adv.trainer.policies.tiny_network import (
    CausalTransformer, KVCache, small_log_softmax)
from lightning_adv.trainer.policies.tiny_sampling import generate


class TinyPolicy(CausalTransformer, Policy):
    """The built-in tiny causal transformer, sampled, scored and trained by the trainer."""

    def shard(self, strategy: Any, reference: Any) -> None:
        raise ValueError("trainer.strategy: FSDP2 shards Hugging Face policies "
                         "(model.policy.pretrained); the built-in policy is a few hundred "
                         "thousand weights: use --trainer.strategy=ddp")

    def generate(self, runtime: Any, request: GenerationRequest, gen: torch.Generator
                 ) -> list[list[Any]]:
        # (ppo.top_k and ppo.top_p are refused for this policy at setup: policies/build.py)
        return generate(self, runtime, request, gen)

    @torch.no_grad()
    def token_scores(self, ids: Tensor, lengths: Tensor, request: ScoreRequest
                     ) -> dict[str, Tensor]:
        prompts = request.prompts
        if request.want == {"logprobs"} and prompts is not None and prompts.size > 1:
            return {"logprobs": shared_prefix_logprobs(self, ids, lengths, prompts.prompt_lengths,
                                                       request.temperature)}
        return selected_scores(self, ids, lengths, request)

    def train_forward(self, ids: Tensor, active: Tensor, temperature: float,
                      entropy_grad: bool, prompts: Optional[PromptGroups] = None
                      ) -> tuple[Tensor, Optional[Tensor], Tensor]:
        """Computed at the loss mask's positions ``active`` only, 0 elsewhere:
        :class:`~lightning_adv.PPOLoss` never reads the other positions, so the loss and its
        gradient are those of a full forward pass, to float rounding."""
        logits, values = self.forward_selected(ids, active)
        targets = F.pad(ids[:, 1:], (0, 1))[active]  # token t+1 at position t
        logp = small_log_softmax(logits, temperature)
        picked = logp.gather(-1, targets[:, None]).squeeze(-1)
        ent = entropy_of_logprobs(logp, entropy_grad)

        def spread(x: Tensor) -> Tensor:
            return x.new_zeros(active.shape).masked_scatter(active, x)

        return spread(picked), None if values is None else spread(values), spread(ent)


def _read_segments(model: CausalTransformer, cache: KVCache, ids: Tensor,
                   read: list[tuple[PrefixSegment, int]], temperature: float, out: Tensor) -> None:
    """One level of :func:`shared_prefix_logprobs`: each segment's holding row reads it up
    to ``end``, the segment's other rows take that row's keys and values, and every row
    of a segment gets its next-token log-probs at the positions read into ``out``."""
    t = ids.shape[1]
    holders = torch.tensor([s.row for s, _ in read], device=ids.device)
    ends = torch.tensor([end for _, end in read], device=ids.device)
    logits, _, positions = model.forward_cached(ids, holders, ends, cache)
    logp = small_log_softmax(logits, temperature)  # [R, n, V]; padding at position t
    copies = [(r, j) for j, (s, _) in enumerate(read) for r in s.rows if r != s.row]
    if copies:
        takers = torch.tensor([r for r, _ in copies], device=ids.device)
        source = holders[torch.tensor([j for _, j in copies], device=ids.device)]
        for layer in cache.layers:
            for tensor in layer:
                tensor[takers] = tensor[source]
        cache.filled[takers] = cache.filled[source]
    rows = torch.tensor([r for s, _ in read for r in s.rows], device=ids.device)
    segment = torch.tensor([j for j, (s, _) in enumerate(read) for _ in s.rows],
                           device=ids.device)
    at = positions[segment]  # [M, n]: the positions each row of a segment gets
    targets = F.pad(ids[:, 1:], (0, 1))[rows[:, None], at.clamp(max=t - 1)]
    picked = logp[segment[:, None], torch.arange(at.shape[1], device=ids.device), targets]
    real = at < t
    out[rows[:, None].expand_as(at)[real], at[real]] = picked[real]


def selected_scores(model: TinyPolicy, ids: Tensor, lengths: Tensor, request: ScoreRequest
                    ) -> dict[str, Tensor]:
    """:meth:`TinyPolicy.token_scores` from one pass over the positions they are read at:
    the real tokens with ``values``, else the tokens that have a next one (0 elsewhere)."""
    columns = torch.arange(ids.shape[1], device=ids.device)
    values = "values" in request.want
    selected = columns[None] < (lengths if values else lengths - 1)[:, None]
    logits, critic = model.forward_selected(ids, selected)

    def spread(x: Tensor) -> Tensor:
        return x.new_zeros(selected.shape).masked_scatter(selected, x.float())

    out = {}
    if values:
        assert critic is not None, "values requested of a policy without a value head"
        out["values"] = spread(critic)
    logp = small_log_softmax(logits, request.temperature)
    if "logprobs" in request.want:  # (a row's last token has no next one: masked below)
        targets = F.pad(ids[:, 1:], (0, 1))[selected]
        out["logprobs"] = spread(logp.gather(-1, targets[:, None]).squeeze(-1))
    if "sum_pi_squared" in request.want:
        out["sum_pi_squared"] = spread(logp.exp().square().sum(-1))
    if "entropies" in request.want:
        out["entropies"] = spread(entropy_of_logprobs(logp, with_grad=False))
    has_next = columns[None] < (lengths - 1)[:, None]
    return {k: v if k == "values" else v * has_next for k, v in out.items()}


@torch.no_grad()
def shared_prefix_logprobs(model: CausalTransformer, ids: Tensor, lengths: Tensor,
                           prompt_lengths: Tensor, temperature: float, *,
                           min_saved: int = MIN_SAVED_TOKENS) -> Tensor:
    """The next-token log-probs of the right-padded rows ``ids`` (``[B, T]``, 0 where no
    next token), with a KV cache that reads each segment the rows share once
    (:func:`~lightning_adv.trainer.policies.shared_prefixes.prefix_segments`: their
    prompts, and the runs of tokens rows share beyond them): level by level, one row
    holding each segment reads it (up to the last position any of its rows needs), and
    the segment's other rows take that row's keys and values. The numbers of a full
    pass, to float rounding (a ``reverse`` batch's prompts are about half its
    positions)."""
    b, t = ids.shape
    cache = KVCache(model, b, t)
    out = torch.zeros(b, t, dtype=torch.float32, device=ids.device)
    needed = (lengths - 1).tolist()  # the last token predicts nothing
    segments = prefix_segments(ids, prompt_lengths, min_saved=min_saved)
    for level in range(max(s.level for s in segments) + 1):
        # (in row order: forward_cached takes a read of every row for rows 0..B-1 in order)
        read = sorted(((s, min(s.end, max(needed[r] for r in s.rows))) for s in segments
                       if s.level == level), key=lambda item: item[0].row)
        read = [(s, end) for s, end in read if end > s.start]
        if read:
            _read_segments(model, cache, ids, read, temperature, out)
    columns = torch.arange(t, device=ids.device)
    return out.masked_fill_(columns[None] >= (lengths - 1)[:, None], 0.0)
