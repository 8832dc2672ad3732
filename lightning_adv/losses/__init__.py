"""The loss side: :class:`~lightning_adv.losses.ppo_loss.PPOLoss`, the policy losses it can
use (:mod:`~lightning_adv.losses.policy_loss_registry`,
:mod:`~lightning_adv.losses.policy_losses`), rollout correction for off-policy tokens
(:mod:`~lightning_adv.losses.rollout_correction`), verl's aggregation modes
(:mod:`~lightning_adv.losses.aggregation`) and the KL coefficient controllers
(:mod:`~lightning_adv.losses.kl_controllers`)."""
