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

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

from lightning_adv.dotted_path import is_dotted_path
from lightning_adv.stages.registry import check_stage_choice
from lightning_adv.validators import (  # noqa: F401  (check_gvpo_kwargs: public here too)
    check_bool, check_choice, check_gvpo_kwargs, check_int, check_number, fail, is_int,
    warn_caller)

NORM_LEVELS = ("batch", "group", None)
KL_ESTIMATORS = ("k1", "k2", "k3")
TIMESTEP_UNITS = ("token", "turn")
PRM_MODES = ("additive", "gvpo", "process_weighted")
DROPPED_OUTCOME_ACTIONS = ("warn", "raise", "ignore")
REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
UNSCORABLE_ACTIONS = ("error", "exclude")
#: What to do about a suspicious batch (options ``dropped_outcome_reward``,
#: ``singleton_groups``, ``missing_ref_logp``, ``positive_ref_prox_logp``).
CHECK_ACTIONS = DROPPED_OUTCOME_ACTIONS
STAGE_FIELDS = ("outcome_reward_shaping", "estimator", "process_adv_shaping")


class IgnoredSettingWarning(UserWarning):
    """A setting that has no effect in this configuration (or on this batch) was given."""


def check_json_kwargs(key: str, kwargs: Any) -> None:
    """Kwargs must be a string-keyed mapping that survives a JSON round trip unchanged."""
    if not isinstance(kwargs, Mapping):
        fail(key, "a mapping of keyword arguments", kwargs)
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier():
            fail(key, "keyword names that are Python identifiers", name)
    try:
        round_trip = json.loads(json.dumps(dict(kwargs), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{key}: expected JSON values only (strings, finite numbers, "
                         f"booleans, null, lists, mappings), got {dict(kwargs)!r}: {exc}") from None
    if round_trip != dict(kwargs):
        raise ValueError(f"{key}: expected JSON values only (tuples, sets and other Python "
                         f"objects do not survive saving the config), got {dict(kwargs)!r}")


def nested_config(cls: type, key: str, value: Any, shorthand: Optional[str] = None) -> Any:
    """The one conversion of a nested config: a mapping (or a ``shorthand`` string, the
    value of field ``shorthand``) becomes a ``cls`` instance; anything else is returned
    as is for the caller's type check. Errors of the nested config name ``key`` (its
    place in the tree) instead of the class's own name (``cls.KEY``, where it has one).
    Every config of the package, the trainer's too, converts its nested fields with it."""
    if shorthand is not None and isinstance(value, str):
        value = {shorthand: value}
    if not isinstance(value, Mapping):
        return value
    # jsonargparse records where a section loaded from its own file came from
    # (``--model.actor=configs/advantage/grpo.yaml``); that is not a field.
    value = {k: v for k, v in value.items() if k != "__path__"}
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise ValueError(f"{key}: unknown keys {unknown}; expected some of {sorted(names)}")
    try:
        return cls(**value)
    except ValueError as exc:
        if not hasattr(cls, "KEY"):
            raise
        # Re-key at the boundary: every key the nested config named (``advantage.x``)
        # gets its place in the tree (``actor.advantage.x``).
        own = re.compile(rf"(?<![\w.]){re.escape(cls.KEY)}(?=[.:])")
        message, count = own.subn(key, str(exc))
        if count:
            raise ValueError(message) from None
        raise


def _own_kwargs(kwargs: Any) -> Any:
    """A private copy of a kwargs mapping (None: no kwargs); other values are left for
    validation to reject."""
    if kwargs is None:
        return {}
    return dict(kwargs) if isinstance(kwargs, Mapping) else kwargs


def convert_field(obj: Any, name: str, value: Any) -> None:
    """Store a converted field value; called only from ``__post_init__``, before
    ``validate``, so a config never changes after it was checked."""
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class NormConfig:
    """How rewards or advantages are centred and scaled (SPEC §3, "Normalization")."""

    mean_level: Optional[Literal["batch", "group"]] = "batch"
    """where the mean is taken: "batch", "group" (per prompt) or null (no centring)"""
    mean_leave1out: bool = False
    """subtract the mean of the other members (leave-one-out baseline) instead of the mean"""
    std_level: Optional[Literal["batch", "group"]] = "batch"
    """where the std is taken: "batch", "group" (per prompt) or null (no scaling)"""
    std_unbiased: bool = True
    """use the unbiased (n-1) standard deviation"""
    eps: float = 1e-5
    """added to the std before dividing (> 0, so an all-equal group cannot divide 0 by 0)"""
    group_size: int = 1
    """rows per group when the batch carries no metadata (fixed-size slices)"""

    KEY: ClassVar[str] = "NormConfig"
    """how errors name this config when it is built on its own (its parent re-keys them)"""

    def __post_init__(self) -> None:
        self.validate(self.KEY)

    def validate(self, key: str) -> None:
        check_choice(f"{key}.mean_level", self.mean_level, NORM_LEVELS)
        check_choice(f"{key}.std_level", self.std_level, NORM_LEVELS)
        check_bool(f"{key}.mean_leave1out", self.mean_leave1out)
        check_bool(f"{key}.std_unbiased", self.std_unbiased)
        check_number(f"{key}.eps", self.eps, positive=True)
        check_int(f"{key}.group_size", self.group_size)


@dataclass(frozen=True)
class StageSpec:
    """One stage of the pipeline: a built-in name or a dotted import path, plus kwargs."""

    implementation: str = "auto"
    """built-in name ("auto", "token_gae", ...) or dotted path of a function (pkg.mod.fn)"""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments bound to the function; JSON values only"""

    KEY: ClassVar[str] = "StageSpec"
    """how errors name this config when it is built on its own (its parent re-keys them)"""

    def __post_init__(self) -> None:
        convert_field(self, "kwargs", _own_kwargs(self.kwargs))
        self.validate(self.KEY)

    def validate(self, key: str) -> None:
        if not isinstance(self.implementation, str) or not self.implementation:
            fail(f"{key}.implementation", "a non-empty string", self.implementation)
        check_json_kwargs(f"{key}.kwargs", self.kwargs)

    @property
    def is_builtin(self) -> bool:
        return not is_dotted_path(self.implementation)


@dataclass(frozen=True)
class AdvantageConfig:
    """The stage tree of the design note: a whole-computation function, or per-stage ones."""

    compute: StageSpec = field(default_factory=lambda: StageSpec("default"))
    """the whole computation: "default" (the staged pipeline) or a dotted path replacing it"""
    outcome_reward_shaping: Optional[StageSpec] = None
    """outcome shaping: null/auto/identity or a dotted path; gets OutcomeRewardInputs"""
    estimator: Optional[StageSpec] = None
    """temporal estimator: null/auto (follow gae_timestep_unit), token_gae, turn_gae or a dotted path"""
    process_adv_shaping: Optional[StageSpec] = None
    """process shaping: null/auto (call-time PRM mode, else additive), additive, gvpo, process_weighted or a dotted path"""

    KEY: ClassVar[str] = "advantage"
    """how errors name this config when it is built on its own (its parent re-keys them)"""

    def __post_init__(self) -> None:
        compute = nested_config(StageSpec, f"{self.KEY}.compute", self.compute, "implementation")
        convert_field(self, "compute", StageSpec("default") if compute is None else compute)
        for name in STAGE_FIELDS:
            convert_field(self, name, nested_config(StageSpec, f"{self.KEY}.{name}", getattr(self, name),
                                         "implementation"))
        self.validate(self.KEY)

    def validate(self, key: str) -> None:
        for name in ("compute",) + STAGE_FIELDS:
            spec = getattr(self, name)
            if spec is None:
                continue
            if not isinstance(spec, StageSpec):
                fail(f"{key}.{name}", "null, a stage name or {implementation: ..., kwargs: {...}}",
                     spec)
            check_stage_choice(f"{key}.{name}", name, spec.implementation, spec.kwargs)
        staged = [n for n in STAGE_FIELDS if getattr(self, n) is not None]
        if self.is_replaced and staged:
            raise ValueError(
                f"{key}.compute: a full replacement ({self.compute.implementation!r}) cannot be "
                f"combined with stage configuration; set {', '.join(f'{key}.{n}' for n in staged)} "
                f"to null or use compute: default")

    @property
    def is_replaced(self) -> bool:
        """True when ``compute`` names a user function instead of the default pipeline."""
        return self.compute.implementation != "default"


@dataclass(frozen=True)
class PRMAdvantageShapingConfig:
    """Legacy call-time selection of process advantage shaping (``module(batch, meta, prm=...)``).

    It is checked when the module uses it, not when it is built: legacy callers build one
    per call, and its GVPO values matter only when GVPO shaping actually runs.
    """

    mode: Literal["additive", "gvpo", "process_weighted"] = "additive"
    """shaping applied to direct token rewards: additive, gvpo or process_weighted"""
    negative_scale: float = 0.2
    """GVPO: extra weight (1 + b) on negative advantages of failed tokens"""
    zero_penalty: float = 0.4
    """GVPO: penalty given to failed tokens whose advantage is about zero"""
    zero_eps: float = 1e-6
    """GVPO: |advantage| <= zero_eps counts as zero"""

    def gvpo_kwargs(self) -> dict[str, float]:
        return {"negative_scale": self.negative_scale, "zero_penalty": self.zero_penalty,
                "zero_eps": self.zero_eps}


@dataclass(frozen=True)
class TruncatedRewardConfig:
    """The outcome reward of a row cut by the length limit (ProRL's stop-properly penalty):
    multiplied by ``scale`` or replaced by ``value``; set exactly one."""

    scale: Optional[float] = None
    """truncated rows get reward * scale (a number in [0, 1])"""
    value: Optional[float] = None
    """truncated rows get this reward (e.g. -0.5)"""

    KEY: ClassVar[str] = "TruncatedRewardConfig"
    """how errors name this config when it is built on its own (its parent re-keys them)"""

    def __post_init__(self) -> None:
        self.validate(self.KEY)

    def validate(self, key: str) -> None:
        if (self.scale is None) == (self.value is None):
            raise ValueError(f"{key}: expected exactly one of scale (truncated rows get reward * "
                             f"scale) or value (truncated rows get value), got "
                             f"scale={self.scale!r}, value={self.value!r}")
        if self.scale is not None:
            check_number(f"{key}.scale", self.scale, minimum=0.0, maximum=1.0)
        else:
            check_number(f"{key}.value", self.value)


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
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
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
            from lightning_adv.recipes import apply_recipe  # the recipes are ActorConfigs
            apply_recipe(self, f"{self.KEY}.recipe")
        self.validate(self.KEY)

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
        if process is not None and process.implementation in ("gvpo", "process_weighted"):
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
        """Timestep unit of the built-in estimator that actually runs."""
        spec = self.advantage.estimator
        if spec is not None and spec.implementation == "token_gae":
            return "token"
        if spec is not None and spec.implementation == "turn_gae":
            return "turn"
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
    """Preconditions of the built-in process modes (SPEC §2)."""
    if mode in ("gvpo", "process_weighted") and not config.token_rewards_as_adv:
        raise ValueError(f"{key}: {mode!r} advantage shaping requires "
                         f"actor.token_rewards_as_adv=true (process rewards must stay direct), "
                         f"got token_rewards_as_adv=false")
    if mode == "process_weighted" and config.mask_no_eos_with_zero:
        raise ValueError(f"{key}: 'process_weighted' advantage shaping requires "
                         f"actor.mask_no_eos_with_zero=false, got true")
