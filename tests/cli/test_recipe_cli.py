"""Recipes through the real CLI: a recipe file under ``model.actor`` replaces the whole
actor section; ``model.actor.recipe: NAME`` fills the fields left at their defaults;
a critic-free recipe next to a value head warns."""

import dataclasses
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from lightning_adv.cli import TRAINER_DEFAULTS, LightningAdvCLI, main
from lightning_adv.recipes import RECIPES, recipe, recipe_fields
from lightning_adv.exceptions import RecipeOverrideWarning
from lightning_adv.trainer.ppo import PPOModule

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


def printed_actor(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)["model"]["actor"]


def built_model(*args: str) -> PPOModule:
    """Parse and instantiate as ``fit`` does, without training."""
    cli = LightningAdvCLI(PPOModule, trainer_defaults=TRAINER_DEFAULTS,
                          auto_configure_optimizers=False, run=False,
                          args=[*args, "--trainer.logger=false"])
    return cli.model


def plain(config) -> dict:
    fields = dataclasses.asdict(config)
    fields.pop("recipe")
    return fields


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_file_replaces_the_whole_actor_section(name, capsys):
    # ppo.yaml sets batch advantage whitening, lambda 0.95 and a KL penalty: none survives.
    actor = printed_actor(capsys, "--config", str(CONFIGS / "ppo.yaml"),
                          f"--model.actor={CONFIGS / 'advantage' / f'{name}.yaml'}")
    assert actor.pop("recipe") is None
    assert actor == recipe_fields(name)


def test_flags_after_a_recipe_file_override_single_fields(capsys):
    actor = printed_actor(capsys, "--config", str(CONFIGS / "ppo.yaml"),
                          f"--model.actor={CONFIGS / 'advantage' / 'rloo.yaml'}",
                          "--model.actor.kl_ctl=0.05")
    assert actor["kl_ctl"] == 0.05
    assert actor["reward_norm"] == recipe_fields("rloo")["reward_norm"]
    assert actor["adv_norm"] is None


def test_recipe_by_name_fills_the_fields_left_at_their_defaults(tmp_path):
    config = tmp_path / "rloo_by_name.yaml"
    config.write_text(yaml.safe_dump({
        "seed_everything": 1,
        "model": {"task": {"name": "addition"}, "policy": {"value_head": False},
                  "ppo": {"prompts_per_step": 4, "n_samples": 4, "minibatches": 2},
                  "actor": {"recipe": "rloo", "kl_ctl": 0.05}}}))
    with pytest.warns(RecipeOverrideWarning, match=r"kl_ctl=0\.05 \(recipe: 0\.0\)"):
        model = built_model("--config", str(config))
    assert model.actor_config.recipe == "rloo"
    assert plain(model.actor_config) == plain(recipe("rloo", kl_ctl=0.05))
    # The checkpoint's hyper-parameters rebuild the same config.
    assert PPOModule(**model.hparams).actor_config == model.actor_config


def test_recipe_by_name_from_the_command_line_keeps_explicit_stages(tmp_path):
    model = built_model("--config", str(CONFIGS / "grpo.yaml"), "--model.actor.recipe=gpg")
    # grpo.yaml sets reward_norm and the token_gae estimator; gpg's outcome stage is filled in.
    assert model.actor_config.advantage.outcome_reward_shaping.implementation == "gpg"
    assert model.actor_config.reward_clip == recipe("gpg").reward_clip


def test_unknown_recipe_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "grpo.yaml"), "--model.actor.recipe=grpo2",
              "--trainer.logger=false"])
    assert exit_info.value.code == 2
    assert "model.actor.recipe: expected one of 'grpo'" in capsys.readouterr().err


def test_ppo_config_with_a_critic_free_recipe_warns_about_the_value_head():
    with pytest.warns(UserWarning, match="policy.value_head: true, but actor.reward_norm "
                                         "subtracts a group-mean baseline"), \
            pytest.warns(RecipeOverrideWarning, match="adv_norm"):
        built_model("--config", str(CONFIGS / "ppo.yaml"), "--model.actor.recipe=grpo")


def test_shipped_critic_configs_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecipeOverrideWarning)
        warnings.filterwarnings("error", message="policy.value_head")
        built_model("--config", str(CONFIGS / "ppo.yaml"))
        built_model("--config", str(CONFIGS / "grpo.yaml"))


def test_two_training_steps_with_a_recipe_file(tmp_path):
    main(["fit", "--config", str(CONFIGS / "grpo.yaml"),
          f"--model.actor={CONFIGS / 'advantage' / 'dr_grpo.yaml'}",
          f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.limit_train_batches=2",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
          "--model.ppo.prompts_per_step=4", "--model.ppo.n_samples=4",
          "--model.ppo.minibatches=2", "--model.ppo.epochs=1"])
    saved = yaml.safe_load((tmp_path / "grpo" / "version_0" / "config.yaml").read_text())
    actor = saved["model"]["actor"]
    actor.pop("recipe")
    assert actor == recipe_fields("dr_grpo")
