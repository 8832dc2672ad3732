"""lightning_adv: a configurable, validated advantage computation for PPO-family trainers of
language-model policies, and the loss around it, on PyTorch Lightning.

What users build on (each defined in the subpackage of its layer):

- configs: :class:`ActorConfig` (+ :class:`NormConfig`, :class:`AdvantageConfig`,
  :class:`StageSpec`, :class:`PRMAdvantageShapingConfig`) and :func:`recipe`;
- the batch: :class:`BatchMeta`, :class:`RolloutGroup`, :func:`concat_batch`,
  :func:`split_batch`;
- the pipeline: :class:`AdvantageModule`, the stage input/result types, and
  :func:`register_stage` for named stages of your own;
- the kernels: :func:`compute_token_gae`, :func:`compute_turn_gae`, the per-row GAE λ
  functions;
- the loss side: :class:`PPOLoss` (verl's policy losses, :func:`register_policy_loss` for
  your own), :func:`rollout_correction` (importance weights and rejection for off-policy
  tokens), :class:`AdvantageMetrics` and the KL controllers (:class:`KLController` to
  write your own);
- pictures: :func:`advantage_heatmap` (per-token advantages of a few responses; needs
  matplotlib, the ``plot`` extra) and :func:`heatmap_inputs` (its inputs from a batch and
  the module's output).

Errors and warnings are in :mod:`lightning_adv.exceptions`; the Lightning trainer is
:class:`lightning_adv.trainer.PPOModule`. Every name is imported on first use, so
``import lightning_adv.config`` loads the config layer alone; importing the package
changes no environment variable.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

#: Each public name and the module that defines it.
_EXPORTS = {
    "AdvantageModule": "lightning_adv.advantage.module",
    **dict.fromkeys(("BatchMeta", "RolloutGroup", "concat_batch", "split_batch"),
                    "lightning_adv.batch.grouping"),
    **dict.fromkeys(("ActorConfig", "AdvantageConfig", "NormConfig", "PRMAdvantageShapingConfig",
                     "StageSpec"), "lightning_adv.config"),
    "AdvantageContractError": "lightning_adv.exceptions",
    **dict.fromkeys(("AdaptiveKLController", "FixedKLController", "KLController",
                     "KLControllerConfig"), "lightning_adv.losses.kl_controllers"),
    "PPOLoss": "lightning_adv.losses.ppo_loss",
    **dict.fromkeys(("rollout_correction", "RolloutCorrectionConfig", "RolloutCorrection"),
                    "lightning_adv.losses.rollout_correction"),
    **dict.fromkeys(("register_policy_loss", "PolicyLossInputs"),
                    "lightning_adv.losses.policy_loss_registry"),
    "AdvantageMetrics": "lightning_adv.metrics.advantage_metrics",
    "OffPolicyMetrics": "lightning_adv.metrics.off_policy_metrics",
    **dict.fromkeys(("compute_token_gae", "compute_turn_gae"), "lightning_adv.ops.gae"),
    "recipe": "lightning_adv.recipes",
    **dict.fromkeys(("GAELambdaContext", "compute_gae_lambda", "constant_gae_lambda",
                     "relative_position_gae_lambda", "vapo_length_adaptive_gae"),
                    "lightning_adv.stages.gae_lambda"),
    "register_stage": "lightning_adv.stages.registry",
    **dict.fromkeys(("AdvantageInputs", "AdvantageResult", "OutcomeResult", "OutcomeRewardInputs",
                     "ProcessAdvantageInputs", "TemporalInputs", "TemporalResult"),
                    "lightning_adv.stages.types"),
    **dict.fromkeys(("advantage_heatmap", "heatmap_inputs"), "lightning_adv.visualize"),
}

__all__ = [
    "__version__",
    "ActorConfig", "NormConfig", "AdvantageConfig", "StageSpec", "PRMAdvantageShapingConfig",
    "recipe",
    "BatchMeta", "RolloutGroup", "concat_batch", "split_batch",
    "AdvantageModule", "register_stage", "OutcomeRewardInputs", "OutcomeResult",
    "TemporalInputs", "TemporalResult", "ProcessAdvantageInputs", "AdvantageInputs",
    "AdvantageResult", "AdvantageContractError",
    "compute_token_gae", "compute_turn_gae", "GAELambdaContext", "compute_gae_lambda",
    "constant_gae_lambda", "vapo_length_adaptive_gae", "relative_position_gae_lambda",
    "PPOLoss", "AdvantageMetrics", "KLController", "FixedKLController", "AdaptiveKLController",
    "KLControllerConfig", "rollout_correction", "RolloutCorrectionConfig", "RolloutCorrection",
    "register_policy_loss", "PolicyLossInputs", "OffPolicyMetrics", "advantage_heatmap",
    "heatmap_inputs",
]

#: Old names, still importable with a DeprecationWarning naming the new one.
_DEPRECATED = {
    "TrajBatchMeta": ("lightning_adv.batch.grouping", "BatchMeta", "lightning_adv.BatchMeta"),
    "GAELambdaInputs": ("lightning_adv.stages.gae_lambda", "GAELambdaContext",
                        "lightning_adv.GAELambdaContext"),
    "PPOModule": ("lightning_adv.trainer.ppo", "PPOModule", "lightning_adv.trainer.PPOModule"),
    **{name: ("lightning_adv.exceptions", name, f"lightning_adv.exceptions.{name}") for name in (
        "DroppedOutcomeRewardWarning", "SingletonGroupWarning", "MissingRefLogpWarning",
        "UnknownBatchKeyWarning", "LogProbRangeWarning", "IgnoredSettingWarning")},
}




def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value   # later lookups skip this function
        return value
    if name in _DEPRECATED:
        module, attr, new = _DEPRECATED[name]
        warnings.warn(f"lightning_adv.{name} is deprecated; use {new}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'lightning_adv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load on first use
    from lightning_adv.advantage.module import AdvantageModule
    from lightning_adv.batch.grouping import BatchMeta, RolloutGroup, concat_batch, split_batch
    from lightning_adv.config import (
        ActorConfig, AdvantageConfig, NormConfig, PRMAdvantageShapingConfig, StageSpec)
    from lightning_adv.exceptions import AdvantageContractError
    from lightning_adv.losses.kl_controllers import (
        AdaptiveKLController, FixedKLController, KLController, KLControllerConfig)
    from lightning_adv.losses.ppo_loss import PPOLoss
    from lightning_adv.losses.policy_loss_registry import PolicyLossInputs, register_policy_loss
    from lightning_adv.losses.rollout_correction import (
        RolloutCorrection, RolloutCorrectionConfig, rollout_correction)
    from lightning_adv.metrics.advantage_metrics import AdvantageMetrics
    from lightning_adv.metrics.off_policy_metrics import OffPolicyMetrics
    from lightning_adv.ops.gae import compute_token_gae, compute_turn_gae
    from lightning_adv.recipes import recipe
    from lightning_adv.stages.gae_lambda import (
        GAELambdaContext, compute_gae_lambda, constant_gae_lambda, relative_position_gae_lambda,
        vapo_length_adaptive_gae)
    from lightning_adv.stages.registry import register_stage
    from lightning_adv.stages.types import (
        AdvantageInputs, AdvantageResult, OutcomeResult, OutcomeRewardInputs,
        ProcessAdvantageInputs, TemporalInputs, TemporalResult)
    from lightning_adv.visualize import advantage_heatmap, heatmap_inputs
