"""OffPolicyMetrics: the numbers of rollout_correction's (verl-named) metrics, accumulated as
ratios of global sums, equal over gloo ranks to one process holding the union."""

import pytest
import torch
import torch.multiprocessing as mp

from lightning_adv import OffPolicyMetrics, rollout_correction
import tests.support.offpolicy_ddp_workers as workers


def batch(seed: int = 1, rows: int = 9, width: int = 10):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) < 0.7).double()
    mask[3] = 0
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 2 - 0.01
    rollout = (old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.4).clamp(max=0)
    return old, rollout, mask


@pytest.mark.parametrize("cfg", [
    dict(rollout_is="token", rollout_is_threshold=1.5),
    dict(rollout_is="token", rollout_is_threshold="0.6_1.4", rollout_rs="seq_max_k2,token_k1",
         rollout_rs_threshold="0.3,0.5_2.0"),
])
def test_the_values_are_rollout_corrections_metrics(cfg):
    old, rollout, mask = batch()
    theirs = rollout_correction(old, rollout, mask, **cfg).metrics
    metrics = OffPolicyMetrics()
    metrics.update(old, rollout, mask, cfg)
    ours = {k.removeprefix("offpolicy/"): float(v) for k, v in metrics.compute().items()}
    pairs = {"mismatch_kl_k1": "kl", "mismatch_kl_k3": "k3_kl", "chi2_token": "chi2_token",
             "chi2_seq": "chi2_seq", "is_weight_mean": "rollout_is_mean",
             "is_weight_min": "rollout_is_min", "is_weight_max": "rollout_is_max",
             "ess": "rollout_is_eff_sample_size", "ratio_frac_high": "rollout_is_ratio_fraction_high",
             "ratio_frac_low": "rollout_is_ratio_fraction_low"}
    if "rollout_rs" in cfg:
        pairs.update(rejected_frac="rollout_rs_masked_fraction",
                     rejected_seq_frac="rollout_rs_seq_masked_fraction")
    for ours_key, their_key in pairs.items():
        assert ours[ours_key] == pytest.approx(float(theirs[their_key]), rel=1e-6, abs=1e-7), ours_key
    if "_" in str(cfg["rollout_is_threshold"]):
        oob = ours["is_masked_frac_high"] + ours["is_masked_frac_low"]
        assert oob == pytest.approx(float(theirs["rollout_is_oob_ratio"]), rel=1e-6)
        assert ours["is_masked_frac_high"] > 0 and ours["is_masked_frac_low"] > 0
    else:
        assert "offpolicy/is_masked_frac_high" not in metrics.compute()


def test_without_a_correction_the_weights_are_the_raw_token_ratios():
    old, rollout, mask = batch(2)
    metrics = OffPolicyMetrics(prefix="x/")
    metrics.update(old, rollout, mask)
    out = metrics.compute()
    ratio = (old - rollout).exp()[mask > 0]
    assert float(out["x/is_weight_mean"]) == pytest.approx(float(ratio.mean()), rel=1e-6)
    assert float(out["x/ess"]) == pytest.approx(float(ratio.sum() ** 2 / (len(ratio) * ratio.square().sum())), rel=1e-6)
    assert "x/rejected_frac" not in out and "x/staleness_mean" not in out
    assert "x/ratio_frac_high" not in out


def test_split_updates_equal_one_update_and_staleness_is_per_row():
    old, rollout, mask = batch(3)
    cfg = dict(rollout_is="sequence", rollout_is_threshold=3.0, rollout_rs="seq_sum_k2",
               rollout_rs_threshold=0.5)
    staleness = torch.tensor([0, 0, 1, 1, 2, 4, 4, 4, 8])
    whole, split = OffPolicyMetrics(), OffPolicyMetrics()
    whole.update(old, rollout, mask, cfg, staleness)
    split.update(old[:4], rollout[:4], mask[:4], cfg, staleness[:4])
    split.update(old[4:], rollout[4:], mask[4:], cfg, staleness[4:])
    a, b = whole.compute(), split.compute()
    assert a.keys() == b.keys()
    for key in a:
        assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-6, abs=1e-9), key
    assert float(a["offpolicy/staleness_mean"]) == pytest.approx(24 / 9)
    assert float(a["offpolicy/staleness_max"]) == 8.0


def test_ddp_values_equal_one_process_on_the_union(tmp_path):
    mp.spawn(workers.worker, args=(2, str(tmp_path / "init"), str(tmp_path / "rank0.pt")),
             nprocs=2, join=True)
    synced = torch.load(tmp_path / "rank0.pt")
    old, rollout, mask, staleness = workers.global_batch()
    single = OffPolicyMetrics()
    single.update(old, rollout, mask, workers.CORRECTION, staleness)
    expected = single.compute()
    assert synced.keys() == expected.keys()
    for key in expected:
        assert float(synced[key]) == pytest.approx(float(expected[key]), rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("call, match", [
    (lambda m, o, r, k: m.update(o.exp(), r, k), r"^OffPolicyMetrics old_logprobs: expected log-probs"),
    (lambda m, o, r, k: m.update(o, r[:, 1:], k), r"^OffPolicyMetrics rollout_logprobs: expected shape"),
    (lambda m, o, r, k: m.update(o, r, k, {"rollout_is": "seq"}), r"^OffPolicyMetrics correction.rollout_is"),
    (lambda m, o, r, k: m.update(o, r, k, None, torch.ones(2)), r"^OffPolicyMetrics staleness"),
    (lambda m, o, r, k: m.update(o, r, k, None, -1), r"^OffPolicyMetrics staleness"),
])
def test_bad_inputs_name_the_argument(call, match):
    old, rollout, mask = batch()
    with pytest.raises(ValueError, match=match):
        call(OffPolicyMetrics(), old, rollout, mask)
