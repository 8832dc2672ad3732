"""A Hugging Face tokenizer as the trainer's vocabulary: prompts, replies, EOS and padding.

:class:`HFTokenizer` gives a task's text the same interface the built-in character
:class:`~lightning_adv.trainer.tasks.Vocab` has (``encode_prompt``, ``encode_reply``,
``decode``, ``eos_ids``, ``pad_id``), so every task runs with either.

- **Prompts.** With a chat template (``task.chat_template: auto`` and the tokenizer has
  one, or ``true``) a prompt string becomes one user message (a list of messages is used
  as is) rendered with ``add_generation_prompt=True`` and tokenized without adding
  special tokens (the template places BOS where the model expects it), as TRL does. A
  list ending with an assistant message is a response prefix the model continues
  (``continue_final_message``).
  Without one the prompt text is tokenized with the tokenizer's special tokens (BOS for
  Llama-family tokenizers).
- **Environment replies** of multi-turn tasks become a chat message (role ``user`` by
  default) after the assistant's turn: the tokens appended are what the template writes
  after the assistant's content (the end-of-turn marker, unless the policy already wrote
  it as its EOS) plus the reply message and the next generation prompt. The template must
  render a conversation's prefix as a prefix of the whole (ChatML, Llama 3 and most
  others do); one that does not is an error, found when the tokenizer is set up.
- **EOS.** A turn ends at any of the tokenizer's EOS and the model's
  ``generation_config.eos_token_id`` (chat models stop at their end-of-turn token).
- **Padding.** A tokenizer without a pad token pads with EOS. Padding never decides a
  mask: attention and loss masks come from the episodes' own lengths, so a generated EOS
  stays a real, trained token even when it is also the pad id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional, Union

_PLACEHOLDER = "lightning_adv_assistant_turn"


class HFTokenizer:
    """Adapter of a ``transformers`` tokenizer for :class:`~lightning_adv.trainer.tasks.TaskRuntime`.

    Args:
        tokenizer: a loaded ``transformers`` tokenizer.
        chat_template: ``"auto"`` (use the tokenizer's template when it has one), True, False.
        eos_ids: further token ids that end a turn (the model's generation config's).
        reply_role: the chat role of environment replies.
    """

    def __init__(self, tokenizer: Any, chat_template: Union[bool, str] = "auto",
                 eos_ids: Iterable[int] = (), reply_role: str = "user"):
        self.tokenizer = tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template is True and not has_template:
            raise ValueError("task.chat_template: true, but the tokenizer of "
                             "model.policy.pretrained has no chat template (use auto or false)")
        self.use_chat = has_template if chat_template == "auto" else bool(chat_template)
        ids = {int(i) for i in eos_ids}
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        if not ids:
            raise ValueError("model.policy.pretrained: the tokenizer has no EOS token and the "
                             "model's generation_config names none; a turn could never end")
        self.eos_id = int(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else min(ids)
        self.eos_ids = frozenset(ids)
        self.pad_id = (int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None
                       else self.eos_id)
        self.bos_id = tokenizer.bos_token_id
        self.reply_role = reply_role
        self._frame: Optional[tuple[str, tuple[str, str]]] = None

    def __len__(self) -> int:
        return len(self.tokenizer)

    def _render(self, messages: Sequence[Mapping[str, str]], generation_prompt: bool) -> str:
        # A prompt ending with an assistant message is the start of the answer (a response
        # prefix, "17 + 25 ="): the model continues that message, as TRL's
        # continue_final_message does, instead of opening a new one.
        prefix = generation_prompt and bool(messages) and messages[-1].get("role") == "assistant"
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                  add_generation_prompt=generation_prompt and not prefix,
                                                  continue_final_message=prefix)

    def _ids(self, text: str, special: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def encode_prompt(self, prompt: Any, where: str, error: type[Exception] = ValueError
                      ) -> list[int]:
        """Token ids of a prompt (a string or a list of chat messages)."""
        if not self.use_chat:
            if not isinstance(prompt, str):
                raise error(f"{where}: a prompt of chat messages needs a chat template, but "
                            f"task.chat_template is false or the tokenizer has none")
            ids = self._ids(prompt, special=True)
        else:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            try:
                text = self._render(messages, generation_prompt=True)
            except Exception as exc:  # jinja errors: the template rejects these messages
                raise error(f"{where}: the tokenizer's chat template cannot render the prompt: "
                            f"{type(exc).__name__}: {exc}") from None
            ids = self._ids(text, special=False)
        if not ids:
            raise error(f"{where}: the prompt tokenizes to no tokens")
        return ids

    def check_replies(self) -> None:
        """Check, once, that environment replies can be appended as chat messages (a
        multi-turn task calls this before its first episode)."""
        if self.use_chat and self._frame is None:
            self._frame = self._reply_frame()

    def _reply_frame(self) -> tuple[str, tuple[str, str]]:
        """(what the template writes after an assistant's content, the text before and
        after the reply in a reply message plus the next generation prompt)."""
        base = [{"role": "user", "content": "question"},
                {"role": "assistant", "content": _PLACEHOLDER}]
        marker = "lightning_adv_reply"
        try:
            before = self._render(base, generation_prompt=False)
            after = self._render(base + [{"role": self.reply_role, "content": marker}],
                                 generation_prompt=True)
        except Exception as exc:
            raise ValueError(f"task.chat_template: the tokenizer's chat template cannot render an "
                             f"environment reply as a {self.reply_role!r} message after the "
                             f"assistant's turn: {type(exc).__name__}: {exc}") from None
        if not after.startswith(before) or _PLACEHOLDER not in before:
            raise ValueError("task.chat_template: the tokenizer's chat template does not render a "
                             "conversation's beginning as a prefix of the whole conversation, so "
                             "environment replies cannot be appended turn by turn; set "
                             "task.chat_template: false")
        closing = before[before.rindex(_PLACEHOLDER) + len(_PLACEHOLDER):]
        head, _, tail = after[len(before):].partition(marker)
        return closing, (head, tail)

    def encode_reply(self, text: str, ended_with: Optional[str], where: str,
                     error: type[Exception] = ValueError) -> list[int]:
        """Tokens appended for an environment reply after a policy turn. ``ended_with``: the
        text of the EOS token that ended the turn (None: it ended otherwise); when it is the
        template's end-of-turn marker, the marker is not written again."""
        if not self.use_chat:
            ids = self._ids(text, special=False)
        else:
            self.check_replies()
            assert self._frame is not None
            closing, (head, tail) = self._frame
            if ended_with and closing.startswith(ended_with):
                closing = closing[len(ended_with):]
            ids = self._ids(closing + head + text + tail, special=False)
        if not ids:
            raise error(f"{where}: the reply tokenizes to no tokens")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated tokens, special tokens left out (as TRL and verl score it)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.convert_ids_to_tokens(int(token_id))
