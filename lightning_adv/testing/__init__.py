"""Test utilities: slow reference implementations the kernels are tested against
(:mod:`~lightning_adv.testing.reference_gae`) and synthetic rollout batches
(:mod:`~lightning_adv.testing.synthetic`)."""
