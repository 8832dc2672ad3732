"""This project's advantages inside TRL 1.16's GRPOTrainer (the released package, its
grpo_trainer.py pinned by hash), on a tiny local model on the CPU: training steps run end
to end; with trl_grpo_config() the advantages equal TRL's own on the same batch; with
process shaping they differ as docs/guides/trl.md says (additive per-token rewards)."""

import warnings

import pytest
import torch

from lightning_adv import PPOLoss
from tests.support.peers import TRL_GRPO_TRAINER, peer_module, require_extra

# the module subclasses TRL's trainer: without the trl extra it does not import (skip here)
require_extra("trl")
from lightning_adv.integrations.trl import AdvantageGRPOTrainer, trl_grpo_config  # noqa: E402

pytestmark = pytest.mark.peers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    peer_module(*TRL_GRPO_TRAINER)
    from lightning_adv.trainer.policies.hf.make_tiny import make_tiny

    path = tmp_path_factory.mktemp("tiny") / "model"
    make_tiny(path)
    return str(path)


def length_reward(completions, **kwargs):
    return [float(len(c)) / 10.0 for c in completions]


def a_reward(completions, **kwargs):
    return [float(c.count("a")) for c in completions]


def token_parity(prompts, completions, completion_ids, **kwargs):
    return [[0.1 if t % 2 else -0.1 for t in ids] for ids in completion_ids]


def make(tiny, tmp_path, recorded=None, **kwargs):
    from datasets import Dataset
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=6, max_steps=2,
                      learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True,
                      save_strategy="no", seed=0, temperature=1.0)
    data = Dataset.from_dict({"prompt": ["hello", "abc", "one two", "xyz"] * 2})
    trainer = AdvantageGRPOTrainer(model=tiny, reward_funcs=[length_reward, a_reward], args=args,
                                   train_dataset=data, **kwargs)
    if recorded is not None:
        original = trainer.compute_advantages

        def record(output):
            ours = original(output)
            recorded.append((output["advantages"].clone(), ours, output["completion_mask"]))
            return ours
        trainer.compute_advantages = record
    return trainer


def train(trainer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = trainer.train()
    return result


def test_grpo_with_trls_constants_equals_trls_advantages_and_trains(tiny, tmp_path):
    recorded = []
    trainer = make(tiny, tmp_path, recorded, advantage=trl_grpo_config())
    result = train(trainer)
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
    assert recorded
    for theirs, ours, mask in recorded:
        active = mask > 0
        assert theirs.dim() == 1 and ours.shape == mask.shape
        torch.testing.assert_close(ours[active], theirs[:, None].expand_as(ours)[active],
                                   rtol=1e-5, atol=1e-5)
        assert bool((theirs.abs() > 1e-3).any())  # not all-equal groups: a real comparison


def test_process_shaping_adds_per_token_rewards(tiny, tmp_path):
    """additive process shaping: TRL's advantage of the row plus the token's process reward."""
    recorded = []
    trainer = make(tiny, tmp_path, recorded, process_reward_funcs=[token_parity],
                   advantage=trl_grpo_config(advantage={
                       "estimator": {"implementation": "token_gae"},
                       "process_adv_shaping": {"implementation": "additive"}}))
    train(trainer)
    for theirs, ours, mask in recorded[:1]:
        active = mask > 0
        # the process rewards are +-0.1 per token: the difference is exactly that
        diff = (ours - theirs[:, None])[active]
        torch.testing.assert_close(diff.abs(), torch.full_like(diff, 0.1), rtol=1e-4, atol=1e-5)


def test_ppo_loss_and_another_recipe_train(tiny, tmp_path):
    trainer = make(tiny, tmp_path, advantage="rloo", ppo_loss=PPOLoss(clip_eps=0.2))
    result = train(trainer)
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
    logged = {k for entry in trainer.state.log_history for k in entry}
    assert "la/policy_loss" in logged and "la/advantage_mean" in logged


def test_a_trl_setting_that_cannot_be_mapped_is_named(tiny, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path / "o"), per_device_train_batch_size=4,
                      num_generations=4, report_to=[], use_cpu=True, scale_rewards="batch")
    with pytest.raises(ValueError, match=r"GRPOConfig.scale_rewards: 'batch' cannot be mapped"
                                         r".*grpo_batch_std"):
        AdvantageGRPOTrainer(model=tiny, reward_funcs=[length_reward], args=args,
                             train_dataset=Dataset.from_dict({"prompt": ["a"] * 4}))


def test_it_is_a_grpo_trainer_subclass_whose_subclasses_override(tiny, tmp_path):
    """A real subclass: issubclass/isinstance hold, and a user's override runs."""
    from trl import GRPOTrainer

    assert issubclass(AdvantageGRPOTrainer, GRPOTrainer)
    calls = []

    class Clipped(AdvantageGRPOTrainer):
        def compute_advantages(self, output):
            calls.append(output["completion_mask"].shape)
            return super().compute_advantages(output).clamp(-0.5, 0.5)

    from datasets import Dataset
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=6, max_steps=1,
                      report_to=[], use_cpu=True, save_strategy="no", seed=0)
    trainer = Clipped(model=tiny, reward_funcs=[length_reward, a_reward], args=args,
                      train_dataset=Dataset.from_dict({"prompt": ["hello", "abc"] * 4}))
    assert isinstance(trainer, AdvantageGRPOTrainer) and isinstance(trainer, GRPOTrainer)
    assert type(trainer).__mro__[1] is AdvantageGRPOTrainer
    train(trainer)
    assert calls  # the override ran on every generated batch


def test_importing_it_without_trl_names_the_extra(tmp_path):
    from tests.support.without_package import run_without

    code = ("import lightning_adv\n"
            "assert lightning_adv.PPOLoss.__name__ == 'PPOLoss'  # lazy exports still work\n"
            "from lightning_adv.integrations.trl_advantages import grpo_advantages\n"
            "try:\n"
            "    import lightning_adv.integrations.trl\n"
            "except ImportError as e:\n"
            "    print('ERR', e.name, e)\n")
    result = run_without(("trl",), code, tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ERR trl lightning_adv.integrations.trl needs TRL" in result.stdout
    assert "pip install 'lightning_adv[trl]'" in result.stdout
