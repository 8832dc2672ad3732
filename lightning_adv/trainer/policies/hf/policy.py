"""A Hugging Face causal LM as the trainer's policy, critic and reference.

:func:`build_hf_policy` loads ``model.policy.pretrained`` (a local directory or a hub id)
with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and returns an :class:`HFPolicy` (the
same call contract as the built-in policy: ``policy(ids) -> (logits, values)`` in the
next-token convention), the reference policy of the KL terms, and the tokenizer.

- **Critic.** ``value_head: true`` adds a scalar head (zero-initialised, float32) on the
  policy's last hidden state (a shared trunk, as TRL's value-head models); with
  ``critic_pretrained: DIR`` the head sits on the trunk of a separate model loaded with
  ``AutoModel`` (OpenRLHF's critic), trained by the same optimizer.
- **Reference.** A frozen copy of the initial policy; under LoRA, the policy itself with
  its adapters disabled (``peft``'s ``disable_adapter()``), so no second copy is held.
- **Saving.** :meth:`HFPolicy.save_pretrained` writes what ``AutoModelForCausalLM``
  loads: the model (LoRA merged into a copy, or the adapter alone), the tokenizer, and
  the value head as ``value_head.safetensors``.

The checks made before any weights are read are in
:mod:`~lightning_adv.trainer.policies.hf.loading` (imported from here too).
"""

from __future__ import annotations

import copy

from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor, nn

from lightning_adv.trainer.policies.hf.loading import (  # noqa: F401 -- checks re-exported from here
    HFSetup, _hub_env, apply_umask, check_device_dtype, check_hf_policy, check_lora_available,
    local_or_hub, no_progress_bars)
from lightning_adv.trainer.policies.base import (
    GenerationRequest, LogitReductions, Policy, PromptGroups, ScoreRequest, plain_scores)
from lightning_adv.trainer.policies.config import LoRAConfig, PolicyConfig
from lightning_adv.trainer.policies.hf.gguf import model_source, without_gguf_quantizer
from lightning_adv.trainer.policies.hf.prompt_sharing import (
    SharedPrefixes, base_model_pass, causal_lm_pass)
from lightning_adv.trainer.policies.token_stats import (
    entropy_rows, next_token_stats, sum_pi_squared_rows)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _load_kwargs(policy: PolicyConfig) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"trust_remote_code": policy.trust_remote_code,
                              "dtype": "auto" if policy.dtype == "auto"
                              else TORCH_DTYPES[policy.dtype]}
    if policy.attn_implementation is not None:
        kwargs["attn_implementation"] = policy.attn_implementation
    return kwargs


def _without_dropout(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


class HFPolicy(Policy):
    """A causal LM (optionally with LoRA adapters) and an optional value head.

    ``forward(input_ids)`` reads a right-padded ``[B, T]`` batch (causal attention keeps
    real tokens from seeing the padding after them) and returns (logits ``[B, T, V]``,
    values ``[B, T]`` or None): position ``t`` has read tokens ``0..t``.

    Its shortcuts: sampling with the model's KV cache (:mod:`.sampling`), every pass over
    a batch reading each shared prefix once (:mod:`.prompt_sharing`), and log-probs,
    entropies and ``sum_pi_squared`` reduced over the vocabulary in chunks
    (:mod:`~lightning_adv.trainer.policies.token_stats`).
    """

    export_name = "hf_model"

    def __init__(self, model: nn.Module, value_head: bool = False,
                 critic: Optional[nn.Module] = None, lora: Optional[LoRAConfig] = None,
                 tokenizer: Any = None):
        super().__init__()
        self.model = model
        self.critic = critic
        self.lora = lora
        self.tokenizer = tokenizer
        """saved beside the model by :meth:`export`"""
        self.dtype_name = "auto"
        """``policy.dtype``, checked against the device by :meth:`check_device`"""
        hidden = (critic or model).config.hidden_size
        self.value_head = nn.Linear(hidden, 1) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    @property
    def config(self) -> Any:
        return self.model.config

    def forward(self, input_ids: Tensor, shared: Optional[SharedPrefixes] = None
                ) -> tuple[Tensor, Optional[Tensor]]:
        """``shared``: the segments the rows share (their prompts, and beyond), each read
        once (:mod:`~lightning_adv.trainer.policies.hf.prompt_sharing`; the same numbers)."""
        trunk = self.value_head is not None and self.critic is None
        logits, hidden = causal_lm_pass(self.model, input_ids, shared, hidden=trunk)
        values = None
        if self.value_head is not None:
            if self.critic is not None:
                hidden = base_model_pass(self.critic, input_ids, shared)
            values = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)
        return logits, values

    def generate(self, runtime: Any, request: GenerationRequest, gen: torch.Generator
                 ) -> list[list[Any]]:
        from lightning_adv.trainer.policies.hf.sampling import hf_generate
        from lightning_adv.trainer.policies.sharding import gathered_weights

        # (a sharded policy's weights are gathered once: each rank samples a different
        # number of tokens, so no collective may run per token)
        with gathered_weights(self):
            return hf_generate(self, runtime, request, gen)

    @torch.no_grad()
    def token_scores(self, ids: Tensor, lengths: Tensor, request: ScoreRequest
                     ) -> dict[str, Tensor]:
        logits, values = self(ids, _shared(ids, request.prompts, self))
        return _chunked_scores(logits, values, ids, lengths, request)

    def train_forward(self, ids: Tensor, active: Tensor, temperature: float,
                      entropy_grad: bool, prompts: Optional[PromptGroups] = None
                      ) -> tuple[Tensor, Optional[Tensor], Tensor]:
        logits, values = self(ids, _shared(ids, prompts, self))
        logprobs, ent = next_token_stats(logits, ids, temperature, True, entropy_grad)
        assert ent is not None
        return logprobs, values, ent

    def export(self, directory: str, trainer: Any) -> Optional[str]:
        save_trained_policy(trainer, self, self.tokenizer, directory)
        return directory

    def check_device(self, device: torch.device) -> None:
        check_device_dtype(self.dtype_name, device)

    def shard(self, strategy: Any, reference: Any) -> None:
        from lightning_adv.trainer.policies.sharding import data_parallel_mesh, shard_policies

        shard_policies(self, reference, data_parallel_mesh(strategy))

    def decode_step(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
               cache: Any = None) -> tuple[Tensor, Any]:
        """One sampling step: read ``input_ids`` ``[B, n]`` after what ``cache`` holds
        (``attention_mask`` covers both, 0 on padding); returns (the last column's logits
        ``[B, 1, V]``, the cache). ``cache=None`` reads from the start."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits, out.cache

    def reference_logits(self, input_ids: Tensor, shared: Optional[SharedPrefixes] = None
                         ) -> Tensor:
        """The logits of the model with its LoRA adapters disabled: the reference policy
        under LoRA (a method of its own, so that a sharded policy gathers its weights for
        it as for ``forward``)."""
        with self.model.disable_adapter():
            return causal_lm_pass(self.model, input_ids, shared, hidden=False)[0]

    @torch.no_grad()
    def reference_scores(self, ids: Tensor, lengths: Tensor, request: ScoreRequest
                         ) -> dict[str, Tensor]:
        """:meth:`token_scores` of the model with its LoRA adapters disabled."""
        logits = self.reference_logits(ids, _shared(ids, request.prompts, self))
        return _chunked_scores(logits, None, ids, lengths, request)

    def reference(self) -> "AdapterDisabledReference | FrozenHFPolicy":  # type: ignore[override]
        """The reference policy: under LoRA this model with its adapters disabled, else a
        frozen copy of it as it is now (call before training)."""
        if self.lora is not None:
            return AdapterDisabledReference(self)
        reference = FrozenHFPolicy(copy.deepcopy(self.model), tokenizer=self.tokenizer)
        reference.requires_grad_(False)
        return reference.eval()

    @torch.no_grad()
    def save_pretrained(self, directory: str | Path, tokenizer: Any,
                        state_dict: Optional[dict[str, Tensor]] = None) -> Path:
        """Write the policy for inference: ``AutoModelForCausalLM.from_pretrained(directory)``
        loads it (an adapter directory loads through ``peft``). The value head, when there
        is one, goes to ``value_head.safetensors``. ``state_dict``: this module's full
        state (gathered from shards under FSDP) instead of its own parameters."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = state_dict if state_dict is not None else self.state_dict()
        model = self.model
        with no_progress_bars():  # "Writing model shards" at every checkpoint otherwise
            if self.lora is not None and state_dict is not None:
                # a sharded policy's adapters: an unsharded copy holding the gathered weights
                from lightning_adv.trainer.policies.sharding import unsharded_lora_copy

                model = unsharded_lora_copy(model, _part(state, "model."))
            if self.lora is not None and self.lora.save == "merged":
                model = copy.deepcopy(model) if model is self.model else model
                model.merge_and_unload().save_pretrained(directory)
            elif self.lora is not None:
                model.save_pretrained(directory)
            else:
                model.save_pretrained(directory, state_dict=_part(state, "model.")
                                      if state_dict is not None else None)
            tokenizer.save_pretrained(directory)
        if self.value_head is not None:
            head = {k: v.detach().float().cpu().contiguous()
                    for k, v in _part(state, "value_head.").items()}
            save_file(head, str(directory / "value_head.safetensors"))
        apply_umask(directory)
        return directory


def save_trained_policy(trainer: Any, policy: HFPolicy, tokenizer: Any, directory: str) -> None:
    """:meth:`HFPolicy.save_pretrained` on rank 0 of ``trainer``'s run. A sharded policy's
    full weights are gathered first, on every rank (a collective)."""
    from lightning_adv.trainer.policies.sharding import full_state_dict, is_sharded

    state = full_state_dict(policy) if is_sharded(policy) else None
    if trainer.is_global_zero:
        policy.save_pretrained(directory, tokenizer, state_dict=state)


def _part(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


class FrozenHFPolicy(HFPolicy):
    """A reference copy: no gradients, and always in eval mode (no dropout), whatever
    ``train()`` calls reach it."""

    def train(self, mode: bool = True) -> "FrozenHFPolicy":
        return super().train(False)


class AdapterDisabledReference:
    """The reference policy under LoRA: the policy's forward with its adapters off.

    A plain object, not a module: it holds no parameters of its own, so checkpoints and
    optimizers see the policy once."""

    def __init__(self, policy: HFPolicy):
        self.policy = policy

    def token_scores(self, ids: Tensor, lengths: Tensor, request: ScoreRequest
                     ) -> dict[str, Tensor]:
        return self.policy.reference_scores(ids, lengths, request)


def _shared(ids: Tensor, prompts: Optional[PromptGroups], policy: nn.Module
            ) -> Optional[SharedPrefixes]:
    """The segments the rows share, to read once, when they come in prompt groups. Whether
    to share is decided by the group size alone, and a sharded ``policy`` cuts at the
    prompts only: every rank of a sharded run then makes the same model calls (each
    gathers the weights), whatever its rows' tokens."""
    from lightning_adv.trainer.policies.sharding import is_sharded

    if prompts is None or prompts.size < 2:
        return None
    return SharedPrefixes.of(ids, prompts.prompt_lengths, beyond_prompts=not is_sharded(policy))


def _chunked_scores(logits: Tensor, values: Optional[Tensor], ids: Tensor, lengths: Tensor,
                    request: ScoreRequest) -> dict[str, Tensor]:
    """:meth:`HFPolicy.token_scores` from the pass's outputs, the vocabulary reduced in
    chunks (no full-size float32 copy of the logits)."""
    return plain_scores(logits, values, ids, lengths, request, CHUNKED)


#: The vocabulary reduced in chunks (:mod:`~lightning_adv.trainer.policies.token_stats`).
CHUNKED = LogitReductions(
    logprobs=lambda x, i, t: next_token_stats(x, i, t, with_entropy=False)[0],
    pi_squared=sum_pi_squared_rows, entropy=entropy_rows)


def build_hf_policy(policy: PolicyConfig, *, seed: int, tokenizer: Any = None) -> HFPolicy:
    """Load the pretrained policy (and critic), add LoRA adapters and the value head; the
    new parameters' initialisation is seeded by ``seed``."""
    from transformers import AutoModel, AutoModelForCausalLM

    _hub_env()
    assert policy.pretrained is not None
    kwargs = _load_kwargs(policy)
    source = model_source(policy.pretrained, policy.gguf_file)
    model = without_gguf_quantizer(AutoModelForCausalLM.from_pretrained(
        local_or_hub(source.path), **kwargs, **source.kwargs()))
    critic = None
    if policy.critic_pretrained is not None:
        critic = AutoModel.from_pretrained(local_or_hub(policy.critic_pretrained), **kwargs)
    if policy.disable_dropout:
        _without_dropout(model)
        if critic is not None:
            _without_dropout(critic)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if policy.lora is not None:
            model = _with_lora(model, policy.lora)
        built = HFPolicy(model, value_head=policy.value_head, critic=critic, lora=policy.lora,
                         tokenizer=tokenizer)
    built.dtype_name = policy.dtype
    return built.train()  # from_pretrained returns eval mode; the trainer switches modes


def _with_lora(model: nn.Module, lora: LoRAConfig) -> nn.Module:
    check_lora_available()
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=lora.target_modules, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        raise ValueError(f"policy.lora.target_modules: {exc}") from None
