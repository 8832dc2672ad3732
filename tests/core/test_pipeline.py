"""Hand-computed small cases for every step and option of the default pipeline (SPEC §3).

The numbers in the comments were worked out by hand from the spec; each test would fail
if the corresponding step computed anything else.
"""

import math
import warnings

import pytest
import torch

from tests.support.batches import rows_batch
from lightning_adv import (
    ActorConfig, AdvantageModule, BatchMeta, NormConfig, PRMAdvantageShapingConfig, RolloutGroup, concat_batch)
from lightning_adv.exceptions import DroppedOutcomeRewardWarning

NO_KL = {"kl_ctl": 0.0}


def run(batch, meta=None, prm=None, **config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DroppedOutcomeRewardWarning)
        return AdvantageModule(ActorConfig(**config))(batch, meta, prm=prm)


def close(got, want):
    want = torch.as_tensor(want, dtype=torch.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.allclose(got.float(), want, atol=1e-5, rtol=1e-5), (got, want)


# ------------------------------------------------------------------------- token GAE

def test_token_gae_monte_carlo_return():
    # T=5, L=4: aligned mask [1,1,1,0,0]; outcome at L-2=2; gamma=lambda=1, V=0.
    out = run(rows_batch(["pggg."], [1.0]), **NO_KL)
    close(out["advantages"], [[1, 1, 1, 0, 0]])
    close(out["returns"], [[1, 1, 1, 0, 0]])
    close(out["tot_rewards"], [[0, 0, 1, 0, 0]])
    close(out["loss_mask"], [[1, 1, 1, 0, 0]])


def test_token_gae_with_values_discount_and_lambda():
    # gamma=lambda=0.5, V=[.5,.25,0,0], outcome r=1 at position 1 (L=3).
    # t=1: delta = 1 + .5*0 - .25 = .75, A=.75;  t=0: delta = 0 + .5*.25 - .5 = -.375,
    # A = -.375 + .25*.75 = -.1875.  returns = A + V.
    batch = rows_batch(["pgg."], [1.0], values=[[0.5, 0.25, 0.0, 0.0]])
    out = run(batch, discount=0.5, gae_lambda=0.5, **NO_KL)
    close(out["advantages"], [[-0.1875, 0.75, 0, 0]])
    close(out["returns"], [[0.3125, 1.0, 0, 0]])


def test_token_gae_skips_inactive_positions_without_discounting():
    # "pgeg.": aligned mask [1,0,1,0,0]; outcome at L-2=2. gamma=.5, lambda=1, V=0:
    # t=2: A=1; t=1 (inactive) carries 1; t=0: A = 0 + .5*1 = .5.
    out = run(rows_batch(["pgeg."], [1.0]), discount=0.5, **NO_KL)
    close(out["advantages"], [[0.5, 1, 1, 0, 0]])


def test_truncated_rows_bootstrap_from_their_last_valid_token():
    # "pggg" fills T=4 -> truncated; bootstrap V[L-1]=V[3]=2. gamma=lambda=1:
    # t=2: delta = 1 + 2 - 0 = 3 and A=3 carries back.
    values = [[0.0, 0.0, 0.0, 2.0]]
    out = run(rows_batch(["pggg"], [1.0], values=values), **NO_KL)
    close(out["advantages"], [[3, 3, 3, 0]])
    assert out["is_truncated"].tolist() == [True]
    # mask_no_eos_with_zero drops the outcome of truncated rows: A = 0 + 2.
    out = run(rows_batch(["pggg"], [1.0], values=values), mask_no_eos_with_zero=True, **NO_KL)
    close(out["advantages"], [[2, 2, 2, 0]])
    # An explicit is_truncated=False wins over the "row fills the width" rule: no bootstrap.
    out = run(rows_batch(["pggg"], [1.0], values=values, is_truncated=[False]), **NO_KL)
    close(out["advantages"], [[1, 1, 1, 0]])
    assert out["is_truncated"].tolist() == [False]
    # And is_truncated=True bootstraps a row that ended before the width: V[L-1] = V[3] = 4.
    out = run(rows_batch(["pggg."], [1.0], values=[[0, 0, 0, 4.0, 9.0]], is_truncated=[True]),
              **NO_KL)
    close(out["advantages"], [[5, 5, 5, 0, 0]])


def test_returns_are_advantages_plus_values_everywhere():
    batch = rows_batch(["pgeg.", "pgggg"], [1.0, -1.0], values=torch.arange(10.0).reshape(2, 5))
    out = run(batch, discount=0.9, gae_lambda=0.8)
    close(out["returns"], out["advantages"] + batch["values"])
    assert out["advantages"][:, -1].abs().sum() == 0  # the last column is never a timestep


# ------------------------------------------------------------------------- KL

@pytest.mark.parametrize("estimator, kl", [
    # old = shift(logprobs) * m = [-1, -2, 0, 0]; ref * m = [-1.5, -1, 0, 0]; d = [.5, -1, 0, 0]
    ("k1", [-0.25, 0.5, 0, 0]),                        # -0.5 * d
    ("k2", [-0.0625, -0.25, 0, 0]),                    # -0.5 * d^2 / 2
    ("k3", [-0.5 * (math.exp(-0.5) - 0.5), -0.5 * (math.e - 2), 0, 0]),  # -0.5*(e^-d - 1 + d)
])
def test_kl_estimators(estimator, kl):
    batch = rows_batch(["pgg."], [1.0], logprobs=[[0.0, -1.0, -2.0, 0.0]],
                       ref_logp=[[-1.5, -1.0, 0.3, 0.7]])
    out = run(batch, kl_ctl=0.5, kl_estimator=estimator)
    close(out["kl_rewards"], [kl])
    close(out["logprobs"], [[-1, -2, 0, 0]])
    close(out["ref_logp"], [[-1.5, -1, 0, 0]])
    # token GAE folds the KL into each step: rewards = kl + outcome(1 at position 1).
    tot = torch.tensor([kl]) + torch.tensor([[0, 1.0, 0, 0]])
    close(out["tot_rewards"], tot)
    close(out["advantages"], [[tot[0, 0] + tot[0, 1], tot[0, 1], 0, 0]])


def test_kl_is_clamped_to_ten():
    # old - ref = +30 at position 0 and -30 at position 1 (log-probs stay <= 0)
    batch = rows_batch(["pgg."], [0.0], logprobs=[[0.0, 0.0, -30.0, 0.0]],
                       ref_logp=[[-30.0, 0.0, 0.0, 0.0]])
    out = run(batch, kl_ctl=1.0)
    close(out["kl_rewards"], [[-10, 10, 0, 0]])


def test_missing_ref_logp_means_zeros():
    batch = rows_batch(["pgg."], [0.0], logprobs=[[0.0, -1.0, -2.0, 0.0]])
    out = run(batch, kl_ctl=0.1)
    close(out["kl_rewards"], [[0.1, 0.2, 0, 0]])
    assert "ref_logp" not in out


# ------------------------------------------------------------------------- log-probs

def test_old_logprobs_prox_and_mopd():
    logprobs = [[0.5, -1.0, -2.0, 0.7]]  # junk at the prompt and padding positions
    prox = [[-0.9, -1.9, 0.4, 0.6]]
    # Standard PPO: old = shift(logprobs) * m, prox_logp output = old.
    out = run(rows_batch(["pgg."], [0.0], logprobs=logprobs, mopd_teacher_logp_sum=torch.zeros(1, 4)))
    close(out["logprobs"], [[-1, -2, 0, 0]])
    close(out["prox_logp"], [[-1, -2, 0, 0]])
    close(out["mopd_behavior_logprobs"], [[-1, -2, 0, 0]])
    # Recompute: old = prox_logp * m (prox is already next-token aligned: not shifted).
    out = run(rows_batch(["pgg."], [0.0], logprobs=logprobs, prox_logp=prox), recompute_logprob=True)
    close(out["logprobs"], [[-0.9, -1.9, 0, 0]])
    close(out["prox_logp"], [[-0.9, -1.9, 0, 0]])
    # Decoupled: old from the behaviour log-probs; prox_logp passes through untouched.
    batch = rows_batch(["pgg."], [0.0], logprobs=logprobs, prox_logp=prox)
    out = run(batch, recompute_logprob=True, use_decoupled_loss=True)
    close(out["logprobs"], [[-1, -2, 0, 0]])
    assert out["prox_logp"] is batch["prox_logp"]
    assert "mopd_behavior_logprobs" not in out


# ------------------------------------------------------------------------- outcome placement

def test_outcome_lands_on_the_position_predicting_the_last_token():
    # L=5 -> position 3, L=2 -> position 0; kl 0, gamma=1: tot_rewards show the placement.
    out = run(rows_batch(["pgggg.", "pg...."], [2.0, 3.0]), **NO_KL)
    close(out["tot_rewards"], [[0, 0, 0, 2, 0, 0], [3, 0, 0, 0, 0, 0]])


def test_dropped_outcome_reward_warns_once_naming_rows_and_can_raise():
    # Row 1 ends with an environment token: its outcome lands on an inactive position.
    batch = rows_batch(["pgg.", "pgge"], [1.0, 1.0])
    with pytest.warns(DroppedOutcomeRewardWarning, match=r"rows \[1\]") as record:
        out = AdvantageModule(ActorConfig(kl_ctl=0.0))(batch)
    assert len(record) == 1
    close(out["advantages"], [[1, 1, 0, 0], [0, 0, 0, 0]])  # legacy numbers kept
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        AdvantageModule(ActorConfig(dropped_outcome_reward="raise"))(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AdvantageModule(ActorConfig(dropped_outcome_reward="ignore", kl_ctl=0.0))(batch)


# ------------------------------------------------------------------------- rewards

def test_scaling_and_clipping():
    # clip((r + 1) * 2, +-3): r=-4 -> -6 -> -3; r=0 -> 2; r=1 -> 4 -> 3.
    out = run(rows_batch(["pg.", "pg.", "pg."], [-4.0, 0.0, 1.0]), reward_bias=1.0,
              reward_scaling=2.0, reward_clip=3.0, **NO_KL)
    close(out["advantages"][:, 0], [-3, 2, 3])
    close(out["rewards"], [-4, 0, 1])  # the rewards output is before scaling


def test_length_penalty():
    # max_new_tokens=10, overlong_tokens=4 -> expected length 6. factor .5:
    # 8 tokens: -(8-6)/4*.5 = -.25; 6 tokens: 0; 3 tokens: positive -> no change.
    batch = rows_batch(["p" + "g" * 8 + "..", "p" + "g" * 6 + "....", "p" + "g" * 3 + "......."],
                       [1.0, 1.0, 1.0])
    config = dict(overlong_reward_penalty=True, overlong_tokens=4, overlong_penalty_factor=0.5,
                  max_new_tokens=10, **NO_KL)
    out = run(batch, **config)
    close(out["rewards"], [0.75, 1.0, 1.0])
    close(out["advantages"][:, 0], [0.75, 1.0, 1.0])
    assert torch.equal(batch["rewards"], torch.ones(3))  # the caller's rewards are untouched
    # Not clamped below -factor: 12 tokens -> -(12-6)/4*.5 = -.75.
    out = run(rows_batch(["p" + "g" * 12 + "."], [0.0]), **config)
    close(out["rewards"], [-0.75])


def test_integer_rewards():
    batch = rows_batch(["pg..", "pggg"], torch.tensor([1, 0]))
    out = run(batch, **NO_KL)
    assert out["rewards"].dtype == torch.int64 and out["rewards"].tolist() == [1, 0]
    close(out["advantages"][:, 0], [1, 0])
    # A length penalty that penalizes nothing keeps them integer ...
    config = dict(overlong_reward_penalty=True, overlong_tokens=2, overlong_penalty_factor=1.0,
                  max_new_tokens=10, **NO_KL)
    assert run(batch, **config)["rewards"].dtype == torch.int64
    # ... one that penalizes a row makes them float instead of failing: 3 tokens, expected 1.
    config["max_new_tokens"] = 3
    out = run(batch, **config)
    assert out["rewards"].dtype == torch.float32
    close(out["rewards"], [1.0, -1.0])  # -(3 - 1) / 2 * 1


# ------------------------------------------------------------------------- reward normalization

THREE = ["pg.", "pg.", "pg."]


@pytest.mark.parametrize("norm, want", [
    (NormConfig(mean_level="group", std_level="group"), [-1 / (1 + 1e-5), 0, 1 / (1 + 1e-5)]),
    (NormConfig(mean_level="group", std_level="group", std_unbiased=False),
     [-1 / (math.sqrt(2 / 3) + 1e-5), 0, 1 / (math.sqrt(2 / 3) + 1e-5)]),
    (NormConfig(mean_level="group", std_level=None), [-1, 0, 1]),
    # leave-one-out means [2.5, 2, 1.5]; deviations [-1.5, 0, 1.5]; unbiased std 1.5.
    (NormConfig(mean_level="group", mean_leave1out=True, std_level="group"),
     [-1.5 / (1.5 + 1e-5), 0, 1.5 / (1.5 + 1e-5)]),
    (NormConfig(mean_level=None, std_level=None), [1, 2, 3]),
    (NormConfig(mean_level="batch", std_level="batch"), [-1 / (1 + 1e-5), 0, 1 / (1 + 1e-5)]),
])
def test_reward_normalization_of_one_prompt(norm, want):
    batch, meta = concat_batch([rows_batch(THREE, [1.0, 2.0, 3.0])])
    out = run(batch, meta, reward_norm=norm, **NO_KL)
    close(out["advantages"][:, 0], want)
    # Without meta the same numbers come from fixed group_size slices (here one group of 3).
    from dataclasses import replace
    out = run(rows_batch(THREE, [1.0, 2.0, 3.0]), reward_norm=replace(norm, group_size=3), **NO_KL)
    close(out["advantages"][:, 0], want)


def test_group_normalization_keeps_prompts_apart():
    batch, meta = concat_batch([rows_batch(["pg.", "pg."], [0.0, 2.0]),
                                rows_batch(["pg.", "pg."], [10.0, 10.0])])
    out = run(batch, meta, reward_norm=NormConfig(mean_level="group", std_level=None), **NO_KL)
    close(out["advantages"][:, 0], [-1, 1, 0, 0])


def test_rollout_aware_normalization_counts_logical_rollouts():
    # Rows 0 and 1 are one logical rollout (equal rewards); references [1, 3]:
    # mean 2, unbiased std sqrt(2).
    group = RolloutGroup((2, 1))
    batch, meta = concat_batch([rows_batch(THREE, [1.0, 1.0, 3.0], rollout_group=group)])
    out = run(batch, meta, reward_norm=NormConfig(mean_level="group", std_level="group"), **NO_KL)
    s = math.sqrt(2) + 1e-5
    close(out["advantages"][:, 0], [-1 / s, -1 / s, 1 / s])


def test_explicit_references_normalize_rows_that_differ():
    # References (0, 2): mean 1, std sqrt(2); each row is (score - 1) / sqrt(2).
    group = RolloutGroup((2, 1), (0.0, 2.0))
    batch, meta = concat_batch([rows_batch(THREE, [5.0, 7.0, 9.0], rollout_group=group)])
    out = run(batch, meta, reward_norm=NormConfig(mean_level="group", std_level="group"), **NO_KL)
    s = math.sqrt(2) + 1e-5
    close(out["advantages"][:, 0], [4 / s, 6 / s, 8 / s])


def test_equal_references_do_not_divide_by_eps():
    group = RolloutGroup((1, 2))
    batch, meta = concat_batch([rows_batch(THREE, [1.0, 1.0, 1.0], rollout_group=group)])
    out = run(batch, meta, reward_norm=NormConfig(mean_level="group", std_level="group"), **NO_KL)
    close(out["advantages"][:, 0], [0, 0, 0])
    # Without rollout groups (hand-built meta) the legacy rule applies: (r - mean) / (0 + eps).
    out = run(rows_batch(THREE, [1.0, 1.0, 1.0]), BatchMeta(1, [3]),
              reward_norm=NormConfig(mean_level="group", std_level="group"), **NO_KL)
    close(out["advantages"][:, 0], [0, 0, 0])


def test_split_rollout_rows_must_agree_without_a_reference():
    group = RolloutGroup((2, 1))
    batch, meta = concat_batch([rows_batch(THREE, [1.0, 2.0, 3.0], rollout_group=group)])
    with pytest.raises(ValueError, match=r"rows \[1\] of a split rollout have different rewards"):
        run(batch, meta, reward_norm=NormConfig(mean_level="group", std_level="group"))
    # No normalization, no check: the score is used as is.
    out = run(batch, meta, **NO_KL)
    close(out["advantages"][:, 0], [1, 2, 3])


def test_explicit_references_bypass_the_length_penalty():
    # Length penalty -0.5 on row 0 only (2 tokens, expected 1, window 2, factor 1).
    # Reference of rollout 0 is the explicit 1.0, rollout 1 derived from row 1 (penalty 0).
    rows = ["pgg", "pg."]
    group = RolloutGroup((1, 1), (1.0, None))
    batch, meta = concat_batch([rows_batch(rows, [1.0, 3.0], rollout_group=group)])
    out = run(batch, meta, reward_norm=NormConfig(mean_level="group", std_level=None),
              overlong_reward_penalty=True, overlong_tokens=2, overlong_penalty_factor=1.0,
              max_new_tokens=3, **NO_KL)
    # references [1, 3] -> mean 2; row scores [0.5, 3] -> [-1.5, 1].
    close(out["rewards"], [0.5, 3.0])
    close(out["advantages"][:, 0], [-1.5, 1.0])


# ------------------------------------------------------------------------- turn GAE

def turn_batch():
    # "pgge gg." turns 0 and 1; aligned mask [1,1,0,1,1,0,0]; aligned ids [0,0,-1,1,1,-1,-1].
    return rows_batch(["pggegg."], [1.0], values=[[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.0]],
                      turn_ids=[[-1, 0, 0, -1, 1, 1, -1]],
                      logprobs=[[0.0, -1.0, -1.0, 0.0, -2.0, -1.0, 0.0]])


def test_turn_gae_by_hand():
    # gamma=.5, lambda=1. Turn 1: R=1 (outcome at L-2=4), V=V[3]=.4: delta=1-.4=.6, A1=.6.
    # Turn 0: R=0, V=V[0]=.1: delta = 0 + .5*.4 - .1 = .1; A0 = .1 + .5*.6 = .4.
    out = run(turn_batch(), discount=0.5, gae_timestep_unit="turn", **NO_KL)
    close(out["advantages"], [[0.4, 0.4, 0, 0.6, 0.6, 0, 0]])
    # Returns: turn advantage + turn value on active tokens, the values elsewhere.
    close(out["returns"], [[0.5, 0.5, 0.3, 1.0, 1.0, 0.6, 0.0]])


def test_turn_gae_keeps_kl_out_of_the_recursion_and_the_returns():
    plain = run(turn_batch(), discount=0.5, gae_timestep_unit="turn", **NO_KL)
    out = run(turn_batch(), discount=0.5, gae_timestep_unit="turn", kl_ctl=0.5)
    kl = out["kl_rewards"]  # k1 with ref 0: -0.5 * old = [.5, .5, 0, 1, .5, 0, 0]
    close(kl, [[0.5, 0.5, 0, 1.0, 0.5, 0, 0]])
    close(out["advantages"], plain["advantages"] + kl)
    close(out["returns"], plain["returns"])
    close(out["tot_rewards"], plain["tot_rewards"] + kl)


def test_turn_estimator_overrides_the_token_unit():
    a = run(turn_batch(), discount=0.5, advantage={"estimator": "turn_gae"}, **NO_KL)
    b = run(turn_batch(), discount=0.5, gae_timestep_unit="turn", **NO_KL)
    close(a["advantages"], b["advantages"])
    # ... and turn_gae needs turn_ids, named in the error.
    batch = turn_batch()
    del batch["turn_ids"]
    with pytest.raises(ValueError, match="estimator 'turn_gae': rollout batch has no 'turn_ids'"):
        run(batch, advantage={"estimator": "turn_gae"})
    with pytest.raises(ValueError, match="gae_timestep_unit='turn'.*no 'turn_ids'"):
        run(batch, gae_timestep_unit="turn")


@pytest.mark.parametrize("ids, rule", [
    ([[-1, 0, 0, -1, -1, 1, -1]], "non-negative"),
    ([[-1, 0, 0, -1, 9, 9, -1]], "smaller than the sequence length"),
    ([[-1, 1, 1, -1, 0, 0, -1]], "non-decreasing"),
    ([[-1, 0.0, 0, -1, 1, 1, -1]], "integer dtype"),
])
def test_turn_ids_are_validated(ids, rule):
    batch = turn_batch()
    batch["turn_ids"] = torch.tensor(ids)
    with pytest.raises(ValueError, match=rule):
        run(batch, gae_timestep_unit="turn")


def test_token_estimator_ignores_turn_ids_unless_a_lambda_function_needs_them():
    batch = turn_batch()
    batch["turn_ids"] = torch.tensor([[-1, 1, 1, -1, 0, 0, -1]])  # decreasing: invalid
    run(batch)  # token GAE with a static lambda never reads them
    with pytest.raises(ValueError, match="non-decreasing"):
        run(batch, gae_lambda="lightning_adv.constant_gae_lambda", gae_lambda_kwargs={"value": 1.0})


# ------------------------------------------------------------------------- lambda functions

def test_lambda_functions_see_the_estimators_timestep_lengths():
    seen = []

    def record(context, **kwargs):
        seen.append((context["timestep_lengths"].tolist(), context.turn_counts.tolist(),
                     context.effective_token_lengths.tolist()))
        return torch.ones(context.timestep_lengths.shape)

    import lightning_adv.stages.gae_lambda as lambdas
    lambdas.record_for_test = record
    try:
        run(turn_batch(), gae_lambda="lightning_adv.stages.gae_lambda.record_for_test")
        run(turn_batch(), gae_lambda="lightning_adv.stages.gae_lambda.record_for_test",
            advantage={"estimator": "turn_gae"})
    finally:
        del lambdas.record_for_test
    # 4 active tokens in 2 turns: token GAE gets 4, turn GAE (despite unit token) gets 2.
    # (The module also probes the function once when it is built.)
    probe = ([0, 1, 2, 7], [0, 1, 2, 7], [0, 1, 2, 7])
    assert [s for s in seen if s != probe] == [([4], [2], [4]), ([2], [2], [4])]


def test_per_row_lambda_from_a_function():
    # vapo alpha=1: L=1 -> lambda 0; L=3 -> 1 - 1/3 = 2/3. gamma=1, V=0, outcome 1:
    # row 1: A = [ (2/3)^2, 2/3, 1 ] at its three active positions.
    batch = rows_batch(["pg..", "pggg"], [1.0, 1.0], is_truncated=[False, False])
    out = run(batch, gae_lambda="lightning_adv.vapo_length_adaptive_gae",
              gae_lambda_kwargs={"alpha": 1.0}, **NO_KL)
    close(out["advantages"], [[1, 0, 0, 0], [4 / 9, 2 / 3, 1, 0]])


def test_builtin_lambda_functions():
    from lightning_adv import (GAELambdaContext, constant_gae_lambda, relative_position_gae_lambda,
                               vapo_length_adaptive_gae)
    lengths = torch.tensor([0, 1, 2, 5])
    ctx = GAELambdaContext(lengths, lengths, lengths)
    close(constant_gae_lambda(ctx, value=0.3), [0.3] * 4)
    close(vapo_length_adaptive_gae(ctx, alpha=0.5), [0, 0, 0, 1 - 1 / 2.5])
    close(relative_position_gae_lambda(ctx, q=0.25), [0, 1, 0.25, 0.25 ** 0.25])
    with pytest.raises(ValueError, match="alpha"):
        vapo_length_adaptive_gae(ctx, alpha=0)
    with pytest.raises(ValueError, match="q must"):
        relative_position_gae_lambda(ctx, q=1.5)
    assert dict(ctx)["turn_counts"] is lengths  # legacy dict-style access


@pytest.mark.parametrize("returned, fragment", [
    (lambda n: torch.full((n,), float("nan")), "non-finite"),
    (lambda n: torch.ones(n + 1), "shape"),
    (lambda n: torch.ones(n, dtype=torch.int64), "floating-point"),
    (lambda n: [1.0] * n, "float tensor"),
    # Right when the module is built (the probe call), wrong on the real batch:
    (lambda n: torch.ones(n) if n == 4 else torch.full((n,), float("inf")), "non-finite"),
])
def test_lambda_function_results_are_checked(returned, fragment):
    import lightning_adv.stages.gae_lambda as lambdas
    lambdas.bad_for_test = lambda context: returned(context.timestep_lengths.shape[0])
    try:
        with pytest.raises(ValueError, match=fragment) as err:
            run(rows_batch(["pgg."], [1.0]), gae_lambda="lightning_adv.stages.gae_lambda.bad_for_test")
        assert "actor.gae_lambda 'lightning_adv.stages.gae_lambda.bad_for_test'" in str(err.value)
    finally:
        del lambdas.bad_for_test


# ------------------------------------------------------------------------- advantage norm

def test_advantage_normalization_over_active_tokens():
    # Advantages on active tokens: row 0 [1, 1], row 1 [3]; batch mean 5/3,
    # unbiased std sqrt(((2/3)^2*2 + (4/3)^2)/2) = sqrt(4/3).
    batch = rows_batch(["pgg.", "pg.."], [1.0, 3.0])
    out = run(batch, adv_norm=NormConfig(), **NO_KL)
    s = math.sqrt(4 / 3) + 1e-5
    close(out["advantages"], [[-2 / 3 / s, -2 / 3 / s, 0, 0], [4 / 3 / s, 0, 0, 0]])
    close(out["returns"], [[1, 1, 0, 0], [3, 0, 0, 0]])  # returns are not normalized


def test_advantage_normalization_uses_logical_member_counts():
    # One prompt, two rows forming ONE logical rollout: a singleton group, so with
    # leave-one-out its mean is each element itself and the unbiased std is 1.
    group = RolloutGroup((2,))
    batch, meta = concat_batch([rows_batch(["pgg", "pg."], [1.0, 1.0], rollout_group=group)])
    out = run(batch, meta, adv_norm=NormConfig(mean_level="group", mean_leave1out=True,
                                               std_level="group"), **NO_KL)
    close(out["advantages"], torch.zeros(2, 3))
    # Without the group the two rows are two members: LOO means [1, 1] over 3 tokens... all
    # advantages equal 1, so every centred value is 0 as well; change one reward to see it.
    batch, meta = concat_batch([rows_batch(["pgg", "pg."], [1.0, 4.0])])
    out = run(batch, meta, adv_norm=NormConfig(mean_level="group", std_level=None), **NO_KL)
    close(out["advantages"], [[-1, -1, 0], [2, 0, 0]])  # mean of [1, 1, 4] is 2


# ------------------------------------------------------------------------- process rewards

def prm_batch(token_rewards, advantages_from=(2.0, -1.0)):
    # Two rows "pgg." with outcome rewards 2 and -1: with gamma=1 and no KL every active
    # token's advantage is the row's reward.
    return rows_batch(["pgg.", "pgg."], list(advantages_from), token_rewards=token_rewards)


def test_additive_process_shaping_uses_shifted_masked_token_rewards():
    # token-aligned rewards of tokens 1, 2 move to positions 0, 1; junk elsewhere is masked.
    tr = [[9.0, 0.5, 0.25, 9.0], [9.0, -0.5, 0.0, 9.0]]
    out = run(prm_batch(tr), **NO_KL)
    close(out["advantages"], [[2.5, 2.25, 0, 0], [-1.5, -1, 0, 0]])
    close(out["returns"], [[2, 2, 0, 0], [-1, -1, 0, 0]])  # returns never include them


def test_gvpo_shaping():
    # Row 0: A=2 (> eps) on failed tokens -> 0; row 1: A=-1 (< -eps) -> (1 + .5) * -1.
    tr = [[0.0, -1.0, 0.5, 0.0], [0.0, -1.0, -0.1, 0.0]]
    prm = PRMAdvantageShapingConfig(mode="gvpo", negative_scale=0.5, zero_penalty=0.3)
    out = run(prm_batch(tr), prm=prm, **NO_KL)
    close(out["advantages"], [[0, 2, 0, 0], [-1.5, -1.5, 0, 0]])
    # |A| <= eps on a failed token -> -zero_penalty.
    out = run(prm_batch(tr, (0.0, 0.0)), prm=prm, **NO_KL)
    close(out["advantages"], [[-0.3, 0, 0, 0], [-0.3, -0.3, 0, 0]])


def test_explicit_gvpo_kwargs_override_call_time_values_key_by_key():
    tr = [[0.0, -1.0, 0.5, 0.0], [0.0, -1.0, -0.1, 0.0]]
    prm = PRMAdvantageShapingConfig(mode="additive", negative_scale=0.5, zero_penalty=0.3)
    stage = {"process_adv_shaping": {"implementation": "gvpo", "kwargs": {"zero_penalty": 0.7}}}
    # Explicit gvpo beats the call-time additive mode; negative_scale keeps the call-time .5.
    out = run(prm_batch(tr), prm=prm, advantage=stage, **NO_KL)
    close(out["advantages"], [[0, 2, 0, 0], [-1.5, -1.5, 0, 0]])
    out = run(prm_batch(tr, (0.0, 0.0)), prm=prm, advantage=stage, **NO_KL)
    close(out["advantages"], [[-0.7, 0, 0, 0], [-0.7, -0.7, 0, 0]])
    # Explicit additive beats a call-time gvpo mode.
    out = run(prm_batch(tr), prm=PRMAdvantageShapingConfig(mode="gvpo"),
              advantage={"process_adv_shaping": "additive"}, **NO_KL)
    close(out["advantages"], [[1, 2.5, 0, 0], [-2, -1.1, 0, 0]])


def test_process_weighted_shaping():
    # Row 0 (A=2 >= 0): A * p -> [2*.5, 2*0]; row 1 (A=-1 < 0): p if p > 0 else A.
    tr = [[0.0, 0.5, 0.0, 0.0], [0.0, 0.25, 0.0, 0.0]]
    out = run(prm_batch(tr), prm=PRMAdvantageShapingConfig(mode="process_weighted"), **NO_KL)
    close(out["advantages"], [[1, 0, 0, 0], [0.25, -1, 0, 0]])
    with pytest.raises(ValueError, match=r"\[0, 1\].*rows \[1\]"):
        run(prm_batch([[0.0, 0.5, 0.0, 0.0], [0.0, 1.5, 0.0, 0.0]]),
            prm=PRMAdvantageShapingConfig(mode="process_weighted"))


def test_folded_process_rewards_enter_gae_once_per_turn():
    # "pggegg." turns 0 (tokens 1,2) and 1 (tokens 4,5) with uniform rewards .5 and -.25:
    # folded at each turn's last predicting position (1 and 4); outcome 1 lands at 4 too.
    tr = [[0.0, 0.5, 0.5, 7.0, -0.25, -0.25, 0.0]]
    batch = rows_batch(["pggegg."], [1.0], token_rewards=tr, turn_ids=[[-1, 0, 0, -1, 1, 1, -1]])
    out = run(batch, token_rewards_as_adv=False, **NO_KL)
    close(out["tot_rewards"], [[0, 0.5, 0, 0, 0.75, 0, 0]])
    close(out["advantages"], [[1.25, 1.25, 0.75, 0.75, 0.75, 0, 0]])
    # Without turn_ids a turn is a run of generated tokens: same turns here.
    del batch["turn_ids"]
    close(run(batch, token_rewards_as_adv=False, **NO_KL)["tot_rewards"],
          [[0, 0.5, 0, 0, 0.75, 0, 0]])
    # Adjacent turns are split by their ids.
    batch = rows_batch(["pgggg."], [0.0], token_rewards=[[0.0, 1.0, 1.0, 2.0, 2.0, 0.0]],
                       turn_ids=[[-1, 0, 0, 1, 1, -1]])
    close(run(batch, token_rewards_as_adv=False, **NO_KL)["tot_rewards"], [[0, 1, 0, 2, 0, 0]])


def test_folded_process_rewards_must_be_uniform_within_a_turn():
    batch = rows_batch(["pgg."], [0.0], token_rewards=[[0.0, 0.5, 0.25, 0.0]])
    with pytest.raises(ValueError, match=r"uniform within each turn; rows \[0\]"):
        run(batch, token_rewards_as_adv=False)


def test_truncated_rows_lose_token_rewards_under_mask_no_eos_with_zero():
    tr = [[0.0, 0.5, 0.5, 0.5]]
    out = run(rows_batch(["pggg"], [1.0], token_rewards=tr), mask_no_eos_with_zero=True, **NO_KL)
    close(out["advantages"], torch.zeros(1, 4))


def test_user_process_stage_sees_none_without_token_rewards():
    import lightning_adv.stages.process as process_mod
    seen = []

    def spy(inputs):
        seen.append(inputs.token_rewards)
        return inputs.advantages * 2

    process_mod.spy_for_test = spy
    try:
        out = run(rows_batch(["pgg."], [1.0]),
                  advantage={"process_adv_shaping": "lightning_adv.stages.process.spy_for_test"},
                  **NO_KL)
    finally:
        del process_mod.spy_for_test
    assert seen == [None]
    close(out["advantages"], [[2, 2, 0, 0]])


# ------------------------------------------------------------------------- outputs

def test_output_keys_and_pass_through():
    batch = rows_batch(["pgg."], [1.0], values=[[0.0] * 4], custom=[[1, 2, 3, 4]])
    out = run(batch)
    assert out is not batch
    assert out["custom"] is batch["custom"] and out["values"] is batch["values"]
    for key in ("advantages", "returns", "loss_mask", "logprobs", "rewards", "tot_rewards",
                "kl_rewards", "is_truncated", "prox_logp", "input_token_loss_mask"):
        assert key in out, key
    assert out["input_token_loss_mask"] is batch["loss_mask"]
    assert out["advantages"].dtype == torch.float32 and out["loss_mask"].dtype == torch.float32
    assert out["is_truncated"].dtype == torch.bool


def test_no_gradient_flows_into_targets():
    values = torch.zeros(1, 4, requires_grad=True)
    out = run(rows_batch(["pgg."], [1.0], values=values))
    assert not out["returns"].requires_grad and not out["advantages"].requires_grad
