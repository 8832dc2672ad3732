"""The trainer's scalars reach Lightning on the steps its loggers write
(``Trainer(log_every_n_steps=...)``), the task reward every step: what TensorBoard gets is
the same as when every step logs, and ``callback_metrics`` holds the last logging step's."""

import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_adv.trainer import PPOConfig, PPOModule, PolicyConfig, TaskConfig
from tests.support.cli_runs import scalars

STEPS = 5


def fit(tmp_path, every):
    torch.manual_seed(0)
    module = PPOModule(task=TaskConfig(name="reverse"), seed=0,
                       ppo=PPOConfig(prompts_per_step=4, n_samples=4, minibatches=2),
                       policy=PolicyConfig(d_model=16, n_layers=1, n_heads=2))
    seen = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            seen.append({k: float(v) for k, v in trainer.callback_metrics.items()})

    logger = TensorBoardLogger(tmp_path / f"every{every}", name="", version="")
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=STEPS, logger=logger,
                         log_every_n_steps=every, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Record()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    return seen, scalars(tmp_path / f"every{every}"), module.reward_history


def test_scalars_reach_the_logger_on_its_steps_with_the_values_of_every_step_logging(tmp_path):
    every_step, written_all, rewards_all = fit(tmp_path, 1)
    every_two, written_two, rewards_two = fit(tmp_path, 2)
    assert rewards_two == rewards_all and len(rewards_all) == STEPS  # the same run
    loss_keys = [k for k in written_all if k.startswith("train/") and k != "train/task_reward"]
    assert {"train/policy_loss", "train/advantages_mean", "train/kl_coef"} <= set(loss_keys)
    for key in [*loss_keys, "train/task_reward"]:
        assert sorted(written_all[key]) == list(range(STEPS)), key
        # Lightning writes steps 1 and 3 (the 2nd and 4th): the same values as above
        assert written_two[key] == {s: written_all[key][s] for s in (1, 3)}, key
    assert written_two["histograms"]["train/advantages"] == [1, 3]
    # between logging steps the monitors see the last logging step's values
    assert "train/policy_loss" not in every_two[0] and "train/task_reward" in every_two[0]
    assert every_two[2]["train/policy_loss"] == every_step[1]["train/policy_loss"]
    assert every_two[2]["train/task_reward"] == every_step[2]["train/task_reward"]
