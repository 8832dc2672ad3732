"""The built-in policy's KV cache: incremental decoding equals re-reading the prefix."""

import pytest
import torch

from lightning_adv.trainer import PolicyConfig, TaskConfig
from lightning_adv.trainer.policies.base import GenerationRequest, SamplingParams
from lightning_adv.trainer.policies.tiny import TinyPolicy
from lightning_adv.trainer.policies.tiny_network import KVCache
from lightning_adv.trainer.policies.logprobs import next_token_logprobs
from lightning_adv.trainer.rollout.batch import build_batch
from lightning_adv.trainer.tasks.runtime import TaskRuntime
from lightning_adv.trainer.data import generator


def trained_looking_policy(value_head=True, vocab=11, width=24):
    torch.manual_seed(0)
    policy = TinyPolicy(PolicyConfig(d_model=32, n_layers=2, n_heads=4,
                                     value_head=value_head), vocab, width)
    with torch.no_grad():  # the LM and value heads start at zero; make them matter
        for p in policy.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    return policy.eval()


def test_forward_cached_matches_a_full_forward_pass_for_ragged_reads():
    policy = trained_looking_policy()
    g = torch.Generator().manual_seed(1)
    buffer = torch.randint(0, 11, (3, 20), generator=g)
    full_logits, full_values = policy(buffer)
    cache = KVCache(policy, 3, 20)
    # rows advance unevenly: prompts of 4/7/1 tokens, then 1-token steps, then a 5-token
    # "environment reply" for row 1 only, then the rest
    schedule = [torch.tensor([4, 7, 1]), torch.tensor([5, 8, 2]), torch.tensor([6, 13, 3]),
                torch.tensor([20, 20, 20])]
    rows = torch.arange(3)
    for lengths in schedule:
        start = cache.filled.clone()
        logits, values, positions = policy.forward_cached(buffer, rows, lengths, cache)
        for r in range(3):
            for i, pos in enumerate(positions[r].tolist()):
                if pos < 20:
                    assert start[r] <= pos < lengths[r]
                    assert torch.allclose(logits[r, i], full_logits[r, pos], atol=1e-5)
                    assert torch.allclose(values[r, i], full_values[r, pos], atol=1e-5)
        real = (positions < 20).sum(1)
        assert torch.equal(real, lengths - start)
    # a subset of rows can be read while the others wait
    cache = KVCache(policy, 3, 20)
    policy.forward_cached(buffer, torch.tensor([0, 2]), torch.tensor([9, 9]), cache)
    assert cache.filled.tolist() == [9, 0, 9]
    logits, _, _ = policy.forward_cached(buffer, torch.tensor([2]), torch.tensor([10]), cache)
    assert torch.allclose(logits[0, 0], full_logits[2, 9], atol=1e-5)


@pytest.mark.parametrize("task", ["reverse", "guess"])
def test_cached_sampling_draws_the_same_episodes(task):
    runtime = TaskRuntime(TaskConfig(name=task))
    width = runtime.task.max_episode_len(runtime.task.max_new_tokens)
    policy = trained_looking_policy(vocab=len(runtime.vocab), width=width)

    def request(kv_cache):
        return GenerationRequest([0, 5, 9], 3, runtime.task.max_new_tokens,
                                 SamplingParams(temperature=1.0, kv_cache=kv_cache))

    plain = policy.generate(runtime, request(False), generator(0, "t"))
    cached = policy.generate(runtime, request(True), generator(0, "t"))
    eps_plain = [ep for g in plain for ep in g]
    eps_cached = [ep for g in cached for ep in g]
    assert any(not ep.truncated for ep in eps_plain)
    for a, b in zip(eps_plain, eps_cached):
        assert a.tokens == b.tokens and a.generated == b.generated
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.values is None and len(b.values) == len(b.tokens)
    # the sampler's values are the critic's values of a full forward pass
    batch, _ = build_batch(cached, multi_turn=task == "guess", process_rewards=False)
    _, values = policy(batch["input_ids"])
    real = batch["attention_mask"]
    assert torch.allclose(batch["values"][real], values[real], atol=1e-5)
    # and the behaviour log-probs those of a full forward pass
    logp = next_token_logprobs(policy(batch["input_ids"])[0], batch["input_ids"])
    shifted = torch.nn.functional.pad(logp[:, :-1], (1, 0))
    gen_mask = batch["loss_mask"].bool()
    assert torch.allclose(batch["logprobs"][gen_mask], shifted[gen_mask], atol=1e-5)


def test_no_values_without_a_value_head():
    runtime = TaskRuntime(TaskConfig(name="reverse"))
    width = runtime.task.max_episode_len(runtime.task.max_new_tokens)
    policy = trained_looking_policy(value_head=False, vocab=len(runtime.vocab), width=width)
    groups = policy.generate(runtime, GenerationRequest([0], 2, runtime.task.max_new_tokens),
                             generator(0, "t"))
    assert all(ep.values is None for ep in groups[0])
    batch, _ = build_batch(groups, multi_turn=False, process_rewards=False)
    assert "values" not in batch


def test_prompts_shared_by_a_group_of_samples_are_read_once():
    """A prompt's samples share its tokens: the cache reads the group's first row and
    copies it, with the numbers of reading every row (and reads every row when a group's
    rows differ)."""
    from lightning_adv.trainer.policies.tiny_sampling import _CachedReader

    policy = trained_looking_policy()
    g = torch.Generator().manual_seed(2)
    prompts = torch.randint(1, 11, (4, 20), generator=g)
    buffer = prompts.repeat_interleave(3, dim=0)  # 4 prompts x 3 samples
    lengths = torch.tensor([5, 7, 2, 6]).repeat_interleave(3)
    calls = []
    forward = policy.forward_cached

    def counted(buffer, rows, lengths, cache):
        calls.append(len(rows))
        return forward(buffer, rows, lengths, cache)

    policy.forward_cached = counted
    each = _CachedReader(policy, 12, 20)
    want = each.read_prompts(buffer, lengths, 1)
    shared = _CachedReader(policy, 12, 20)
    got = shared.read_prompts(buffer, lengths, 3)
    assert calls == [12, 4]
    assert torch.allclose(got, want, atol=1e-6) and torch.equal(shared.cache.filled, lengths)
    assert torch.allclose(shared.values, each.values, atol=1e-6)
    for (k1, v1), (k2, v2) in zip(shared.cache.layers, each.cache.layers):
        assert torch.allclose(k1, k2, atol=1e-6) and torch.allclose(v1, v2, atol=1e-6)
    # the next token reads the same from either cache
    buffer[:, 7] = 3
    step = lengths.clamp(min=7) + 1
    assert torch.allclose(shared.read(buffer, torch.arange(12), step),
                          each.read(buffer, torch.arange(12), step), atol=1e-5)
    # rows of a group that differ are read one by one
    buffer[4, 0] = (buffer[4, 0] % 10) + 1
    calls.clear()
    _CachedReader(policy, 12, 20).read_prompts(buffer, lengths, 3)
    assert calls == [12]


def test_forward_cached_rows_that_read_nothing_beside_rows_that_read_several():
    """Only the new tokens go through the linear layers: a row with nothing new (a
    finished episode) beside rows reading one and several tokens changes nothing."""
    policy = trained_looking_policy()
    g = torch.Generator().manual_seed(3)
    buffer = torch.randint(0, 11, (3, 20), generator=g)
    full_logits, full_values = policy(buffer)
    cache = KVCache(policy, 3, 20)
    policy.forward_cached(buffer, torch.arange(3), torch.tensor([5, 5, 5]), cache)
    logits, values, positions = policy.forward_cached(buffer, torch.arange(3),
                                                      torch.tensor([5, 6, 9]), cache)
    assert positions.tolist() == [[20] * 4, [5, 20, 20, 20], [5, 6, 7, 8]]
    assert torch.allclose(logits[1, 0], full_logits[1, 5], atol=1e-5)
    assert torch.allclose(logits[2], full_logits[2, 5:9], atol=1e-5)
    assert torch.allclose(values[2], full_values[2, 5:9], atol=1e-5)
    assert cache.filled.tolist() == [5, 6, 9]
    logits, _, _ = policy.forward_cached(buffer, torch.arange(3), torch.tensor([6, 7, 10]), cache)
    assert torch.allclose(logits[:, 0], full_logits[[0, 1, 2], [5, 6, 9]], atol=1e-5)


def test_forward_cached_under_bf16_autocast():
    """Lightning's bf16-mixed precision runs the sampler under autocast: the new keys and
    values (bf16) go into the float32 cache."""
    policy = trained_looking_policy()
    buffer = torch.randint(0, 11, (2, 20), generator=torch.Generator().manual_seed(4))
    cache = KVCache(policy, 2, 20)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full_logits, _ = policy(buffer)
        policy.forward_cached(buffer, torch.arange(2), torch.tensor([6, 3]), cache)
        logits, _, _ = policy.forward_cached(buffer, torch.arange(2), torch.tensor([7, 4]), cache)
    assert torch.allclose(logits[:, 0].float(), full_logits[[0, 1], [6, 3]].float(), atol=0.1)
