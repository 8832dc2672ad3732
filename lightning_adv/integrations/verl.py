"""This project's estimators, recipes and policy losses inside verl's registries.

:func:`register` (``prefix="la_"``) adds, with verl's own decorators:

- to ``verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY``: every recipe
  (``la_grpo``, ``la_rloo``, ``la_reinforce_pp``, ...), ``la_gae`` (token GAE with a
  critic, whitened over the batch: verl's ``gae``) and the estimator stages
  ``la_token_gae``, ``la_turn_gae``, ``la_reinforce`` (plus any ``configs`` you pass);
- to ``POLICY_LOSS_REGISTRY``: every policy loss of :class:`~lightning_adv.PPOLoss`
  (``la_vanilla``, ``la_gspo``, ..., ``la_vespo``, and yours from
  :func:`~lightning_adv.register_policy_loss`).

Select them as verl selects its own (``algorithm.adv_estimator=la_grpo``,
``actor_rollout_ref.actor.policy_loss.loss_mode=la_vespo``). Importing this module does
not import verl; :func:`register` does.

**Estimators.** verl calls a registered estimator with ``token_level_rewards``,
``response_mask``, ``config`` (its ``AlgoConfig``), ``index`` (the group ids) and, when
its batch has them, ``reward_baselines``; its built-in ``gae`` also gets ``values``,
``gamma``, ``lam`` and its optimal token baselines ``old_log_probs``,
``sum_pi_squared``, ``rollout_is_weights``. The adapter accepts all of those, builds the
pipeline's batch (:mod:`lightning_adv.integrations.response_batch`), and maps the
``AlgoConfig`` onto the name's :class:`~lightning_adv.ActorConfig`
(:func:`actor_config_for`). Note that verl 0.9.1's ``compute_advantage`` passes
``values`` only to its built-in ``gae``, and ``sum_pi_squared``/``old_log_probs`` only
to its built-in optimal token baselines: ``la_gae`` and ``la_(tir_)optimal_token_baseline``
refuse a call without them, naming the key (docs/guides/verl.md); ``la_gigpo`` needs the
batch key ``anchor_state_ids``, and the tree recipes (``la_tree_grpo``, ``la_treepo``,
``la_treerl``) ``tree_node_ids``, which verl has no way to pass.

**Policy losses.** verl calls ``fn(old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode, config, rollout_is_weights)`` with its actor config; the adapter builds
a :class:`~lightning_adv.PPOLoss` from it (:func:`ppo_loss_for`) and normalizes by
verl's ``global_batch_info`` counts, so micro-batches and data-parallel ranks sum to
verl's loss.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from lightning_adv.advantage.module import AdvantageModule
from lightning_adv.config import ActorConfig, NormConfig
from lightning_adv.exceptions import IgnoredSettingWarning, PaddingDependentScaleWarning
from lightning_adv.integrations.response_batch import response_advantages
from lightning_adv.losses.aggregation import TokenCounts
from lightning_adv.losses.policy_loss_registry import (
    POLICY_LOSSES, policy_loss_names, resolve_policy_loss)
from lightning_adv.losses.ppo_loss import PPOLoss
from lightning_adv.recipes import RECIPES, recipe
from lightning_adv.stages.registry import STAGES, StageEntry, auto_stage, selected_stage

__all__ = ["register", "estimator_configs", "actor_config_for", "ppo_loss_for",
           "VERL_ESTIMATORS", "ALGO_FIELDS"]

_WHITEN = NormConfig(mean_level="batch", std_level="batch")
#: The optional batch keys verl 0.9.1's compute_advantage can hand an estimator (turn_ids
#: are made from the response mask).
_VERL_KEYS = {"sum_pi_squared", "rollout_is_weights", "reward_baselines", "turn_ids"}


def estimator_configs() -> dict[str, ActorConfig]:
    """The configs :func:`register` adds as estimators, by name (without the prefix)."""
    configs = {name: recipe(name) for name in RECIPES}
    token_gae = auto_stage("estimator", "token").name
    configs["gae"] = ActorConfig(kl_ctl=0.0, adv_norm=_WHITEN,
                                 advantage={"estimator": {"implementation": token_gae}})
    # each built-in estimator on its own, unless a recipe of that name has it, or it reads
    # a batch key verl's compute_advantage does not pass (it could never run under verl)
    for stage in STAGES["estimator"].entries():
        if stage.builtin and stage.name not in configs and set(stage.requires) <= _VERL_KEYS:
            configs[stage.name] = ActorConfig(
                kl_ctl=0.0, advantage={"estimator": {"implementation": stage.name}})
    return configs


#: verl 0.9.1's estimator name -> the name this project registers for it (with the prefix).
VERL_ESTIMATORS = {
    "gae": "gae", "grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_pp",
    "reinforce_plus_plus_baseline": "reinforce_pp_baseline", "remax": "remax", "opo": "opo",
    "gpg": "gpg", "grpo_passk": "grpo_passk", "gdpo": "gdpo",
    "optimal_token_baseline": "optimal_token_baseline",
    "tir_optimal_token_baseline": "tir_optimal_token_baseline",
}

#: What becomes of each verl ``AlgoConfig`` field. ``discount``/``gae_lambda``: mapped onto
#: that ActorConfig field for the names whose verl counterpart reads it; ``verl``: verl's
#: trainer applies it around the estimator (in-reward KL, filters, rollout correction),
#: so it needs nothing here; ``mapped``: read by the adapter (see actor_config_for).
ALGO_FIELDS = {
    "gamma": "discount", "lam": "gae_lambda", "adv_estimator": "verl",
    "norm_adv_by_std_in_grpo": "mapped", "use_kl_in_reward": "verl", "kl_penalty": "verl",
    "kl_ctrl": "verl", "use_pf_ppo": "refused", "pf_ppo": "verl", "filter_groups": "verl",
    "rollout_correction": "verl", "gdpo_reward_keys": "mapped", "gdpo_reward_weights": "mapped",
}


def _facts(config: ActorConfig) -> tuple[Optional[StageEntry], Optional[StageEntry]]:
    """The registry entries of the outcome stage and the estimator that run for ``config``."""
    return (selected_stage(config, "outcome_reward_shaping"), selected_stage(config, "estimator"))


def _outcome_level(config: ActorConfig) -> bool:
    """verl's outcome estimators (grpo, rloo, opo, ...) compare each row's summed reward
    within its group: a reward normalization or a group-baseline outcome stage is one."""
    outcome, _ = _facts(config)
    return config.reward_norm is not None or (outcome is not None and outcome.baseline == "group")


def _reads(config: ActorConfig, fact: str) -> bool:
    """Whether verl's counterpart of ``config`` reads gamma (``reads_discount``) or lam
    (``reads_lambda``): verl's estimators that subtract a baseline (a group's, a greedy
    response's, a per-step group baseline) take undiscounted returns and ignore both; the
    others read them where the estimator stage does."""
    outcome, estimator = _facts(config)
    if config.reward_norm is not None or outcome is not None and outcome.baseline is not None:
        return False
    return estimator is not None and estimator.baseline in (None, "values") \
        and getattr(estimator, fact)


def _otb(estimator: Optional[StageEntry]) -> bool:
    """verl's optimal token baselines are its estimators that read ``sum_pi_squared``;
    verl passes them ``handle_zero_tail`` and ``epsilon``."""
    return estimator is not None and "sum_pi_squared" in estimator.requires


def _algo_items(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if dataclasses.is_dataclass(config):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    if isinstance(config, Mapping):
        return dict(config)
    try:  # an omegaconf DictConfig
        return {k: config[k] for k in config.keys()}
    except Exception as exc:  # noqa: BLE001 - named below
        raise TypeError(f"algorithm config: expected verl's AlgoConfig, a DictConfig or a "
                        f"mapping, got {type(config).__name__}") from exc


def actor_config_for(name: str, base: ActorConfig, algo: Any, *, gamma: Any = None,
                     lam: Any = None, epsilon: Optional[float] = None,
                     norm_adv_by_std_in_grpo: Optional[bool] = None,
                     handle_zero_tail: bool = True) -> ActorConfig:
    """``base`` (the config registered as ``name``) with verl's algorithm settings mapped
    on (see :data:`ALGO_FIELDS`); a setting that cannot be mapped is refused, naming the
    field. Always: ``kl_ctl`` 0 (verl puts its in-reward KL into ``token_level_rewards``
    before the estimator runs) and ``token_rewards_as_adv`` False (per-token rewards are
    folded into the returns, where verl's estimators take them)."""
    items = _algo_items(algo)
    where = f"verl estimator 'la_{name}'"
    # _target_ and other underscore keys are verl's config machinery, not settings
    unknown = sorted(k for k in set(items) - set(ALGO_FIELDS) if not k.startswith("_"))
    if unknown:
        raise ValueError(f"{where}: algorithm.{unknown[0]}: not a field of verl 0.9.1's "
                         f"AlgoConfig this adapter knows ({', '.join(ALGO_FIELDS)}); cannot map it")
    if items.get("use_pf_ppo"):
        raise ValueError(f"{where}: algorithm.use_pf_ppo: True cannot be mapped: verl 0.9.1 "
                         f"reweights the batch for PF-PPO only after its built-in 'gae'")
    changes: dict[str, Any] = {"kl_ctl": 0.0, "token_rewards_as_adv": False}
    gamma = items.get("gamma", 1.0) if gamma is None else gamma
    lam = items.get("lam", 1.0) if lam is None else lam
    if _reads(base, "reads_discount"):
        changes["discount"] = float(gamma)
    if _reads(base, "reads_lambda"):
        changes["gae_lambda"] = float(lam)
    by_std = items.get("norm_adv_by_std_in_grpo", True) if norm_adv_by_std_in_grpo is None \
        else norm_adv_by_std_in_grpo
    eps = 1e-6 if epsilon is None else float(epsilon)  # verl's default epsilon
    if name == "grpo":
        changes["reward_norm"] = dataclasses.replace(
            base.reward_norm, eps=eps, **({} if by_std else {"std_level": None}))
    elif name == "grpo_passk":
        outcome = base.advantage.outcome_reward_shaping  # the recipe's pass@k baseline
        changes["advantage"] = dataclasses.replace(base.advantage, outcome_reward_shaping={
            "implementation": outcome.implementation,
            "kwargs": {"std_normalize": bool(by_std), "eps": eps}})
    elif name == "gdpo" and not by_std:
        raise ValueError(f"{where}: algorithm.norm_adv_by_std_in_grpo: False cannot be mapped: "
                         f"gdpo's per-column normalization always divides by the group std")
    spec = base.advantage.estimator
    if spec is not None and _otb(_facts(base)[1]):
        # verl's keyword arguments of its optimal token baselines (defaults True and 1e-8)
        kwargs = {**spec.kwargs, "handle_zero_tail": bool(handle_zero_tail),
                  "eps": 1e-8 if epsilon is None else float(epsilon)}
        tree = {f.name: getattr(base.advantage, f.name) for f in dataclasses.fields(base.advantage)}
        changes["advantage"] = {**tree, "estimator": {"implementation": spec.implementation,
                                                      "kwargs": kwargs}}
    # gdpo_reward_keys/weights: read by la_gdpo's call (verl reads them only in its gdpo)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return ActorConfig(**{**fields, **changes})


def _gdpo_columns(algo: dict[str, Any], non_tensor_batch: Any, batch: Any,
                  response_mask: Tensor) -> tuple[Optional[Tensor], Optional[list[float]]]:
    """verl's gdpo reward columns (``algorithm.gdpo_reward_keys`` in ``non_tensor_batch``)
    as ``[B, K]``, and their weights."""
    keys = algo.get("gdpo_reward_keys")
    if not keys or non_tensor_batch is None or batch is None:
        return None, None
    missing = [k for k in keys if k not in non_tensor_batch]
    if missing:
        raise ValueError(f"verl estimator 'la_gdpo': algorithm.gdpo_reward_keys: {missing} not "
                         f"in the batch's non_tensor_batch (keys: {sorted(non_tensor_batch)})")
    columns = torch.stack([torch.as_tensor([float(v) for v in non_tensor_batch[k]],
                                           device=response_mask.device) for k in keys], dim=1)
    weights = algo.get("gdpo_reward_weights")
    return columns, [float(w) for w in weights] if weights is not None else [1.0] * len(keys)


def _estimator(name: str, base: ActorConfig) -> Callable[..., tuple[Tensor, Tensor]]:
    """verl's estimator signature around the config ``base``."""
    _, estimator = _facts(base)
    # verl's outcome estimators (a group baseline of the reward: grpo, rloo, rf++-baseline,
    # ...) read the row's sum; its temporal ones each token's reward where it lies
    per_token = not _outcome_level(base)
    # an estimator over turns: each run of generated tokens is a turn (tool outputs between)
    turns = "runs" if estimator is not None and estimator.timestep_unit == "turn" else None
    otb = _otb(estimator)

    # keyword-only past index: verl calls with keywords, and the order after is not verl's
    def estimate(token_level_rewards: Tensor, response_mask: Tensor, index: Any = None, *,
                 config: Any = None, values: Optional[Tensor] = None, gamma: Any = None,
                 lam: Any = None, epsilon: Optional[float] = None,
                 norm_adv_by_std_in_grpo: Optional[bool] = None,
                 reward_baselines: Optional[Tensor] = None,
                 old_log_probs: Optional[Tensor] = None, sum_pi_squared: Optional[Tensor] = None,
                 rollout_is_weights: Optional[Tensor] = None, non_tensor_batch: Any = None,
                 batch: Any = None, **unused: Any) -> tuple[Tensor, Tensor]:
        where = f"verl estimator 'la_{name}'"
        handle_zero_tail = unused.pop("handle_zero_tail", True)  # verl's default
        if unused:
            raise TypeError(f"{where}: unexpected arguments {sorted(unused)}")
        actor = actor_config_for(name, base, config, gamma=gamma, lam=lam, epsilon=epsilon,
                                 norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                                 handle_zero_tail=handle_zero_tail)
        algo = _algo_items(config)
        columns, weights = (_gdpo_columns(algo, non_tensor_batch, batch, response_mask)
                            if name == "gdpo" else (None, None))
        if weights is not None:
            actor = dataclasses.replace(actor, reward_weights=weights)
        if name == "gae" and values is None:
            raise ValueError(f"{where}: needs 'values' (the critic's, [B, R]); verl 0.9.1's "
                             f"compute_advantage passes values only to its built-in 'gae'")
        extra = {k: v for k, v in (("values", values), ("sum_pi_squared", sum_pi_squared),
                                   ("rollout_is_weights", rollout_is_weights),
                                   ("reward_baselines", reward_baselines)) if v is not None}
        if otb and (sum_pi_squared is None or old_log_probs is None):
            raise ValueError(f"{where}: needs 'sum_pi_squared' and 'old_log_probs'; verl 0.9.1's "
                             f"compute_advantage passes them only to its built-in optimal token "
                             f"baselines (actor.calculate_sum_pi_squared=True)")
        group_ids = list(range(response_mask.shape[0])) if index is None else list(index)
        module = AdvantageModule(actor)
        with warnings.catch_warnings():
            # verl's batches are what they are: one response per prompt (singleton groups)
            # and a reward on an unmasked position are verl's call, not this adapter's
            warnings.simplefilter("ignore", IgnoredSettingWarning)
            return response_advantages(
                module, where, token_level_rewards, response_mask, group_ids,
                per_token_rewards=per_token, turns=turns,
                old_log_probs=old_log_probs, extra=extra, reward_columns=columns)

    estimate.__name__ = f"la_{name}"
    estimate.__qualname__ = f"la_{name}"
    return estimate


# ---------------------------------------------------------------------------- policy losses

def _get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(key, default)
    getter = getattr(config, "get", None)
    if getter is not None:
        return getter(key, default)
    return getattr(config, key, default)


def ppo_loss_for(name: str, loss_agg_mode: str, config: Any,
                 response_width: Optional[int] = None) -> PPOLoss:
    """A :class:`~lightning_adv.PPOLoss` of the policy loss ``name`` with verl's actor
    settings: ``clip_ratio_low``/``clip_ratio_high`` (``clip_ratio`` where unset) ->
    ``clip_eps``/``clip_eps_high``; ``clip_ratio_c`` -> ``dual_clip`` (losses that read
    it; verl always dual-clips them); ``tau_pos``/``tau_neg`` and ``policy_loss``'s
    ``clip_cov_*``, ``kl_cov_ratio``, ``ppo_kl_coef``, ``dro_beta`` -> the loss's
    settings; ``global_batch_info.loss_scale_factor`` -> ``loss_scale_factor``, or, where
    verl gives none with ``seq-mean-token-sum-norm``, ``response_width`` (the columns of
    the response mask: verl 0.9.1's ``agg_loss`` default), with a
    :class:`~lightning_adv.exceptions.PaddingDependentScaleWarning`."""
    if config is None:
        raise ValueError(f"verl policy loss 'la_{name}': needs the actor config (verl passes "
                         f"config=actor config)")
    # a built-in's settings are checked when PPOLoss is built (dro's dro_beta is required)
    spec = POLICY_LOSSES.get(name) or resolve_policy_loss(name, None)
    clip = _get(config, "clip_ratio", 0.2)
    low = _get(config, "clip_ratio_low") or clip
    high = _get(config, "clip_ratio_high") or clip
    policy = _get(config, "policy_loss")
    kwargs = {}
    for key in spec.kwarg_checks:
        value = _get(config, key) if key in ("tau_pos", "tau_neg") else _get(policy, key)
        if value is not None:
            kwargs[key] = value
    info = _get(config, "global_batch_info") or {}
    mode = loss_agg_mode if spec.loss_agg_mode is None else None
    factor = info.get("loss_scale_factor")
    if mode == "seq-mean-token-sum-norm" and factor is None and response_width is not None:
        # verl's default; PPOLoss itself asks for the constant, as this divisor changes
        # with each batch's padding, so the loss scale moves from step to step
        warnings.warn(f"verl policy loss 'la_{name}': loss_agg_mode seq-mean-token-sum-norm "
                      f"without global_batch_info.loss_scale_factor divides by the response "
                      f"width ({response_width} here), as verl does; it depends on padding: "
                      f"set actor.loss_scale_factor to a constant (e.g. the maximum response "
                      f"length)", PaddingDependentScaleWarning, stacklevel=3)
        factor = float(response_width)
    return PPOLoss(clip_eps=low, clip_eps_high=high,
                   dual_clip=_get(config, "clip_ratio_c", 3.0) if spec.reads_dual_clip else None,
                   loss_agg_mode=mode, policy_loss=name, policy_loss_kwargs=kwargs,
                   loss_scale_factor=factor if mode == "seq-mean-token-sum-norm" else None,
                   sync_across_ranks=False)


def _verl_counts(mask: Tensor, info: Mapping[str, Any]) -> TokenCounts:
    """The counts verl's ``agg_loss`` divides by: its ``global_batch_info`` (the whole
    minibatch over all data-parallel ranks) where given, this micro-batch's otherwise."""
    counts = TokenCounts(mask, sync=False)
    if info.get("batch_num_tokens") is not None:
        counts.tokens = torch.as_tensor(float(info["batch_num_tokens"]), dtype=mask.dtype)
    if info.get("global_batch_size") is not None:
        counts.sequences = torch.as_tensor(float(info["global_batch_size"]), dtype=mask.dtype)
    counts.scale = int(info.get("dp_size", 1) or 1)
    return counts


def _policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    def loss(old_log_prob: Tensor, log_prob: Tensor, advantages: Tensor, response_mask: Tensor,
             loss_agg_mode: str = "token-mean", config: Any = None,
             rollout_is_weights: Optional[Tensor] = None) -> tuple[Tensor, dict[str, Any]]:
        ppo = ppo_loss_for(name, loss_agg_mode, config, response_width=response_mask.shape[-1])
        mask = response_mask.to(torch.promote_types(log_prob.dtype, torch.float32))
        counts = _verl_counts(mask, _get(config, "global_batch_info") or {})
        out = ppo(log_prob, old_log_prob, advantages, mask,
                  rollout_is_weights=rollout_is_weights, counts=counts)
        metrics = {f"actor/{k}": float(v) for k, v in out.items()
                   if k not in ("loss", "num_tokens") and isinstance(v, Tensor) and v.numel() == 1}
        return out["loss"], metrics

    loss.__name__ = loss.__qualname__ = f"la_{name}"
    return loss


# ---------------------------------------------------------------------------- register

#: The functions already registered, by full name: verl refuses a second, different
#: function under a name, so registering twice hands it the same one.
_REGISTERED: dict[str, Callable[..., Any]] = {}


def register(prefix: str = "la_", configs: Optional[Mapping[str, ActorConfig]] = None,
             ) -> dict[str, list[str]]:
    """Add this project's estimators, recipes (and ``configs``, your own
    :class:`~lightning_adv.ActorConfig` by name) to verl's advantage-estimator registry and
    its policy losses to verl's policy-loss registry, each as ``prefix + name``. Safe to
    call more than once. Returns the names added, ``{"estimators": [...], "policy_losses":
    [...]}``."""
    from verl.trainer.ppo import core_algos  # the optional extra: pip install lightning_adv[verl]

    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"register prefix: expected a non-empty string, got {prefix!r}")
    all_configs = estimator_configs()
    for name, config in (configs or {}).items():
        if not isinstance(config, ActorConfig):
            raise TypeError(f"register configs[{name!r}]: expected an ActorConfig, got "
                            f"{type(config).__name__}")
        all_configs[name] = config
    added: dict[str, list[str]] = {"estimators": [], "policy_losses": []}
    for name, config in all_configs.items():
        full = prefix + name
        fn = _REGISTERED.get(full)
        if fn is None or name in (configs or {}):
            fn = _REGISTERED[full] = _estimator(name, config)
            core_algos.ADV_ESTIMATOR_REGISTRY.pop(full, None)
        core_algos.register_adv_est(full)(fn)
        added["estimators"].append(full)
    for name in policy_loss_names():
        full = prefix + name
        fn = _REGISTERED.setdefault(f"loss:{full}", _policy_loss(name))
        core_algos.register_policy_loss(full)(fn)
        added["policy_losses"].append(full)
    return added

