"""Compute advantages for a small built-in batch and print them.

Two prompts, three sampled responses each, a critic, a reference policy and GRPO-style
group normalization of the outcome rewards.
"""

import torch

from lightning_adv import ActorConfig, AdvantageModule, NormConfig, concat_batch


def prompt_group(seed: int, prompt_len: int, response_lens: list[int], rewards: list[float]) -> dict:
    g = torch.Generator().manual_seed(seed)
    rows, width = len(response_lens), prompt_len + max(response_lens) + 1
    attention = torch.zeros(rows, width, dtype=torch.bool)
    loss_mask = torch.zeros(rows, width, dtype=torch.int32)
    for i, n in enumerate(response_lens):
        attention[i, : prompt_len + n] = True
        loss_mask[i, prompt_len: prompt_len + n] = 1
    return {
        "input_ids": torch.randint(1, 100, (rows, width), generator=g) * attention,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "logprobs": -torch.rand(rows, width, generator=g) * loss_mask,
        "ref_logp": -torch.rand(rows, width, generator=g) * attention,
        "values": torch.randn(rows, width, generator=g) * attention,
        "rewards": torch.tensor(rewards),
    }


def small_batch():
    """Two prompts with three sampled responses each, as (batch, meta)."""
    return concat_batch([
        prompt_group(0, prompt_len=3, response_lens=[4, 2, 5], rewards=[1.0, 0.0, 1.0]),
        prompt_group(1, prompt_len=2, response_lens=[3, 3, 1], rewards=[0.0, 0.0, 1.0]),
    ])


def main() -> None:
    batch, meta = small_batch()
    config = ActorConfig(discount=1.0, gae_lambda=0.95, kl_ctl=0.05,
                         reward_norm=NormConfig(mean_level="group", std_level="group"))
    module = AdvantageModule(config)
    print(module)
    out = module(batch, meta)
    torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
    print("advantages (next-token aligned; 0 off generated tokens):")
    print(out["advantages"] * out["loss_mask"])
    print("returns:")
    print(out["returns"] * out["loss_mask"])


if __name__ == "__main__":
    main()
