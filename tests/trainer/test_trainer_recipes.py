"""The built-in trainer feeds the recipes what they read: ``sum_pi_squared`` from its logits
(optimal token baseline), a greedy response's reward per prompt (ReMax,
``ppo.greedy_baseline``), and DAPO's dynamic sampling (``ppo.dynamic_sampling``)."""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from lightning_adv.recipes import recipe
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.rollout.dynamic_sampling import has_signal, sample_with_signal
from lightning_adv.trainer.ppo import PPOModule
from lightning_adv.trainer.rollout.step import Rollout
from tests.support.cli_runs import CONFIGS, SMALL, fit, scalars
from tests.support.trainer_helpers import ddp_fit

RECORDER = "--model.advantage_module=tests.support.trainer_helpers.RecordingAdvantageModule"
TINY = {"policy": {"d_model": 16, "n_layers": 1, "n_heads": 2, "value_head": False},
        "ppo": {"prompts_per_step": 2, "n_samples": 4, "minibatches": 2, "epochs": 1},
        "task": {"name": "addition", "kwargs": {"max_operand": 9}}, "seed": 3}


def module(actor, task=None, **ppo):
    return PPOModule(actor=actor, **{**TINY, "ppo": {**TINY["ppo"], **ppo},
                                     "task": task or TINY["task"]})


REVERSE = {"name": "reverse", "kwargs": {"alphabet": "abcde", "min_len": 2, "max_len": 4}}


# ------------------------------------------------------------------ sum_pi_squared

def test_sum_pi_squared_comes_from_the_behaviour_logits_when_the_estimator_reads_it():
    model = module(recipe("optimal_token_baseline"))
    assert model.rollouts.keys.recipe_inputs == {"sum_pi_squared"}
    groups = model.rollout([0, 1], generator(3, "test"))
    batch, meta = model.make_batch(groups)
    logits, _ = model.policy(batch["input_ids"])
    # sum_v p_v^2 = exp(logsumexp(2 log p)), the next-token distribution at each position.
    want = torch.logsumexp(2 * torch.log_softmax(logits.float(), -1), -1).exp()
    next_real = torch.nn.functional.pad(batch["attention_mask"][:, 1:].float(), (0, 1))
    assert torch.allclose(batch["sum_pi_squared"], want * next_real, atol=1e-6)
    out = model.advantage(batch, meta)
    assert torch.isfinite(out["advantages"]).all()
    plain = module(recipe("grpo"))
    assert "sum_pi_squared" not in plain.make_batch(plain.rollout([0, 1], generator(3, "t")))[0]


def test_optimal_token_baseline_trains_through_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_ADV_RECORD", str(tmp_path))
    fit("grpo", tmp_path, f"--model.actor={CONFIGS / 'advantage' / 'optimal_token_baseline.yaml'}",
        RECORDER)
    recorded = torch.load(tmp_path / "rank0_call1.pt", weights_only=True)
    assert recorded["sum_pi_squared"].shape == recorded["advantages"].shape
    assert sorted(scalars(tmp_path / "grpo" / "version_0")["train/task_reward"]) == [0, 1]


# ------------------------------------------------------------------ greedy baseline (ReMax)

def greedy_by_hand(model, index):
    """Decode one response token by token, taking the most likely token, and score it."""
    runtime = model.runtime
    instance, prompt = runtime.instance(index)
    tokens, vocab = list(prompt), runtime.vocab
    for _ in range(model.max_new_tokens):
        logits, _ = model.policy(torch.tensor([tokens]))
        tokens.append(int(logits[0, -1].argmax()))
        if tokens[-1] == vocab.eos_id:
            break
    return float(runtime.task.reward(SimpleNamespace(
        response=vocab.decode(tokens[len(prompt):]), target=runtime.task.target(instance),
        instance=instance, truncated=tokens[-1] != vocab.eos_id)))


def test_greedy_baseline_is_the_reward_of_the_argmax_response_and_stays_out_of_the_update():
    model = module(recipe("remax"), task=REVERSE, greedy_baseline=True)
    assert "reward_baselines" in model.rollouts.keys.recipe_inputs
    g = torch.Generator().manual_seed(0)
    vocab = model.runtime.vocab
    with torch.no_grad():  # a policy whose greedy answers are letters that vary by prompt
        for p in model.policy.parameters():
            p.add_(torch.randn(p.shape, generator=g))
        model.policy.lm_head.bias[[vocab.eos_id, vocab.encode("=", "test")[0]]] = -1e9
    indices = [4, 9]
    baselines = model.rollouts.greedy_rewards(indices)
    assert baselines == [greedy_by_hand(model, i) for i in indices]
    # Partial credit: the greedy answers are not all worth the same.
    assert len(set(model.rollouts.greedy_rewards(list(range(40))))) > 1
    uncached = Rollout(model.policy, None, model.runtime,
                       dataclasses.replace(model.ppo_config, kv_cache=False))
    assert uncached.greedy_rewards(indices) == baselines
    groups = model.rollout(indices, generator(3, "test"))
    batch, meta = model.make_batch(groups, baselines)
    assert batch["reward_baselines"].tolist() == pytest.approx([baselines[0]] * 4 + [baselines[1]] * 4)
    assert batch["input_ids"].shape[0] == 8  # only the sampled responses are trained on
    out = model.advantage(batch, meta)
    rewards = torch.tensor([ep.reward for g in groups for ep in g])
    assert torch.allclose(out["rewards"], rewards - batch["reward_baselines"])


def test_remax_without_the_greedy_baseline_is_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        fit("grpo", tmp_path, f"--model.actor={CONFIGS / 'advantage' / 'remax.yaml'}")
    assert exit_info.value.code == 2
    assert "model.ppo.greedy_baseline: the advantage stages read the batch key " \
           "'reward_baselines'" in capsys.readouterr().err


def test_remax_trains_through_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_ADV_RECORD", str(tmp_path))
    fit("grpo", tmp_path, f"--model.actor={CONFIGS / 'advantage' / 'remax.yaml'}",
        "--model.ppo.greedy_baseline=true", RECORDER)
    recorded = torch.load(tmp_path / "rank0_call0.pt", weights_only=True)
    assert recorded["reward_baselines"].shape == (16,)
    logged = scalars(tmp_path / "grpo" / "version_0")
    assert sorted(logged["train/greedy_reward"]) == [0, 1]


def test_greedy_baseline_without_a_reader_warns():
    with pytest.warns(UserWarning, match="ppo.greedy_baseline: true, but no advantage stage reads"):
        module(recipe("grpo"), greedy_baseline=True)


# ------------------------------------------------------------------ dynamic sampling

def fake_groups(rewards_by_prompt):
    def sample(indices):
        return [[SimpleNamespace(index=i, reward=r) for r in rewards_by_prompt[i]] for i in indices]
    return sample


def drawer(order):
    """``draw(n)``: the next n prompts of ``order``; records each n."""
    asked = []

    def draw(n):
        asked.append(n)
        out = order[:n]
        del order[:n]
        return out
    return draw, asked


def test_sample_with_signal_refills_until_the_share_has_signal():
    rewards = {0: [1, 1], 1: [0, 1], 2: [0, 0], 3: [1, 1], 4: [0, 1], 5: [0, 2], 6: [3, 1],
               7: [2, 2]}
    draw, asked = drawer([2, 3, 4, 5, 6, 7])
    result = sample_with_signal([0, 1, 3, 7], fake_groups(rewards), draw, max_rounds=4)
    # Round 1 keeps 1 of 4: 3 missing at a keep rate of 1/4 -> at most the share, 4 prompts
    # (2, 3, 4, 5: two kept); round 3: 1 missing, kept 3 of 8 -> ceil(8/3) = 3 prompts.
    assert asked == [4, 3]
    assert [g[0].index for g in result.groups] == [1, 4, 5, 6]
    assert [g[0].index for g in result.first_round] == [0, 1, 3, 7]
    assert (result.rounds, result.sampled, result.filtered, result.short) == (3, 10, 6, False)
    assert result.filtered_fraction == 0.6


def test_sample_with_signal_trains_on_what_it_has_after_max_rounds():
    rewards = {0: [1, 1], 1: [0, 1], 2: [0, 0], 3: [1, 1]}
    draw, _ = drawer([2, 3])
    result = sample_with_signal([0, 1], fake_groups(rewards), draw, max_rounds=2)
    assert result.short and result.rounds == 2
    # The group with signal, topped up with the first filtered group.
    assert [g[0].index for g in result.groups] == [1, 0]
    assert [has_signal(g) for g in result.groups] == [True, False]


def groups_of(recorded, n_samples):
    rewards = recorded["rewards"].view(-1, n_samples)
    return [set(row.tolist()) for row in rewards]


def test_dynamic_sampling_trains_only_on_groups_with_signal_and_is_reproducible(tmp_path, monkeypatch):
    runs = []
    for name in ("a", "b"):
        record = tmp_path / name
        record.mkdir()
        monkeypatch.setenv("LIGHTNING_ADV_RECORD", str(record))
        fit("grpo", record, "--model.task.name=reverse",
            "--model.task.kwargs={alphabet: abcde, min_len: 2, max_len: 4}",
            "--model.ppo.dynamic_sampling={enabled: true, max_rounds: 4}", RECORDER)
        runs.append(record)
    for call in (0, 1):
        a, b = (torch.load(r / f"rank0_call{call}.pt", weights_only=True) for r in runs)
        for key in a:
            assert torch.equal(a[key], b[key]), (key, call)
        assert all(len(group) > 1 for group in groups_of(a, 4)), call
    logged = scalars(runs[0] / "grpo" / "version_0")
    for tag in ("train/dynamic_filtered_fraction", "train/dynamic_rounds"):
        assert sorted(logged[tag]) == [0, 1], tag
    assert all(1 <= v <= 4 for v in logged["train/dynamic_rounds"].values())
    assert all(0 <= v < 1 for v in logged["train/dynamic_filtered_fraction"].values())


def test_dynamic_sampling_needs_more_than_one_sample(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        fit("grpo", tmp_path, "--model.ppo.dynamic_sampling={enabled: true}",
            "--model.ppo.n_samples=1")
    assert exit_info.value.code == 2
    assert "model.ppo.dynamic_sampling.enabled" in capsys.readouterr().err


def test_dynamic_sampling_under_ddp_fills_each_ranks_share(tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    proc = ddp_fit(CONFIGS / "grpo_dynamic.yaml", tmp_path, record, *SMALL,
                   "--model.ppo.dynamic_sampling.max_rounds=8",
                   # the recorded rewards are then the task rewards (pass@k reshapes them)
                   "--model.actor.recipe=grpo")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for step in (0, 1):
        ranks = [torch.load(record / f"rank{r}_call{step}.pt", weights_only=True) for r in (0, 1)]
        # 4 prompts per step over 2 ranks: each rank trains on its 2 groups of 4 samples,
        # every one with differing rewards, and the ranks' groups differ.
        assert [r["rewards"].shape[0] for r in ranks] == [8, 8]
        for r in ranks:
            assert all(len(group) > 1 for group in groups_of(r, 4)), step
        assert not torch.equal(ranks[0]["rewards"], ranks[1]["rewards"])
    logged = scalars(tmp_path / "grpo_dynamic" / "version_0")
    assert sorted(logged["train/dynamic_rounds"]) == [0, 1]
    assert math.isfinite(logged["train/task_reward"][1])
