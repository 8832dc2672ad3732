"""The entropy-aware process stages (``gtpo``, ``top_entropy_mask``): hand-computed cases,
GTPO's kept mean advantage per response as a property, the module reading ``entropies``
from the batch, and the errors naming what is wrong. TRL's selection itself is compared in
tests/integrations/test_trl_entropy_mask.py."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_adv import ActorConfig, AdvantageModule, ProcessAdvantageInputs
from lightning_adv.stages.entropy_shaping import gtpo, top_entropy_mask
from examples.quickstart import small_batch

GROUP_NORM = {"mean_level": "group", "std_level": "group"}


def inputs(adv, mask, entropies, token_rewards=None):
    return ProcessAdvantageInputs(torch.tensor(adv), token_rewards, torch.tensor(mask),
                                  ActorConfig(), None, {"entropies": torch.tensor(entropies)})


def test_gtpo_by_hand():
    # one advantage per response (GRPO): A * H / mean(H); mean(H) = 2
    got = gtpo(inputs([[2.0, 2.0, 2.0, 9.0]], [[1.0, 1.0, 1.0, 0.0]], [[1.0, 2.0, 3.0, 5.0]]))
    torch.testing.assert_close(got, torch.tensor([[1.0, 2.0, 3.0, 9.0]]))  # inactive: kept
    # entropy_weight 0.5: A * (0.5 + 0.5 * H / mean(H))
    got = gtpo(inputs([[2.0, 2.0, 2.0]], [[1.0, 1.0, 1.0]], [[1.0, 2.0, 3.0]]), entropy_weight=0.5)
    torch.testing.assert_close(got, torch.tensor([[1.5, 2.0, 2.5]]))
    # token-level A = 1, 2, 3 (mean 2), H = 3, 0, 0 (mean 1): A + 2 * (H - 1) = 5, 0, 1
    got = gtpo(inputs([[1.0, 2.0, 3.0]], [[1.0, 1.0, 1.0]], [[3.0, 0.0, 0.0]]))
    torch.testing.assert_close(got, torch.tensor([[5.0, 0.0, 1.0]]))
    # every entropy 0, or no active token: unchanged
    torch.testing.assert_close(gtpo(inputs([[1.0, -2.0]], [[1.0, 1.0]], [[0.0, 0.0]])),
                               torch.tensor([[1.0, -2.0]]))
    torch.testing.assert_close(gtpo(inputs([[1.0, -2.0]], [[0.0, 0.0]], [[1.0, 3.0]])),
                               torch.tensor([[1.0, -2.0]]))


def test_top_entropy_mask_by_hand():
    # active entropies 4, 1, 2, 3: the 0.75 quantile of them is 3.25 (linear interpolation),
    # so quantile 0.25 keeps the token of entropy 4 only; the inactive one keeps its value
    got = top_entropy_mask(inputs([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
                                  [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]],
                                  [[4.0, 1.0, 9.0], [2.0, 3.0, 9.0]]), quantile=0.25)
    torch.testing.assert_close(got, torch.tensor([[1.0, 0.0, 3.0], [0.0, 0.0, 6.0]]))
    every = inputs([[1.0, 2.0]], [[1.0, 1.0]], [[0.5, 0.1]])
    torch.testing.assert_close(top_entropy_mask(every, quantile=1.0), every.advantages)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2 ** 16), weight=st.sampled_from([0.0, 0.3, 1.0]))
def test_gtpo_keeps_each_rows_mean_advantage(seed, weight):
    g = torch.Generator().manual_seed(seed)
    rows, width = 5, 9
    adv = torch.randn(rows, width, generator=g)
    mask = (torch.rand(rows, width, generator=g) < 0.6).float()
    entropies = torch.rand(rows, width, generator=g) * 4
    entropies[0] = 0.0  # a row of certain tokens
    x = ProcessAdvantageInputs(adv, None, mask, ActorConfig(), None, {"entropies": entropies})
    versions = adv._version, entropies._version
    got = gtpo(x, entropy_weight=weight)
    n = mask.sum(1).clamp(min=1)
    torch.testing.assert_close((got * mask).sum(1) / n, (adv * mask).sum(1) / n,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got * (1 - mask), adv * (1 - mask))  # inactive: kept
    # within a row the change is proportional to H - mean(H), with the sign of the row's mean A
    mean_adv = ((adv * mask).sum(1) / n)[:, None]
    mean_h = ((entropies * mask).sum(1) / n)[:, None]
    expected = adv + weight * mean_adv * torch.where(mean_h > 0, entropies / mean_h - 1, 0) * mask
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (adv._version, entropies._version) == versions  # inputs not modified


def module(implementation, **kwargs):
    return AdvantageModule(ActorConfig(kl_ctl=0.0, reward_norm=GROUP_NORM, advantage={
        "process_adv_shaping": {"implementation": implementation, "kwargs": kwargs}}))


def test_the_module_shapes_grpo_advantages_by_the_batchs_entropies():
    batch, meta = small_batch()
    g = torch.Generator().manual_seed(3)
    batch["entropies"] = torch.rand(batch["input_ids"].shape, generator=g) * 2
    plain = AdvantageModule(ActorConfig(kl_ctl=0.0, reward_norm=GROUP_NORM))(batch, meta)
    shaped = module("gtpo")(batch, meta)
    mask = plain["loss_mask"]
    expected = gtpo(ProcessAdvantageInputs(plain["advantages"], None, mask, ActorConfig(), None,
                                           {"entropies": batch["entropies"]}))
    torch.testing.assert_close(shaped["advantages"], expected)
    assert not torch.equal(shaped["advantages"] * mask, plain["advantages"] * mask)
    torch.testing.assert_close(shaped["returns"], plain["returns"])  # returns untouched
    masked = module("top_entropy_mask", quantile=0.5)(batch, meta)["advantages"]
    kept = (masked != 0) & (mask > 0)
    assert 0 < int(kept.sum()) < int(mask.sum())
    torch.testing.assert_close(masked[kept], plain["advantages"][kept])
    assert module("gtpo").required_batch_keys == {"entropies"}


def test_errors_name_the_stage_and_the_key():
    batch, meta = small_batch()
    with pytest.raises(ValueError, match=r"'gtpo'.*no 'entropies'"):
        module("gtpo")(batch, meta)
    batch["entropies"] = torch.ones(batch["input_ids"].shape)
    batch["token_rewards"] = torch.zeros(batch["input_ids"].shape)
    with pytest.raises(ValueError, match=r"'top_entropy_mask'.*'token_rewards'.*"
                                         r"token_rewards_as_adv: false"):
        module("top_entropy_mask")(batch, meta)
    del batch["token_rewards"]
    bad = batch["entropies"].clone()
    bad[1, 2] = -0.5
    with pytest.raises(ValueError, match=r"'entropies': expected non-negative.*\(1, 2\)"):
        module("gtpo")({**batch, "entropies": bad}, meta)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"'entropies': expected finite values"):
        module("gtpo")({**batch, "entropies": bad}, meta)
    with pytest.raises(ValueError, match=r"'entropies': expected shape \[6, 9\]"):
        module("gtpo")({**batch, "entropies": torch.ones(6, 8)}, meta)
    with pytest.raises(ValueError, match=r"kwargs.quantile: expected a number in \(0, 1\]"):
        module("top_entropy_mask", quantile=0)
    with pytest.raises(ValueError, match=r"kwargs.entropy_weight: expected a number <= 1.0"):
        module("gtpo", entropy_weight=1.5)
