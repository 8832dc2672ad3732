"""Per-turn rewards and the turn estimators: the Monte Carlo test of unbiasedness under
a policy that chooses how many turns to take, hand-computed cases, and the rules of the
``turn_rewards`` key."""

from __future__ import annotations

import pytest
import torch

from lightning_adv import ActorConfig, AdvantageModule, concat_batch
from lightning_adv.recipes import recipe
from tests.support.batches import rows_batch
from tests.support.turn_problem import TurnProblem, advantage_errors, gradient_estimates, sample

GROUPS, SIZE = 1000, 16


def estimator(name: str, **kwargs) -> ActorConfig:
    return recipe("turn_rloo", advantage={"estimator": {"implementation": name, "kwargs": kwargs}})


@pytest.fixture(scope="module")
def problem_batch():
    problem = TurnProblem()
    batch, meta, info = sample(problem, GROUPS, SIZE, seed=0)
    return problem, batch, meta, info["turns"]


def mean_advantage_errors(problem, out, turns) -> dict:
    """Per (turn, action) of the turns with a choice: (estimated mean advantage - exact
    advantage) / standard error; for the last, forced turn the bias itself."""
    last = len(problem.q) - 1
    return {key: mean if key[0] == last else mean / se
            for key, (mean, se) in advantage_errors(problem, out, turns, SIZE).items()}


def gradient_errors(problem, out, turns) -> list[tuple[float, float]]:
    """Per turn with a choice: the estimated dJ/dtheta_k and (estimate - exact) / its
    standard error, for the policy of one logit per turn."""
    return [(estimate, (estimate - exact) / se) for (estimate, se), exact
            in zip(gradient_estimates(problem, out, turns, SIZE), problem.gradient())]


def test_the_sampler_reproduces_the_known_values(problem_batch):
    problem, batch, meta, turns = problem_batch
    # Monte Carlo Q_k(a): the mean return from turn k of the episodes that took a there.
    _, q = problem.values()
    returns = batch["rewards"] + problem.cost * (turns - 1).float()   # gamma = 1
    for k in range(len(problem.q) - 1):
        for action, took in (("continue", turns > k + 1), ("stop", turns == k + 1)):
            later = returns[took] - problem.cost * k
            se = later.std() / took.sum() ** 0.5
            assert abs(float(later.mean()) - q[k][action]) < 4 * float(se)


def test_turn_rloo_matches_the_exact_advantages_and_gradient(problem_batch):
    problem, batch, meta, turns = problem_batch
    out = AdvantageModule(recipe("turn_rloo"))(batch, meta)
    errors = mean_advantage_errors(problem, out, turns)
    last = (len(problem.q) - 1, "stop")
    for key, z in errors.items():
        assert key == last or abs(z) < 4, (key, z)
    # At the forced last turn an episode alone in reaching it has baseline 0 (A = G):
    # an offset V_k * P(alone) of the mean advantage (here about 3e-4), which no gradient
    # sees (the turn has no choice, and the baseline never depends on the episode's own
    # actions). The leave-one-out sums of a cell are otherwise exactly 0.
    assert abs(errors[last]) < 2e-3
    for k, (_, z) in enumerate(gradient_errors(problem, out, turns)):
        assert abs(z) < 4, (k, z)


@pytest.mark.parametrize("std_normalize", [False, True])
def test_per_turn_index_normalization_is_biased(problem_batch, std_normalize):
    # The shortcut charges every further turn the mean reward of that turn index: here it
    # pushes the policy away from the tool calls that pay off (the gradient's sign flips).
    problem, batch, meta, turns = problem_batch
    out = AdvantageModule(estimator("turn_index_norm", std_normalize=std_normalize))(batch, meta)
    errors = mean_advantage_errors(problem, out, turns)
    assert all(abs(errors[(k, a)]) > 20 for k in (0, 1) for a in ("continue", "stop")), errors
    if not std_normalize:
        assert all(g > 0 for g in problem.gradient())   # calling the tool pays off
        for estimate, z in gradient_errors(problem, out, turns):
            assert estimate < 0 and abs(z) > 20


# ------------------------------------------------------------------ by hand

def tool_rows(rows, rewards, turn_rewards, turn_ids):
    return rows_batch(rows, rewards, turn_rewards=turn_rewards, turn_ids=turn_ids)


def test_turn_rloo_by_hand():
    # Three episodes of one prompt: p g e g (two turns), p g (one), p g e g (two).
    # Turn rewards -0.1 on first turns that call a tool; outcomes 1, 0, 0.
    # G: ep0 [0.9, 1], ep1 [0], ep2 [-0.1, 0].
    # turn 0 baselines (leave-one-out): ep0 (0 - 0.1)/2 = -0.05, ep1 (0.9 - 0.1)/2 = 0.4,
    # ep2 (0.9 + 0)/2 = 0.45; turn 1 (episodes 0 and 2): ep0 0, ep2 1.
    batch = tool_rows(["pgeg", "pg..", "pgeg"], [1.0, 0.0, 0.0],
                      [[0, -0.1, 0, 0], [0, 0, 0, 0], [0, -0.1, 0, 0]],
                      [[-1, 0, -1, 1], [-1, 0, -1, -1], [-1, 0, -1, 1]])
    out = AdvantageModule(recipe("turn_rloo"))(*concat_batch([batch]))
    adv = out["advantages"]
    assert adv[0, 0].item() == pytest.approx(0.95) and adv[0, 2].item() == pytest.approx(1.0)
    assert adv[1, 0].item() == pytest.approx(-0.4)
    assert adv[2, 0].item() == pytest.approx(-0.55) and adv[2, 2].item() == pytest.approx(-1.0)
    assert adv[0, 1].item() == 0.0   # the tool token (aligned position 1) is in no turn


def test_turn_index_norm_by_hand():
    # Same episodes: per-index means: turn 0: (-0.1 + 0 - 0.1)/3 = -0.0667 ; turn 1: (1 + 0)/2.
    # ep0: turn 1: 1 - .5 = .5; turn 0: (-0.1 + 0.0667) + .5 = 0.4667
    batch = tool_rows(["pgeg", "pg..", "pgeg"], [1.0, 0.0, 0.0],
                      [[0, -0.1, 0, 0], [0, 0, 0, 0], [0, -0.1, 0, 0]],
                      [[-1, 0, -1, 1], [-1, 0, -1, -1], [-1, 0, -1, 1]])
    out = AdvantageModule(estimator("turn_index_norm"))(*concat_batch([batch]))
    adv = out["advantages"]
    assert adv[0, 2].item() == pytest.approx(0.5)
    assert adv[0, 0].item() == pytest.approx(-0.1 + 0.2 / 3 + 0.5)
    assert adv[1, 0].item() == pytest.approx(0.2 / 3)


def test_turn_rewards_broadcast_or_at_the_turn_end_are_the_same_reward():
    ids = [[-1, 0, 0, -1, 1, 1]]
    at_end = rows_batch(["pggegg"], [1.0], turn_ids=ids, turn_rewards=[[0, 0, -0.5, 0, 0, 0.25]])
    broadcast = rows_batch(["pggegg"], [1.0], turn_ids=ids,
                           turn_rewards=[[0, -0.5, -0.5, 0, 0.25, 0.25]])
    config = ActorConfig(kl_ctl=0.0)
    one = AdvantageModule(config)(at_end)
    two = AdvantageModule(config)(broadcast)
    torch.testing.assert_close(one["advantages"], two["advantages"])
    torch.testing.assert_close(one["tot_rewards"], two["tot_rewards"])
    # each turn's reward once, at its last generated token (aligned: the position before it)
    assert one["tot_rewards"][0].tolist() == pytest.approx([0, -0.5, 0, 0, 1.25, 0])


def test_a_masked_span_inside_a_turn_does_not_split_it():
    # turn 0 = tokens 1, 2 and 4 (a tool token 3 inside it): its reward counts once
    ids = [[-1, 0, 0, -1, 0, 1]]
    batch = rows_batch(["pggegg"], [0.0], turn_ids=ids, turn_rewards=[[0, 0.5, 0.5, 0, 0.5, 2.0]])
    out = AdvantageModule(ActorConfig(kl_ctl=0.0))(batch)
    assert out["tot_rewards"][0].sum().item() == pytest.approx(2.5)
    folded = rows_batch(["pggegg"], [0.0], turn_ids=ids, token_rewards=[[0, 0.5, 0.5, 0, 0.5, 2.0]])
    out = AdvantageModule(ActorConfig(kl_ctl=0.0, token_rewards_as_adv=False))(folded)
    assert out["tot_rewards"][0].sum().item() == pytest.approx(2.5)


def test_turn_rewards_of_another_layout_are_refused():
    batch = rows_batch(["pggg"], [0.0], turn_ids=[[-1, 0, 0, 0]], turn_rewards=[[0, 0.5, 0.2, 1.0]])
    with pytest.raises(ValueError, match=r"rollout batch 'turn_rewards': a turn's reward goes on "
                                         r"every generated token of the turn, or on its last one "
                                         r"with 0 on the others; rows \[0\]"):
        AdvantageModule(ActorConfig(kl_ctl=0.0))(batch)


def test_turn_rewards_must_be_finite_and_float():
    batch = rows_batch(["pgg"], [0.0], turn_rewards=[[0, float("nan"), 0.0]])
    with pytest.raises(ValueError, match="rollout batch 'turn_rewards': expected finite values"):
        AdvantageModule(ActorConfig(kl_ctl=0.0))(batch)
    batch = rows_batch(["pgg"], [0.0], turn_rewards=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="rollout batch 'turn_rewards': expected a floating-point"):
        AdvantageModule(ActorConfig(kl_ctl=0.0))(batch)


def test_truncated_rows_lose_turn_rewards_under_mask_no_eos_with_zero():
    batch = rows_batch(["pggg"], [0.0], turn_rewards=[[0, 0, 0, 1.0]],
                       is_truncated=torch.tensor([True]))
    out = AdvantageModule(ActorConfig(kl_ctl=0.0, mask_no_eos_with_zero=True))(batch)
    assert out["tot_rewards"].abs().sum().item() == 0.0


def test_turn_estimators_need_prompt_groups():
    batch = rows_batch(["pgg"], [1.0])
    with pytest.raises(ValueError, match="estimator 'turn_rloo': needs the prompt groups of meta"):
        AdvantageModule(recipe("turn_rloo"))(batch)
