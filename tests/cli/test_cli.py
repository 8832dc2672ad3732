"""The CLI users run: ``python -m lightning_adv fit --config configs/<name>.yaml``.

Every shipped config runs 2 small training steps through the CLI (in process, to keep
CI short); the TensorBoard event files, the saved config, ``--print_config``, usage
errors (exit 2, naming the key) and exact resume from a checkpoint are checked.
"""

import math
import shlex
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_adv.trainer.run.resume import load_checkpoint_info, steps_left
from lightning_adv.cli import as_step_count, main
from tests.support.cli_runs import CONFIGS, REPO, SHIPPED, SMALL, failed_fit, fit, scalars
from tests.support.scripts import load_script
from lightning_adv.trainer import PPOModule

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
    not_finite = {tag: values for tag, values in logged.items() if tag != "histograms"
                  and not all(math.isfinite(v) for v in values.values())}
    assert not not_finite, f"every logged scalar is finite: {not_finite}"
    critic = shipped["model"]["policy"]["value_head"]
    assert ("train/value_loss" in logged) == critic
    assert ("train/explained_variance" in logged) == critic
    assert logged["histograms"]["train/advantages"] == [0, 1]
    # ppo.vine: the continuations' tokens, apart from the trained responses'
    assert ("train/vine_tokens" in logged) == ("vine" in shipped["model"]["ppo"])
    # each step's sampling cost, and the run's so far
    tokens = logged["train/sampled_tokens"]
    assert tokens[0] > 0 and logged["train/sampled_tokens_total"] == {
        0: tokens[0], 1: tokens[0] + tokens[1]}
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


@dataclass
class CliBad:
    """A command line that must stop with a usage error (exit 2) before anything is built:
    ``error: ...`` first, naming ``key``."""

    id: str
    override: str | tuple[str, ...]
    key: str
    config: str = "ppo"

    @property
    def args(self) -> tuple[str, ...]:
        return (self.override,) if isinstance(self.override, str) else self.override


CLI_ERRORS = [
    CliBad("cli-unknown-stage", "--model.actor.advantage.estimator.implementation=token_gea",
           "model.actor.advantage.estimator"),
    CliBad("cli-stage-kwargs", "--model.actor.advantage.process_adv_shaping={implementation: gvpo, "
           "kwargs: {negative: 1}}", "model.actor.advantage.process_adv_shaping"),
    CliBad("cli-unimportable-stage", "--model.actor.advantage.outcome_reward_shaping="
           "no_such_pkg.mod.fn", "model.actor.advantage.outcome_reward_shaping"),
    CliBad("cli-literal-choice", "--model.actor.kl_estimator=k9", "model.actor.kl_estimator"),
    CliBad("cli-wrong-type", "--model.ppo.n_samples=abc", "model.ppo.n_samples"),
    CliBad("cli-unknown-option", "--model.ppo.n_sample=4", "--model.ppo.n_sample"),
    CliBad("cli-unknown-task", "--model.task.name=no_such_task", "model.task.name"),
    CliBad("cli-task-kwargs", "--model.task.kwargs={alphabet: abc, colour: red}", "model.task.kwargs"),
    CliBad("cli-unimportable-reward", "--model.task.reward=no_such_pkg.rewards.fn", "model.task.reward"),
    CliBad("cli-non-positive-count", "--model.ppo.n_samples=0", "model.ppo.n_samples"),
    CliBad("cli-token-limit", "--model.ppo.max_new_tokens=0", "model.ppo.max_new_tokens"),
    CliBad("cli-sequence-too-short", "--model.policy.max_seq_len=4", "model.policy.max_seq_len"),
    CliBad("cli-advantage-module-class", "--model.advantage_module=lightning_adv.ActorConfig",
           "model.advantage_module"),
    CliBad("cli-scorer-kwargs", "--model.prm={enabled: true, scorers: [{path: "
           "lightning_adv.trainer.tasks.position_match, kwargs: {x: 1}}]}", "model.prm.scorers[0].path"),
    CliBad("cli-length-penalty-budget", "--model.actor={overlong_reward_penalty: true, "
           "overlong_tokens: 2, overlong_penalty_factor: 1.0}", "model.actor.max_new_tokens"),
    CliBad("cli-lambda-kwargs", "--model.actor={gae_lambda: lightning_adv.vapo_length_adaptive_gae, "
           "gae_lambda_kwargs: {alpha: -1}}", "model.actor.gae_lambda"),
    CliBad("cli-norm-eps", "--model.actor.adv_norm.eps=0", "model.actor.adv_norm.eps"),
    CliBad("cli-turn-gae-single-turn", "--model.actor.advantage.estimator=turn_gae",
           "model.actor.advantage.estimator"),
    CliBad("cli-turn-unit-single-turn", ("--model.actor.advantage.estimator=auto",
                                         "--model.actor.gae_timestep_unit=turn"),
           "model.actor.gae_timestep_unit"),
    CliBad("cli-pool-smaller-than-step", "--model.task.num_prompts=3", "model.task.num_prompts"),
    CliBad("cli-more-minibatches-than-rows", "--model.ppo.minibatches=17", "model.ppo.minibatches"),
    CliBad("cli-minibatches-per-rank", ("--trainer.devices=2", "--model.ppo.minibatches=9"),
           "model.ppo.minibatches"),
    CliBad("cli-group-norm-one-sample", "--model.ppo.n_samples=1", "model.ppo.n_samples", "grpo"),
    CliBad("cli-group-mean-one-sample", "--model.ppo.n_samples=1", "model.ppo.n_samples", "dr_grpo"),
    CliBad("cli-group-baseline-one-sample", ("--model.actor.reward_norm=null", "--model.ppo.n_samples=1",
                                             "--model.actor.advantage.outcome_reward_shaping=gpg"),
           "model.ppo.n_samples", "grpo"),
    CliBad("cli-clip-eps-degenerate", "--model.ppo.clip_eps=50", "model.ppo.clip_eps"),
    CliBad("cli-lr-degenerate", "--model.ppo.lr=5", "model.ppo.lr"),
    CliBad("cli-forward-batch-size", "--model.ppo.forward_batch_size=0",
           "model.ppo.forward_batch_size"),
    CliBad("cli-micro-batch-size", "--model.ppo.micro_batch_size=-1", "model.ppo.micro_batch_size"),
    CliBad("cli-vine-estimator-without-vine", "--model.ppo.vine=null", "model.ppo.vine", "vine"),
    CliBad("cli-vine-without-estimator", "--model.ppo.vine={k: 2}", "model.ppo.vine"),
    CliBad("cli-vine-boundaries", "--model.ppo.vine.boundaries=sentence",
           "model.ppo.vine.boundaries", "vine"),
    CliBad("cli-tree-estimator-without-tree", "--model.ppo.tree=null", "model.ppo.tree",
           "tree_grpo"),
    CliBad("cli-tree-leaves", "--model.ppo.n_samples=6", "model.ppo.n_samples", "tree_grpo"),
    CliBad("cli-tree-branch-at", "--model.ppo.tree.branch_at=random",
           "model.ppo.tree.branch_at", "treerl"),
    CliBad("cli-missing-checkpoint", "--ckpt_path=no/such/last.ckpt", "ckpt_path"),
    CliBad("cli-not-a-checkpoint", f"--ckpt_path={Path(__file__)}", "ckpt_path"),
    CliBad("cli-threads", "--torch_num_threads=0", "torch_num_threads"),
    CliBad("cli-val-interval-past-epoch", "--trainer.val_check_interval=3", "trainer.val_check_interval"),
    CliBad("cli-pass-k-above-samples", "--model.evaluation.pass_k=[1, 8]", "model.evaluation.pass_k"),
]


@pytest.mark.parametrize("bad", CLI_ERRORS, ids=[b.id for b in CLI_ERRORS])
def test_bad_command_line_is_a_short_usage_error_naming_the_key(bad, capsys, tmp_path):
    code, err = failed_fit(bad.config, tmp_path, bad.override, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and bad.key in err, err
    assert len(lines) <= 10 and "--help" in lines[-1], "the error, not the whole usage"
    assert not (tmp_path / bad.config).exists(), "nothing may be built before validation"
    # docs/reference/errors.md shows this message (scripts/generate_reference.py writes it).
    pages = load_script("generate_reference")
    row = pages.cli_error_line(pages.cli_error_row(bad, err))
    assert row in (REPO / "docs" / "reference" / "errors.md").read_text(), (
        f"docs/reference/errors.md lacks or differs from {row!r}: run "
        f"python scripts/generate_reference.py")


def test_help_shows_each_fields_description(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("clip range of the probability ratio", "responses sampled per prompt",
                 "temporal estimator: null/auto", "width of the residual stream"):
        assert text in out, text


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
    ("--model.task.reward=tests.support.trainer_helpers.nan_reward", "must be finite, got nan"),
    ("--model.task.reward=tests.support.trainer_helpers.string_reward", "must be a float, got str"),
    ("--model.task.reward=tests.support.trainer_helpers.bool_reward", "convert booleans with float()"),
    ("--model.task.name=tests.support.trainer_helpers.EmptyPromptTask", "expected a non-empty string"),
])
def test_bad_task_function_output_is_a_clear_error(override, message, capsys, tmp_path):
    code, err = failed_fit("ppo", tmp_path, override, capsys)
    assert code == 1
    assert message in err and ("task.reward" in err or "task.name" in err), err


def test_resume_with_overwrite_run_continues_in_the_run_directory_and_reproduces_the_next_steps(
        tmp_path, capsys):
    # 4 steps, a checkpoint every 2 training steps; the override applies to the config's
    # checkpoint callback.
    fit("turn_gae", tmp_path, "--trainer.limit_train_batches=4",
        "--trainer.callbacks.every_n_train_steps=2")
    run = tmp_path / "turn_gae" / "version_0"
    full = scalars(run)
    ckpt = run / "checkpoints" / "epoch=0-step=2.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in (run / "checkpoints").iterdir())
    capsys.readouterr()
    # Steps 2-3 exist already: only the explicit flag continues in place, replacing them.
    fit("turn_gae", tmp_path, "--trainer.limit_train_batches=4",
        "--trainer.callbacks.every_n_train_steps=2", f"--ckpt_path={ckpt}", "--overwrite_run=true")
    out, err = capsys.readouterr()
    assert "--overwrite_run: continuing in" in err and "epoch=0-step=4.ckpt" in err, err
    assert "resumed in" in out and str(run) in out, out
    assert not (tmp_path / "turn_gae" / "version_1").exists(), "a resumed run keeps its directory"
    resumed = scalars(run)
    assert sorted(resumed["train/task_reward"]) == [0, 1, 2, 3]
    for tag, values in resumed.items():
        if tag.startswith("train/"):
            for step, value in values.items():
                assert value == full[tag][step], (tag, step)
    # One curve: the steps the resumed run wrote again replaced the first run's.
    events = EventAccumulator(str(run))
    events.Reload()
    assert [e.step for e in events.Scalars("train/task_reward")] == [0, 1, 2, 3]
    # The original config is kept; the resumed run's config sits beside it.
    assert yaml.safe_load((run / "config.yaml").read_text())["ckpt_path"] is None
    assert yaml.safe_load((run / "config-2.yaml").read_text())["ckpt_path"] == str(ckpt)


def test_resume_trains_with_the_command_line_not_the_checkpoint(tmp_path, capsys):
    # Checkpoint after training step 0 of a run without a reference policy (kl_ctl 0) ...
    fit("ppo", tmp_path, "--trainer.callbacks.every_n_train_steps=1", "--model.actor.kl_ctl=0")
    run = tmp_path / "ppo" / "version_0"
    ckpt = run / "checkpoints" / "epoch=0-step=1.ckpt"
    capsys.readouterr()
    # ... resumed with another learning rate and a KL penalty (which needs the reference).
    fit("ppo", tmp_path, "--trainer.callbacks.every_n_train_steps=1", "--model.actor.kl_ctl=0.5",
        "--model.ppo.lr=0.05", f"--ckpt_path={ckpt}")
    err = capsys.readouterr().err
    assert "model.ppo.lr (0.0005 in the checkpoint, 0.05 now)" in err, err
    assert "model.actor.kl_ctl (0.0 in the checkpoint, 0.5 now)" in err, err
    branch = tmp_path / "ppo" / "version_1"  # other settings: a new run directory
    assert scalars(run)["train/kl_coef"] == {0: 0.0, 1: 0.0}, "the parent run is left as it was"
    logged = scalars(branch)
    assert logged["train/kl_coef"] == {1: 0.5}
    assert logged["train/kl_rewards"][1] != 0.0
    last = torch.load(branch / "checkpoints" / "last.ckpt", weights_only=True)
    assert [g["lr"] for g in last["optimizer_states"][0]["param_groups"]] == [0.05]
    saved = yaml.safe_load((branch / "config.yaml").read_text())["model"]
    assert saved["ppo"]["lr"] == 0.05 and saved["actor"]["kl_ctl"] == 0.5


def test_resuming_a_different_network_is_refused_naming_the_keys(tmp_path, capsys):
    fit("grpo", tmp_path, "--trainer.limit_train_batches=1")
    ckpt = tmp_path / "grpo" / "version_0" / "checkpoints" / "last.ckpt"
    # (a second epoch: the checkpoint's run finished its first)
    code, err = failed_fit("ppo", tmp_path, (f"--ckpt_path={ckpt}", "--trainer.max_epochs=2"), capsys)
    assert code == 2
    assert "model.policy.value_head (False in the checkpoint, True now)" in err, err
    assert "value_head" in err and "ckpt_path" in err


def test_load_from_checkpoint_carries_the_run_seed(tmp_path):
    fit("ppo", tmp_path, "--trainer.limit_train_batches=1")
    ckpt = tmp_path / "ppo" / "version_0" / "checkpoints" / "last.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = PPOModule.load_from_checkpoint(ckpt)
    assert module.seed == 7 and module.rollout_step == 1


def test_limit_train_batches_counts_steps_one_included(tmp_path, capsys):
    fit("ppo", tmp_path, "--trainer.limit_train_batches=1")
    assert sorted(scalars(tmp_path / "ppo" / "version_0")["train/task_reward"]) == [0]
    assert "fit: 1 training steps" in capsys.readouterr().out


@pytest.mark.parametrize("parsed, steps", [(1, 1), (1.0, 1), (3.0, 3), (0.5, 0.5), (None, None)])
def test_step_counts_survive_either_parse_of_int_or_float(parsed, steps):
    # jsonargparse turns "1" into 1 or 1.0 depending on what else is installed (pydantic).
    assert as_step_count(parsed) == steps and type(as_step_count(parsed)) is type(steps)


def test_fit_without_a_length_runs_a_bounded_number_of_steps(tmp_path):
    from lightning_adv.cli import LightningAdvCLI

    def trainer(*args):
        cli = LightningAdvCLI(PPOModule, auto_configure_optimizers=False, run=False,
                              args=[f"--trainer.default_root_dir={tmp_path}", *args])
        return cli.trainer
    assert trainer().limit_train_batches == 300  # not the default pool's 3125-step epoch
    assert trainer("--trainer.limit_train_batches=5").limit_train_batches == 5
    assert trainer("--trainer.max_steps=40").limit_train_batches == 1.0  # Lightning's default


def test_no_logger_keeps_the_run_in_its_own_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("mine: true\n")
    for _ in range(2):
        main(["fit", "--config", str(CONFIGS / "ppo.yaml"), "--trainer.logger=false", *SMALL])
    assert (tmp_path / "config.yaml").read_text() == "mine: true\n"
    for version in ("version_0", "version_1"):
        run = tmp_path / "runs" / "no_logger" / version
        assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "runs"]


def test_saved_config_never_overwrites_a_file(tmp_path):
    (tmp_path / "config.yaml").write_text("mine: true\n")
    main(["fit", "--config", str(CONFIGS / "ppo.yaml"), "--trainer.logger=false",
          f"--trainer.default_root_dir={tmp_path}", *SMALL])
    assert (tmp_path / "config.yaml").read_text() == "mine: true\n"
    assert yaml.safe_load((tmp_path / "config-2.yaml").read_text())["model"]["task"]["name"] == "reverse"


@pytest.mark.parametrize("config", SHIPPED)
def test_checkpointing_can_be_switched_off(config, tmp_path, capsys):
    fit(config, tmp_path, "--trainer.enable_checkpointing=false", "--trainer.limit_train_batches=1")
    assert not (tmp_path / config / "version_0" / "checkpoints").exists()
    assert "checkpoints: none" in capsys.readouterr().out


def test_fit_ends_with_a_summary(tmp_path, capsys):
    fit("ppo", tmp_path)
    out = capsys.readouterr().out
    run = tmp_path / "ppo" / "version_0"
    assert "fit: 2 training steps (4 optimizer steps)" in out, out
    assert "final train/task_reward" in out and f"logs: {run}" in out
    assert f"checkpoints: {run / 'checkpoints'} (latest: last.ckpt)" in out


def test_ctrl_c_saves_a_checkpoint_and_prints_the_resume_command(tmp_path):
    cmd = [sys.executable, "-m", "lightning_adv", "fit", "--config", str(CONFIGS / "ppo.yaml"),
           f"--trainer.logger.init_args.save_dir={tmp_path}", *SMALL,
           "--trainer.limit_train_batches=500"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("fit: 500 training steps"):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "`max_epochs=1` reached" not in out + err, "the run was interrupted, not finished"
    for noise in ("Tip:", "LeafSpec", "weights_only"):  # dependency notes that say nothing to a user
        assert noise not in out + err, noise
    command = next(line for line in out.splitlines() if "resume with:" in line).split("resume with: ")[1]
    args = shlex.split(command)
    assert args[:4] == ["python", "-m", "lightning_adv", "fit"]
    ckpt = Path(args[args.index("--ckpt_path") + 1])
    step = torch.load(ckpt, weights_only=True)["lightning_adv"]["rollout_step"]
    assert ckpt.is_file() and ckpt.name == f"interrupted-step={step}.ckpt" and step >= 1
    assert f"(latest: {ckpt.name})" in out, "the summary names the checkpoint that resumes"
    # last.ckpt holds the same mid-epoch state: it resumes the rest of the epoch too.
    last = load_checkpoint_info(ckpt.parent / "last.ckpt")
    assert (last["step"], last["epochs_done"], last["mid_epoch"]) == (step, 0, True), last
    assert steps_left(last, 1, 500) == 500 - step
    assert sorted(p.name for p in ckpt.parent.iterdir()) == [ckpt.name, "last.ckpt"]
    # The printed command resumes (one more step here) in the same run directory.
    main(args[3:] + [f"--trainer.limit_train_batches={step + 1}"])
    assert sorted(scalars(ckpt.parent.parent)["train/task_reward"]) == list(range(step + 1))


def documented_command(page: str, fragment: str) -> list[str]:
    """The ``python -m lightning_adv ...`` command of a docs page whose lines contain ``fragment``."""
    lines = (REPO / "docs" / page).read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if fragment in line)
    start = max(i for i in range(end + 1) if lines[i].lstrip().startswith("python -m lightning_adv"))
    while lines[end].rstrip().split("#")[0].rstrip().endswith("\\"):
        end += 1
    text = " ".join(line.split("  #")[0].rstrip().rstrip("\\") for line in lines[start:end + 1])
    return shlex.split(text)[3:]


def test_documented_stage_override_example_works(tmp_path):
    from lightning_adv.cli import LightningAdvCLI, TRAINER_DEFAULTS

    args = documented_command("guides/writing-a-stage.md",
                              "process_adv_shaping.kwargs.negative_scale=0.5")
    assert args[0] == "fit"
    cli = LightningAdvCLI(PPOModule, trainer_defaults=TRAINER_DEFAULTS, auto_configure_optimizers=False,
                          args=args[1:] + [f"--trainer.default_root_dir={tmp_path}"], run=False)
    process = cli.model.advantage.process
    assert (process.implementation, process.kwargs) == ("gvpo", {"negative_scale": 0.5})
    fit(Path(args[args.index("--config") + 1]).stem, tmp_path, *args[3:],
        "--trainer.limit_train_batches=1")


@pytest.mark.parametrize("form", ["yaml", "flag"])
def test_a_stage_may_be_given_by_name_alone(form, tmp_path, capsys):
    if form == "yaml":
        config = tmp_path / "est.yaml"
        config.write_text("model:\n  actor:\n    advantage:\n      estimator: reinforce\n"
                          "      compute: default\n")
        extra = ["--config", str(config)]
    else:
        extra = ["--model.actor.advantage.estimator=reinforce"]
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(CONFIGS / "grpo.yaml"), *extra, "--print_config"])
    advantage = yaml.safe_load(capsys.readouterr().out)["model"]["actor"]["advantage"]
    estimator = advantage["estimator"]
    assert estimator in ("reinforce", {"implementation": "reinforce", "kwargs": {}})
    fit("grpo", tmp_path, *extra, "--trainer.limit_train_batches=1")


def test_a_dotted_stage_path_flag_then_its_kwargs(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(CONFIGS / "ppo.yaml"),
              "--model.actor.advantage.estimator", "my_pkg.estimators.fn",
              "--model.actor.advantage.estimator.kwargs.scale=2", "--print_config"])
    estimator = yaml.safe_load(capsys.readouterr().out)["model"]["actor"]["advantage"]["estimator"]
    assert estimator == {"implementation": "my_pkg.estimators.fn", "kwargs": {"scale": 2}}


def test_a_user_stage_exception_names_the_stage(tmp_path):
    with pytest.raises(ZeroDivisionError) as err:
        fit("ppo", tmp_path, "--model.actor.advantage.estimator=tests.support.trainer_helpers.failing_estimator")
    assert any("advantage.estimator 'tests.support.trainer_helpers.failing_estimator'" in note
               for note in err.value.__notes__), err.value.__notes__


def test_scorers_without_prm_enabled_warn(tmp_path):
    scorers = "--model.prm.scorers=[{path: lightning_adv.trainer.tasks.position_match}]"
    with pytest.warns(UserWarning, match="prm.scorers: process scorers are configured but "
                                         "prm.enabled is false"):
        fit("ppo", tmp_path, scorers, "--trainer.limit_train_batches=1")
