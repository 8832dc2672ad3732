"""A few sampled responses in TensorBoard every N training steps: as text (its TEXT tab),
one table of prompt, response and task reward, the first response of each of the first
``count`` prompt groups; and as per-token advantage heatmaps (its IMAGES tab,
:mod:`~lightning_adv.trainer.logs.heatmap_log`). Validation logs its greedy responses the same
way."""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

from lightning_adv.trainer.config import SampleLogConfig  # noqa: F401 -- its old home




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


def log_text(module: Any, tag: str, text: str, step: int) -> None:
    """``text`` under ``tag`` at ``step`` in the module's TensorBoard (rank 0; nothing without
    a logger that takes text)."""
    experiment = getattr(module.logger, "experiment", None)
    if module.global_rank == 0 and hasattr(experiment, "add_text"):
        experiment.add_text(tag, text, step)


def evaluation_log_step(module: Any) -> int:
    """The step an evaluation's text and images go to: during fit, that of its scalars, which
    Lightning logs at the index of the last training step (so a run resumed from a checkpoint
    has no TensorBoard event after the checkpoint's step); otherwise the rollout step."""
    trainer = getattr(module, "_trainer", None)
    fitting = trainer is not None and trainer.state.fn == "fit"
    return max(module.rollout_step - 1, 0) if fitting else module.rollout_step
