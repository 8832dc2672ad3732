"""Configuration of the advantage pipeline (SPEC §2): frozen, self-validating dataclasses
holding only strings and JSON values, so a bad YAML fails before any worker starts.

- :class:`ActorConfig` (:mod:`~lightning_adv.config.actor`): every option that shapes
  advantages, with AReaL's field names, and the named recipes it can start from
  (:mod:`~lightning_adv.config.recipe_table`);
- :class:`AdvantageConfig` and :class:`StageSpec` (:mod:`~lightning_adv.config.stage_tree`):
  the stage tree;
- :class:`NormConfig`, :class:`TruncatedRewardConfig`, :class:`PRMAdvantageShapingConfig`
  (:mod:`~lightning_adv.config.options`);
- :func:`nested_config` (:mod:`~lightning_adv.config.nested`): mappings from YAML into
  these classes, errors keyed by their place in the tree.

Importing it loads no kernel and no stage implementation.
"""

from lightning_adv.config.actor import (
    CHECK_ACTIONS, ActorConfig, check_process_mode, critic_free_reason, warn_ignored)
from lightning_adv.config.nested import check_json_kwargs, convert_field, nested_config
from lightning_adv.config.options import (
    NORM_LEVELS, NormConfig, PRMAdvantageShapingConfig, TruncatedRewardConfig)
from lightning_adv.config.stage_tree import STAGE_FIELDS, AdvantageConfig, StageSpec

__all__ = ["ActorConfig", "AdvantageConfig", "StageSpec", "NormConfig", "TruncatedRewardConfig",
           "PRMAdvantageShapingConfig", "nested_config", "check_json_kwargs", "convert_field",
           "check_process_mode", "critic_free_reason", "warn_ignored", "STAGE_FIELDS",
           "NORM_LEVELS", "PRM_MODES", "CHECK_ACTIONS"]


def __getattr__(name: str):
    if name == "PRM_MODES":  # read from the stage registry on first use (keeps the import light)
        from lightning_adv.config import options
        return options.PRM_MODES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
