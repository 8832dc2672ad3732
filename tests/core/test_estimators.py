"""The estimators the peers ship beyond GRPO/RLOO: pass@k GRPO, multi-component rewards
(GDPO), TRL's batch scaling, RLOO with a sequence KL, ReMax, the optimal token baseline,
unscorable rows and the reward-side options. Each formula is checked on a small
hand-computed batch, against the slow loops of ``estimator_loops`` and, where there is an
invariant, with hypothesis."""

import math
import warnings

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tests.support.estimator_loops as loops
from tests.support.batches import rows_batch
from lightning_adv import ActorConfig, AdvantageModule, BatchMeta, RolloutGroup, concat_batch
from lightning_adv.recipes import recipe

ROWS_A = ["pgggg.", "pgg...", "pggg..", "pg...."]
ROWS_B = ["pgg...", "pgggg.", "pg...."]


def run(config, batch, meta=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AdvantageModule(config)(batch, meta)


def per_row(out):
    """The advantage every active token of a row shares (checked to be shared)."""
    adv, mask = out["advantages"], out["loss_mask"]
    values = []
    for row in range(adv.shape[0]):
        active = adv[row][mask[row] > 0]
        assert torch.allclose(active, active[0].expand_as(active), atol=1e-6), (row, active)
        values.append(active[0].item())
    return values


def close(got, want, tol=1e-5):
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want):
        assert math.isclose(g, w, rel_tol=tol, abs_tol=tol), (got, want)


def two_prompts(rewards_a, rewards_b, **extra):
    return concat_batch([rows_batch(ROWS_A, rewards_a, **extra.get("a", {})),
                         rows_batch(ROWS_B, rewards_b, **extra.get("b", {}))])


# ------------------------------------------------------------------ grpo_passk

def test_grpo_passk_by_hand():
    # A: best row 0 (1.0), second 0.5, unbiased std of [1, 0, .5, 0] = sqrt(.6875 / 3).
    # B: the maximum 2.0 is unique, second 0, std of [0, 2, 0] = sqrt(4/3).
    out = run(recipe("grpo_passk"), *two_prompts([1.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0]))
    std_a, std_b = math.sqrt(0.6875 / 3), math.sqrt(4 / 3)
    close(per_row(out), [0.5 / (std_a + 1e-6), 0, 0, 0, 0, 2 / (std_b + 1e-6), 0])
    unscaled = recipe("grpo_passk", advantage={
        "outcome_reward_shaping": {"implementation": "passk_baseline",
                                   "kwargs": {"std_normalize": False}},
        "estimator": "token_gae"})
    close(per_row(run(unscaled, *two_prompts([1.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0]))),
          [0.5, 0, 0, 0, 0, 2.0, 0])


def test_grpo_passk_ties_for_the_maximum_give_no_signal():
    out = run(recipe("grpo_passk"), *two_prompts([1.0, 0.0, 1.0, 0.0], [3.0, 3.0, 3.0]))
    close(per_row(out), [0.0] * 7)


def test_grpo_passk_refuses_a_group_of_one():
    batch, meta = concat_batch([rows_batch(["pgg."], [1.0]), rows_batch(["pg..", "pgg."], [0.0, 1.0])])
    with pytest.raises(ValueError, match=r"'passk_baseline': pass@k needs at least two responses "
                                         r"per prompt group; groups \[0\] have one"):
        run(recipe("grpo_passk"), batch, meta)


group_rewards = st.lists(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, -1.0]),
                                  min_size=2, max_size=6), min_size=1, max_size=4)


def batch_of(groups, rows_for=lambda i: "pg" + "g" * (i % 3) + "." * (2 - i % 3)):
    return concat_batch([rows_batch([rows_for(i) for i in range(len(g))], g) for g in groups])


@settings(max_examples=60, deadline=None)
@given(group_rewards)
def test_grpo_passk_matches_the_loop_and_has_one_winner_per_group(groups):
    got = per_row(run(recipe("grpo_passk"), *batch_of(groups)))
    close(got, loops.passk(groups), tol=1e-4)
    start = 0
    for g in groups:
        mine = got[start:start + len(g)]
        nonzero = [v for v in mine if v != 0]
        top = sorted(g)
        if top[-1] > top[-2]:  # a unique maximum: exactly one positive advantage, at it
            assert len(nonzero) == 1 and nonzero[0] > 0
            assert mine.index(nonzero[0]) == g.index(top[-1])
        else:
            assert not nonzero
        start += len(g)


# ------------------------------------------------------------------ grpo_batch_std

def test_grpo_batch_std_by_hand():
    # Batch of 7 rewards, mean 2/7, unbiased std sqrt((2 - 7 (2/7)^2) / 6); group means .5 and 0.
    out = run(recipe("grpo_batch_std"), *two_prompts([1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0]))
    std = math.sqrt((2 - 4 / 7) / 6)
    a = 0.5 / (std + 1e-4)
    close(per_row(out), [a, -a, -a, a, 0, 0, 0])


@settings(max_examples=40, deadline=None)
@given(group_rewards)
def test_grpo_batch_std_matches_the_loop(groups):
    close(per_row(run(recipe("grpo_batch_std"), *batch_of(groups))),
          loops.group_mean_batch_std(groups), tol=1e-4)


# ------------------------------------------------------------------ multi-component rewards, gdpo

def test_gdpo_by_hand():
    # Columns [1, 0, 1, 0] and [0, 1, 1, 0], weights [1, .5]: each column normalizes to
    # +-a, a = .5 / (sqrt(1/3) + 1e-4); sums [.5a, -.5a, 1.5a, -1.5a]; whitened over the
    # batch (mean 0, unbiased std a sqrt(5/3)).
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    out = run(recipe("gdpo", reward_weights=[1.0, 0.5]), *concat_batch([rows_batch(ROWS_A, rewards)]))
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    std = a * math.sqrt(5 / 3)
    close(per_row(out), [0.5 * a / (std + 1e-4), -0.5 * a / (std + 1e-4),
                         1.5 * a / (std + 1e-4), -1.5 * a / (std + 1e-4)])


def test_sum_then_normalize_is_grpo_of_the_weighted_sum():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    summed = rewards @ torch.tensor([1.0, 0.5])
    multi = run(recipe("grpo", reward_weights=[1.0, 0.5]), *concat_batch([rows_batch(ROWS_A, rewards)]))
    single = run(recipe("grpo"), *concat_batch([rows_batch(ROWS_A, summed)]))
    assert torch.allclose(multi["advantages"], single["advantages"], atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(*[st.sampled_from([0.0, 0.5, 1.0, 3.0])] * 3), min_size=2,
                         max_size=5), min_size=1, max_size=3),
       st.lists(st.sampled_from([1.0, 0.5, 2.0, -1.0]), min_size=3, max_size=3))
# Weighted column scores that nearly cancel: the batch scale falls below 2 eps and becomes 1.
@example([[(0.0, 0.0, 0.0), (0.0, 1.0, 3.0)]], [1.0, 1.0, -1.0])
def test_gdpo_matches_the_loop(groups, weights):
    batch, meta = concat_batch([rows_batch(["pgg."] * len(g), torch.tensor(g)) for g in groups])
    got = per_row(run(recipe("gdpo", reward_weights=weights), batch, meta))
    want = loops.gdpo(groups, weights)
    close(got, want, tol=1e-4)


@settings(max_examples=40, deadline=None)
@given(group_rewards, st.sampled_from(["grpo", "gdpo", "rloo", "grpo_batch_std"]),
       st.sampled_from([None, [1.0], [2.5]]), st.booleans())
def test_a_single_column_equals_a_vector(groups, name, weights, integer):
    batch, meta = batch_of(groups)
    if integer:
        batch["rewards"] = batch["rewards"].round().long()
    column = {**batch, "rewards": batch["rewards"][:, None]}
    vector = run(recipe(name, reward_weights=weights), batch, meta)
    matrix = run(recipe(name, reward_weights=weights), column, meta)
    for key in ("advantages", "returns", "rewards", "tot_rewards"):
        assert torch.equal(vector[key], matrix[key]), key


def test_multi_component_bad_inputs_name_the_key():
    batch, meta = concat_batch([rows_batch(ROWS_A, torch.ones(4, 3))])
    with pytest.raises(ValueError, match=r"rollout batch 'rewards': expected shape \[4\] \(one "
                                         r"outcome reward per row\), or \[B, K\] .* got \[4, 3\] "
                                         r"and no actor.reward_weights"):
        run(recipe("gdpo"), batch, meta)
    with pytest.raises(ValueError, match=r"actor.reward_weights: expected 3 weights, one per column"):
        run(recipe("gdpo", reward_weights=[1.0, 1.0]), batch, meta)
    with pytest.raises(ValueError, match="actor.reward_aggregation: 'normalize_then_sum' .* needs "
                                         "the batch's meta"):
        run(recipe("gdpo", reward_weights=[1.0] * 3), batch)
    with pytest.raises(ValueError, match=r"actor.reward_weights\[1\]: expected a finite number"):
        ActorConfig(reward_weights=[1.0, math.nan])


# ------------------------------------------------------------------ rloo_kl

def kl_batch():
    # Row i: one prompt token then generated tokens with behaviour log-prob -1 each; the
    # reference gives -0.5 to every generated token (next-token convention: column t
    # scores token t+1). KL per row = (-1 + .5) x tokens = -.5 x [2, 1, 3].
    rows = ["pgg..", "pg...", "pggg."]
    loss = torch.tensor([[c == "g" for c in r] for r in rows]).float()
    ref = torch.roll(loss, -1, dims=1) * -0.5
    return rows_batch(rows, [1.0, 0.0, 0.5], logprobs=-loss, ref_logp=ref)


def test_rloo_kl_by_hand():
    # beta .05: rewards 1 + .05, 0 + .025, .5 + .075 -> [1.05, .025, .575];
    # leave-one-out baselines (.025 + .575)/2 = .3, (1.05 + .575)/2 = .8125, (1.05 + .025)/2 = .5375.
    out = run(recipe("rloo_kl"), *concat_batch([kl_batch()]))
    close(per_row(out), [1.05 - 0.3, 0.025 - 0.8125, 0.575 - 0.5375])
    # One advantage per sequence: the token KL is in the reward, not in the token rewards.
    assert float(out["kl_rewards"].abs().sum()) == 0


def test_rloo_kl_penalizes_a_split_rollout_by_its_whole_kl():
    # Rows 0 and 1 are one logical rollout (reward 1 on both, KL -1 and -.5): both rows get
    # 1 - .05 (-1.5) = 1.075; row 2 (reward .5, KL -1.5) gets .575. Leave-one-out over two
    # logical rollouts: 1.075 - .575 = .5 and -.5.
    batch = kl_batch()
    batch["rewards"] = torch.tensor([1.0, 1.0, 0.5])
    batch["rollout_group"] = RolloutGroup((2, 1))
    close(per_row(run(recipe("rloo_kl"), *concat_batch([batch]))), [0.5, 0.5, -0.5])
    # An explicit reference reward (2.0) feeds the other rollout's baseline, penalized by
    # the same KL (2 + .075); the rows keep their own penalized reward (SPEC §3 step 3).
    batch["rollout_group"] = RolloutGroup((2, 1), (2.0, None))
    close(per_row(run(recipe("rloo_kl"), *concat_batch([batch]))),
          [1.075 - 0.575] * 2 + [0.575 - (2.0 + 0.075)])


def test_rloo_kl_without_ref_logp_names_the_key():
    batch = kl_batch()
    del batch["ref_logp"]
    with pytest.raises(ValueError, match="outcome_reward_shaping 'sequence_kl': rollout batch has "
                                         "no 'ref_logp'"):
        run(recipe("rloo_kl"), *concat_batch([batch]))


# ------------------------------------------------------------------ remax

def test_remax_by_hand():
    batch = rows_batch(["pggg.", "pg..."], [1.0, 0.0], reward_baselines=[0.25, 0.25],
                       logprobs=[[0, -1.0, -1.0, -1.0, 0], [0, -1.0, 0, 0, 0]])
    # kl_ctl .001, k1 against a zero reference: +.001 at every generated token; the
    # return-to-go minus the greedy baseline .25 is [1.003, 1.002, 1.001] - .25 for row 0
    # and [0 + .001] - .25 for row 1.
    out = run(recipe("remax"), *concat_batch([batch]))
    close(out["advantages"][0, :3].tolist(), [0.753, 0.752, 0.751])
    close(out["advantages"][1, :1].tolist(), [-0.249])


def test_remax_without_reward_baselines_names_the_key():
    with pytest.raises(ValueError, match="'remax_baseline': rollout batch has no 'reward_baselines'"):
        run(recipe("remax"), *concat_batch([rows_batch(["pgg."], [1.0])]))
    with pytest.raises(ValueError, match=r"rollout batch 'reward_baselines': expected finite values, "
                                         r"got NaN/Inf in rows \[1\]"):
        run(recipe("remax"), *concat_batch([rows_batch(["pgg.", "pg.."], [1.0, 0.0],
                                                       reward_baselines=[0.0, math.nan])]))


# ------------------------------------------------------------------ optimal_token_baseline

def test_optimal_token_baseline_by_hand():
    # One group: row 0 generates 2 tokens (reward 1), row 1 one token (reward 0); every
    # sampled token has probability .5, so w_t = 1 - 1 + sum_pi_squared_t = s_t.
    # s = [.5, .25] (row 0), [.5] (row 1): W = [.5, .75], [.5].
    # Step 0: B = (1 * .5 + 0 * .5) / 1 = .5 -> A = .5, -.5. Step 1: only row 0, the
    # unique longest: its own return would be the baseline (A = 0); verl's default
    # handle_zero_tail makes it 0 (A = G = 1).
    half = math.log(0.5)
    batch = rows_batch(["pgg.", "pg.."], [1.0, 0.0],
                       logprobs=[[0, half, half, 0], [0, half, 0, 0]],
                       sum_pi_squared=[[0.5, 0.25, 0, 0], [0.5, 0, 0, 0]])
    out = run(recipe("optimal_token_baseline"), *concat_batch([batch]))
    close(out["advantages"][0, :2].tolist(), [0.5, 1.0], tol=1e-6)
    close(out["advantages"][1, :1].tolist(), [-0.5], tol=1e-6)
    close(out["returns"][0, :2].tolist(), [1.0, 1.0])
    spec = {"implementation": "optimal_token_baseline", "kwargs": {"handle_zero_tail": False}}
    out = run(recipe("optimal_token_baseline", advantage={"estimator": spec}),
              *concat_batch([batch]))
    close(out["advantages"][0, :2].tolist(), [0.5, 0.0], tol=1e-6)
    close(out["advantages"][1, :1].tolist(), [-0.5], tol=1e-6)
    close(out["returns"][0, :2].tolist(), [1.0, 1.0])


def test_optimal_token_baseline_aligns_steps_from_the_first_generated_token():
    # The same group with row 1's prompt one token longer: the same advantages per step.
    half = math.log(0.5)
    batch = rows_batch(["pgg..", "ppg.."], [1.0, 0.0],
                       logprobs=[[0, half, half, 0, 0], [0, 0, half, 0, 0]],
                       sum_pi_squared=[[0.5, 0.25, 0, 0, 0], [0, 0.5, 0, 0, 0]])
    out = run(recipe("optimal_token_baseline"), *concat_batch([batch]))
    close(out["advantages"][0, :2].tolist(), [0.5, 1.0], tol=1e-6)
    close(out["advantages"][1, 1:2].tolist(), [-0.5], tol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 5), st.sampled_from([0.0, 1.0, 0.5, -1.0])),
                         min_size=1, max_size=4), min_size=1, max_size=3),
       st.integers(0, 2 ** 16))
def test_optimal_token_baseline_matches_the_loop(groups, seed):
    g = torch.Generator().manual_seed(seed)
    prompts, reference = [], []
    for group in groups:
        width = 2 + max(n for n, _ in group)
        rows, logprobs, spq, resp = [], [], [], []
        for n, reward in group:
            rows.append("p" + "g" * n + "." * (width - 1 - n))
            pi = torch.rand(n, generator=g) * 0.9 + 0.05
            # A consistent sum of squares: pi^2 plus a share of the rest of the mass squared.
            rest = (1 - pi) ** 2 * torch.rand(n, generator=g)
            logprobs.append([0.0] + pi.log().tolist() + [0.0] * (width - 1 - n))
            spq.append((pi ** 2 + rest).tolist() + [0.0] * (width - n))
            resp.append({"rewards": [0.0] * (n - 1) + [reward], "pi": pi.tolist(),
                         "sum_pi_squared": (pi ** 2 + rest).tolist()})
        prompts.append(rows_batch(rows, [r for _, r in group], logprobs=logprobs,
                                  sum_pi_squared=spq))
        reference.append(resp)
    out = run(recipe("optimal_token_baseline"), *concat_batch(prompts))
    want = loops.optimal_token_baseline(reference)
    for row, expected in enumerate(want):
        active = out["loss_mask"][row] > 0
        close(out["advantages"][row][active].tolist(), expected, tol=1e-4)


def test_optimal_token_baseline_refuses_split_rollouts():
    # Its baseline lines up each response's steps; the rows of one logical rollout are not
    # responses of their own (as rows, one rollout of two rows would be a group of two).
    half = math.log(0.5)
    batch = rows_batch(["pgg.", "pg.."], [1.0, 1.0], logprobs=[[0, half, half, 0], [0, half, 0, 0]],
                       sum_pi_squared=[[0.5, 0.25, 0, 0], [0.5, 0, 0, 0]],
                       rollout_group=RolloutGroup((2,)))
    with pytest.raises(ValueError, match=r"estimator 'optimal_token_baseline': .* rollouts split "
                                         r"over several rows \(prompts \[0\]\)"):
        run(recipe("optimal_token_baseline"), *concat_batch([batch]))


def test_optimal_token_baseline_bad_inputs_name_the_key():
    batch = rows_batch(["pgg.", "pg.."], [1.0, 0.0])
    with pytest.raises(ValueError, match="estimator 'optimal_token_baseline': rollout batch has no "
                                         "'sum_pi_squared'"):
        run(recipe("optimal_token_baseline"), *concat_batch([batch]))
    batch["sum_pi_squared"] = torch.full((2, 4), 1.5)
    with pytest.raises(ValueError, match=r"'sum_pi_squared': expected values in \[0, 1\]"):
        run(recipe("optimal_token_baseline"), *concat_batch([batch]))
    batch["sum_pi_squared"] = torch.full((2, 4), 0.5)
    with pytest.raises(ValueError, match="needs the prompt groups of meta"):
        run(recipe("optimal_token_baseline"), batch)


# ------------------------------------------------------------------ unscorable rows

def nan_batch():
    a = rows_batch(ROWS_A, [1.0, math.nan, 0.0, 1.0], values=torch.rand(4, 6))
    b = rows_batch(ROWS_B, [0.5, 0.0, math.nan], values=torch.rand(3, 6))
    return a, b


def without_rows(prompt, rows):
    keep = [i for i in range(prompt["rewards"].shape[0]) if i not in rows]
    return {k: v[keep] for k, v in prompt.items()}


def test_nan_rewards_are_refused_by_default_with_the_rows():
    with pytest.raises(ValueError, match=r"rollout batch 'rewards': rows \[1, 6\] are NaN \(could "
                                         r"not be scored\); set actor.unscorable_rewards: exclude"):
        run(recipe("grpo"), *concat_batch(list(nan_batch())))


@pytest.mark.parametrize("name", ["grpo", "rloo", "gpg", "reinforce_pp", "grpo_batch_std", "opo"])
def test_unscorable_rows_are_left_out_of_every_statistic(name):
    a, b = nan_batch()
    config = recipe(name, unscorable_rewards="exclude")
    out = run(config, *concat_batch([a, b]))
    clean = run(config, *concat_batch([without_rows(a, [1]), without_rows(b, [2])]))
    kept = [0, 2, 3, 4, 5]
    for key in ("advantages", "returns", "rewards", "tot_rewards", "loss_mask", "logprobs"):
        assert torch.allclose(out[key][kept], clean[key], atol=1e-6), key
    for row in (1, 6):
        assert float(out["advantages"][row].abs().sum()) == 0
        assert float(out["kl_rewards"][row].abs().sum()) == 0
        assert float(out["loss_mask"][row].sum()) > 0  # still counted in token means
    assert out["unscorable"].tolist() == [False, True, False, False, False, False, True]
    assert clean["unscorable"].tolist() == [False] * 5


def test_unscorable_rows_with_a_critic_keep_their_values_as_returns():
    a, b = nan_batch()
    out = run(ActorConfig(unscorable_rewards="exclude", kl_ctl=0.0), *concat_batch([a, b]))
    mask = out["loss_mask"][1]
    assert torch.allclose(out["returns"][1], a["values"][1] * mask)
    assert out["advantages"][1].abs().sum() == 0


def test_unscorable_columns_and_split_rollouts():
    rewards = torch.tensor([[1.0, 0.0], [math.nan, math.nan], [0.0, 1.0], [1.0, 1.0]])
    out = run(recipe("gdpo", reward_weights=[1.0, 1.0], unscorable_rewards="exclude"),
              *concat_batch([rows_batch(ROWS_A, rewards)]))
    assert out["unscorable"].tolist() == [False, True, False, False]
    partial = rewards.clone()
    partial[2, 0] = math.nan
    with pytest.raises(ValueError, match=r"rows \[2\] have NaN in some reward columns but not all"):
        run(recipe("gdpo", reward_weights=[1.0, 1.0], unscorable_rewards="exclude"),
            *concat_batch([rows_batch(ROWS_A, partial)]))
    split = rows_batch(ROWS_A, [1.0, math.nan, 0.0, 1.0], rollout_group=RolloutGroup((2, 1, 1)))
    with pytest.raises(ValueError, match="of one logical rollout disagree on being scorable"):
        run(recipe("rloo", unscorable_rewards="exclude"), *concat_batch([split]))
    with pytest.raises(ValueError, match="every row is NaN"):
        run(recipe("rloo", unscorable_rewards="exclude"),
            *concat_batch([rows_batch(["pg.", "pgg"], [math.nan, math.nan])]))


def test_unscorable_rows_without_meta_cannot_shift_fixed_group_slices():
    # group_size 2 slices rows (0, 1), (2, 3), ...: dropping rows 1 and 3 would pair rows 0
    # and 2 as a group. Without meta the rows cannot be dropped: an error names the key.
    batch = rows_batch(["pgg."] * 8, [1.0, math.nan, 0.0, math.nan, 1.0, 0.0, 0.0, 1.0])
    for field in ("reward_norm", "adv_norm"):
        config = recipe("grpo", unscorable_rewards="exclude",
                        **{field: {"mean_level": "group", "std_level": "group", "group_size": 2}})
        with pytest.raises(ValueError, match=rf"actor.unscorable_rewards: 'exclude' .* "
                                             rf"actor.{field}.group_size \(2\) .* pass meta"):
            run(config, batch)
    # With meta the same rows are dropped from their own groups: singletons get 0.
    meta = BatchMeta(n_trajs=4, traj_group_sizes=[2] * 4)
    out = run(recipe("grpo", unscorable_rewards="exclude"), batch, meta)
    a = 0.5 / (math.sqrt(0.5) + 1e-5)
    close(out["advantages"][:, 0].tolist(), [0, 0, 0, 0, a, -a, -a, a], tol=1e-5)


def test_a_prompt_whose_rows_are_all_unscorable_drops_out_of_the_meta():
    a, b = nan_batch()
    b["rewards"] = torch.full((3,), math.nan)
    config = recipe("grpo", unscorable_rewards="exclude")
    out = run(config, *concat_batch([a, b]))
    clean = run(config, *concat_batch([without_rows(a, [1])]))
    assert torch.allclose(out["advantages"][[0, 2, 3]], clean["advantages"], atol=1e-6)
    assert out["advantages"][4:].abs().sum() == 0


# ------------------------------------------------------------------ reward-side options

def test_asymmetric_reward_clip():
    batch = rows_batch(["pgg", "pgg", "pgg"], [-5.0, 5.0, 0.5])
    out = run(ActorConfig(reward_clip=[-1.0, 2.0], kl_ctl=0.0), batch)
    close(out["advantages"][:, 0].tolist(), [-1.0, 2.0, 0.5])
    out = run(ActorConfig(reward_clip=1.5, kl_ctl=0.0), batch)
    close(out["advantages"][:, 0].tolist(), [-1.5, 1.5, 0.5])
    with pytest.raises(ValueError, match=r"actor.reward_clip: expected \[low, high\] with low < high"):
        ActorConfig(reward_clip=[2.0, -1.0])
    with pytest.raises(ValueError, match=r"actor.reward_clip: expected a number or two numbers"):
        ActorConfig(reward_clip=[1.0, 2.0, 3.0])


def test_truncated_reward_scale_and_value():
    batch = rows_batch(["pgg.", "pggg"], [1.0, 1.0], is_truncated=[False, True])
    out = run(ActorConfig(kl_ctl=0.0, truncated_reward={"scale": 0.25}), batch)
    close([out["advantages"][0, 0].item(), out["advantages"][1, 0].item()], [1.0, 0.25])
    close(out["rewards"].tolist(), [1.0, 0.25])
    out = run(ActorConfig(kl_ctl=0.0, truncated_reward={"value": -0.5}), batch)
    close(out["rewards"].tolist(), [1.0, -0.5])
    # Without is_truncated the legacy rule applies: a row that fills the padded width.
    del batch["is_truncated"]
    out = run(ActorConfig(kl_ctl=0.0, truncated_reward={"value": -0.5}), batch)
    close(out["rewards"].tolist(), [1.0, -0.5])
    with pytest.raises(ValueError, match="actor.truncated_reward: expected exactly one of scale"):
        ActorConfig(truncated_reward={"scale": 0.5, "value": 1.0})
    with pytest.raises(ValueError, match=r"actor.truncated_reward.scale: expected a number <= 1"):
        ActorConfig(truncated_reward={"scale": 2.0})


def test_unscorable_fraction_metric():
    from lightning_adv import AdvantageMetrics

    a, b = nan_batch()
    batch, meta = concat_batch([a, b])
    out = run(recipe("grpo", unscorable_rewards="exclude"), batch, meta)
    metrics = AdvantageMetrics(prefix="train/")
    metrics.update(out, meta)
    assert math.isclose(float(metrics.compute()["train/unscorable_fraction"]), 2 / 7, rel_tol=1e-6)
    plain = AdvantageMetrics(prefix="train/")
    plain.update(run(recipe("grpo"), *two_prompts([1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0])), meta)
    assert "train/unscorable_fraction" not in plain.compute()


# ------------------------------------------------------------------ split rollouts

@pytest.mark.parametrize("name", ["grpo_passk", "grpo_batch_std", "opo", "gpg"])
def test_group_stages_count_a_split_rollout_once(name):
    """A logical rollout split over two rows is one response of its group: every row of it
    gets the advantage the rollout gets when it is one row (opo: its length is the sum of
    its rows'), and it counts once in the group and batch statistics."""
    split = rows_batch(["pgg...", "pgg...", "pg....", "pgggg.", "pgg..."],
                       [1.0, 1.0, 0.0, 0.5, 0.25], rollout_group=RolloutGroup((2, 1, 1, 1)))
    whole = rows_batch(["pgggg.", "pg....", "pgggg.", "pgg..."], [1.0, 0.0, 0.5, 0.25])
    other = rows_batch(["pgg...", "pg....", "pggg.."], [0.0, 1.0, 0.0])
    got = per_row(run(recipe(name), *concat_batch([split, other])))
    want = per_row(run(recipe(name), *concat_batch([whole, other])))
    close(got, [want[0]] + want, tol=1e-6)
    assert got[0] != 0
