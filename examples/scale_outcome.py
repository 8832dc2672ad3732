"""The design note's outcome stage: scale every task reward by a factor.

Config::

    actor:
      advantage:
        outcome_reward_shaping:
          implementation: examples.scale_outcome.scale_outcome
          kwargs: {factor: 0.5}
"""

from lightning_adv import ActorConfig, AdvantageModule, OutcomeResult, OutcomeRewardInputs


def scale_outcome(inputs: OutcomeRewardInputs, *, factor: float) -> OutcomeResult:
    return OutcomeResult(rewards=inputs.data["rewards"] * factor)


def main() -> None:
    from examples.quickstart import small_batch

    batch, meta = small_batch()
    config = ActorConfig(kl_ctl=0.0, advantage={"outcome_reward_shaping": {
        "implementation": "examples.scale_outcome.scale_outcome", "kwargs": {"factor": 0.5}}})
    module = AdvantageModule(config)
    print(module)
    out = module(batch, meta)
    print("task rewards:  ", batch["rewards"].tolist())
    print("shaped rewards:", out["rewards"].tolist())


if __name__ == "__main__":
    main()
