"""Adapters that put this project's advantages and losses inside the trainers people
already run: :mod:`~lightning_adv.integrations.verl` (verl's estimator and policy-loss
registries) and :mod:`~lightning_adv.integrations.trl` (TRL's ``GRPOTrainer``). Each
imports its framework only when used (the extras ``[verl]`` and ``[trl]``)."""
