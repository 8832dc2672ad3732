"""The built-in trainer's own metrics: episodes (rewards, lengths, turns) and the critic's
explained variance, synced across ranks by torchmetrics.

Everything about advantages and the loss (token means of total and KL rewards, advantage
and return statistics, policy/value loss, approx KL, clip fraction, entropy, process
rewards) is :class:`~lightning_adv.AdvantageMetrics`, which any trainer can use; this
module holds only what needs the trainer's episodes.

Each training step updates the metrics, then :meth:`StepMetrics.compute` computes every
metric on every rank (``compute`` is collective under DDP), resets them and returns plain
tensors to log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torchmetrics import ExplainedVariance, MeanMetric, SumMetric

#: metric name (logged as ``train/<name>``) -> what it averages over episodes
ROW_MEANS = {
    "task_reward": "task (outcome) reward per episode, as the task function returned it "
                   "(over the scored episodes: unscorable ones, NaN, are left out)",
    "rlhf_reward": "per episode: task reward + its summed KL penalty + its summed process "
                   "rewards, before any normalization (TRL's objective/rlhf_reward); over "
                   "the scored episodes",
    "response_length": "generated tokens per episode (all turns)",
    "sampled_per_episode": "tokens sampled per episode: its generated tokens less those an "
                           "earlier row of its tree sampled (ppo.tree: a tree's tokens per "
                           "leaf), plus its ppo.vine continuations'",
    "truncated": "fraction of episodes whose last turn hit the token limit",
    "turns": "policy turns per episode",
}


def rlhf_rewards(task_rewards: Tensor, out: Mapping[str, Any]) -> Tensor:
    """What the policy is optimizing, per episode, before any normalization: the raw task
    reward plus the episode's summed KL penalty (``kl_rewards``, zero off the generated
    tokens) and its summed direct process rewards (``token_rewards`` on generated tokens)."""
    total = task_rewards.double() + out["kl_rewards"].double().sum(1)
    if "token_rewards" in out:
        total = total + (out["token_rewards"].double()
                         * out["input_token_loss_mask"].double()).sum(1)
    return total.float()


class StepMetrics(nn.Module):
    """Episode metrics of one training step; ``compute()`` returns ``{"train/<name>": value}``."""

    def __init__(self, critic: bool, vine: bool = False):
        super().__init__()
        self.critic = critic
        self.means = nn.ModuleDict({name: MeanMetric() for name in ROW_MEANS})
        if vine:  # ppo.vine: tokens sampled for the step values, per episode
            self.means["vine_tokens"] = MeanMetric()
        # The step's sampling cost, the x axis of an equal-token-budget comparison
        # (benchmarks/token_budget.py): a sum over the step's episodes and ranks.
        self.sampled_tokens = SumMetric().set_dtype(torch.float64)  # exact past 2**24 tokens
        self.explained_variance = ExplainedVariance()

    def update(self, name: str, value: Tensor, weight: Optional[Tensor] = None) -> None:
        value = value.detach().float()
        self.means[name].update(value, torch.ones_like(value) if weight is None
                                else weight.detach().float())

    def update_scored(self, name: str, value: Tensor) -> None:
        """:meth:`update` over the finite entries of ``value`` only: NaN marks an unscorable
        episode (``actor.unscorable_rewards: exclude``), which has no reward to average. A
        step with none scored adds nothing (under DDP the other ranks' episodes count)."""
        scored = ~torch.isnan(value)
        self.update(name, torch.where(scored, value, torch.zeros_like(value)), scored.float())

    def update_step(self, batch: Mapping[str, Any], out: Mapping[str, Any],
                    groups: Sequence[Sequence[Any]], sampled: Sequence[Sequence[Any]]) -> None:
        """The episode metrics of one training step: its rollout ``batch`` of the episodes of
        ``groups``, the advantage module's output ``out``, and ``sampled``, the groups whose
        rewards ``train/task_reward`` reports (under dynamic sampling the first round's,
        unfiltered)."""
        m = out["loss_mask"]
        episodes = [ep for group in groups for ep in group]
        task_rewards = torch.tensor([ep.reward for ep in episodes], device=m.device)
        reported = [ep.reward for group in sampled for ep in group]
        # Unscorable episodes (NaN, actor.unscorable_rewards: exclude) have no reward to
        # average: the reward means are over the scored ones (the lengths count them all).
        self.update_scored("task_reward", torch.tensor(reported, device=m.device))
        self.update_scored("rlhf_reward", rlhf_rewards(task_rewards, out))
        self.update("response_length", batch["loss_mask"].sum(1).float())
        sampled = torch.tensor([float(ep.sampled_tokens) for ep in episodes], device=m.device)
        self.update("sampled_per_episode", sampled)
        self.sampled_tokens.update(sampled)
        self.update("truncated", batch["is_truncated"].float())
        self.update("turns", torch.tensor([float(len(ep.turns)) for ep in episodes]))
        if "vine_tokens" in self.means:
            self.update("vine_tokens", torch.tensor([float(ep.continuation_tokens)
                                                     for ep in episodes]))
        if self.critic:
            # An unscorable row's returns are its own values (it has no target): counted,
            # its tokens would be perfectly predicted ones and lift explained variance.
            scored = m if "unscorable" not in out else m * ~out["unscorable"][:, None]
            self.update_values(batch["values"], out["returns"], scored)

    def update_values(self, values: Tensor, returns: Tensor, mask: Tensor) -> None:
        active = mask > 0
        self.explained_variance.update(values[active].detach().float(),
                                       returns[active].detach().float())

    def compute(self) -> dict[str, Tensor]:
        """Every rank must call this (it all-reduces under DDP); metrics are reset after."""
        out = {}
        for name, metric in self.means.items():
            out[f"train/{name}"] = metric.compute()
            metric.reset()
        # tokens the sampler drew for the step's episodes: generated tokens, a tree's shared
        # prefixes once (ppo.tree), ppo.vine's continuations included
        out["train/sampled_tokens"] = self.sampled_tokens.compute()
        self.sampled_tokens.reset()
        if self.critic:
            out["train/explained_variance"] = self.explained_variance.compute()
            self.explained_variance.reset()
        return out


@torch.no_grad()
def episode_kl(out: Mapping[str, Any]) -> tuple[float, int]:
    """The KL between the rollout and the reference policy, for the KL controller: the mean
    over episodes of each episode's summed k1 estimate (TRL's and Ziegler et al.'s
    measure), global under DDP so every rank's controller moves alike; and the episodes."""
    mask = out["loss_mask"]
    per_row = ((out["logprobs"] - out["ref_logp"]) * mask).sum(1)
    totals = torch.stack([per_row.sum(), torch.tensor(float(len(per_row)), device=per_row.device)])
    totals = totals.double()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    return float(totals[0] / totals[1]), int(totals[1])


def logging_due(trainer: Any) -> bool:
    """Whether Lightning's loggers write this training step's scalars: every
    ``Trainer(log_every_n_steps=...)`` training steps, and when training stops.

    The trainer hands its statistics to ``self.log`` on those steps only (the task reward
    goes every step: the progress bar, checkpoint monitors): on the others Lightning's
    loggers would drop them, and each ``self.log`` call has a cost of its own (torchmetrics
    copies the key's state), paid for twenty-odd keys. What reaches the loggers is the
    same; ``trainer.callback_metrics`` holds the values of the last logging step."""
    connector = getattr(trainer, "_logger_connector", None)  # (the rule has no public name)
    return connector is None or bool(connector.should_update_logs)


def log_histogram(logger: Any, rank: int, step: int, tag: str, values: Tensor) -> None:
    """A TensorBoard histogram of ``values`` at ``step`` (rank 0; the caller calls it on
    the steps of :func:`logging_due`)."""
    experiment = getattr(logger, "experiment", None)
    if rank == 0 and hasattr(experiment, "add_histogram") and values.numel():
        experiment.add_histogram(tag, values.float().cpu(), step)
