"""The stages of the advantage pipeline: their input and result types
(:mod:`~lightning_adv.stages.types`), the registry of named stages
(:mod:`~lightning_adv.stages.registry`), the built-ins by family
(:mod:`~lightning_adv.stages.outcome`, :mod:`~lightning_adv.stages.estimators`,
:mod:`~lightning_adv.stages.process`), per-row GAE lambdas
(:mod:`~lightning_adv.stages.gae_lambda`) and the checks run on user stages
(:mod:`~lightning_adv.stages.contract_checks`).

Importing this package imports none of them: the config layer reads the registry
without loading any implementation.
"""
