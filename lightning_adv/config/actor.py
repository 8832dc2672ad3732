"""Configuration of the advantage pipeline (SPEC §2).

Every dataclass here is frozen, holds only strings and JSON values, and validates itself
when built, so a bad YAML fails before any worker starts. Field names follow AReaL's
``PPOActorConfig`` so existing configs keep working. Errors name the key as it appears
in the YAML tree (``actor.advantage.estimator``) and the value that was given.

Nested configs may be given as plain mappings (``reward_norm={"mean_level": "group"}``);
``__post_init__`` converts them once, with :func:`nested_config`, before validating. A nested
config validates itself under its own name (``NormConfig.eps``); when its parent built
it from a mapping, the error is re-keyed at that boundary (``actor.reward_norm.eps``).
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

from lightning_adv._checks import (
    check_bool, check_choice, check_int, check_number, fail, is_int, warn_caller)
from lightning_adv.config.nested import _own_kwargs, check_json_kwargs, convert_field, nested_config
from lightning_adv.config.options import NormConfig, TruncatedRewardConfig
from lightning_adv.config.recipe_table import RECIPES
from lightning_adv.config.stage_tree import STAGE_FIELDS, AdvantageConfig
from lightning_adv.dotted_path import is_dotted_path
from lightning_adv.exceptions import IgnoredSettingWarning, RecipeOverrideWarning
from lightning_adv.stages.registry import STAGES, selected_stage
from lightning_adv.ops.kl import KL_ESTIMATORS, KLEstimator

TIMESTEP_UNITS = ("token", "turn")
DROPPED_OUTCOME_ACTIONS = ("warn", "raise", "ignore")
REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
UNSCORABLE_ACTIONS = ("error", "exclude")
#: What to do about a suspicious batch (options ``dropped_outcome_reward``,
#: ``singleton_groups``, ``missing_ref_logp``, ``positive_ref_prox_logp``).
CHECK_ACTIONS = DROPPED_OUTCOME_ACTIONS


@dataclass(frozen=True)
class ActorConfig:
    """Actor options that shape advantages (SPEC §2). Parsed under ``model.actor``."""

    recipe: Optional[str] = None
    """a named recipe (grpo, rloo, ...; lightning_adv.recipes) supplying every field left at
    its default here; fields set to another value override the recipe (with a warning
    naming them); null: no recipe"""
    reward_bias: float = 0.0
    """added to each outcome reward before scaling"""
    reward_scaling: float = 1.0
    """multiplies the biased outcome reward (non-zero; negative turns a cost into a reward)"""
    reward_clip: Union[float, list[float]] = 20.0
    """scaled rewards are clipped to [-reward_clip, reward_clip] (> 0, .inf: no clipping),
    or to [low, high] when given as two numbers"""
    reward_weights: Optional[list[float]] = None
    """one weight per column of a [B, K] rewards tensor (one column per reward function);
    null: a [B] (or [B, 1]) rewards tensor"""
    reward_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """how [B, K] rewards become one per row: the weighted sum (sum_then_normalize), or each
    column normalized within its prompt group first, then the weighted sum
    (normalize_then_sum: GDPO, TRL's multi_objective_aggregation)"""
    unscorable_rewards: Literal["error", "exclude"] = "error"
    """a NaN outcome reward: an error naming the rows, or (exclude) a row that could not be
    scored: left out of every statistic, advantage 0, counted as unscorable_fraction"""
    truncated_reward: Optional[TruncatedRewardConfig] = None
    """reward of rows cut by the length limit: {scale: c} or {value: c} (null: unchanged)"""
    reward_norm: Optional[NormConfig] = None
    """normalization of outcome rewards (null: off)"""
    adv_norm: Optional[NormConfig] = None
    """normalization of advantages over active tokens (null: off)"""
    kl_ctl: float = 0.1
    """KL penalty coefficient (0 disables the penalty)"""
    kl_estimator: KLEstimator = "k1"
    """KL estimator between old and reference log-probs: k1, k2 or k3"""
    discount: float = 1.0
    """discount factor gamma"""
    gae_lambda: Union[float, str] = 1.0
    """GAE lambda: a number in [0, 1] or the dotted path of a per-row lambda function"""
    gae_lambda_kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of the lambda function (a number takes none: any given warn)"""
    gae_timestep_unit: Literal["token", "turn"] = "token"
    """GAE timestep for the auto estimator: "token" or "turn" (needs turn_ids)"""
    mask_no_eos_with_zero: bool = False
    """zero the outcome and token rewards of truncated rows (no EOS)"""
    token_rewards_as_adv: bool = True
    """process rewards shape advantages after normalization (true) or are folded into GAE rewards (false)"""
    overlong_reward_penalty: bool = False
    """apply the DAPO overlong length penalty to outcome rewards"""
    overlong_tokens: Optional[int] = None
    """length of the soft penalty window before max_new_tokens (with the penalty off: null, or it warns)"""
    overlong_penalty_factor: Optional[float] = None
    """penalty at max_new_tokens, > 0 (grows linearly over the window and beyond; with the penalty off: null, or it warns)"""
    max_new_tokens: int = 1024
    """generation budget the length penalty refers to"""
    use_decoupled_loss: bool = False
    """decoupled PPO: prox_logp is passed through untouched"""
    recompute_logprob: bool = False
    """use the recomputed prox_logp as old log-probs (when not decoupled)"""
    dropped_outcome_reward: Literal["warn", "raise", "ignore"] = "warn"
    """when an outcome reward lands on an inactive position (and never reaches GAE): warn, raise or ignore"""
    singleton_groups: Literal["warn", "raise", "ignore"] = "warn"
    """when every group of a group-level reward_norm/adv_norm has one member (group statistics then zero or skip every value): warn, raise or ignore"""
    missing_ref_logp: Literal["warn", "raise", "ignore"] = "warn"
    """when kl_ctl > 0 and the batch has no ref_logp (the KL is then taken against log-prob 0, as in the legacy code): warn once, raise or ignore"""
    positive_ref_prox_logp: Literal["warn", "raise", "ignore"] = "warn"
    """when ref_logp or prox_logp exceed 0 at an active position (probabilities or logits passed as log-probs?): warn, raise or ignore"""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """the stage tree (compute, outcome_reward_shaping, estimator, process_adv_shaping)"""

    KEY: ClassVar[str] = "actor"
    """how errors name this config when it is built on its own (its parent re-keys them)"""

    def __post_init__(self) -> None:
        for name in ("reward_norm", "adv_norm"):
            convert_field(self, name, nested_config(NormConfig, f"{self.KEY}.{name}", getattr(self, name)))
        convert_field(self, "truncated_reward", nested_config(
            TruncatedRewardConfig, f"{self.KEY}.truncated_reward", self.truncated_reward))
        advantage = nested_config(AdvantageConfig, f"{self.KEY}.advantage", self.advantage)
        convert_field(self, "advantage", AdvantageConfig() if advantage is None else advantage)
        convert_field(self, "gae_lambda_kwargs", _own_kwargs(self.gae_lambda_kwargs))
        for name in ("reward_clip", "reward_weights"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                convert_field(self, name, list(value))
        if self.recipe is not None:
            self._fill_from_recipe(f"{self.KEY}.recipe")
        self.validate(self.KEY)

    def _fill_from_recipe(self, key: str) -> None:
        """Fields at their default take the recipe's value (:data:`RECIPES`); other
        fields stay and, where they differ from the recipe, are named in one
        :class:`~lightning_adv.exceptions.RecipeOverrideWarning`. The stage tree counts
        stage by stage. Called only from ``__post_init__``, before validation."""
        check_choice(key, self.recipe, tuple(RECIPES))
        wanted, default = ActorConfig(**copy.deepcopy(RECIPES[self.recipe])), ActorConfig()
        overrides = []
        for f in dataclasses.fields(ActorConfig):
            if f.name in ("recipe", "advantage"):
                continue
            given, own = getattr(self, f.name), getattr(wanted, f.name)
            if given == getattr(default, f.name):
                convert_field(self, f.name, own)
            elif given != own:
                overrides.append(f"{f.name}={_shown(given)!r} (recipe: {_shown(own)!r})")
        stages = {}
        for name in ("compute",) + STAGE_FIELDS:
            given, own = getattr(self.advantage, name), getattr(wanted.advantage, name)
            keep = given != getattr(default.advantage, name)
            stages[name] = given if keep else own
            if keep and given != own:
                overrides.append(f"advantage.{name}={_shown(given)!r} (recipe: {_shown(own)!r})")
        if stages["compute"].implementation != "default":  # a full replacement takes no stages
            stages.update({name: None for name in STAGE_FIELDS})
        convert_field(self, "advantage", AdvantageConfig(**stages))
        if overrides:
            warnings.warn(f"{key} {self.recipe!r}: the config overrides the recipe's "
                          f"{'; '.join(overrides)}", RecipeOverrideWarning, stacklevel=4)

    def validate(self, key: str) -> None:
        for name in ("reward_norm", "adv_norm"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, NormConfig):
                fail(f"{key}.{name}", "null or a NormConfig mapping", value)
        if not isinstance(self.advantage, AdvantageConfig):
            fail(f"{key}.advantage", "an AdvantageConfig mapping", self.advantage)

        check_number(f"{key}.reward_bias", self.reward_bias)
        check_number(f"{key}.reward_scaling", self.reward_scaling)
        if self.reward_scaling == 0:
            fail(f"{key}.reward_scaling", "a non-zero number (0 scales every outcome reward, "
                 "and so every advantage, to 0)", self.reward_scaling)
        check_reward_clip(f"{key}.reward_clip", self.reward_clip)
        check_reward_weights(f"{key}.reward_weights", self.reward_weights)
        check_choice(f"{key}.reward_aggregation", self.reward_aggregation, REWARD_AGGREGATIONS)
        check_choice(f"{key}.unscorable_rewards", self.unscorable_rewards, UNSCORABLE_ACTIONS)
        if self.truncated_reward is not None and not isinstance(self.truncated_reward,
                                                                TruncatedRewardConfig):
            fail(f"{key}.truncated_reward", "null, {scale: c} or {value: c}", self.truncated_reward)
        check_number(f"{key}.kl_ctl", self.kl_ctl, minimum=0.0)
        check_choice(f"{key}.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        if self.kl_ctl == 0 and self.kl_estimator != "k1":
            warn_ignored(f"{key}.kl_estimator", self.kl_estimator,
                         f"{key}.kl_ctl is 0, so no KL penalty is computed")
        check_number(f"{key}.discount", self.discount, minimum=0.0, maximum=1.0)
        check_choice(f"{key}.gae_timestep_unit", self.gae_timestep_unit, TIMESTEP_UNITS)
        for name in ("dropped_outcome_reward", "singleton_groups", "missing_ref_logp",
                     "positive_ref_prox_logp"):
            check_choice(f"{key}.{name}", getattr(self, name), CHECK_ACTIONS)
        for name in ("mask_no_eos_with_zero", "token_rewards_as_adv", "overlong_reward_penalty",
                     "use_decoupled_loss", "recompute_logprob"):
            check_bool(f"{key}.{name}", getattr(self, name))

        if isinstance(self.gae_lambda, str):
            if not is_dotted_path(self.gae_lambda):
                fail(f"{key}.gae_lambda", "a number in [0, 1] or a dotted function path "
                      "(lightning_adv.vapo_length_adaptive_gae)", self.gae_lambda)
            check_json_kwargs(f"{key}.gae_lambda_kwargs", self.gae_lambda_kwargs)
        else:
            check_number(f"{key}.gae_lambda", self.gae_lambda, minimum=0.0, maximum=1.0)
            check_json_kwargs(f"{key}.gae_lambda_kwargs", self.gae_lambda_kwargs)
            if self.gae_lambda_kwargs:
                warn_ignored(f"{key}.gae_lambda_kwargs", self.gae_lambda_kwargs,
                             f"only a lambda function takes kwargs, and {key}.gae_lambda is "
                             f"the number {self.gae_lambda!r}")

        check_int(f"{key}.max_new_tokens", self.max_new_tokens)
        self._validate_length_penalty(key)

        process = self.advantage.process_adv_shaping
        if process is not None and not is_dotted_path(process.implementation):
            check_process_mode(f"{key}.advantage.process_adv_shaping", process.implementation, self)

    def _validate_length_penalty(self, key: str) -> None:
        tokens, factor = self.overlong_tokens, self.overlong_penalty_factor
        if not self.overlong_reward_penalty:
            # Values given with the penalty off are still checked: they fail where they
            # would fail with it on, instead of when someone turns it on.
            if tokens is not None and not is_int(tokens, minimum=1):
                fail(f"{key}.overlong_tokens", "null or a positive integer", tokens)
            if factor is not None:
                check_number(f"{key}.overlong_penalty_factor", factor, minimum=0.0)
            for name, value in (("overlong_tokens", tokens), ("overlong_penalty_factor", factor)):
                if value is not None:
                    warn_ignored(f"{key}.{name}", value, f"{key}.overlong_reward_penalty is false "
                                 f"(set it to true to apply the length penalty)")
            return
        if not is_int(tokens, minimum=1):
            fail(f"{key}.overlong_tokens", "a positive integer when overlong_reward_penalty "
                 "is on", tokens)
        if factor is None:
            fail(f"{key}.overlong_penalty_factor", "a number when overlong_reward_penalty "
                 "is on", factor)
        check_number(f"{key}.overlong_penalty_factor", factor, minimum=0.0)
        if factor == 0:
            fail(f"{key}.overlong_penalty_factor", "a number > 0 when overlong_reward_penalty "
                 "is on (0 penalizes nothing; set overlong_reward_penalty to false)", factor)

    @property
    def reward_clip_range(self) -> tuple[float, float]:
        """``(low, high)`` of ``reward_clip``: ``(-c, c)`` for a number."""
        if isinstance(self.reward_clip, list):
            return float(self.reward_clip[0]), float(self.reward_clip[1])
        return -float(self.reward_clip), float(self.reward_clip)

    @property
    def estimator_unit(self) -> str:
        """Timestep unit of the estimator that actually runs: its registered
        ``timestep_unit``, else (a dotted path, or none declared) ``gae_timestep_unit``."""
        entry = selected_stage(self, "estimator")
        if entry is not None and entry.timestep_unit is not None:
            return entry.timestep_unit
        return self.gae_timestep_unit


def check_reward_clip(key: str, value: Any) -> None:
    """A number c > 0 or .inf (the range [-c, c]) or two numbers [low, high], low < high."""
    if isinstance(value, list):
        if len(value) != 2:
            fail(key, "a number or two numbers [low, high]", value)
        for i, bound in enumerate(value):
            check_number(f"{key}[{i}]", bound, allow_inf=True)
        if not value[0] < value[1]:
            fail(key, "[low, high] with low < high", value)
        return
    check_number(key, value, allow_inf=True)
    if not value > 0:
        fail(key, "a number > 0 or .inf (0 clips every outcome reward, and so every "
             "advantage, to 0), or [low, high]", value)


def check_reward_weights(key: str, weights: Any) -> None:
    """Null, or a non-empty list of finite numbers (one per reward column)."""
    if weights is None:
        return
    if not isinstance(weights, list) or not weights:
        fail(key, "null or a non-empty list of numbers (one per reward column)", weights)
    for i, weight in enumerate(weights):
        check_number(f"{key}[{i}]", weight)


def warn_ignored(key: str, value: Any, why: str) -> None:
    """One :class:`IgnoredSettingWarning` naming ``key``, the value given and why it has no
    effect (the configuration is still accepted: the result is what it would be without it)."""
    warn_caller(f"{key}: {value!r} is ignored: {why}", IgnoredSettingWarning)


def check_process_mode(key: str, mode: str, config: ActorConfig) -> None:
    """Preconditions of a named process mode (SPEC §2): its registered ``config_check``."""
    entry = STAGES["process_adv_shaping"].get(mode)
    if entry is not None and entry.config_check is not None:
        entry.config_check(key, mode, config)



def _shown(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def critic_free_reason(config: ActorConfig) -> Optional[str]:
    """Why ``config`` needs no critic, or None: a group-mean reward baseline, or a stage
    registered with ``replaces_critic`` (its own baseline, or values ignored)."""
    norm = config.reward_norm
    if norm is not None and norm.mean_level == "group":
        return "actor.reward_norm subtracts a group-mean baseline"
    for family in STAGE_FIELDS:
        spec = getattr(config.advantage, family)
        entry = None if spec is None else STAGES[family].get(spec.implementation)
        if entry is not None and entry.replaces_critic:
            return f"actor.advantage.{family} {spec.implementation!r} needs no critic"
    return None
