"""Checks of a Hugging Face policy made before any weights are read, and the file
conventions of what the trainer writes.

:func:`check_hf_policy` (errors name the key): the directory exists and holds a
``config.json``, weights and a tokenizer; the config is a causal LM's; a hub id fails at
once, in plain words, when the hub cannot be reached (``HF_HUB_OFFLINE`` set, or no
connection) and the model is not in the local hub cache; LoRA needs ``peft`` and its
``target_modules`` must match modules of the model; ``dtype: float16`` needs a GPU.
Written ``*.safetensors`` files get the mode the umask gives (:func:`apply_umask`), and a
local model directory is loaded by its absolute path (:func:`local_or_hub`), which is
what a saved LoRA adapter records as its base model.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

import torch

from lightning_adv.trainer.policies.hf.gguf import ModelSource, model_source
from lightning_adv.trainer.policies.hf.tokenizer import HFTokenizer
from lightning_adv.trainer.policies.config import LoRAConfig, PolicyConfig

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "adapter_model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _hub_env() -> None:
    # transformers' progress bars and load reports would flood every run's output.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off within the block (``save_pretrained`` draws a
    "Writing model shards" bar even for one shard), the caller's setting restored after."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


def apply_umask(directory: str | Path) -> None:
    """Give the ``*.safetensors`` files in ``directory`` the mode a new file gets (0644
    under the usual umask 022): safetensors writes them 0600, which other users of a shared
    model directory, or a container running as another user, cannot read."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(directory).glob("*.safetensors"):
        os.chmod(path, 0o666 & ~mask)


def local_or_hub(path: str) -> str:
    """A local model directory as an absolute path (what a saved LoRA adapter records as
    its base model, so that it loads from any working directory), a hub id as it is."""
    expanded = os.path.expanduser(path)
    return os.path.abspath(expanded) if os.path.isdir(expanded) else path


def expected_directory(key: str) -> str:
    """What a model directory must hold, and how to make a tiny local one: the tail of
    every error about an unusable ``key`` (``policy.pretrained``; ``model.`` on the CLI)."""
    return (f"expected a Hugging Face model directory as save_pretrained writes it: "
            f"config.json, weights ({' or '.join(WEIGHT_FILES[:3:2])}) and tokenizer files "
            f"(tokenizer.json or tokenizer_config.json), or a hub id with network access. For "
            f"a tiny random local model: python -m lightning_adv make-tiny --out "
            f"models/tiny_lm, then --model.{key}=models/tiny_lm")


def check_model_location(path: str, key: str, gguf_file: Optional[str] = None) -> bool:
    """Check a local model directory's files; True for a local directory, False for a
    hub id (left to ``from_pretrained``). Errors name ``key``, the path and what a model
    directory holds. A GGUF file (checked by :func:`~.gguf.model_source`) holds it all."""
    if gguf_file is not None:
        return True
    looks_local = os.path.isabs(path) or path.startswith((".", "~")) or os.path.exists(path)
    if not os.path.isdir(os.path.expanduser(path)):
        if looks_local or path.count("/") > 1:
            raise ValueError(f"{key}: no such directory {path!r} (a Hugging Face model directory "
                             f"or a hub id such as Qwen/Qwen2.5-0.5B); {expected_directory(key)}")
        return False
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise ValueError(f"{key}: {path!r} has no config.json: not a Hugging Face model "
                         f"directory; {expected_directory(key)}")
    if not any((directory / name).is_file() for name in WEIGHT_FILES) and not any(
            directory.glob("*.safetensors")):
        raise ValueError(f"{key}: {path!r} has no model weights (expected one of "
                         f"{', '.join(WEIGHT_FILES[:3])}); {expected_directory(key)}")
    return True


def load_config(path: str, key: str, trust_remote_code: bool,
                gguf_file: Optional[str] = None) -> Any:
    """The model's ``AutoConfig`` (of the directory, hub id or ``gguf_file`` in ``path``),
    checked to be a causal LM's."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    local = check_model_location(path, key, gguf_file)
    if not local:
        check_hub_reachable(path, key)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code,
                                            **ModelSource(path, gguf_file).kwargs())
    except Exception as exc:  # transformers raises OSError/ValueError/KeyError variously
        what = (f"cannot load the model config of {path!r}" if local else
                f"{path!r} is not a local directory, and the hub has no model of that name "
                f"that this machine may read")
        raise ValueError(f"{key}: {what}: {type(exc).__name__}: "
                         f"{str(exc)[:300].rstrip('. ')}; {expected_directory(key)}") from None
    remote = "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not (
            remote and trust_remote_code):
        arch = ", ".join(getattr(config, "architectures", None) or []) or "no architecture"
        raise ValueError(f"{key}: {path!r} holds a {config.model_type!r} model ({arch}), which is "
                         f"not a causal language model (AutoModelForCausalLM cannot load it)")
    return config


def hub_unreachable() -> Optional[str]:
    """Why the Hugging Face hub cannot be reached from here, or None (reachable, or not
    knowable: behind a proxy). A failed connection is known in milliseconds; the hub
    client would retry for half a minute before its error."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        return f"there is no connection to {host}:{port} ({exc.strerror or type(exc).__name__})"
    return None


def check_hub_reachable(repo_id: str, key: str) -> None:
    """A hub id must be in the local hub cache or the hub reachable; else fail at once."""
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 -- not a valid repo id: from_pretrained says so
        return
    reason = None if cached else hub_unreachable()
    if reason:
        raise ValueError(f"{key}: {repo_id!r} is not a local directory, and this machine cannot "
                         f"download it: {reason}, and it is not in the hub cache "
                         f"({constants.HF_HUB_CACHE}). Download it where the hub is reachable "
                         f"(huggingface-cli download {repo_id}) or give a local directory; "
                         f"{expected_directory(key)}")


def check_lora_targets(config: Any, lora: LoRAConfig, trust_remote_code: bool) -> None:
    """``lora.target_modules`` must match a module of the model ``config`` builds (checked
    on a skeleton on the meta device: no weights are read or allocated)."""
    targets = lora.target_modules
    if targets is None or targets == "all-linear":
        return
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    wanted = LoraConfig(target_modules=targets, task_type="CAUSAL_LM")
    if any(check_target_module_exists(wanted, name) for name, _ in model.named_modules() if name):
        return
    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, torch.nn.Linear)})
    raise ValueError(f"policy.lora.target_modules: {targets!r} matches no module of the "
                     f"{config.model_type!r} model; its linear layers are named "
                     f"{', '.join(linear)} (or use all-linear, or null for peft's default)")


def load_tokenizer(path: str, key: str, trust_remote_code: bool,
                   gguf_file: Optional[str] = None) -> Any:
    from transformers import AutoTokenizer

    directory = Path(path).expanduser()
    if gguf_file is None and directory.is_dir() and not any(
            (directory / n).is_file() for n in TOKENIZER_FILES):
        raise ValueError(f"{key}: {path!r} has no tokenizer (expected tokenizer.json or "
                         f"tokenizer_config.json beside the model); {expected_directory(key)}")
    try:
        # Left padding is what batched generation needs; the trainer pads its own batches.
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                             padding_side="left",
                                             **ModelSource(path, gguf_file).kwargs())
    except Exception as exc:
        raise ValueError(f"{key}: cannot load the tokenizer of {path!r}: "
                         f"{type(exc).__name__}: {str(exc)[:300].rstrip('. ')}; "
                         f"{expected_directory(key)}") from None


def context_window(config: Any) -> Optional[int]:
    """The longest sequence the model reads (None when its config does not say)."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_device_dtype(dtype: str, device: torch.device | str) -> None:
    if dtype == "float16" and torch.device(device).type == "cpu":
        raise ValueError("policy.dtype: float16 needs a GPU (CPU kernels for it are missing or "
                         "slow); use bfloat16 or float32 on CPU, or "
                         "--trainer.precision=bf16-mixed")


def check_lora_available() -> None:
    if importlib.util.find_spec("peft") is None:
        raise ValueError("policy.lora: LoRA needs the peft package, which is not installed; "
                         "install the extra: pip install 'lightning_adv[lora]'")


@dataclass
class HFSetup:
    """What the trainer needs of a pretrained policy, checked before anything is loaded."""

    config: Any
    """the policy's transformers config"""
    tokenizer: HFTokenizer
    context_window: Optional[int]


def check_hf_policy(policy: PolicyConfig, chat_template: Any = "auto") -> HFSetup:
    """Everything that can be checked without loading weights: files, config, tokenizer,
    LoRA availability, the critic's directory. Errors name ``policy.<field>``."""
    _hub_env()
    assert policy.pretrained is not None
    source = model_source(policy.pretrained, policy.gguf_file)
    config = load_config(source.path, "policy.pretrained", policy.trust_remote_code,
                         source.gguf_file)
    raw = load_tokenizer(source.path, "policy.pretrained", policy.trust_remote_code,
                         source.gguf_file)
    eos = _generation_eos(source)
    tokenizer = HFTokenizer(raw, chat_template, eos_ids=eos)
    if policy.lora is not None:
        check_lora_available()
        check_lora_targets(config, policy.lora, policy.trust_remote_code)
    if policy.critic_pretrained is not None:
        critic = load_config(policy.critic_pretrained, "policy.critic_pretrained",
                             policy.trust_remote_code)
        if getattr(critic, "vocab_size", len(raw)) < len(raw):
            raise ValueError(f"policy.critic_pretrained: its vocabulary ({critic.vocab_size} "
                             f"tokens) is smaller than the policy tokenizer's ({len(raw)}); the "
                             f"critic must read the policy's token ids")
    return HFSetup(config, tokenizer, context_window(config))


def _generation_eos(source: ModelSource) -> list[int]:
    from transformers import GenerationConfig

    if source.gguf_file is not None:  # (a GGUF file's EOS is its tokenizer's)
        return []
    try:
        eos = GenerationConfig.from_pretrained(source.path).eos_token_id
    except Exception:  # no generation_config.json: the tokenizer's EOS alone
        return []
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]
