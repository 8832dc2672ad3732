"""Tensor operations with no configuration: GAE (:mod:`~lightning_adv.ops.gae`, the
``lightning_adv::token_gae`` and ``lightning_adv::turn_gae`` custom ops) and the KL
estimators (:mod:`~lightning_adv.ops.kl`). Tensors in, tensors out."""
