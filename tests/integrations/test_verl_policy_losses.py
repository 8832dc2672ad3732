"""The la_ policy losses, called through verl's policy-loss registry with verl's actor
config, equal verl 0.9.1's own registered losses (value and gradient), with verl's
global_batch_info (micro-batches of a minibatch over data-parallel ranks)."""

import pytest
import torch

from lightning_adv.integrations.verl import register
from tests.losses.test_policy_losses import SETTINGS, batch, verl_config
from tests.support.peers import VERL_CORE_ALGOS, peer_module

pytestmark = pytest.mark.peers


@pytest.fixture(scope="module")
def verl():
    core = peer_module(*VERL_CORE_ALGOS)
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # the pinned release

    register()
    return core, ActorConfig, PolicyLossConfig


def value_and_grad(fn, lp):
    x = lp.clone().requires_grad_(True)
    torch.manual_seed(1234)  # clip_cov draws with torch.randperm on the global generator
    loss, metrics = fn(x)
    loss.backward()
    return loss.detach(), x.grad, metrics


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_la_losses_equal_verls_through_its_registry(verl, name, mode):
    core = verl[0]
    lp, old, adv, mask, weights = batch(0)
    config = verl_config(verl, name, mode, 1.5 if name in ("vanilla", "dppo_tv", "dppo_kl")
                         else None, SETTINGS[name][1])
    theirs_fn, ours_fn = core.get_policy_loss_fn(name), core.get_policy_loss_fn("la_" + name)
    results = [value_and_grad(lambda x: fn(old, x, adv, mask, mode, config, weights), lp)
               for fn in (theirs_fn, ours_fn)]
    (theirs, theirs_grad, _), (ours, ours_grad, metrics) = results
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-7, atol=1e-10)
    assert all(k.startswith("actor/") and isinstance(v, float) for k, v in metrics.items())


def test_global_batch_info_normalizes_micro_batches_as_verls(verl):
    """Two micro-batches of one minibatch, dp_size 2: verl divides by the global token
    count and multiplies by dp_size; so does la_vanilla."""
    core = verl[0]
    lp, old, adv, mask, _ = batch(1)
    info = {"dp_size": 2, "batch_num_tokens": float(mask.sum() * 2), "global_batch_size": 18}
    config = verl_config(verl, "vanilla", "token-mean", 3.0, {}, info=info)
    halves = (slice(0, 4), slice(4, 9))
    for part in halves:
        theirs = core.get_policy_loss_fn("vanilla")(old[part], lp[part], adv[part], mask[part],
                                                    "token-mean", config)[0]
        ours = core.get_policy_loss_fn("la_vanilla")(old[part], lp[part], adv[part], mask[part],
                                                     "token-mean", config)[0]
        torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-10)


def test_a_loss_setting_verl_cannot_give_is_named(verl):
    """vespo is TRL's: its settings are not fields of verl's config, so la_vespo runs with
    its defaults; a bad value of a mapped setting is refused naming it."""
    core = verl[0]
    lp, old, adv, mask, _ = batch(0)
    config = verl_config(verl, "sapo", "token-mean", None, {"tau_pos": -1.0, "tau_neg": 1.0})
    with pytest.raises(ValueError, match="tau_pos"):
        core.get_policy_loss_fn("la_sapo")(old, lp, adv, mask, "token-mean", config)


def test_trls_vespo_runs_through_verls_registry_as_ppo_loss_does(verl):
    """vespo has no verl counterpart: through verl's registry it equals PPOLoss's vespo."""
    from lightning_adv import PPOLoss

    core = verl[0]
    lp, old, adv, mask, weights = batch(2)
    config = verl_config(verl, "vanilla", "token-mean", None, {})
    ours = core.get_policy_loss_fn("la_vespo")(old, lp, adv, mask, "token-mean", config, weights)[0]
    direct = PPOLoss(clip_eps=0.2, clip_eps_high=0.28, policy_loss="vespo",
                     sync_across_ranks=False)(lp, old, adv, mask, rollout_is_weights=weights)["loss"]
    torch.testing.assert_close(ours, direct)


@pytest.mark.parametrize("name", ["vanilla", "gpg"])
def test_seq_mean_token_sum_norm_without_a_factor_divides_by_the_width_as_verl(verl, name):
    """verl 0.9.1's default (loss_scale_factor None): its agg_loss divides by the mask's
    width; la_ does the same through the registry, warning that it depends on padding."""
    from lightning_adv.exceptions import PaddingDependentScaleWarning

    core = verl[0]
    lp, old, adv, mask, weights = batch(0)
    config = verl_config(verl, name, "seq-mean-token-sum-norm", 1.5 if name == "vanilla"
                         else None, SETTINGS[name][1])
    config.global_batch_info["loss_scale_factor"] = None
    theirs, theirs_grad, _ = value_and_grad(
        lambda x: core.get_policy_loss_fn(name)(old, x, adv, mask, "seq-mean-token-sum-norm",
                                                config, weights), lp)
    with pytest.warns(PaddingDependentScaleWarning, match=rf"response width \({mask.shape[-1]}"):
        ours, ours_grad, _ = value_and_grad(
            lambda x: core.get_policy_loss_fn("la_" + name)(
                old, x, adv, mask, "seq-mean-token-sum-norm", config, weights), lp)
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-7, atol=1e-10)
    # the width is the divisor: a wider padding of the same rows scales both losses alike
    wide = [torch.nn.functional.pad(t, (0, 3)) for t in (lp, old, adv, mask, weights)]
    with pytest.warns(PaddingDependentScaleWarning):
        padded = core.get_policy_loss_fn("la_" + name)(wide[1], wide[0], wide[2], wide[3],
                                                       "seq-mean-token-sum-norm", config,
                                                       wide[4])[0]
    width = mask.shape[-1]
    torch.testing.assert_close(padded * (width + 3), ours * width, rtol=1e-6, atol=1e-9)
