"""The trainer's advantage heatmaps (TensorBoard's IMAGES tab), every ``sample_log.every_n_steps``
training steps and at each validation:

- ``train/advantage_heatmap``: a few responses of the step, token by token, coloured by
  the advantage they were trained with (:func:`~lightning_adv.visualize.advantage_heatmap`),
  with the critic's values and the process rewards as strips when the run has them, the
  token entropy when the batch carries it, and in decoupled off-policy runs each token's
  log importance weight (and, with rollout rejection, the rejected tokens);
  ``sample_log.heatmap_groups`` prompt groups (those whose rewards differ first: a group
  of equal rewards has nothing to compare), ``sample_log.heatmap_responses`` responses each;
- ``train/advantage_heatmap_raw``: the same responses coloured by the estimator's
  advantages before normalization, when the config normalizes them (``actor.adv_norm``);
- ``val/advantage_heatmap`` (``test/`` under ``test``): the greedy responses of the first
  held-out prompts, each scored as the trainer would score it among its prompt's group:
  the greedy response and the evaluation's samples, through the same advantage module
  (process scorers and critic included); the greedy response first, then samples.

Under ``ppo.tree`` the training image draws the first ``heatmap_responses`` leaves of each
chosen prompt's tree in path order (whole subtrees first): each shared prefix once, a mark
at each segment's start, a shared token coloured by the mean of the advantages over all
the batch's rows through its node; a line between prompts. The evaluation's independent
responses are one-node trees: nothing shared.

Drawing needs matplotlib (the ``plot`` extra); without it one line says so and the
images are skipped. Loggers with ``experiment.add_image`` (TensorBoard) or ``log_image``
(Weights & Biases, ...) receive them; with neither, nothing is drawn.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from typing import Any, Optional

from lightning_adv.trainer.data import generator
from lightning_adv.trainer.logs.sample_log import SampleLogConfig
from lightning_adv.trainer.rollout.batch import score
from lightning_adv.visualize import Heatmap, advantage_heatmap, heatmap_inputs

log = logging.getLogger(__name__)

#: ``out`` key -> tag suffix of its image
ADVANTAGE_KEYS = {"advantages": "", "unnormalized_advantages": "_raw"}
TITLES = {"advantages": "the advantages trained on", "unnormalized_advantages":
          "the estimator's, before actor.adv_norm"}


class HeatmapLog:
    """Draws and logs a module's heatmaps (see the module docstring)."""

    def __init__(self, config: SampleLogConfig, vocab: Any):
        self.config = config
        self.vocab = vocab
        self.missing: str | None = None
        """why matplotlib could not be imported ("" once it was)"""

    def token_text(self, token: int) -> str:
        # A token's own text; a special token (decoded to nothing) by its name.
        return self.vocab.decode([token]) or self.vocab.token_text(token)

    def wanted(self, module: Any) -> bool:
        """Heatmaps are drawn: they are on, a logger takes images and matplotlib imports (the
        same answer on every rank: the evaluation's advantages are a collective)."""
        config = self.config
        if not (config.every_n_steps and config.heatmap_groups and image_loggers(module)):
            return False
        if self.missing is None:
            try:
                import matplotlib  # noqa: F401
                self.missing = ""
            except ImportError as exc:
                self.missing = str(exc) or "no module named 'matplotlib'"
                if module.global_rank == 0:
                    log.warning("advantage heatmaps are skipped: matplotlib is not installed "
                                "(pip install 'lightning_adv[plot]'; %s)", self.missing)
        return not self.missing

    def training(self, module: Any, batch: dict[str, Any], out: dict[str, Any],
                 groups: Sequence[Sequence[Any]]) -> dict[str, Heatmap]:
        """``train/advantage_heatmap[_raw]`` of the step's rollout ``batch`` of ``groups`` and
        its advantages ``out``; the heatmaps drawn, by tag."""
        if module.global_rank != 0 or not self.wanted(module):
            return {}
        chosen = []
        offsets = [0]
        for group in groups:
            offsets.append(offsets[-1] + len(group))
        kind = "leaf" if "tree_node_ids" in batch else "response"
        for g in chosen_groups(groups, self.config.heatmap_groups):
            # a tree's first leaves in path order: whole subtrees, then part of the next
            for s, ep in enumerate(groups[g][: self.config.heatmap_responses]):
                chosen.append((offsets[g] + s, f"prompt {ep.index} · group {g} · {kind} {s} · "
                                               f"{reward_text(ep.reward)}"))
        return self.draw_and_log(module, "train", batch, out, chosen, [len(g) for g in groups])

    def evaluation(self, module: Any, stage: str, greedy: Sequence[Sequence[Any]],
                   sampled: Sequence[Sequence[Any]], step: Optional[int] = None) -> None:
        """``<stage>/advantage_heatmap[_raw]``: the first prompts' greedy responses, scored
        among their samples, logged at ``step`` (that of the stage's scalars; default the
        rollout step). Every rank calls this (the advantage module's statistics are
        collectives under DDP); rank 0 draws."""
        if not self.wanted(module):
            return
        count = min(self.config.heatmap_groups, len(greedy))
        groups = [[*greedy[g][:1], *sampled[g]] for g in range(count)]
        tree = module.ppo_config.tree is not None
        if module.scorers or module.rollouts.vine is not None or tree:
            groups = [[copy.copy(ep) for ep in group] for group in groups]
        if module.scorers:  # the evaluation scored outcomes only; the heatmap shows both
            score(groups, module.runtime, module.scorers)
        if module.rollouts.vine is not None:  # estimator vine reads their step values
            module.rollouts.step_values(groups, generator(
                module.seed, "vine", stage, module.rollout_step, module.global_rank))
        if tree:  # independent responses: to a tree estimator, a tree of one level
            for group in groups:
                for s, ep in enumerate(group):
                    ep.tree_node_ids = [s if g else -1 for g in ep.generated]
        baselines = ([group[0].reward for group in groups]
                     if module.ppo_config.greedy_baseline else None)
        batch, meta = module.make_batch(groups, baselines)
        out = module.advantage(batch, meta, prm=module.prm_shaping,
                               kl_coef=module.kl_controller.value)
        if module.global_rank != 0:
            return
        chosen, start = [], 0
        for g, group in enumerate(groups):
            for s, ep in enumerate(group[: self.config.heatmap_responses]):
                kind = "greedy" if s == 0 else f"sample {s}"
                chosen.append((start + s, f"prompt {ep.index} · group {g} · {kind} · "
                                          f"{reward_text(ep.reward)}"))
            start += len(group)
        self.draw_and_log(module, stage, batch, out, chosen, [len(g) for g in groups], step)

    def draw_and_log(self, module: Any, stage: str, batch: dict[str, Any], out: dict[str, Any],
                     chosen: Sequence[tuple[int, str]], group_sizes: list[int],
                     step: Optional[int] = None) -> dict[str, Heatmap]:
        """The heatmaps of the ``chosen`` rows of ``batch`` (each with its label), whose
        prompt groups have ``group_sizes`` rows (a tree batch's shared tokens are
        coloured by the mean over all the rows through their node), logged; by tag."""
        step = module.rollout_step if step is None else step
        rows, labels = [row for row, _ in chosen], [label for _, label in chosen]
        tree = " · shared segments: the mean over their rows" if "tree_node_ids" in batch else ""
        drawn = {}
        correction = module.ppo_config.rollout_correction
        correction = None if correction is None else correction.kwargs()
        for key, suffix in ADVANTAGE_KEYS.items():
            if key not in out:
                continue
            inputs = heatmap_inputs(batch, out, self.token_text, rows, advantages_key=key,
                                    correction=correction, group_sizes=group_sizes)
            tag = f"{stage}/advantage_heatmap{suffix}"
            heatmap = advantage_heatmap(**inputs, labels=labels,
                                        title=f"{tag} · step {step} · {TITLES[key]}{tree}")
            for logger in image_loggers(module):
                log_image(logger, tag, heatmap.image, step)
            drawn[tag] = heatmap
        return drawn


def chosen_groups(groups: Sequence[Sequence[Any]], count: int) -> list[int]:
    """Indices of ``count`` groups: those whose (scored) rewards differ first, in order, then
    the others."""
    def differ(group: Sequence[Any]) -> bool:
        rewards = {ep.reward for ep in group if not math.isnan(ep.reward)}
        return len(rewards) > 1

    order = sorted(range(len(groups)), key=lambda g: not differ(groups[g]))
    return sorted(order[:count])


def reward_text(reward: float) -> str:
    return "reward unscorable" if math.isnan(reward) else f"reward {reward:.3f}"


def image_loggers(module: Any) -> list[Any]:
    """The module's loggers that take images."""
    return [logger for logger in getattr(module, "loggers", None) or []
            if hasattr(getattr(logger, "experiment", None), "add_image")
            or hasattr(logger, "log_image")]


def log_image(logger: Any, tag: str, image: Any, step: int) -> None:
    """``image`` (``[H, W, 3]`` uint8) to TensorBoard's IMAGES tab, or through a
    ``log_image(key, images, step)`` logger."""
    experiment = getattr(logger, "experiment", None)
    if hasattr(experiment, "add_image"):
        experiment.add_image(tag, image, step, dataformats="HWC")
    else:
        logger.log_image(key=tag, images=[image], step=step)
