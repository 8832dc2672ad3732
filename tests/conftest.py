import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Test helpers (reference loops, strategies, case loaders) live beside the tests; the
# examples package is imported from the repository root.
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

# Tests never touch the network: Hugging Face models and tokenizers are built locally.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """A tiny random Qwen2 causal LM with a ChatML tokenizer (pad token <|endoftext|>)."""
    from lightning_adv.trainer.tiny_hf_model import make_tiny

    return str(make_tiny(tmp_path_factory.mktemp("tiny_lm") / "qwen2"))


@pytest.fixture(scope="session")
def tiny_llama_no_pad(tmp_path_factory):
    """A tiny random Llama causal LM whose tokenizer has no pad token (pad = EOS)."""
    from lightning_adv.trainer.tiny_hf_model import make_tiny

    return str(make_tiny(tmp_path_factory.mktemp("tiny_llama") / "llama", arch="llama",
                         pad_token=False))
