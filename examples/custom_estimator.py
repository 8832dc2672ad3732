"""A custom temporal estimator: token GAE whose advantages are clipped to [-clip, clip].

It resolves lambda with ``compute_gae_lambda`` (so a per-row lambda function from the
config keeps working) and reuses the public kernel. Config::

    actor:
      gae_lambda: 0.95
      advantage:
        estimator:
          implementation: examples.custom_estimator.clipped_token_gae
          kwargs: {clip: 2.0}
"""

from lightning_adv import (
    ActorConfig, AdvantageModule, TemporalInputs, TemporalResult, compute_gae_lambda,
    compute_token_gae)


def clipped_token_gae(inputs: TemporalInputs, *, clip: float) -> TemporalResult:
    # Same per-step rewards as the built-in token GAE: KL + outcome (+ folded process).
    rewards = inputs.kl_rewards + inputs.outcome_rewards
    if inputs.process_rewards is not None:
        rewards = rewards + inputs.process_rewards
    advantages, returns = compute_token_gae(
        rewards, inputs.values, inputs.loss_mask,
        bootstrap_values=inputs.bootstrap_values * inputs.is_truncated,
        discount=inputs.discount, gae_lambda=compute_gae_lambda(inputs, "token"))
    return TemporalResult(advantages.clamp(-clip, clip), returns, rewards)


def main() -> None:
    from examples.quickstart import small_batch

    batch, meta = small_batch()
    config = ActorConfig(gae_lambda="lightning_adv.vapo_length_adaptive_gae",
                         gae_lambda_kwargs={"alpha": 0.5},
                         advantage={"estimator": {
                             "implementation": "examples.custom_estimator.clipped_token_gae",
                             "kwargs": {"clip": 0.5}}})
    out = AdvantageModule(config)(batch, meta)
    print("advantages, clipped to [-0.5, 0.5]:")
    print((out["advantages"] * out["loss_mask"]).round(decimals=3))


if __name__ == "__main__":
    main()
