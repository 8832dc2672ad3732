"""The rollout batch: how its rows group into prompts and logical rollouts
(:mod:`~lightning_adv.batch.grouping`: ``BatchMeta``, ``RolloutGroup``, ``concat_batch``,
``split_batch``) and its checks at the pipeline's boundary
(:mod:`~lightning_adv.batch.validation`)."""
