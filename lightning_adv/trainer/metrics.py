"""Training metrics: masked means over active tokens, synced across ranks by torchmetrics.

Each training step updates the metrics (possibly several times, once per PPO
minibatch), then :meth:`StepMetrics.compute` computes every metric on every rank
(``compute`` is collective under DDP), resets them and returns plain tensors to log.
Token metrics are weighted by the aligned loss mask, so a rank with more tokens counts
more: the true global token mean, not a mean of per-rank means.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torchmetrics import ExplainedVariance, MeanMetric, Metric


class MaskedMoments(Metric):
    """Mean and (population) standard deviation of ``x`` over positions where ``mask`` is 1."""

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for name in ("total", "squares", "count"):
            self.add_state(name, torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, x: Tensor, mask: Optional[Tensor] = None) -> None:
        x = x.detach().double()
        w = torch.ones_like(x) if mask is None else mask.detach().double()
        self.total += (x * w).sum()
        self.squares += (x * x * w).sum()
        self.count += w.sum()

    def compute(self) -> tuple[Tensor, Tensor]:
        mean = self.total / self.count
        var = (self.squares / self.count - mean * mean).clamp(min=0)
        return mean.float(), var.sqrt().float()


#: metric name (logged as ``train/<name>``) -> what it averages
TOKEN_MEANS = {
    "total_rewards": "per-token total reward (task score at the last token, KL penalty, folded process rewards)",
    "kl_rewards": "per-token KL penalty reward (-kl_ctl * KL estimate)",
    "approx_kl": "approximate KL between the updated and the rollout policy ((r - 1) - log r)",
    "clipfrac": "fraction of tokens whose probability ratio was clipped",
    "entropy": "entropy of the policy's sampling distribution",
    "policy_loss": "clipped surrogate policy loss",
    "value_loss": "clipped value loss (critic configs only)",
    "process_reward": "direct process (PRM) reward of generated tokens (prm.enabled only)",
}
ROW_MEANS = {
    "task_reward": "task (outcome) reward per episode, as the task function returned it",
    "response_length": "generated tokens per episode (all turns)",
    "truncated": "fraction of episodes whose last turn hit the token limit",
    "turns": "policy turns per episode",
}


class StepMetrics(nn.Module):
    """All metrics of one training step; ``compute()`` returns ``{"train/<name>": value}``."""

    def __init__(self, critic: bool):
        super().__init__()
        self.critic = critic
        self.means = nn.ModuleDict({name: MeanMetric() for name in (*TOKEN_MEANS, *ROW_MEANS)})
        self.advantages = MaskedMoments()
        self.explained_variance = ExplainedVariance()
        self._updated: set[str] = set()

    def update(self, name: str, value: Tensor, weight: Optional[Tensor] = None) -> None:
        value = value.detach().float()
        self.means[name].update(value, torch.ones_like(value) if weight is None
                                else weight.detach().float())
        self._updated.add(name)

    def update_advantages(self, advantages: Tensor, mask: Tensor) -> None:
        self.advantages.update(advantages, mask)

    def update_values(self, values: Tensor, returns: Tensor, mask: Tensor) -> None:
        active = mask > 0
        self.explained_variance.update(values[active].detach().float(),
                                       returns[active].detach().float())

    def compute(self) -> dict[str, Tensor]:
        """Every rank must call this (it all-reduces under DDP); metrics are reset after."""
        out = {}
        for name, metric in self.means.items():
            if name in self._updated:
                out[f"train/{name}"] = metric.compute()
            metric.reset()
        mean, std = self.advantages.compute()
        out["train/advantages_mean"], out["train/advantages_std"] = mean, std
        self.advantages.reset()
        if self.critic:
            out["train/explained_variance"] = self.explained_variance.compute()
            self.explained_variance.reset()
        self._updated.clear()
        return out
