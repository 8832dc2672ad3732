"""Reading a prompt once for all the responses that share it (Hugging Face policies).

A GRPO-style step samples ``n_samples`` responses per prompt, and every pass over the
batch (the sampler's first step, the reference's scoring pass, the policy's forward and
backward in the update) reads each prompt once per response. With a chat template the
prompt is most of the tokens (about 20 of the 25 of a shipped text-task row), so most of
the work is the same prompt read again.

:class:`SharedPrompts` finds the rows of a right-padded batch whose prompts are the
same tokens; :func:`shared_prompt_pass` reads each distinct prompt once (left-padded,
one row per prompt), gives every row its prompt's keys and values (the cache's
``reorder_cache``: an ``index_select``, through which autograd sums the rows' gradients
back into the prompt's pass), then reads each row's own tokens after it, with explicit
positions. Attention is causal and a prompt's hidden states depend on its tokens alone,
so the logits (and hidden states) at every real position are those of a pass over the
whole batch, to float rounding, and so are the gradients
(``tests/hf/test_prompt_sharing.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class SharedPrompts:
    """Rows of a batch and the distinct prompts they read."""

    prompt_lengths: Tensor
    """``[B]``: each row's prompt length (the tokens before its first generated one)"""
    prompt_of_row: Tensor
    """``[B]``: the index of each row's prompt among the distinct prompts"""
    first_rows: Tensor
    """``[U]``: a row holding each distinct prompt"""

    @classmethod
    def of(cls, input_ids: Tensor, prompt_lengths: Tensor) -> "SharedPrompts":
        """The distinct prompts of the rows ``input_ids`` (``[B, T]``) whose first
        ``prompt_lengths`` tokens are their prompts. Any prefix would do (the passes are
        exact wherever a row is split), so a row without a prompt reads its first token
        as one; the split never depends on the data beyond that, so every rank of a
        sharded run makes the same passes."""
        lengths = prompt_lengths.clamp(min=1).tolist()
        seen: dict[tuple[int, ...], int] = {}
        prompt_of_row, first_rows = [], []
        for row, (ids, n) in enumerate(zip(input_ids.tolist(), lengths)):
            key = tuple(ids[:n])
            if key not in seen:
                seen[key] = len(first_rows)
                first_rows.append(row)
            prompt_of_row.append(seen[key])
        device = input_ids.device
        return cls(torch.tensor(lengths, device=device),
                   torch.tensor(prompt_of_row, device=device),
                   torch.tensor(first_rows, device=device))

    @classmethod
    def of_rollout(cls, input_ids: Tensor, generated: Tensor) -> "SharedPrompts":
        """:meth:`of` with each row's prompt the tokens before its first generated one
        (``generated``: ``[B, T]``, non-zero on generated tokens)."""
        return cls.of(input_ids, (generated > 0).int().argmax(1))


def prompt_batch(input_ids: Tensor, shared: SharedPrompts) -> tuple[Tensor, Tensor, Tensor]:
    """The distinct prompts left-padded (token ids, attention mask, positions), ``[U, P]``."""
    lengths = shared.prompt_lengths[shared.first_rows]
    width = int(lengths.max())
    columns = torch.arange(width, device=input_ids.device)
    start = width - lengths  # the first real column of each left-padded row
    real = columns[None] >= start[:, None]
    source = (columns[None] - start[:, None]).clamp(min=0)
    ids = input_ids[shared.first_rows].gather(1, source) * real
    return ids, real.long(), source


def shared_prompt_pass(step: Callable[..., tuple[list[Tensor], Any]], input_ids: Tensor,
                       shared: SharedPrompts) -> list[Tensor]:
    """The per-position outputs of ``step`` over the right-padded rows ``input_ids``
    (``[B, T]``), each distinct prompt read once.

    ``step(ids, attention_mask, position_ids, cache)`` runs the model (with a KV cache:
    ``cache`` None at first) and returns its per-position outputs (``[b, n, ...]``: logits,
    hidden states) and the cache. The result is each output at every position of
    ``input_ids`` (``[B, T, ...]``), as one causal pass over the rows computes it: a row's
    padding is read as tokens, after its real ones."""
    b, t = input_ids.shape
    device = input_ids.device
    prompt_ids, prompt_mask, prompt_positions = prompt_batch(input_ids, shared)
    u, width = prompt_ids.shape
    first, cache = step(prompt_ids, prompt_mask, prompt_positions, None)
    cache.reorder_cache(shared.prompt_of_row)  # each row takes its prompt's keys and values
    starts = shared.prompt_lengths
    rest = max(t - int(starts.min()), 1)
    columns = torch.arange(rest, device=device)
    positions = starts[:, None] + columns[None]
    inside = positions < t
    ids = input_ids.gather(1, positions.clamp(max=t - 1))
    attention = torch.cat([prompt_mask[shared.prompt_of_row], inside.long()], dim=1)
    second, _ = step(ids, attention, positions, cache)
    # Row r's position p sits at column (width - starts[r] + p) of its prompt's row of the
    # first pass, or at column (p - starts[r]) of its own row of the second: one gather
    # over both.
    at = torch.arange(t, device=device)[None]
    from_first = shared.prompt_of_row[:, None] * width + (width - starts[:, None] + at)
    from_second = u * width + torch.arange(b, device=device)[:, None] * rest + (
        at - starts[:, None]).clamp(0, rest - 1)
    index = torch.where(at < starts[:, None], from_first, from_second).reshape(-1)
    out = []
    for a, c in zip(first, second):
        table = torch.cat([a.reshape(u * width, *a.shape[2:]), c.reshape(b * rest, *c.shape[2:])])
        out.append(table.index_select(0, index).reshape(b, t, *a.shape[2:]))
    return out


def causal_lm_pass(model: nn.Module, input_ids: Tensor, shared: Optional[SharedPrompts], *,
                   hidden: bool) -> tuple[Tensor, Optional[Tensor]]:
    """A causal LM's logits (and last hidden states, with ``hidden``) at every position of
    the right-padded rows ``input_ids``; with ``shared``, each distinct prompt read once."""
    if shared is None:
        out = model(input_ids=input_ids, use_cache=False, output_hidden_states=hidden)
        return out.logits, out.hidden_states[-1] if hidden else None

    def step(ids: Tensor, mask: Tensor, positions: Tensor, cache: Any) -> tuple[list[Tensor], Any]:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                    use_cache=True, output_hidden_states=hidden)
        return [out.logits] + ([out.hidden_states[-1]] if hidden else []), out.cache

    outputs = shared_prompt_pass(step, input_ids, shared)
    return outputs[0], outputs[1] if hidden else None


def base_model_pass(model: nn.Module, input_ids: Tensor, shared: Optional[SharedPrompts]
                    ) -> Tensor:
    """A base model's (a separate critic's) last hidden states, as :func:`causal_lm_pass`."""
    if shared is None:
        return model(input_ids=input_ids, use_cache=False).last_hidden_state

    def step(ids: Tensor, mask: Tensor, positions: Tensor, cache: Any) -> tuple[list[Tensor], Any]:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                    use_cache=True)
        return [out.last_hidden_state], out.cache

    return shared_prompt_pass(step, input_ids, shared)[0]
