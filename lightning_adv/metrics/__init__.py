"""torchmetrics metrics of advantages, rewards and losses (:mod:`~lightning_adv.metrics.advantage_metrics`)
and of off-policy batches (:mod:`~lightning_adv.metrics.off_policy_metrics`), synced across ranks."""
