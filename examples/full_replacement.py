"""Replacing the whole computation: GRPO written from scratch as one function.

A full replacement owns alignment: it moves token-aligned tensors to the next-token
convention itself, and returns everything the trainer reads. Config::

    actor:
      advantage:
        compute:
          implementation: examples.full_replacement.grpo_advantages
          kwargs: {eps: 1.0e-6}
"""

import torch

from lightning_adv import ActorConfig, AdvantageInputs, AdvantageModule, AdvantageResult


def grpo_advantages(inputs: AdvantageInputs, *, eps: float = 1e-6) -> AdvantageResult:
    data, meta = inputs.data, inputs.meta
    if meta is None:
        raise ValueError("grpo_advantages: needs meta (prompt groups); build the batch with "
                         "concat_batch")
    mask = torch.roll(data["loss_mask"].float(), -1, dims=-1)
    logprobs = torch.roll(data["logprobs"], -1, dims=-1) * mask
    rewards = data["rewards"].float()
    normalized = torch.empty_like(rewards)
    start = 0
    for size in meta.traj_group_sizes:
        group = rewards[start:start + size]
        std = group.std() if size > 1 else torch.ones(())
        normalized[start:start + size] = (group - group.mean()) / (std + eps)
        start += size
    advantages = normalized[:, None] * mask
    seqlens = data["attention_mask"].sum(dim=1)
    extras = {"is_truncated": seqlens == mask.shape[1], "input_token_loss_mask": data["loss_mask"],
              "prox_logp": logprobs.clone()}
    if data.get("mopd_teacher_logp_sum") is not None:
        extras["mopd_behavior_logprobs"] = logprobs.detach().clone()
    return AdvantageResult(advantages=advantages, returns=advantages.clone(), loss_mask=mask,
                           logprobs=logprobs, rewards=data["rewards"],
                           total_rewards=torch.zeros_like(advantages),
                           kl_rewards=torch.zeros_like(advantages), extras=extras)


def main() -> None:
    from examples.quickstart import small_batch

    batch, meta = small_batch()
    module = AdvantageModule(ActorConfig(advantage={"compute": {
        "implementation": "examples.full_replacement.grpo_advantages"}}))
    print(module)
    out = module(batch, meta)
    print((out["advantages"] * out["loss_mask"]).round(decimals=3))


if __name__ == "__main__":
    main()
