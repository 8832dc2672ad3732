"""Subclassing AdvantageModule to change one stage in code.

Each stage is reached through one method (``shape_outcome``, ``estimate``,
``shape_process``); ``normalize_rewards`` and ``normalize_advantages`` can be overridden
the same way. The override below keeps the configured estimator and clips its
advantages. A subclass's own code is trusted: its results are not contract-checked.
Use it in the trainer with ``model.advantage_module: examples.subclass.ClippedAdvantageModule``.
"""

import dataclasses

from lightning_adv import ActorConfig, AdvantageModule, TemporalInputs, TemporalResult


class ClippedAdvantageModule(AdvantageModule):
    clip = 1.0

    def estimate(self, inputs: TemporalInputs) -> TemporalResult:
        result = super().estimate(inputs)
        return dataclasses.replace(result, advantages=result.advantages.clamp(-self.clip, self.clip))


def main() -> None:
    from examples.quickstart import small_batch

    batch, meta = small_batch()
    out = ClippedAdvantageModule(ActorConfig(gae_lambda=0.95))(batch, meta)
    print((out["advantages"] * out["loss_mask"]).round(decimals=3))


if __name__ == "__main__":
    main()
