"""KL estimators of the loss term: verl's straight-through k1+ and k3+ (value of k1/k3,
gradient of k2) equal its released kl_penalty; the importance-corrected estimate."""

import math

import pytest
import torch

from lightning_adv.ops.kl import KL_ESTIMATORS, LOSS_KL_ESTIMATORS, kl_estimate
from tests.support.peers import VERL_CORE_ALGOS, peer_module


def pair(seed: int, n: int = 64):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(n, generator=g, dtype=torch.float64) * 4
    ref = (lp + torch.randn(n, generator=g, dtype=torch.float64) * 1.5).clamp(max=0)
    return lp, ref


@pytest.mark.peers
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "low_var_kl", "abs", "k1+", "k3+",
                                       "low_var_kl+"])
def test_value_and_gradient_equal_verls_kl_penalty(estimator):
    core = peer_module(*VERL_CORE_ALGOS)
    lp, ref = pair(0)
    a, b = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    ours = kl_estimate(a, ref, estimator)
    theirs = core.kl_penalty(b, ref, estimator)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)  # |estimates| < 10 here
    ours.sum().backward()
    theirs.sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("base", ["k1", "k3"])
def test_plus_has_the_value_of_the_estimator_and_the_gradient_of_k2(base):
    lp, ref = pair(1)
    x = lp.clone().requires_grad_(True)
    plus = kl_estimate(x, ref, base + "+")
    torch.testing.assert_close(plus, kl_estimate(lp, ref, base))
    plus.sum().backward()
    torch.testing.assert_close(x.grad, lp - ref)  # d/dx of (x - ref)^2 / 2


def test_the_importance_corrected_estimate_is_the_ratio_times_the_estimate():
    lp, ref = pair(2)
    old = (lp + 0.2).clamp(max=0)
    x = lp.clone().requires_grad_(True)
    corrected = kl_estimate(x, ref, "k3", log_importance_ratio=x - old)
    torch.testing.assert_close(corrected, (lp - old).exp() * kl_estimate(lp, ref, "k3"))
    corrected.sum().backward()
    k3 = kl_estimate(lp, ref, "k3")
    dk3 = 1 - (ref - lp).exp()  # d/dx of e^(ref-x) - 1 - (ref - x)
    torch.testing.assert_close(x.grad, (lp - old).exp() * (k3 + dk3))


def test_the_reward_side_estimators_have_no_straight_through_variant():
    assert not any(e.endswith("+") for e in KL_ESTIMATORS)
    assert set(LOSS_KL_ESTIMATORS) - set(KL_ESTIMATORS) == {"k1+", "k3+", "low_var_kl+"}
    with pytest.raises(ValueError, match="kl_estimator: expected one of"):
        kl_estimate(torch.zeros(2), torch.zeros(2), "k2++")


@pytest.mark.parametrize("estimator", ["k1", "k2", "abs", "k1+", "k3+", "low_var_kl+"])
@pytest.mark.parametrize("d", [6.0, -6.0, 19.0, -19.0])
def test_the_loss_estimators_keep_their_gradient_far_from_the_reference(estimator, d):
    """The log-ratio is clamped at ±20, not the value at ±10: at |log r| = 6 (and 19) the
    gradient is the estimator's own, never 0 (a value clamp zeroed k2's beyond 4.47)."""
    ref = torch.tensor([-25.0], dtype=torch.float64)
    x = (ref + d).requires_grad_(True)
    kl_estimate(x, ref, estimator).sum().backward()
    want = {"k1": 1.0, "abs": 1.0 if d > 0 else -1.0}.get(estimator, d)  # k2 and the + ones: d
    assert x.grad.item() == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("estimator,d,value,grad", [
    ("k1", 25.0, 20.0, 0.0), ("k1", -25.0, -20.0, 0.0), ("abs", -25.0, 20.0, 0.0),
    ("k2", 25.0, 200.0, 0.0), ("k2", 6.0, 18.0, 6.0), ("k1", 12.0, 12.0, 1.0),
    ("k3", -6.0, 10.0, 0.0), ("k3", 25.0, 10.0, 0.0),
    ("k3", 3.0, math.exp(-3.0) + 2.0, 1.0 - math.exp(-3.0)),
])
def test_the_bounds_of_each_estimator(estimator, d, value, grad):
    """k1/abs/k2 of the log-ratio clamped at ±20; k3's value clamped at ±10 (verl's)."""
    ref = torch.tensor([-30.0], dtype=torch.float64)
    x = (ref + d).requires_grad_(True)
    out = kl_estimate(x, ref, estimator)
    assert out.item() == pytest.approx(value, rel=1e-12)
    out.sum().backward()
    assert x.grad.item() == pytest.approx(grad, rel=1e-12)


@pytest.mark.peers
@pytest.mark.parametrize("d", [6.0, -6.0, 12.0, -12.0])
@pytest.mark.parametrize("estimator", ["k1", "k2", "abs", "k3", "k1+", "k3+"])
def test_far_from_the_reference_value_and_gradient_equal_verls(estimator, d):
    """Within |log r| < 20 every estimator equals verl's kl_penalty, value and gradient:
    k3's value clamp at ±10 is verl's (its gradient is 0 at log r = -6, as verl's)."""
    core = peer_module(*VERL_CORE_ALGOS)
    ref = torch.full((3,), -25.0, dtype=torch.float64)
    a, b = (ref + d).requires_grad_(True), (ref + d).requires_grad_(True)
    ours, theirs = kl_estimate(a, ref, estimator), core.kl_penalty(b, ref, estimator)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    ours.sum().backward()
    theirs.sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)


def test_the_reward_penalty_still_clamps_every_estimate_at_ten():
    """AReaL's bound of the reward-side penalty: -kl_coef * clamp(k, -10, 10)."""
    from lightning_adv.advantage.reward_terms import kl_penalty

    ref = torch.full((4,), -25.0)
    old = ref + torch.tensor([12.0, -12.0, 5.0, float("inf")])
    torch.testing.assert_close(kl_penalty(old, ref, 0.5, "k1"), torch.tensor([-5.0, 5.0, -2.5, -5.0]))
    torch.testing.assert_close(kl_penalty(old, ref, 0.5, "k2"), torch.tensor([-5.0, -5.0, -5.0, -5.0]))
