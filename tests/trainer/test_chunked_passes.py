"""The trainer's passes over fewer rows at a time give the numbers of one pass over all
rows: the scoring passes (``ppo.forward_batch_size``) against the full-tensor formulas on
a tiny Hugging Face model, the rollout batch of ``make_batch``, and the first training
step's loss inputs and metrics."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

from lightning_adv import ActorConfig
from lightning_adv.recipes import recipe
from lightning_adv.trainer import PPOConfig, PPOModule, PolicyConfig, TaskConfig
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.policies.base import ScoreRequest
from lightning_adv.trainer.policies.hf.policy import build_hf_policy
from lightning_adv.trainer.rollout.scoring import row_chunks, scoring_passes

DATASET = str(Path(__file__).resolve().parents[2] / "data" / "reverse_text.jsonl")
CHAR_MATCH = "lightning_adv.trainer.tasks.text.char_match"
LENGTH_REWARD = "tests.support.trainer_helpers.response_length_reward"


def right_padded(vocab, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab, (len(lengths), max(lengths)), generator=g)
    for row, n in enumerate(lengths):
        ids[row, n:] = 0
    return ids, torch.tensor(lengths)


def full_tensor_reference(policy, reference, ids, temperature):
    """One pass over the whole batch, reduced with the plain full-tensor formulas."""
    logits, values = policy(ids)
    logp = torch.log_softmax(logits.double() / temperature, -1)
    ref = torch.log_softmax(reference(ids)[0].double() / temperature, -1)

    def picked(lp):
        return F.pad(lp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1), (0, 1))

    return {"values": values.double(), "prox_logp": picked(logp), "ref_logp": picked(ref),
            "sum_pi_squared": (logp.exp() ** 2).sum(-1),
            "entropies": -(logp.exp() * logp).sum(-1)}


def test_row_chunks():
    assert row_chunks(5, None) == [slice(0, 5)]
    assert row_chunks(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert row_chunks(3, 8) == [slice(0, 8)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scoring_passes_in_chunks_equal_one_pass(tiny_lm, dtype):
    """Chunks of 1, 2 and 3 rows (ragged), each cut to its longest row, give one pass's
    values and log-probs (float32: to rounding; bf16: the model's own rounding of a
    narrower matrix), and both equal the full-tensor formulas at every real position."""
    policy = build_hf_policy(PolicyConfig(pretrained=tiny_lm, dtype=dtype), seed=0).eval()
    with torch.no_grad():
        policy.value_head.weight.normal_()  # a critic that is not all zeros
    reference = policy.reference()
    vocab = policy.config.vocab_size
    ids, lengths = right_padded(vocab, [7, 3, 12, 5, 9])
    real = torch.arange(ids.shape[1])[None] < lengths[:, None]
    next_real = F.pad(real[:, 1:], (0, 1))
    request = ScoreRequest(frozenset({"values", "logprobs", "sum_pi_squared", "entropies"}), 0.8)
    whole = scoring_passes(policy, reference, ids, lengths, request)
    with torch.no_grad():
        want = full_tensor_reference(policy, reference, ids, 0.8)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for key, mask in (("values", real), ("prox_logp", next_real), ("ref_logp", next_real),
                      ("sum_pi_squared", next_real), ("entropies", next_real)):
        assert whole[key].dtype == torch.float32 and whole[key].shape == ids.shape
        assert torch.allclose(whole[key][mask].double(), want[key][mask], rtol=tol, atol=tol), key
    for rows in (1, 2, 3):
        chunked = scoring_passes(policy, reference, ids, lengths, request, rows=rows)
        assert chunked.keys() == whole.keys()
        for key, mask in (("values", real), ("prox_logp", next_real), ("ref_logp", next_real),
                          ("sum_pi_squared", next_real), ("entropies", next_real)):
            assert torch.allclose(chunked[key][mask], whole[key][mask], rtol=tol, atol=tol), key
        for key in chunked:  # past a row's last token: 0, whole or in chunks of any width
            assert not chunked[key][~real].any() and not whole[key][~real].any(), key


def test_scoring_passes_run_only_the_passes_asked_for(tiny_lm):
    policy = build_hf_policy(PolicyConfig(pretrained=tiny_lm, value_head=False), seed=0)
    ids, lengths = right_padded(policy.config.vocab_size, [4, 6])
    calls = []
    forward = policy.forward

    def counted(x, shared=None):
        calls.append(x.shape)
        return forward(x, shared)

    policy.forward = counted
    out = scoring_passes(policy, None, ids, lengths,
                         ScoreRequest(frozenset({"sum_pi_squared"}), 1.0), rows=1)
    assert set(out) == {"sum_pi_squared"} and calls == [(1, 4), (1, 6)]
    calls.clear()
    assert scoring_passes(policy, None, ids, lengths,
                          ScoreRequest(frozenset(), 1.0)) == {} and calls == []


def hf_module(tiny_lm, forward_batch_size=None, actor=None, value_head=True, **ppo):
    module = PPOModule(policy=PolicyConfig(pretrained=tiny_lm, value_head=value_head),
                       actor=actor or ActorConfig(kl_ctl=0.05, recompute_logprob=True),
                       task=TaskConfig(dataset=DATASET, reward=LENGTH_REWARD),
                       ppo=PPOConfig(prompts_per_step=2, n_samples=3, minibatches=2, epochs=1,
                                     lr=0.01, max_new_tokens=6, entropy_coef=0.01,
                                     forward_batch_size=forward_batch_size, **ppo), seed=0)
    if value_head:  # the same critic in every module, not the all-zero initial one
        head = module.policy.value_head.weight
        with torch.no_grad():
            head.copy_(0.1 * torch.randn(head.shape, generator=torch.Generator().manual_seed(7)))
    return module


@pytest.mark.parametrize("case", ["ppo", "optimal_token_baseline"])
def test_make_batch_with_forward_batch_size_equals_one_pass(tiny_lm, case):
    """values, prox_logp, ref_logp (PPO with recompute_logprob and a KL penalty) and
    sum_pi_squared (optimal token baseline), from passes of 1 and 4 rows."""
    actor = (ActorConfig(kl_ctl=0.05, recompute_logprob=True) if case == "ppo"
             else recipe("optimal_token_baseline"))
    modules = [hf_module(tiny_lm, size, actor=actor, value_head=case == "ppo")
               for size in (None, 1, 4)]
    groups = modules[0].rollout([0, 1], generator(0, "rollout", 0, 0))
    batches = [m.make_batch(groups)[0] for m in modules]
    keys = ({"values", "prox_logp", "ref_logp"} if case == "ppo" else {"sum_pi_squared"})
    assert keys <= set(batches[0])
    for key in keys:
        assert batches[0][key].abs().sum() > 0
        for other in batches[1:]:
            assert torch.allclose(other[key], batches[0][key], rtol=1e-5, atol=1e-6), key


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_forward_batch_size_must_be_null_or_positive(bad):
    with pytest.raises(ValueError, match=r"ppo\.forward_batch_size: expected null .* or a "
                                         r"positive integer"):
        PPOConfig(forward_batch_size=bad)


@pytest.mark.parametrize("bad", [0, -1, 2.0, False])
def test_micro_batch_size_must_be_null_or_positive(bad):
    with pytest.raises(ValueError, match=r"ppo\.micro_batch_size: expected null .* or a "
                                         r"positive integer"):
        PPOConfig(micro_batch_size=bad)


class StepRecorder(PPOModule):
    """Runs ``updater.step`` without a Trainer: plain backward, and an optimizer of lr 0 that
    records the accumulated gradients of every step (the weights stay fixed, so every
    minibatch's gradient is comparable)."""

    def optimizers(self):
        return self.recording

    def manual_backward(self, loss):
        loss.backward()


class RecordingSGD(torch.optim.SGD):
    def __init__(self, params):
        self.params = list(params)
        super().__init__(self.params, lr=0.0)
        self.steps = []

    def step(self, closure=None):
        self.steps.append([p.grad.clone() for p in self.params if p.grad is not None])
        return super().step(closure)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_update_micro_batches_accumulate_the_minibatch_gradient(tiny_lm, agg):
    """Micro-batches of 1 and 2 rows (each cut to its own longest row) give each optimizer
    step the gradient of the whole minibatch, and the same loss metrics."""
    runs = {}
    for size in (None, 1, 2):
        module = StepRecorder(
            policy=PolicyConfig(pretrained=tiny_lm), actor=ActorConfig(kl_ctl=0.05),
            task=TaskConfig(dataset=DATASET, reward=CHAR_MATCH),
            ppo=PPOConfig(prompts_per_step=2, n_samples=3, minibatches=2, epochs=1,
                          max_new_tokens=6, entropy_coef=0.01, kl_loss_coef=0.1,
                          max_grad_norm=None, loss_agg_mode=agg, micro_batch_size=size), seed=0)
        module.recording = RecordingSGD(module.policy.parameters())
        groups = module.rollout([0, 1], generator(0, "rollout", 0, 0))
        batch, meta = module.make_batch(groups)
        out = dict(module.advantage(batch, meta))
        g = torch.Generator().manual_seed(1)  # off-policy old log-probs: the clips bind
        out["logprobs"] = (out["logprobs"] + 0.3 * torch.randn(
            out["logprobs"].shape, generator=g) * out["loss_mask"]).clamp(max=0.0)
        module.updater.step(batch, out, torch.Generator().manual_seed(5), module)
        runs[size] = (module.recording.steps, module.adv_metrics.compute())
    (steps, metrics) = runs[None]
    assert len(steps) == 2 and metrics["train/clipfrac"] > 0
    for size in (1, 2):
        other_steps, other_metrics = runs[size]
        assert len(other_steps) == 2
        for want, got in zip(steps, other_steps):
            assert len(want) == len(got) > 0
            for w, x in zip(want, got):
                assert torch.allclose(x, w, rtol=1e-4, atol=1e-6)
        assert other_metrics.keys() == metrics.keys()
        for key, value in metrics.items():
            assert torch.allclose(other_metrics[key], value, rtol=1e-5, atol=1e-6), key


def fit_one_step(module, tmp_path):
    losses = []
    forward = module.loss_fn.forward

    def recording(*args, **kwargs):
        result = forward(*args, **kwargs)
        losses.append(result["loss"].detach().clone())
        return result

    module.loss_fn.forward = recording
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, logger=False,
                         log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module)
    return losses, {k: v.clone() for k, v in trainer.callback_metrics.items()}


def test_first_training_step_is_the_same_in_passes_of_one_row(tiny_lm, tmp_path):
    """A whole training step with ppo.forward_batch_size 1 and ppo.micro_batch_size 1
    against one pass each: the first minibatch's loss (the sum of its micro-batches'),
    the second's (after one optimizer step) and every logged metric."""
    plain, plain_metrics = fit_one_step(hf_module(tiny_lm), tmp_path / "a")
    chunked, chunked_metrics = fit_one_step(hf_module(tiny_lm, 1, micro_batch_size=1),
                                            tmp_path / "b")
    assert len(plain) == 2 and len(chunked) == 6  # 2 minibatches of 3 rows
    sums = [sum(chunked[:3]), sum(chunked[3:])]
    assert torch.allclose(sums[0], plain[0], rtol=1e-5, atol=1e-6)
    assert torch.allclose(sums[1], plain[1], rtol=1e-4, atol=1e-5)
    assert plain_metrics.keys() == chunked_metrics.keys()
    assert {"train/policy_loss", "train/value_loss", "train/entropy", "train/clipfrac",
            "train/explained_variance", "train/kl_rewards", "train/advantages_mean",
            "train/returns_mean"} <= plain_metrics.keys()
    for key, value in plain_metrics.items():
        assert torch.allclose(chunked_metrics[key], value, rtol=1e-4, atol=1e-5), key


def test_ddp_micro_batches_take_the_same_steps(tmp_path):
    """Two gloo ranks with ppo.micro_batch_size 1 (gradients all-reduced at each
    minibatch's last micro-batch only) and ppo.forward_batch_size 1 train as with whole
    passes: the second step, sampled from the updated weights, has the same advantages
    on both ranks (unsynced or wrongly scaled gradients would move the weights apart)."""
    from tests.support.cli_runs import CONFIGS, SMALL
    from tests.support.trainer_helpers import ddp_fit

    recorded = []
    for name, extra in (("whole", []), ("micro", ["--model.ppo.micro_batch_size=1",
                                                  "--model.ppo.forward_batch_size=1"])):
        save_dir, record = tmp_path / name, tmp_path / name / "record"
        record.mkdir(parents=True)
        proc = ddp_fit(CONFIGS / "ppo.yaml", save_dir, record, *SMALL, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        recorded.append([torch.load(record / f"rank{r}_call1.pt", weights_only=True)
                         for r in (0, 1)])
    for whole, micro in zip(*recorded):
        assert torch.equal(whole["loss_mask"], micro["loss_mask"])  # the same samples
        assert torch.allclose(micro["advantages"], whole["advantages"], rtol=1e-4, atol=1e-5)
        assert torch.allclose(micro["returns"], whole["returns"], rtol=1e-4, atol=1e-5)
