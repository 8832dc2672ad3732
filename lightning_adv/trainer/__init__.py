"""The PPO trainer: ``PPOModule``, its policies, tasks, rollout, update, logs and runs.

The names below load on first use: ``from lightning_adv.trainer import PPOModule`` imports
Lightning, while importing a task or reward module (``lightning_adv.trainer.tasks.text``)
alone does not (a peer trainer scoring with ``char_match`` need not load Lightning).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_adv.trainer import _moved

_moved.install()  # the module paths of 0.2 (lightning_adv.trainer.policy, ...) still import

#: Each public name and the module that defines it.
_EXPORTS = {
    "PPOModule": "lightning_adv.trainer.ppo",
    "PPOConfig": "lightning_adv.trainer.config",
    "PRMConfig": "lightning_adv.trainer.config",
    "ScorerSpec": "lightning_adv.trainer.config",
    "PolicyConfig": "lightning_adv.trainer.policies.config",
    "CausalTransformer": "lightning_adv.trainer.policies.tiny_network",
    "TaskConfig": "lightning_adv.trainer.tasks.runtime",
    "Task": "lightning_adv.trainer.tasks.runtime",
    "Sample": "lightning_adv.trainer.tasks.runtime",
    "Turn": "lightning_adv.trainer.tasks.runtime",
    "ReverseTask": "lightning_adv.trainer.tasks.runtime",
    "AdditionTask": "lightning_adv.trainer.tasks.runtime",
    "GuessTask": "lightning_adv.trainer.tasks.runtime",
    "position_match": "lightning_adv.trainer.tasks.runtime",
    "guess_consistency": "lightning_adv.trainer.tasks.runtime",
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
    from lightning_adv.trainer.policies.tiny_network import CausalTransformer
    from lightning_adv.trainer.policies.config import PolicyConfig
    from lightning_adv.trainer.ppo import PPOModule
    from lightning_adv.trainer.tasks.runtime import (
        AdditionTask, GuessTask, ReverseTask, Sample, Task, TaskConfig, Turn, guess_consistency,
        position_match)
