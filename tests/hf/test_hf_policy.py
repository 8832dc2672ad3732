"""A Hugging Face causal LM as policy, critic and reference: loading checks, value heads,
references (frozen copy, LoRA with adapters disabled) and saving for inference."""

import importlib.util
import shutil

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, ViTConfig, ViTModel

from lightning_adv.trainer.policies.base import ScoreRequest
from lightning_adv.trainer.policies.hf.policy import (
    AdapterDisabledReference, build_hf_policy, check_device_dtype, check_hf_policy)
from lightning_adv.trainer.policies.logprobs import next_token_logprobs
from lightning_adv.trainer.policies.config import PolicyConfig

IDS = torch.tensor([[1, 20, 30, 40, 50, 60], [1, 70, 80, 90, 0, 0]])


def policy_config(path, **kwargs):
    return PolicyConfig(pretrained=path, **kwargs)


def perturb(module, scale=0.5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=gen))


# ---------------------------------------------------------------------- bad input

def test_missing_directory_files_and_tokenizer_are_named(tmp_path, tiny_lm):
    with pytest.raises(ValueError, match="policy.pretrained: no such directory './nowhere'"):
        check_hf_policy(policy_config("./nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no config.json: not a Hugging Face model"):
        check_hf_policy(policy_config(str(empty)))
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(f"{tiny_lm}/config.json", no_weights)
    with pytest.raises(ValueError, match="policy.pretrained: .* has no model weights"):
        check_hf_policy(policy_config(str(no_weights)))
    no_tokenizer = tmp_path / "no_tokenizer"
    AutoModelForCausalLM.from_pretrained(tiny_lm).save_pretrained(no_tokenizer)
    with pytest.raises(ValueError, match="policy.pretrained: .* has no tokenizer"):
        check_hf_policy(policy_config(str(no_tokenizer)))
    # offline (the tests run with HF_HUB_OFFLINE=1) or without network: one plain message
    with pytest.raises(ValueError, match="policy.pretrained: 'nobody/no-such-model' is not a "
                                         "local directory, and (this machine cannot|the hub has)"):
        check_hf_policy(policy_config("nobody/no-such-model"))


def test_an_unloadable_directory_names_the_key_path_expected_files_and_make_tiny(tmp_path,
                                                                                   tiny_lm):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_lm, broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ValueError) as info:
        check_hf_policy(policy_config(str(broken)))
    message = str(info.value)
    assert message.startswith(f"policy.pretrained: cannot load the model config of '{broken}': ")
    for part in ("expected a Hugging Face model directory", "config.json",
                 "model.safetensors", "tokenizer.json",
                 "python -m lightning_adv make-tiny --out models/tiny_lm",
                 "--model.policy.pretrained=models/tiny_lm"):
        assert part in message, (part, message)
    # The checks before loading give the same expectation and hint.
    for path in ("./nowhere", "nobody/no-such-model"):
        with pytest.raises(ValueError, match=r"expected a Hugging Face model directory.*"
                                             r"python -m lightning_adv make-tiny"):
            check_hf_policy(policy_config(path))


def test_saving_prints_no_progress_bars(tmp_path, tiny_lm, capfd):
    from transformers.utils import logging

    from lightning_adv.trainer.policies.hf.make_tiny import make_tiny

    logging.enable_progress_bar()  # as a user's session might have it
    try:
        make_tiny(tmp_path / "tiny")
        policy = build_hf_policy(policy_config(tiny_lm), seed=0)
        logging.enable_progress_bar()
        policy.save_pretrained(tmp_path / "saved", AutoTokenizer.from_pretrained(tiny_lm))
        captured = capfd.readouterr()
        assert "Writing model shards" not in captured.err + captured.out
        assert logging.is_progress_bar_enabled()  # the caller's setting is restored
    finally:
        logging.disable_progress_bar()
    assert (tmp_path / "tiny" / "model.safetensors").is_file()
    assert (tmp_path / "saved" / "model.safetensors").is_file()


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path):
    ViTModel(ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=8, image_size=8, patch_size=4)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a 'vit' model .*not a causal language model"):
        check_hf_policy(policy_config(str(tmp_path)))


def test_float16_on_cpu_and_lora_without_peft(tiny_lm, monkeypatch):
    with pytest.raises(ValueError, match="policy.dtype: float16 needs a GPU"):
        check_device_dtype("float16", "cpu")
    check_device_dtype("bfloat16", "cpu")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ValueError, match=r"policy.lora: LoRA needs the peft package.*"
                                         r"pip install 'lightning_adv\[lora\]'"):
        check_hf_policy(policy_config(tiny_lm, lora={"r": 2}))


def test_config_errors():
    with pytest.raises(ValueError, match="policy.dtype"):
        PolicyConfig(pretrained="x", dtype="float8")
    with pytest.raises(ValueError, match="policy.critic_pretrained: a separate critic needs"):
        PolicyConfig(pretrained="x", critic_pretrained="y", value_head=False)
    with pytest.raises(ValueError, match="policy.lora.r"):
        PolicyConfig(pretrained="x", lora={"r": 0})
    with pytest.raises(ValueError, match="policy.lora: unknown keys"):
        PolicyConfig(pretrained="x", lora={"rank": 4})


# ---------------------------------------------------------------------- policy and critic

def test_logits_and_shared_trunk_values(tiny_lm):
    policy = build_hf_policy(policy_config(tiny_lm, value_head=True), seed=0)
    logits, values = policy(IDS)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    torch.testing.assert_close(logits, model(IDS).logits)
    assert values.shape == (2, 6) and torch.all(values == 0)  # the head starts at zero
    perturb(policy.value_head)
    _, values = policy(IDS)
    hidden = AutoModel.from_pretrained(tiny_lm)(IDS).last_hidden_state
    torch.testing.assert_close(values, policy.value_head(hidden).squeeze(-1))
    assert build_hf_policy(policy_config(tiny_lm, value_head=False), seed=0)(IDS)[1] is None


def test_separate_critic_reads_its_own_trunk(tiny_lm, tiny_llama_no_pad):
    policy = build_hf_policy(policy_config(tiny_lm, critic_pretrained=tiny_llama_no_pad), seed=0)
    perturb(policy.value_head)
    logits, values = policy(IDS)
    hidden = AutoModel.from_pretrained(tiny_llama_no_pad)(IDS).last_hidden_state
    torch.testing.assert_close(values, policy.value_head(hidden).squeeze(-1))
    torch.testing.assert_close(logits, AutoModelForCausalLM.from_pretrained(tiny_lm)(IDS).logits)
    names = {n.split(".")[0] for n, _ in policy.named_parameters()}
    assert names == {"model", "critic", "value_head"}


def test_frozen_copy_reference(tiny_lm):
    policy = build_hf_policy(policy_config(tiny_lm), seed=0)
    reference = policy.reference()
    before = policy(IDS)[0]
    perturb(policy.model)
    assert not torch.allclose(policy(IDS)[0], before)
    torch.testing.assert_close(reference(IDS)[0], before)
    assert not any(p.requires_grad for p in reference.parameters())
    assert reference(IDS)[1] is None  # no value head


def test_lora_reference_is_the_policy_with_adapters_disabled(tiny_lm):
    config = policy_config(tiny_lm, value_head=False,
                           lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    policy = build_hf_policy(config, seed=0)
    base = AutoModelForCausalLM.from_pretrained(tiny_lm)(IDS).logits
    torch.testing.assert_close(policy(IDS)[0], base)  # LoRA's B starts at zero
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    reference = policy.reference()
    assert isinstance(reference, AdapterDisabledReference) and not isinstance(reference, torch.nn.Module)
    perturb(policy)
    assert not torch.allclose(policy(IDS)[0], base, atol=1e-3)
    torch.testing.assert_close(policy.reference_logits(IDS), base)
    # its scores: the log-probs of the model without adapters
    lengths = (IDS != 0).sum(1)
    scores = reference.token_scores(IDS, lengths, ScoreRequest(frozenset({"logprobs"})))
    has_next = torch.arange(IDS.shape[1])[None] < (lengths - 1)[:, None]
    torch.testing.assert_close(scores["logprobs"], next_token_logprobs(base, IDS) * has_next)
    # the adapters' initialisation comes from the seed
    name = next(n for n in trainable if "lora_A" in n)
    first, again, other = (dict(build_hf_policy(config, seed=s).named_parameters())[name]
                           for s in (0, 0, 1))
    assert torch.equal(first, again) and not torch.equal(first, other)


# ---------------------------------------------------------------------- saving

@pytest.mark.parametrize("lora", [None, "merged", "adapter"])
def test_saved_policy_loads_with_auto_model_and_generates(tiny_lm, tmp_path, lora):
    kwargs = {} if lora is None else {"lora": {"r": 4, "target_modules": ["q_proj", "v_proj"],
                                               "save": lora}}
    policy = build_hf_policy(policy_config(tiny_lm, value_head=True, **kwargs), seed=0)
    perturb(policy)
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    out = policy.save_pretrained(tmp_path / "hf_model", tokenizer)
    assert (out / "value_head.safetensors").is_file()
    assert (out / "adapter_config.json").is_file() == (lora == "adapter")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, policy(IDS)[0], atol=1e-5, rtol=1e-5)
    prompt = AutoTokenizer.from_pretrained(out)("Reverse: ab", return_tensors="pt")
    generated = loaded.generate(**prompt, max_new_tokens=3, do_sample=False)
    assert generated.shape[1] == prompt["input_ids"].shape[1] + 3 or generated[0, -1] in (
        tokenizer.eos_token_id, tokenizer.pad_token_id)
    if lora is not None:  # saving a merged copy leaves the training model's adapters alone
        assert any("lora_" in n for n, _ in policy.named_parameters())


@pytest.mark.parametrize("lora", [None, "merged", "adapter"])
def test_save_from_a_gathered_state_dict(tiny_lm, tmp_path, lora):
    """Under FSDP2 the trainer passes the gathered full state dict; it is what is written,
    LoRA adapters included (merged into an unsharded copy, or alone)."""
    from peft import AutoPeftModelForCausalLM
    from safetensors.torch import load_file

    adapters = None if lora is None else {"r": 4, "target_modules": ["q_proj", "v_proj"],
                                          "save": lora}
    config = policy_config(tiny_lm, value_head=True, lora=adapters)
    policy = build_hf_policy(config, seed=0)
    trained = build_hf_policy(config, seed=0)
    perturb(trained)
    out = policy.save_pretrained(tmp_path / "m", AutoTokenizer.from_pretrained(tiny_lm),
                                 state_dict=trained.state_dict())
    assert (out / "adapter_config.json").is_file() == (lora == "adapter")
    loaded = (AutoPeftModelForCausalLM if lora == "adapter" else AutoModelForCausalLM
              ).from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, trained(IDS)[0], atol=1e-5, rtol=1e-5)
        # the policy that saved holds other weights: the state dict is what was written
        assert not torch.allclose(policy(IDS)[0], trained(IDS)[0], atol=1e-3)
    torch.testing.assert_close(load_file(out / "value_head.safetensors")["weight"],
                               trained.value_head.weight)
