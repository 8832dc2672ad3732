"""Evaluation on held-out prompts: ``validate``, ``test``, ``predict``, and validation
during ``fit`` (every ``trainer.val_check_interval`` steps, else at the end of each epoch).

The held-out prompts come from the task's own generator, at pool indices the training
pool never uses: the validation set is indices ``task.num_prompts ..
task.num_prompts + evaluation.num_prompts - 1``, the test set (also ``predict``'s) the
next ``evaluation.num_prompts``. A dataset task trains on all its lines but the last
``2 x evaluation.num_prompts`` by default, which are the two sets; a ``task.num_prompts``
that leaves either set empty is refused before training. A task with few distinct instances (``addition`` has 100)
may repeat a training instance under a new index.

Each prompt gets one greedy response and ``evaluation.n_samples`` sampled ones (at
``ppo.temperature``). Logged as ``val/...`` or ``test/...``: ``reward_greedy`` and
``solved_greedy`` (the greedy response), ``reward_mean`` (over the samples) and
``pass@k`` for each ``k`` of ``evaluation.pass_k``: the unbiased estimator of Chen et al.
(2021) over the ``n`` samples, a prompt counting as solved when a response's task reward
is at least ``evaluation.success_threshold``.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any, Optional, Sequence

import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics import MeanMetric

from lightning_adv.trainer.run.callbacks import free_path
from lightning_adv.trainer.config import EvalConfig

STAGES = ("val", "test")




def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``correct`` solve the prompt:
    ``1 - C(n - c, k) / C(n, k)``, the chance that ``k`` of the samples drawn without
    replacement hold a solution (Chen et al. 2021)."""
    if not 0 < k <= n or not 0 <= correct <= n:
        raise ValueError(f"pass_at_k: expected 0 <= correct <= n and 0 < k <= n, got n={n}, "
                         f"correct={correct}, k={k}")
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


class HeldOutPrompts(Dataset):
    """Pool indices ``start .. start + count - 1`` (never in the training pool)."""

    def __init__(self, start: int, count: int):
        self.start, self.count = start, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        return self.start + index


def held_out_loader(stage: str, train_prompts: int, config: EvalConfig,
                    pool_size: Optional[int] = None) -> DataLoader:
    """The loader of ``stage`` ("val", or "test" which ``predict`` uses too). A fixed pool
    (a dataset of ``pool_size`` lines) holds out only the lines after the training pool."""
    offset = train_prompts + (config.num_prompts if stage == "test" else 0)
    count = config.num_prompts
    if pool_size is not None and offset + count > pool_size:
        count = max(0, pool_size - offset)
        warnings.warn(f"evaluation.num_prompts: the task's pool has {pool_size} prompts and "
                      f"training uses the first {train_prompts}, so the {stage} set has "
                      f"{count} instead of {config.num_prompts} (lower task.num_prompts to "
                      f"hold out more)", stacklevel=2)
    return DataLoader(HeldOutPrompts(offset, count), batch_size=config.prompts_per_batch,
                      shuffle=False)


class EvalMetrics(nn.Module):
    """The means of one evaluation stage; logged through Lightning, which computes (synced
    across ranks) and resets them at the end of the stage."""

    def __init__(self, pass_k: Sequence[int]):
        super().__init__()
        names = ["reward_greedy", "solved_greedy", "reward_mean"] + [f"pass@{k}" for k in pass_k]
        self.pass_k = list(pass_k)
        self.means = nn.ModuleDict({name.replace("@", "_at_"): MeanMetric() for name in names})

    def update(self, greedy: Sequence[Sequence[Any]], sampled: Sequence[Sequence[Any]],
               threshold: float) -> None:
        """``greedy``/``sampled``: per prompt, its scored episodes.

        Unscorable responses (NaN rewards, ``actor.unscorable_rewards: exclude``) are left
        out: the greedy means are over the prompts whose greedy response was scored,
        ``reward_mean`` over each prompt's scored samples, and pass@k counts a prompt's
        scored samples as its ``n`` (a prompt with fewer than ``k`` is left out of pass@k).
        """
        first = torch.tensor([group[0].reward for group in greedy], dtype=torch.float64)
        scored = ~first.isnan()
        self.means["reward_greedy"].update(first.nan_to_num(0.0), scored.double())
        self.means["solved_greedy"].update((first >= threshold).double(), scored.double())
        rewards = torch.tensor([[ep.reward for ep in group] for group in sampled], dtype=torch.float64)
        n = (~rewards.isnan()).sum(1)
        self.means["reward_mean"].update((rewards.nan_to_num(0.0).sum(1) / n.clamp_min(1)),
                                         (n > 0).double())
        correct = (rewards >= threshold).sum(1)  # NaN >= threshold is False
        for k in self.pass_k:
            values = torch.tensor([pass_at_k(int(m), int(c), k) if m >= k else 0.0
                                   for m, c in zip(n, correct)], dtype=torch.float64)
            self.means[f"pass_at_{k}"].update(values, (n >= k).double())

    def items(self) -> list[tuple[str, MeanMetric]]:
        return [(name.replace("_at_", "@"), metric) for name, metric in self.means.items()]


def prediction_records(greedy: Sequence[Sequence[Any]], sampled: Sequence[Sequence[Any]]
                       ) -> list[dict[str, Any]]:
    """One JSON-able record per response: the greedy one first, then the samples."""
    records = []
    for greedy_group, group in zip(greedy, sampled):
        for number, ep in [(None, greedy_group[0])] + list(enumerate(group)):
            records.append({"prompt_index": ep.index, "prompt": ep.sample.prompt,
                            "response": ep.sample.response,
                            # JSON has no NaN: an unscorable response's reward is null
                            "reward": None if math.isnan(ep.reward) else ep.reward,
                            "greedy": number is None, "sample": number})
    return records


class PredictionWriter(BasePredictionWriter):
    """Writes ``predict``'s records as JSON lines as the batches come (rank ``r`` > 0 of a
    distributed run writes ``<name>.rank<r>.jsonl`` beside rank 0's file)."""

    def __init__(self, path: Optional[str] = None):
        super().__init__(write_interval="batch")
        self.path = path
        self.written: Optional[str] = None
        self.lines = 0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        configured = self.path or getattr(getattr(pl_module, "eval_config", None), "predictions", None)
        if configured is None:
            configured = os.path.join(trainer.log_dir or trainer.default_root_dir, "predictions.jsonl")
        if trainer.global_rank:
            stem, ext = os.path.splitext(configured)
            configured = f"{stem}.rank{trainer.global_rank}{ext}"
        os.makedirs(os.path.dirname(os.path.abspath(configured)), exist_ok=True)
        self.written = str(free_path(os.path.dirname(os.path.abspath(configured)),
                                     os.path.basename(configured)))
        open(self.written, "x").close()

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any,
                           batch_indices: Optional[Sequence[int]], batch: Tensor,
                           batch_idx: int, dataloader_idx: int) -> None:
        with open(self.written, "a") as f:
            for record in prediction:
                f.write(json.dumps(record) + "\n")
                self.lines += 1
