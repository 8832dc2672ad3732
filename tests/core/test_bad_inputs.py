"""A catalogue of bad inputs: each gives one clear error naming the field (SPEC §7).

Every entry builds a bad call and names the exception type and the fragments its message
must contain (the field, and what was expected). Inputs whose legacy numbers are kept give
a warning of a named category instead (``warns``); their entries run with that category
turned into an error. ``docs/reference/errors.md`` shows every entry's whole message
(``scripts/generate_reference.py`` runs this catalogue; ``tests/docs`` checks the page).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from tests.support.batches import rows_batch
from lightning_adv import (
    ActorConfig, AdvantageContractError, AdvantageModule, BatchMeta, NormConfig, PRMAdvantageShapingConfig, RolloutGroup, compute_token_gae, concat_batch)
from lightning_adv.exceptions import IgnoredSettingWarning, LogProbRangeWarning, MissingRefLogpWarning, SingletonGroupWarning, UnknownBatchKeyWarning


def good(**extra):
    return rows_batch(["pgg.", "pggg"], [1.0, 0.0], values=torch.zeros(2, 4),
                      ref_logp=torch.zeros(2, 4), **extra)


def with_key(key, value, **extra):
    batch = good(**extra)
    batch[key] = value
    return batch


def without(key):
    batch = good()
    del batch[key]
    return batch


def call(batch, meta=None, prm=None, **config):
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AdvantageModule(ActorConfig(**config))(batch, meta, prm=prm)
    return run


def warns(category, batch, meta=None, **config):
    """A call whose only complaint is a ``category`` warning, raised as an error."""
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", category)
            return AdvantageModule(ActorConfig(**config))(batch, meta)
    return run


def config_warns(category, **config):
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", category)
            return ActorConfig(**config)
    return run


def token_gae(mask=None, discount=1.0, gae_lambda=1.0):
    mask = torch.ones(2, 4) if mask is None else mask
    return lambda: compute_token_gae(torch.zeros(2, 4), torch.zeros(2, 4), mask,
                                     bootstrap_values=torch.zeros(2), discount=discount,
                                     gae_lambda=gae_lambda)


def out_of_range_lambda(context):
    return torch.full(context.timestep_lengths.shape, 1.5)


GROUP_NORM = NormConfig(mean_level="group", std_level="group")
PROBABILITIES = torch.tensor([[0.0, 0.7, 0.2, 0.0], [0.0, 0.9, 0.5, 0.4]])
POSITIVE_REF = torch.tensor([[0.75, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


@dataclass
class Bad:
    id: str
    run: Callable[[], object]
    error: type
    fragments: tuple[str, ...]


def nan_at(shape, index):
    x = torch.zeros(shape)
    x[index] = math.nan
    return x


TURN_IDS = [[-1, 0, 0, -1], [-1, 0, 1, 1]]

CATALOGUE = [
    # ---------------------------------------------------------------- batch structure
    Bad("batch-not-a-dict", call([("rewards", torch.ones(2))]), TypeError,
        ("rollout batch", "expected a dict")),
    Bad("missing-loss-mask", call(without("loss_mask")), ValueError,
        ("rollout batch has no 'loss_mask'",)),
    Bad("missing-rewards", call(without("rewards")), ValueError, ("rollout batch has no 'rewards'",)),
    Bad("input-ids-not-2d", call(with_key("input_ids", torch.zeros(8, dtype=torch.long))), ValueError,
        ("'input_ids'", "[B, T]")),
    Bad("single-column", call(rows_batch(["p", "p"], [0.0, 0.0])), ValueError,
        ("'input_ids'", "two columns")),
    Bad("values-wrong-shape", call(with_key("values", torch.zeros(2, 3))), ValueError,
        ("'values'", "shape [2, 4]", "[2, 3]")),
    Bad("logprobs-integer", call(with_key("logprobs", torch.zeros(2, 4, dtype=torch.long))),
        ValueError, ("'logprobs'", "floating-point", "torch.int64")),
    Bad("logprobs-nan", call(with_key("logprobs", nan_at((2, 4), (1, 2)))), ValueError,
        ("'logprobs'", "finite", "(1, 2)")),
    Bad("values-inf", call(with_key("values", torch.full((2, 4), math.inf))), ValueError,
        ("'values'", "finite")),
    Bad("ref-logp-other-device", call(with_key("ref_logp", torch.zeros(2, 4, device="meta"))),
        ValueError, ("'ref_logp'", "on cpu", "meta")),
    Bad("rewards-nan", call(with_key("rewards", torch.tensor([1.0, math.nan]))), ValueError,
        ("'rewards'", "rows [1] are NaN", "actor.unscorable_rewards: exclude")),
    Bad("rewards-inf", call(with_key("rewards", torch.tensor([math.inf, 0.0]))), ValueError,
        ("'rewards'", "finite")),
    Bad("rewards-bool", call(with_key("rewards", torch.tensor([True, False]))), ValueError,
        ("'rewards'", "float or integer", "torch.bool")),
    Bad("rewards-per-token", call(with_key("rewards", torch.zeros(2, 4))), ValueError,
        ("'rewards'", "shape [2]", "[2, 4]")),
    Bad("rewards-not-a-tensor", call(with_key("rewards", [1.0, 0.0])), ValueError,
        ("'rewards'", "shape [2]", "list")),
    Bad("loss-mask-not-binary", call(with_key("loss_mask", torch.tensor([[0, 2, 1, 0], [0, 1, 1, 1]]))),
        ValueError, ("'loss_mask'", "only 0 and 1")),
    Bad("left-padding", call(with_key("attention_mask", torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]),
                                      )), ValueError, ("'attention_mask'", "right padding")),
    Bad("generated-on-padding", call(with_key("loss_mask", torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]]))),
        ValueError, ("'loss_mask'", "attention_mask is 1", "rows [0]")),
    Bad("generated-first-token", call(with_key("loss_mask", torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]]))),
        ValueError, ("'loss_mask'", "column 0", "rows [0]")),
    Bad("token-rewards-wrong-shape", call(with_key("token_rewards", torch.zeros(2, 5))), ValueError,
        ("'token_rewards'", "shape [2, 4]", "[2, 5]")),
    Bad("token-rewards-nan", call(with_key("token_rewards", nan_at((2, 4), (0, 1)))), ValueError,
        ("'token_rewards'", "finite")),
    Bad("is-truncated-list", call(with_key("is_truncated", [False, True])), TypeError,
        ("'is_truncated'", "bool tensor", "list")),
    Bad("is-truncated-wrong-shape", call(with_key("is_truncated", torch.zeros(2, 1, dtype=torch.bool))),
        ValueError, ("'is_truncated'", "shape [2]", "[2, 1]")),
    Bad("is-truncated-float", call(with_key("is_truncated", torch.tensor([0.0, 1.0]))), ValueError,
        ("'is_truncated'", "bool or integer")),
    Bad("missing-key-misspelt", call({**without("rewards"), "reward": torch.ones(2)}), ValueError,
        ("rollout batch has no 'rewards'", "'reward' for 'rewards'")),
    Bad("batch-key-misspelt", warns(UnknownBatchKeyWarning, good(token_reward=torch.ones(2, 4))),
        UnknownBatchKeyWarning, ("'token_reward'", "did you mean 'token_rewards'?")),
    Bad("logprobs-above-zero", call(with_key("logprobs", PROBABILITIES)), ValueError,
        ("'logprobs'", "expected log-probabilities", "generated tokens", "(0, 1): 0.7")),
    Bad("ref-logp-above-zero", warns(LogProbRangeWarning, with_key("ref_logp", POSITIVE_REF)),
        LogProbRangeWarning,
        ("'ref_logp'", "expected log-probabilities", "actor.positive_ref_prox_logp")),
    Bad("prox-logp-above-zero-raise", call(good(prox_logp=POSITIVE_REF), positive_ref_prox_logp="raise"),
        ValueError, ("'prox_logp'", "expected log-probabilities", "(0, 0): 0.75")),
    Bad("kl-without-ref-logp", warns(MissingRefLogpWarning, without("ref_logp")),
        MissingRefLogpWarning, ("actor.kl_ctl=0.1", "no 'ref_logp'", "actor.missing_ref_logp")),
    Bad("kl-without-ref-logp-raise", call(without("ref_logp"), missing_ref_logp="raise"),
        ValueError, ("actor.kl_ctl=0.1", "no 'ref_logp'")),
    Bad("process-mode-without-token-rewards",
        warns(IgnoredSettingWarning, good(), advantage={"process_adv_shaping": "gvpo"}),
        IgnoredSettingWarning, ("actor.advantage.process_adv_shaping", "'gvpo' is ignored",
                                "no 'token_rewards'")),
    Bad("recompute-without-prox-logp", call(good(), recompute_logprob=True), ValueError,
        ("'prox_logp'", "recompute_logprob")),
    Bad("row-without-generated-token", call(rows_batch(["pgg.", "ppp."], [1.0, 1.0]),
                                            dropped_outcome_reward="raise"), ValueError,
        ("rows [1]", "inactive position")),
    Bad("response-ends-with-tool-output", call(rows_batch(["pgge", "pgg."], [1.0, 1.0]),
                                               dropped_outcome_reward="raise"), ValueError,
        ("rows [0]", "non-generated tokens")),
    # ---------------------------------------------------------------- turns
    Bad("turn-unit-without-turn-ids", call(good(), gae_timestep_unit="turn"), ValueError,
        ("gae_timestep_unit='turn'", "no 'turn_ids'")),
    Bad("turn-id-negative", call(good(turn_ids=[[-1, 0, -1, -1], [-1, 0, 1, 1]]),
                                 gae_timestep_unit="turn"), ValueError,
        ("turn_ids", "non-negative", "rows [0]")),
    Bad("turn-id-decreasing", call(good(turn_ids=[[-1, 0, 0, -1], [-1, 1, 0, 0]]),
                                   gae_timestep_unit="turn"), ValueError,
        ("turn_ids", "non-decreasing", "rows [1]")),
    Bad("turn-id-too-large", call(good(turn_ids=[[-1, 0, 4, -1], [-1, 0, 1, 1]]),
                                  gae_timestep_unit="turn"), ValueError,
        ("turn_ids", "smaller than the sequence length 4")),
    Bad("turn-id-float", call(good(turn_ids=torch.tensor(TURN_IDS, dtype=torch.float32)),
                              gae_timestep_unit="turn"), ValueError, ("turn_ids", "integer dtype")),
    Bad("turn-id-nan", call(good(turn_ids=torch.tensor([[-1, 0, math.nan, -1], [-1, 0, 1, 1]])),
                            token_rewards_as_adv=False), ValueError,
        ("'turn_ids'", "integer values", "NaN")),
    Bad("turn-ids-wrong-shape", call(good(turn_ids=torch.zeros(2, 3, dtype=torch.long))), ValueError,
        ("'turn_ids'", "shape [2, 4]")),
    Bad("folded-rewards-not-uniform", call(good(token_rewards=[[0, 1.0, 2.0, 0], [0, 1, 1, 1.0]]),
                                           token_rewards_as_adv=False), ValueError,
        ("'token_rewards'", "uniform within each turn", "rows [0]")),
    Bad("process-rewards-out-of-range",
        call(good(token_rewards=[[0, 1.0, 2.0, 0], [0, 1, 1, 1.0]]),
             prm=PRMAdvantageShapingConfig(mode="process_weighted")), ValueError,
        ("process_weighted", "[0, 1]", "rows [0]")),
    # ---------------------------------------------------------------- meta and rollout groups
    Bad("meta-not-batch-meta", call(good(), meta={"traj_group_sizes": [2]}), TypeError,
        ("meta", "BatchMeta")),
    Bad("meta-rows-do-not-add-up", call(good(), meta=BatchMeta(2, [1, 2])), ValueError,
        ("meta.traj_group_sizes", "sum to 3", "has 2")),
    Bad("rollout-group-rows-do-not-add-up",
        lambda: concat_batch([{**good(), "rollout_group": RolloutGroup((1, 2))}]), ValueError,
        ("rollout_group", "cover 3 rows", "prompt has 2")),
    Bad("rollout-group-reward-count", lambda: RolloutGroup((1, 1), (1.0,)), ValueError,
        ("RolloutGroup.rewards", "one entry per logical rollout")),
    Bad("split-rollout-rows-disagree",
        call(*concat_batch([{**good(), "rollout_group": RolloutGroup((2,))}]),
             reward_norm=NormConfig(mean_level="group", std_level="group")), ValueError,
        ("actor.reward_norm", "rows [1]", "explicit reference reward")),
    Bad("singleton-groups", warns(SingletonGroupWarning, good(), reward_norm=GROUP_NORM),
        SingletonGroupWarning, ("actor.reward_norm", "every group has one member",
                                "group_size 1 and no meta", "actor.singleton_groups")),
    Bad("singleton-groups-raise", call(good(), meta=BatchMeta(2, [1, 1]), adv_norm=GROUP_NORM,
                                       singleton_groups="raise"), ValueError,
        ("actor.adv_norm", "every group has one member", "member counts [1, 1]")),
    Bad("group-size-does-not-divide", call(rows_batch(["pg.", "pg.", "pg."], [0.0, 1.0, 2.0]),
                                           reward_norm=NormConfig(mean_level="group", group_size=2)),
        ValueError, ("actor.reward_norm.group_size", "3 rows")),
    # ---------------------------------------------------------------- call-time PRM selection
    Bad("prm-not-a-config", call(good(), prm={"mode": "gvpo"}), TypeError,
        ("prm", "PRMAdvantageShapingConfig")),
    Bad("prm-unknown-mode", call(good(), prm=PRMAdvantageShapingConfig(mode="weighted")), ValueError,
        ("prm.mode", "additive", "'weighted'")),
    Bad("prm-gvpo-needs-direct-rewards", call(good(), prm=PRMAdvantageShapingConfig(mode="gvpo"),
                                              token_rewards_as_adv=False), ValueError,
        ("prm.mode", "'gvpo'", "token_rewards_as_adv")),
    Bad("prm-process-weighted-with-mask-no-eos",
        call(good(), prm=PRMAdvantageShapingConfig(mode="process_weighted"),
             mask_no_eos_with_zero=True), ValueError,
        ("prm.mode", "process_weighted", "mask_no_eos_with_zero")),
    Bad("prm-gvpo-nonfinite", call(good(token_rewards=torch.zeros(2, 4)),
                                   prm=PRMAdvantageShapingConfig(mode="gvpo", zero_eps=math.inf)),
        ValueError, ("gvpo", "zero_eps", "finite and non-negative", "inf")),
    # ---------------------------------------------------------------- config
    Bad("config-unknown-norm-level", lambda: ActorConfig(adv_norm={"mean_level": "token"}),
        ValueError, ("actor.adv_norm.mean_level", "'token'")),
    Bad("config-unknown-estimator", lambda: ActorConfig(advantage={"estimator": "gae"}), ValueError,
        ("actor.advantage.estimator", "token_gae", "'gae'")),
    Bad("config-unimportable-path",
        lambda: AdvantageModule(ActorConfig(advantage={"estimator": "my_pkg.estimators.fn"})),
        ValueError, ("actor.advantage.estimator", "my_pkg.estimators.fn", "cannot import")),
    Bad("config-kwargs-not-accepted",
        lambda: AdvantageModule(ActorConfig(gae_lambda="lightning_adv.vapo_length_adaptive_gae",
                                            gae_lambda_kwargs={"a": 1})),
        ValueError, ("actor.gae_lambda", "does not accept kwargs ['a']")),
    Bad("config-kwargs-not-json",
        lambda: ActorConfig(advantage={"estimator": {"implementation": "a.b", "kwargs": {"x": (1,)}}}),
        ValueError, ("actor.advantage.estimator.kwargs", "JSON")),
    Bad("config-default-compute-kwargs",
        lambda: ActorConfig(advantage={"compute": {"implementation": "default", "kwargs": {"x": 1}}}),
        ValueError, ("actor.advantage.compute", "no kwargs")),
    Bad("config-replacement-plus-stage",
        lambda: ActorConfig(advantage={"compute": "a.b", "process_adv_shaping": "gvpo"}),
        ValueError, ("actor.advantage.compute", "cannot be combined",
                     "actor.advantage.process_adv_shaping")),
    Bad("config-gvpo-negative", lambda: ActorConfig(advantage={"process_adv_shaping": {
        "implementation": "gvpo", "kwargs": {"zero_penalty": -1}}}), ValueError,
        ("actor.advantage.process_adv_shaping.kwargs.zero_penalty", "-1")),
    Bad("config-static-lambda-nan", lambda: ActorConfig(gae_lambda=math.nan), ValueError,
        ("actor.gae_lambda", "nan")),
    Bad("config-lambda-kwargs-rejected",
        lambda: AdvantageModule(ActorConfig(gae_lambda="lightning_adv.vapo_length_adaptive_gae",
                                            gae_lambda_kwargs={"alpha": -1})),
        ValueError, ("actor.gae_lambda", "rejects kwargs", "alpha must be a positive")),
    Bad("lambda-function-out-of-range",
        lambda: AdvantageModule(ActorConfig(gae_lambda="tests.core.test_bad_inputs.out_of_range_lambda")),
        ValueError, ("actor.gae_lambda 'tests.core.test_bad_inputs.out_of_range_lambda'",
                     "outside [0, 1]")),
    Bad("config-lambda-kwargs-ignored",
        config_warns(IgnoredSettingWarning, gae_lambda=0.9, gae_lambda_kwargs={"alpha": 1.0}),
        IgnoredSettingWarning, ("actor.gae_lambda_kwargs", "is ignored", "the number 0.9")),
    Bad("config-reward-clip-zero", lambda: ActorConfig(reward_clip=0.0), ValueError,
        ("actor.reward_clip", "> 0", "0.0")),
    Bad("config-reward-scaling-zero", lambda: ActorConfig(reward_scaling=0), ValueError,
        ("actor.reward_scaling", "non-zero", "0")),
    Bad("config-overlong-factor-zero",
        lambda: ActorConfig(overlong_reward_penalty=True, overlong_tokens=2, overlong_penalty_factor=0.0),
        ValueError, ("actor.overlong_penalty_factor", "> 0", "penalizes nothing")),
    Bad("config-overlong-options-ignored", config_warns(IgnoredSettingWarning, overlong_tokens=4),
        IgnoredSettingWarning, ("actor.overlong_tokens", "is ignored",
                                "actor.overlong_reward_penalty is false")),
    Bad("config-overlong-tokens-invalid", lambda: ActorConfig(overlong_tokens=0), ValueError,
        ("actor.overlong_tokens", "null or a positive integer", "0")),
    Bad("config-kl-estimator-ignored", config_warns(IgnoredSettingWarning, kl_ctl=0.0, kl_estimator="k3"),
        IgnoredSettingWarning, ("actor.kl_estimator", "'k3' is ignored", "actor.kl_ctl is 0")),
    Bad("kernel-discount-out-of-range", token_gae(discount=2.0), ValueError,
        ("compute_token_gae", "discount", "[0, 1]", "2.0")),
    Bad("kernel-lambda-nan", token_gae(gae_lambda=math.nan), ValueError,
        ("compute_token_gae", "gae_lambda", "[0, 1]", "nan")),
    Bad("kernel-lambda-tensor-out-of-range", token_gae(gae_lambda=torch.tensor([0.5, 1.5])),
        ValueError, ("compute_token_gae", "gae_lambda tensor", "[0, 1]", "max 1.5")),
    Bad("kernel-mask-not-binary", token_gae(mask=torch.full((2, 4), 3.0)), ValueError,
        ("compute_token_gae", "loss_mask", "only 0 and 1", "3.0")),
    Bad("config-norm-eps-zero", lambda: ActorConfig(reward_norm={"eps": 0.0}), ValueError,
        ("actor.reward_norm.eps", "> 0")),
    Bad("config-gpg-eps-zero", lambda: ActorConfig(advantage={"outcome_reward_shaping": {
        "implementation": "gpg", "kwargs": {"std_normalize": True, "eps": 0}}}), ValueError,
        ("actor.advantage.outcome_reward_shaping.kwargs.eps", "> 0")),
]


def _stage_result(stage, name, field, expected):
    import tests.support.contract_stages as test_contracts
    def run():
        batch = test_contracts.batch()
        if name == "compute_int_rewards_changed":
            batch["rewards"] = torch.tensor([1, 2])
        return test_contracts.module(stage, name)(batch)
    return Bad(f"stage-{name.replace('_', '-')}", run, AdvantageContractError,
               (f"advantage.{stage} 'tests.support.contract_stages.{name}'", field, expected))


def _contract_entries():
    import tests.support.contract_stages as test_contracts
    return [_stage_result(*violation) for violation in test_contracts.VIOLATIONS]


# Stage results breaking each contract rule (the violating functions live in test_contracts).
CATALOGUE += _contract_entries()


def _recipe(name, batch, meta=True, **overrides):
    from lightning_adv.recipes import recipe

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AdvantageModule(recipe(name, **overrides))(*(
                concat_batch([batch]) if meta else (batch, None)))
    return run


# The estimators of lightning_adv.recipes and the reward-side options.
CATALOGUE += [
    Bad("reward-weights-wrong-length", _recipe("gdpo", with_key("rewards", torch.ones(2, 3)),
                                                reward_weights=[1.0, 1.0]), ValueError,
        ("actor.reward_weights", "expected 3 weights", "got 2")),
    Bad("reward-columns-without-weights", _recipe("grpo", with_key("rewards", torch.ones(2, 3))),
        ValueError, ("'rewards'", "[2, 3] and no actor.reward_weights", "set to K numbers")),
    Bad("reward-columns-partly-nan", _recipe(
        "grpo", with_key("rewards", torch.tensor([[1.0, math.nan], [0.0, 1.0]])), reward_weights=[1, 1],
        unscorable_rewards="exclude"), ValueError, ("'rewards'", "rows [0]", "some reward columns")),
    Bad("normalize-then-sum-without-meta", _recipe("gdpo", good(), meta=False), ValueError,
        ("actor.reward_aggregation", "needs the batch's meta")),
    Bad("remax-without-baselines", _recipe("remax", good()), ValueError,
        ("'remax_baseline'", "no 'reward_baselines'", "ppo.greedy_baseline")),
    Bad("remax-baselines-wrong-shape", _recipe("remax", good(reward_baselines=torch.zeros(2, 1)),
                                                meta=False),
        ValueError, ("'reward_baselines'", "shape [2]", "[2, 1]")),
    Bad("otb-without-sum-pi-squared", _recipe("optimal_token_baseline", good()), ValueError,
        ("estimator 'optimal_token_baseline'", "no 'sum_pi_squared'")),
    Bad("otb-sum-pi-squared-out-of-range", _recipe(
        "optimal_token_baseline", good(sum_pi_squared=torch.full((2, 4), 2.0))), ValueError,
        ("'sum_pi_squared'", "[0, 1]", "rows [0, 1]")),
    Bad("rloo-kl-without-ref-logp", _recipe("rloo_kl", without("ref_logp")), ValueError,
        ("'sequence_kl'", "no 'ref_logp'")),
    Bad("passk-group-of-one", _recipe("grpo_passk", rows_batch(["pgg."], [1.0])), ValueError,
        ("'passk_baseline'", "at least two responses", "groups [0]")),
    Bad("all-rows-unscorable", call(with_key("rewards", torch.tensor([math.nan, math.nan])),
                                    unscorable_rewards="exclude"), ValueError,
        ("'rewards'", "every row is NaN")),
    Bad("unscorable-rows-shift-fixed-slices", call(
        with_key("rewards", torch.tensor([1.0, math.nan])), unscorable_rewards="exclude",
        reward_norm={"mean_level": "group", "std_level": "group", "group_size": 2}), ValueError,
        ("actor.unscorable_rewards", "actor.reward_norm.group_size (2)", "pass meta")),
    Bad("config-reward-clip-low-above-high", lambda: ActorConfig(reward_clip=[1.0, -1.0]),
        ValueError, ("actor.reward_clip", "low < high", "[1.0, -1.0]")),
    Bad("config-truncated-reward-both", lambda: ActorConfig(
        truncated_reward={"scale": 0.5, "value": -1.0}), ValueError,
        ("actor.truncated_reward", "exactly one of scale")),
    Bad("config-unknown-recipe", lambda: ActorConfig(recipe="grpo2"), ValueError,
        ("actor.recipe", "expected one of", "'grpo2'")),
]



def _vine(batch, meta=True, **kwargs):
    config = ActorConfig(kl_ctl=0.0, advantage={"estimator": {"implementation": "vine",
                                                              "kwargs": kwargs}})

    def run():
        return AdvantageModule(config)(*(concat_batch([batch]) if meta else (batch, None)))
    return run


ONE_STEP_EACH = torch.tensor([[[0.5]], [[0.5]]])
STEP_IDS = [[-1, 0, 1, -1], [-1, 0, 1, 2]]

# The vine estimator's Monte Carlo returns and step ids (docs/guides/step-credit.md).
CATALOGUE += [
    Bad("vine-without-mc-returns", _vine(good()), ValueError,
        ("estimator 'vine'", "no 'mc_returns'", "[B, S, K]")),
    Bad("mc-returns-not-3d", _vine(good(mc_returns=torch.zeros(2, 3)), meta=False), ValueError,
        ("'mc_returns'", "shape [2, S, K]", "[2, 3]")),
    Bad("mc-returns-integer", _vine(good(mc_returns=torch.zeros(2, 1, 1, dtype=torch.long))),
        ValueError, ("'mc_returns'", "float tensor", "torch.int64")),
    Bad("mc-returns-inf", _vine(good(mc_returns=torch.tensor([[[math.inf]], [[0.5]]]))), ValueError,
        ("'mc_returns'", "finite returns or NaN", "(0, 0, 0)")),
    Bad("mc-returns-too-few-step-slots", _vine(good(step_ids=STEP_IDS, mc_returns=torch.zeros(2, 2, 1))),
        ValueError, ("'mc_returns'", "at least 3 step slots", "rows [1]", "[2, 2, 1]")),
    Bad("mc-returns-past-last-step", _vine(good(mc_returns=torch.zeros(2, 2, 1))), ValueError,
        ("'mc_returns'", "NaN in the slots past each row's last step", "rows [0, 1]")),
    Bad("mc-returns-step-without-return", _vine(good(mc_returns=torch.tensor([[[0.5]], [[math.nan]]]))),
        ValueError, ("'mc_returns'", "at least one finite return for every step", "rows [1]",
                     "skip_unestimated")),
    Bad("step-ids-decreasing", _vine(good(step_ids=[[-1, 1, 0, -1], [-1, 0, 0, 0]],
                                          mc_returns=ONE_STEP_EACH)), ValueError,
        ("estimator 'vine'", "'step_ids' (shifted one step left): step_ids at active", "non-decreasing")),
    Bad("step-ids-fractional", _vine(good(step_ids=[[-1, 0.5, 0, -1], [-1, 0, 0, 0]],
                                          mc_returns=ONE_STEP_EACH)), ValueError,
        ("'step_ids'", "integer values")),
    Bad("config-vine-skip-not-bool", lambda: ActorConfig(advantage={"estimator": {
        "implementation": "vine", "kwargs": {"skip_unestimated": 1}}}), ValueError,
        ("actor.advantage.estimator.kwargs.skip_unestimated",)),
]

def test_catalogue_has_at_least_forty_distinct_entries():
    ids = [b.id for b in CATALOGUE]
    assert len(ids) == len(set(ids)) and len(ids) >= 40


@pytest.mark.parametrize("bad", CATALOGUE, ids=[b.id for b in CATALOGUE])
def test_bad_input_gives_one_clear_error(bad):
    with pytest.raises(Exception) as err:
        bad.run()
    assert type(err.value) is bad.error, (type(err.value), err.value)
    message = str(err.value)
    for fragment in bad.fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
