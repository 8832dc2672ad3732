"""The scoring step's forward passes over a rollout batch, in chunks of rows.

Values, the recomputed log-probs (``prox_logp``), the reference log-probs and
``sum_pi_squared`` need one pass of the policy and one of the reference over every row
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

The built-in policy computes only the positions a pass's results are read at
(:meth:`~lightning_adv.trainer.policies.tiny_network.CausalTransformer.forward_selected`): every real
token when the critic's values are asked for, else every token that has a next one
(log-probs and ``sum_pi_squared`` score the next token); the other positions hold 0.
Its reference pass (over the whole batch at once) reads each prompt once for all of the
prompt's samples, with a KV cache (:func:`shared_prompt_logprobs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch
from torch import Tensor

from lightning_adv.trainer.policies.tiny_network import CausalTransformer
from lightning_adv.trainer.policies.logprobs import next_token_logprobs, picked_logprobs
from lightning_adv.trainer.policies.hf.prompt_sharing import SharedPrompts, forward_rows, reads_shared_prompts
from lightning_adv.trainer.rollout.recipe_inputs import sum_pi_squared

Model = Callable[[Tensor], tuple[Tensor, Optional[Tensor]]]


def row_chunks(rows: int, size: Optional[int]) -> list[slice]:
    """Consecutive slices of at most ``size`` rows (None: one slice of all rows)."""
    step = rows if size is None else size
    return [slice(start, start + step) for start in range(0, rows, max(step, 1))]


@torch.no_grad()
def scoring_passes(policy: Model, reference: Optional[Model], ids: Tensor, lengths: Tensor,
                   temperature: float, *, values: bool, logprobs: bool, pi_squared: bool,
                   rows: Optional[int] = None,
                   prompts: Optional[tuple[Tensor, int]] = None) -> dict[str, Tensor]:
    """The requested ``[B, T]`` float32 tensors of the right-padded batch ``ids`` (real
    lengths ``lengths``): ``values`` (the policy's critic), ``prox_logp`` (``logprobs``:
    the policy's next-token log-probs), ``sum_pi_squared`` (``pi_squared``) and, with a
    ``reference``, ``ref_logp``. Past a chunk's longest row they hold 0 (positions the
    caller masks). ``rows``: rows per forward pass (None: the whole batch at once).
    ``prompts``: each row's prompt length and the size of the groups of consecutive rows
    that share their prompt (a prompt's samples); with the built-in reference and no
    ``rows``, its pass reads each group's prompt once (:func:`shared_prompt_logprobs`)."""
    b, t = ids.shape
    out: dict[str, Tensor] = {}
    if isinstance(reference, CausalTransformer) and rows is None and prompts is not None:
        shared = shared_prompt_logprobs(reference, ids, lengths, *prompts, temperature)
        if shared is not None:
            out["ref_logp"], reference = shared, None

    def put(name: str, chunk: slice, value: Tensor) -> None:
        if name not in out:
            out[name] = torch.zeros(b, t, dtype=torch.float32, device=ids.device)
        out[name][chunk, :value.shape[1]] = value.float()

    run_policy = values or logprobs or pi_squared
    for chunk in row_chunks(b, rows):
        width = int(lengths[chunk].max())
        part = ids[chunk, :width]
        # a Hugging Face model reads each prompt of the chunk once for all its samples
        # (decided by the group size alone: every rank of a sharded run runs the same passes)
        prompt_groups = (SharedPrompts.of(part, prompts[0][chunk])
                         if prompts is not None and prompts[1] > 1 and (
                             reads_shared_prompts(policy) or reads_shared_prompts(reference))
                         else None)
        if run_policy and isinstance(policy, CausalTransformer):
            got = selected_passes(policy, part, lengths[chunk], temperature, values=values,
                                  logprobs=logprobs, pi_squared=pi_squared)
            for name, key in (("values", "values"), ("logprobs", "prox_logp"),
                              ("sum_pi_squared", "sum_pi_squared")):
                if name in got:
                    put(key, chunk, got[name])
        elif run_policy:
            logits, critic = forward_rows(policy, part, prompt_groups)
            if values:
                assert critic is not None, "values requested of a policy without a value head"
                put("values", chunk, critic)
            if logprobs:
                put("prox_logp", chunk, next_token_logprobs(logits, part, temperature))
            if pi_squared:
                put("sum_pi_squared", chunk, sum_pi_squared(logits, temperature))
            del logits, critic  # before the reference pass allocates its own logits
        if isinstance(reference, CausalTransformer):
            put("ref_logp", chunk, selected_passes(reference, part, lengths[chunk], temperature,
                                                   values=False, logprobs=True,
                                                   pi_squared=False)["logprobs"])
        elif reference is not None:
            ref_logits, _ = forward_rows(reference, part, prompt_groups)
            put("ref_logp", chunk, next_token_logprobs(ref_logits, part, temperature))
            del ref_logits
    return out


def selected_passes(model: CausalTransformer, ids: Tensor, lengths: Tensor, temperature: float,
                    *, values: bool, logprobs: bool, pi_squared: bool) -> dict[str, Tensor]:
    """The built-in policy's ``values``, next-token ``logprobs`` and ``sum_pi_squared`` of
    the right-padded rows ``ids`` (``[b, w]``, real lengths ``lengths``), each ``[b, w]``,
    from one pass over the positions they are read at: the real tokens with ``values``,
    else the tokens that have a next one (0 at the others)."""
    columns = torch.arange(ids.shape[1], device=ids.device)
    selected = columns[None] < (lengths if values else lengths - 1)[:, None]
    logits, critic = model.forward_selected(ids, selected)

    def spread(x: Tensor) -> Tensor:
        return x.new_zeros(selected.shape).masked_scatter(selected, x)

    out = {}
    if values:
        assert critic is not None, "values requested of a policy without a value head"
        out["values"] = spread(critic)
    if logprobs:  # (a row's last token has no next one: its target is padding, masked later)
        targets = torch.nn.functional.pad(ids[:, 1:], (0, 1))[selected]
        out["logprobs"] = spread(picked_logprobs(logits, targets, temperature))
    if pi_squared:
        out["sum_pi_squared"] = spread(sum_pi_squared(logits[None], temperature)[0])
    return out


@torch.no_grad()
def shared_prompt_logprobs(model: CausalTransformer, ids: Tensor, lengths: Tensor,
                           prompt_lengths: Tensor, group: int, temperature: float
                           ) -> Optional[Tensor]:
    """The built-in policy's next-token log-probs of the right-padded rows ``ids`` (``[B,
    T]``, 0 where no next token), with a KV cache that reads the prompt of each group of
    ``group`` consecutive rows once: the group's first row's prompt, whose keys and values
    the other rows take, then every row's remaining tokens. None when some group's rows do
    not share their prompt (or the rows do not split into such groups). The numbers of a
    full pass, to float rounding (the prompt's share of the work is read ``group`` times
    less: about half of a ``reverse`` batch's positions)."""
    from lightning_adv.trainer.policies.tiny_network import KVCache

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
    targets = torch.nn.functional.pad(ids[:, 1:], (0, 1))
    out = torch.zeros(b, t, dtype=torch.float32, device=ids.device)

    def put(rows: Tensor, logits: Tensor, positions: Tensor) -> None:
        real = positions < t  # (padding reads sit at position t)
        row = rows[:, None].expand_as(positions)[real]
        at = positions[real]
        out[row, at] = picked_logprobs(logits[real], targets[row, at], temperature).float()

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
