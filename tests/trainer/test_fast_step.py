"""The trainer step's shortcuts give the plain computation's numbers: the built-in
policy's (:class:`TinyPolicy`) passes over selected positions only (``forward_selected``:
``train_forward`` at the update's loss-mask positions, ``token_scores`` at the scoring
passes' read positions) those of the :class:`Policy` base class's full forward pass over
the padded rows, to float rounding, and so do the loss, its gradient and whole training
steps; the rollout batch built at once that of ``concat_batch`` over the prompt
groups."""

import warnings

import lightning.pytorch as pl
import pytest
from hypothesis import given, settings, strategies as st
import torch
import torch.nn.functional as F

from lightning_adv import ActorConfig, concat_batch
from lightning_adv.trainer import PPOConfig, PPOModule, PolicyConfig, TaskConfig
from lightning_adv.losses.ppo_loss import PPOLoss
from lightning_adv.trainer.policies.base import (
    GenerationRequest, Policy, PromptGroups, ScoreRequest)
from lightning_adv.trainer.policies.tiny import TinyPolicy, shared_prefix_logprobs
from lightning_adv.trainer.policies.tiny_network import small_log_softmax
from lightning_adv.trainer.policies.logprobs import next_token_logprobs
from lightning_adv.trainer.rollout.batch import build_batch, score
from lightning_adv.trainer.rollout.scoring import scoring_passes
from lightning_adv.trainer.tasks.runtime import TaskRuntime
from lightning_adv.trainer.data import generator
from tests.support.trees import random_tree_rows


def trained_looking_policy(n_layers=2, value_head=True, vocab=11, width=24):
    torch.manual_seed(0)
    policy = TinyPolicy(PolicyConfig(d_model=32, n_layers=n_layers, n_heads=4,
                                     value_head=value_head), vocab, width,
                        banned_tokens=(0,))
    with torch.no_grad():  # the LM and value heads start at zero; make them matter
        for p in policy.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    return policy


def close(got, want, tol=1e-5):
    """Equal to float rounding relative to the tensor's scale (gradients sum many terms)."""
    return bool((got - want).abs().max() <= tol * max(float(want.abs().max()), 1e-3))


def ragged_batch(lengths, vocab=11, width=None, seed=1):
    """Right-padded rows (padding token 0) and a selection of some of their positions,
    one row selecting nothing."""
    g = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), width), generator=g)
    real = torch.arange(width)[None] < torch.tensor(lengths)[:, None]
    ids[~real] = 0
    selected = real & (torch.rand(ids.shape, generator=g) < 0.5)
    selected[1] = False
    return ids, real, selected


@pytest.mark.parametrize("n_layers", [1, 2])
def test_forward_selected_equals_forward_at_the_selected_positions(n_layers):
    policy = trained_looking_policy(n_layers)
    ids, real, selected = ragged_batch([7, 3, 12, 5, 9, 1], width=14)
    logits, values = policy(ids)
    picked_logits, picked_values = policy.forward_selected(ids, selected)
    assert picked_logits.shape == (int(selected.sum()), 11)
    assert torch.allclose(picked_logits, logits[selected], rtol=1e-5, atol=1e-5)
    assert torch.allclose(picked_values, values[selected], rtol=1e-5, atol=1e-5)
    # gradients: any function of the selected outputs
    weights = torch.randn(picked_logits.shape, generator=torch.Generator().manual_seed(2))

    def grads(loss):
        policy.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in policy.named_parameters()}

    full = grads((policy(ids)[0][selected] * weights).sum() + policy(ids)[1][selected].sum())
    logits, values = policy.forward_selected(ids, selected)
    packed = grads((logits * weights).sum() + values.sum())
    for name, grad in full.items():
        assert close(packed[name], grad), name


def test_forward_selected_with_nothing_selected_still_backpropagates():
    policy = trained_looking_policy()
    ids, _, _ = ragged_batch([4, 6])
    logits, values = policy.forward_selected(ids, torch.zeros(ids.shape, dtype=torch.bool))
    assert logits.shape == (0, 11) and values.shape == (0,)
    (logits.sum() + values.sum()).backward()
    assert all(p.grad is None or not p.grad.any() for p in policy.parameters())


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_train_forward_gives_the_plain_pass_loss_and_gradient(entropy_grad):
    """PPOLoss (clipped value loss, KL term, entropy bonus) on TinyPolicy.train_forward's
    loss mask positions only equals the loss over the base class's full pass
    (Policy.train_forward), and so does its gradient."""
    policy = trained_looking_policy()
    ids, real, mask = ragged_batch([7, 3, 12, 5, 9, 1], width=13, seed=3)
    g = torch.Generator().manual_seed(4)
    noise = [torch.randn(ids.shape, generator=g) for _ in range(5)]
    loss_fn = PPOLoss(entropy_coef=0.01 if entropy_grad else 0.0, kl_coef=0.1,
                      value_clip_eps=0.2, loss_agg_mode="seq-mean-token-mean")

    def loss(pass_fn):
        logprobs, values, ent = pass_fn(policy, ids, mask, 0.7, entropy_grad)
        with torch.no_grad():
            old = logprobs.detach() + 0.1 * noise[0]
            old_values = values.detach() + 0.1 * noise[1]
        result = loss_fn(logprobs, torch.where(mask, old, 0.0), noise[2], mask.int(),
                         ref_logprobs=torch.where(mask, old + 0.1 * noise[3], 0.0),
                         values=values, old_values=torch.where(mask, old_values, 0.0),
                         returns=noise[4], entropy=ent)
        policy.zero_grad()
        result["loss"].backward()
        return result, {n: p.grad.clone() for n, p in policy.named_parameters()}

    want, want_grads = loss(Policy.train_forward)
    got, got_grads = loss(TinyPolicy.train_forward)
    assert want.keys() == got.keys()
    for key in want:
        assert torch.allclose(got[key], want[key], rtol=1e-5, atol=1e-6), key
    for name, grad in want_grads.items():
        assert close(got_grads[name], grad), name


@pytest.mark.parametrize("value_head", [True, False])
def test_scoring_passes_of_the_built_in_policy_equal_a_full_pass(value_head):
    """TinyPolicy.token_scores (through scoring_passes, whole and in chunks of rows)
    equals the base class's full pass, Policy.token_scores."""
    policy = trained_looking_policy(value_head=value_head)
    reference = trained_looking_policy().reference()
    ids, real, _ = ragged_batch([7, 3, 12, 5, 9, 1], width=12)
    lengths = real.sum(1)
    next_real = F.pad(real[:, 1:], (0, 1))
    request = ScoreRequest(frozenset({"logprobs", "sum_pi_squared"}
                                     | ({"values"} if value_head else set())), 0.8)
    with torch.no_grad():
        plain = Policy.token_scores(policy, ids, lengths, request)
        want = {"prox_logp": plain["logprobs"], "sum_pi_squared": plain["sum_pi_squared"],
                "ref_logp": Policy.token_scores(reference, ids, lengths, ScoreRequest(
                    frozenset({"logprobs"}), 0.8))["logprobs"]}
        if value_head:
            want["values"] = plain["values"]
    for rows in (None, 2):
        got = scoring_passes(policy, reference, ids, lengths, request, rows=rows)
        assert got.keys() == want.keys()
        for key, tensor in got.items():
            assert tensor.dtype == torch.float32 and tensor.shape == ids.shape
            read = real if key == "values" else next_real
            assert torch.allclose(tensor[read], want[key][read], rtol=1e-5, atol=1e-5), key
            assert not tensor[~real].any(), key  # nothing computed past a row's end


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_small_log_softmax_equals_torch_log_softmax(temperature):
    """The built-in policy's written-out log-softmax over its few dozen tokens (sampler,
    scoring and update) gives torch.log_softmax's values and gradient."""
    g = torch.Generator().manual_seed(7)
    logits = (3 * torch.randn(4, 6, 11, generator=g)).requires_grad_()
    weights = torch.randn(4, 6, 11, generator=g)

    def value_and_grad(fn):
        logits.grad = None
        out = fn(logits)
        (out * weights).sum().backward()
        return out.detach(), logits.grad.clone()

    got, got_grad = value_and_grad(lambda x: small_log_softmax(x, temperature))
    want, want_grad = value_and_grad(lambda x: torch.log_softmax(x.float() / temperature, -1))
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    assert torch.allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)


SMALL = dict(prompts_per_step=4, n_samples=4, minibatches=2, epochs=2, lr=0.01)


def fit_params(ppo, steps=3):
    module = PPOModule(task=TaskConfig(name="reverse"), seed=0, ppo=PPOConfig(**SMALL, **ppo),
                       actor=ActorConfig(kl_ctl=0.05),
                       policy=PolicyConfig(d_model=16, n_layers=2, n_heads=2))
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps, logger=False,
                         log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", devices=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return {n: p.detach().clone() for n, p in module.policy.named_parameters()}, metrics


@pytest.mark.parametrize("ppo", [{}, {"entropy_coef": 0.01, "kl_loss_coef": 0.1,
                                      "micro_batch_size": 3}])
def test_training_steps_equal_those_of_full_passes(monkeypatch, ppo):
    """Three training steps (twelve optimizer steps) update the weights as the plain full
    passes do, to float rounding, and report the same metrics."""
    fast, fast_metrics = fit_params(ppo)

    # the base class's plain passes instead of TinyPolicy's shortcuts (selected positions,
    # shared prompts)
    monkeypatch.setattr(TinyPolicy, "train_forward", Policy.train_forward)
    monkeypatch.setattr(TinyPolicy, "token_scores", Policy.token_scores)
    plain, plain_metrics = fit_params(ppo)
    # Adam divides each gradient by its own running scale, so a gradient entry that is a
    # near-cancelling sum moves by up to ~1e-3 of the learning rate (0.01) with the
    # summation order; a wrong position or term would move weights by ~lr per step.
    for name, param in plain.items():
        assert (fast[name] - param).abs().max() < 1e-4, name
    assert fast_metrics.keys() == plain_metrics.keys()
    for key, value in plain_metrics.items():
        assert fast_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def per_group_batch(groups, multi_turn, process_rewards):
    """The rollout batch as concat_batch makes it of one padded batch per prompt group."""
    trajs = []
    for group in groups:
        width = max(len(ep.tokens) for ep in group)

        def pad(rows, dtype, fill=0):
            return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=dtype)

        traj = {"input_ids": pad([ep.tokens for ep in group], torch.long),
                "attention_mask": pad([[True] * len(ep.tokens) for ep in group], torch.bool, False),
                "loss_mask": pad([[int(g) for g in ep.generated] for ep in group], torch.int32),
                "logprobs": pad([ep.logprobs for ep in group], torch.float32, 0.0),
                "rewards": torch.tensor([ep.reward for ep in group], dtype=torch.float32),
                "is_truncated": torch.tensor([ep.truncated for ep in group], dtype=torch.bool)}
        if multi_turn:
            traj["turn_ids"] = pad([ep.turn_ids for ep in group], torch.long, -1)
        if process_rewards:
            traj["token_rewards"] = pad([ep.token_rewards or [] for ep in group],
                                        torch.float32, 0.0)
        if all(ep.values is not None for ep in group):
            traj["values"] = pad([ep.values for ep in group], torch.float32, 0.0)
        trajs.append(traj)
    batch, meta = concat_batch(trajs)
    if multi_turn:
        batch["turn_ids"] = batch["turn_ids"].masked_fill(~batch["loss_mask"].bool(), -1)
    return batch, meta


@pytest.mark.parametrize("task", ["reverse", "guess"])
def test_build_batch_equals_concat_batch_of_the_prompt_groups(task):
    runtime = TaskRuntime(TaskConfig(name=task))
    width = runtime.task.max_episode_len(runtime.task.max_new_tokens)
    policy = trained_looking_policy(vocab=len(runtime.vocab), width=width)
    groups = policy.generate(runtime, GenerationRequest([0, 5, 9, 2], 3,
                                                        runtime.task.max_new_tokens),
                             generator(0, "t"))
    score(groups, runtime)
    for ep in groups[1]:  # process rewards of different lengths
        ep.token_rewards = [0.5 * i for i in range(len(ep.tokens))]
    multi_turn = task == "guess"
    batch, meta = build_batch(groups, multi_turn=multi_turn, process_rewards=True)
    want, want_meta = per_group_batch(groups, multi_turn, True)
    assert meta == want_meta and batch.keys() == want.keys()
    if task == "reverse":  # prompts of different lengths: groups of different widths
        assert len(set(meta.traj_seqlens)) > 1
    for key, tensor in want.items():
        assert batch[key].dtype == tensor.dtype and torch.equal(batch[key], tensor), key


@pytest.mark.parametrize("bootstrap", [False, True])
def test_rollout_reads_the_last_tokens_values_only_when_they_are_used(bootstrap):
    """The value after an episode's last token is zeroed in the batch unless
    ppo.bootstrap_truncated: the rollout then skips the pass that reads it, and the batch
    is the same as with it."""
    module = PPOModule(task=TaskConfig(name="guess"), seed=0,
                       ppo=PPOConfig(prompts_per_step=4, n_samples=3, bootstrap_truncated=bootstrap),
                       policy=PolicyConfig(d_model=16, n_layers=2, n_heads=2))
    with torch.no_grad():  # a critic that is not all zeros
        module.policy.value_head.weight.normal_(generator=torch.Generator().manual_seed(1))
    reads = []
    forward = module.policy.forward_cached

    def counted(*args):
        reads.append(len(args[1]))
        return forward(*args)

    module.policy.forward_cached = counted
    groups = module.rollout([0, 1, 2, 3], generator(0, "r"))
    trainer_reads = len(reads)
    reads.clear()
    full = module.policy.generate(module.runtime, module.rollouts.request(
        [0, 1, 2, 3], 3, last_values=True), generator(0, "r"))
    score(full, module.runtime)
    assert trainer_reads == len(reads) - (0 if bootstrap else 1)
    values = module.make_batch(groups)[0]["values"]
    want = module.make_batch(full)[0]["values"]
    assert torch.equal(values, want)
    last = [len(ep.tokens) - 1 for g in full for ep in g]
    assert want[torch.arange(12), last].any() == bootstrap


def test_packed_causal_attention_gradcheck():
    """The written-out attention of the packed passes, its hand-written backward checked
    against finite differences (float64), with unkept positions and unread outputs."""
    from lightning_adv.trainer.policies.tiny_network import _PackedCausalAttention

    g = torch.Generator().manual_seed(5)
    b, t, heads, dh = 3, 5, 2, 3
    kept = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    keep = kept.reshape(-1).nonzero().squeeze(1)
    read = keep[torch.tensor([0, 2, 3, 4, 7, 9])]
    qkv = torch.randn(len(keep), 3 * heads * dh, generator=g, dtype=torch.float64,
                      requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: _PackedCausalAttention.apply(x, keep, read, (b, t), heads), (qkv,))
    # and the forward is causal attention over each row's kept prefix
    full = qkv.new_zeros(b * t, 3 * heads * dh).index_copy(0, keep, qkv.detach())
    q, k, v = full.view(b, t, 3, heads, dh).unbind(2)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True).transpose(1, 2).reshape(b * t, -1)
    got = _PackedCausalAttention.apply(qkv.detach(), keep, read, (b, t), heads)
    assert torch.allclose(got, want[read], atol=1e-12)


def test_environment_replies_are_checked_and_encoded_once_per_text():
    from lightning_adv.trainer.tasks.runtime import Turn

    runtime = TaskRuntime(TaskConfig(name="guess"))
    calls = []
    encode = runtime.vocab.encode_reply

    def counted(*args):
        calls.append(args[0])
        return encode(*args)

    runtime.vocab.encode_reply = counted
    turn = Turn("x", ("x",), False)
    first = runtime.reply(3, [turn], 0)
    again = runtime.reply(5, [turn], 1)
    assert first == again == runtime.vocab.encode("?", "test") and calls == ["?"]
    first.append(99)  # each answer is the caller's own list
    assert runtime.reply(5, [turn], 1) == again
    assert runtime.reply(3, [Turn("5", ("5",), False)], 0) == runtime.vocab.encode("<", "t")
    assert calls == ["?", "<"]


def test_reference_log_probs_with_shared_prompts_equal_a_full_pass():
    reference = trained_looking_policy().reference()
    g = torch.Generator().manual_seed(6)
    prompts = torch.randint(1, 11, (3, 14), generator=g)
    ids = prompts.repeat_interleave(4, dim=0)  # 3 prompts x 4 samples
    prompt_lengths = torch.tensor([3, 5, 1]).repeat_interleave(4)
    lengths = torch.tensor([7, 9, 4, 14, 6, 5, 12, 8, 2, 3, 1, 10])
    responses = torch.randint(1, 11, ids.shape, generator=g)
    columns = torch.arange(14)[None]
    ids = torch.where(columns < prompt_lengths[:, None], ids, responses)
    ids[columns >= lengths[:, None]] = 0
    next_real = columns < (lengths - 1)[:, None]
    with torch.no_grad():
        want = next_token_logprobs(reference(ids)[0], ids, 0.9)
    got = shared_prefix_logprobs(reference, ids, lengths, prompt_lengths, 0.9)
    assert torch.allclose(got[next_real], want[next_real], atol=1e-5)
    assert not got[~next_real].any()
    # through scoring_passes; and a group whose prompts differ reads them apart
    out = scoring_passes(trained_looking_policy(), reference, ids, lengths, ScoreRequest(
        frozenset(), 0.9, PromptGroups(prompt_lengths, 4)))
    assert torch.equal(out["ref_logp"], got)
    ids[5, 0] = ids[5, 0] % 10 + 1
    with torch.no_grad():
        want = next_token_logprobs(reference(ids)[0], ids, 0.9)
    got = shared_prefix_logprobs(reference, ids, lengths, prompt_lengths, 0.9)
    assert torch.allclose(got[next_real], want[next_real], atol=1e-5)


def test_reference_log_probs_of_rows_read_out_of_order_equal_a_full_pass():
    """Rows 0 and 2 share their first generated token, so the trie's segments after the
    prompt come in the order 0, 2, 1, 3 and every row reads one of them."""
    reference = trained_looking_policy().reference()
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(1, 11, (4, 12), generator=g)
    ids[:, :5] = ids[0, :5]
    ids[2, 5] = ids[0, 5]
    ids[1, 5] = ids[0, 5] % 10 + 1
    ids[3, 5] = ids[1, 5] % 10 + 1
    lengths = torch.tensor([12, 9, 11, 10])
    ids[torch.arange(12)[None] >= lengths[:, None]] = 0
    prompt_lengths = torch.full((4,), 5)
    next_real = torch.arange(12)[None] < (lengths - 1)[:, None]
    with torch.no_grad():
        want = next_token_logprobs(reference(ids)[0], ids, 0.9)
    got = shared_prefix_logprobs(reference, ids, lengths, prompt_lengths, 0.9)
    assert torch.allclose(got[next_real], want[next_real], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("min_saved", [1, 32])
def test_reference_log_probs_of_tree_rows_equal_a_full_pass(seed, min_saved):
    """Rows of trees (a prompt, then segments branching at random depths, rows of
    different lengths, one row repeated), each shared segment read once."""
    check_tree_reference(seed, min_saved, prompts=2, depth=3)


def check_tree_reference(seed: int, min_saved: int, prompts: int, depth: int) -> None:
    """The shared-prefix reference log-probs of random tree rows equal a full pass (0 past
    each row's last prediction)."""
    reference = trained_looking_policy(width=48).reference()
    ids, lengths, prompt_lengths = random_tree_rows(torch.Generator().manual_seed(seed),
                                                    prompts, depth)
    ids = ids % 10 + (ids > 0)  # the policy's 11 tokens, 0 still the padding
    next_real = torch.arange(ids.shape[1])[None] < (lengths - 1)[:, None]
    with torch.no_grad():
        want = next_token_logprobs(reference(ids)[0], ids, 0.9)
    got = shared_prefix_logprobs(reference, ids, lengths, prompt_lengths, 0.9,
                                 min_saved=min_saved)
    assert torch.allclose(got[next_real], want[next_real], atol=1e-5)
    assert not got[~next_real].any()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), min_saved=st.integers(1, 40),
       prompts=st.integers(1, 3), depth=st.integers(1, 4))
def test_reference_log_probs_of_any_tree_equal_a_full_pass(seed, min_saved, prompts, depth):
    check_tree_reference(seed, min_saved, prompts, depth)
