"""The ``vine`` estimator (VinePPO's Monte Carlo step values): unbiased advantages whose
variance falls as 1/K on a problem with exact values, hand-computed cases, the layout of
``mc_returns`` and ``step_ids``, and equality with VinePPO's released code (recorded by
``scripts/record_vine_cases.py``)."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_adv import ActorConfig, AdvantageModule, RolloutGroup, concat_batch, split_batch
from tests.support.batches import rows_batch
from tests.support.peers import recorded_cases
from tests.support.turn_problem import (
    TurnProblem, continuation_returns, per_turn_advantages, sample)

NAN = math.nan
VINEPPO = ("src/treetune/episode_generators/math_episode_generator_with_mc_advantages.py",
           "7c9816b18abbf0dd02a319eb81464840b8352486a9442d01aa6f3148703688af")


def vine(kl_ctl: float = 0.0, discount: float = 1.0, **kwargs) -> ActorConfig:
    return ActorConfig(kl_ctl=kl_ctl, discount=discount,
                       advantage={"estimator": {"implementation": "vine", "kwargs": kwargs}})


def run(config: ActorConfig, batch: dict, meta=None) -> dict:
    return AdvantageModule(config)(batch, meta)


# ------------------------------------------------------------------ exact values

PROBLEM = TurnProblem(gamma=0.9)
EPISODES = 20000


@pytest.fixture(scope="module")
def per_turn() -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """For K = 1 and 4: each episode's per-turn advantages [N, 3] and its turn count, the
    continuations sampled from the state before each of its turns."""
    out = {}
    for k, seed in ((1, 3), (4, 4)):
        batch, meta, info = sample(PROBLEM, EPISODES // 10, 10, seed=seed)
        turns = info["turns"]
        g = torch.Generator().manual_seed(100 + seed)
        slots = len(PROBLEM.q)
        returns = torch.stack([continuation_returns(PROBLEM, torch.full((EPISODES,), j), k, g)
                               for j in range(slots)], dim=1)
        present = torch.arange(slots)[None, :, None] < turns[:, None, None]
        batch["mc_returns"] = torch.where(present, returns, NAN).float()
        result = run(vine(discount=PROBLEM.gamma), batch, meta)
        out[k] = (per_turn_advantages(result, turns), turns)
    return out


def cells(adv: torch.Tensor, turns: torch.Tensor):
    """Per (turn, action): the exact advantage and the sampled ones of the episodes that
    took that action there."""
    for (k, action), truth in PROBLEM.advantages().items():
        took = (turns > k + 1) if action == "continue" else (turns == k + 1)
        yield (k, action), truth, adv[took, k].double()


def exact_variance(k: int, action: str, continuations: int) -> float:
    """``Var(A_k | action) = Var(r_k) + (gamma^2 Var(G_{k+1}) + Var(G_k)) / K``: the step's
    own reward, and two independent means of K returns (none after an answer)."""
    var = PROBLEM.return_variances()
    if action == "stop":
        return PROBLEM.q[k] * (1 - PROBLEM.q[k]) + var[k] / continuations
    return (PROBLEM.gamma ** 2 * var[k + 1] + var[k]) / continuations


def variance_and_se(x: torch.Tensor) -> tuple[float, float]:
    """The sample variance and its standard error, ``sqrt((m4 - s^4) / n)``."""
    centred = x - x.mean()
    var = float(centred.pow(2).mean())
    return var, math.sqrt(max(float(centred.pow(4).mean()) - var * var, 0.0) / len(x))


@pytest.mark.parametrize("k", [1, 4])
def test_vine_advantages_are_unbiased(per_turn, k):
    adv, turns = per_turn[k]
    for key, truth, got in cells(adv, turns):
        se = float(got.std()) / math.sqrt(len(got))
        assert abs(float(got.mean()) - truth) < 3 * se, (k, key, float(got.mean()), truth, se)


@pytest.mark.parametrize("k", [1, 4])
def test_vine_variance_is_the_exact_one(per_turn, k):
    adv, turns = per_turn[k]
    for (turn, action), _, got in cells(adv, turns):
        var, se = variance_and_se(got)
        assert abs(var - exact_variance(turn, action, k)) < 3 * se, (k, turn, action, var)


def test_vine_variance_falls_as_one_over_k(per_turn):
    # After a tool call the step's reward is fixed: all the variance is the two Monte Carlo
    # means', so K = 4 has a quarter of K = 1's. The ratio's standard error by the delta
    # method: sqrt((se1 / v1)^2 + (se4 / v4)^2) times the ratio.
    ratios = []
    for (turn, action), _, one in cells(*per_turn[1]):
        if action != "continue":
            continue
        four = next(got for key, _, got in cells(*per_turn[4]) if key == (turn, action))
        (v1, se1), (v4, se4) = variance_and_se(one), variance_and_se(four)
        ratio = v1 / v4
        se = ratio * math.sqrt((se1 / v1) ** 2 + (se4 / v4) ** 2)
        assert abs(ratio - 4) < 3 * se, (turn, ratio, se)
        ratios.append(ratio)
    assert len(ratios) == 2


# ------------------------------------------------------------------ by hand

def steps_row(**extra) -> dict:
    # p | step 0: 2 tokens | step 1: 1 token | step 2: 2 tokens; outcome 1
    return rows_batch(["pggggg"], [1.0], step_ids=[[-1, 0, 0, 1, 2, 2]], **extra)


def test_vine_by_hand():
    # V = (0.5 + 0.3)/2, 0.6 (one continuation; NaN: not there), (0.9 + 0.7)/2 = 0.4, 0.6, 0.8
    # A_0 = 0 + 0.6 - 0.4, A_1 = 0 + 0.8 - 0.6, A_2 = 1 + 0 - 0.8; returns r_k + V_{k+1}
    batch = steps_row(mc_returns=torch.tensor([[[0.5, 0.3], [0.6, NAN], [0.9, 0.7]]]))
    out = run(vine(), *concat_batch([batch]))
    assert out["advantages"][0].tolist() == pytest.approx([0.2, 0.2, 0.2, 0.2, 0.2, 0.0])
    assert out["returns"][0].tolist() == pytest.approx([0.6, 0.6, 0.8, 1.0, 1.0, 0.0])


def test_vine_discount_and_kl_by_hand():
    # gamma = 0.5: A_0 = 0 + 0.5 * 0.6 - 0.4 = -0.1, A_1 = 0.5 * 0.8 - 0.6 = -0.2,
    # A_2 = 1 - 0.8 = 0.2; the KL penalty -0.1 * (old - ref) = -0.1 * 0.5 at each
    # position predicting a generated token, added to the advantages only.
    batch = steps_row(mc_returns=torch.tensor([[[0.4], [0.6], [0.8]]]),
                      ref_logp=torch.full((1, 6), -0.5))
    out = run(vine(kl_ctl=0.1, discount=0.5), *concat_batch([batch]))
    kl = out["kl_rewards"][0]
    assert kl[:5].tolist() == pytest.approx([-0.05] * 5) and kl[5].item() == 0.0
    want = torch.tensor([-0.1, -0.1, -0.2, 0.2, 0.2, 0.0])
    torch.testing.assert_close(out["advantages"][0], want + kl)
    assert out["returns"][0].tolist() == pytest.approx([0.3, 0.3, 0.4, 1.0, 1.0, 0.0])


def test_vine_steps_default_to_turns_and_masked_tokens_get_zero():
    # turns p g e g g (turn_ids) or runs of generated tokens: the same two steps
    returns = torch.tensor([[[0.25, 0.75], [0.0, 1.0]]])
    with_ids = rows_batch(["pgegg"], [1.0], turn_ids=[[-1, 0, -1, 1, 1]], mc_returns=returns)
    runs = rows_batch(["pgegg"], [1.0], mc_returns=returns)
    for batch in (with_ids, runs):
        out = run(vine(), *concat_batch([batch]))
        # A_0 = 0 + 0.5 - 0.5 = 0 on position 0; the tool token's position 1 gets 0;
        # A_1 = 1 - 0.5 on positions 2, 3
        assert out["advantages"][0].tolist() == pytest.approx([0.0, 0.0, 0.5, 0.5, 0.0])
        assert out["returns"][0, 1].item() == 0.0


def test_turn_rewards_are_step_rewards():
    # a tool call costs 0.25 at the end of turn 0: A_0 = -0.25 + 0.5 - 0.5
    batch = rows_batch(["pgegg"], [1.0], turn_ids=[[-1, 0, -1, 1, 1]],
                       turn_rewards=[[0, -0.25, 0, 0, 0]],
                       mc_returns=torch.tensor([[[0.5], [0.5]]]))
    out = run(vine(), *concat_batch([batch]))
    assert out["advantages"][0, 0].item() == pytest.approx(-0.25)


def test_an_episode_split_over_rows_is_one_episode():
    # One episode p g e g | g (its last turn in a second row, one logical rollout whose
    # outcome is the second row's reward): the value after row 0's last step is row 1's
    # first; the advantages are those of the episode in one row.
    whole = rows_batch(["pgegeg"], [1.0], turn_ids=[[-1, 0, -1, 1, -1, 2]],
                       mc_returns=torch.tensor([[[0.1], [0.4], [0.3]]]))
    split = rows_batch(["pgeg", "pg.."], [0.0, 1.0], turn_ids=[[-1, 0, -1, 1], [-1, 0, -1, -1]],
                       mc_returns=torch.tensor([[[0.1], [0.4]], [[0.3], [NAN]]]),
                       rollout_group=RolloutGroup((2,), rewards=(1.0,)))
    one = run(vine(), *concat_batch([whole]))["advantages"][0]
    two = run(vine(), *concat_batch([split]))["advantages"]
    # A_0 = 0.4 - 0.1, A_1 = 0.3 - 0.4, A_2 = 1 - 0.3
    assert one.tolist() == pytest.approx([0.3, 0.0, -0.1, 0.0, 0.7, 0.0])
    assert [two[0, 0].item(), two[0, 2].item(), two[1, 0].item()] == pytest.approx([0.3, -0.1, 0.7])


def test_unestimated_steps_pass_their_successor_back_with_skip_unestimated():
    # VinePPO's max_step_for_value_estimation: no continuation from steps 1 and 2;
    # V_2 = r_2 = 1, V_1 = 0 + V_2 = 1; A_0 = 0 + 1 - 0.4; A_1 = A_2 = 0
    batch = steps_row(mc_returns=torch.tensor([[[0.4], [NAN], [NAN]]]))
    out = run(vine(skip_unestimated=True), *concat_batch([batch]))
    assert out["advantages"][0].tolist() == pytest.approx([0.6, 0.6, 0.0, 0.0, 0.0, 0.0])
    assert out["returns"][0, :5].tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0])


def test_without_meta_each_row_is_an_episode():
    batch = rows_batch(["pgg", "pg."], [1.0, 0.0], step_ids=[[-1, 0, 1], [-1, 0, -1]],
                       mc_returns=torch.tensor([[[0.5], [0.25]], [[0.5], [NAN]]]))
    alone = run(vine(), batch)["advantages"]
    grouped = run(vine(), *concat_batch([batch]))["advantages"]
    torch.testing.assert_close(alone, grouped)
    assert alone[0].tolist() == pytest.approx([-0.25, 0.75, 0.0])
    assert alone[1].tolist() == pytest.approx([-0.5, 0.0, 0.0])


def test_inputs_are_not_modified():
    returns = torch.tensor([[[0.5, NAN], [0.6, 0.2], [0.9, NAN]]])
    batch = steps_row(mc_returns=returns)
    before = {k: v.clone() for k, v in batch.items()}
    versions = {k: v._version for k, v in batch.items()}
    run(vine(), *concat_batch([batch]))
    run(vine(), batch)
    for key, value in batch.items():
        assert torch.equal(value.nan_to_num(7.0), before[key].nan_to_num(7.0)), key
        assert value._version == versions[key], key


def test_concat_batch_pads_mc_returns_with_nan_and_split_batch_keeps_them():
    one = steps_row(mc_returns=torch.tensor([[[0.4], [0.6], [0.8]]]))
    two = rows_batch(["pgg", "pg."], [1.0, 0.0], step_ids=[[-1, 0, 0], [-1, 0, -1]],
                     mc_returns=torch.tensor([[[0.5, 0.5]], [[0.0, 1.0]]]))
    batch, meta = concat_batch([one, two])
    got = batch["mc_returns"]
    assert got.shape == (3, 3, 2)
    assert torch.isnan(got[0, :, 1]).all() and torch.isnan(got[1:, 1:]).all()
    assert got[1, 0].tolist() == [0.5, 0.5] and got[0, 2, 0].item() == pytest.approx(0.8)
    parts = split_batch(batch, meta)
    assert parts[0]["mc_returns"].shape == (1, 3, 2)
    run(vine(), batch, meta)   # the padding is what the stage reads as "no continuation"


# ------------------------------------------------------------------ VinePPO's code

def vineppo_cases() -> list[dict]:
    return recorded_cases("peer_cases/vine_vineppo.json", source=VINEPPO[0],
                          sha256=VINEPPO[1])["cases"]


def vineppo_batch(episodes: list[dict]) -> dict:
    """One row per episode: a prompt token, then its response tokens with the step of each
    (EOS included); the outcome is the last step's reward; ``mc_returns`` holds the
    rewards of each state's continuations, NaN-padded."""
    width = 1 + max(len(e["token_steps"]) for e in episodes) + 1
    steps = max(len(e["step_rewards"]) for e in episodes)
    k = max(len(r) for e in episodes for r in e["mc_returns"])
    rows, ids = [], []
    returns = torch.full((len(episodes), steps, k), NAN)
    for b, e in enumerate(episodes):
        n = len(e["token_steps"])
        rows.append("p" + "g" * n + "." * (width - 1 - n))
        ids.append([-1] + e["token_steps"] + [-1] * (width - 1 - n))
        for s, values in enumerate(e["mc_returns"]):
            returns[b, s, :len(values)] = torch.tensor(values)
    return rows_batch(rows, [e["step_rewards"][-1] for e in episodes], step_ids=ids,
                      mc_returns=returns)


@pytest.mark.parametrize("case", range(10))
def test_equals_vineppo(case):
    recorded = vineppo_cases()[case]
    episodes = recorded["episodes"]
    assert all(sum(e["step_rewards"][:-1]) == 0 for e in episodes)   # the outcome alone
    out = run(vine(skip_unestimated=True), *concat_batch([vineppo_batch(episodes)]))
    for b, e in enumerate(episodes):
        n = len(e["token_steps"])
        got = out["advantages"][b, :n].double()
        torch.testing.assert_close(got, torch.tensor(e["token_advantages"], dtype=torch.float64),
                                   rtol=1e-5, atol=1e-6)
        values = (out["returns"][b, :n] - out["advantages"][b, :n]).double()
        want = torch.tensor([e["values"][s] for s in e["token_steps"]], dtype=torch.float64)
        torch.testing.assert_close(values, want, rtol=1e-5, atol=1e-6)
        per_step = [e["step_advantages"][s] for s in e["token_steps"]]
        assert got.tolist() == pytest.approx(per_step, rel=1e-5, abs=1e-6)


def test_vineppo_cases_cover_unestimated_states_and_eos():
    episodes = [e for c in vineppo_cases() for e in c["episodes"]]
    assert any([] in e["mc_returns"] for e in episodes)
    assert len({len(r) for e in episodes for r in e["mc_returns"]}) > 3
    assert any(len(e["step_rewards"]) == 5 for e in episodes)


def test_unestimated_steps_are_refused_by_default():
    recorded = next(c for c in vineppo_cases() if c["max_step_for_value_estimation"] is not None)
    batch = vineppo_batch(recorded["episodes"])
    with pytest.raises(ValueError, match="estimator 'vine': rollout batch 'mc_returns': expected "
                                         "at least one finite return for every step"):
        run(vine(), *concat_batch([batch]))
