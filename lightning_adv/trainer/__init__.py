"""The built-in PPO trainer: a tiny transformer policy, built-in tasks, ``PPOModule``.

Importing this package imports Lightning; ``import lightning_adv`` alone stays light and
exposes ``lightning_adv.PPOModule`` lazily.
"""

from lightning_adv.trainer.policy import CausalTransformer
from lightning_adv.trainer.policy_config import PolicyConfig
from lightning_adv.trainer.config import PPOConfig, PRMConfig, ScorerSpec
from lightning_adv.trainer.ppo import PPOModule
from lightning_adv.trainer.tasks import (
    AdditionTask, GuessTask, ReverseTask, Sample, Task, TaskConfig, Turn, guess_consistency,
    position_match)

__all__ = [
    "PPOModule", "PPOConfig", "PRMConfig", "ScorerSpec", "PolicyConfig", "CausalTransformer",
    "TaskConfig", "Task", "Sample", "Turn", "ReverseTask", "AdditionTask", "GuessTask",
    "position_match", "guess_consistency",
]
