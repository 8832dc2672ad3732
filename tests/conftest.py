"""Shared fixtures. The test helpers are the package ``tests.support``; ``tests`` and the
``examples`` package import from the repository root, which pytest puts on ``sys.path``
(``tests`` is a package)."""

import os
import sys

import pytest

# Tests never touch the network: Hugging Face models and tokenizers are built locally.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def plain_argv(monkeypatch):
    # LightningCLI warns when args= is given while sys.argv holds pytest's own arguments.
    monkeypatch.setattr(sys, "argv", ["lightning_adv"])


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A tiny random Qwen2 causal LM with a ChatML tokenizer (pad token <|endoftext|>)."""
    from lightning_adv.trainer.policies.hf.make_tiny import make_tiny

    return str(make_tiny(tmp_path_factory.mktemp("tiny_lm") / "qwen2"))


@pytest.fixture(scope="session")
def tiny_llama_no_pad(tmp_path_factory):
    """A tiny random Llama causal LM whose tokenizer has no pad token (pad = EOS)."""
    from lightning_adv.trainer.policies.hf.make_tiny import make_tiny

    return str(make_tiny(tmp_path_factory.mktemp("tiny_llama") / "llama", arch="llama",
                         pad_token=False))
