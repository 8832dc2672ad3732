"""Built-in tasks: prompt pools with verifiable rewards, an environment, process scorers.

A :class:`Task` draws instances from a seeded ``random.Random``, renders each as a prompt
string over its own small alphabet, optionally answers between policy turns
(:meth:`Task.reply`), and scores a finished episode (:meth:`Task.reward`). Everything is
character-level: one symbol is one token. Nothing is downloaded.

Built-in tasks (``model.task.name``):

- ``reverse``: write the prompt's letters backwards; partial credit per position
  (single turn).
- ``addition``: ``a+b=`` -> the decimal sum; exact match (single turn).
- ``guess``: find a hidden number in ``0..n-1``; after each guess the environment answers
  ``<`` (smaller), ``>`` (larger) or ``?`` (not a guess) (multi-turn).

Process scorers (``model.prm.scorers[*].path``) are plain functions
``fn(sample, **kwargs) -> list[float]`` returning one value per generated token, or one
per policy turn (broadcast over the turn's tokens): :func:`position_match` (per token)
and :func:`guess_consistency` (per turn).
"""

from __future__ import annotations

import functools
import math
import numbers
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union

import torch

from lightning_adv._checks import check_int, is_int
from lightning_adv.config import check_json_kwargs
from lightning_adv.config.actor import UNSCORABLE_ACTIONS
from lightning_adv.dotted_path import is_dotted_path
from lightning_adv.dotted_path import check_signature, import_object, resolve_callable

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


class TaskError(ValueError):
    """A task, reward or scorer function returned something the trainer cannot use.

    The message names the config key and function, the prompt and the sample.
    """


class Vocab:
    """Character vocabulary: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, then one id per symbol."""

    specials = (PAD, BOS, EOS)

    def __init__(self, symbols: str):
        if len(set(symbols)) != len(symbols):
            raise ValueError(f"task symbols must be distinct characters, got {symbols!r}")
        self.symbols = symbols
        self.itos = list(self.specials) + list(symbols)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, where: str, error: type[Exception] = ValueError) -> list[int]:
        unknown = sorted({c for c in text if c not in self.stoi or c in self.specials})
        if unknown:
            raise error(f"{where}: characters {unknown} are not task symbols "
                             f"({self.symbols!r})")
        return [self.stoi[c] for c in text]

    def encode_prompt(self, prompt: Any, where: str, error: type[Exception] = ValueError
                      ) -> list[int]:
        """``<bos>`` and the prompt's symbols (a character vocabulary has no chat template)."""
        if not isinstance(prompt, str):
            raise error(f"{where}: a prompt of chat messages needs a tokenizer with a chat "
                        f"template (a Hugging Face policy, model.policy.pretrained); the built-in "
                        f"policy reads strings")
        return [self.bos_id] + self.encode(prompt, where, error)

    def encode_reply(self, text: str, ended_with: Optional[str], where: str,
                     error: type[Exception] = ValueError) -> list[int]:
        """The environment's reply, appended as its symbols."""
        return self.encode(text, where, error)

    @property
    def eos_ids(self) -> frozenset[int]:
        return frozenset((self.eos_id,))

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.itos[i] for i in ids if i >= len(self.specials))

    def token_text(self, i: int) -> str:
        return self.itos[i]


@dataclass(frozen=True)
class Turn:
    """One policy turn of an episode."""

    text: str
    """the generated symbols of the turn (without ``<eos>``)"""
    tokens: tuple[str, ...]
    """every generated token, ``<eos>`` included when the turn ended with it"""
    eos: bool
    """the turn ended with ``<eos>`` (else it hit the per-turn token limit or a stop string)"""
    reply: str = ""
    """the environment's answer after this turn ("" after the last turn)"""
    stop: Optional[str] = None
    """the stop string (``task.stop_strings``) that ended the turn, if one did"""

    @property
    def ended(self) -> bool:
        """The turn ended by itself (EOS or a stop string), not at the token limit."""
        return self.eos or self.stop is not None


@dataclass(frozen=True)
class Sample:
    """A finished episode, as reward functions and process scorers see it."""

    index: int
    """the prompt's index in the pool"""
    instance: Any
    """the task instance (hidden number, string to reverse, ...)"""
    prompt: str
    """the prompt text"""
    turns: tuple[Turn, ...]
    """the policy turns, in order (one for single-turn tasks)"""
    truncated: bool
    """the last turn stopped without ``<eos>``"""
    target: Optional[str] = None
    """the task's reference answer, when it has one"""

    @property
    def response(self) -> str:
        """All generated text, turns concatenated (the answer, for single-turn tasks)."""
        return "".join(t.text for t in self.turns)

    @property
    def num_tokens(self) -> int:
        return sum(len(t.tokens) for t in self.turns)


class Task:
    """A pool of prompts with a verifiable reward; subclass it for your own task.

    Subclasses set ``symbols`` (one character per token), ``max_prompt_len``,
    ``max_new_tokens`` (default tokens per policy turn) and, for multi-turn tasks,
    ``max_turns`` and ``max_reply_len``, and implement :meth:`make_instance`,
    :meth:`prompt` and :meth:`reward` (and :meth:`reply` for an environment).
    """

    symbols: str = ""
    max_prompt_len: int = 8
    max_new_tokens: int = 8
    max_turns: int = 1
    max_reply_len: int = 0

    @property
    def pool_size(self) -> Optional[int]:
        """Number of distinct prompts when the task is a fixed pool (a dataset; prompt ``i``
        is :meth:`instance_at`), None when instances are drawn (:meth:`make_instance`)."""
        return None

    def instance_at(self, index: int) -> Any:
        """Instance ``index`` of a fixed pool (tasks with a ``pool_size``)."""
        raise NotImplementedError

    @property
    def vocab(self) -> Vocab:
        if not hasattr(self, "_vocab"):
            self._vocab = Vocab(self.symbols)
        return self._vocab

    def make_instance(self, rng: random.Random) -> Any:
        """Draw one task instance."""
        raise NotImplementedError

    def prompt(self, instance: Any) -> str:
        """The prompt text of an instance (non-empty, task symbols only). With a Hugging
        Face tokenizer it is rendered through the chat template (``task.chat_template``);
        a list of ``{"role", "content"}`` messages is accepted there too."""
        raise NotImplementedError

    def target(self, instance: Any) -> Optional[str]:
        """The reference answer, when the task has one (used by scorers)."""
        return None

    def reply(self, instance: Any, turns: Sequence[Turn]) -> Optional[str]:
        """The environment's answer after the last of ``turns``, or None to end the episode."""
        return None

    def reward(self, sample: Sample) -> float:
        """The outcome reward of a finished episode (a finite float)."""
        raise NotImplementedError

    def max_episode_len(self, max_new_tokens: int) -> int:
        """Longest token sequence an episode can produce (``<bos>`` included)."""
        return (1 + self.max_prompt_len + self.max_turns * max_new_tokens
                + (self.max_turns - 1) * self.max_reply_len)


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


BUILTIN_TASKS: dict[str, type[Task]] = {
    "reverse": ReverseTask, "addition": AdditionTask, "guess": GuessTask}


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


# ---------------------------------------------------------------------- configuration

@dataclass(frozen=True)
class TaskConfig:
    """Which task to train on, its prompt pool and (optionally) a replacement reward."""

    name: str = "reverse"
    """built-in task (reverse, addition, guess) or dotted path of a Task subclass or factory"""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of the task constructor"""
    reward: Optional[str] = None
    """dotted path of fn(sample, **reward_kwargs) -> float replacing the task's own reward"""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of the reward function"""
    num_prompts: int = 100_000
    """prompts in the pool (one epoch: num_prompts / ppo.prompts_per_step steps); prompt i is
    drawn from (seed, i)"""
    seed: int = 0
    """seed of the prompt pool (independent of the training seed)"""
    dataset: Optional[str] = None
    """JSON-lines prompt file (a 'prompt' per line plus the fields the reward reads); replaces
    task.name and needs task.reward; the pool is its lines, in order (at most num_prompts)"""
    chat_template: Union[bool, Literal["auto"]] = "auto"
    """render prompts (and environment replies, as messages) through the tokenizer's chat
    template: auto (when it has one), true (it must have one) or false (plain text)"""
    stop_strings: list[str] = field(default_factory=list)
    """a policy turn also ends when its text contains one of these (kept in the text)"""

    def __post_init__(self) -> None:
        if self.dataset is not None:
            if not isinstance(self.dataset, str) or not self.dataset:
                raise ValueError(f"task.dataset: expected null or the path of a JSON-lines "
                                 f"file, got {self.dataset!r}")
            if self.name not in ("reverse", "dataset"):
                raise ValueError(f"task.name: task.dataset ({self.dataset!r}) is the task; leave "
                                 f"task.name unset, got {self.name!r}")
            if self.reward is None:
                raise ValueError("task.reward: a dataset task (task.dataset) needs a reward "
                                 "function by dotted path, e.g. "
                                 "lightning_adv.trainer.text_tasks.exact_match")
        if self.chat_template not in ("auto", True, False):
            raise ValueError(f"task.chat_template: expected auto, true or false, got "
                             f"{self.chat_template!r}")
        if not (isinstance(self.stop_strings, list)
                and all(isinstance(s, str) and s for s in self.stop_strings)):
            raise ValueError(f"task.stop_strings: expected a list of non-empty strings, got "
                             f"{self.stop_strings!r}")
        if not isinstance(self.name, str) or not (self.name in BUILTIN_TASKS
                                                   or is_dotted_path(self.name)
                                                   or self.dataset is not None):
            raise ValueError(f"task.name: expected one of {', '.join(BUILTIN_TASKS)} or a dotted "
                             f"path (my_pkg.tasks.MyTask), got {self.name!r}")
        check_json_kwargs("task.kwargs", self.kwargs)
        if self.reward is not None and (not isinstance(self.reward, str)
                                        or not is_dotted_path(self.reward)):
            raise ValueError(f"task.reward: expected null or a dotted function path "
                             f"(my_pkg.rewards.exact_match), got {self.reward!r}")
        check_json_kwargs("task.reward_kwargs", self.reward_kwargs)
        if self.reward is None and self.reward_kwargs:
            raise ValueError(f"task.reward_kwargs: given ({sorted(self.reward_kwargs)}) but "
                             f"task.reward is null; the built-in reward takes no kwargs")
        for name in ("num_prompts", "seed"):
            check_int(f"task.{name}", getattr(self, name), minimum=int(name == "num_prompts"))


class TaskRuntime:
    """A built task plus its checked reward function: what the trainer talks to.

    Every call into user code (instances, prompts, replies, rewards) is checked here, and
    errors name the config key and the function.

    ``tokenizer`` turns prompts and replies into tokens: the task's own character
    :class:`Vocab` by default, or a Hugging Face tokenizer's adapter
    (:class:`~lightning_adv.trainer.hf_tokenizer.HFTokenizer`). With ``context_window``
    every prompt is checked to leave room for ``episode_budget`` more tokens.
    """

    def __init__(self, config: TaskConfig, tokenizer: Any = None,
                 context_window: Optional[int] = None, episode_budget: int = 0,
                 unscorable_rewards: str = "error"):
        if unscorable_rewards not in UNSCORABLE_ACTIONS:
            raise ValueError(f"actor.unscorable_rewards: expected one of "
                             f"{', '.join(UNSCORABLE_ACTIONS)}, got {unscorable_rewards!r}")
        self.config = config
        self.unscorable_rewards = unscorable_rewards
        """``actor.unscorable_rewards``: under ``exclude`` a reward function may return None
        or NaN for a response it cannot score (:meth:`reward` gives NaN)"""
        self.where = (f"task.dataset {config.dataset!r}" if config.dataset is not None
                      else f"task.name {config.name!r}")
        self.task = build_task(config)
        self.vocab = tokenizer if tokenizer is not None else self.task.vocab
        if tokenizer is None and config.chat_template is True:
            raise ValueError("task.chat_template: true, but the built-in policy's character "
                             "vocabulary has no chat template (use auto or false, or a Hugging "
                             "Face policy: model.policy.pretrained)")
        self.context_window = context_window
        self.episode_budget = episode_budget
        self._instances: dict[int, tuple[Any, list[int]]] = {}
        self._replies: dict[tuple[str, Optional[str]], tuple[int, ...]] = {}
        if self.task.max_turns > 1 and hasattr(self.vocab, "check_replies"):
            self.vocab.check_replies()  # the chat template can append replies as messages
        if config.reward is not None:
            fn = resolve_callable(config.reward, config.reward_kwargs, "task.reward")
            self.reward_where = f"task.reward {config.reward!r}"
            self._reward: Callable[[Sample], Any] = lambda s: fn(s, **config.reward_kwargs)
        else:
            self.reward_where = f"{self.where} reward"
            self._reward = self.task.reward

    @property
    def num_prompts(self) -> int:
        """Prompts in the pool: ``task.num_prompts``, at most a dataset's records."""
        pool = self.task.pool_size
        return self.config.num_prompts if pool is None else min(pool, self.config.num_prompts)

    def prompt_text(self, index: int) -> Any:
        """The task's prompt of instance ``index`` (before any chat template)."""
        return self.task.prompt(self.instance(index)[0])

    def instance(self, index: int) -> tuple[Any, list[int]]:
        """Instance ``index`` of the pool and its prompt tokens (``<bos>`` first, or the
        tokenizer's rendering).

        Made once per index and kept (seeding a string-seeded ``random.Random`` costs about
        a millisecond): tasks must treat their instances as read-only."""
        if index not in self._instances:
            self._instances[index] = self._make_instance(index)
        instance, tokens = self._instances[index]
        return instance, list(tokens)

    def _make_instance(self, index: int) -> tuple[Any, list[int]]:
        if self.task.pool_size is not None:
            instance = self.task.instance_at(index)
        else:
            instance = self.task.make_instance(random.Random(f"{self.config.seed}:{index}"))
        text = self.task.prompt(instance)
        where = f"{self.where}: prompt of instance {index}"
        if not (isinstance(text, (str, list)) and text):
            raise TaskError(f"{where}: expected a non-empty string, got {text!r}")
        if isinstance(text, str) and len(text) > self.task.max_prompt_len:
            raise TaskError(f"{where}: {len(text)} symbols exceed the task's max_prompt_len "
                            f"({self.task.max_prompt_len})")
        tokens = self.vocab.encode_prompt(text, where, TaskError)
        window = self.context_window
        if window is not None and len(tokens) + self.episode_budget > window:
            raise TaskError(f"{where}: {len(tokens)} prompt tokens + up to {self.episode_budget} "
                            f"tokens of the episode (ppo.max_new_tokens x turns, and replies) "
                            f"exceed the model's context window of {window} tokens "
                            f"(model.policy.pretrained); shorten the prompt or lower "
                            f"ppo.max_new_tokens")
        return instance, tokens

    def check_prompts(self, limit: Optional[int] = None) -> None:
        """Build (and so check) the first ``limit`` prompts of the pool (all with None):
        before training, so a bad dataset line or an over-long prompt stops the run early."""
        count = self.num_prompts if limit is None else min(limit, self.num_prompts)
        for index in range(count):
            self.instance(index)

    def reply(self, instance: Any, turns: Sequence[Turn], index: int) -> Optional[list[int]]:
        """The environment's reply tokens after the last of ``turns`` (None: episode over)."""
        answer = self.reply_with_text(instance, turns, index)
        return None if answer is None else answer[1]

    def reply_with_text(self, instance: Any, turns: Sequence[Turn], index: int
                        ) -> Optional[tuple[str, list[int]]]:
        """The reply's text and its tokens, checked."""
        text = self.task.reply(instance, turns)
        if text is None:
            return None
        last = turns[-1]
        ended_with = last.tokens[-1] if last.eos and last.tokens else None
        # A task answers with a few distinct texts: each is checked and encoded once.
        known = self._replies.get((text, ended_with)) if type(text) is str else None
        if known is not None:
            return text, list(known)
        where = f"{self.where}: environment reply after turn {len(turns) - 1} of instance {index}"
        if not isinstance(text, str) or not text:
            raise TaskError(f"{where}: expected a non-empty string (or None to end the episode), "
                             f"got {text!r}")
        if len(text) > self.task.max_reply_len:
            raise TaskError(f"{where}: {len(text)} symbols exceed the task's max_reply_len "
                             f"({self.task.max_reply_len})")
        tokens = self.vocab.encode_reply(text, ended_with, where, TaskError)
        if type(text) is str:
            self._replies[(text, ended_with)] = tuple(tokens)
        return text, tokens

    def reward(self, sample: Sample, sample_no: int) -> float:
        """The checked outcome reward of ``sample``. A reward function returns None (or NaN)
        for a response it cannot score (a verifier that timed out, an answer it cannot
        parse): NaN under ``actor.unscorable_rewards: exclude`` (the advantage module leaves
        the row out, advantage 0), else an error naming the function and the row."""
        value = self._reward(sample)
        what = f"prompt {sample.index}, sample {sample_no} (response {sample.response!r})"
        if is_unscorable(value):
            if self.unscorable_rewards == "exclude":
                return math.nan
            got = "is None" if value is None else "must be finite, got nan"
            raise TaskError(f"{self.reward_where}: reward for {what} {got}, i.e. the function "
                            f"could not score the response; return a float, or set "
                            f"actor.unscorable_rewards: exclude to train without such responses "
                            f"(advantage 0, left out of every reward statistic)")
        return checked_user_number(value, f"{self.reward_where}", what, "reward")


def is_unscorable(value: Any) -> bool:
    """A reward function's "could not score": None, a float NaN or a one-element NaN tensor
    (infinities are not: they are a bug, refused by :func:`checked_user_number`)."""
    if value is None:
        return True
    if isinstance(value, torch.Tensor):
        return (value.numel() == 1 and value.is_floating_point()
                and bool(torch.isnan(value).all()))
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isnan(float(value)))


def checked_user_number(value: Any, where: str, what: str, field_name: str) -> float:
    """A finite real number from user code (0-d tensors accepted; bools are refused)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            raise TaskError(f"{where}: {field_name} for {what} must be one real number, got a "
                             f"tensor of shape {list(value.shape)} and dtype {value.dtype}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = " (convert booleans with float())" if isinstance(value, bool) else ""
        raise TaskError(f"{where}: {field_name} for {what} must be a float, got "
                         f"{type(value).__name__} {value!r}{hint}")
    value = float(value)
    if not math.isfinite(value):
        raise TaskError(f"{where}: {field_name} for {what} must be finite, got {value}")
    return value


def build_task(config: TaskConfig) -> Task:
    """Construct the configured task; errors name ``task.name`` / ``task.kwargs``."""
    if config.dataset is not None:
        from lightning_adv.trainer.text_tasks import DatasetTask

        factory: Any = functools.partial(DatasetTask, config.dataset)
        check_signature(factory, config.kwargs, "task.kwargs", "DatasetTask", positional=0)
        return factory(**config.kwargs)  # its errors name task.dataset and the line
    if config.name in BUILTIN_TASKS:
        factory = BUILTIN_TASKS[config.name]
    else:
        factory = import_object(config.name, "task.name")
        if not callable(factory):
            raise ValueError(f"task.name: {config.name!r} is a {type(factory).__name__}, not a "
                             f"Task class or factory")
    check_signature(factory, config.kwargs, "task.kwargs", config.name, positional=0)
    try:
        task = factory(**config.kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"task.kwargs: {config.name!r} rejected {dict(config.kwargs)!r}: "
                         f"{exc}") from None
    if not isinstance(task, Task):
        raise ValueError(f"task.name: {config.name!r} returned a {type(task).__name__}, expected "
                         f"a lightning_adv.trainer.tasks.Task")
    for name in ("max_prompt_len", "max_new_tokens", "max_turns"):
        value = getattr(task, name)
        check_int(f"task.name {config.name!r}: Task.{name}", value)
    if task.max_turns > 1 and task.max_reply_len < 1:
        raise ValueError(f"task.name {config.name!r}: a multi-turn task needs max_reply_len >= 1")
    try:
        task.vocab  # noqa: B018 -- builds the vocabulary, checking the symbols
    except ValueError as exc:
        raise ValueError(f"task.name {config.name!r}: {exc}") from None
    return task


__all__ = [
    "Vocab", "Turn", "Sample", "Task", "ReverseTask", "AdditionTask", "GuessTask",
    "BUILTIN_TASKS", "position_match", "guess_consistency", "TaskConfig", "TaskRuntime",
    "build_task", "checked_user_number", "is_unscorable", "PAD", "BOS", "EOS",
]
