"""The built-in trainer's loss options (PPOLoss under ``model.ppo``) and its KL controller
(``model.kl_controller``), run through a real Trainer."""

import warnings

import lightning.pytorch as pl
import pytest
import torch

from lightning_adv import ActorConfig, AdaptiveKLController, FixedKLController, NormConfig
from lightning_adv.trainer import PPOConfig, PPOModule, PolicyConfig, TaskConfig
from lightning_adv.trainer.setup import validate_model_config

SMALL = dict(prompts_per_step=4, n_samples=4, minibatches=2, epochs=1)


def make(cls=PPOModule, **overrides):
    kwargs = {"task": TaskConfig(name="reverse"), "ppo": PPOConfig(**SMALL), "seed": 0,
              "policy": PolicyConfig(d_model=16, n_layers=1, n_heads=2)}
    kwargs.update(overrides)
    return cls(**kwargs)


def fit(module, tmp_path, steps=2):
    logged = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            logged.append({k: float(v) for k, v in trainer.callback_metrics.items()})

    trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps, logger=False,
                         log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[Record()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    return trainer, logged


class RecordingKL(PPOModule):
    """Keeps each step's advantage output, as fed to the KL controller."""

    def _update_kl_controller(self, out):
        self.outputs = getattr(self, "outputs", []) + [out]
        super()._update_kl_controller(out)


def test_adaptive_kl_controller_drives_the_reward_penalty_and_is_checkpointed(tmp_path):
    module = make(RecordingKL, actor=ActorConfig(kl_ctl=0.1), ppo=PPOConfig(**SMALL, lr=0.05),
                  kl_controller={"type": "adaptive", "target": 0.05, "horizon": 10.0})
    assert isinstance(module.kl_controller, AdaptiveKLController)
    trainer, logged = fit(module, tmp_path, steps=3)
    coefs = [step["train/kl_coef"] for step in logged]
    # Ziegler et al.: coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon, with
    # kl the mean over the 16 episodes of each one's summed log-ratio to the reference.
    expected = 0.1
    for step, out in enumerate(module.outputs):
        assert coefs[step] == pytest.approx(expected, rel=1e-6)
        # the reward-side KL penalty used this step's coefficient
        d = (out["logprobs"] - out["ref_logp"]) * out["loss_mask"]
        assert torch.allclose(out["kl_rewards"], -expected * d.clamp(-10, 10), atol=1e-6)
        kl = float(d.sum(1).mean())
        expected *= 1 + min(max(kl / 0.05 - 1, -0.2), 0.2) * 16 / 10.0
    assert float(module.outputs[0]["kl_rewards"].abs().sum()) == 0  # step 0 samples the reference
    assert module.kl_controller.value == pytest.approx(expected, rel=1e-6)
    assert len(set(round(c, 6) for c in coefs)) == 3
    path = tmp_path / "c.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["state_dict"]
    restored = make(actor=ActorConfig(kl_ctl=0.1),
                    kl_controller={"type": "adaptive", "target": 0.05, "horizon": 10.0})
    restored.load_state_dict(state)
    assert restored.kl_controller.value == pytest.approx(module.kl_controller.value)


def test_fixed_controller_keeps_kl_ctl():
    module = make(actor=ActorConfig(kl_ctl=0.05))
    assert isinstance(module.kl_controller, FixedKLController)
    assert module.kl_controller.value == pytest.approx(0.05)


def test_kl_loss_term_loads_a_reference_and_is_logged(tmp_path):
    module = make(actor=ActorConfig(kl_ctl=0.0, reward_norm=NormConfig(
        mean_level="group", std_level="group")), policy=PolicyConfig(
        d_model=16, n_layers=1, n_heads=2, value_head=False),
        ppo=PPOConfig(**SMALL, kl_loss_coef=0.04, kl_loss_estimator="k3"))
    assert module.ref_policy is not None and module.loss_fn.kl_estimator == "k3"
    _, logged = fit(module, tmp_path, steps=2)
    assert all("train/kl_loss" in step for step in logged)
    # the policy moved away from the frozen reference during the first step's update
    assert logged[-1]["train/kl_loss"] > 0


def test_dr_grpo_aggregation_defaults_to_the_episode_budget():
    module = make(ppo=PPOConfig(**SMALL, loss_agg_mode="seq-mean-token-sum-norm"))
    budget = module.max_new_tokens * module.runtime.task.max_turns
    assert module.loss_fn.loss_scale_factor == float(budget)
    explicit = make(ppo=PPOConfig(**SMALL, loss_agg_mode="seq-mean-token-sum-norm",
                                  loss_scale_factor=64.0))
    assert explicit.loss_fn.loss_scale_factor == 64.0


@pytest.mark.parametrize("kwargs, key", [
    ({"loss_agg_mode": "seq-sum"}, "ppo.loss_agg_mode"),
    ({"dual_clip": 1.0}, "ppo.dual_clip"),
    ({"dual_clip": 0.5}, "ppo.dual_clip"),
    ({"clip_eps_high": -0.1}, "ppo.clip_eps_high"),
    ({"kl_loss_coef": -1.0}, "ppo.kl_loss_coef"),
    ({"kl_loss_estimator": "k4"}, "ppo.kl_loss_estimator"),
    ({"ratio_level": "episode"}, "ppo.ratio_level"),
])
def test_bad_loss_options_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        PPOConfig(**kwargs)


def test_adaptive_controller_needs_a_positive_kl_ctl():
    with pytest.raises(ValueError, match="kl_controller.type"):
        validate_model_config({"actor": {"kl_ctl": 0.0},
                               "kl_controller": {"type": "adaptive", "target": 0.1, "horizon": 100}})


def test_dr_grpo_config_is_the_recipe_with_its_loss():
    from pathlib import Path

    import yaml

    from lightning_adv.recipes import recipe

    shipped = yaml.safe_load((Path(__file__).parents[2] / "configs" / "dr_grpo.yaml").read_text())
    assert ActorConfig(**shipped["model"]["actor"]) == recipe("dr_grpo")
    assert shipped["model"]["ppo"]["loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert shipped["model"]["policy"]["value_head"] is False


def test_rlhf_reward_adds_kl_and_process_rewards_to_the_task_reward():
    from lightning_adv.trainer.logs.metrics import rlhf_rewards

    out = {"kl_rewards": torch.tensor([[0.0, -0.1, -0.2, 0.0], [0.0, 0.05, 0.0, 0.0]]),
           "token_rewards": torch.tensor([[0.0, 0.5, 1.0, 9.0], [7.0, 0.25, 0.0, 0.0]]),
           "input_token_loss_mask": torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]])}
    got = rlhf_rewards(torch.tensor([1.0, 0.0]), out)
    assert torch.allclose(got, torch.tensor([1.0 - 0.3 + 1.5, 0.05 + 0.25]))
    del out["token_rewards"]
    assert torch.allclose(rlhf_rewards(torch.tensor([1.0, 0.0]), out), torch.tensor([0.7, 0.05]))
