"""grpo_advantages (what AdvantageGRPOTrainer puts in TRL's batch; importable without TRL): logical rollouts by
rollout_id, reward columns with TRL's weights, and the errors naming what is wrong."""

import pytest
import torch

from lightning_adv import AdvantageModule, RolloutGroup
from lightning_adv.integrations.trl_advantages import (
    grpo_advantages, map_trl_args, rollout_groups_of, trl_grpo_config)

MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.float32)


def test_rows_of_one_episode_count_once_in_the_group_statistics():
    """Episode a spans rows 0-1 (reward 1), b row 2 (0), c row 3 (0.5): the group's mean
    and unbiased std are over three episodes: 0.5 and 0.5."""
    module = AdvantageModule(trl_grpo_config())
    rewards = torch.tensor([[1.0], [1.0], [0.0], [0.5]])
    adv = grpo_advantages(module, rewards, MASK, 4, rollout_ids=["a", "a", "b", "c"])
    per_row = 0.5 / (0.5 + 1e-4)
    expected = torch.tensor([per_row, per_row, -per_row, 0.0])[:, None] * MASK
    torch.testing.assert_close(adv, expected)
    plain = grpo_advantages(module, rewards, MASK, 4)  # four members: mean 0.625
    assert float(plain[3, 0]) == pytest.approx((0.5 - 0.625) / (0.4787136 + 1e-4), rel=1e-5)


def test_rollout_ids_must_be_contiguous_and_complete():
    assert rollout_groups_of([None] * 4, [4]) is None
    assert rollout_groups_of(["a", "a", "b", "c"], [2, 2]) == [RolloutGroup((2,)),
                                                                  RolloutGroup((1, 1))]
    with pytest.raises(ValueError, match=r"episode 'a' are not contiguous"):
        rollout_groups_of(["a", "b", "a", "c"], [4])
    with pytest.raises(ValueError, match=r"row 1 has none"):
        rollout_groups_of(["a", None, "b", "c"], [4])


def test_reward_columns_are_weighted_as_trls_reward_weights():
    class Args:
        scale_rewards = "group"
        multi_objective_aggregation = "sum_then_normalize"

    config = map_trl_args(trl_grpo_config(), Args(), torch.tensor([2.0, 0.5]))
    assert config.reward_weights == [2.0, 0.5]
    columns = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 2.0], [0.0, 0.0]])
    ours = grpo_advantages(AdvantageModule(config), columns, MASK, 4)
    summed = columns @ torch.tensor([2.0, 0.5])
    expected = (summed - summed.mean()) / (summed.std() + 1e-4)
    torch.testing.assert_close(ours[:, 0], expected)


def test_bad_shapes_are_named():
    module = AdvantageModule(trl_grpo_config())
    with pytest.raises(ValueError, match=r"num_generations: expected a positive divisor"):
        grpo_advantages(module, torch.zeros(4, 1), MASK, 3)
    with pytest.raises(ValueError, match=r"rewards_per_func: expected a \[4, K\] tensor"):
        grpo_advantages(module, torch.zeros(4), MASK, 2)


def test_what_the_trainer_cannot_do_is_refused_when_it_is_built():
    from lightning_adv import PPOLoss
    from lightning_adv.integrations.trl_advantages import check_trl_setup

    class Args:
        beta = 0.0

    with pytest.raises(NotImplementedError, match=r"more than one process \(accelerate num_processes 2\)"):
        check_trl_setup(2, Args(), None)
    with pytest.raises(ValueError, match=r"GRPOConfig.beta: 0 with ppo_loss kl_coef 0.1"):
        check_trl_setup(1, Args(), PPOLoss(kl_coef=0.1))
    check_trl_setup(1, Args(), PPOLoss())
    Args.beta = 0.04
    with pytest.raises(ValueError, match=r"GRPOConfig.beta: 0.04 with ppo_loss kl_coef 0"):
        check_trl_setup(1, Args(), PPOLoss())
    check_trl_setup(1, Args(), PPOLoss(kl_coef=0.04))
