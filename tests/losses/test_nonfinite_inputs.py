"""A NaN or Inf where an input is read is refused with one error naming the input, what
it must hold and the first bad value (PPOLoss at the loss mask's tokens; the GAE kernels
at every position, since their scan reads them all; rollout_correction's 0/1 mask);
padding may hold anything and never reaches the loss or its gradient."""

import math
import re

import pytest
import torch

from lightning_adv import PPOLoss, compute_token_gae, compute_turn_gae, rollout_correction
from tests.losses.test_ppo_loss import call, full_config, random_inputs

READ = ["logprobs", "advantages", "ref_logprobs", "values", "old_values", "returns",
        "entropy", "old_logprobs"]


def active_and_masked(data):
    mask = data["loss_mask"]
    return tuple(mask.nonzero()[0].tolist()), tuple((mask == 0).nonzero()[0].tolist())


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", READ)
def test_a_non_finite_input_at_a_loss_token_is_named(name, bad):
    data = random_inputs(3)
    (row, col), _ = active_and_masked(data)
    poisoned = data[name].clone()
    poisoned[row, col] = bad
    loss = PPOLoss(**full_config("token-mean"))
    with pytest.raises(ValueError, match=rf"^PPOLoss {name}: expected .*finite.* at the loss "
                                         rf"mask's tokens.*got '1 bad tokens \(first at "
                                         rf"\({row}, {col}\): -?(nan|inf)\)'"):
        call(loss, dict(data, **{name: poisoned}))
    assert torch.equal(data[name].isnan(), torch.zeros_like(data[name], dtype=torch.bool))


@pytest.mark.parametrize("name", READ)
def test_padding_may_hold_anything_and_never_reaches_the_loss_or_its_gradient(name):
    data = random_inputs(4)
    _, (row, col) = active_and_masked(data)
    clean = call(PPOLoss(**full_config("token-mean")), data)
    poisoned = dict(data, **{name: data[name].clone()})
    poisoned[name][row, col] = math.nan
    leaves = {k: v.clone().requires_grad_(True) for k, v in poisoned.items()
              if k in ("logprobs", "values")}
    out = call(PPOLoss(**full_config("token-mean")), dict(poisoned, **leaves))
    torch.testing.assert_close(out["loss"], clean["loss"])
    out["loss"].backward()
    assert all(bool(torch.isfinite(leaf.grad).all()) for leaf in leaves.values())


def test_positive_current_log_probs_are_refused():
    data = random_inputs(5)
    (row, col), _ = active_and_masked(data)
    lp = data["logprobs"].clone()
    lp[row, col] = 0.7
    with pytest.raises(ValueError, match=r"^PPOLoss logprobs: expected log-probs \(<= 0, finite\)"
                                         r".*probabilities or logits passed\?.*: 0.7\)'"):
        call(PPOLoss(), dict(data, logprobs=lp))
    lp[row, col] = 5e-4  # within a float32 sampler's rounding of 0: accepted
    call(PPOLoss(), dict(data, logprobs=lp))


def test_ref_logprobs_are_read_only_with_a_kl_term():
    data = random_inputs(6)
    (row, col), _ = active_and_masked(data)
    ref = data["ref_logprobs"].clone()
    ref[row, col] = math.nan
    out = call(PPOLoss(), dict(data, ref_logprobs=ref))  # kl_coef 0: not read
    assert torch.isfinite(out["loss"])
    with pytest.raises(ValueError, match=r"^PPOLoss ref_logprobs: expected finite values"):
        call(PPOLoss(kl_coef=0.1), dict(data, ref_logprobs=ref))


def gae_inputs():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0]])
    values = torch.tensor([[0.1, 0.2, 0.3, 0.0], [0.4, 0.5, 0.6, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    return rewards, values, mask, torch.zeros(2)


@pytest.mark.parametrize("key", ["rewards", "values", "bootstrap_values"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_the_gae_kernels_refuse_non_finite_inputs_naming_them(key, bad):
    rewards, values, mask, bootstrap = gae_inputs()
    tensors = {"rewards": rewards, "values": values, "bootstrap_values": bootstrap}
    poisoned = tensors[key].clone()
    poisoned.view(-1)[-1] = bad  # a masked position: the scan still reads it
    tensors[key] = poisoned
    where = (1, 3) if poisoned.ndim == 2 else (1,)
    for fn, extra in ((compute_token_gae, {}), (compute_turn_gae, {"turn_ids": mask.long() * 0})):
        name = fn.__name__
        with pytest.raises(ValueError, match=rf"^{name}: {key} must be finite at every position, "
                                             rf"got 1 NaN/Inf entries \(first at {re.escape(str(where))}: "):
            args = (tensors["rewards"], tensors["values"], mask, *extra.values())
            fn(*args, bootstrap_values=tensors["bootstrap_values"], discount=1.0, gae_lambda=0.95)


def test_finite_gae_inputs_still_compute():
    rewards, values, mask, bootstrap = gae_inputs()
    adv, _ = compute_token_gae(rewards, values, mask, bootstrap_values=bootstrap, discount=1.0,
                               gae_lambda=1.0)
    # row 0, λ = γ = 1: A_0 = r_0 + r_1 + r_2 - V_0 = 1 - 0.1
    assert adv[0, 0].item() == pytest.approx(0.9)


def test_rollout_correction_refuses_a_mask_that_is_not_0_or_1():
    old = -torch.rand(2, 3)
    with pytest.raises(ValueError, match=r"^loss_mask: expected only 0 and 1 \(or a bool "
                                         r"tensor\), got 'values \[0.5\]'"):
        rollout_correction(old, old, torch.tensor([[1.0, 0.5, 0.0], [1.0, 1.0, 1.0]]),
                           rollout_is="token")
    out = rollout_correction(old, old, torch.tensor([[True, False, True], [True, True, False]]),
                             rollout_is="token")
    assert out.weights is not None
