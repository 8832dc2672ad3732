"""Per-token advantage heatmaps: where the credit of a batch of responses goes.

:func:`advantage_heatmap` draws a few responses token by token: every generated token is
a cell holding its text, coloured by its advantage on a diverging colour map centred at 0
(blue above, red below, white at 0; one symmetric scale for the whole image, shown by a
colour bar). Tokens the policy did not generate (a multi-turn environment's replies) are
grey, and a black bar marks the start of each later policy turn. With ``tree_node_ids``
(tree rollouts) each shared prefix is drawn once and a green mark starts each segment. With ``process_rewards``
a strip under each line shows them, with ``values`` another shows the critic's values,
and ``strips`` adds the token entropy, the log importance weight and the rejection mask
of off-policy training, each on its own scale and colour bar. Long responses wrap.

It returns a :class:`Heatmap`: the matplotlib figure, the rendered RGB image (for
``SummaryWriter.add_image`` or a ``log_image``-style logger) and where each token's cell
is in that image. Drawing needs matplotlib (``pip install 'lightning_adv[plot]'``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Optional

import numpy as np
from torch import Tensor

from lightning_adv._checks import check_int, check_number, fail
from lightning_adv.visualize.heatmap_data import (
    NAMED_STRIPS, QUANTITIES, Heatmap, Response, RowInputs)
from lightning_adv.visualize.heatmap_trees import RowTree, read_trees

PLOT_EXTRA = "pip install 'lightning_adv[plot]'"


def advantage_heatmap(tokens: Sequence[Sequence[str]], advantages: Any, loss_mask: Any, *,
                      labels: Optional[Sequence[str]] = None, process_rewards: Any = None,
                      values: Any = None, turn_ids: Any = None,
                      strips: Optional[Mapping[str, Any]] = None, tree_node_ids: Any = None,
                      tree_groups: Any = None, title: Optional[str] = None,
                      limit: Optional[float] = None, width: int = 64, max_tokens: int = 256,
                      dpi: int = 100) -> Heatmap:
    """Draw responses token by token, coloured by advantage.

    Every per-token argument is **token-aligned** (entry ``i`` of a row is about token
    ``i``), a ``[B, T]`` tensor or array or one sequence per row, each row at least as long
    as its ``tokens`` (the ``AdvantageModule``'s outputs are next-token aligned:
    :func:`~lightning_adv.visualize.heatmap_inputs` converts a batch and its output).

    Args:
        tokens: per row, the text of each token (prompt included; a row ends at its last token).
        advantages: per row, the advantage of each token (read at generated tokens only).
        loss_mask: per row, 1 where the policy generated the token. A row is shown from its
            first generated token; other tokens after it are the environment's (grey).
        labels: per row, the line written above it (default ``row <b>``).
        process_rewards: per row, each token's process reward: a strip under the tokens.
        values: per row, the critic's value of the state each token was chosen in: a strip.
        turn_ids: per row, the policy turn of each generated token (-1 elsewhere): a bar
            marks each turn's start (without it, each generated run after a non-generated one).
        strips: more strips by name, each per row per token: ``"entropy"`` (the policy's
            entropy where the token was sampled, on ``[0, largest]``), ``"log IS weight"``
            (``log pi_old - log pi_rollout`` of an off-policy token, centred at 0) and
            ``"rejected"`` (1 where rollout rejection masked the token out, on ``[0, 1]``).
        tree_node_ids: per row, the tree node of each generated token, -1 elsewhere: each
            shared prefix drawn once, a shared token coloured by the mean advantage of the
            rows through its node (:mod:`~lightning_adv.visualize.heatmap_trees`).
        tree_groups: with ``tree_node_ids``, per row its prompt group (int or str; the
            rows of a group consecutive): node ids are compared within a group.
        title: the line above the image.
        limit: the advantage colour scale, ``[-limit, limit]`` (default: the largest
            absolute advantage shown; beyond it colours saturate).
        width: characters per line before a response wraps.
        max_tokens: tokens shown per response (the rest are counted in a note).
        dpi: pixels per inch of :attr:`Heatmap.image`.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'lightning_adv[plot]'``).
        ValueError: an argument of the wrong shape or length, or a non-finite number at a
            generated token, named in the message.
    """
    check_int("advantage_heatmap width", width, minimum=8)
    check_int("advantage_heatmap max_tokens", max_tokens)
    check_int("advantage_heatmap dpi", dpi, minimum=10)
    if limit is not None:
        check_number("advantage_heatmap limit", limit, positive=True)
    responses = read_responses(RowInputs(tokens, advantages, loss_mask, labels,
                                         process_rewards, values, turn_ids, strips,
                                         tree_node_ids, tree_groups), max_tokens)
    try:
        from lightning_adv.visualize.heatmap_drawing import draw
    except ImportError as exc:
        raise ImportError(f"advantage_heatmap needs matplotlib ({PLOT_EXTRA}): {exc}") from exc
    return draw(responses, _scales(responses, limit), title, width, dpi)


def _scales(responses: list[Response], limit: Optional[float]) -> dict[str, tuple[float, float]]:
    """Each drawn quantity's colour scale: the advantage's ``[-limit, limit]`` (default: the
    largest absolute advantage shown), then each strip's."""
    largest = limit if limit is not None else _largest(responses, None)
    scales = {"advantage": (-largest, largest)}
    for name, quantity in QUANTITIES.items():
        if any(name in r.strips for r in responses):
            scales[name] = _scale(quantity.scale, _largest(responses, name))
    return scales


def _scale(kind: str, largest: float) -> tuple[float, float]:
    """The colour scale (low, high) of a quantity of scale ``kind`` (:class:`Quantity`)."""
    return {"signed": (-largest, largest), "magnitude": (0.0, largest),
            "unit": (0.0, 1.0)}[kind]


def read_responses(given: RowInputs, max_tokens: int) -> list[Response]:
    """The checked rows, token-aligned and cut to what is shown."""
    tokens, labels, turn_ids = given.tokens, given.labels, given.turn_ids
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence) or not tokens:
        fail("advantage_heatmap tokens", "a non-empty list with one list of token texts per row",
             type(tokens).__name__)
    rows = [list(row) for row in tokens]
    for b, row in enumerate(rows):
        if any(not isinstance(t, str) for t in row):
            fail(f"advantage_heatmap tokens[{b}]", "token texts (str)",
                 sorted({type(t).__name__ for t in row}))
    lengths = [len(row) for row in rows]
    if labels is None:
        labels = [f"row {b}" for b in range(len(rows))]
    elif isinstance(labels, str) or len(labels) != len(rows):
        fail("advantage_heatmap labels", f"one string per row ({len(rows)})", labels)
    advs = per_row("advantages", given.advantages, lengths)
    mask = [[v != 0 for v in row] for row in per_row("loss_mask", given.loss_mask, lengths)]
    given_strips = {"process reward": given.process_rewards, "value": given.values,
                    **named_strips(given.strips)}
    strips = {name: per_row(argument_name(name), x, lengths)
              for name, x in given_strips.items() if x is not None}
    turns = per_row("turn_ids", turn_ids, lengths) if turn_ids is not None else None
    trees = _trees(given, lengths, rows, mask, advs)
    out = []
    for b, row in enumerate(rows):
        _check_finite(b, mask[b], {"advantages": advs[b],
                                   **{argument_name(k): v[b] for k, v in strips.items()}})
        first = mask[b].index(True) if True in mask[b] else len(row)
        shown = list(range(first, min(len(row), first + max_tokens)))
        response = Response(str(labels[b]), row, advs[b], mask[b], shown,
                            len(row) - first - len(shown), {k: v[b] for k, v in strips.items()},
                            _turn_starts(mask[b], turns[b] if turns else None, shown))
        if trees:
            response = replace(response, advantages=trees[b].advantages,
                               drawn_before=trees[b].drawn_before,
                               segment_starts=trees[b].segment_starts,
                               new_tree=trees[b].first_of_group)
        out.append(response)
    return out


def _trees(given: RowInputs, lengths: list[int], rows: list[list[str]],
           mask: list[list[bool]], advs: list[list[float]]) -> list[RowTree]:
    """Each row's place in its tree (:mod:`~lightning_adv.visualize.heatmap_trees`), none
    without ``tree_node_ids``; checked after the advantages are (finite where generated)."""
    if given.tree_node_ids is None:
        if given.tree_groups is not None:
            fail("advantage_heatmap tree_groups", "None without tree_node_ids",
                 "per-row groups")
        return []
    for b in range(len(rows)):
        _check_finite(b, mask[b], {"advantages": advs[b]})
    return read_trees(per_row("tree_node_ids", given.tree_node_ids, lengths),
                      given.tree_groups, mask, rows, advs)


def argument_name(strip: str) -> str:
    """How errors name a strip's argument."""
    if strip in NAMED_STRIPS:
        return f"strips[{strip!r}]"
    return strip.replace(" ", "_") + "s"


def named_strips(given: Any) -> dict[str, Any]:
    """``strips`` checked: a mapping of :data:`NAMED_STRIPS` names to per-row numbers
    (None entries dropped), in the drawing's order."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        fail("advantage_heatmap strips", f"a mapping of strip names {list(NAMED_STRIPS)} "
             "to per-row numbers", type(given).__name__)
    unknown = sorted(str(k) for k in given if k not in NAMED_STRIPS)
    if unknown:
        fail("advantage_heatmap strips", f"names among {list(NAMED_STRIPS)}", unknown)
    return {name: given[name] for name in NAMED_STRIPS if given.get(name) is not None}


def per_row(name: str, x: Any, lengths: list[int]) -> list[list[float]]:
    """``x`` (a ``[B, T]`` tensor or array, or one sequence per row) as one list of floats
    per row, each cut to its row's token count."""
    if isinstance(x, Tensor):
        x = x.detach().cpu().double().numpy()
    if isinstance(x, np.ndarray):
        if x.ndim != 2:
            fail(f"advantage_heatmap {name}", f"a [B, T] array of {len(lengths)} rows",
                 f"shape {x.shape}")
        x = x.tolist()
    if isinstance(x, (str, bytes)) or not isinstance(x, Sequence) or len(x) != len(lengths):
        fail(f"advantage_heatmap {name}", f"one row per row of tokens ({len(lengths)})",
             f"{len(x)} rows" if isinstance(x, Sequence) else type(x).__name__)
    rows = []
    for b, (row, n) in enumerate(zip(x, lengths)):
        row = list(row)
        if len(row) < n:
            fail(f"advantage_heatmap {name}[{b}]", f"at least one entry per token ({n})",
                 f"{len(row)} entries")
        rows.append([float(v) for v in row[:n]])
    return rows


def _check_finite(b: int, generated: list[bool], rows: dict[str, list[float]]) -> None:
    for name, row in rows.items():
        bad = [i for i, (g, v) in enumerate(zip(generated, row)) if g and not math.isfinite(v)]
        if bad:
            fail(f"advantage_heatmap {name}[{b}]", "finite numbers at generated tokens",
                 f"{row[bad[0]]} at position {bad[0]}")


def _turn_starts(generated: list[bool], turns: Optional[list[float]],
                 shown: list[int]) -> set[int]:
    """Shown positions (after the first) where a later policy turn starts: a generated token
    after a non-generated one, or whose turn id differs from the previous generated token's."""
    starts, previous = set(), None
    for i in shown:
        if not generated[i]:
            continue
        turn = turns[i] if turns is not None else None
        if previous is not None and (not generated[i - 1] or turn != previous[1]):
            starts.add(i)
        previous = (i, turn)
    return starts


def _largest(responses: list[Response], strip: Optional[str]) -> float:
    """The largest absolute number shown (advantages, or a strip's), 1 when all are 0."""
    largest = 0.0
    for r in responses:
        row = r.advantages if strip is None else r.strips.get(strip, [])
        for i in r.positions:
            if r.generated[i] and i < len(row):
                largest = max(largest, abs(row[i]))
    return largest if largest > 0 else 1.0
