"""The chunked large-vocabulary reductions of a Hugging Face policy
(:func:`token_stats.next_token_stats`, :func:`token_stats.sum_pi_squared_rows`: the
chosen-token log-prob, entropy, sum of pi^2, and their gradients) against the plain
full-tensor formulas (:mod:`~lightning_adv.trainer.policies.logprobs`, the
:class:`~lightning_adv.trainer.policies.base.Policy` base class's path), in float32 and
bf16, over several chunks; no full-size float32 temporary."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_adv.trainer.policies import logprobs as plain_path
from lightning_adv.trainer.policies import token_stats
from lightning_adv.trainer.policies.logprobs import scaled_log_softmax
from lightning_adv.trainer.policies.token_stats import next_token_stats, sum_pi_squared_rows

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def plain(logits, ids, temperature):
    """The plain formulas: one log-softmax of the whole tensor (float64 here, the exact
    reference)."""
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    picked = F.pad(logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1), (0, 1))
    return picked, -(logp.exp() * logp).sum(-1), (logp.exp() ** 2).sum(-1)


def random_case(seed, b, t, v, dtype, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, t, v, generator=g) * scale).to(dtype)
    return logits, torch.randint(v, (b, t), generator=g)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 5 rows, so a few positions span several chunks and a ragged last one."""
    def use(vocab):
        monkeypatch.setattr(token_stats, "CHUNK_ELEMENTS", vocab * 5)
    return use


@SETTINGS
@given(seed=st.integers(0, 2**16), b=st.integers(1, 4), t=st.integers(2, 9),
       v=st.sampled_from([11, 300, 1031]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       temperature=st.sampled_from([1.0, 0.7, 1.5]), chunk=st.sampled_from([1, 5, 10**6]))
def test_values_equal_the_full_tensor_formula(seed, b, t, v, dtype, temperature, chunk):
    logits, ids = random_case(seed, b, t, v, dtype)
    before = logits.clone()
    old = token_stats.CHUNK_ELEMENTS
    token_stats.CHUNK_ELEMENTS = v * chunk
    try:
        got_lp, got_ent = next_token_stats(logits, ids, temperature)
        lp_only, no_ent = next_token_stats(logits, ids, temperature, with_entropy=False)
        got_sq = sum_pi_squared_rows(logits, temperature)
    finally:
        token_stats.CHUNK_ELEMENTS = old
    assert no_ent is None
    want_lp, want_ent, want_sq = plain(logits, ids, temperature)
    # the plain path of the Policy base class, in float32
    plain_lp, plain_ent = plain_path.logprobs_and_entropy(logits, ids, temperature)
    plain_sq = plain_path.sum_pi_squared(logits, temperature)
    for got, want in ((got_lp, want_lp), (lp_only, want_lp), (got_ent, want_ent),
                      (got_sq, want_sq), (plain_lp, want_lp), (plain_ent, want_ent),
                      (plain_sq, want_sq)):
        assert got.dtype == torch.float32 and got.shape == (b, t)
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=2e-5)
    for got, want in ((got_lp, plain_lp), (got_ent, plain_ent), (got_sq, plain_sq)):
        assert torch.allclose(got, want, rtol=1e-5, atol=2e-5)
    assert (got_lp[:, -1] == 0).all()
    assert torch.equal(logits, before)  # never modified in place


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_gradients_equal_autograd_of_the_full_tensor_formula(dtype, temperature, entropy_grad,
                                                             small_chunks):
    """The custom backward (softmax recomputed chunk by chunk) against autograd through
    the plain path's ``log_softmax(logits.float() / T)``: the same gradient, in the
    logits' dtype."""
    small_chunks(300)
    logits, ids = random_case(1, 3, 8, 300, dtype)
    g = torch.Generator().manual_seed(2)
    w_lp, w_ent = torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g)

    def grad_of(fn):
        x = logits.clone().requires_grad_()
        lp, ent = fn(x)
        (lp * w_lp + ent * w_ent).sum().backward()
        return x.grad

    def reference(x):
        return plain_path.logprobs_and_entropy(x, ids, temperature, entropy_grad=entropy_grad)

    got = grad_of(lambda x: next_token_stats(x, ids, temperature, entropy_grad=entropy_grad))
    want = grad_of(reference)
    assert got.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # bf16: one rounding of each gradient
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
    # the gradient of a position's log-prob sums to 0 over the vocabulary (softmax)
    only_lp = grad_of(lambda x: (next_token_stats(x, ids, temperature)[0],
                                 torch.zeros(3, 8)))
    assert only_lp.float().sum(-1).abs().max() < (1e-5 if dtype == torch.float32 else 5e-2)


def test_gradient_by_hand_one_position():
    """Two tokens, logits (0, log 3): p = (1/4, 3/4); chosen token 1, T = 1.
    d log p_1 / dx = onehot - p = (-1/4, 1/4); H = -(1/4 log 1/4 + 3/4 log 3/4) and
    dH / dx_i = -p_i (log p_i + H)."""
    logits = torch.zeros(1, 2, 300)
    logits[..., 2:] = -1e4  # the other 298 tokens take no probability
    logits[0, 0, 1] = torch.tensor(3.0).log()
    logits.requires_grad_()
    ids = torch.tensor([[0, 1]])
    lp, ent = next_token_stats(logits, ids)
    assert lp[0, 0].item() == pytest.approx(torch.tensor(0.75).log().item(), abs=1e-6)
    h = -(0.25 * torch.tensor(0.25).log() + 0.75 * torch.tensor(0.75).log()).item()
    assert ent[0, 0].item() == pytest.approx(h, abs=1e-6)
    lp[0, 0].backward(retain_graph=True)
    assert logits.grad[0, 0, :2].tolist() == pytest.approx([-0.25, 0.25], abs=1e-6)
    logits.grad = None
    ent[0, 0].backward()
    p = torch.tensor([0.25, 0.75])
    assert logits.grad[0, 0, :2].tolist() == pytest.approx((-p * (p.log() + h)).tolist(), abs=1e-6)


class LargestFloat32(TorchDispatchMode):
    """The most elements of any float32 tensor an operation produced."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
                self.largest = max(self.largest, x.numel())
        return out


@pytest.mark.parametrize("fn", ["next_token_stats", "sum_pi_squared_rows"])
def test_no_full_size_float32_temporary_of_bf16_logits(fn, small_chunks):
    """bf16 logits, forward and backward: every float32 tensor is at most one chunk; the
    old full-tensor formula (checked too, so the probe can fail) makes full-size ones."""
    b, t, v = 4, 16, 512
    small_chunks(v)  # chunks of 5 rows: 2560 elements of the 32768
    logits = random_case(0, b, t, v, torch.bfloat16)[0].requires_grad_()
    ids = torch.randint(v, (b, t))
    with LargestFloat32() as probe:
        if fn == "sum_pi_squared_rows":
            sum_pi_squared_rows(logits.detach(), 0.7)
        else:
            lp, ent = next_token_stats(logits, ids, 0.7)
            (lp.sum() + ent.sum()).backward()
    assert probe.largest <= 5 * v
    with LargestFloat32() as old:
        scaled_log_softmax(logits, 0.7).sum().backward()
    assert old.largest == b * t * v

