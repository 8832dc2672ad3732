"""The scoring step's forward passes over a rollout batch, in chunks of rows.

Values, the recomputed log-probs (``prox_logp``), the reference log-probs,
``sum_pi_squared`` and ``entropies`` need one pass of the policy and one of the reference over every row
of the batch. With a Hugging Face vocabulary one pass's logits are ``[B, T, V]``
(B=128, T=1024, V=150k: 79 GB in float32), so the passes run over at most
``ppo.forward_batch_size`` rows at a time, each chunk cut to its own longest row, and a
chunk's logits are reduced to ``[rows, T]`` numbers (:mod:`.token_stats`) before the
next pass starts: at most one chunk's logits are alive. verl calls the same setting
``log_prob_micro_batch_size_per_gpu``, OpenRLHF ``micro_rollout_batch_size``.

Rows never see each other (causal attention over right-padded rows), so the numbers are
those of one pass over the whole batch, to float rounding (kernels may block a smaller
matrix differently). Every rank has the same rows per step, hence the same number of
passes, as FSDP's collective forward needs.

How a chunk is scored is the policy's business
(:meth:`~lightning_adv.trainer.policies.base.Policy.token_scores`: the built-in policy
computes only the positions that are read, a Hugging Face one reads each prompt once).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.trainer.policies.base import Policy, PromptGroups, ScoreRequest

#: the batch key of each score, for the policy and the reference
POLICY_KEYS = {"values": "values", "logprobs": "prox_logp", "sum_pi_squared": "sum_pi_squared",
               "entropies": "entropies"}


def row_chunks(rows: int, size: Optional[int]) -> list[slice]:
    """Consecutive slices of at most ``size`` rows (None: one slice of all rows)."""
    step = rows if size is None else size
    return [slice(start, start + step) for start in range(0, rows, max(step, 1))]


@torch.no_grad()
def scoring_passes(policy: Policy, reference: Optional[Any], ids: Tensor, lengths: Tensor,
                   request: ScoreRequest, rows: Optional[int] = None) -> dict[str, Tensor]:
    """The ``[B, T]`` float32 tensors of the right-padded batch ``ids`` (real lengths
    ``lengths``): the policy's ``request.want`` scores, under their batch keys
    (``values``, ``prox_logp``, ``sum_pi_squared``, ``entropies``), and with a ``reference`` its
    ``ref_logp``. Past a row's last token they hold 0. ``rows``: rows per forward pass
    (None: the whole batch at once)."""
    b, t = ids.shape
    out: dict[str, Tensor] = {}

    def put(name: str, chunk: slice, value: Tensor) -> None:
        if name not in out:
            out[name] = torch.zeros(b, t, dtype=torch.float32, device=ids.device)
        out[name][chunk, :value.shape[1]] = value.float()

    for chunk in row_chunks(b, rows):
        width = int(lengths[chunk].max())
        part, part_lengths = ids[chunk, :width], lengths[chunk]
        prompts = request.prompts
        if prompts is not None:
            prompts = PromptGroups(prompts.prompt_lengths[chunk], prompts.size)
        if request.want:
            scores = policy.token_scores(part, part_lengths, ScoreRequest(
                request.want, request.temperature, prompts))
            for name, value in scores.items():
                put(POLICY_KEYS[name], chunk, value)
            del scores  # before the reference pass allocates its own logits
        if reference is not None:
            scores = reference.token_scores(part, part_lengths, ScoreRequest(
                frozenset({"logprobs"}), request.temperature, prompts))
            put("ref_logp", chunk, scores["logprobs"])
    return out
