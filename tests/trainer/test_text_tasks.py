"""Prompt datasets from JSON lines, the shipped text tasks and their reward functions."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from lightning_adv.trainer import PPOConfig, PPOModule, PolicyConfig, TaskConfig
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.logs.evaluation import EvalConfig
from lightning_adv.trainer.policies.base import GenerationRequest
from lightning_adv.trainer.rollout.batch import build_batch, score
from lightning_adv.trainer.tasks.runtime import Sample, TaskRuntime, Turn
from lightning_adv.exceptions import TaskError
from lightning_adv.trainer.tasks.text import (
    DatasetTask, char_match, exact_match, load_prompt_records, write_text_dataset)

REPO = Path(__file__).resolve().parents[2]
CHAR_MATCH = "lightning_adv.trainer.tasks.text.char_match"


def response(text, record):
    return Sample(index=0, instance=record, prompt=record["prompt"],
                  turns=(Turn(text, tuple(text), True),), truncated=False,
                  target=record.get("answer"))


def write(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return str(path)


def test_rewards_by_hand():
    record = {"prompt": "Reverse: abc", "answer": "cba"}
    assert exact_match(response(" cba\n", record)) == 1.0
    assert exact_match(response("cb", record)) == 0.0
    assert exact_match(response(" cba", record), strip=False) == 0.0
    assert char_match(response("cba", record)) == 1.0
    assert char_match(response("cxa", record)) == pytest.approx(2 / 3)
    assert char_match(response("cbaa", record)) == pytest.approx(3 / 4)  # extra letters cost
    assert char_match(response("", record)) == 0.0
    assert char_match(response("8", {"prompt": "3+5=", "n": 8}), field="n") == 1.0


def test_dataset_task_reads_records_in_order(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"prompt": "ab", "answer": "ba", "extra": 1}, "",
                                        {"prompt": "xyz!", "answer": "!zyx"}])
    task = DatasetTask(path)
    assert task.pool_size == 2 and task.instance_at(1)["answer"] == "!zyx"
    assert task.max_prompt_len == 4 and task.max_new_tokens == 5  # longest answer + EOS
    assert set(task.symbols) == set("abxyz!")
    runtime = TaskRuntime(TaskConfig(dataset=path, reward=CHAR_MATCH, num_prompts=10))
    assert runtime.num_prompts == 2  # at most the file's records
    instance, tokens = runtime.instance(1)
    assert instance["prompt"] == "xyz!" and runtime.vocab.decode(tokens) == "xyz!"
    assert tokens[0] == runtime.vocab.bos_id
    assert TaskRuntime(TaskConfig(dataset=path, reward=CHAR_MATCH, num_prompts=1)).num_prompts == 1
    assert DatasetTask(path, max_new_tokens=3).max_new_tokens == 3


@pytest.mark.parametrize("lines, message", [
    (['{"prompt": "a"}', '{"question": "b"}'], "line 2 of .* has no 'prompt' field"),
    (['{"prompt": "a"', ], "line 1 of .*: not valid JSON"),
    (['["prompt"]'], "line 1 of .*: expected a JSON object, got list"),
    (['{"prompt": ""}'], "line 1 .*'prompt' must be a non-empty string"),
    (['{"prompt": [{"role": "user"}]}'], "line 1 .*list of .*role.*content"),
    ([""], ".* holds no records"),
])
def test_bad_dataset_lines_are_named(tmp_path, lines, message):
    path = write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError, match="task.dataset: " + message):
        load_prompt_records(path)


def test_dataset_config_errors():
    with pytest.raises(ValueError, match="task.reward: a dataset task"):
        TaskConfig(dataset="d.jsonl")
    with pytest.raises(ValueError, match="task.name: task.dataset"):
        TaskConfig(dataset="d.jsonl", name="addition", reward=CHAR_MATCH)
    with pytest.raises(ValueError, match="task.dataset: no such file"):
        TaskRuntime(TaskConfig(dataset="/nonexistent.jsonl", reward=CHAR_MATCH))
    with pytest.raises(ValueError, match="task.chat_template"):
        TaskConfig(chat_template="yes")
    with pytest.raises(ValueError, match="task.stop_strings"):
        TaskConfig(stop_strings=[""])
    with pytest.raises(ValueError, match="task.chat_template: true, but the built-in"):
        TaskRuntime(TaskConfig(chat_template=True))


def test_chat_messages_need_a_chat_template(tmp_path):
    path = write(tmp_path / "m.jsonl", [{"prompt": [{"role": "user", "content": "hi"}]}])
    runtime = TaskRuntime(TaskConfig(dataset=path, reward=CHAR_MATCH))
    with pytest.raises(TaskError, match="chat messages needs a tokenizer with a chat template"):
        runtime.instance(0)


def test_dataset_task_trains_the_built_in_policy(tmp_path):
    path = write_text_dataset(tmp_path / "r.jsonl", "reverse", n=8, seed=1)
    task = TaskConfig(dataset=str(path), reward=CHAR_MATCH)
    runtime = TaskRuntime(task)
    groups = _policy(runtime).generate(runtime, GenerationRequest([0, 3], 2, 5), generator(0, "d"))
    score(groups, runtime)
    batch, _ = build_batch(groups, multi_turn=False, process_rewards=False)
    expected = [char_match(ep.sample) for g in groups for ep in g]
    assert batch["rewards"].tolist() == pytest.approx(expected)
    assert groups[1][0].sample.instance == load_prompt_records(path)[3]
    module = PPOModule(task=task, ppo=PPOConfig(prompts_per_step=2, n_samples=2, minibatches=1,
                                                epochs=1), policy=PolicyConfig(value_head=False),
                       evaluation=EvalConfig(num_prompts=2), seed=0)
    # the last 2 x evaluation.num_prompts lines are held out for validation and test
    assert module.runtime.num_prompts == 4 and len(module.runtime.vocab) == len(runtime.vocab)


def _policy(runtime):
    from lightning_adv.trainer.policies.tiny import TinyPolicy

    torch.manual_seed(0)
    width = runtime.task.max_episode_len(runtime.task.max_new_tokens)
    return TinyPolicy(PolicyConfig(d_model=16, n_heads=2), len(runtime.vocab), width)


def test_script_writes_the_shipped_dataset():
    shipped = REPO / "data" / "reverse_text.jsonl"
    proc = subprocess.run([sys.executable, "scripts/make_text_dataset.py", "--task", "reverse",
                           "--n", "2000", "--seed", "0", "--out", "/dev/stdout"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(shipped.read_text())
    records = load_prompt_records(shipped)
    assert len(records) == 2000
    assert all(r["answer"] == r["prompt"].removeprefix("Reverse: ")[::-1] for r in records)


def test_a_blank_line_in_a_dataset_is_reported_naming_it(tmp_path):
    path = write(tmp_path / "d.jsonl", [{"prompt": "ab"}, "", {"prompt": "cd"}, "  "])
    with pytest.warns(UserWarning, match=r"task.dataset: .* has 2 blank line\(s\) \(line 2, 4\); "
                                         r"they are skipped, so prompt i of the pool is the i-th "
                                         r"non-blank line"):
        records = load_prompt_records(path)
    assert [r["prompt"] for r in records] == ["ab", "cd"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the CLI reads the file twice (check, then run)
        assert load_prompt_records(path) == records


def test_number_match_scores_the_first_integer_of_the_response():
    from types import SimpleNamespace

    from lightning_adv.trainer.tasks.text import number_match

    def score(response, answer="109"):
        return number_match(SimpleNamespace(response=response, instance={"answer": answer}))

    assert [score(" 109"), score(" 109.\nSo the answer"), score("109 or 110")] == [1.0, 1.0, 1.0]
    assert [score(" 110"), score(" 1090"), score(" the sum"), score("")] == [0.0] * 4
    assert score(" -3", "-3") == 1.0 and score(" 3 then 109") == 0.0  # the first number only


def test_the_sum_dataset_is_the_scripts_output_with_distinct_prompts():
    shipped = REPO / "data" / "sum_chat.jsonl"
    proc = subprocess.run([sys.executable, "scripts/make_text_dataset.py", "--task", "sum",
                           "--n", "3000", "--seed", "0", "--distinct", "--out", "/dev/stdout"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(shipped.read_text())
    records = load_prompt_records(shipped)
    assert len(records) == 3000
    assert len({json.dumps(r["prompt"]) for r in records}) == 3000  # held-out lines unseen
    for r in records[:50]:
        (user, prefix), answer = r["prompt"], int(r["answer"])
        a, b = (int(x) for x in prefix["content"].removesuffix(" =").split(" + "))
        assert user == {"role": "user", "content": f"What is {a} + {b}?"}
        assert prefix["role"] == "assistant" and 10 <= a <= 99 and 10 <= b <= 99 and answer == a + b


def test_a_task_with_too_few_distinct_prompts_is_refused(tmp_path):
    from lightning_adv.trainer.tasks.text import write_text_dataset

    with pytest.raises(ValueError, match=r"^n: task 'addition' has fewer than 200 distinct"):
        write_text_dataset(tmp_path / "a.jsonl", "addition", n=200, distinct=True)
