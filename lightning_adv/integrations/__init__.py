"""Adapters that put this project's advantages and losses inside the trainers people
already run: :mod:`~lightning_adv.integrations.verl` (verl's estimator and policy-loss
registries; it imports verl only when :func:`~lightning_adv.integrations.verl.register`
runs) and :mod:`~lightning_adv.integrations.trl` (a subclass of TRL's ``GRPOTrainer``:
importing it imports TRL, and without TRL raises an ImportError naming the extra;
:mod:`~lightning_adv.integrations.trl_advantages` holds its TRL-free functions). The
extras are ``[verl]`` and ``[trl]``."""
