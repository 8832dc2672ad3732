"""A few sampled responses in TensorBoard every N training steps: as text (its TEXT tab),
one table of prompt, response and task reward, the first response of each of the first
``count`` prompt groups; and as per-token advantage heatmaps (its IMAGES tab,
:mod:`~lightning_adv.trainer.heatmap_log`). Validation logs its greedy responses the same
way."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

from lightning_adv._checks import check_int


@dataclass(frozen=True)
class SampleLogConfig:
    """Sampled responses logged as text (TensorBoard's TEXT tab)."""

    every_n_steps: int = 50
    """log a table of responses every this many training steps, the first step included
    (0: never)"""
    count: int = 4
    """prompts shown per table (the first response of each)"""
    heatmap_groups: int = 2
    """prompt groups drawn in each advantage heatmap (train/advantage_heatmap, IMAGES tab;
    groups whose rewards differ first; 0: no heatmaps)"""
    heatmap_responses: int = 4
    """responses drawn per prompt group (validation: the greedy one and samples)"""

    def __post_init__(self) -> None:
        check_int("sample_log.every_n_steps", self.every_n_steps, minimum=0)
        check_int("sample_log.count", self.count)
        check_int("sample_log.heatmap_groups", self.heatmap_groups, minimum=0)
        check_int("sample_log.heatmap_responses", self.heatmap_responses)

    def due(self, step: int) -> bool:
        return self.every_n_steps > 0 and step % self.every_n_steps == 0


def _cell(text: Any) -> str:
    if not isinstance(text, str):  # a chat prompt: its messages
        text = json.dumps(text)
    # Markdown table cells: a pipe would end the cell; angle brackets would vanish as HTML.
    escaped = text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return f"`{escaped}`" if escaped else "(empty)"


def samples_markdown(groups: Sequence[Sequence[Any]], count: int) -> str:
    """A Markdown table of the first episode of each of the first ``count`` groups."""
    lines = ["| prompt | response | reward |", "|---|---|---|"]
    for group in list(groups)[:count]:
        ep = group[0]
        reward = "unscorable" if math.isnan(ep.reward) else f"{ep.reward:.3f}"
        lines.append(f"| {_cell(ep.sample.prompt)} | {_cell(ep.sample.response)} | {reward} |")
    return "\n".join(lines)
