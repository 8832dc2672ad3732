"""TRL 1.16's GRPO losses (its released _compute_loss, run on a stand-in trainer) against
PPOLoss: where TRL defines a loss differently from verl (cispo, sapo, luspo, vespo), the
settings that reproduce it here, and the measured difference where none does; TRL's vLLM
importance-sampling correction and use_bias_correction_kl."""

import pytest
import torch

from lightning_adv import PPOLoss
from tests.support.trl_loss import trl_grpo_loss

pytestmark = pytest.mark.peers


def batch(seed: int, rows: int = 8, width: int = 9, empty_rows=()):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) < 0.75).double()
    mask[:, 0] = 1
    for r in empty_rows:
        mask[r] = 0
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 2.5 - 0.05
    lp = (old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3).clamp(max=-1e-3)
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64)  # TRL: one per completion
    ref = (old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3).clamp(max=0)
    ratio = torch.rand(rows, width, generator=g, dtype=torch.float64) + 0.4
    return lp, old, adv, mask, ref, ratio


def both(ours_fn, trl_fn, lp):
    """Loss and gradient of each, from the same log-probs."""
    a, b = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    ours, theirs = ours_fn(a), trl_fn(b)
    ours.backward()
    theirs.backward()
    return ours, theirs, a.grad, b.grad


def assert_equal(ours_fn, trl_fn, lp):
    ours, theirs, ga, gb = both(ours_fn, trl_fn, lp)
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ga, gb, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_trl_cispo_is_cispo_without_a_lower_bound_and_an_absolute_cap(seed):
    """TRL caps the ratio at epsilon_high (an absolute cap) and has no lower bound; verl's
    cispo clips to [1 - clip_eps, 1 + clip_eps_high]: clip_eps=1, clip_eps_high=cap - 1."""
    lp, old, adv, mask, _, _ = batch(seed, empty_rows=(2,))
    loss = PPOLoss(policy_loss="cispo", clip_eps=1.0, clip_eps_high=1.2 - 1.0)
    assert_equal(lambda x: loss(x, old, adv.expand_as(x), mask)["loss"],
                 lambda x: trl_grpo_loss(x, old, adv, mask, loss_type="cispo", epsilon_high=1.2), lp)


def test_trl_sapo_is_verls_sapo_except_that_empty_rows_count():
    lp, old, adv, mask, _, _ = batch(2)
    # (temperatures exact in float32: TRL's torch.where of two floats makes a float32 tensor)
    loss = PPOLoss(policy_loss="sapo", policy_loss_kwargs={"tau_pos": 1.25, "tau_neg": 0.75})
    settings = dict(loss_type="sapo", sapo_temperature_pos=1.25, sapo_temperature_neg=0.75)
    assert_equal(lambda x: loss(x, old, adv.expand_as(x), mask)["loss"],
                 lambda x: trl_grpo_loss(x, old, adv, mask, **settings), lp)
    # Measured: TRL's grpo/sapo aggregation averages over every row, an empty one too
    mask[3] = 0
    ours, theirs, ga, gb = both(lambda x: loss(x, old, adv.expand_as(x), mask)["loss"],
                                lambda x: trl_grpo_loss(x, old, adv, mask, **settings), lp)
    torch.testing.assert_close(theirs, ours * 7 / 8, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gb, ga * 7 / 8, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 3])
def test_trl_luspo_is_the_sequence_ratio_summed_over_each_sequences_tokens(seed):
    """LUSPO = vanilla with TRL's sequence ratio (ratio_level="sequence") aggregated with
    seq-mean-token-sum (length-unbiased: each sequence's token sum)."""
    lp, old, adv, mask, _, _ = batch(seed)
    loss = PPOLoss(ratio_level="sequence", loss_agg_mode="seq-mean-token-sum", clip_eps_high=0.28)
    assert_equal(lambda x: loss(x, old, adv.expand_as(x), mask)["loss"],
                 lambda x: trl_grpo_loss(x, old, adv, mask, loss_type="luspo", epsilon_high=0.28,
                                         importance_sampling_level="sequence"), lp)


@pytest.mark.parametrize("weighted", [False, True])
def test_vespo_equals_trls(weighted):
    lp, old, adv, mask, _, ratio = batch(4, empty_rows=(5,))
    ratio = torch.where(mask > 0, ratio, 1.0)  # TRL sums log-ratios over every position
    weights = ratio if weighted else None
    settings = dict(k_pos=1.5, lambda_pos=2.5, k_neg=3.0, lambda_neg=2.0)
    loss = PPOLoss(policy_loss="vespo", policy_loss_kwargs=settings)
    trl = {f"vespo_{k}": v for k, v in settings.items()}
    assert_equal(lambda x: loss(x, old, adv.expand_as(x), mask, rollout_is_weights=weights)["loss"],
                 lambda x: trl_grpo_loss(x, old, adv, mask, loss_type="vespo",
                                         importance_sampling_ratio=weights, **trl), lp)


@pytest.mark.parametrize("loss_type, mode", [("bnpo", "token-mean"), ("dapo", "token-mean"),
                                             ("grpo", "seq-mean-token-mean"),
                                             ("dr_grpo", "seq-mean-token-sum-norm")])
def test_trls_vllm_importance_sampling_correction_is_the_rollout_is_weight(loss_type, mode):
    """TRL multiplies the per-token policy loss by π_old/π_vLLM: decoupled mode's weight."""
    lp, old, adv, mask, _, ratio = batch(5)
    loss = PPOLoss(loss_agg_mode=mode, clip_eps_high=0.28,
                   loss_scale_factor=9.0 if "norm" in mode else None)
    assert_equal(lambda x: loss(x, old, adv.expand_as(x), mask, rollout_is_weights=ratio)["loss"],
                 lambda x: trl_grpo_loss(x, old, adv, mask, loss_type=loss_type, epsilon_high=0.28,
                                         importance_sampling_ratio=ratio,
                                         max_completion_length=9), lp)


@pytest.mark.parametrize("corrected", [False, True])
def test_use_bias_correction_kl_weights_k3_by_the_ratio(corrected):
    lp, old, adv, mask, ref, ratio = batch(6, empty_rows=(1,))
    loss = PPOLoss(kl_coef=0.3, kl_estimator="k3", use_bias_correction_kl=corrected)
    assert_equal(
        lambda x: loss(x, old, adv.expand_as(x), mask, ref_logprobs=ref, rollout_is_weights=ratio)["loss"],
        lambda x: trl_grpo_loss(x, old, adv, mask, loss_type="bnpo", beta=0.3, ref_logps=ref,
                                use_bias_correction_kl=corrected, importance_sampling_ratio=ratio), lp)
