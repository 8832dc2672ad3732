"""lightning_adv.rollout_correction: weights, the mask after rejection and the metrics equal
verl 0.9.1's compute_rollout_correction_and_rejection_mask (its released code), hand-worked
cases, and one clear error per bad input."""

import math

import pytest
import torch

import lightning_adv
from lightning_adv.losses.rollout_correction import RolloutCorrectionConfig, rollout_correction
from tests.support.peers import VERL_ROLLOUT_CORR, peer_module


def batch(seed: int, rows: int = 12, width: int = 9, empty_rows=(3,), spread: float = 0.4,
          dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) < 0.7).to(dtype)
    mask[:, 0] = 1
    for r in empty_rows:
        mask[r] = 0
    old = -torch.rand(rows, width, generator=g, dtype=dtype) * 3 - 0.01
    rollout = (old + torch.randn(rows, width, generator=g, dtype=dtype) * spread).clamp(max=0)
    return old, rollout, mask


CONFIGS = [
    dict(rollout_is="token"),
    dict(rollout_is="token", rollout_is_threshold=1.5),
    dict(rollout_is="token", rollout_is_threshold="0.5_2.0"),
    dict(rollout_is="sequence", rollout_is_threshold=5.0),
    dict(rollout_is="sequence", rollout_is_threshold="0.2_5.0"),
    dict(rollout_is="token", rollout_is_batch_normalize=True),
    dict(rollout_is="sequence", rollout_is_threshold=3.0, rollout_is_batch_normalize=True),
    dict(rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6"),
    dict(rollout_rs="token_k2,token_k3", rollout_rs_threshold="0.05,0.04"),
    dict(rollout_rs="seq_sum_k1", rollout_rs_threshold=2.5),
    dict(rollout_rs="seq_sum_k2,seq_sum_k3", rollout_rs_threshold="0.4"),
    dict(rollout_rs="seq_mean_k1,seq_mean_k2,seq_mean_k3", rollout_rs_threshold="0.8_1.25,0.05,0.06"),
    dict(rollout_rs="seq_max_k2,seq_max_k3", rollout_rs_threshold="0.2,0.3"),
    dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3,token_k1",
         rollout_rs_threshold="0.05,0.5_2.0"),
    dict(rollout_is="sequence", rollout_rs="seq_max_k2", rollout_rs_threshold=0.3),
    dict(),
]


@pytest.fixture(scope="module")
def verl_helper():
    return peer_module(*VERL_ROLLOUT_CORR)


def verl_run(helper, old, rollout, mask, cfg):
    proto, verl_mask, metrics = helper.compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, **{"rollout_is_threshold": 2.0, **cfg})
    weights = None if proto is None else proto.batch["rollout_is_weights"]
    return weights, verl_mask, {k.removeprefix("rollout_corr/"): v for k, v in metrics.items()}


def assert_metrics_equal(ours: dict, theirs: dict) -> None:
    assert set(ours) == set(theirs), (sorted(set(ours) ^ set(theirs)))
    for key, value in theirs.items():
        assert float(ours[key]) == pytest.approx(value, rel=1e-6, abs=1e-9), key


@pytest.mark.peers
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_equals_verl_on_batches_without_empty_rows(verl_helper, cfg, seed):
    old, rollout, mask = batch(seed, empty_rows=())
    weights, verl_mask, verl_metrics = verl_run(verl_helper, old, rollout, mask, cfg)
    ours = rollout_correction(old, rollout, mask, **cfg)
    if weights is None:
        assert ours.weights is None
    else:
        torch.testing.assert_close(ours.weights, weights, rtol=1e-7, atol=0)  # verl: +1e-8 in means
    assert torch.equal(ours.loss_mask, verl_mask)
    assert ours.loss_mask.dtype == mask.dtype
    assert_metrics_equal(ours.metrics, verl_metrics)


@pytest.mark.peers
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_fully_masked_rows_change_no_number_but_verls_all_row_means(verl_helper, cfg):
    """Weights and mask equal verl's on a batch with empty rows; the metrics are those of
    the batch without them, which equal verl's there (verl averages some sequence
    statistics over every row, an empty one counting as weight 1)."""
    old, rollout, mask = batch(5, empty_rows=(0, 4, 11))
    weights, verl_mask, _ = verl_run(verl_helper, old, rollout, mask, cfg)
    ours = rollout_correction(old, rollout, mask, **cfg)
    if weights is not None:
        torch.testing.assert_close(ours.weights, weights, rtol=1e-7, atol=0)  # verl: +1e-8 in means
    assert torch.equal(ours.loss_mask, verl_mask)
    keep = mask.sum(1) > 0
    _, _, verl_nonempty = verl_run(verl_helper, old[keep], rollout[keep], mask[keep], cfg)
    assert_metrics_equal(ours.metrics, verl_nonempty)


def test_token_tis_and_icepop_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    rollout = torch.tensor([[-1.5, -1.0, -0.5, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # rho = e^0.5, e^-1, 1 (the last position is masked)
    tis = rollout_correction(old, rollout, mask, rollout_is="token", rollout_is_threshold=1.5)
    torch.testing.assert_close(tis.weights, torch.tensor([[1.5, math.exp(-1), 1.0, 0.0]]))
    icepop = rollout_correction(old, rollout, mask, rollout_is="token",
                                rollout_is_threshold="0.5_1.5")
    torch.testing.assert_close(icepop.weights, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))
    assert torch.equal(icepop.loss_mask, mask)  # IcePop zeroes weights, keeps the mask
    seq = rollout_correction(old, rollout, mask, rollout_is="sequence", rollout_is_threshold=10.0)
    torch.testing.assert_close(seq.weights, torch.tensor([[math.exp(-0.5)] * 3 + [0.0]]))


def test_a_sequence_filter_rejects_the_whole_sequence_a_token_filter_one_token():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    rollout = torch.tensor([[-1.0, -3.0, -1.0], [-1.0, -1.0, -1.0]])
    mask = torch.ones(2, 3)
    token = rollout_correction(old, rollout, mask, rollout_rs="token_k2", rollout_rs_threshold=1.0)
    assert token.loss_mask.tolist() == [[1, 0, 1], [1, 1, 1]]  # k2 = 2 at the middle token
    seq = rollout_correction(old, rollout, mask, rollout_rs="seq_max_k2", rollout_rs_threshold=1.0)
    assert seq.loss_mask.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert float(seq.metrics["rollout_rs_seq_masked_fraction"]) == 0.5
    assert float(token.metrics["rollout_rs_masked_fraction"]) == pytest.approx(1 / 6)


def test_k1_bounds_are_on_the_rollout_to_old_ratio():
    """verl's k1 statistic is -log(π_old/π_rollout): 'lower_upper' bounds π_rollout/π_old."""
    old = torch.tensor([[-1.0, -1.0]])
    rollout = torch.tensor([[-1.0 + math.log(1.5), -1.0 - math.log(1.5)]])  # ratios 1.5, 1/1.5
    out = rollout_correction(old, rollout, torch.ones(1, 2), rollout_rs="token_k1",
                             rollout_rs_threshold="0.5_1.2")
    assert out.loss_mask.tolist() == [[0.0, 1.0]]


def test_the_public_name_and_the_config_take_verls_keys():
    assert lightning_adv.rollout_correction is rollout_correction
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_rs="seq_mean_k3",
                                  rollout_rs_threshold=0.01)
    old, rollout, mask = batch(2)
    a = rollout_correction(old, rollout, mask, **cfg.kwargs())
    b = rollout_correction(old, rollout, mask, rollout_is="token", rollout_rs="seq_mean_k3",
                           rollout_rs_threshold=0.01)
    assert torch.equal(a.weights, b.weights) and torch.equal(a.loss_mask, b.loss_mask)


def test_an_empty_mask_gives_zero_weights_and_no_token_metrics():
    old, rollout, _ = batch(3)
    mask = torch.zeros_like(old)
    out = rollout_correction(old, rollout, mask, rollout_is="token", rollout_rs="token_k2",
                             rollout_rs_threshold=1.0)
    assert not out.weights.any() and torch.equal(out.loss_mask, mask) and out.metrics == {}


def test_inputs_are_not_modified_and_masked_positions_never_read():
    old, rollout, mask = batch(4)
    old[mask == 0] = float("nan")
    rollout[mask == 0] = float("inf")
    copies = [t.clone() for t in (old, rollout, mask)]
    out = rollout_correction(old, rollout, mask, rollout_is="sequence", rollout_rs="seq_sum_k3",
                             rollout_rs_threshold=1.0)
    assert torch.isfinite(out.weights).all() and torch.isfinite(out.weights[mask > 0]).all()
    for tensor, copy in zip((old, rollout, mask), copies):
        torch.testing.assert_close(tensor, copy, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kwargs, key", [
    (dict(rollout_is="tokens"), "rollout_is"),
    (dict(rollout_is="token", rollout_is_threshold="0.5-2.0"), "rollout_is_threshold"),
    (dict(rollout_is="token", rollout_is_threshold="2.0_0.5"), "rollout_is_threshold"),
    (dict(rollout_is="token", rollout_is_threshold=0.5), "rollout_is_threshold"),
    (dict(rollout_is="token", rollout_is_threshold=-1.0), "rollout_is_threshold"),
    (dict(rollout_is="token", rollout_is_threshold=True), "rollout_is_threshold"),
    (dict(rollout_is="token", rollout_is_threshold=float("nan")), "rollout_is_threshold"),
    (dict(rollout_rs="seq_max_k1", rollout_rs_threshold=2.0), "rollout_rs"),
    (dict(rollout_rs="token_k4", rollout_rs_threshold=2.0), "rollout_rs"),
    (dict(rollout_rs="token_k2"), "rollout_rs_threshold"),
    (dict(rollout_rs_threshold=2.0), "rollout_rs_threshold"),
    (dict(rollout_rs="token_k2,seq_max_k3", rollout_rs_threshold="1,2,3"), "rollout_rs_threshold"),
    (dict(rollout_rs="token_k2", rollout_rs_threshold="0.5_2"), "rollout_rs_threshold"),
    (dict(rollout_rs="token_k1", rollout_rs_threshold="1.5_2"), "rollout_rs_threshold"),
    (dict(rollout_rs="token_k3", rollout_rs_threshold=0), "rollout_rs_threshold"),
    (dict(rollout_is_batch_normalize=1), "rollout_is_batch_normalize"),
])
def test_bad_settings_name_the_key(kwargs, key):
    old, rollout, mask = batch(0)
    with pytest.raises(ValueError, match=rf"^{key}"):
        rollout_correction(old, rollout, mask, **kwargs)


def test_bad_inputs_name_the_argument():
    old, rollout, mask = batch(0)
    with pytest.raises(ValueError, match=r"^old_logprobs: .*log-probs \(<= 0\)"):
        rollout_correction(old.exp(), rollout, mask, rollout_is="token")
    with pytest.raises(ValueError, match=r"^rollout_logprobs: expected shape"):
        rollout_correction(old, rollout[:, :-1], mask, rollout_is="token")
    with pytest.raises(ValueError, match=r"^rollout_logprobs: expected a floating"):
        rollout_correction(old, rollout.long(), mask)
    with pytest.raises(ValueError, match=r"^loss_mask: expected a \[B, T\] tensor"):
        rollout_correction(old, rollout, mask[0])


@pytest.mark.parametrize("kwargs, key", [
    (dict(rollout_is="token", bypass_mode=True), "rollout_correction.rollout_is"),
    (dict(loss_type="reinforce"), "rollout_correction.loss_type"),
    (dict(loss_type="ppo"), "rollout_correction.loss_type"),
    (dict(rollout_rs="seq_mean_k2"), "rollout_correction.rollout_rs_threshold"),
])
def test_the_config_refuses_bad_and_doubled_corrections(kwargs, key):
    with pytest.raises(ValueError, match=rf"^{key}"):
        RolloutCorrectionConfig(**kwargs)
