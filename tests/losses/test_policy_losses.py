"""Every built-in policy loss's value and gradient equal verl 0.9.1's registered function
(its released code, pinned by hash) for every loss_agg_mode, on random batches with fully
masked rows, with and without rollout IS weights; bypass mode equals verl's bypass_mode
loss; rejection counts the tokens it removed (verl's global_batch_info of the mask before
rejection)."""

import warnings

import pytest
import torch

from lightning_adv import PPOLoss, rollout_correction
from lightning_adv.exceptions import IgnoredSettingWarning
from lightning_adv.losses.aggregation import LOSS_AGG_MODES
from tests.support.peers import VERL_CORE_ALGOS, peer_module

FACTOR = 7.0  # loss_scale_factor of seq-mean-token-sum-norm
LO, HI = 0.2, 0.28

#: (our policy_loss_kwargs, verl's PolicyLossConfig/ActorConfig settings) per loss
SETTINGS = {
    "vanilla": ({}, {}),
    "gspo": ({}, {}),
    "cispo": ({}, {}),
    "sapo": ({"tau_pos": 1.3, "tau_neg": 0.7}, {"tau_pos": 1.3, "tau_neg": 0.7}),
    "geo_mean": ({}, {}),
    "dppo_tv": ({}, {}),
    "dppo_kl": ({}, {}),
    "clip_cov": ({"clip_cov_ratio": 0.2, "clip_cov_lb": 0.05, "clip_cov_ub": 4.0},
                 {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.05, "clip_cov_ub": 4.0}),
    "kl_cov": ({"kl_cov_ratio": 0.15, "ppo_kl_coef": 0.7},
               {"kl_cov_ratio": 0.15, "ppo_kl_coef": 0.7}),
    "dro": ({"dro_beta": 0.3}, {"dro_beta": 0.3}),
    "gpg": ({}, {}),
}
POLICY_LOSS_KEYS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio",
                    "ppo_kl_coef", "dro_beta")


@pytest.fixture(scope="module")
def verl():
    core = peer_module(*VERL_CORE_ALGOS)
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # the pinned release

    return core, ActorConfig, PolicyLossConfig


def batch(seed: int, rows: int = 9, width: int = 11):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) < 0.7).double()
    mask[1] = 0
    mask[6] = 0
    mask[:, 0] = mask[:, 0].clamp(min=float(seed % 2))
    mask[1] = 0
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 2.5 - 0.05
    lp = (old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.35).clamp(max=-1e-3)
    adv = torch.randn(rows, width, generator=g, dtype=torch.float64) * 1.5
    weights = torch.rand(rows, width, generator=g, dtype=torch.float64) * 2.0 + 0.2
    return lp, old, adv, mask, weights


def verl_config(verl, name: str, mode: str, dual_clip, extra: dict, info: dict = None,
                rollout_correction=None):
    _, ActorConfig, PolicyLossConfig = verl
    policy = {k: v for k, v in extra.items() if k in POLICY_LOSS_KEYS}
    if rollout_correction is not None:
        policy["rollout_correction"] = rollout_correction
    actor = {k: v for k, v in extra.items() if k not in POLICY_LOSS_KEYS}
    c = 1e12 if dual_clip is None else dual_clip  # verl always dual-clips (3 by default)
    if name.startswith("dppo"):
        c = 20.0 if dual_clip is None else dual_clip  # verl's dppo fallback: 20
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                         clip_ratio=LO, clip_ratio_low=LO, clip_ratio_high=HI, clip_ratio_c=c,
                         loss_agg_mode=mode, policy_loss=PolicyLossConfig(loss_mode=name, **policy),
                         **actor)
    config.global_batch_info.update(info or {})
    config.global_batch_info["loss_scale_factor"] = FACTOR if "norm" in mode else None
    return config


def ours_loss(name: str, mode: str, dual_clip, kwargs: dict, lp, old, adv, mask, weights,
              **extra):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredSettingWarning)  # sapo, geo_mean: fixed modes
        loss = PPOLoss(clip_eps=LO, clip_eps_high=HI, dual_clip=dual_clip, loss_agg_mode=mode,
                       loss_scale_factor=FACTOR if "norm" in mode else None, policy_loss=name,
                       policy_loss_kwargs=kwargs)
    return loss(lp, old, adv, mask, rollout_is_weights=weights, **extra)["loss"]


def compare(ours_fn, theirs_fn, lp):
    a, b = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    torch.manual_seed(1234)  # clip_cov draws with torch.randperm on the global generator
    ours = ours_fn(a)
    torch.manual_seed(1234)
    theirs = theirs_fn(b)
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-7, atol=1e-10)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-7, atol=1e-10)


CASES = [(name, None) for name in SETTINGS] + [("vanilla", 1.3), ("dppo_tv", 1.2), ("dppo_kl", 1.1)]


@pytest.mark.peers
@pytest.mark.parametrize("weighted", [False, True], ids=["no-weights", "is-weights"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name, dual_clip", CASES, ids=[f"{n}-c{c}" for n, c in CASES])
def test_loss_and_gradient_equal_verls_registered_function(verl, name, dual_clip, mode, weighted):
    core = verl[0]
    ours_kwargs, theirs_settings = SETTINGS[name]
    for seed in (0, 1):
        lp, old, adv, mask, weights = batch(seed)
        weights = weights if weighted else None
        config = verl_config(verl, name, mode, dual_clip, theirs_settings)
        fn = core.get_policy_loss_fn(name)
        compare(lambda x: ours_loss(name, mode, dual_clip, ours_kwargs, x, old, adv, mask, weights),
                lambda x: fn(old, x, adv, mask, mode, config, weights)[0], lp)


@pytest.mark.parametrize("name, dual_clip, key", [
    ("vanilla", 1.3, "dual_clipfrac"), ("vanilla", None, "clipfrac_high"),
    ("vanilla", None, "clipfrac_low"), ("clip_cov", None, "clipfrac"),
    ("kl_cov", None, "kl_cov_frac"), ("dppo_tv", None, "clipfrac"), ("dppo_kl", None, "clipfrac"),
    ("geo_mean", None, "clipfrac")])
def test_the_batches_reach_each_losss_special_branch(name, dual_clip, key):
    """The comparisons above would hold for a loss whose clip never binds: they do bind."""
    reached = []
    for seed in (0, 1):
        lp, old, adv, mask, _ = batch(seed)
        out = PPOLoss(clip_eps=LO, clip_eps_high=HI, dual_clip=dual_clip, policy_loss=name,
                      policy_loss_kwargs=SETTINGS[name][0])(lp, old, adv, mask)
        reached.append(float(out[key]))
    assert max(reached) > 0, key
    capped = ((lp - old).exp() > 1.2) & (mask > 0)  # dppo's truncation at dual_clip binds
    assert capped.any()


@pytest.mark.peers
@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("name", ["vanilla", "cispo", "gpg"])
def test_rejection_counts_the_tokens_it_removed(verl, name, mode):
    """A rejected mask from rollout_correction passed as rollout_rs_mask: verl's function on
    the rejected mask, normalized by the counts of the mask before rejection (verl's
    global_batch_info, what its trainer passes in bypass mode)."""
    core = verl[0]
    lp, old, adv, mask, _ = batch(3)
    rollout = (old + torch.randn(old.shape, generator=torch.Generator().manual_seed(9),
                                 dtype=old.dtype) * 0.3).clamp(max=0)
    corr = rollout_correction(old, rollout, mask, rollout_is="token", rollout_rs="token_k2,seq_max_k3",
                              rollout_rs_threshold="0.02,0.2")
    assert 0 < corr.loss_mask.sum() < mask.sum()
    info = {"dp_size": 1, "batch_num_tokens": mask.sum(),
            "global_batch_size": (mask.sum(1) > 0).sum()}
    config = verl_config(verl, name, mode, None, SETTINGS[name][1], info)
    fn = core.get_policy_loss_fn(name)
    compare(lambda x: ours_loss(name, mode, None, SETTINGS[name][0], x, old, adv, mask,
                                corr.weights, rollout_rs_mask=corr.loss_mask),
            lambda x: fn(old, x, adv, corr.loss_mask, mode, config, corr.weights)[0], lp)


BYPASS = [
    dict(loss_type="ppo_clip"),
    dict(loss_type="ppo_clip", rollout_rs="seq_mean_k3,token_k1", rollout_rs_threshold="0.05,0.5_2.0"),
    dict(loss_type="reinforce", rollout_is="token", rollout_is_threshold=2.0),
    dict(loss_type="reinforce", rollout_is="sequence", rollout_is_threshold=3.0,
         rollout_rs="seq_max_k2", rollout_rs_threshold=0.3),
    dict(loss_type="reinforce", rollout_is="token", rollout_is_threshold="0.5_2.0",
         rollout_is_batch_normalize=True),
    dict(loss_type="reinforce"),
]


@pytest.mark.peers
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("cfg", BYPASS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_bypass_mode_equals_verls_bypass_mode_loss(verl, cfg, mode):
    core = verl[0]
    from verl.trainer.config.algorithm import RolloutCorrectionConfig as VerlConfig

    lp, old, adv, mask, _ = batch(4)
    verl_cfg = VerlConfig(**{"rollout_is": None, **cfg, "bypass_mode": True})
    info = {"dp_size": 1, "batch_num_tokens": mask.sum(),
            "global_batch_size": (mask.sum(1) > 0).sum()}
    config = verl_config(verl, "bypass_mode", mode, None, {}, info, rollout_correction=verl_cfg)
    loss = PPOLoss(clip_eps=LO, clip_eps_high=HI, loss_agg_mode=mode,
                   loss_scale_factor=FACTOR if "norm" in mode else None,
                   rollout_correction={**cfg, "bypass_mode": True})
    compare(lambda x: loss(x, old, adv, mask)["loss"],
            lambda x: core.compute_policy_loss_bypass_mode(old, x, adv, mask, mode, config)[0], lp)


def test_icepop_weights_and_token_rejection_of_the_same_tokens_give_the_same_loss():
    """Counting before rejection makes a rejected token a token of weight 0."""
    lp, old, adv, mask, _ = batch(5)
    keep = (torch.rand(mask.shape, generator=torch.Generator().manual_seed(2)) < 0.7).double()
    for mode in LOSS_AGG_MODES:
        loss = PPOLoss(loss_agg_mode=mode, loss_scale_factor=FACTOR if "norm" in mode else None)
        a = loss(lp, old, adv, mask, rollout_is_weights=keep)["loss"]
        b = loss(lp, old, adv, mask, rollout_rs_mask=keep)["loss"]
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
