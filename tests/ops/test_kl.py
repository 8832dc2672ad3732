"""KL estimators of the loss term: verl's straight-through k1+ and k3+ (value of k1/k3,
gradient of k2) equal its released kl_penalty; the importance-corrected estimate."""

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
