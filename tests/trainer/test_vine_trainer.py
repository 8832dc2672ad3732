"""The built-in trainer samples VinePPO's step values (``ppo.vine``): responses cut into
steps, ``k`` continuations from each step boundary scored by the task's reward, the batch
keys ``step_ids`` and ``mc_returns``, continuations out of the update, config errors."""

import math

import pytest
import torch

from lightning_adv import ActorConfig
from lightning_adv.trainer.config import VineConfig
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.ppo import PPOModule
from lightning_adv.trainer.rollout.vine import step_starts, token_step_ids
from lightning_adv.trainer.tasks.base import Vocab
from lightning_adv.trainer.tasks.episode import Episode
from tests.support.trainer_helpers import response_of_code

VINE_ACTOR = {"kl_ctl": 0.0, "advantage": {"estimator": {"implementation": "vine"}}}
REVERSE = {"name": "reverse", "kwargs": {"alphabet": "abcde", "min_len": 3, "max_len": 6}}
POLICY = {"d_model": 16, "n_layers": 1, "n_heads": 2, "value_head": False}


def module(vine=None, actor=VINE_ACTOR, task=REVERSE, **ppo):
    vine = {"k": 3, "every_n_tokens": 2} if vine is None else vine
    return PPOModule(actor=actor, policy=POLICY, task=task, seed=4, ppo={
        "prompts_per_step": 2, "n_samples": 3, "minibatches": 2, "epochs": 1, "vine": vine,
        **ppo})


def response(ep):
    return [t for t, g in zip(ep.tokens, ep.generated) if g]


# ------------------------------------------------------------------ steps

def hand_episode(vocab, text, logprobs, eos=True):
    tokens = [vocab.stoi[c] for c in text] + ([vocab.eos_id] if eos else [])
    prompt = [vocab.bos_id, vocab.stoi["a"]]
    return Episode(0, None, prompt + tokens, [False, False] + [True] * len(tokens),
                   [0.0, 0.0] + logprobs, [-1, -1] + [0] * len(tokens), [])


def test_step_boundaries_of_each_rule_and_the_token_aligned_step_ids():
    vocab = Vocab("ab\n")
    logprobs = [math.log(p) for p in (0.9, 0.2, 0.8, 0.05, 0.6, 0.9)]
    ep = hand_episode(vocab, "a\nb\nb", logprobs)   # 5 letters + EOS
    assert step_starts(ep, VineConfig(boundaries="every_n_tokens", every_n_tokens=2),
                       vocab) == [0, 2, 4]
    assert step_starts(ep, VineConfig(boundaries="every_n_tokens", every_n_tokens=4),
                       vocab) == [0, 4]
    # a step begins after each token holding a newline, if a token follows (EOS counts)
    newline = VineConfig(boundaries="newline")
    assert step_starts(ep, newline, vocab) == [0, 2, 4]
    assert step_starts(hand_episode(vocab, "ab\n", logprobs[:3], eos=False), newline,
                       vocab) == [0]
    assert step_starts(hand_episode(vocab, "ab\n", logprobs[:4]), newline, vocab) == [0, 3]
    # a step begins at each token drawn with probability below low_prob (not the first)
    assert step_starts(ep, VineConfig(boundaries="low_prob", low_prob=0.3), vocab) == [0, 1, 3]
    assert step_starts(ep, VineConfig(boundaries="low_prob", low_prob=0.1), vocab) == [0, 3]
    assert token_step_ids(ep, [0, 1, 3]) == [-1, -1, 0, 1, 1, 2, 2, 2]
    assert token_step_ids(ep, [0, 2, 4]) == [-1, -1, 0, 0, 1, 1, 2, 2]


# ------------------------------------------------------------------ sampled step values

def test_each_return_is_the_task_reward_of_the_prefix_and_its_continuation():
    # The reward is the response written as a number: each return reads back as the text
    # the task scored, which must start with the response's tokens up to the boundary.
    model = module(task={**REVERSE, "reward": "tests.support.trainer_helpers.response_code"},
                   actor={**VINE_ACTOR, "reward_clip": math.inf}, vine={"k": 3,
                                                                          "every_n_tokens": 2})
    groups = model.rollout([0, 1], generator(5, "vine"))
    vocab, limit = model.runtime.vocab, model.max_new_tokens
    continuations = set()
    for ep in (ep for group in groups for ep in group):
        text = vocab.decode(response(ep))
        starts = list(range(0, len(response(ep)), 2))
        assert ep.step_ids == token_step_ids(ep, starts)
        assert len(ep.mc_returns) == len(starts)
        tokens = 0
        for start, returns in zip(starts, ep.mc_returns):
            assert len(returns) == 3 and all(math.isfinite(r) for r in returns)
            for r in returns:
                scored = response_of_code(r)
                assert scored.startswith(text[:start]), (text, start, scored)
                continuations.add((text[:start], scored))
                ended = len(scored) < limit   # (an unfinished response has no EOS)
                tokens += len(scored) + ended - start
        assert ep.continuation_tokens == tokens
    assert len(continuations) > 10   # sampled, not copies of the responses


@pytest.mark.parametrize("kv_cache", [True, False])
def test_a_near_greedy_policy_continues_each_response_as_it_was_sampled(kv_cache):
    # At temperature 1e-5 every draw is the argmax: each continuation from a boundary
    # repeats the rest of its response, so each return is the response's reward,
    # discounted once per step after its first, and every advantage is 0.
    model = module(actor={**VINE_ACTOR, "discount": 0.5}, temperature=1e-5,
                   vine={"k": 2, "every_n_tokens": 2}, kv_cache=kv_cache)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():  # (a fresh policy's zero head is uniform at any temperature)
        for p in model.policy.parameters():
            p.add_(torch.randn(p.shape, generator=noise))
    groups = model.rollout([0, 1], generator(5, "vine"))
    for ep in (ep for group in groups for ep in group):
        n = len(response(ep))
        steps = math.ceil(n / 2)
        assert ep.mc_returns == [[0.5 ** (steps - 1 - k) * ep.reward] * 2 for k in range(steps)]
        assert ep.continuation_tokens == 2 * sum(n - start for start in range(0, n, 2))
    batch, meta = model.make_batch(groups)
    out = model.advantage(batch, meta)
    assert torch.allclose(out["advantages"], torch.zeros_like(out["advantages"]), atol=1e-6)


def test_the_batch_holds_one_row_per_response_with_its_step_slots():
    model = module(vine={"k": 2, "boundaries": "low_prob", "low_prob": 0.3})
    groups = model.rollout([0, 1], generator(6, "vine"))
    batch, meta = model.make_batch(groups)
    episodes = [ep for group in groups for ep in group]
    assert batch["input_ids"].shape[0] == len(episodes) == 6   # continuations add no row
    slots = [len(step_starts(ep, model.ppo_config.vine, model.runtime.vocab)) for ep in episodes]
    assert max(slots) > 1   # some response has several steps
    table = batch["mc_returns"]
    assert table.shape == (6, max(slots), 2)
    for b, n in enumerate(slots):
        assert torch.isfinite(table[b, :n]).all() and torch.isnan(table[b, n:]).all()
        ids = batch["step_ids"][b]
        generated = batch["loss_mask"][b] > 0
        assert (ids[~generated] == -1).all() and int(ids[generated].max()) == n - 1
    out = model.advantage(batch, meta)
    assert torch.isfinite(out["advantages"]).all()
    assert (out["advantages"] != 0).any()


def test_continuations_are_drawn_from_the_step_generator():
    first = module().rollout([0], generator(7, "vine"))
    again = module().rollout([0], generator(7, "vine"))
    other = module().rollout([0], generator(8, "vine"))
    assert [ep.mc_returns for ep in first[0]] == [ep.mc_returns for ep in again[0]]
    assert [ep.mc_returns for ep in first[0]] != [ep.mc_returns for ep in other[0]]


# ------------------------------------------------------------------ config errors

@pytest.mark.parametrize("vine, actor, task, message", [
    (None, VINE_ACTOR, REVERSE, "ppo.vine: the advantage stages read the batch key 'mc_returns'"),
    ({"k": 2}, {"kl_ctl": 0.0}, REVERSE, "set actor.advantage.estimator: vine or ppo.vine: null"),
    ({"k": 2}, VINE_ACTOR, {"name": "guess"}, "sampling through the environment"),
    ({"k": 2}, {**VINE_ACTOR, "reward_norm": {"mean_level": "batch"}}, REVERSE,
     "actor.reward_norm would change the episodes' rewards"),
    ({"k": 2}, {**VINE_ACTOR, "truncated_reward": {"value": -1.0}}, REVERSE,
     "actor.truncated_reward"),
    ({"k": 0}, VINE_ACTOR, REVERSE, "ppo.vine.k: expected a positive integer"),
    ({"boundaries": "sentence"}, VINE_ACTOR, REVERSE, "ppo.vine.boundaries: expected one of"),
    ({"low_prob": 0.2}, VINE_ACTOR, REVERSE, "ppo.vine.low_prob: expected null with boundaries"),
    ({"boundaries": "low_prob"}, VINE_ACTOR, REVERSE, "ppo.vine.low_prob"),
    ({"boundaries": "low_prob", "low_prob": 1.0}, VINE_ACTOR, REVERSE,
     "ppo.vine.low_prob: expected a probability in (0, 1)"),
    ({"n": 2}, VINE_ACTOR, REVERSE, "ppo.vine: unknown keys ['n']"),
])
def test_config_errors_name_the_keys(vine, actor, task, message):
    with pytest.raises(ValueError) as info:
        PPOModule(actor=actor, policy=POLICY, task=task, ppo={
            "prompts_per_step": 2, "n_samples": 2, "minibatches": 2, "vine": vine})
    assert message in str(info.value)
    if vine is None:
        assert "actor.advantage.estimator: vine" in str(info.value)


def test_without_vine_the_batch_has_no_step_values():
    model = PPOModule(actor={"kl_ctl": 0.0}, policy=POLICY, task=REVERSE,
                      ppo={"prompts_per_step": 2, "n_samples": 2, "minibatches": 2})
    batch, _ = model.make_batch(model.rollout([0], generator(1, "vine")))
    assert "mc_returns" not in batch and "step_ids" not in batch
    assert model.rollouts.vine is None


# ------------------------------------------------------------------ a Hugging Face policy

def test_a_hugging_face_policy_continues_from_the_prefixes(tiny_lm):
    from lightning_adv.trainer.policies.base import GenerationRequest, SamplingParams
    from lightning_adv.trainer.rollout.batch import score
    from lightning_adv.trainer.rollout.vine import StepValueSampling, sample_step_values
    from lightning_adv.trainer.tasks.runtime import TaskConfig
    from tests.hf.test_hf_sampling import setup

    policy, runtime = setup(tiny_lm, TaskConfig(name="reverse"))
    request = GenerationRequest([0, 1], 2, 6, SamplingParams())
    groups = policy.generate(runtime, request, generator(0, "hf"))
    score(groups, runtime)
    config = VineConfig(k=2, every_n_tokens=2)
    sample_step_values(policy, runtime, groups, StepValueSampling(config, ActorConfig()),
                       request, generator(1, "hf"))
    for ep in (ep for group in groups for ep in group):
        starts = list(range(0, len(response(ep)), 2))
        assert len(ep.mc_returns) == len(starts) and ep.continuation_tokens > 0
        assert all(len(r) == 2 and all(map(math.isfinite, r)) for r in ep.mc_returns)
    # one continuation by hand: the prompt, the prefix, then at most the turn's rest
    ep = groups[0][0]
    prefix = response(ep)[:2]
    (cont,), = policy.generate(runtime, GenerationRequest(
        [ep.index], 1, 6, SamplingParams(), prefixes=[prefix]), generator(2, "hf"))
    prompt = ep.generated.index(True)
    assert cont.tokens[:prompt + 2] == ep.tokens[:prompt + 2]
    assert cont.generated[prompt:prompt + 2] == [True, True] and cont.logprobs[prompt] == 0.0
    assert len(response(cont)) <= 6 and len(cont.turns) == 1
    assert cont.turns[0].text == runtime.vocab.decode(
        [t for t in response(cont) if t not in runtime.vocab.eos_ids])
