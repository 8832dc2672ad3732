"""Reading each shared prefix once (Hugging Face policies): the prompt a group's samples
share, and the parts of a tree's rows they share beyond it.

A GRPO-style step samples ``n_samples`` responses per prompt, and every pass over the
batch (the sampler's first step, the reference's scoring pass, the policy's forward and
backward in the update) reads each prompt once per response. With a chat template the
prompt is most of the tokens (about 20 of the 25 of a shipped text-task row), so most of
the work is the same prompt read again. The rows of a tree rollout share more: a prefix
of their generated tokens, branching at several depths.

:class:`SharedPrefixes` reads the segments a batch's rows share, found from their token
ids alone (:func:`~lightning_adv.trainer.policies.shared_prefixes.prefix_segments`: the
rows' prompts, then the runs of tokens that rows share beyond them where that saves
enough token reads). The segments at one depth of the trie make one model call (a
*level*), left-padded. :func:`shared_prefix_pass` reads the levels in turn: every
segment takes its parent's keys and values (the cache's ``reorder_cache``: an
``index_select``, through which autograd sums the children's gradients back into the
parent's pass), then reads its own tokens with explicit positions and an attention mask
over the cache, so a token sees exactly its row's earlier tokens. Attention is causal
and a prefix's hidden states depend on its tokens alone, so the logits (and hidden
states) at every position are those of a pass over the whole batch, to float rounding,
and so are the gradients (``tests/hf/test_prompt_sharing.py``,
``tests/hf/test_shared_prefix.py``).

Rows that share only their prompt (a plain GRPO batch, or any batch with
``beyond_prompts=False``) make two levels: the distinct prompts, then every row's own
tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor, nn

from lightning_adv.trainer.policies.shared_prefixes import (
    MIN_SAVED_TOKENS, PrefixSegment, prefix_segments)


@dataclass(frozen=True)
class PrefixLevel:
    """One model call of a shared-prefix pass: the segments at one depth of the trie."""

    parents: Optional[Tensor]
    """``[n]``: each segment's parent among the previous level's (None at the prompts)"""
    ids: Tensor
    """``[n, w]``: each segment's tokens, left-padded"""
    mask: Tensor
    """``[n, w]``: 1 on the segments' tokens, 0 on the padding"""
    positions: Tensor
    """``[n, w]``: each token's position in its row (a padding column: the segment's start)"""


@dataclass(frozen=True)
class SharedPrefixes:
    """The levels of the segments a batch's rows are cut into, and where each row's
    positions are read."""

    levels: tuple[PrefixLevel, ...]
    source: Tensor
    """``[B, T]``: each row position's index among the levels' outputs, their
    ``[n, w]`` positions flattened and concatenated level after level"""

    @classmethod
    def of(cls, input_ids: Tensor, prompt_lengths: Tensor, *, beyond_prompts: bool = True,
           min_saved: int = MIN_SAVED_TOKENS) -> "SharedPrefixes":
        """The segments of the rows ``input_ids`` (``[B, T]``, right-padded: padding is
        read as tokens, after a row's real ones) whose first ``prompt_lengths`` tokens are
        their prompts. Any cut would do (the passes are exact wherever a row is cut), so a
        row without a prompt reads its first token as one; ``beyond_prompts=False`` makes
        no cut past the prompts, so the number of model calls (2) does not depend on the
        tokens: every rank of a sharded run then makes the same calls."""
        segments = prefix_segments(input_ids, prompt_lengths, beyond_prompts=beyond_prompts,
                                   min_saved=min_saved)
        return _levels(segments, input_ids.detach().cpu().numpy(), input_ids.device)


def _levels(segments: list[PrefixSegment], rows: np.ndarray, device: torch.device
            ) -> SharedPrefixes:
    """The model calls reading ``segments`` level by level, and the outputs' gather index."""
    by_level: list[list[int]] = []
    slot = []  # each segment's index within its level
    for i, segment in enumerate(segments):
        by_level.extend([] for _ in range(segment.level + 1 - len(by_level)))
        slot.append(len(by_level[segment.level]))
        by_level[segment.level].append(i)
    source = np.full(rows.shape, -1, dtype=np.int64)
    levels, offset = [], 0
    for depth, members in enumerate(by_level):
        width = max(segments[i].end - segments[i].start for i in members)
        ids, mask, positions = (np.zeros((len(members), width), dtype=np.int64)
                                for _ in range(3))
        for j, segment in enumerate(segments[i] for i in members):
            pad = width - (segment.end - segment.start)
            span = np.arange(segment.start, segment.end)
            ids[j, pad:] = rows[segment.row, segment.start:segment.end]
            mask[j, pad:] = 1
            positions[j] = segment.start
            positions[j, pad:] = span
            source[segment.rows, segment.start:segment.end] = offset + j * width + pad + (
                span - segment.start)
        parents = None if depth == 0 else torch.tensor(
            [slot[segments[i].parent] for i in members], device=device)
        levels.append(PrefixLevel(parents, *(torch.from_numpy(x).to(device)
                                             for x in (ids, mask, positions))))
        offset += len(members) * width
    assert int(source.min()) >= 0, "a row position read by no segment"
    return SharedPrefixes(tuple(levels), torch.from_numpy(source).to(device))


def shared_prefix_pass(step: Callable[..., tuple[list[Tensor], Any]], shared: SharedPrefixes
                       ) -> list[Tensor]:
    """The per-position outputs of ``step`` over the rows ``shared`` was cut from (as one
    causal pass over them computes them: a row's padding is read as tokens, after its
    real ones), each shared segment read once.

    ``step(ids, attention_mask, position_ids, cache)`` runs the model (with a KV cache:
    ``cache`` None at first) and returns its per-position outputs (``[n, w, ...]``:
    logits, hidden states) and the cache. The result is each output at every position of
    the rows (``[B, T, ...]``)."""
    cache: Any = None
    attention: Optional[Tensor] = None
    outputs = []
    for level in shared.levels:
        if level.parents is None:
            attention = level.mask
        else:
            assert attention is not None
            cache.reorder_cache(level.parents)  # each segment takes its parent's keys and values
            attention = torch.cat([attention[level.parents], level.mask], dim=1)
        out, cache = step(level.ids, attention, level.positions, cache)
        outputs.append(out)
    b, t = shared.source.shape
    index = shared.source.reshape(-1)
    return [torch.cat([out[k].flatten(0, 1) for out in outputs]).index_select(0, index)
            .reshape(b, t, *outputs[0][k].shape[2:]) for k in range(len(outputs[0]))]


def causal_lm_pass(model: nn.Module, input_ids: Tensor, shared: Optional[SharedPrefixes], *,
                   hidden: bool) -> tuple[Tensor, Optional[Tensor]]:
    """A causal LM's logits (and last hidden states, with ``hidden``) at every position of
    the right-padded rows ``input_ids``; with ``shared``, each shared segment read once."""
    if shared is None:
        out = model(input_ids=input_ids, use_cache=False, output_hidden_states=hidden)
        return out.logits, out.hidden_states[-1] if hidden else None

    def step(ids: Tensor, mask: Tensor, positions: Tensor, cache: Any) -> tuple[list[Tensor], Any]:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                    use_cache=True, output_hidden_states=hidden)
        return [out.logits] + ([out.hidden_states[-1]] if hidden else []), out.cache

    outputs = shared_prefix_pass(step, shared)
    return outputs[0], outputs[1] if hidden else None


def base_model_pass(model: nn.Module, input_ids: Tensor, shared: Optional[SharedPrefixes]
                    ) -> Tensor:
    """A base model's (a separate critic's) last hidden states, as :func:`causal_lm_pass`."""
    if shared is None:
        return model(input_ids=input_ids, use_cache=False).last_hidden_state

    def step(ids: Tensor, mask: Tensor, positions: Tensor, cache: Any) -> tuple[list[Tensor], Any]:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                    use_cache=True)
        return [out.last_hidden_state], out.cache

    return shared_prefix_pass(step, shared)[0]
