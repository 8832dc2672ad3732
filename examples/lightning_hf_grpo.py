"""A LightningModule that wraps a Hugging Face causal LM and TRL-style reward functions,
without this project's trainer: it samples with ``model.generate``, scores with plain
``fn(prompts, completions, **columns) -> list[float]`` functions (TRL's reward-function
signature, so the same functions serve both), and takes the advantages (``AdvantageModule``,
any recipe) and the loss (``PPOLoss``) from lightning_adv.

Run: ``python -m examples.lightning_hf_grpo [model_dir] [max_steps]`` (without a model
directory it writes a tiny random one with ``make_tiny`` into a temporary folder).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Sequence

import lightning as L
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_adv import AdvantageModule, BatchMeta, PPOLoss, recipe

RewardFunc = Callable[..., Sequence[float]]


def brevity(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """Shorter completions score higher (a reward a tiny random model can learn)."""
    return [1.0 / (1.0 + len(c)) for c in completions]


def vowels(prompts: list[str], completions: list[str], **columns) -> list[float]:
    return [sum(ch in "aeiou" for ch in c) / 10.0 for c in completions]


class HFGRPOModule(L.LightningModule):
    """GRPO (or any recipe) on a Hugging Face model with Lightning's loop."""

    def __init__(self, model_dir: str, reward_funcs: Sequence[RewardFunc] = (brevity, vowels),
                 recipe_name: str = "grpo", num_generations: int = 4, max_new_tokens: int = 8,
                 lr: float = 1e-3, epochs: int = 2):
        super().__init__()
        self.automatic_optimization = False  # several PPO epochs per rollout
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.model.train()  # from_pretrained returns it in eval mode
        self.reward_funcs = list(reward_funcs)
        self.advantage = AdvantageModule(recipe(recipe_name))
        self.loss = PPOLoss(clip_eps=0.2, loss_agg_mode="token-mean")
        self.num_generations, self.max_new_tokens = num_generations, max_new_tokens
        self.lr, self.epochs = lr, epochs

    @torch.no_grad()
    def rollout(self, prompts: list[str]) -> tuple[dict, BatchMeta, list[str]]:
        """Sample ``num_generations`` completions per prompt and lay them out as the
        pipeline reads a batch (SPEC §1): each row ``prompt | completion | padding``,
        left-aligned, the loss mask on the completion tokens (through EOS)."""
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        rows, masks, completions = [], [], []
        for prompt in prompts:
            ids = self.tokenizer(prompt, return_tensors="pt").input_ids
            out = self.model.generate(ids, do_sample=True, max_new_tokens=self.max_new_tokens,
                                      num_return_sequences=self.num_generations,
                                      pad_token_id=pad if pad is not None else eos)
            for seq in out:
                completion = seq[ids.shape[1]:].tolist()
                if eos in completion:
                    completion = completion[:completion.index(eos) + 1]
                completions.append(self.tokenizer.decode(completion, skip_special_tokens=True))
                rows.append(ids[0].tolist() + completion)
                masks.append([0] * ids.shape[1] + [1] * len(completion))
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        loss_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks])
        attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        expanded = [p for p in prompts for _ in range(self.num_generations)]
        rewards = torch.tensor([list(f(expanded, completions)) for f in self.reward_funcs]).sum(0)
        old, _ = self.aligned_logprobs(input_ids, attention)
        batch = {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask,
                 # token-aligned: the log-prob of token i at column i
                 "logprobs": F.pad(old[:, :-1], (1, 0)) * loss_mask, "rewards": rewards.float(),
                 "is_truncated": torch.tensor([eos not in r for r in rows])}
        meta = BatchMeta(n_trajs=len(prompts), traj_group_sizes=[self.num_generations] * len(prompts))
        return batch, meta, completions

    def aligned_logprobs(self, ids: torch.Tensor, attention: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob of token t+1 and the entropy at position t (the aligned convention)."""
        logp = self.model(input_ids=ids, attention_mask=attention).logits[:, :-1].log_softmax(-1)
        picked = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        return F.pad(picked, (0, 1)), F.pad(-(logp.exp() * logp).sum(-1), (0, 1))

    def training_step(self, prompts: list[str], batch_idx: int) -> None:
        batch, meta, _ = self.rollout(prompts)
        out = self.advantage(batch, meta)
        opt = self.optimizers()
        for _ in range(self.epochs):
            logprobs, entropy = self.aligned_logprobs(batch["input_ids"], batch["attention_mask"])
            result = self.loss(logprobs, out["logprobs"], out["advantages"], out["loss_mask"],
                               entropy=entropy)
            opt.zero_grad()
            self.manual_backward(result["loss"])
            opt.step()
        size = len(batch["rewards"])
        self.log("train/reward", batch["rewards"].mean(), batch_size=size, prog_bar=True)
        self.log_dict({f"train/{k}": v for k, v in result.items() if k != "num_tokens"},
                      batch_size=size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        prompts = ["hello", "the sky is", "one two", "abc"] * 64
        return torch.utils.data.DataLoader(prompts, batch_size=2, collate_fn=list)


def main(model_dir: str | None = None, max_steps: int = 4) -> L.Trainer:
    """Train for ``max_steps`` optimizer steps (``epochs`` per rollout)."""
    L.seed_everything(0, verbose=False)
    if model_dir is None:
        from lightning_adv.trainer.policies.hf.make_tiny import make_tiny  # a tiny random LM

        model_dir = tempfile.mkdtemp(prefix="tiny_lm_")
        make_tiny(model_dir)
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(HFGRPOModule(model_dir))
    print({k: round(float(v), 4) for k, v in trainer.callback_metrics.items()})
    return trainer


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None,
         *(int(a) for a in sys.argv[2:3]))
