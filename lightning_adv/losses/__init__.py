"""The loss side: :class:`~lightning_adv.losses.ppo_loss.PPOLoss`, verl's aggregation modes
(:mod:`~lightning_adv.losses.aggregation`) and the KL coefficient controllers
(:mod:`~lightning_adv.losses.kl_controllers`)."""
