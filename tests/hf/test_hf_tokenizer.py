"""A Hugging Face tokenizer as the trainer's vocabulary: chat prompts, replies, EOS, pad."""

import pytest
from transformers import AutoTokenizer

from lightning_adv.trainer.policies.hf.tokenizer import HFTokenizer

CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def raw(tiny_lm):
    return AutoTokenizer.from_pretrained(tiny_lm)


def test_prompts_are_rendered_through_the_chat_template(raw):
    tok = HFTokenizer(raw)
    assert tok.use_chat
    ids = tok.encode_prompt("Reverse: cab", "p")
    assert raw.decode(ids) == CHAT.format("Reverse: cab")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert raw.decode(tok.encode_prompt(messages, "p")) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n" + CHAT.format("hi"))
    plain = HFTokenizer(raw, chat_template=False)
    assert raw.decode(plain.encode_prompt("Reverse: cab", "p")) == "Reverse: cab"
    with pytest.raises(ValueError, match="p: a prompt of chat messages needs a chat template"):
        plain.encode_prompt(messages, "p")


def test_auto_without_a_template_is_plain_and_true_is_an_error(raw):
    template = raw.chat_template
    try:
        raw.chat_template = None
        assert not HFTokenizer(raw, "auto").use_chat
        with pytest.raises(ValueError, match="task.chat_template: true, but the tokenizer"):
            HFTokenizer(raw, True)
    finally:
        raw.chat_template = template


def test_replies_continue_the_conversation_as_the_template_renders_it(raw):
    """Prompt + generated turns + reply tokens decode to the template's rendering of the
    whole conversation, whether a turn ended with EOS or at the token limit."""
    tok = HFTokenizer(raw)
    tok.check_replies()
    first, second = raw("4")["input_ids"] + [tok.eos_id], raw("6")["input_ids"]  # 2nd: cut
    ids = tok.encode_prompt("G", "p") + first + tok.encode_reply(">", "<|im_end|>", "r")
    ids += second + tok.encode_reply("<", None, "r")
    conversation = [{"role": "user", "content": "G"}, {"role": "assistant", "content": "4"},
                    {"role": "user", "content": ">"}, {"role": "assistant", "content": "6"},
                    {"role": "user", "content": "<"}]
    assert raw.decode(ids) == raw.apply_chat_template(conversation, tokenize=False,
                                                      add_generation_prompt=True)
    assert tok.decode(first) == "4"  # special tokens are not part of the text
    plain = HFTokenizer(raw, chat_template=False)
    assert raw.decode(plain.encode_reply("<", "<|im_end|>", "r")) == "<"


def test_the_end_of_turn_marker_follows_the_eos_token_that_ended_the_turn(tiny_lm):
    """With several EOS ids (the tokenizer's and the generation config's), only an EOS that
    is the template's end-of-turn marker stands for it: after another EOS the marker is
    still written, and after the marker it is not written twice."""
    raw = AutoTokenizer.from_pretrained(tiny_lm, eos_token="<|endoftext|>")
    tok = HFTokenizer(raw, eos_ids=[raw.convert_tokens_to_ids("<|im_end|>")])
    assert tok.eos_id == raw.convert_tokens_to_ids("<|endoftext|>") and len(tok.eos_ids) == 2
    turn = raw("4")["input_ids"]
    after_marker = tok.encode_reply(">", "<|im_end|>", "r")
    assert raw.decode(turn + [raw.convert_tokens_to_ids("<|im_end|>")] + after_marker) == (
        "4<|im_end|>\n<|im_start|>user\n><|im_end|>\n<|im_start|>assistant\n")
    after_other = tok.encode_reply(">", "<|endoftext|>", "r")
    assert raw.decode(after_other).startswith("<|im_end|>\n<|im_start|>user\n>")


def test_a_template_that_is_not_prefix_stable_is_refused(raw):
    template = raw.chat_template
    try:
        # renders only the last message: appending a reply rewrites the beginning
        raw.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
        with pytest.raises(ValueError, match="task.chat_template: .* not render a conversation's "
                                             "beginning as a prefix"):
            HFTokenizer(raw).check_replies()
    finally:
        raw.chat_template = template


def test_eos_and_pad(raw, tiny_llama_no_pad):
    tok = HFTokenizer(raw, eos_ids=[raw.convert_tokens_to_ids("<|endoftext|>")])
    assert tok.eos_id == raw.eos_token_id and len(tok.eos_ids) == 2
    assert tok.pad_id == raw.pad_token_id != tok.eos_id
    no_pad = HFTokenizer(AutoTokenizer.from_pretrained(tiny_llama_no_pad))
    assert no_pad.pad_id == no_pad.eos_id


def test_a_prompt_ending_with_an_assistant_message_is_continued(raw):
    """The start of the answer as a response prefix: the rendered prompt ends with its
    text (no end-of-turn marker, no new assistant header), and equals the template's
    rendering of the question plus the generation prompt, followed by the prefix."""
    tok = HFTokenizer(raw)
    question = [{"role": "user", "content": "What is 27 + 82?"}]
    prefixed = tok.encode_prompt([*question, {"role": "assistant", "content": "27 + 82 ="}], "p")
    text = raw.decode(prefixed)
    opened = raw.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    assert text == opened + "27 + 82 =", text
    assert raw.decode(tok.encode_prompt(question, "p")) == opened
