"""Each prompt read once for all its samples (``lightning_adv.trainer.policies.hf.prompt_sharing``):
``HFPolicy.train_forward`` and ``token_scores`` given the rows' prompt groups
(``PromptGroups``) give the log-probs, entropies, values, scores and gradients of one
pass over the whole batch without them (Qwen2 and Llama; a value head on the trunk, a
separate critic, LoRA and its adapter-free reference), and a whole training step is that
of the trainer reading every row whole. (The sampler's first step reads each distinct
prompt once too: ``tests/hf/test_hf_sampling.py``, with the KV cache it belongs to.)"""

import contextlib
from unittest import mock

import lightning.pytorch as pl
import pytest
import torch

from lightning_adv import ActorConfig
from lightning_adv.trainer import PPOConfig, PPOModule, PolicyConfig, TaskConfig
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.policies.base import SCORES, PromptGroups, ScoreRequest
from lightning_adv.trainer.policies.hf.policy import build_hf_policy
from lightning_adv.trainer.policies.hf.prompt_sharing import SharedPrefixes
from lightning_adv.trainer.tasks.text import write_text_dataset
from tests.support.trees import padded_in_random_order

CHAR_MATCH = "lightning_adv.trainer.tasks.text.char_match"

CASES = {
    "value head": {"value_head": True},
    "critic": {"value_head": True, "critic_pretrained": "MODEL"},
    "lora": {"value_head": True, "lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]}},
}


def rows_sharing_prompts(seed=0):
    """Three prompts (4, 7 and 5 tokens) with three responses each (1 to 5 tokens), right
    padded, shuffled, and one row whose prompt is a single token (split after it)."""
    gen = torch.Generator().manual_seed(seed)
    rows, prompt_lengths = [], []
    for n in (4, 7, 5):
        prompt = torch.randint(3, 250, (n,), generator=gen)
        for k in range(3):
            rows.append(torch.cat([prompt, torch.randint(3, 250, (1 + 2 * k,), generator=gen)]))
            prompt_lengths.append(n)
    rows.append(torch.randint(3, 250, (6,), generator=gen))
    prompt_lengths.append(0)
    return padded_in_random_order(rows, prompt_lengths, 1, gen)


def perturbed(policy, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return policy


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_shared_prompt_pass_is_one_pass_over_the_batch(arch, case, tiny_lm, tiny_llama_no_pad):
    path = tiny_lm if arch == "qwen2" else tiny_llama_no_pad
    fields = {k: (path if v == "MODEL" else v) for k, v in CASES[case].items()}
    policy = build_hf_policy(PolicyConfig(pretrained=path, **fields), seed=0)
    reference = policy.reference()
    perturbed(policy)
    ids, lengths, prompt_lengths = rows_sharing_prompts()
    # three prompts, and the row without one
    assert len(SharedPrefixes.of(ids, prompt_lengths).levels[0].ids) == 4
    groups = PromptGroups(prompt_lengths, 3)
    real = torch.arange(ids.shape[1])[None] < lengths[:, None]
    outputs, grads = {}, {}
    for name, prompts in (("whole", None), ("shared", groups)):
        policy.zero_grad()
        logprobs, values, ent = policy.train_forward(ids, real, 0.8, True, prompts)
        loss = ((logprobs + 0.1 * ent) * real).sum() + (values * real).square().sum()
        loss.backward()
        outputs[name] = (logprobs.detach(), values.detach(), ent.detach())
        grads[name] = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
    for whole, shared_out in zip(outputs["whole"], outputs["shared"]):
        torch.testing.assert_close(shared_out[real], whole[real], atol=1e-5, rtol=1e-5)
    scale = max(g.abs().max() for g in grads["whole"].values())
    assert scale > 1
    for name, grad in grads["whole"].items():
        torch.testing.assert_close(grads["shared"][name], grad, atol=1e-6 * scale, rtol=1e-5,
                                   msg=name)
    # the scoring passes: the policy's scores, and the reference's log-probs (under LoRA:
    # the policy, adapters disabled)
    scores = {name: policy.token_scores(ids, lengths, ScoreRequest(SCORES, 0.8, prompts))
              for name, prompts in (("whole", None), ("shared", groups))}
    assert scores["whole"].keys() == SCORES
    for key, whole in scores["whole"].items():
        torch.testing.assert_close(scores["shared"][key], whole, atol=1e-5, rtol=1e-5, msg=key)
    refs = {name: reference.token_scores(ids, lengths, ScoreRequest(
        frozenset({"logprobs"}), 0.8, prompts))["logprobs"]
        for name, prompts in (("whole", None), ("shared", groups))}
    torch.testing.assert_close(refs["shared"], refs["whole"], atol=1e-5, rtol=1e-5)
    next_real = torch.arange(ids.shape[1])[None] < (lengths - 1)[:, None]
    assert not torch.allclose(refs["whole"][next_real], scores["whole"]["logprobs"][next_real],
                              atol=1e-3)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    # prompts of different lengths, so the prompts are left-padded
    return str(write_text_dataset(tmp_path_factory.mktemp("d") / "r.jsonl", "reverse", n=16))


def one_step(tiny_lm, dataset, share, out):
    module = PPOModule(policy=PolicyConfig(pretrained=tiny_lm, value_head=True),
                       actor=ActorConfig(kl_ctl=0.05),
                       task=TaskConfig(dataset=dataset,
                                       reward="tests.support.trainer_helpers.response_length_reward"),
                       ppo=PPOConfig(prompts_per_step=3, n_samples=4, minibatches=2, epochs=1,
                                     lr=0.01, max_new_tokens=6, entropy_coef=0.01,
                                     kl_loss_coef=0.1),
                       evaluation={"num_prompts": 0}, seed=0)
    losses = []
    forward = module.loss_fn.forward

    def recording(*args, **kwargs):
        result = forward(*args, **kwargs)
        losses.append({k: v.detach().clone() for k, v in result.items()
                       if isinstance(v, torch.Tensor)})
        return result

    module.loss_fn.forward = recording
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=out)
    # share false: the policy's and the reference's passes read every row whole
    whole_rows = mock.patch("lightning_adv.trainer.policies.hf.policy._shared",
                            lambda *args: None)
    with contextlib.nullcontext() if share else whole_rows:
        trainer.fit(module)
    return losses, {n: p.detach() for n, p in module.policy.named_parameters()}


def test_a_training_step_reading_shared_prompts_is_the_whole_rows_step(tiny_lm, dataset,
                                                                       tmp_path):
    shared_losses, shared_weights = one_step(tiny_lm, dataset, True, tmp_path / "shared")
    whole_losses, whole_weights = one_step(tiny_lm, dataset, False, tmp_path / "whole")
    assert len(shared_losses) == len(whole_losses) == 2
    for a, b in zip(shared_losses, whole_losses):
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-5, msg=key)
    # Adam divides each gradient by its running scale, so where a gradient is near zero
    # its float rounding moves the weight by up to lr: the weights agree to a hundredth of
    # the two steps' largest move (2 lr = 0.02), the losses above to 1e-5
    for name, weight in whole_weights.items():
        torch.testing.assert_close(shared_weights[name], weight, atol=2e-4, rtol=0, msg=name)
