"""The task interface: the :class:`Task` base class and what its functions see.

A :class:`Task` draws instances from a seeded ``random.Random``, renders each as a prompt
string over its own small alphabet, optionally answers between policy turns
(:meth:`Task.reply`), and scores a finished episode (:meth:`Task.reward`), which it sees
as a :class:`Sample` of :class:`Turn` s. With the built-in policy everything is
character-level: one symbol is one token (:class:`Vocab`).

The built-in tasks are in :mod:`~lightning_adv.trainer.tasks.builtin`, prompt datasets in
:mod:`~lightning_adv.trainer.tasks.text`, and the runtime that builds and checks a
configured task in :mod:`~lightning_adv.trainer.tasks`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


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
        """Generated tokens over all turns, ``<eos>`` included."""
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
        """The character vocabulary of ``symbols`` (the built-in policy's tokens)."""
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

    def turn_rewards(self, sample: Sample) -> Optional[Sequence[float]]:
        """Per-turn rewards of a finished episode, one finite float per policy turn (a tool
        call's cost, a checked intermediate step), or None for none. They reach the
        advantage module as the batch key ``turn_rewards``, each at its turn's last token;
        the outcome reward stays :meth:`reward`'s."""
        return None

    def max_episode_len(self, max_new_tokens: int) -> int:
        """Longest token sequence an episode can produce (``<bos>`` included)."""
        return (1 + self.max_prompt_len + self.max_turns * max_new_tokens
                + (self.max_turns - 1) * self.max_reply_len)
