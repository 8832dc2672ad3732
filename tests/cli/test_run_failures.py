"""A run that goes wrong says where, once, and loses nothing that was saved (issue 32):
a non-finite training step stops the run naming the step and the term, before anything
of it is applied or saved."""

import pytest
import torch

from tests.support.cli_runs import failed_fit
from tests.support.nonfinite import BAD_FROM

HELPERS = "tests.support.nonfinite"
EVERY_STEP = ("--trainer.limit_train_batches=4", "--trainer.callbacks.every_n_train_steps=1")


def saved_steps(folder):
    return {p.name: torch.load(p, weights_only=True)["lightning_adv"]["rollout_step"]
            for p in sorted(folder.glob("*.ckpt"))}


@pytest.mark.parametrize("config", ["ppo", "grpo"])
def test_nan_advantages_of_an_advantage_module_stop_the_run_naming_it_and_the_step(
        config, tmp_path, capsys):
    module = f"{HELPERS}.LateNaNAdvantageModule"
    code, err = failed_fit(config, tmp_path, (*EVERY_STEP, f"--model.advantage_module={module}"),
                           capsys)
    assert code == 1 and "Traceback" not in err and "histogram" not in err, err
    assert err.strip().splitlines() == [err.strip()], err
    assert err.startswith(f"error: training step {BAD_FROM}: advantage_module '{module}' "
                          f"returned advantages that are not finite"), err
    assert "expected finite values wherever loss_mask > 0" in err
    folder = tmp_path / config / "version_0" / "checkpoints"
    assert f"the last checkpoint, {folder / 'last.ckpt'}, holds the last good step" in err, err
    assert saved_steps(folder) == {"epoch=0-step=1.ckpt": 1, "epoch=0-step=2.ckpt": 2,
                                   "last.ckpt": BAD_FROM}


def test_a_non_finite_loss_stops_the_run_naming_the_step_and_the_term(tmp_path, capsys):
    module = f"{HELPERS}.LateOverflowAdvantageModule"
    code, err = failed_fit("ppo", tmp_path, (*EVERY_STEP, f"--model.advantage_module={module}"),
                           capsys)
    assert code == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: training step {BAD_FROM} (PPO epoch 0, minibatch 0): the "
                          f"loss is "), err
    assert "expected a finite value; not finite: value_loss=inf;" in err, err
    assert "policy_loss=" in err.split("; finite: ")[-1], "the finite terms are named too"
    assert "no checkpoint of this step was written" in err
    folder = tmp_path / "ppo" / "version_0" / "checkpoints"
    assert saved_steps(folder)["last.ckpt"] == BAD_FROM, "last.ckpt is the last good step"
    assert max(saved_steps(folder).values()) == BAD_FROM


def test_a_run_failing_at_step_0_leaves_no_empty_run_directory(tmp_path, capsys):
    (tmp_path / "ppo" / "version_0").mkdir(parents=True)
    (tmp_path / "ppo" / "version_0" / "notes.txt").write_text("mine")
    code, err = failed_fit("ppo", tmp_path, "--model.task.reward=tests.support.trainer_helpers.nan_reward",
                           capsys)
    assert code == 1 and err.startswith("error: task.reward"), err
    # version_1 (config.yaml, hparams.yaml, an events file without a step) is removed;
    # the directory that was there before is not.
    assert sorted(p.name for p in (tmp_path / "ppo").iterdir()) == ["version_0"]
    assert (tmp_path / "ppo" / "version_0" / "notes.txt").read_text() == "mine"


def test_a_run_failing_later_keeps_its_directory(tmp_path, capsys):
    module = f"{HELPERS}.LateNaNAdvantageModule"
    failed_fit("grpo", tmp_path, ("--trainer.limit_train_batches=4",
                                  f"--model.advantage_module={module}"), capsys)
    run = tmp_path / "grpo" / "version_0"
    assert (run / "config.yaml").is_file(), "steps 0-1 were logged: the run is kept"


@pytest.mark.parametrize("text, says", [
    ("model:\n  ppo:\n    # lr: 0.001\n", "error: model.ppo: expected a mapping of settings, got "
                                          "null in {path} (a section whose keys are all commented out?)"),
    ("model:\n  ppo: {lr: [1\n", "error: --config: '{path}' is not valid YAML: expected ',' or ']'"),
])
def test_an_override_file_that_would_undo_a_section_or_is_not_yaml_names_the_file(
        text, says, tmp_path, capsys):
    path = tmp_path / "override.yaml"
    path.write_text(text)
    code, err = failed_fit("ppo", tmp_path, ("--config", str(path)), capsys)
    assert code == 2 and err.startswith(says.format(path=path)), err
    assert not (tmp_path / "ppo").exists()


def test_a_strategy_lightning_refuses_is_a_trainer_usage_error(tmp_path, capsys):
    code, err = failed_fit("ppo", tmp_path, "--trainer.strategy=not_a_strategy", capsys)
    assert code == 2 and err.startswith("error: trainer: You selected an invalid strategy"), err
