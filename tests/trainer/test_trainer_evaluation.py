"""Held-out evaluation: pass@k, the validate/test/predict subcommands, validation during
fit, and the sampled responses logged as text."""

import itertools
import json
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_adv.cli import main
from lightning_adv.trainer import TaskConfig
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.logs.evaluation import EvalConfig, EvalMetrics, held_out_loader, pass_at_k
from lightning_adv.trainer.policies.base import GenerationRequest, SamplingParams
from lightning_adv.trainer.rollout.batch import score
from lightning_adv.trainer.tasks.runtime import ReverseTask, Sample, TaskRuntime, Turn
from tests.support.cli_runs import CONFIGS, SMALL, fit, scalars
from tests.trainer.test_trainer import make_module


def brute_force_pass_at_k(outcomes, k):
    """The chance that k samples drawn without replacement hold a solution, by enumeration."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_hand_computed():
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - math.comb(3, 3) / math.comb(5, 3))
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(4, 1, 5)


@given(st.lists(st.booleans(), min_size=1, max_size=7), st.data())
def test_pass_at_k_is_the_subset_probability(outcomes, data):
    k = data.draw(st.integers(1, len(outcomes)))
    assert pass_at_k(len(outcomes), sum(outcomes), k) == pytest.approx(
        brute_force_pass_at_k(outcomes, k))


def test_eval_metrics_average_over_prompts():
    ep = lambda r: SimpleNamespace(reward=r)  # noqa: E731
    metrics = EvalMetrics([1, 2])
    metrics.update([[ep(1.0)], [ep(0.5)]], [[ep(1.0), ep(0.0)], [ep(0.0), ep(0.0)]], threshold=1.0)
    values = {name: float(m.compute()) for name, m in metrics.items()}
    assert values == {"reward_greedy": 0.75, "solved_greedy": 0.5, "reward_mean": 0.25,
                      "pass@1": 0.25, "pass@2": 0.5}


def test_held_out_prompts_are_outside_the_training_pool():
    config = EvalConfig(num_prompts=5, prompts_per_batch=2)
    val = [i for b in held_out_loader("val", 100, config) for i in b.tolist()]
    test = [i for b in held_out_loader("test", 100, config) for i in b.tolist()]
    assert val == list(range(100, 105)) and test == list(range(105, 110))


def test_greedy_decoding_ignores_the_generator():
    module = make_module()
    runtime = TaskRuntime(TaskConfig(name="reverse"))
    request = GenerationRequest([0, 1, 2], 1, 5, SamplingParams(greedy=True))
    runs = [module.policy.generate(runtime, request, generator(seed)) for seed in (0, 1)]
    assert [[ep.tokens for ep in g] for g in runs[0]] == [[ep.tokens for ep in g] for g in runs[1]]
    # Each generated token is the most likely one after its prefix.
    ep = runs[0][0][0]
    logits, _ = module.policy(torch.tensor([ep.tokens]))
    for t in range(1, len(ep.tokens)):
        if ep.generated[t]:
            assert int(logits[0, t - 1].argmax()) == ep.tokens[t]


def test_fit_validates_every_val_check_interval(tmp_path):
    fit("ppo", tmp_path, "--trainer.limit_train_batches=4", "--trainer.val_check_interval=2")
    logged = scalars(tmp_path / "ppo" / "version_0")
    for tag in ("val/reward_greedy", "val/solved_greedy", "val/reward_mean", "val/pass@1", "val/pass@4"):
        assert sorted(logged[tag]) == [1, 3], tag
    assert 0 <= logged["val/pass@1"][3] <= logged["val/pass@4"][3] <= 1


def test_validate_test_and_predict_subcommands(tmp_path):
    fit("ppo", tmp_path, "--trainer.limit_train_batches=1")
    ckpt = tmp_path / "ppo" / "version_0" / "checkpoints" / "last.ckpt"
    common = ["--config", str(CONFIGS / "ppo.yaml"), f"--trainer.logger.init_args.save_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--model.evaluation.num_prompts=8",
              f"--ckpt_path={ckpt}"]
    main(["validate", *common])
    main(["test", *common])
    main(["predict", *common])
    evaluations = tmp_path / "ppo" / "version_0" / "eval"  # inside the run they evaluate
    assert {"val/pass@1", "val/reward_greedy"} <= set(scalars(evaluations / "validate_0"))
    assert "test/pass@4" in scalars(evaluations / "test_0")
    lines = (evaluations / "predict_0" / "predictions.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 8 * (1 + 4)  # per prompt: the greedy response and 4 samples
    assert {r["prompt_index"] for r in records} == set(range(100_008, 100_016))  # the test set
    task = ReverseTask(alphabet="abcde", min_len=2, max_len=4)
    for r in records:
        instance = r["prompt"][:-1]
        sample = Sample(0, instance, r["prompt"], (Turn(r["response"], tuple(r["response"]), True),),
                        False, task.target(instance))
        assert r["reward"] == pytest.approx(task.reward(sample))


def test_sampled_responses_are_logged_as_text(tmp_path):
    fit("ppo", tmp_path, "--trainer.limit_train_batches=3", "--model.sample_log.every_n_steps=2",
        "--model.sample_log.count=2")
    events = EventAccumulator(str(tmp_path / "ppo" / "version_0"), size_guidance={"tensors": 0})
    events.Reload()
    tables = events.Tensors("train/samples/text_summary")
    assert [t.step for t in tables] == [0, 2]
    text = tables[0].tensor_proto.string_val[0].decode()
    rows = text.splitlines()
    assert rows[0] == "| prompt | response | reward |" and len(rows) == 2 + 2
    assert rows[2].startswith("| `") and rows[2].rstrip().endswith("|")
    assert "val/samples/text_summary" in events.Tags()["tensors"]


def test_val_check_interval_without_validation_warns(tmp_path):
    with pytest.warns(UserWarning, match="trainer.val_check_interval: validation is off"):
        fit("ppo", tmp_path, "--model.evaluation.num_prompts=0", "--trainer.val_check_interval=1")
