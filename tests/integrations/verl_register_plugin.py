"""A pytest plugin (``-p tests.integrations.verl_register_plugin``) that calls
:func:`lightning_adv.integrations.verl.register` before verl's own tests are collected,
so they run against verl's registries with the la_ adapters in them. Once collection is
done (before the first test; verl's registry tests then clear and replace its estimator
registry themselves) it writes the la_ names in verl's registries to the file named by
``LIGHTNING_ADV_REGISTERED_FILE`` (when set), for the test that runs it."""

import json
import os

from lightning_adv.integrations.verl import register


def pytest_configure(config):
    register()


def pytest_collection_finish(session):
    path = os.environ.get("LIGHTNING_ADV_REGISTERED_FILE")
    if path:
        from verl.trainer.ppo import core_algos

        names = {"estimators": sorted(n for n in core_algos.ADV_ESTIMATOR_REGISTRY if n.startswith("la_")),
                 "policy_losses": sorted(n for n in core_algos.POLICY_LOSS_REGISTRY if n.startswith("la_"))}
        with open(path, "w") as f:
            json.dump(names, f)
