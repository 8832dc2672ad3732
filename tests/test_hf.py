"""``python -m lightning_adv.hf make-tiny``: a tiny causal LM and tokenizer, built offline."""

import filecmp
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_adv.hf import CHAT_TEMPLATE, IM_END, make_tiny


def test_make_tiny_writes_a_loadable_causal_lm_with_a_chat_template(tiny_lm):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Reverse: abc"}],
                                         tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nReverse: abc<|im_end|>\n<|im_start|>assistant\n"
    # byte-level: any string round-trips, the special tokens are single tokens
    for s in ("Reverse: cab", "héllo wörld ✓", "3+5=8"):
        assert tokenizer.decode(tokenizer(s)["input_ids"]) == s
    assert len(tokenizer("<|im_start|><|im_end|>")["input_ids"]) == 2
    out = model.generate(**tokenizer(text, return_tensors="pt"), max_new_tokens=4,
                         do_sample=False)
    assert out.shape[1] > len(tokenizer(text)["input_ids"])


def test_llama_without_pad_token(tiny_llama_no_pad):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_no_pad)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_no_pad)
    assert model.config.model_type == "llama" and tokenizer.pad_token is None
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_same_arguments_write_the_same_files(tmp_path):
    a, b = make_tiny(tmp_path / "a"), make_tiny(tmp_path / "b")
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        assert filecmp.cmp(a / name, b / name, shallow=False), name
    other = make_tiny(tmp_path / "c", seed=1)
    wa = AutoModelForCausalLM.from_pretrained(a).model.embed_tokens.weight
    wc = AutoModelForCausalLM.from_pretrained(other).model.embed_tokens.weight
    assert not torch.equal(wa, wc)


def test_command_line(tmp_path):
    out = tmp_path / "m"
    proc = subprocess.run([sys.executable, "-m", "lightning_adv.hf", "make-tiny", "--out", str(out),
                           "--arch", "llama", "--layers", "1", "--hidden-size", "32"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 1 and model.config.hidden_size == 32
