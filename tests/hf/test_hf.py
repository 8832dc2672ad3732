"""``python -m lightning_adv make-tiny``: a tiny causal LM and tokenizer, built offline."""

import filecmp
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_adv.cli import main
from lightning_adv.trainer.policies.hf.make_tiny import CHAT_TEMPLATE, IM_END, make_tiny


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
    proc = subprocess.run([sys.executable, "-m", "lightning_adv", "make-tiny", "--out", str(out),
                           "--arch", "llama", "--layers", "1", "--hidden-size", "32"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 1 and model.config.hidden_size == 32


def test_make_tiny_is_a_command_of_the_cli_with_its_own_help(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lightning_adv"])
    with pytest.raises(SystemExit) as info:
        main(["make-tiny", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m lightning_adv make-tiny") and "--out OUT" in out
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "other commands: make-tiny" in capsys.readouterr().out
    main(["make-tiny", "--out", str(tmp_path / "m"), "--layers", "1", "--hidden-size", "16"])
    assert "wrote a qwen2 model (1 layers, width 16)" in capsys.readouterr().out
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "m").config.hidden_size == 16


def test_the_old_command_still_works_and_says_it_is_deprecated(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lightning_adv.hf", "make-tiny", "--out",
                           str(tmp_path / "m"), "--layers", "1", "--hidden-size", "16"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "python -m lightning_adv.hf is deprecated; run python -m lightning_adv make-tiny" in (
        proc.stderr)
    assert (tmp_path / "m" / "config.json").is_file()


def test_importing_the_old_module_warns():
    code = "import lightning_adv.hf as hf; print(hf.make_tiny.__module__)"
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "lightning_adv.hf is deprecated" in proc.stderr
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "lightning_adv.trainer.policies.hf.make_tiny", proc.stderr
