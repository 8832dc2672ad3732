"""Unscorable rewards in the built-in trainer (``actor.unscorable_rewards``).

A task or ``task.reward`` function returns None (or NaN) for a response it cannot score.
Under ``exclude`` that row's reward is NaN in the rollout batch (the advantage module
leaves it out, advantage 0); under the default ``error`` the run stops with an error
naming the function and the row. The trainer's own reward metrics, dynamic sampling,
evaluation, sample tables and predictions skip such rows instead of turning NaN.
"""

import math
import warnings

import pytest
import torch

from lightning_adv import ActorConfig
from lightning_adv.trainer import PPOConfig, PPOModule, TaskConfig
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.rollout.dynamic_sampling import has_signal
from lightning_adv.trainer.logs.evaluation import EvalMetrics, pass_at_k, prediction_records
from lightning_adv.trainer.logs.metrics import StepMetrics
from lightning_adv.trainer.rollout.recipe_inputs import baseline_rewards
from lightning_adv.trainer.logs.sample_log import samples_markdown
from lightning_adv.trainer.tasks.episode import Episode
from lightning_adv.trainer.tasks.runtime import Sample, TaskRuntime, Turn
from lightning_adv.exceptions import TaskError

HELPER = "tests.support.trainer_helpers.sometimes_unscorable"


def sample(response, target="cba", index=0):
    turn = Turn(response, tuple(response) + ("<eos>",), True)
    return Sample(index=index, instance="abc", prompt="abc=", turns=(turn,), truncated=False,
                  target=target)


def episode(reward, index=0, response="ab"):
    ep = Episode(index, "abc", [], [], [], [], [])
    ep.reward, ep.sample = reward, sample(response, index=index)
    return ep


# ---------------------------------------------------------------------- the reward call

@pytest.mark.parametrize("reward", [HELPER, "tests.support.trainer_helpers.nan_when_odd"])
def test_none_or_nan_is_unscorable_under_exclude(reward):
    runtime = TaskRuntime(TaskConfig(reward=reward), unscorable_rewards="exclude")
    assert math.isnan(runtime.reward(sample("cbb"), 0))  # odd length: could not score
    assert runtime.reward(sample("cb", target="cb"), 1) == 1.0
    assert runtime.reward(sample("cb"), 2) == 0.0


def test_a_tasks_own_reward_may_be_unscorable_too():
    config = TaskConfig(name="tests.support.trainer_helpers.UnscorableReverseTask")
    assert math.isnan(TaskRuntime(config, unscorable_rewards="exclude").reward(sample("cbb"), 0))
    with pytest.raises(TaskError, match=r"task.name 'tests.support.trainer_helpers.UnscorableReverseTask' "
                                        r"reward: reward for prompt 0, sample 0 .* is None"):
        TaskRuntime(config).reward(sample("cbb"), 0)


@pytest.mark.parametrize("reward, got", [
    (HELPER, "is None"), ("tests.support.trainer_helpers.nan_when_odd", "must be finite, got nan")])
def test_unscorable_is_refused_by_default_naming_the_function_and_the_row(reward, got):
    runtime = TaskRuntime(TaskConfig(reward=reward))
    with pytest.raises(TaskError, match=rf"task.reward '{reward}': reward for prompt 7, sample "
                                        rf"3 \(response 'cbb'\) {got}, i.e. the function could "
                                        rf"not score the response; .*actor.unscorable_rewards: "
                                        rf"exclude"):
        runtime.reward(sample("cbb", index=7), 3)


def test_exclude_accepts_only_none_and_nan():
    from lightning_adv.trainer.tasks.runtime import is_unscorable

    assert is_unscorable(None) and is_unscorable(math.nan) and is_unscorable(torch.tensor(math.nan))
    assert not any(is_unscorable(v) for v in (math.inf, -math.inf, 0.0, torch.tensor(1.0),
                                              torch.tensor([math.nan, math.nan]), "nan", False))
    runtime = TaskRuntime(TaskConfig(reward="tests.support.trainer_helpers.string_reward"),
                          unscorable_rewards="exclude")
    with pytest.raises(TaskError, match="must be a float, got str"):
        runtime.reward(sample("cb"), 0)
    with pytest.raises(ValueError, match="actor.unscorable_rewards: expected one of error, "
                                         "exclude, got 'skip'"):
        TaskRuntime(TaskConfig(), unscorable_rewards="skip")


def test_the_rollout_batch_carries_nan_for_unscorable_rows():
    module = PPOModule(task=TaskConfig(name="addition", reward=HELPER),
                       ppo=PPOConfig(prompts_per_step=4, n_samples=4, minibatches=2, epochs=1),
                       actor=ActorConfig(unscorable_rewards="exclude"), seed=0)
    groups = module.rollout([0, 1, 2, 3], generator(0, "unscorable"))
    batch, meta = module.make_batch(groups)
    odd = torch.tensor([len(ep.sample.response) % 2 == 1 for g in groups for ep in g])
    assert 0 < int(odd.sum()) < len(odd)  # the seed gives both kinds
    assert torch.equal(batch["rewards"].isnan(), odd)
    out = module.advantage(batch, meta)
    assert torch.equal(out["unscorable"].cpu(), odd)
    assert float(out["advantages"][odd].abs().sum()) == 0.0


# ---------------------------------------------------------------------- the trainer's own numbers

def test_reward_means_skip_unscorable_episodes():
    metrics = StepMetrics(critic=False)
    metrics.update_scored("task_reward", torch.tensor([1.0, math.nan, 0.0, 0.5]))
    metrics.update("response_length", torch.tensor([2.0, 4.0, 6.0, 8.0]))
    for name in ("rlhf_reward", "truncated", "turns"):
        metrics.update(name, torch.zeros(1))
    values = metrics.compute()
    assert float(values["train/task_reward"]) == pytest.approx(1.5 / 3)
    assert float(values["train/response_length"]) == pytest.approx(5.0)  # every episode


def test_dynamic_sampling_sees_the_spread_of_scored_rewards_only():
    assert not has_signal([episode(math.nan), episode(math.nan)])  # NaN != NaN is no spread
    assert not has_signal([episode(1.0), episode(math.nan), episode(1.0)])
    assert has_signal([episode(1.0), episode(math.nan), episode(0.0)])


def test_evaluation_metrics_leave_unscorable_responses_out():
    metrics = EvalMetrics(pass_k=[1, 2])
    nan = math.nan
    greedy = [[episode(1.0, 0)], [episode(nan, 1)], [episode(0.0, 2)]]
    sampled = [[episode(r, 0) for r in (1.0, nan, 0.0)],
               [episode(r, 1) for r in (nan, nan, nan)],
               [episode(r, 2) for r in (nan, 1.0, nan)]]
    metrics.update(greedy, sampled, threshold=1.0)
    got = {name: float(m.compute()) for name, m in metrics.items()}
    assert got["reward_greedy"] == pytest.approx(0.5)  # prompts 0 and 2
    assert got["solved_greedy"] == pytest.approx(0.5)
    assert got["reward_mean"] == pytest.approx((0.5 + 1.0) / 2)  # prompt 1 has no scored one
    # pass@1: prompt 0 (n=2, c=1) 1/2, prompt 2 (n=1, c=1) 1; pass@2 only prompt 0: 1.
    assert got["pass@1"] == pytest.approx((pass_at_k(2, 1, 1) + 1.0) / 2)
    assert got["pass@2"] == pytest.approx(pass_at_k(2, 1, 2)) == 1.0


def test_an_evaluation_without_anything_scored_to_average_is_nan_not_zero():
    # pass@3 needs 3 scored samples of a prompt; no prompt has them, so pass@3 has no
    # estimate (NaN, as README says), where 0 would read as "never solved". The greedy
    # means likewise when no greedy response was scored.
    metrics = EvalMetrics(pass_k=[1, 3])
    nan = math.nan
    greedy = [[episode(nan, 0)], [episode(nan, 1)]]
    sampled = [[episode(r, 0) for r in (1.0, nan, 0.0)], [episode(r, 1) for r in (nan, 1.0, 1.0)]]
    metrics.update(greedy, sampled, threshold=1.0)
    got = {name: float(m.compute()) for name, m in metrics.items()}
    assert math.isnan(got["pass@3"]) and math.isnan(got["reward_greedy"])
    assert math.isnan(got["solved_greedy"])
    assert got["pass@1"] == pytest.approx((0.5 + 1.0) / 2)
    assert got["reward_mean"] == pytest.approx((0.5 + 1.0) / 2)


def test_predictions_and_sample_tables_show_unscorable_responses():
    greedy, sampled = [[episode(math.nan, 0)]], [[episode(0.25, 0)]]
    records = prediction_records(greedy, sampled)
    assert [r["reward"] for r in records] == [None, 0.25]  # JSON null, not NaN
    table = samples_markdown(greedy, 1)
    assert table.splitlines()[-1].endswith("| unscorable |")


def test_a_greedy_baseline_must_be_scored():
    assert baseline_rewards([[episode(0.5, 4)], [episode(1.0, 5)]]) == [0.5, 1.0]
    with pytest.raises(TaskError, match=r"ppo.greedy_baseline: .* could not score .* greedy "
                                        r"response to prompts \[5\]"):
        baseline_rewards([[episode(0.5, 4)], [episode(math.nan, 5)]])


# ---------------------------------------------------------------------- end to end

def cli_fit(tmp_path, monkeypatch, *extra, config_name="grpo"):
    """``python -m lightning_adv fit`` (in process) of configs/<config_name>.yaml, two small
    steps, with a reward function that cannot score responses of odd length."""
    import sys
    from pathlib import Path

    from lightning_adv.cli import main

    monkeypatch.setattr(sys, "argv", ["lightning_adv"])
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv("LIGHTNING_ADV_RECORD", str(record))
    config = Path(__file__).resolve().parents[2] / "configs" / f"{config_name}.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main(["fit", "--config", str(config), f"--trainer.logger.init_args.save_dir={tmp_path}",
              "--trainer.limit_train_batches=2", "--trainer.enable_progress_bar=false",
              "--trainer.enable_model_summary=false", "--model.ppo.prompts_per_step=4",
              "--model.ppo.n_samples=4", "--model.ppo.minibatches=2", "--model.ppo.epochs=1",
              "--model.evaluation.num_prompts=8", f"--model.task.reward={HELPER}",
              "--model.advantage_module=tests.support.trainer_helpers.UnscorableRecordingAdvantageModule",
              *extra])
    return record, tmp_path / config_name / "version_0"


def test_fit_trains_without_unscorable_rows_and_logs_their_fraction(tmp_path, monkeypatch):
    from tests.support.cli_runs import scalars

    record, log_dir = cli_fit(tmp_path, monkeypatch, "--model.actor.unscorable_rewards=exclude")
    logged = scalars(log_dir)
    calls = [torch.load(record / f"rank0_call{i}.pt") for i in range(2)]
    for step, call in enumerate(calls):
        nan = call["input_rewards"].isnan()
        assert torch.equal(call["unscorable"], nan)
        assert logged["train/unscorable_fraction"][step] == pytest.approx(float(nan.double().mean()))
        # The trainer's reward mean is over the scored episodes, as the batch holds them.
        scored = call["input_rewards"][~nan].double()
        assert logged["train/task_reward"][step] == pytest.approx(float(scored.mean()), abs=1e-6)
        assert math.isfinite(logged["train/rlhf_reward"][step])
        assert float(call["advantages"][nan].abs().sum()) == 0.0
        assert bool((call["loss_mask"][nan].sum(1) > 0).all())  # still in token means
        assert torch.isfinite(call["advantages"]).all()
    fractions = [logged["train/unscorable_fraction"][s] for s in (0, 1)]
    assert all(0 < f < 1 for f in fractions), fractions  # the seed gives both kinds
    for tag in ("val/reward_greedy", "val/reward_mean", "val/pass@1", "train/advantages_mean"):
        assert all(math.isfinite(v) for v in logged[tag].values()), tag


def test_explained_variance_leaves_unscorable_rows_out(tmp_path, monkeypatch):
    """An unscorable row's returns are its own values (no target, so no critic signal):
    counted, its tokens would be perfectly predicted ones and pull the critic's explained
    variance towards 1."""
    from torchmetrics.functional import explained_variance

    from tests.support.cli_runs import scalars

    record, log_dir = cli_fit(tmp_path, monkeypatch, "--model.actor.unscorable_rewards=exclude",
                              "--model.task.reward=tests.support.trainer_helpers.graded_unless_odd",
                              config_name="ppo")
    logged = scalars(log_dir)["train/explained_variance"]
    for step in range(2):
        call = torch.load(record / f"rank0_call{step}.pt")
        nan = call["input_rewards"].isnan()
        assert 0 < int(nan.sum()) < len(nan)  # the seed gives both kinds
        active = call["loss_mask"] > 0

        def ev(rows):
            chosen = active & rows[:, None]
            return float(explained_variance(call["input_values"][chosen].float(),
                                            call["returns"][chosen].float()))

        assert logged[step] == pytest.approx(ev(~nan), abs=1e-5)
    # (Step 0's values are all 0, the value head's initialization: every row then has
    # residual = return. After one update they differ, and so do the two means.)
    assert abs(ev(~nan) - ev(torch.ones_like(nan))) > 1e-3


def test_fit_under_the_default_stops_naming_the_reward_function(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_fit(tmp_path, monkeypatch)
    err = capsys.readouterr().err
    assert exit_info.value.code == 1
    assert f"task.reward '{HELPER}': reward for prompt" in err and "is None" in err, err
    assert "actor.unscorable_rewards: exclude" in err
