"""A minimal LightningModule that computes advantages on its rank's prompt groups.

Used by the DDP parity tests: each rank writes what it computed to ``out_dir``. It lives
in an importable module because ddp_spawn pickles the module into its worker processes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import torch

from lightning_adv import ActorConfig, AdvantageModule, RolloutGroup, concat_batch


def prompt_groups(seed: int = 0, n_prompts: int = 4,
                  broken: list[tuple[int, str]] = ()) -> list[dict]:
    """Prompt groups of different sizes and widths, some split into logical rollouts.

    Each ``(prompt, kind)`` of ``broken`` changes one prompt: ``split_rows`` drops its
    explicit reference and gives the two rows of its split rollout different rewards
    (invalid under reward normalization); ``tool_tail`` makes its first row end with a
    non-generated token; ``process_range`` puts a process reward of 1.5 on a generated
    token; ``one_row`` makes every row its own logical rollout (no split, no reference).
    """
    broken = set(broken)
    g = torch.Generator().manual_seed(seed)
    groups = []
    for p in range(n_prompts):
        rows = 2 + p % 3
        width = 6 + 2 * p
        prompt_len = 1 + p % 2
        attention = torch.zeros(rows, width, dtype=torch.bool)
        loss = torch.zeros(rows, width, dtype=torch.int32)
        for r in range(rows):
            length = int(torch.randint(prompt_len + 1, width + 1, (1,), generator=g))
            attention[r, :length] = True
            loss[r, prompt_len:length] = 1
        rewards = torch.randint(0, 3, (rows,), generator=g).float()
        group = None
        if p % 2 == 1 and (p, "one_row") not in broken:
            # two rows of one logical rollout with an explicit reference
            reference = None if (p, "split_rows") in broken else 0.5
            group = RolloutGroup((2,) + (1,) * (rows - 2), (reference,) + (None,) * (rows - 2))
            if (p, "split_rows") in broken:
                rewards[1] = rewards[0] + 1
        if (p, "tool_tail") in broken:
            last = int(attention[0].sum()) - 1
            loss[0, last] = 0
            loss[0, prompt_len] = 1
        token_rewards = torch.rand(rows, width, generator=g) * loss
        if (p, "process_range") in broken:
            token_rewards[0, prompt_len] = 1.5
            loss[0, prompt_len] = 1
        groups.append({
            "input_ids": torch.randint(1, 50, (rows, width), generator=g) * attention,
            "attention_mask": attention, "loss_mask": loss,
            "logprobs": -torch.rand(rows, width, generator=g) * loss,
            "ref_logp": -torch.rand(rows, width, generator=g) * attention,
            "values": torch.randn(rows, width, generator=g) * attention,
            "token_rewards": token_rewards, "rewards": rewards, "rollout_group": group,
            # Explicit: the "row fills the padded width" fallback depends on the padding,
            # which differs between one process and a rank.
            "is_truncated": torch.rand(rows, generator=g) < 0.3,
        })
    return groups


def advantages(config: ActorConfig, groups: list[dict]) -> dict:
    batch, meta = concat_batch(groups)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = AdvantageModule(config)(batch, meta)
    return {k: out[k] for k in ("advantages", "returns", "rewards", "tot_rewards")}


class AdvantageProbe(L.LightningModule):
    """Rank r takes prompt groups [r * k, (r + 1) * k) of the global batch."""

    def __init__(self, configs: dict, out_dir: str, n_prompts: int = 4,
                 broken: dict[str, list[tuple[int, str]]] | None = None):
        super().__init__()
        self.configs = configs
        self.broken = broken or {}
        self.out_dir = out_dir
        self.n_prompts = n_prompts
        self.automatic_optimization = False
        self.anchor = torch.nn.Parameter(torch.zeros(()))

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.zeros(self.trainer.world_size, 1), batch_size=1)

    def training_step(self, batch, batch_idx):
        per_rank = self.n_prompts // self.trainer.world_size
        mine = slice(self.global_rank * per_rank, (self.global_rank + 1) * per_rank)
        results = {}
        for name, config in self.configs.items():
            groups = prompt_groups(n_prompts=self.n_prompts, broken=self.broken.get(name, ()))
            try:
                results[name] = advantages(ActorConfig(**config), groups[mine])
            except (ValueError, RuntimeError) as exc:
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        torch.save(results, Path(self.out_dir) / f"rank{self.global_rank}.pt")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)
