"""Prompt datasets from JSON lines, the shipped text tasks, and text reward functions.

``task.dataset: PATH`` trains on the prompts of a JSON-lines file: one object per line
with a ``prompt`` (a string, or a list of ``{"role", "content"}`` chat messages as in
TRL's conversational datasets) and any other fields the reward function reads
(``sample.instance`` is the line's object; a string ``answer`` is also
``sample.target``). The reward is a function named by dotted path in ``task.reward``,
``fn(sample, **task.reward_kwargs) -> float``; :func:`exact_match`,
:func:`number_match` and :func:`char_match` are built in.

The same dataset runs with the built-in policy (its character vocabulary is every
character of the file's strings) and with any Hugging Face tokenizer.

The shipped text tasks (:data:`TEXT_TASKS`) are the built-in ``reverse`` and
``addition`` tasks written as text, and ``sum`` (two-digit addition for a chat model, with
the start of the answer as a response prefix); ``scripts/make_text_dataset.py`` writes
their JSONL.
"""

from __future__ import annotations

import json
import random
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from lightning_adv.trainer.tasks.builtin import AdditionTask, ReverseTask
from lightning_adv.trainer.tasks.base import Sample, Task


def reverse_record(rng: random.Random, alphabet: str = "abcde", min_len: int = 2,
                   max_len: int = 4) -> dict[str, str]:
    """``{"prompt": "Reverse: cab", "answer": "bac"}``: the ``reverse`` task as text."""
    word = ReverseTask(alphabet, min_len, max_len).make_instance(rng)
    return {"prompt": f"Reverse: {word}", "answer": word[::-1]}


def addition_record(rng: random.Random, max_operand: int = 9) -> dict[str, str]:
    """``{"prompt": "3+5=", "answer": "8"}``: the ``addition`` task as text."""
    a, b = AdditionTask(max_operand).make_instance(rng)
    return {"prompt": f"{a}+{b}=", "answer": str(a + b)}


def sum_record(rng: random.Random, low: int = 10, high: int = 99) -> dict[str, Any]:
    """Two-number addition for a chat model: the question as a user message and the start
    of the answer as an assistant message the model continues (``"27 + 82 ="``), so the
    reply is the number; ``answer`` is the sum (``docs/guides/real-model.md``)."""
    a, b = rng.randint(low, high), rng.randint(low, high)
    return {"prompt": [{"role": "user", "content": f"What is {a} + {b}?"},
                       {"role": "assistant", "content": f"{a} + {b} ="}],
            "answer": str(a + b)}


#: name -> fn(rng) -> one JSONL record; ``scripts/make_text_dataset.py --task NAME``
TEXT_TASKS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "reverse": reverse_record, "addition": addition_record, "sum": sum_record}


def write_text_dataset(path: str | Path, task: str = "reverse", n: int = 2000,
                       seed: int = 0, distinct: bool = False) -> Path:
    """Write ``n`` records of a shipped text task to ``path`` (JSON lines, seeded);
    ``distinct``: no prompt twice, so the held-out lines at the end are prompts training
    never saw."""
    if task not in TEXT_TASKS:
        raise ValueError(f"task: expected one of {', '.join(TEXT_TASKS)}, got {task!r}")
    rng = random.Random(seed)
    records: list[str] = []
    seen: set[str] = set()
    for _ in range(100 * n):  # (a task with fewer distinct prompts than n stops here)
        if len(records) == n:
            break
        record = TEXT_TASKS[task](rng)
        prompt = json.dumps(record["prompt"])
        if not (distinct and prompt in seen):
            seen.add(prompt)
            records.append(json.dumps(record) + "\n")
    if len(records) < n:
        raise ValueError(f"n: task {task!r} has fewer than {n} distinct prompts")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(records))
    return path


# ---------------------------------------------------------------------- reward functions

_FIRST_INTEGER = re.compile(r"-?\d+")


def exact_match(sample: Sample, *, field: str = "answer", strip: bool = True) -> float:
    """1.0 when the response equals the record's ``field`` (both stripped), else 0.0."""
    response, answer = sample.response, str(sample.instance[field])
    if strip:
        response, answer = response.strip(), answer.strip()
    return float(response == answer)


def number_match(sample: Sample, *, field: str = "answer") -> float:
    """1.0 when the first integer of the response equals the record's ``field`` (an
    integer), else 0.0: exact correctness of a numeric answer, whatever follows it (no
    credit for the format)."""
    found = _FIRST_INTEGER.search(sample.response)
    return float(found is not None and int(found.group()) == int(str(sample.instance[field])))


def char_match(sample: Sample, *, field: str = "answer", strip: bool = True) -> float:
    """Partial credit: characters equal to the record's ``field`` at the same position,
    over the longer of the two (extra or missing characters cost too), as ``reverse``."""
    response, answer = sample.response, str(sample.instance[field])
    if strip:
        response, answer = response.strip(), answer.strip()
    if not response and not answer:
        return 1.0
    matches = sum(a == b for a, b in zip(response, answer))
    return matches / max(len(response), len(answer))


# ---------------------------------------------------------------------- datasets

def _check_messages(prompt: Any, where: str) -> None:
    if not prompt or not all(isinstance(m, Mapping) and isinstance(m.get("role"), str)
                             and isinstance(m.get("content"), str) for m in prompt):
        raise ValueError(f"{where}: 'prompt' must be a non-empty string or a non-empty list of "
                         f"{{\"role\": str, \"content\": str}} messages, got {prompt!r:.200}")


#: (file, its blank lines) already reported in this process
_BLANK_LINES_SAID: set[tuple[str, tuple[int, ...]]] = set()


def load_prompt_records(path: str | Path, key: str = "task.dataset") -> list[dict[str, Any]]:
    """The records of a JSON-lines prompt file, checked: every non-blank line is a JSON
    object with a usable ``prompt``. Errors name the key, the file and the line; blank
    lines are skipped with a warning naming them (record ``i`` is then not line ``i + 1``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{key}: no such file {str(path)!r}")
    records, blank = [], []
    with path.open() as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                blank.append(number)
                continue
            where = f"{key}: line {number} of {str(path)!r}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got "
                                 f"{type(record).__name__}")
            if "prompt" not in record:
                raise ValueError(f"{where}: has no 'prompt' field (fields: {sorted(record)})")
            prompt = record["prompt"]
            if not (isinstance(prompt, str) and prompt):
                if not isinstance(prompt, list):
                    raise ValueError(f"{where}: 'prompt' must be a non-empty string or a list "
                                     f"of chat messages, got {prompt!r:.200}")
                _check_messages(prompt, where)
            records.append(record)
    if not records:
        raise ValueError(f"{key}: {str(path)!r} holds no records")
    said = (str(Path(path).resolve()), tuple(blank))
    if blank and said not in _BLANK_LINES_SAID:  # the CLI reads a dataset twice: check, then run
        _BLANK_LINES_SAID.add(said)
        shown = ", ".join(map(str, blank[:10])) + (", ..." if len(blank) > 10 else "")
        warnings.warn(f"{key}: {str(path)!r} has {len(blank)} blank line(s) (line {shown}); they "
                      f"are skipped, so prompt i of the pool is the i-th non-blank line", stacklevel=2)
    return records


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def prompt_chars(prompt: str | Sequence[Mapping[str, str]]) -> int:
    return len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)


class DatasetTask(Task):
    """The prompts of a JSON-lines file (``task.dataset``), in file order: prompt ``i`` of
    the pool is record ``i``. Single turn; the reward is ``task.reward``.

    For the built-in policy the vocabulary is every character of the file's strings, and
    ``max_prompt_len`` its longest prompt. ``max_new_tokens`` (tokens per response)
    defaults to the longest ``answer`` plus one (for the EOS), or 32 without answers.
    """

    def __init__(self, path: str, max_new_tokens: Optional[int] = None):
        self.path = str(path)
        self.records = load_prompt_records(path)
        chars = {c for record in self.records for s in _strings(record) for c in s}
        self.symbols = "".join(sorted(chars))
        self.max_prompt_len = max(prompt_chars(r["prompt"]) for r in self.records)
        answers = [r.get("answer") for r in self.records]
        if max_new_tokens is None:
            max_new_tokens = (max(len(a) for a in answers) + 1
                              if all(isinstance(a, str) for a in answers) else 32)
        self.max_new_tokens = max_new_tokens

    @property
    def pool_size(self) -> Optional[int]:
        return len(self.records)

    def instance_at(self, index: int) -> dict[str, Any]:
        return self.records[index]

    def prompt(self, instance: dict[str, Any]) -> Any:
        return instance["prompt"]

    def target(self, instance: dict[str, Any]) -> Optional[str]:
        answer = instance.get("answer")
        return answer if isinstance(answer, str) else None

    def reward(self, sample: Sample) -> float:
        raise ValueError("task.reward: a dataset task (task.dataset) has no reward of its own; "
                         "name one by dotted path (lightning_adv.trainer.tasks.text.exact_match)")


__all__ = ["DatasetTask", "TEXT_TASKS", "char_match", "exact_match", "load_prompt_records",
           "write_text_dataset", "reverse_record", "addition_record"]
