"""AdvantageMetrics: hand-computed values, a slow loop over a real AdvantageModule result,
accumulation as global token means, PPOLoss diagnostics, errors, and DDP (gloo processes)."""

import math

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import given, settings, strategies as st

from examples.quickstart import small_batch
from lightning_adv import (
    ActorConfig, AdvantageMetrics, AdvantageModule, BatchMeta, NormConfig, PPOLoss)

import tests.support.loss_ddp_workers as workers


def hand_out() -> dict:
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    return {
        "loss_mask": mask,
        "tot_rewards": torch.tensor([[9, 1, 2, 9], [9, 3, 9, 9], [9, 9, 9, 9], [0, 0, 0, 4.0]]),
        "kl_rewards": torch.tensor([[9, -1, -1, 9], [9, -2, 9, 9], [9, 9, 9, 9], [0, 0, 0, -1.0]]),
        "advantages": torch.tensor([[5, 1, -1, 5], [5, 2, 5, 5], [5, 5, 5, 5], [0, 1e-8, 0, 0]]),
        "returns": torch.tensor([[7, 2, 4, 7], [7, 0, 7, 7], [7, 7, 7, 7], [1, 1, 1, 1.0]]),
    }


def test_hand_computed_values():
    # groups: rows {0, 1} (signal), row {2} (no active token), row {3} (|A| <= atol)
    meta = BatchMeta(n_trajs=3, traj_group_sizes=[2, 1, 1])
    out = AdvantageMetrics()(hand_out(), meta)
    tokens = 7
    assert out["train/total_rewards"].item() == pytest.approx((1 + 2 + 3 + 4) / tokens)
    assert out["train/kl_rewards"].item() == pytest.approx((-1 - 1 - 2 - 1) / tokens)
    adv = [1, -1, 2, 0, 1e-8, 0, 0]
    mean = sum(adv) / tokens
    assert out["train/advantages_mean"].item() == pytest.approx(mean)
    std = math.sqrt(sum((a - mean) ** 2 for a in adv) / tokens)
    assert out["train/advantages_std"].item() == pytest.approx(std, rel=1e-6)
    assert out["train/advantages_min"].item() == -1 and out["train/advantages_max"].item() == 2
    ret = [2, 4, 0, 1, 1, 1, 1]
    assert out["train/returns_mean"].item() == pytest.approx(10 / 7)
    assert out["train/returns_min"].item() == 0 and out["train/returns_max"].item() == 4
    assert out["train/returns_std"].item() == pytest.approx(
        math.sqrt(sum((r - 10 / 7) ** 2 for r in ret) / 7), rel=1e-6)
    assert out["train/zero_adv_group_frac"].item() == pytest.approx(2 / 3)
    assert "train/process_reward" not in out and "train/policy_loss" not in out


def test_zero_atol_and_prefix():
    meta = BatchMeta(n_trajs=3, traj_group_sizes=[2, 1, 1])
    out = AdvantageMetrics(prefix="adv/", zero_atol=0.0)(hand_out(), meta)
    assert out["adv/zero_adv_group_frac"].item() == pytest.approx(1 / 3)  # 1e-8 is a signal now


def slow_reference(out: dict, sizes: list[int]) -> dict:
    mask = out["loss_mask"].tolist()
    cells = [(b, t) for b in range(len(mask)) for t in range(len(mask[b])) if mask[b][t]]

    def values(key):
        x = out[key].tolist()
        return [x[b][t] for b, t in cells]

    result = {"total_rewards": sum(values("tot_rewards")) / len(cells),
              "kl_rewards": sum(values("kl_rewards")) / len(cells)}
    for key in ("advantages", "returns"):
        xs = values(key)
        mean = sum(xs) / len(xs)
        result.update({f"{key}_mean": mean, f"{key}_min": min(xs), f"{key}_max": max(xs),
                       f"{key}_std": math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))})
    zero, start = 0, 0
    adv = out["advantages"].tolist()
    for size in sizes:
        rows = range(start, start + size)
        zero += all(abs(adv[b][t]) <= 1e-6 for b in rows for t in range(len(adv[b])) if mask[b][t])
        start += size
    result["zero_adv_group_frac"] = zero / len(sizes)
    return result


def test_a_real_advantage_result_against_a_loop():
    batch, meta = small_batch()
    for config in (ActorConfig(kl_ctl=0.05, gae_lambda=0.9),
                   ActorConfig(kl_ctl=0.0, reward_norm=NormConfig(mean_level="group", std_level="group"))):
        out = AdvantageModule(config)(batch, meta)
        got = AdvantageMetrics()(out, meta)
        for key, want in slow_reference(out, meta.traj_group_sizes).items():
            assert got[f"train/{key}"].item() == pytest.approx(want, rel=1e-5, abs=1e-6), key
    # GRPO (no critic) with all-equal rewards in prompt 2: its advantages are all zero
    batch = {k: v for k, v in batch.items() if k != "values"}
    batch["rewards"] = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    out = AdvantageModule(ActorConfig(kl_ctl=0.0, reward_norm=NormConfig(
        mean_level="group", std_level="group")))(batch, meta)
    assert AdvantageMetrics()(out, meta)["train/zero_adv_group_frac"].item() == 0.5


def test_updates_accumulate_as_a_global_token_mean():
    """Two batches of 7 and 1 tokens: the mean over the 8 tokens, not the mean of means."""
    metric = AdvantageMetrics()
    one = hand_out()
    two = {k: v[1:2] for k, v in hand_out().items()}  # one token, total reward 3
    metric.update(one, BatchMeta(n_trajs=3, traj_group_sizes=[2, 1, 1]))
    metric.update(two, BatchMeta(n_trajs=1, traj_group_sizes=[1]))
    got = metric.compute()
    assert got["train/total_rewards"].item() == pytest.approx((10 + 3) / 8)
    assert got["train/zero_adv_group_frac"].item() == pytest.approx(2 / 4)
    metric.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert metric.compute() == {}  # no key without data


def test_forward_returns_the_batch_value_and_accumulates():
    metric = AdvantageMetrics()
    first = metric(hand_out())
    second = metric({k: v[1:2] for k, v in hand_out().items()})
    assert second["train/total_rewards"].item() == pytest.approx(3.0)
    assert first["train/total_rewards"].item() == pytest.approx(10 / 7)
    assert metric.compute()["train/total_rewards"].item() == pytest.approx(13 / 8)


def test_process_reward_over_generated_tokens():
    out = hand_out()
    out["token_rewards"] = torch.tensor([[0, 0.5, 0.25, 9], [0, 1, 9, 9], [9] * 4, [9] * 4])
    out["input_token_loss_mask"] = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0], [0] * 4, [0] * 4])
    assert AdvantageMetrics()(out)["train/process_reward"].item() == pytest.approx(1.75 / 3)


def test_loss_diagnostics_are_weighted_by_tokens():
    g = torch.Generator().manual_seed(0)
    data = {k: torch.randn(6, 5, generator=g, dtype=torch.float64) for k in
            ("logprobs", "old", "adv", "ref", "values", "returns", "entropy")}
    for key in ("logprobs", "old", "ref"):  # log-probs are <= 0 (PPOLoss checks old_logprobs)
        data[key] = -data[key].abs()
    mask = (torch.rand(6, 5, generator=g) < 0.5).double()
    mask[:2] = 1  # the first minibatch has many more tokens
    loss = PPOLoss(kl_coef=0.1, entropy_coef=0.01, dual_clip=2.0)

    def run(rows):
        return loss(data["logprobs"][rows], data["old"][rows], data["adv"][rows], mask[rows],
                    ref_logprobs=data["ref"][rows], values=data["values"][rows],
                    returns=data["returns"][rows], entropy=data["entropy"][rows])

    metric = AdvantageMetrics()
    metric.update(loss=run(slice(0, 2)))
    metric.update(loss=run(slice(2, 6)))
    whole = run(slice(0, 6))
    got = metric.compute()
    for key in ("policy_loss", "value_loss", "kl_loss", "entropy", "approx_kl", "clipfrac",
                "clipfrac_high", "clipfrac_low", "dual_clipfrac"):
        assert got[f"train/{key}"].item() == pytest.approx(whole[key].item(), rel=1e-6), key
    assert "train/total_rewards" not in got


@pytest.mark.parametrize("call,match", [
    (lambda m: m.update(), "neither"),
    (lambda m: m.update(meta=BatchMeta(n_trajs=1, traj_group_sizes=[4])), "meta"),
    (lambda m: m.update({k: v for k, v in hand_out().items() if k != "returns"}), "'returns'"),
    (lambda m: m.update(dict(hand_out(), advantages=torch.zeros(4, 3))), "'advantages'"),
    (lambda m: m.update(dict(hand_out(), loss_mask=hand_out()["loss_mask"] * 0.5)), "loss_mask"),
    (lambda m: m.update(hand_out(), BatchMeta(n_trajs=2, traj_group_sizes=[2, 1])),
     "traj_group_sizes"),
    (lambda m: m.update(hand_out(), meta=[2, 2]), "meta"),
    (lambda m: m.update(dict(hand_out(), token_rewards=torch.zeros(4, 4))), "input_token_loss_mask"),
    (lambda m: m.update(loss={"loss": torch.tensor(1.0)}), "num_tokens"),
    (lambda m: AdvantageMetrics(zero_atol=-1.0), "zero_atol"),
])
def test_bad_inputs_name_the_key(call, match):
    with pytest.raises(ValueError, match=match):
        call(AdvantageMetrics())


def test_inputs_are_not_modified():
    out = hand_out()
    versions = {k: v._version for k, v in out.items()}
    AdvantageMetrics()(out, BatchMeta(n_trajs=3, traj_group_sizes=[2, 1, 1]))
    assert {k: v._version for k, v in out.items()} == versions


# ---------------------------------------------------------------- DDP


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics_ddp")
    mp.spawn(workers.worker, args=(2, str(tmp / "init"), str(tmp / "rank0.pt")), nprocs=2, join=True)
    return torch.load(tmp / "rank0.pt", weights_only=True)


def single_process() -> dict:
    data = workers.global_batch()
    meta = BatchMeta(n_trajs=len(workers.GROUP_SIZES), traj_group_sizes=workers.GROUP_SIZES)
    metrics = AdvantageMetrics()
    batch_value = metrics(workers.advantage_out(data), meta)
    model = workers.TinyPolicy()
    logprobs, values, entropy = model(data["features"], data["old_logprobs"])
    metrics.update(loss=PPOLoss(**workers.loss_kwargs("token-mean"))(
        logprobs.detach(), data["old_logprobs"], data["advantages"], data["loss_mask"],
        ref_logprobs=data["ref_logprobs"], values=values.detach(), old_values=data["old_values"],
        returns=data["returns"], entropy=entropy.detach()))
    return {"forward": batch_value, "compute": metrics.compute()}


def test_ddp_means_equal_one_process_on_the_union(ddp_results):
    """Rank 0 holds 2 rows and rank 1 5 rows (unequal tokens): global token means, the
    union's min/max and group fraction, on the synced forward value and on compute."""
    single = single_process()
    for which in ("forward", "compute"):
        assert set(ddp_results[which]) == set(single[which]), which
        for key, want in single[which].items():
            assert torch.allclose(ddp_results[which][key], want, rtol=1e-6, atol=1e-7), (which, key)
    assert single["compute"]["train/zero_adv_group_frac"].item() == pytest.approx(0.25)
    assert "train/policy_loss" in single["compute"] and "train/process_reward" in single["compute"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), sizes=st.lists(st.integers(1, 3), min_size=2, max_size=5),
       cut=st.integers(1, 4))
def test_split_updates_equal_one_update(seed, sizes, cut):
    """Prompt groups split over several updates (as over ranks) give the statistics of one
    update over all of them."""
    g = torch.Generator().manual_seed(seed)
    rows, width = sum(sizes), 5
    mask = (torch.rand(rows, width, generator=g) < 0.6).float()
    out = {k: torch.randn(rows, width, generator=g) * (torch.rand(rows, 1, generator=g) < 0.7)
           for k in ("advantages", "returns", "tot_rewards", "kl_rewards")}
    out["loss_mask"] = mask
    whole = AdvantageMetrics()(out, BatchMeta(n_trajs=len(sizes), traj_group_sizes=sizes))
    cut = min(cut, len(sizes) - 1)
    split = sum(sizes[:cut])
    metric = AdvantageMetrics()
    metric.update({k: v[:split] for k, v in out.items()}, BatchMeta(n_trajs=cut, traj_group_sizes=sizes[:cut]))
    metric.update({k: v[split:] for k, v in out.items()},
                  BatchMeta(n_trajs=len(sizes) - cut, traj_group_sizes=sizes[cut:]))
    parts = metric.compute()
    assert set(parts) == set(whole)
    for key in whole:
        assert torch.allclose(parts[key], whole[key], rtol=1e-5, atol=1e-6), key


def test_unnormalized_advantages_are_the_estimators_output_before_adv_norm():
    """With adv_norm set, the module also returns the advantages before normalization;
    their statistics equal those of the same pipeline run without adv_norm."""
    from lightning_adv import ActorConfig, AdvantageModule, NormConfig

    g = torch.Generator().manual_seed(5)
    B, T = 6, 9
    attention = torch.ones(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.long)
    loss_mask[:, 3:] = 1
    batch = {"input_ids": torch.zeros(B, T, dtype=torch.long), "attention_mask": attention,
             "loss_mask": loss_mask, "logprobs": -torch.rand(B, T, generator=g) * loss_mask,
             "rewards": torch.randn(B, generator=g), "values": torch.randn(B, T, generator=g)}
    plain = AdvantageModule(ActorConfig(kl_ctl=0.0, gae_lambda=0.9))(batch)
    normed = AdvantageModule(ActorConfig(kl_ctl=0.0, gae_lambda=0.9, adv_norm=NormConfig()))(batch)
    assert "unnormalized_advantages" not in plain
    assert torch.equal(normed["unnormalized_advantages"], plain["advantages"])
    metrics = AdvantageMetrics(dist_sync_on_step=False)
    metrics.update(normed)
    got = metrics.compute()
    active = plain["loss_mask"] > 0
    raw = plain["advantages"][active].double()
    assert got["train/unnormalized_advantages_mean"].item() == pytest.approx(raw.mean().item(), rel=1e-5)
    assert got["train/unnormalized_advantages_std"].item() == pytest.approx(raw.std(unbiased=False).item(), rel=1e-5)
    assert got["train/unnormalized_advantages_max"].item() == pytest.approx(raw.max().item(), rel=1e-6)
    assert abs(got["train/advantages_mean"].item()) < 1e-5  # the normalized ones
