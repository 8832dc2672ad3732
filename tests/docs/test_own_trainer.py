"""examples/own_trainer.py: a user's LightningModule with AdvantageModule, PPOLoss and
AdvantageMetrics trains with lightning.Trainer and logs the metrics to TensorBoard."""

import math

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from examples.own_trainer import ANSWER_LEN, ExactAnswerBonus, OwnTrainer, main
from lightning_adv import ActorConfig

EXPECTED_TAGS = {
    "train/task_reward", "train/total_rewards", "train/kl_rewards", "train/advantages_mean",
    "train/advantages_std", "train/advantages_min", "train/advantages_max", "train/returns_mean",
    "train/zero_adv_group_frac", "train/policy_loss", "train/entropy", "train/approx_kl",
    "train/clipfrac"}


def test_it_trains_and_logs_the_metrics(tmp_path):
    model = main(max_steps=160, root=str(tmp_path))
    assert isinstance(model, OwnTrainer)
    events = EventAccumulator(str(tmp_path / "own_trainer" / "version_0"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert EXPECTED_TAGS <= tags, EXPECTED_TAGS - tags
    for tag in EXPECTED_TAGS:
        values = [e.value for e in events.Scalars(tag)]
        assert len(values) == 80 and all(math.isfinite(v) for v in values), tag
    reward = [e.value for e in events.Scalars("train/task_reward")]
    # 1/8 of the tokens are right by chance; the policy learns the task
    assert sum(reward[:10]) / 10 < 0.3 and sum(reward[-10:]) / 10 > 0.8
    clipfrac = [e.value for e in events.Scalars("train/clipfrac")]
    assert max(clipfrac) > 0  # the second PPO epoch is off-policy
    assert all(0 <= e.value <= 1 for e in events.Scalars("train/zero_adv_group_frac"))


def test_the_subclass_overrides_outcome_shaping():
    ids = torch.ones(2, ANSWER_LEN + 1, dtype=torch.long)
    generated = torch.ones_like(ids)
    generated[:, 0] = 0
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": generated,
             "logprobs": -0.5 * generated.float(), "rewards": torch.tensor([1.0, 0.5]),
             "is_truncated": torch.zeros(2, dtype=torch.bool)}
    out = ExactAnswerBonus(ActorConfig(kl_ctl=0.0))(batch)
    # the outcome reward sits at the last generated token's aligned position
    assert out["tot_rewards"][:, ANSWER_LEN - 1].tolist() == [1.5, 0.5]
