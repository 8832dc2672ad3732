"""A configured task at run time: :class:`TaskConfig`, :func:`build_task` and
:class:`TaskRuntime`, which checks every call into task, reward and scorer code.

``model.task`` names a built-in task (:mod:`~lightning_adv.trainer.tasks.builtin`), a
``Task`` subclass or factory by dotted path (:mod:`~lightning_adv.trainer.tasks.base`), or
a JSON-lines prompt dataset (:mod:`~lightning_adv.trainer.tasks.text`). This module is
also where a task's names are imported from by dotted path
(``lightning_adv.trainer.tasks.position_match``, ``lightning_adv.trainer.tasks.Task``).
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

from lightning_adv._checks import check_int
from lightning_adv.config import check_json_kwargs
from lightning_adv.config.actor import UNSCORABLE_ACTIONS
from lightning_adv.dotted_path import is_dotted_path
from lightning_adv.dotted_path import check_signature, import_object, resolve_callable
from lightning_adv.trainer.tasks.builtin import (
    BUILTIN_TASKS, AdditionTask, CalculatorTask, GuessTask, ReverseTask, guess_consistency,
    position_match)
from lightning_adv.trainer.tasks.base import BOS, EOS, PAD, Sample, Task, Turn, Vocab
from lightning_adv.exceptions import TaskError
from lightning_adv.trainer.tasks.text import DatasetTask



#: the training pool of a drawn task whose task.num_prompts is null
DRAWN_PROMPTS = 100_000

# ---------------------------------------------------------------------- configuration

@dataclass(frozen=True)
class TaskConfig:
    """Which task to train on, its prompt pool and (optionally) a replacement reward."""

    name: str = "reverse"
    """built-in task (reverse, addition, guess, calculator) or dotted path of a Task subclass
    or factory"""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of the task constructor"""
    reward: Optional[str] = None
    """dotted path of fn(sample, **reward_kwargs) -> float replacing the task's own reward"""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of the reward function"""
    num_prompts: Optional[int] = None
    """prompts in the training pool (one epoch: num_prompts / ppo.prompts_per_step steps);
    prompt i is drawn from (seed, i). null: 100000 drawn prompts, or a dataset's lines but
    the last 2 x evaluation.num_prompts, which it holds out for evaluation"""
    seed: int = 0
    """seed of the prompt pool (independent of the training seed)"""
    dataset: Optional[str] = None
    """JSON-lines prompt file (a 'prompt' per line plus the fields the reward reads); replaces
    task.name and needs task.reward; the training pool is its first num_prompts lines, the
    evaluation sets the lines after them"""
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
                                 "lightning_adv.trainer.tasks.text.exact_match")
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
        if self.num_prompts is not None:
            check_int("task.num_prompts", self.num_prompts)
        check_int("task.seed", self.seed, minimum=0)


class TaskRuntime:
    """A built task plus its checked reward function: what the trainer talks to.

    Every call into user code (instances, prompts, replies, rewards) is checked here, and
    errors name the config key and the function.

    ``tokenizer`` turns prompts and replies into tokens: the task's own character
    :class:`Vocab` by default, or a Hugging Face tokenizer's adapter
    (:class:`~lightning_adv.trainer.policies.hf.tokenizer.HFTokenizer`). With ``context_window``
    every prompt is checked to leave room for ``episode_budget`` more tokens.
    """

    def __init__(self, config: TaskConfig, tokenizer: Any = None,
                 context_window: Optional[int] = None, episode_budget: int = 0,
                 unscorable_rewards: str = "error", held_out: int = 0):
        if unscorable_rewards not in UNSCORABLE_ACTIONS:
            raise ValueError(f"actor.unscorable_rewards: expected one of "
                             f"{', '.join(UNSCORABLE_ACTIONS)}, got {unscorable_rewards!r}")
        self.config = config
        self.held_out = held_out
        """the last lines a dataset keeps for evaluation when ``task.num_prompts`` is null"""
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
        """Prompts in the training pool: ``task.num_prompts`` (at most a dataset's records),
        by default 100000 drawn ones or a dataset's records but the ``held_out`` last."""
        pool, wanted = self.task.pool_size, self.config.num_prompts
        if pool is None:
            return DRAWN_PROMPTS if wanted is None else wanted
        return max(pool - self.held_out, 0) if wanted is None else min(pool, wanted)

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


    def turn_rewards(self, sample: Sample, sample_no: int) -> Optional[list[float]]:
        """The task's checked per-turn rewards of ``sample`` (one finite float per turn),
        or None when it gives none."""
        values = self.task.turn_rewards(sample)
        if values is None:
            return None
        where = f"{self.where} turn_rewards"
        what = f"prompt {sample.index}, sample {sample_no} (response {sample.response!r})"
        if isinstance(values, torch.Tensor):
            values = values.flatten().tolist()
        if not isinstance(values, Sequence) or isinstance(values, str) \
                or len(values) != len(sample.turns):
            got = len(values) if isinstance(values, Sequence) and not isinstance(values, str) \
                else type(values).__name__
            raise TaskError(f"{where}: expected one value per policy turn "
                            f"({len(sample.turns)}) for {what}, got {got}")
        return [checked_user_number(v, where, what, f"reward of turn {i}")
                for i, v in enumerate(values)]


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
    "Vocab", "Turn", "Sample", "Task", "ReverseTask", "AdditionTask", "GuessTask", "CalculatorTask",
    "BUILTIN_TASKS", "position_match", "guess_consistency", "TaskConfig", "TaskRuntime",
    "build_task", "checked_user_number", "is_unscorable", "PAD", "BOS", "EOS",
]
