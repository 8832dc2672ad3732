"""Sampling from a Hugging Face policy with a KV cache: left-padded generation turned into
the right-padded SPEC batch, log-probs equal to the training forward pass's, EOS, stop
strings, pad = EOS, top-k / top-p, multi-turn chat replies."""

from dataclasses import replace

import pytest
import torch

from lightning_adv import ActorConfig, AdvantageModule
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.policies.hf.policy import build_hf_policy, check_hf_policy
from lightning_adv.trainer.policies.base import GenerationRequest, SamplingParams
from lightning_adv.trainer.policies.hf.sampling import hf_generate
from lightning_adv.trainer.policies.logprobs import next_token_logprobs
from lightning_adv.trainer.policies.config import PolicyConfig
from lightning_adv.trainer.rollout.batch import build_batch, score
from lightning_adv.trainer.tasks.runtime import TaskConfig, TaskRuntime
from lightning_adv.exceptions import TaskError
from lightning_adv.trainer.tasks.text import write_text_dataset

PLAIN = SamplingParams()


def setup(path, task=None, **policy_kwargs):
    task = task or TaskConfig(name="reverse")
    config = PolicyConfig(pretrained=path, **policy_kwargs)
    hf = check_hf_policy(config, task.chat_template)
    runtime = TaskRuntime(task, tokenizer=hf.tokenizer)
    runtime.context_window = hf.context_window
    policy = build_hf_policy(config, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a policy that is not uniform, so samples depend on the weights
        for p in policy.model.parameters():
            p.add_(0.08 * torch.randn(p.shape, generator=gen))
    return policy.eval(), runtime


def sample(policy, runtime, params=PLAIN, kv_cache=True, indices=(0, 1, 2, 3), n=3,
           max_new_tokens=6, seed=0):
    request = GenerationRequest(list(indices), n, max_new_tokens,
                                replace(params, kv_cache=kv_cache))
    groups = hf_generate(policy, runtime, request, generator(seed, "test"))
    score(groups, runtime)
    return groups


def forward_logprobs(policy, batch, temperature=1.0):
    logits, _ = policy(batch["input_ids"])
    aligned = next_token_logprobs(logits, batch["input_ids"], temperature)
    # token-aligned: the log-prob of token t sits at column t - 1 of the forward pass
    return torch.nn.functional.pad(aligned[:, :-1], (1, 0))


@pytest.fixture(scope="module")
def reverse(tiny_lm, tmp_path_factory):
    # prompts of different lengths, so generation really is left-padded
    path = write_text_dataset(tmp_path_factory.mktemp("d") / "r.jsonl", "reverse", n=16)
    task = TaskConfig(dataset=str(path), reward="lightning_adv.trainer.tasks.text.char_match")
    return setup(tiny_lm, task)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_the_training_forward_pass(reverse, temperature):
    policy, runtime = reverse
    groups = sample(policy, runtime, SamplingParams(temperature=temperature),
                    indices=range(8), max_new_tokens=8)
    lengths = {sum(not g for g in ep.generated[:ep.generated.index(True)]) for ep in groups[0] + groups[5]}
    batch, _ = build_batch(groups, multi_turn=False, process_rewards=False)
    assert len({len(runtime.instance(i)[1]) for i in range(8)}) > 1, lengths  # ragged prompts
    mask = batch["loss_mask"].bool()
    with torch.no_grad():
        replay = forward_logprobs(policy, batch, temperature)
    assert mask.sum() > 40
    assert (replay - batch["logprobs"])[mask].abs().max() < 1e-5
    assert torch.all(batch["logprobs"][~mask] == 0)


def test_the_batch_is_right_padded_and_follows_the_episodes(reverse):
    policy, runtime = reverse
    groups = sample(policy, runtime, indices=range(4), max_new_tokens=8)
    batch, meta = build_batch(groups, multi_turn=False, process_rewards=False)
    episodes = [ep for g in groups for ep in g]
    for row, ep in enumerate(episodes):
        n = len(ep.tokens)
        assert batch["attention_mask"][row].tolist() == [True] * n + [False] * (
            batch["input_ids"].shape[1] - n)
        assert batch["input_ids"][row, :n].tolist() == ep.tokens
        prompt = runtime.instance(ep.index)[1]
        assert ep.tokens[: len(prompt)] == prompt and not any(ep.generated[: len(prompt)])
        generated = ep.tokens[len(prompt):]
        ended = generated[-1] in runtime.vocab.eos_ids
        assert len(generated) == 8 or ended
        assert batch["is_truncated"][row] == (not ended)
        assert ep.sample.response == runtime.vocab.decode(generated[:-1] if ended else generated)
        assert ep.sample.prompt == runtime.prompt_text(ep.index)  # "Reverse: ...", no template
    assert meta.traj_group_sizes == [3] * 4
    AdvantageModule(ActorConfig(kl_ctl=0.0))(batch, meta)  # a valid SPEC batch


@pytest.mark.parametrize("case", ["multi-turn", "ragged prompts"])
def test_the_kv_cache_samples_what_rereading_the_prefix_samples(tiny_lm, reverse, case):
    """The sampler with the model's KV cache, whose first step reads each distinct prompt
    once for all its samples (``lightning_adv.trainer.policies.hf.prompt_sharing``), draws
    the episodes that re-reading every row's whole history at each step draws: with
    environment replies between turns (guess) and with left-padded prompts of different
    lengths (a text dataset)."""
    if case == "multi-turn":
        policy, runtime = setup(tiny_lm, TaskConfig(name="guess"))
        kwargs = dict(indices=(0, 1), n=4, max_new_tokens=3)
    else:
        policy, runtime = reverse
        kwargs = dict(indices=(0, 1, 2, 3), n=3, max_new_tokens=6)
    first_batches = []
    decode = policy.decode_step

    def recording(input_ids, attention_mask, position_ids, cache=None):
        if cache is None:
            first_batches.append(input_ids.shape[0])
        return decode(input_ids, attention_mask, position_ids, cache)

    policy.decode_step = recording
    try:
        cached = sample(policy, runtime, **kwargs)
    finally:
        del policy.decode_step
    plain = sample(policy, runtime, kv_cache=False, **kwargs)
    prompts = {tuple(ep.tokens[:ep.generated.index(True)]) for g in cached for ep in g}
    assert first_batches == [len(prompts)]  # each prompt read once, for all its samples
    if case == "ragged prompts":
        assert len({len(p) for p in prompts}) > 1
        assert sum(len(ep.tokens) for g in cached for ep in g) > 12 * 10
    for a, b in zip((ep for g in cached for ep in g), (ep for g in plain for ep in g)):
        assert a.tokens == b.tokens and a.turns == b.turns
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    again = sample(policy, runtime, **kwargs)
    assert [ep.tokens for g in again for ep in g] == [ep.tokens for g in cached for ep in g]


def test_multi_turn_replies_are_chat_messages_with_loss_mask_0(tiny_lm):
    policy, runtime = setup(tiny_lm, TaskConfig(name="guess"))
    groups = sample(policy, runtime, indices=(0, 1, 2), n=4, max_new_tokens=3)
    batch, meta = build_batch(groups, multi_turn=True, process_rewards=False)
    tok = runtime.vocab.tokenizer
    many = [ep for g in groups for ep in g if len(ep.turns) > 1]
    assert many, "no multi-turn episode was sampled"
    for ep in many:
        row = [e for g in groups for e in g].index(ep)
        text = tok.decode(ep.tokens)
        assert text.count("<|im_start|>user\n") == len(ep.turns)  # the prompt and each reply
        assert [t.reply for t in ep.turns[:-1]] == [runtime.task.reply(ep.instance, ep.turns[:i + 1])
                                                    for i in range(len(ep.turns) - 1)]
        turn_ids = batch["turn_ids"][row]
        generated = batch["loss_mask"][row].bool()
        assert torch.all(turn_ids[~generated] == -1)
        assert sorted(set(turn_ids[generated].tolist())) == list(range(len(ep.turns)))
    with torch.no_grad():
        replay = forward_logprobs(policy, batch)
    mask = batch["loss_mask"].bool()
    assert (replay - batch["logprobs"])[mask].abs().max() < 1e-5
    AdvantageModule(ActorConfig(kl_ctl=0.0, gae_timestep_unit="turn"))(batch, meta)


def test_pad_is_eos_when_the_tokenizer_has_no_pad_token(tiny_llama_no_pad):
    policy, runtime = setup(tiny_llama_no_pad)
    eos = runtime.vocab.eos_id
    assert runtime.vocab.pad_id == eos
    with torch.no_grad():  # make EOS likely, so rows end at different lengths
        policy.model.lm_head.bias = None
        policy.model.lm_head.weight[eos] += 0.3 * policy.model.model.norm.weight.sign()
    groups = sample(policy, runtime, indices=range(4), n=4, max_new_tokens=6)
    batch, _ = build_batch(groups, multi_turn=False, process_rewards=False)
    ids, attention, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    prompt_len = torch.tensor([len(runtime.instance(ep.index)[1]) for g in groups for ep in g])
    columns = torch.arange(ids.shape[1])
    ended = (ids == eos) & attention & (columns[None] >= prompt_len[:, None])  # generated EOS
    assert ended.any() and (~attention).any()
    assert torch.all(loss_mask[ended] == 1)  # a generated EOS is a real, trained token
    assert torch.all(loss_mask[~attention] == 0)
    assert not batch["is_truncated"][ended.any(1)].any()
    assert torch.equal(batch["is_truncated"], ~ended.any(1))
    with torch.no_grad():
        replay = forward_logprobs(policy, batch)
    assert (replay - batch["logprobs"])[loss_mask.bool()].abs().max() < 1e-5


def test_stop_strings_end_a_turn(reverse):
    policy, runtime = reverse
    runtime_stop = TaskRuntime(TaskConfig(dataset=runtime.config.dataset, reward=runtime.config.reward,
                                          stop_strings=["a", "b"]), tokenizer=runtime.vocab)
    groups = sample(policy, runtime_stop, indices=range(6), n=4, max_new_tokens=8)
    stopped = [ep for g in groups for ep in g if ep.turns[0].stop is not None]
    assert stopped
    for ep in (e for g in groups for e in g):
        turn = ep.turns[0]
        text = turn.text
        if turn.stop is not None:
            assert text.endswith(turn.stop) or turn.stop in runtime.vocab.decode(
                [runtime.vocab.tokenizer.convert_tokens_to_ids(t) for t in turn.tokens])
            assert not ep.truncated
            # the stop string was not yet in the text one token earlier
            prefix = runtime.vocab.tokenizer.convert_tokens_to_ids(list(turn.tokens[:-1]))
            assert not any(s in runtime.vocab.decode(prefix) for s in ("a", "b"))
        else:
            assert "a" not in text and "b" not in text


def test_top_k_1_and_tiny_top_p_are_greedy_with_full_distribution_logprobs(reverse):
    policy, runtime = reverse
    for params in (SamplingParams(top_k=1), SamplingParams(top_p=1e-6)):
        groups = sample(policy, runtime, params, indices=range(3), n=2, max_new_tokens=5)
        batch, _ = build_batch(groups, multi_turn=False, process_rewards=False)
        logits, _ = policy(batch["input_ids"])
        mask = batch["loss_mask"].bool()
        greedy = torch.nn.functional.pad(logits.argmax(-1)[:, :-1], (1, 0))
        assert torch.equal(batch["input_ids"][mask], greedy[mask])
        replay = forward_logprobs(policy, batch)
        assert (replay - batch["logprobs"])[mask].abs().max() < 1e-5
        assert batch["logprobs"][mask].max() < 0  # not 0 = log 1 of the truncated distribution
    top5 = sample(policy, runtime, SamplingParams(top_k=5), indices=range(4), n=4)
    batch, _ = build_batch(top5, multi_turn=False, process_rewards=False)
    logits, _ = policy(batch["input_ids"])
    rank = (logits[:, :-1] > logits[:, :-1].gather(-1, batch["input_ids"][:, 1:, None])).sum(-1)
    assert rank[batch["loss_mask"][:, 1:].bool()].max() < 5


def test_an_episode_beyond_the_context_window_is_an_error(tiny_lm, tmp_path):
    from lightning_adv.trainer.policies.hf.make_tiny import make_tiny

    small = make_tiny(tmp_path / "small", max_positions=24)
    policy, runtime = setup(str(small), TaskConfig(name="guess"))
    with pytest.raises(TaskError, match="context window \\(24 tokens\\)"):
        sample(policy, runtime, indices=(0, 1), n=4, max_new_tokens=3)
    runtime.episode_budget = 30
    with pytest.raises(TaskError, match="exceed the model's context window of 24 tokens"):
        TaskRuntime(TaskConfig(name="guess"), tokenizer=runtime.vocab, context_window=24,
                    episode_budget=30).instance(0)
