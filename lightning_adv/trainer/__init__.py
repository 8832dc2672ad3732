"""The built-in PPO trainer: a tiny transformer policy, built-in tasks, ``PPOModule``.

The names below load on first use: ``from lightning_adv.trainer import PPOModule`` imports
Lightning, while importing a task or reward module (``lightning_adv.trainer.text_tasks``)
alone does not (a peer trainer scoring with ``char_match`` need not load Lightning).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the module that defines it.
_EXPORTS = {
    "PPOModule": "lightning_adv.trainer.ppo",
    "PPOConfig": "lightning_adv.trainer.config",
    "PRMConfig": "lightning_adv.trainer.config",
    "ScorerSpec": "lightning_adv.trainer.config",
    "PolicyConfig": "lightning_adv.trainer.policy_config",
    "CausalTransformer": "lightning_adv.trainer.policy",
    "TaskConfig": "lightning_adv.trainer.tasks",
    "Task": "lightning_adv.trainer.tasks",
    "Sample": "lightning_adv.trainer.tasks",
    "Turn": "lightning_adv.trainer.tasks",
    "ReverseTask": "lightning_adv.trainer.tasks",
    "AdditionTask": "lightning_adv.trainer.tasks",
    "GuessTask": "lightning_adv.trainer.tasks",
    "position_match": "lightning_adv.trainer.tasks",
    "guess_consistency": "lightning_adv.trainer.tasks",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value   # later lookups skip this function
        return value
    raise AttributeError(f"module 'lightning_adv.trainer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load on first use
    from lightning_adv.trainer.config import PPOConfig, PRMConfig, ScorerSpec
    from lightning_adv.trainer.policy import CausalTransformer
    from lightning_adv.trainer.policy_config import PolicyConfig
    from lightning_adv.trainer.ppo import PPOModule
    from lightning_adv.trainer.tasks import (
        AdditionTask, GuessTask, ReverseTask, Sample, Task, TaskConfig, Turn, guess_consistency,
        position_match)
