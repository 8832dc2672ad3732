"""Your own trainer: a LightningModule that owns its policy, sampling and reward, and takes
the advantages (an ``AdvantageModule`` subclass), the loss (``PPOLoss``) and the metrics
(``AdvantageMetrics``) from lightning_adv.

Toy task: after a prompt token p, emit p+1, p+2, p+3, p+4 (mod 8); the reward is the
fraction of right tokens. GRPO-style: 8 samples per prompt, group-normalized rewards, no
critic, two PPO epochs per rollout. Logs to TensorBoard under runs/own_trainer.
Run: ``python -m examples.own_trainer [max_steps]``.
"""

import sys

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn

from lightning_adv import (
    ActorConfig, AdvantageMetrics, AdvantageModule, BatchMeta, NormConfig, OutcomeResult,
    OutcomeRewardInputs, PPOLoss)

VOCAB, ANSWER_LEN, PROMPTS, SAMPLES, EPOCHS = 8, 4, 4, 8, 2


class ExactAnswerBonus(AdvantageModule):
    """Overrides one stage (outcome shaping): a fully right answer earns 0.5 extra."""

    def shape_outcome(self, inputs: OutcomeRewardInputs) -> OutcomeResult:
        rewards = inputs.data["rewards"]
        return OutcomeResult(rewards + 0.5 * (rewards == 1.0).float())


class TinyPolicy(nn.Module):
    """Next-token logits from the current token, the prompt token and the position."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.token, self.prompt = nn.Embedding(VOCAB, width), nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(ANSWER_LEN + 1, width)
        self.head = nn.Sequential(nn.Tanh(), nn.Linear(width, VOCAB))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.token(ids) + self.prompt(ids[:, :1]) + self.position.weight[: ids.shape[1]]
        return self.head(h)


class OwnTrainer(L.LightningModule):
    def __init__(self, lr: float = 0.02, seed: int = 0):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False  # several PPO epochs per rollout
        self.policy = TinyPolicy()
        norm = NormConfig(mean_level="group", std_level="group")
        self.advantage = ExactAnswerBonus(ActorConfig(kl_ctl=0.0, reward_norm=norm))
        self.loss = PPOLoss(clip_eps=0.2, loss_agg_mode="seq-mean-token-mean", entropy_coef=0.01)
        self.adv_metrics = AdvantageMetrics()

    def aligned_logprobs(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob of token t+1 and the entropy at position t (the aligned convention)."""
        logp = self.policy(ids)[:, :-1].log_softmax(-1)
        picked = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        return F.pad(picked, (0, 1)), F.pad(-(logp.exp() * logp).sum(-1), (0, 1))

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        ids = prompts.repeat_interleave(SAMPLES)[:, None]
        for _ in range(ANSWER_LEN):
            probs = self.policy(ids)[:, -1].softmax(-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], 1)
        return ids

    def training_step(self, step: torch.Tensor, batch_idx: int) -> None:
        gen = torch.Generator().manual_seed(self.hparams.seed * 1_000_003 + int(step))
        ids = self.sample(torch.randint(VOCAB, (PROMPTS,), generator=gen), gen)
        target = (ids[:, :1] + torch.arange(1, ANSWER_LEN + 1)) % VOCAB
        rewards = (ids[:, 1:] == target).float().mean(1)
        generated = torch.ones_like(ids)
        generated[:, 0] = 0  # the prompt token
        with torch.no_grad():
            old_logprobs, _ = self.aligned_logprobs(ids)
        batch = {  # SPEC §1: loss_mask and logprobs are token-aligned (token i at column i)
            "input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": generated,
            "logprobs": F.pad(old_logprobs[:, :-1], (1, 0)), "rewards": rewards,
            "is_truncated": torch.zeros(len(ids), dtype=torch.bool)}
        meta = BatchMeta(n_trajs=PROMPTS, traj_group_sizes=[SAMPLES] * PROMPTS)
        out = self.advantage(batch, meta)  # aligned advantages, loss mask, old log-probs

        opt = self.optimizers()
        for _ in range(EPOCHS):
            logprobs, entropy = self.aligned_logprobs(ids)
            result = self.loss(logprobs, out["logprobs"], out["advantages"], out["loss_mask"],
                               entropy=entropy)
            opt.zero_grad()
            self.manual_backward(result["loss"])
            opt.step()
        self.log("train/task_reward", rewards.mean(), prog_bar=True, batch_size=len(ids))
        self.log_dict(self.adv_metrics(out, meta, loss=result), batch_size=len(ids))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.policy.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.arange(100_000), batch_size=None)


def main(max_steps: int = 160, root: str = "runs") -> OwnTrainer:
    """Train; ``max_steps`` counts optimizer steps (``EPOCHS`` per rollout)."""
    L.seed_everything(0, verbose=False)
    model = OwnTrainer()
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, log_every_n_steps=1,
                        logger=TensorBoardLogger(root, name="own_trainer"),
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model)
    print(f"task reward {float(trainer.callback_metrics['train/task_reward']):.3f} after "
          f"{max_steps // EPOCHS} rollouts; logs in {trainer.logger.log_dir}")
    return model


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
