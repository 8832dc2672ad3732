"""Each shared prefix read once (``SharedPrefixes``, ``shared_prefix_pass``): on random
trees of rows (a prompt, then segments branching at random depths, rows of different
lengths right-padded), the per-token log-probs and their gradients with respect to the
model's parameters equal those of a forward pass over each row alone (float32, within
1e-5); a batch without sharing and a plain prompt-group batch make exactly the two
calls of prompt sharing; the cut rule ``(k - 1) * L >= min_saved``."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from lightning_adv.trainer.policies.base import PromptGroups
from lightning_adv.trainer.policies.hf.policy import build_hf_policy
from lightning_adv.trainer.policies.hf.prompt_sharing import (
    SharedPrefixes, causal_lm_pass)
from lightning_adv.trainer.policies.shared_prefixes import MIN_SAVED_TOKENS
from lightning_adv.trainer import PolicyConfig
from tests.support.trees import random_tree_rows


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tiny_lm, tiny_llama_no_pad):
    path = tiny_lm if request.param == "qwen2" else tiny_llama_no_pad
    policy = build_hf_policy(PolicyConfig(pretrained=path, dtype="float32"), seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # away from the near-uniform initialisation
        for p in policy.model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return policy.model.eval()


def next_token_logprobs(logits, ids):
    """``[B, T-1]``: each position's log-prob of the token after it."""
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]


def per_row_and_shared(model, ids, lengths, shared, weights):
    """(log-probs, gradients) of each row read alone, and of the shared-prefix pass; the
    loss weighs each position's log-prob by ``weights``."""
    results = []
    for rows_alone in (True, False):
        model.zero_grad()
        if rows_alone:
            logprobs = torch.zeros(ids.shape[0], ids.shape[1] - 1)
            for r, n in enumerate(lengths.tolist()):
                row = ids[r:r + 1, :n]
                logprobs[r, :n - 1] = next_token_logprobs(model(input_ids=row).logits, row)[0]
        else:
            logits, _ = causal_lm_pass(model, ids, shared, hidden=False)
            logprobs = next_token_logprobs(logits, ids)
        real = torch.arange(ids.shape[1] - 1)[None] < (lengths - 1)[:, None]
        (logprobs * weights * real).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((logprobs.detach() * real, grads))
    return results


def assert_same(results):
    (alone, alone_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, alone, atol=1e-5, rtol=1e-5)
    scale = max(float(g.abs().max()) for g in alone_grads.values())
    assert scale > 0.1
    for name, grad in alone_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5 * scale, rtol=1e-5,
                                   msg=name)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("min_saved", [1, 8])
def test_random_trees_give_the_log_probs_and_gradients_of_each_row_alone(model, seed,
                                                                         min_saved):
    gen = torch.Generator().manual_seed(seed)
    ids, lengths, prompt_lengths = random_tree_rows(gen)
    shared = SharedPrefixes.of(ids, prompt_lengths, min_saved=min_saved)
    if min_saved == 1:  # every branch point is a cut: the trees are read level by level
        assert len(shared.levels) > 2
    assert sum(level.mask.sum() for level in shared.levels) < ids.numel()
    weights = torch.rand(ids.shape[0], ids.shape[1] - 1, generator=gen)
    assert_same(per_row_and_shared(model, ids, lengths, shared, weights))


def test_a_batch_without_sharing_is_read_row_by_row_in_two_calls(model):
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([9, 5, 12, 7])
    ids = torch.randint(3, 250, (4, 13), generator=gen) * (
        torch.arange(13)[None] < lengths[:, None])
    prompt_lengths = torch.tensor([3, 4, 2, 6])
    shared = SharedPrefixes.of(ids, prompt_lengths, min_saved=1)
    assert [level.ids.shape for level in shared.levels] == [(4, 6), (4, 11)]
    weights = torch.rand(4, 12, generator=gen)
    assert_same(per_row_and_shared(model, ids, lengths, shared, weights))


def recorded_calls(model, ids, shared):
    """The (ids, attention mask, positions) of each model call of the shared pass, and
    its logits."""
    calls, forward = [], model.forward

    def recording(**kwargs):
        calls.append((kwargs["input_ids"], kwargs["attention_mask"], kwargs["position_ids"]))
        return forward(**kwargs)

    model.forward = recording
    try:
        with torch.no_grad():
            logits, _ = causal_lm_pass(model, ids, shared, hidden=False)
    finally:
        del model.forward
    return calls, logits


def test_a_prompt_group_batch_makes_the_two_calls_of_prompt_sharing(model):
    """Rows sharing only their prompts (as GRPO samples): the distinct prompts left-padded,
    then every row's tokens after its prompt to the batch's width (left-padded), over the
    prompt's keys and values: the calls of reading each prompt once."""
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 250, (n,), generator=gen) for n in (5, 3)]
    rows = [torch.cat([p, torch.randint(3, 250, (k,), generator=gen)])
            for p in prompts for k in (4, 6, 2)]
    ids = torch.zeros(6, 12, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    prompt_lengths = torch.tensor([5, 5, 5, 3, 3, 3])
    calls, logits = recorded_calls(model, ids, SharedPrefixes.of(ids, prompt_lengths))
    assert len(calls) == 2
    (first_ids, first_mask, first_positions), (ids2, mask2, positions2) = calls
    assert torch.equal(first_ids, torch.stack([prompts[0], torch.cat(
        [torch.zeros(2, dtype=torch.long), prompts[1]])]))
    assert torch.equal(first_mask, torch.tensor([[1] * 5, [0, 0, 1, 1, 1]]))
    assert torch.equal(first_positions, torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]))
    assert ids2.shape == (6, 9)  # 12 - 3 columns after the shortest prompt
    # every row's tokens after its prompt, right-aligned, over its prompt's mask
    for r in range(6):
        n = int(prompt_lengths[r])
        assert torch.equal(ids2[r, 9 - (12 - n):], ids[r, n:])
        assert torch.equal(positions2[r, 9 - (12 - n):], torch.arange(n, 12))
        assert torch.equal(mask2[r], torch.cat([first_mask[r // 3], torch.tensor(
            [0] * (n - 3) + [1] * (12 - n))]))
    with torch.no_grad():
        whole = model(input_ids=ids).logits
    torch.testing.assert_close(logits, whole, atol=1e-5, rtol=1e-5)


def test_no_cut_beyond_the_prompts_when_asked(model):
    ids, lengths, prompt_lengths = random_tree_rows(torch.Generator().manual_seed(5))
    shared = SharedPrefixes.of(ids, prompt_lengths, beyond_prompts=False, min_saved=1)
    assert len(shared.levels) == 2 and len(shared.levels[1].ids) == len(ids)
    calls, logits = recorded_calls(model, ids, shared)
    with torch.no_grad():
        whole = model(input_ids=ids).logits
    torch.testing.assert_close(logits, whole, atol=1e-5, rtol=1e-5)


def test_the_cut_rule():
    """Three rows sharing 10 tokens past a 4-token prompt save (3 - 1) * 10 = 20 reads:
    read with the prompt from min_saved 20 down, each row's own above; under a prompt
    with more rows, a cut of its own; rows the same to the end are one segment."""
    gen = torch.Generator().manual_seed(6)
    shared_run = torch.randint(3, 250, (14,), generator=gen)
    rows = torch.stack([torch.cat([shared_run, torch.full((3,), token)])
                        for token in (7, 8, 9)])
    prompt_lengths = torch.full((3,), 4)
    widths = {m: [tuple(level.ids.shape) for level in SharedPrefixes.of(
        rows, prompt_lengths, min_saved=m).levels] for m in (20, 21)}
    assert widths == {20: [(1, 14), (3, 3)], 21: [(1, 4), (3, 13)]}
    # a fourth row with the prompt alone: the three's run is a segment under the prompt
    other = torch.cat([shared_run[:4], torch.full((13,), 5)])[None]
    levels = SharedPrefixes.of(torch.cat([rows, other]), torch.full((4,), 4),
                               min_saved=20).levels
    assert [tuple(level.ids.shape) for level in levels] == [(1, 4), (2, 13), (3, 3)]
    assert levels[1].mask.tolist() == [[0, 0, 0] + [1] * 10, [1] * 13]
    same = SharedPrefixes.of(rows[[0, 0, 1]], prompt_lengths, min_saved=21)
    assert [tuple(level.ids.shape) for level in same.levels] == [(1, 4), (2, 13)]
    assert torch.equal(same.source[0], same.source[1])
    with pytest.raises(ValueError, match="min_saved: expected a number of token reads of at "
                                         "least 1, got 0"):
        SharedPrefixes.of(rows, prompt_lengths, min_saved=0)
    assert MIN_SAVED_TOKENS == 32


def test_a_policy_reads_tree_rows_once_with_a_critic(tiny_lm):
    """``HFPolicy.train_forward`` given prompt groups of tree rows: the log-probs,
    entropies, values and gradients of the pass without them (the critic a model of its
    own, read by the same segments)."""
    policy = build_hf_policy(PolicyConfig(pretrained=tiny_lm, value_head=True,
                                          critic_pretrained=tiny_lm), seed=0)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    ids, lengths, prompt_lengths = random_tree_rows(gen, duplicate=False)
    real = torch.arange(ids.shape[1])[None] < lengths[:, None]
    results = []
    for prompts in (None, PromptGroups(prompt_lengths, 2)):
        policy.zero_grad()
        logprobs, values, ent = policy.train_forward(ids, real, 0.8, True, prompts)
        (((logprobs + 0.1 * ent) * real).sum() + (values * real).square().sum()).backward()
        results.append(([x.detach() * real for x in (logprobs, values, ent)],
                        {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (whole, whole_grads), (shared, shared_grads) = results
    for a, b in zip(shared, whole):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    scale = max(float(g.abs().max()) for g in whole_grads.values())
    for name, grad in whole_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5 * scale, rtol=1e-5,
                                   msg=name)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), min_saved=st.integers(1, 40),
       prompts=st.integers(1, 3), depth=st.integers(1, 4))
def test_any_tree_and_cut_rule_give_the_whole_batch_logits(model, seed, min_saved, prompts,
                                                           depth):
    ids, _, prompt_lengths = random_tree_rows(torch.Generator().manual_seed(seed), prompts,
                                              depth)
    shared = SharedPrefixes.of(ids, prompt_lengths, min_saved=min_saved)
    with torch.no_grad():
        logits, _ = causal_lm_pass(model, ids, shared, hidden=False)
        whole = model(input_ids=ids).logits
    torch.testing.assert_close(logits, whole, atol=1e-5, rtol=1e-5)
