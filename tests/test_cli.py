"""The CLI users run: ``python -m lightning_adv fit --config configs/<name>.yaml``.

Every shipped config runs 2 small training steps through the CLI (in process, to keep
CI short); the TensorBoard event files, the saved config, ``--print_config``, usage
errors (exit 2, naming the key) and exact resume from a checkpoint are checked.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_adv.cli import main

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
SHIPPED = ["ppo", "grpo", "dr_grpo", "turn_gae", "gvpo_prm", "grpo_dynamic"]
SMALL = ["--trainer.limit_train_batches=2", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--model.ppo.prompts_per_step=4",
         "--model.ppo.n_samples=4", "--model.ppo.minibatches=2", "--model.ppo.epochs=1"]


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    # LightningCLI warns when args= is given while sys.argv holds pytest's own arguments.
    monkeypatch.setattr(sys, "argv", ["lightning_adv"])


def fit(config: str, save_dir: Path, *extra: str) -> None:
    main(["fit", "--config", str(CONFIGS / f"{config}.yaml"),
          f"--trainer.logger.init_args.save_dir={save_dir}", *SMALL, *extra])


def failed_fit(config: str, save_dir: Path, override: str, capsys) -> tuple[int, str]:
    """Run a fit that must stop with SystemExit; its exit code and stderr."""
    with pytest.raises(SystemExit) as exit_info:
        fit(config, save_dir, override)
    return exit_info.value.code, capsys.readouterr().err


def scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    out = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    out["histograms"] = {tag: [e.step for e in events.Histograms(tag)]
                         for tag in events.Tags()["histograms"]}
    return out


@pytest.mark.parametrize("config", SHIPPED)
def test_every_shipped_config_fits_two_steps(config, tmp_path):
    shipped = yaml.safe_load((CONFIGS / f"{config}.yaml").read_text())
    assert isinstance(shipped["seed_everything"], int) and not isinstance(
        shipped["seed_everything"], bool), "configs carry an explicit integer seed"
    fit(config, tmp_path)
    log_dir = tmp_path / config / "version_0"
    logged = scalars(log_dir)
    for tag in ("train/total_rewards", "train/kl_rewards", "train/task_reward",
                "train/advantages_mean", "train/advantages_std", "train/approx_kl",
                "train/clipfrac", "train/entropy", "train/policy_loss", "train/response_length"):
        assert sorted(logged[tag]) == [0, 1], tag
    critic = shipped["model"]["policy"]["value_head"]
    assert ("train/value_loss" in logged) == critic
    assert ("train/explained_variance" in logged) == critic
    assert logged["histograms"]["train/advantages"] == [0, 1]
    assert (log_dir / "config.yaml").is_file()


def test_saved_config_reruns(tmp_path):
    fit("ppo", tmp_path)
    saved = tmp_path / "ppo" / "version_0" / "config.yaml"
    main(["fit", "--config", str(saved)])
    assert sorted(scalars(tmp_path / "ppo" / "version_1")["train/task_reward"]) == [0, 1]


def test_print_config(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "turn_gae.yaml"), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["actor"]["advantage"]["estimator"]["implementation"] == "turn_gae"
    assert printed["model"]["task"]["name"] == "guess"
    assert printed["seed_everything"] == 11


@pytest.mark.parametrize("override, key", [
    ("--model.actor.advantage.estimator.implementation=token_gea", "estimator"),
    ("--model.actor.advantage.process_adv_shaping={implementation: gvpo, kwargs: {negative: 1}}",
     "process_adv_shaping"),
    ("--model.actor.advantage.outcome_reward_shaping={implementation: no_such_pkg.mod.fn}",
     "model.actor.advantage.outcome_reward_shaping"),
    ("--model.actor.kl_estimator=k9", "model.actor.kl_estimator"),
    ("--model.task.name=no_such_task", "model.task.name"),
    ("--model.task.kwargs={alphabet: abc, colour: red}", "model.task.kwargs"),
    ("--model.task.reward=no_such_pkg.rewards.fn", "model.task.reward"),
    ("--model.ppo.n_samples=0", "model.ppo.n_samples"),
    ("--model.ppo.max_new_tokens=0", "model.ppo.max_new_tokens"),
    ("--model.policy.max_seq_len=4", "model.policy.max_seq_len"),
    ("--model.advantage_module=lightning_adv.ActorConfig", "model.advantage_module"),
    ("--model.prm.scorers=[{path: lightning_adv.trainer.tasks.position_match, kwargs: {x: 1}}]",
     "model.prm.scorers[0].path"),
    ("--model.actor={overlong_reward_penalty: true, overlong_tokens: 2, overlong_penalty_factor: 1.0}",
     "model.actor.max_new_tokens"),
    ("--model.actor={gae_lambda: lightning_adv.vapo_length_adaptive_gae, gae_lambda_kwargs: {alpha: -1}}",
     "model.actor.gae_lambda"),
    ("--model.actor.adv_norm.eps=0", "model.actor.adv_norm.eps"),
])
def test_bad_config_is_a_usage_error_naming_the_key(override, key, capsys, tmp_path):
    code, err = failed_fit("ppo", tmp_path, override, capsys)
    assert code == 2
    assert key in err, err
    assert not (tmp_path / "ppo").exists(), "nothing may be built before validation"


def test_process_mode_is_checked_against_the_actor_at_parse_time(capsys, tmp_path):
    code, err = failed_fit("gvpo_prm", tmp_path, "--model.actor.token_rewards_as_adv=false", capsys)
    assert code == 2
    assert "model.prm.advantage_shaping.mode" in err and "token_rewards_as_adv" in err, err


def test_bad_stage_name_exits_2_from_the_command_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lightning_adv", "fit", "--config", str(CONFIGS / "ppo.yaml"),
         f"--trainer.logger.init_args.save_dir={tmp_path}",
         "--model.actor.advantage.estimator.implementation=token_gea"],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert "model.actor.advantage" in result.stderr and "token_gea" in result.stderr


@pytest.mark.parametrize("override, message", [
    ("--model.task.reward=trainer_helpers.nan_reward", "must be finite, got nan"),
    ("--model.task.reward=trainer_helpers.string_reward", "must be a float, got str"),
    ("--model.task.reward=trainer_helpers.bool_reward", "convert booleans with float()"),
    ("--model.task.name=trainer_helpers.EmptyPromptTask", "expected a non-empty string"),
])
def test_bad_task_function_output_is_a_clear_error(override, message, capsys, tmp_path):
    code, err = failed_fit("ppo", tmp_path, override, capsys)
    assert code == 1
    assert message in err and ("task.reward" in err or "task.name" in err), err


def test_resume_reproduces_the_next_steps_exactly(tmp_path):
    # 4 steps, a checkpoint every 2 (each step is 2 optimizer steps with these overrides);
    # the override applies to the config's ModelCheckpoint.
    fit("turn_gae", tmp_path, "--trainer.limit_train_batches=4",
        "--trainer.callbacks.every_n_train_steps=4")
    first = tmp_path / "turn_gae" / "version_0"
    ckpt = first / "checkpoints" / "epoch=0-step=4.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in (first / "checkpoints").iterdir())
    fit("turn_gae", tmp_path, "--trainer.limit_train_batches=4",
        "--trainer.callbacks.every_n_train_steps=4", f"--ckpt_path={ckpt}")
    full, resumed = scalars(first), scalars(tmp_path / "turn_gae" / "version_1")
    assert sorted(resumed["train/task_reward"]) == [2, 3]
    for tag, values in resumed.items():
        if tag.startswith("train/"):
            for step, value in values.items():
                assert value == full[tag][step], (tag, step)
