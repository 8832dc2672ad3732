"""Invariants of the default pipeline, as hypothesis properties over random valid batches."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_adv import ActorConfig, AdvantageModule, NormConfig, RolloutGroup, concat_batch
from tests.support.strategies import norm_configs, rollout_cases

SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOKEN_KEYS = ("advantages", "returns", "tot_rewards", "kl_rewards", "loss_mask", "logprobs")


def run(config, batch, meta, prm=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AdvantageModule(config)(batch, meta, prm=prm)


def outputs_or_error(config, batch, meta, prm):
    try:
        return run(config, batch, meta, prm)
    except ValueError as exc:
        return exc


def assert_close(got, want, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    err = ((got.double() - want.double()).abs() / want.double().abs().clamp_min(1.0)).max()
    assert err <= 1e-5, (what, err.item())


@SETTINGS
@given(case=rollout_cases(max_prompts=4), data=st.data())
def test_permuting_prompt_groups_permutes_the_outputs(case, data):
    order = data.draw(st.permutations(range(len(case.trajectories))))
    batch, meta = case.batch()
    shuffled, shuffled_meta = concat_batch(copy.deepcopy([case.trajectories[i] for i in order]))
    first = outputs_or_error(case.config, batch, meta, case.prm)
    second = outputs_or_error(case.config, shuffled, shuffled_meta, case.prm)
    if isinstance(first, Exception) or isinstance(second, Exception):
        assert type(first) is type(second), (first, second)
        return
    starts = [0]
    for size in meta.traj_group_sizes:
        starts.append(starts[-1] + size)
    rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in order])
    for key in TOKEN_KEYS + ("rewards",):
        assert_close(second[key], first[key][rows], key)


@SETTINGS
@given(case=rollout_cases(), extra=st.integers(1, 5))
def test_padding_columns_leave_real_positions_unchanged(case, extra):
    batch, meta = case.batch()
    width = batch["input_ids"].shape[1]
    if batch.get("is_truncated") is None:
        # Explicit: the "row fills the width" fallback would change with the width.
        batch["is_truncated"] = batch["attention_mask"].bool().sum(1) == width
    padded = {k: torch.nn.functional.pad(v, (0, extra)) if isinstance(v, torch.Tensor) and v.ndim == 2
              else v for k, v in batch.items()}
    first = outputs_or_error(case.config, batch, meta, case.prm)
    second = outputs_or_error(case.config, padded, meta, case.prm)
    if isinstance(first, Exception) or isinstance(second, Exception):
        assert type(first) is type(second), (first, second)
        return
    for key in TOKEN_KEYS:
        assert_close(second[key][:, :width], first[key], key)
        assert second[key][:, width:].abs().sum() == 0, key
    assert torch.equal(second["rewards"], first["rewards"])


@SETTINGS
@given(case=rollout_cases(), unit=st.sampled_from(["token", "turn"]))
def test_undiscounted_monte_carlo_gives_every_active_token_the_outcome(case, unit):
    config = dataclasses.replace(case.config, discount=1.0, gae_lambda=1.0, gae_lambda_kwargs={},
                                 kl_ctl=0.0, reward_norm=None, adv_norm=None,
                                 overlong_reward_penalty=False, gae_timestep_unit=unit,
                                 advantage=dataclasses.replace(case.config.advantage, estimator=None))
    batch, meta = case.batch()
    for key in ("values", "token_rewards"):
        batch.pop(key, None)
    if unit == "turn" and batch.get("turn_ids") is None:
        return
    out = run(config, batch, meta)
    score = ((batch["rewards"].double() + config.reward_bias) * config.reward_scaling).clamp(
        -config.reward_clip, config.reward_clip)
    seqlens = batch["attention_mask"].bool().sum(1)
    mask = out["loss_mask"].bool()
    rows = torch.arange(len(seqlens))
    outcome_active = mask[rows, (seqlens - 2).clamp(min=0)]
    truncated = out["is_truncated"]
    for b in range(len(seqlens)):
        want = score[b].item() if outcome_active[b] else 0.0
        if config.mask_no_eos_with_zero and truncated[b]:
            want = 0.0
        got = out["advantages"][b][mask[b]]
        assert torch.allclose(got.double(), torch.full_like(got.double(), want), atol=1e-5), (b, got, want)


@SETTINGS
@given(case=rollout_cases(), norm=norm_configs(), value=st.sampled_from([-2.0, 0.0, 0.5, 3.0]))
def test_leave_one_out_over_identical_rewards_gives_zeros(case, norm, value):
    norm = dataclasses.replace(norm, mean_level="group", mean_leave1out=True)
    trajs = copy.deepcopy(case.trajectories)
    for t in trajs:
        t["rewards"] = torch.full(t["rewards"].shape, value)  # float even for int rewards
        group = t.get("rollout_group")
        if group is not None:  # explicit references identical to the rewards
            t["rollout_group"] = RolloutGroup(group.row_counts,
                                              tuple(None if r is None else value for r in group.rewards))
    config = dataclasses.replace(case.config, reward_norm=norm, adv_norm=None, kl_ctl=0.0,
                                 overlong_reward_penalty=False)
    batch, meta = concat_batch(trajs)
    for key in ("values", "token_rewards"):
        batch.pop(key, None)
    out = run(config, batch, meta)
    assert out["advantages"].abs().max() <= 1e-6


def test_leave_one_out_of_identical_rewards_by_hand():
    from tests.support.batches import rows_batch
    batch, meta = concat_batch([rows_batch(["pg.", "pgg", "pg."], [0.7, 0.7, 0.7])])
    for norm in (NormConfig(mean_level="group", mean_leave1out=True, std_level=None),
                 NormConfig(mean_level="group", mean_leave1out=True, std_level="group"),
                 NormConfig(mean_level="group", mean_leave1out=True, std_level="batch")):
        out = run(ActorConfig(kl_ctl=0.0, reward_norm=norm), batch, meta)
        assert out["advantages"].abs().max() == 0, norm
