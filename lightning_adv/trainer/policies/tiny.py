"""The built-in policy: :class:`TinyPolicy`, the tiny causal transformer
(:class:`~.tiny_network.CausalTransformer`) as a :class:`~.base.Policy`.

Its shortcuts are its own business, each tested equal to the plain path of
:class:`~.base.Policy`:

- sampling with a KV cache that reads each prompt once (:mod:`.tiny_sampling`);
- scoring and the update's forward computed at the positions that are read only
  (:meth:`~.tiny_network.CausalTransformer.forward_selected`: a third of a padded batch's
  positions on the shipped configs);
- a reference pass that reads each prompt group's prompt once, with a KV cache
  (:func:`shared_prompt_logprobs`);
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
        if request.want == {"logprobs"} and request.prompts is not None:
            shared = shared_prompt_logprobs(self, ids, lengths, request.prompts.prompt_lengths,
                                            request.prompts.size, request.temperature)
            if shared is not None:
                return {"logprobs": shared}
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
def shared_prompt_logprobs(model: CausalTransformer, ids: Tensor, lengths: Tensor,
                           prompt_lengths: Tensor, group: int, temperature: float
                           ) -> Optional[Tensor]:
    """The next-token log-probs of the right-padded rows ``ids`` (``[B, T]``, 0 where no
    next token), with a KV cache that reads the prompt of each group of ``group``
    consecutive rows once: the group's first row's prompt, whose keys and values the other
    rows take, then every row's remaining tokens. None when some group's rows do not share
    their prompt (or the rows do not split into such groups). The numbers of a full pass,
    to float rounding (the prompt's share of the work is read ``group`` times less: about
    half of a ``reverse`` batch's positions)."""
    b, t = ids.shape
    if group < 2 or b % group or not bool((prompt_lengths >= 1).all()):
        return None
    grouped = ids.view(b // group, group, t)
    columns = torch.arange(t, device=ids.device)
    in_prompt = (columns[None] < prompt_lengths[:, None]).view(b // group, group, t)
    same = ((grouped == grouped[:, :1]) | ~in_prompt).all() and bool(
        (prompt_lengths.view(-1, group) == prompt_lengths.view(-1, group)[:, :1]).all())
    if not same:
        return None
    cache = KVCache(model, b, t)
    leaders = torch.arange(0, b, group, device=ids.device)
    targets = F.pad(ids[:, 1:], (0, 1))
    out = torch.zeros(b, t, dtype=torch.float32, device=ids.device)

    def put(rows: Tensor, logits: Tensor, positions: Tensor) -> None:
        real = positions < t  # (padding reads sit at position t)
        row = rows[:, None].expand_as(positions)[real]
        at = positions[real]
        logp = small_log_softmax(logits[real], temperature)
        out[row, at] = logp.gather(-1, targets[row, at][:, None]).squeeze(-1)

    logits, _, positions = model.forward_cached(ids, leaders, prompt_lengths[leaders], cache)
    for layer in cache.layers:
        for tensor in layer:  # each group's rows take its first row's keys and values
            view = tensor.view(b // group, group, *tensor.shape[1:])
            view[:, 1:] = view[:, :1]
    cache.filled.copy_(prompt_lengths)
    for member in range(group):  # the prompt's log-probs, the same for the whole group
        put(leaders + member, logits, positions)
    everyone = torch.arange(b, device=ids.device)
    last = (lengths - 1).clamp(min=prompt_lengths)  # the last token predicts nothing
    logits, _, positions = model.forward_cached(ids, everyone, last, cache)
    put(everyone, logits, positions)
    return out.masked_fill_(columns[None] >= (lengths - 1)[:, None], 0.0)
