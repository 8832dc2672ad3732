"""lightning_adv: configurable, validated and fast advantage computation for PPO-family
trainers of language-model policies, on PyTorch Lightning."""

# First, before anything imports torch: OpenMP reads its wait policy when torch loads it.
from lightning_adv.openmp import prefer_passive_wait

prefer_passive_wait()

from lightning_adv.batch_checks import LogProbRangeWarning, UnknownBatchKeyWarning
from lightning_adv.config import (
    ActorConfig, AdvantageConfig, IgnoredSettingWarning, NormConfig, PRMAdvantageShapingConfig,
    StageSpec)
from lightning_adv.contracts import (
    AdvantageContractError, AdvantageInputs, AdvantageResult, OutcomeResult, OutcomeRewardInputs,
    ProcessAdvantageInputs, TemporalInputs, TemporalResult)
from lightning_adv.kernels import compute_token_gae, compute_turn_gae
from lightning_adv.lambdas import (
    GAELambdaContext, GAELambdaInputs, compute_gae_lambda, constant_gae_lambda,
    relative_position_gae_lambda, vapo_length_adaptive_gae)
from lightning_adv.meta import BatchMeta, RolloutGroup, TrajBatchMeta, concat_batch, split_batch
from lightning_adv.module import AdvantageModule
from lightning_adv.normalization import SingletonGroupWarning
from lightning_adv.rewards import DroppedOutcomeRewardWarning, MissingRefLogpWarning
from lightning_adv.ppo_loss import PPOLoss
from lightning_adv.kl_control import AdaptiveKLController, FixedKLController, KLControllerConfig

__all__ = [
    "ActorConfig", "NormConfig", "AdvantageConfig", "StageSpec", "PRMAdvantageShapingConfig",
    "BatchMeta", "TrajBatchMeta", "RolloutGroup", "concat_batch", "split_batch",
    "AdvantageModule", "OutcomeRewardInputs", "OutcomeResult", "TemporalInputs",
    "TemporalResult", "ProcessAdvantageInputs", "AdvantageInputs", "AdvantageResult",
    "GAELambdaContext", "GAELambdaInputs", "compute_gae_lambda", "compute_token_gae",
    "compute_turn_gae", "constant_gae_lambda", "vapo_length_adaptive_gae",
    "relative_position_gae_lambda", "AdvantageContractError", "DroppedOutcomeRewardWarning",
    "SingletonGroupWarning", "MissingRefLogpWarning", "UnknownBatchKeyWarning",
    "LogProbRangeWarning", "IgnoredSettingWarning",
    "PPOModule", "PPOLoss", "FixedKLController", "AdaptiveKLController", "KLControllerConfig",
    "AdvantageMetrics",
]


def __getattr__(name: str):
    # The trainer imports Lightning; load it only when asked for.
    if name == "PPOModule":
        from lightning_adv.trainer.ppo import PPOModule
        return PPOModule
    if name == "AdvantageMetrics":
        # torchmetrics is imported on first use only, like the trainer.
        from lightning_adv.advantage_metrics import AdvantageMetrics
        return AdvantageMetrics
    raise AttributeError(f"module 'lightning_adv' has no attribute {name!r}")
