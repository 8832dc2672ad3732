"""The integration examples run (a couple of steps each) and do what they say."""

import math
import warnings

import pytest
import torch


@pytest.mark.peers
def test_verl_example_computes_verls_numbers():
    from tests.support.peers import VERL_CORE_ALGOS, peer_module

    peer_module(*VERL_CORE_ALGOS)
    from examples.verl_estimators import main

    results = main()
    torch.testing.assert_close(results["la_rloo"], results["rloo"])


@pytest.mark.peers
def test_trl_example_trains_with_process_rewards_and_ppo_loss(tmp_path):
    from tests.support.peers import TRL_GRPO_TRAINER, peer_module

    peer_module(*TRL_GRPO_TRAINER)
    from examples.trl_grpo import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = main(max_steps=2, output_dir=str(tmp_path / "out"))
    assert trainer.state.global_step == 2
    logged = [entry for entry in trainer.state.log_history if "la/policy_loss" in entry]
    assert len(logged) == 2 and all(math.isfinite(e["la/policy_loss"]) for e in logged)


def test_lightning_hf_example_trains_without_this_projects_trainer(tmp_path):
    from examples.lightning_hf_grpo import HFGRPOModule, main
    from lightning_adv.trainer.policies.hf.make_tiny import make_tiny

    make_tiny(tmp_path / "tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = main(str(tmp_path / "tiny"), max_steps=4)
    assert trainer.global_step == 4 and isinstance(trainer.lightning_module, HFGRPOModule)
    metrics = trainer.callback_metrics
    for key in ("train/reward", "train/policy_loss", "train/clipfrac", "train/entropy"):
        assert math.isfinite(float(metrics[key])), key
    # the second PPO epoch of each rollout is off-policy: its ratio moved
    assert float(metrics["train/approx_kl"]) != 0.0


def test_the_lightning_example_lays_rollouts_out_as_the_pipeline_reads_them(tmp_path):
    from examples.lightning_hf_grpo import HFGRPOModule
    from lightning_adv.trainer.policies.hf.make_tiny import make_tiny

    make_tiny(tmp_path / "tiny")
    module = HFGRPOModule(str(tmp_path / "tiny"), num_generations=3)
    torch.manual_seed(0)
    batch, meta, completions = module.rollout(["hello", "abc"])
    assert meta.traj_group_sizes == [3, 3] and len(completions) == 6
    prompt_len = module.tokenizer("hello", return_tensors="pt").input_ids.shape[1]
    assert not batch["loss_mask"][:3, :prompt_len].any() and batch["loss_mask"][:3, prompt_len].all()
    # attended tokens form a prefix; the loss mask lies inside it
    assert bool((batch["attention_mask"].cummin(1).values == batch["attention_mask"]).all())
    assert bool((batch["loss_mask"] <= batch["attention_mask"]).all())
    out = module.advantage(batch, meta)
    assert out["advantages"].shape == batch["input_ids"].shape
