"""The segments a batch's rows share: a trie of their tokens, cut at each row's prompt
and where rows that share more diverge (the policies' shared-prefix passes read each
segment once: :mod:`.hf.prompt_sharing`, and the built-in policy's reference pass,
:func:`.tiny.shared_prefix_logprobs`).

The cuts come from the token ids alone. The first is each row's prompt: rows whose
prompts are the same tokens share it. Beyond the prompt, a run of tokens that ``k >= 2``
rows share (``L`` tokens from the last cut to where they diverge) is read once where
that saves ``(k - 1) * L >= min_saved`` token reads (:data:`MIN_SAVED_TOKENS`): a
segment of its own, or, for the run that all of a prompt's rows share right after it,
part of the prompt's segment (a tree's trunk: no model call more). What is left of a
row after its last cut is its own segment (rows the same to the end share it). Any cut gives the same numbers (attention is causal, so a prefix's hidden
states depend on its tokens alone); the rule decides only what is read once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from torch import Tensor

#: Beyond the prompt, a run of ``L`` tokens that ``k`` rows share is read once when that
#: saves at least this many token reads, ``(k - 1) * L``: each cut adds a model call (on
#: a GPU, one more read of the weights), so the few tokens that rows share by chance (a
#: common first word) stay in each row's own segment.
MIN_SAVED_TOKENS = 32


@dataclass(frozen=True)
class PrefixSegment:
    """Tokens ``start..end`` of ``row``, read once for ``rows`` (which all hold them);
    ``level``: its depth in the trie (0: a prompt), ``parent``: its index in the list of
    segments (-1 for a prompt)."""

    level: int
    parent: int
    row: int
    start: int
    end: int
    rows: list[int]


def prefix_segments(input_ids: Tensor, prompt_lengths: Tensor, *, beyond_prompts: bool = True,
                    min_saved: int = MIN_SAVED_TOKENS) -> list[PrefixSegment]:
    """The segments of the rows ``input_ids`` (``[B, T]``; padding is cut as tokens)
    whose first ``prompt_lengths`` tokens are their prompts, parents before their
    children, each level's segments in the order of their first rows. A row without a
    prompt reads its first token as one; ``beyond_prompts=False`` cuts at the prompts
    only (two levels, whatever the tokens)."""
    if min_saved < 1:
        raise ValueError(f"min_saved: expected a number of token reads of at least 1, got "
                         f"{min_saved}")
    rows = input_ids.detach().cpu().numpy()  # (numpy: the trie's many small steps)
    t = rows.shape[1]
    segments = _prompt_segments(rows, prompt_lengths.clamp(1, t).tolist())
    for prompt in range(len(segments)):
        members, start = segments[prompt].rows, segments[prompt].end
        if beyond_prompts:
            end = _shared_end(rows, members, start)
            if (len(members) - 1) * (end - start) >= min_saved:
                # the run all the prompt's rows share after it is read with it (no call more)
                segments[prompt] = replace(segments[prompt], end=end)
                start = end
            _branch(rows, segments, members, start, prompt, min_saved)
        else:
            segments.extend(PrefixSegment(1, prompt, r, start, t, [r])
                            for r in members if start < t)
    return segments


def _prompt_segments(rows: np.ndarray, lengths: list[int]) -> list[PrefixSegment]:
    """One segment per distinct prompt (its tokens and its length), at the first level."""
    seen: dict[tuple[int, ...], PrefixSegment] = {}
    for row, (ids, n) in enumerate(zip(rows.tolist(), lengths)):
        key = tuple(ids[:n])
        if key not in seen:
            seen[key] = PrefixSegment(0, -1, row, 0, n, [])
        seen[key].rows.append(row)
    return list(seen.values())


def _shared_end(rows: np.ndarray, members: list[int], start: int) -> int:
    """Where the rows ``members`` first differ at or after ``start`` (the width: nowhere)."""
    block = rows[members, start:]
    differ = np.flatnonzero((block != block[:1]).any(0))
    return start + int(differ[0]) if len(differ) else rows.shape[1]


def _branch(rows: np.ndarray, segments: list[PrefixSegment], members: list[int], start: int,
            parent: int, min_saved: int) -> None:
    """Append the segments of ``members`` (rows holding the same tokens before ``start``,
    under ``segments[parent]``) beyond ``start``: a trie walked with a stack."""
    t = rows.shape[1]
    stack = [(members, start, parent, segments[parent].level + 1)]
    while stack:
        members, start, parent, level = stack.pop()
        if start >= t:
            continue
        if len(members) == 1:  # a row's own tokens
            segments.append(PrefixSegment(level, parent, members[0], start, t, members))
            continue
        end = _shared_end(rows, members, start)
        if end == t:  # rows the same to the end: one segment, no new level
            segments.append(PrefixSegment(level, parent, members[0], start, t, members))
            continue
        if (len(members) - 1) * (end - start) >= min_saved:
            segments.append(PrefixSegment(level, parent, members[0], start, end, members))
            parent, level, start = len(segments) - 1, level + 1, end
        # (else the shared run stays in each branch's segment: the branches start here)
        branches: dict[int, list[int]] = {}
        for row, token in zip(members, rows[members, end].tolist()):
            branches.setdefault(token, []).append(row)
        # (pushed last first: segments come in the order of their first rows)
        stack.extend((branch, start, parent, level) for branch in reversed(branches.values()))
