"""A custom process-advantage shaping: add bounded, weighted process rewards.

``A + weight * clamp(r, -bound, bound)`` on active tokens. A process function runs on
every batch; ``token_rewards`` is None when the batch has no direct process rewards.
Config::

    actor:
      advantage:
        process_adv_shaping:
          implementation: examples.custom_process.bounded_additive
          kwargs: {weight: 0.5, bound: 1.0}
"""

import torch

from lightning_adv import ActorConfig, AdvantageModule, ProcessAdvantageInputs


def bounded_additive(inputs: ProcessAdvantageInputs, *, weight: float, bound: float) -> torch.Tensor:
    if inputs.token_rewards is None:
        return inputs.advantages
    bonus = inputs.token_rewards.clamp(-bound, bound) * inputs.loss_mask
    return inputs.advantages + weight * bonus


def main() -> None:
    from examples.quickstart import small_batch

    batch, meta = small_batch()
    # A process scorer's per-token rewards (token-aligned, like loss_mask).
    batch["token_rewards"] = torch.linspace(-3, 3, batch["loss_mask"].numel()).reshape(
        batch["loss_mask"].shape) * batch["loss_mask"]
    config = ActorConfig(kl_ctl=0.0, advantage={"process_adv_shaping": {
        "implementation": "examples.custom_process.bounded_additive",
        "kwargs": {"weight": 0.5, "bound": 1.0}}})
    out = AdvantageModule(config)(batch, meta)
    print((out["advantages"] * out["loss_mask"]).round(decimals=3))


if __name__ == "__main__":
    main()
