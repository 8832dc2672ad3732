"""``python -m lightning_adv make-tiny --out DIR``: a tiny Hugging Face causal LM for CPU runs.

Writes a randomly initialised small causal language model (Qwen2 or Llama architecture,
2 layers, 64 wide by default) and a byte-level BPE tokenizer trained with ``tokenizers``
on the text of the built-in tasks, with a ChatML chat template. The directory loads with
``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(DIR)``, offline, in well under
a second, and is what ``configs/hf_grpo.yaml`` and ``configs/hf_ppo.yaml`` train::

    python -m lightning_adv make-tiny --out models/tiny_lm
    python -m lightning_adv make-tiny --out models/tiny_llama --arch llama --no-pad-token

The tokenizer's alphabet is all 256 bytes, so it encodes any string; its few merges are
the chat roles and the shipped tasks' instruction words, so task content stays one
character per token. The same arguments and seed write the same files.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional, Sequence

from lightning_adv.trainer.policies.hf.policy import apply_umask, no_progress_bars

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

#: ChatML, as Qwen's instruct models use it. An empty first user turn still renders.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

ARCHITECTURES = ("qwen2", "llama")


#: The words the tokenizer merges: chat roles and the shipped tasks' instructions. Task
#: content (letters, digits) stays one byte per token, so a tiny model can learn to
#: reverse or add character by character.
CORPUS_WORDS = ("system", "user", "assistant", "Reverse:", "Answer:", "Question:")


@dataclass(frozen=True)
class TinyModelOptions:
    """The shape of a tiny model and its tokenizer (``make-tiny``'s flags): one object from
    the command line, or :func:`make_tiny`'s keywords, to the builders."""

    arch: str = "qwen2"
    vocab_size: int = 300
    """BPE vocabulary (256 bytes + 3 special tokens + merges)"""
    pad_token: bool = True
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 256
    max_positions: int = 512
    """context window (``max_position_embeddings``)"""
    seed: int = 0


def task_corpus(repeats: int = 50) -> list[str]:
    """Text the tokenizer learns its merges from (see :data:`CORPUS_WORDS`)."""
    return [" ".join(CORPUS_WORDS) + "\n"] * repeats


def build_tokenizer(vocab_size: int = 300, pad_token: bool = True):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with ChatML special tokens.

    EOS is ``<|im_end|>`` (the end of an assistant turn, where generation stops); the pad
    token is ``<|endoftext|>``, or none with ``pad_token=False`` (then pad = EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=[END_OF_TEXT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(task_corpus(), trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=IM_END,
                                      pad_token=END_OF_TEXT if pad_token else None)
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_model(vocab_size: int, eos_token_id: int, pad_token_id: Optional[int],
                options: TinyModelOptions = TinyModelOptions()):
    """A randomly initialised causal LM (transformers' own initialisation, seeded)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config
    from transformers import Qwen2ForCausalLM

    arch = options.arch
    if arch not in ARCHITECTURES:
        raise ValueError(f"--arch: expected one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    config_cls, model_cls = ((Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2"
                             else (LlamaConfig, LlamaForCausalLM))
    config = config_cls(vocab_size=vocab_size, hidden_size=options.hidden_size,
                        intermediate_size=options.intermediate_size,
                        num_hidden_layers=options.layers, num_attention_heads=options.heads,
                        num_key_value_heads=options.kv_heads,
                        max_position_embeddings=options.max_positions, tie_word_embeddings=False,
                        eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(options.seed)
        model = model_cls(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_token_id,
                                               pad_token_id=pad_token_id)
    return model


def make_tiny(out: str | Path, *, arch: str = "qwen2", vocab_size: int = 300,
              pad_token: bool = True, hidden_size: int = 64, layers: int = 2, heads: int = 4,
              kv_heads: int = 2, intermediate_size: int = 256, max_positions: int = 512,
              seed: int = 0) -> Path:
    """Write a tiny model and its tokenizer to ``out``; returns the directory. The keywords
    are :class:`TinyModelOptions`' fields (and ``make-tiny``'s flags)."""
    return write_tiny(out, TinyModelOptions(
        arch=arch, vocab_size=vocab_size, pad_token=pad_token, hidden_size=hidden_size,
        layers=layers, heads=heads, kv_heads=kv_heads, intermediate_size=intermediate_size,
        max_positions=max_positions, seed=seed))


def write_tiny(out: str | Path, options: TinyModelOptions) -> Path:
    """:func:`make_tiny` with its options as one object."""
    out = Path(out)
    tokenizer = build_tokenizer(options.vocab_size, pad_token=options.pad_token)
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, options)
    out.mkdir(parents=True, exist_ok=True)
    with no_progress_bars():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    apply_umask(out)
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m lightning_adv make-tiny`` (``argv``: the arguments after ``make-tiny``)."""
    parser = argparse.ArgumentParser(prog="python -m lightning_adv make-tiny",
                                     description="Write a tiny random Hugging Face causal LM "
                                                 "and its tokenizer (a chat template included).")
    parser.add_argument("--out", required=True, help="directory to write (created)")
    parser.add_argument("--arch", default="qwen2", choices=ARCHITECTURES)
    parser.add_argument("--vocab-size", type=int, default=300,
                        help="BPE vocabulary (256 bytes + 3 special tokens + merges)")
    parser.add_argument("--no-pad-token", dest="pad_token", action="store_false",
                        help="save the tokenizer without a pad token (pad = EOS)")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=256)
    parser.add_argument("--max-positions", type=int, default=512,
                        help="context window (max_position_embeddings)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # every flag but --out is named as the option it sets
    out = write_tiny(args.out, TinyModelOptions(**{f.name: getattr(args, f.name)
                                                   for f in fields(TinyModelOptions)}))
    print(f"wrote a {args.arch} model ({args.layers} layers, width {args.hidden_size}) and its "
          f"tokenizer to {out}")
