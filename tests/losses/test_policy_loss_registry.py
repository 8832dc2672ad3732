"""The policy-loss registry and PPOLoss's off-policy options: a user's loss by dotted path or
register_policy_loss, its contract checks, the settings each loss refuses, corrections that
would apply twice, the rollout KL term, and one clear error per bad input."""

import warnings

import pytest
import torch

from lightning_adv import PPOLoss, PolicyLossInputs, register_policy_loss, rollout_correction
from lightning_adv.exceptions import IgnoredSettingWarning, PolicyLossContractError
from lightning_adv.losses.policy_loss_registry import unregister_policy_loss
from lightning_adv.ops.kl import kl_estimate


def batch(seed: int = 0, rows: int = 5, width: int = 7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) < 0.7).double()
    mask[2] = 0
    mask[:, 1] = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 2 - 0.01
    lp = (old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3).clamp(max=0)
    rollout = (old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3).clamp(max=0)
    adv = torch.randn(rows, width, generator=g, dtype=torch.float64)
    return lp, old, adv, mask, rollout


def plain_reinforce(inputs: PolicyLossInputs, *, scale: float = 1.0):
    per_token = -scale * inputs.advantages * inputs.logprobs
    return per_token, {"scale": scale}


def test_a_users_loss_by_dotted_path_is_aggregated_like_a_builtin():
    lp, old, adv, mask, _ = batch()
    path = f"{__name__}.plain_reinforce"
    mine = PPOLoss(policy_loss=path, policy_loss_kwargs={"scale": 2.0}, loss_agg_mode="seq-mean-token-mean")
    gpg = PPOLoss(policy_loss="gpg", loss_agg_mode="seq-mean-token-mean")
    a, b = mine(lp, old, adv, mask), gpg(lp, old, adv, mask)
    torch.testing.assert_close(a["loss"], 2 * b["loss"])
    assert float(a["scale"]) == 2.0


def test_register_policy_loss_selects_by_name_with_checked_kwargs():
    def positive(key, value):
        if not value > 0:
            raise ValueError(f"{key}: expected a number > 0, got {value!r}")

    register_policy_loss("scaled_pg", kwarg_checks={"scale": positive})(plain_reinforce)
    try:
        lp, old, adv, mask, _ = batch()
        out = PPOLoss(policy_loss="scaled_pg", policy_loss_kwargs={"scale": 3.0})(lp, old, adv, mask)
        assert float(out["scale"]) == 3.0
        with pytest.raises(ValueError, match=r"^policy_loss_kwargs.scale: expected a number > 0"):
            PPOLoss(policy_loss="scaled_pg", policy_loss_kwargs={"scale": -1.0})
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("scaled_pg")(plain_reinforce)
        with pytest.raises(ValueError, match="already registered"):
            register_policy_loss("gspo")(plain_reinforce)
    finally:
        unregister_policy_loss("scaled_pg")


def _detached(inputs):
    return -(inputs.advantages * inputs.logprobs).detach(), {}


def _wrong_shape(inputs):
    return (-inputs.advantages * inputs.logprobs).sum(1), {}


def _nan(inputs):
    return inputs.logprobs * float("nan"), {}


def _in_place(inputs):
    inputs.advantages.mul_(2)
    return -inputs.advantages * inputs.logprobs, {}


def _vector_diagnostic(inputs):
    return -inputs.advantages * inputs.logprobs, {"per_row": inputs.logprobs.sum(1)}


@pytest.mark.parametrize("fn, message", [
    (_detached, "no gradient"), (_wrong_shape, "shape"), (_nan, "non-finite"),
    (_in_place, "modified its inputs in place"), (_vector_diagnostic, "diagnostics must be scalars"),
])
def test_a_users_loss_that_breaks_its_contract_is_named(fn, message):
    lp, old, adv, mask, _ = batch()
    loss = PPOLoss(policy_loss=f"{__name__}.{fn.__name__}")
    with pytest.raises(PolicyLossContractError, match=rf"policy loss '{fn.__name__}' .*{message}"):
        loss(lp.clone().requires_grad_(True), old, adv, mask)


@pytest.mark.parametrize("kwargs, key", [
    (dict(policy_loss="ppo"), "policy_loss"),
    (dict(policy_loss="my_pkg.nowhere.fn"), "policy_loss"),
    (dict(policy_loss="sapo", policy_loss_kwargs={"tau": 1.0}), "policy_loss_kwargs"),
    (dict(policy_loss="sapo", policy_loss_kwargs={"tau_pos": 0.0}), "policy_loss_kwargs.tau_pos"),
    (dict(policy_loss="dro"), "policy_loss_kwargs"),
    (dict(policy_loss="clip_cov", policy_loss_kwargs={"clip_cov_ratio": -0.1}),
     "policy_loss_kwargs.clip_cov_ratio"),
    (dict(policy_loss="gspo", dual_clip=3.0), "dual_clip"),
    (dict(policy_loss="cispo", ratio_level="sequence"), "ratio_level"),
    (dict(loss_agg_mode="token-avg"), "loss_agg_mode"),
    (dict(kl_estimator="k2+"), "kl_estimator"),
    (dict(rollout_kl_coef=-1.0), "rollout_kl_coef"),
    (dict(rollout_kl_estimator="k4"), "rollout_kl_estimator"),
    (dict(use_bias_correction_kl=1), "use_bias_correction_kl"),
    (dict(rollout_correction={"rollout_is": "tokens"}), "rollout_correction.rollout_is"),
    (dict(rollout_correction={"rollout_is_threshold": "2_0.5", "rollout_is": "token"}),
     "rollout_correction.rollout_is_threshold"),
    (dict(rollout_correction={"rollout_rs": "seq_k3", "rollout_rs_threshold": 1.0}),
     "rollout_correction.rollout_rs"),
    (dict(rollout_correction={"rollout_is": "token", "bypass_mode": True}),
     "rollout_correction.rollout_is"),
    (dict(rollout_correction={"rollout_iss": "token"}), "rollout_correction"),
    (dict(rollout_correction={"bypass_mode": True}, policy_loss="gspo"), "policy_loss"),
])
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"^{key}[:.]? "):
        PPOLoss(**kwargs)


def test_a_fixed_aggregation_warns_when_another_mode_is_asked_for():
    with pytest.warns(IgnoredSettingWarning, match="loss_agg_mode: 'token-mean' is ignored"):
        PPOLoss(policy_loss="sapo", loss_agg_mode="token-mean")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert PPOLoss(policy_loss="sapo").loss_agg_mode == "seq-mean-token-mean"


def test_the_decoupled_correction_inside_equals_the_one_computed_outside():
    lp, old, adv, mask, rollout = batch(1)
    cfg = dict(rollout_is="token", rollout_is_threshold=1.5, rollout_rs="seq_max_k2",
               rollout_rs_threshold=0.08)
    corr = rollout_correction(old, rollout, mask, **cfg)
    assert 0 < corr.loss_mask.sum() < mask.sum()
    inside = PPOLoss(rollout_correction=cfg)(lp, old, adv, mask, rollout_logprobs=rollout)
    outside = PPOLoss()(lp, old, adv, mask, rollout_is_weights=corr.weights,
                        rollout_rs_mask=corr.loss_mask)
    for key in ("loss", "policy_loss", "rollout_rejected_frac"):
        torch.testing.assert_close(inside[key], outside[key])


def test_weights_multiply_the_policy_term_only():
    lp, old, adv, mask, _ = batch(2)
    values = torch.randn_like(lp)
    common = dict(ref_logprobs=old, values=values, returns=values + 1, entropy=-lp)
    loss = PPOLoss(kl_coef=0.2, entropy_coef=0.1, value_coef=0.5)
    plain = loss(lp, old, adv, mask, **common)
    doubled = loss(lp, old, adv, mask, rollout_is_weights=torch.full_like(lp, 2.0), **common)
    policy = PPOLoss(value_coef=0.0)(lp, old, adv, mask)["loss"]
    torch.testing.assert_close(doubled["loss"] - plain["loss"], policy)


def test_the_rollout_kl_term_is_its_estimate_aggregated():
    lp, old, adv, mask, rollout = batch(3)
    base = PPOLoss()(lp, old, adv, mask)["loss"]
    out = PPOLoss(rollout_kl_coef=0.5, rollout_kl_estimator="k3+")(lp, old, adv, mask,
                                                                    rollout_logprobs=rollout)
    kl = kl_estimate(torch.where(mask > 0, lp, 0.0), torch.where(mask > 0, rollout, 0.0), "k3")
    expected = base + 0.5 * (kl * mask).sum() / mask.sum()
    torch.testing.assert_close(out["loss"], expected)


def test_bypass_mode_reads_the_rollout_policy_from_old_logprobs():
    lp, old, adv, mask, rollout = batch(4)
    bypass = PPOLoss(rollout_correction={"bypass_mode": True, "loss_type": "reinforce",
                                         "rollout_is": "token", "rollout_is_threshold": 2.0})
    w = (lp - old).exp().clamp(max=2.0) * mask
    expected = PPOLoss(policy_loss="gpg")(lp, old, adv, mask, rollout_is_weights=w)["loss"]
    torch.testing.assert_close(bypass(lp, old, adv, mask)["loss"], expected)
    with pytest.raises(ValueError, match="^PPOLoss rollout_logprobs: expected None in bypass mode"):
        bypass(lp, old, adv, mask, rollout_logprobs=rollout)


@pytest.mark.parametrize("change, match", [
    (dict(rollout_logprobs=None), "^PPOLoss rollout_logprobs: required with rollout_correction"),
    (dict(rollout_is_weights="ones"), "^PPOLoss rollout_is_weights: expected None when the loss "
                                      "computes its own rollout_correction"),
])
def test_a_configured_correction_needs_rollout_logprobs_and_refuses_outside_weights(change, match):
    lp, old, adv, mask, rollout = batch(5)
    loss = PPOLoss(rollout_correction={"rollout_is": "token"})
    kwargs = {"rollout_logprobs": rollout, **change}
    if kwargs.get("rollout_is_weights") == "ones":
        kwargs["rollout_is_weights"] = torch.ones_like(lp)
    with pytest.raises(ValueError, match=match):
        loss(lp, old, adv, mask, **kwargs)


@pytest.mark.parametrize("name, value, match", [
    ("rollout_logprobs", lambda t: t.exp(), r"^PPOLoss rollout_logprobs: expected log-probs \(<= 0"),
    ("old_logprobs", lambda t: t + 5, r"^PPOLoss old_logprobs: expected log-probs \(<= 0"),
    ("rollout_is_weights", lambda t: t[:, :-1], r"^PPOLoss rollout_is_weights: expected shape"),
    ("rollout_is_weights", lambda t: -t.exp(), r"^PPOLoss rollout_is_weights: expected finite weights >= 0"),
    ("rollout_rs_mask", lambda t: t * 0 + 0.5, r"^PPOLoss rollout_rs_mask: expected only 0 and 1"),
])
def test_bad_inputs_name_the_argument(name, value, match):
    lp, old, adv, mask, rollout = batch(6)
    kwargs = {"rollout_logprobs": rollout, "old_logprobs": old}
    kwargs[name] = value(rollout if name != "old_logprobs" else old)
    old_lp = kwargs.pop("old_logprobs")
    with pytest.raises(ValueError, match=match):
        PPOLoss(rollout_kl_coef=0.1)(lp, old_lp, adv, mask, **kwargs)
