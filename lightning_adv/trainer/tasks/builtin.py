"""The built-in tasks (``model.task.name``) and the built-in process scorers.

- ``reverse``: write the prompt's letters backwards; partial credit per position
  (single turn).
- ``addition``: ``a+b=`` -> the decimal sum; exact match (single turn).
- ``guess``: find a hidden number in ``0..n-1``; after each guess the environment answers
  ``<`` (smaller), ``>`` (larger) or ``?`` (not a guess) (multi-turn).
- ``calculator``: ``a*b`` -> the product, with a calculator tool: a turn starting with
  ``=`` calls it and the environment replies with the result; a call has a per-turn
  reward (multi-turn, tool use).

Process scorers (``model.prm.scorers[*].path``) are plain functions
``fn(sample, **kwargs) -> list[float]`` returning one value per generated token, or one
per policy turn (broadcast over the turn's tokens): :func:`position_match` (per token)
and :func:`guess_consistency` (per turn).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Optional

from lightning_adv.trainer.tasks.base import EOS, Sample, Task, Turn
from lightning_adv.exceptions import TaskError
from lightning_adv._checks import check_int, is_int


class ReverseTask(Task):
    """Write the prompt's letters in reverse order: ``cab=`` -> ``bac``.

    Partial credit: matching positions over ``max(len(target), len(response))``, so extra
    or missing letters cost too; ``partial_credit=false`` gives 1 for an exact match only.
    """

    def __init__(self, alphabet: str = "abcde", min_len: int = 2, max_len: int = 4,
                 partial_credit: bool = True):
        if not alphabet or "=" in alphabet:
            raise ValueError(f"alphabet: expected non-empty letters without '=', got {alphabet!r}")
        if not (is_int(min_len, minimum=1) and is_int(max_len, minimum=min_len)):
            raise ValueError(f"min_len, max_len: expected 1 <= min_len <= max_len, "
                             f"got {min_len!r}, {max_len!r}")
        self.alphabet, self.min_len, self.max_len = alphabet, min_len, max_len
        self.partial_credit = bool(partial_credit)
        self.symbols = alphabet + "="
        self.max_prompt_len = max_len + 1
        self.max_new_tokens = max_len + 1

    def make_instance(self, rng: random.Random) -> str:
        n = rng.randint(self.min_len, self.max_len)
        return "".join(rng.choice(self.alphabet) for _ in range(n))

    def prompt(self, instance: str) -> str:
        return instance + "="

    def target(self, instance: str) -> str:
        return instance[::-1]

    def reward(self, sample: Sample) -> float:
        target, response = sample.target, sample.response
        if not self.partial_credit:
            return float(response == target)
        matches = sum(a == b for a, b in zip(response, target))
        return matches / max(len(target), len(response))


class AdditionTask(Task):
    """``a+b=`` -> the decimal sum, exact match (1 or 0), operands in ``0..max_operand``."""

    symbols = "0123456789+="

    def __init__(self, max_operand: int = 9):
        check_int("max_operand", max_operand)
        self.max_operand = max_operand
        digits = len(str(max_operand))
        self.max_prompt_len = 2 * digits + 2
        self.max_new_tokens = len(str(2 * max_operand)) + 1

    def make_instance(self, rng: random.Random) -> tuple[int, int]:
        return rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)

    def prompt(self, instance: tuple[int, int]) -> str:
        return f"{instance[0]}+{instance[1]}="

    def target(self, instance: tuple[int, int]) -> str:
        return str(sum(instance))

    def reward(self, sample: Sample) -> float:
        return float(sample.response == sample.target)


class GuessTask(Task):
    """Find a hidden number in ``0..n-1`` in at most ``max_turns`` guesses.

    The prompt is ``G``. Each policy turn is a guess: its first symbol, if it is a digit
    below ``n``. The environment answers ``<`` (the number is smaller), ``>`` (larger)
    or ``?`` (the turn is not a guess); a right guess ends the episode. Reward:
    ``1 - turn_penalty * (k - 1)`` for a right guess at turn ``k``, else 0, so binary
    search (which always succeeds for ``n <= 2**max_turns - 1``) beats guessing.
    """

    def __init__(self, n: int = 8, max_turns: int = 4, turn_penalty: float = 0.1):
        check_int("n", n, minimum=2, maximum=10)
        check_int("max_turns", max_turns)
        if not (isinstance(turn_penalty, (int, float)) and 0 <= turn_penalty * (max_turns - 1) < 1):
            raise ValueError(f"turn_penalty: expected a number >= 0 with turn_penalty * "
                             f"(max_turns - 1) < 1, got {turn_penalty!r}")
        self.n, self.max_turns, self.turn_penalty = n, max_turns, float(turn_penalty)
        self.symbols = "".join(str(i) for i in range(n)) + "<>?G"
        self.max_prompt_len = 1
        self.max_new_tokens = 2
        self.max_reply_len = 1

    def make_instance(self, rng: random.Random) -> int:
        return rng.randrange(self.n)

    def prompt(self, instance: int) -> str:
        return "G"

    def guess(self, turn: Turn) -> Optional[int]:
        """The turn's guess, or None when its first symbol is not a digit below n."""
        first = turn.text[:1]
        return int(first) if first.isdigit() and int(first) < self.n else None

    def reply(self, instance: int, turns: Sequence[Turn]) -> Optional[str]:
        guess = self.guess(turns[-1])
        if guess is None:
            return "?"
        if guess == instance:
            return None
        return "<" if instance < guess else ">"

    def reward(self, sample: Sample) -> float:
        for k, turn in enumerate(sample.turns):
            if self.guess(turn) == sample.instance:
                return 1.0 - self.turn_penalty * k
        return 0.0


class CalculatorTask(Task):
    """``a*b`` (or ``a+b``) -> the result, with a calculator as the environment.

    The prompt is the expression. A policy turn that starts with ``=`` calls the
    calculator: the environment replies with the result's digits (loss mask 0, as any
    tool output), and the episode goes on. Any other turn is the answer and ends the
    episode; so is the last allowed turn (``max_turns``), whatever it starts with. Reward:
    the answer's digits that match the result at their position, over the longer of the
    two (1 for an exact answer; ``partial_credit=false``: 1 or 0); 0 without an answer.
    Per-turn rewards (:meth:`Task.turn_rewards`): ``call_reward`` for each call (negative:
    a tool's price; positive: a bonus that gets a small policy to try the tool), 0 for
    the answer. The policy decides how many turns to take: answer at once (hard: the
    operands go up to ``max_operand``), or call and copy the reply.
    """

    def __init__(self, max_operand: int = 99, op: str = "*", max_turns: int = 3,
                 call_reward: float = -0.05, partial_credit: bool = True):
        check_int("max_operand", max_operand)
        check_int("max_turns", max_turns, minimum=2)
        if op not in ("*", "+"):
            raise ValueError(f"op: expected '*' or '+', got {op!r}")
        if isinstance(call_reward, bool) or not isinstance(call_reward, (int, float)) \
                or not -1 < call_reward < 1:
            raise ValueError(f"call_reward: expected a number in (-1, 1), got {call_reward!r}")
        self.max_operand, self.op, self.max_turns = max_operand, op, max_turns
        self.call_reward, self.partial_credit = float(call_reward), bool(partial_credit)
        self.symbols = "0123456789=" + op
        digits = len(str(max_operand))
        result = len(str(self.evaluate(max_operand, max_operand)))
        self.max_prompt_len = 2 * digits + 1
        self.max_new_tokens = result + 1
        self.max_reply_len = result

    def evaluate(self, a: int, b: int) -> int:
        return a * b if self.op == "*" else a + b

    def make_instance(self, rng: random.Random) -> tuple[int, int]:
        return rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)

    def prompt(self, instance: tuple[int, int]) -> str:
        return f"{instance[0]}{self.op}{instance[1]}"

    def target(self, instance: tuple[int, int]) -> str:
        return str(self.evaluate(*instance))

    def calls(self, turns: Sequence[Turn]) -> list[bool]:
        """Which turns call the calculator: those starting with ``=``, but the last
        allowed turn (it answers)."""
        return [t.text.startswith("=") and k < self.max_turns - 1 for k, t in enumerate(turns)]

    def reply(self, instance: tuple[int, int], turns: Sequence[Turn]) -> Optional[str]:
        return self.target(instance) if self.calls(turns)[-1] else None

    def reward(self, sample: Sample) -> float:
        answers = [t.text for t, call in zip(sample.turns, self.calls(sample.turns)) if not call]
        if not answers:
            return 0.0
        answer, target = answers[-1], sample.target
        if not self.partial_credit:
            return float(answer == target)
        matches = sum(a == b for a, b in zip(answer, target))
        return matches / max(len(target), len(answer))

    def turn_rewards(self, sample: Sample) -> list[float]:
        return [self.call_reward if call else 0.0 for call in self.calls(sample.turns)]


BUILTIN_TASKS: dict[str, type[Task]] = {
    "reverse": ReverseTask, "addition": AdditionTask, "guess": GuessTask,
    "calculator": CalculatorTask}


# ---------------------------------------------------------------------- process scorers

def position_match(sample: Sample, *, penalty: float = 1.0, bonus: float = 0.0) -> list[float]:
    """Per token: ``bonus`` where the token matches the reference answer (then ``<eos>``)
    at its position, ``-penalty`` where it does not. Needs a task with a reference
    answer (``reverse``, ``addition``)."""
    if sample.target is None:
        raise TaskError("position_match: the task has no reference answer (Task.target); use it "
                        "with reverse, addition or a task that defines target()")
    expected = list(sample.target) + [EOS]
    tokens = [tok for turn in sample.turns for tok in turn.tokens]
    return [bonus if i < len(expected) and tok == expected[i] else -penalty
            for i, tok in enumerate(tokens)]


def guess_consistency(sample: Sample, *, penalty: float = 1.0) -> list[float]:
    """Per turn of the ``guess`` task: ``-penalty`` for a turn that is not a guess, or whose
    guess contradicts an earlier answer (outside the interval still possible); 0 else."""
    lo, hi = 0, math.inf
    scores = []
    for turn in sample.turns:
        guess = _guess_of(turn)
        ok = guess is not None and lo <= guess < hi
        scores.append(0.0 if ok else -penalty)
        if guess is not None and turn.reply == "<":
            hi = min(hi, guess)
        elif guess is not None and turn.reply == ">":
            lo = max(lo, guess + 1)
    return scores


def _guess_of(turn: Turn) -> Optional[int]:
    first = turn.text[:1]
    return int(first) if first.isdigit() else None
