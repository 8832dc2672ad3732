"""Shared fixtures. The test helpers are the package ``tests.support``; ``tests`` and the
``examples`` package import from the repository root, which pytest puts on ``sys.path``
(``tests`` is a package)."""

import importlib
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def check_tests_package(module) -> None:
    """``module`` (the imported ``tests``) must be this checkout's: verl 0.9.1 installs its
    own tests/ folder as a top-level package ``tests`` in site-packages (154 files in its
    RECORD), so with the repository root missing from ``sys.path`` ``import tests.x``
    would silently reach verl's files, or fail with a name that misleads."""
    where = Path(getattr(module, "__file__", None) or "?").resolve().parent
    if where != TESTS:
        raise ImportError(f"the package 'tests' was imported from {where}, not from this "
                          f"checkout's {TESTS}: an installed distribution's top-level 'tests' "
                          f"(verl 0.9.1 installs one) shadows it; run python -m pytest from "
                          f"the repository root, or put the root first on PYTHONPATH")


# pytest imported this file as tests.conftest; "tests" must resolve to this folder
check_tests_package(importlib.import_module("tests"))

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
