"""Which policy a config asks for, checked before anything loads, and built.

The one place that tells the two implementations apart, by the config alone:
``policy.pretrained`` names a Hugging Face model (:mod:`.hf`); without it the policy is
the built-in tiny transformer (:mod:`.tiny`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from lightning_adv.trainer.policies.base import Policy
from lightning_adv.trainer.policies.config import PolicyConfig


@dataclass(frozen=True)
class PolicySetup:
    """What the trainer's setup needs of the configured policy before any network is built."""

    tokenizer: Any = None
    """the policy's tokenizer for the task's text (None: the task's character vocabulary)"""
    context_window: Optional[int] = None
    """the longest sequence the policy reads (None: the built-in policy's own length)"""
    hf: Any = None
    """a Hugging Face policy's checked files, config and tokenizer (None: the built-in policy)"""


def check_policy_options(policy: PolicyConfig, ppo: Any, task: Any) -> PolicySetup:
    """The policy's setup: a pretrained policy's files, config, tokenizer and dtype checked
    (no weights loaded), or the built-in policy's, whose sampler has no top-k / top-p and
    no stop strings."""
    if policy.pretrained is None:
        for name, off in (("top_k", 0), ("top_p", 1.0)):
            if getattr(ppo, name) != off:
                raise ValueError(f"ppo.{name}: supported with a Hugging Face policy "
                                 f"(policy.pretrained) only; the built-in policy samples from "
                                 f"the full distribution")
        if task.stop_strings:
            raise ValueError("task.stop_strings: supported with a Hugging Face policy "
                             "(policy.pretrained) only; the built-in policy's turns end at "
                             "<eos> or the token limit")
        return PolicySetup()
    from lightning_adv.trainer.policies.hf.loading import check_device_dtype, check_hf_policy

    hf = check_hf_policy(policy, task.chat_template)
    if policy.dtype == "float16" and not torch.cuda.is_available():
        check_device_dtype(policy.dtype, "cpu")
    return PolicySetup(hf.tokenizer, hf.context_window, hf)


def build_policy(policy: PolicyConfig, setup: PolicySetup, vocab: Any, max_len: int,
                 seed: int) -> Policy:
    """The policy of ``policy``'s config: a Hugging Face one (``setup.hf``), else the
    built-in transformer over the task's ``vocab`` and ``max_len`` tokens. Its new weights
    come from ``seed``, not from whatever the global RNG holds."""
    if setup.hf is not None:
        from lightning_adv.trainer.policies.hf.policy import build_hf_policy

        return build_hf_policy(policy, seed=seed, tokenizer=setup.hf.tokenizer.tokenizer)
    from lightning_adv.trainer.policies.tiny import TinyPolicy

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyPolicy(policy, len(vocab), max_len, banned_tokens=(vocab.pad_id, vocab.bos_id))
