"""Nothing a user ran is lost or silently ignored (issue 27): resuming never replaces a
run's files, a finished run says so, evaluations write inside the run they evaluate,
checkpoints speak one unit, and a command that would do nothing, or that fails during
training, says so in one ``error:`` line."""

import hashlib
from pathlib import Path

import pytest
import torch
import yaml

from lightning_adv.cli import main
from lightning_adv.trainer.run.resume import load_checkpoint_info, nothing_left_to_train, steps_left
from tests.support.cli_runs import CONFIGS, failed_fit, fit, scalars


def file_digests(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha256 of its bytes)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_resume_with_a_changed_lr_from_a_middle_checkpoint_leaves_the_run_untouched(tmp_path, capsys):
    fit("ppo", tmp_path, "--trainer.limit_train_batches=4", "--trainer.callbacks.every_n_train_steps=1")
    run = tmp_path / "ppo" / "version_0"
    before, logged = file_digests(run), scalars(run)
    assert sorted(logged["train/task_reward"]) == [0, 1, 2, 3] and "val/reward_greedy" in logged
    ckpt = run / "checkpoints" / "epoch=0-step=2.ckpt"
    capsys.readouterr()
    fit("ppo", tmp_path, "--trainer.limit_train_batches=4", "--trainer.callbacks.every_n_train_steps=1",
        f"--ckpt_path={ckpt}", "--model.ppo.lr=0.0002")
    err = capsys.readouterr().err
    assert f"note: {run} is left as it is" in err and "--overwrite_run" in err, err
    assert file_digests(run) == before, "checkpoints, TensorBoard events and config unchanged"
    assert scalars(run) == logged, "every TensorBoard scalar of the original run is still there"
    branch = tmp_path / "ppo" / "version_1"
    assert sorted(scalars(branch)["train/task_reward"]) == [2, 3]
    text = (branch / "config.yaml").read_text()
    assert f"# parent run: {run}" in text and str(ckpt) in text.splitlines()[0], text[:400]
    assert "model.ppo.lr (0.0005 in the checkpoint, 0.0002 now)" in text
    config = yaml.safe_load(text)
    assert config["ckpt_path"] == str(ckpt) and config["model"]["ppo"]["lr"] == 0.0002


def test_resuming_with_the_same_settings_when_later_checkpoints_exist_starts_a_new_run(tmp_path):
    fit("ppo", tmp_path, "--trainer.limit_train_batches=3", "--trainer.callbacks.every_n_train_steps=1")
    run = tmp_path / "ppo" / "version_0"
    before = file_digests(run)
    fit("ppo", tmp_path, "--trainer.limit_train_batches=3", "--trainer.callbacks.every_n_train_steps=1",
        f"--ckpt_path={run / 'checkpoints' / 'epoch=0-step=1.ckpt'}")
    assert file_digests(run) == before
    assert sorted(scalars(tmp_path / "ppo" / "version_1")["train/task_reward"]) == [1, 2]


def test_resuming_a_finished_run_says_so_and_leaves_last_ckpt_untouched(tmp_path, capsys):
    fit("ppo", tmp_path)  # 2 steps of max_epochs 1
    run = tmp_path / "ppo" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    before = file_digests(tmp_path)
    capsys.readouterr()
    code, err = failed_fit("ppo", tmp_path, (f"--ckpt_path={last}", "--model.ppo.lr=0.0002"), capsys)
    assert code == 2
    first = err.splitlines()[0]
    assert first.startswith("error: ckpt_path: nothing is left to train") and "2 training steps" in first
    assert ("2 training steps in 1 finished epoch(s), and this config trains "
            "trainer.max_epochs=1 epoch(s) of 2 steps") in first, first
    assert "--trainer.max_epochs" in first and "left as it is" in first, err
    assert file_digests(tmp_path) == before, "last.ckpt byte-identical, no new run directory"
    # Extending it as the message says trains the next epoch, beside the finished run.
    fit("ppo", tmp_path, f"--ckpt_path={last}", "--trainer.max_epochs=2")
    assert {f"ppo/version_0/{k}": v for k, v in file_digests(run).items()} == before
    assert sorted(p.name for p in (tmp_path / "ppo").iterdir()) == ["version_0", "version_1"]
    assert sorted(scalars(tmp_path / "ppo" / "version_1")["train/task_reward"]) == [2, 3]


def test_a_resume_is_judged_by_the_checkpoints_epoch_counters_as_lightning_resumes(tmp_path, capsys):
    # Issue 32 item 13: 5 steps in one epoch, then 2 epochs of 1 step: Lightning trains
    # the second epoch's one step (it was refused: "holds 5 training steps ... trains 2").
    fit("ppo", tmp_path, "--trainer.limit_train_batches=5", "--trainer.callbacks.every_n_train_steps=2")
    folder = tmp_path / "ppo" / "version_0" / "checkpoints"
    capsys.readouterr()
    fit("ppo", tmp_path, "--trainer.limit_train_batches=1", "--trainer.max_epochs=2",
        f"--ckpt_path={folder / 'last.ckpt'}")
    out = capsys.readouterr().out
    assert "fit: 1 more training steps of 4 prompts x 4 samples, resuming after step 5 (to step 6" in out, out
    assert sorted(scalars(tmp_path / "ppo" / "version_1")["train/task_reward"]) == [5]
    # A checkpoint within an epoch finishes that epoch first.
    middle = load_checkpoint_info(folder / "epoch=0-step=2.ckpt")
    assert (middle["epochs_done"], middle["mid_epoch"], middle["steps_in_epoch"]) == (0, True, 2)
    assert steps_left(middle, 1, 5) == 3 and steps_left(middle, 2, 5) == 8
    finished = load_checkpoint_info(folder / "last.ckpt")
    assert steps_left(finished, 1, 5) == 0 and steps_left(finished, 2, 1) == 1
    assert nothing_left_to_train(finished, 1, -1, 300) is not None
    assert nothing_left_to_train(finished, 2, -1, 1) is None


def test_checkpoints_count_training_steps(tmp_path):
    # SMALL: 2 optimizer steps per training step; a run of 3 training steps, every 2.
    fit("ppo", tmp_path, "--trainer.limit_train_batches=3", "--trainer.callbacks.every_n_train_steps=2")
    folder = tmp_path / "ppo" / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt"]
    steps = {p.name: torch.load(p, weights_only=True)["lightning_adv"]["rollout_step"]
             for p in folder.iterdir()}
    assert steps == {"epoch=0-step=2.ckpt": 2, "last.ckpt": 3}, "last.ckpt holds the final step"
    saved = yaml.safe_load((tmp_path / "ppo" / "version_0" / "config.yaml").read_text())
    assert saved["trainer"]["callbacks"][0]["class_path"].endswith("TrainingStepCheckpoint")


def test_lightnings_model_checkpoint_in_a_config_counts_training_steps_too(tmp_path):
    config = yaml.safe_load((CONFIGS / "ppo.yaml").read_text())
    config["trainer"]["callbacks"][0]["class_path"] = "lightning.pytorch.callbacks.ModelCheckpoint"
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path), f"--trainer.logger.init_args.save_dir={tmp_path}",
          "--trainer.limit_train_batches=2", "--trainer.callbacks.every_n_train_steps=1",
          "--model.ppo.prompts_per_step=4", "--model.ppo.n_samples=4", "--model.ppo.minibatches=2",
          "--model.ppo.epochs=1", "--model.evaluation.num_prompts=4"])
    folder = tmp_path / "ppo" / "version_0" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [
        "epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt", "last.ckpt"]


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_evaluations_write_inside_the_run_they_evaluate(command, tmp_path, capsys, recwarn):
    fit("ppo", tmp_path, "--trainer.limit_train_batches=1")
    recwarn.clear()
    run = tmp_path / "ppo" / "version_0"
    before = file_digests(run)
    for _ in range(2):
        main([command, "--config", str(CONFIGS / "ppo.yaml"),
              f"--trainer.logger.init_args.save_dir={tmp_path}", "--model.evaluation.num_prompts=4",
              "--trainer.enable_progress_bar=false", f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"])
    assert sorted(p.name for p in (tmp_path / "ppo").iterdir()) == ["version_0"], "no new version_N"
    outputs = [run / "eval" / f"{command}_0", run / "eval" / f"{command}_1"]
    assert all((d / "config.yaml").is_file() for d in outputs)
    assert {k: v for k, v in file_digests(run).items() if not k.startswith("eval/")} == before
    # Lightning's note that the checkpoint folder moved says nothing here: it moved on purpose.
    assert not [w for w in recwarn if "dirpath has changed" in str(w.message)]
    if command == "predict":
        assert all((d / "predictions.jsonl").is_file() for d in outputs)
    else:
        stage = "val" if command == "validate" else "test"
        assert f"{stage}/reward_greedy" in scalars(outputs[0])


@pytest.mark.parametrize("override, key", [
    ("--trainer.limit_train_batches=-1", "trainer.limit_train_batches"),
    ("--trainer.limit_val_batches=-2", "trainer.limit_val_batches"),
    ("--trainer.limit_train_batches=0", "trainer.limit_train_batches: 0 trains nothing"),
    ("--trainer.max_epochs=0", "trainer.max_epochs: 0 trains nothing"),
    ("--trainer.max_steps=0", "trainer.max_steps: 0 trains nothing"),
    ("--trainer.max_epochs=-5", "trainer.max_epochs"),
    ("--trainer.max_epochs=-1", "trainer.max_epochs: -1 trains without end"),
    ("--trainer.limit_train_batches=0.00001", "trainer.limit_train_batches: 1e-05 of an epoch"),
    ("--trainer.val_check_interval=0", "trainer.val_check_interval"),
])
def test_trainer_counts_that_train_nothing_or_lightning_refuses_are_usage_errors(
        override, key, tmp_path, capsys):
    code, err = failed_fit("ppo", tmp_path, override, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and lines[0].startswith(f"error: {key}"), err
    assert len(lines) <= 3 and "Traceback" not in err
    assert not (tmp_path / "ppo").exists(), "no run directory for a run that cannot train"


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_an_empty_config_file_says_it_is_empty(text, tmp_path, capsys):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith(f"error: --config: {str(path)!r} is empty"), err


@pytest.mark.parametrize("estimator, says", [
    ("tests.support.contract_stages.estimator_short_returns", "returns: expected shape [16, "),
    ("tests.support.trainer_helpers.nan_estimator", "advantages: expected finite values"),
])
def test_a_user_estimator_breaking_its_contract_during_fit_is_one_error_line(
        estimator, says, tmp_path, capsys):
    code, err = failed_fit("ppo", tmp_path, f"--model.actor.advantage.estimator={estimator}", capsys)
    assert code == 1
    assert err.strip().splitlines() == [err.strip()] and "Traceback" not in err, err
    assert err.startswith(f"error: advantage.estimator {estimator!r}: ") and says in err, err
