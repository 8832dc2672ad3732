"""Property tests: ``AdvantageModule`` equals the spec pipeline on random valid batches.

The spec pipeline (tests/spec_pipeline.py) is written from SPEC §3; the batches come
from tests/strategies.py. Three metadata situations are covered: the complete meta of
``concat_batch`` (rollout-aware reward normalization), ``meta=None`` (fixed
``group_size`` slices) and a hand-built ``BatchMeta`` without ``rollout_groups``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_adv import (
    ActorConfig, AdvantageModule, BatchMeta, NormConfig, PRMAdvantageShapingConfig, concat_batch)
from lightning_adv.exceptions import DroppedOutcomeRewardWarning
from tests.support.spec_compare import compare_outputs
from tests.support.spec_pipeline import SpecError, spec_pipeline_advantages
from tests.support.strategies import RolloutCase, divisors, rollout_cases, with_group_size

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def run_module(config, batch, meta, prm):
    """The module's output and the DroppedOutcomeRewardWarnings it emitted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = AdvantageModule(config)(batch, meta, prm=prm)
    dropped = [w for w in caught if issubclass(w.category, DroppedOutcomeRewardWarning)]
    return out, dropped


def check_against_spec_pipeline(config, batch, meta, prm):
    details: dict = {}
    try:
        want = spec_pipeline_advantages(batch, meta, config, prm, details=details)
    except SpecError as exc:
        with pytest.raises((ValueError, TypeError)):
            run_module(config, batch, meta, prm)
        return f"both raise ({exc})"
    got, dropped_warnings = run_module(config, batch, meta, prm)
    problems = compare_outputs(got, want, details)
    assert not problems, "\n".join(problems)
    check_dropped_warning(config, details["dropped"], dropped_warnings)
    return "ok"


def check_dropped_warning(config, dropped, caught):
    """SPEC §9: one warning per batch when an outcome reward lands on an inactive position."""
    if config.dropped_outcome_reward == "ignore" or not dropped:
        assert not caught, [str(w.message) for w in caught]
        return
    if any(value != 0 for _, value in dropped):
        assert len(caught) == 1, f"expected one DroppedOutcomeRewardWarning, got {len(caught)}"
        message = str(caught[0].message)
        for row, value in dropped:
            if value != 0:
                assert str(row) in message, f"row {row} not named in: {message}"
    else:
        assert len(caught) <= 1  # only zero rewards dropped: a warning is optional


@SETTINGS
@given(case=rollout_cases())
def test_module_matches_spec_pipeline_with_concat_meta(case: RolloutCase):
    batch, meta = case.batch()
    check_against_spec_pipeline(case.config, batch, meta, case.prm)


@st.composite
def cases_without_rollout_groups(draw):
    """A case plus a group size dividing B (for meta=None) and the choice of meta."""
    case = draw(rollout_cases())
    batch, meta = case.batch()
    n_rows = batch["attention_mask"].shape[0]
    group_size = draw(st.sampled_from(divisors(n_rows)))
    return case, group_size


@SETTINGS
@given(data=cases_without_rollout_groups())
def test_module_matches_spec_pipeline_without_meta(data):
    case, group_size = data
    config = with_group_size(case.config, group_size)
    batch, _ = case.batch()
    check_against_spec_pipeline(config, batch, None, case.prm)


@SETTINGS
@given(case=rollout_cases())
def test_module_matches_spec_pipeline_with_hand_built_meta(case: RolloutCase):
    batch, meta = case.batch()
    plain = BatchMeta(n_trajs=meta.n_trajs, traj_group_sizes=list(meta.traj_group_sizes))
    check_against_spec_pipeline(case.config, batch, plain, case.prm)


# ----------------------------------------------------------------------------------------
# exact boundaries of the process modes (the property tests accept either side there)
# ----------------------------------------------------------------------------------------

def one_row_batch(token_rewards):
    """prompt | 4 generated tokens; zero rewards, values, logprobs: advantages are 0."""
    n = len(token_rewards)
    width = n + 1
    return concat_batch([{
        "input_ids": torch.ones(1, width, dtype=torch.int64),
        "attention_mask": torch.ones(1, width, dtype=torch.bool),
        "loss_mask": torch.tensor([[0] + [1] * n]),
        "logprobs": torch.zeros(1, width),
        "rewards": torch.zeros(1),
        "is_truncated": torch.tensor([False]),
        "token_rewards": torch.tensor([[0.0] + list(token_rewards)]),
    }])


@pytest.mark.parametrize("mode,gvpo,token_rewards", [
    ("process_weighted", {}, [0.5, 0.0, 1.0, 0.25]),           # A = 0 -> A * r = 0
    ("gvpo", {"zero_eps": 0.0, "zero_penalty": 0.4}, [-0.5, 0.5, -1.0, 0.0]),  # |A| <= 0 -> -z
    ("gvpo", {"zero_eps": 0.05, "zero_penalty": 0.1}, [-0.5, 0.5, -1.0, 0.0]),
    ("additive", {}, [-0.5, 0.5, -1.0, 0.0]),
])
def test_process_modes_at_zero_advantage(mode, gvpo, token_rewards):
    batch, meta = one_row_batch(token_rewards)
    config = ActorConfig(kl_ctl=0.0)
    prm = PRMAdvantageShapingConfig(mode=mode, **gvpo)
    want = spec_pipeline_advantages(batch, meta, config, prm)
    got, _ = run_module(config, batch, meta, prm)
    assert torch.equal(want["advantages"], got["advantages"]), (want["advantages"], got["advantages"])


def test_reward_norm_zero_std_uses_scale_one():
    """Rollout-aware path: a scale <= 2*eps becomes 1. Equal explicit references give
    std 0, while the rows' own rewards differ from them, so the rule shows."""
    from lightning_adv import RolloutGroup
    batch, _ = one_row_batch([0.0, 0.0])
    traj = {k: torch.cat([v, v]) for k, v in batch.items()}
    traj["rewards"] = torch.tensor([2.0, 0.0])
    traj["rollout_group"] = RolloutGroup((1, 1), (1.0, 1.0))
    batch, meta = concat_batch([traj])
    config = ActorConfig(reward_norm=NormConfig(mean_level="group", std_level="group"),
                         kl_ctl=0.0)
    want = spec_pipeline_advantages(batch, meta, config)
    got, _ = run_module(config, batch, meta, None)
    assert want["advantages"][:, 0].tolist() == [1.0, -1.0]
    assert torch.allclose(want["advantages"], got["advantages"], rtol=1e-5, atol=1e-5), \
        got["advantages"]


# ----------------------------------------------------------------------------------------
# the "rows of a split rollout must agree" rule (SPEC §3 step 3)
# ----------------------------------------------------------------------------------------

def split_rollout_batch(rewards, generated, refs=()):
    """One prompt, one logical rollout over len(rewards) rows; row i generates
    generated[i] tokens (prompt of one token, right-padded)."""
    from lightning_adv import RolloutGroup
    width = max(generated) + 2
    rows = len(rewards)
    loss_mask = torch.zeros(rows, width, dtype=torch.int64)
    attention = torch.zeros(rows, width, dtype=torch.bool)
    for i, n in enumerate(generated):
        loss_mask[i, 1:1 + n] = 1
        attention[i, :1 + n] = True
    return concat_batch([{
        "input_ids": attention.long(), "attention_mask": attention, "loss_mask": loss_mask,
        "logprobs": torch.zeros(rows, width), "rewards": torch.tensor(rewards),
        "rollout_group": RolloutGroup((rows,), tuple(refs)),
    }, {
        "input_ids": torch.ones(1, 3, dtype=torch.int64),
        "attention_mask": torch.ones(1, 3, dtype=torch.bool),
        "loss_mask": torch.tensor([[0, 1, 1]]), "logprobs": torch.zeros(1, 3),
        "rewards": torch.tensor([0.5]),
    }])


PENALTY = dict(overlong_reward_penalty=True, overlong_tokens=2, overlong_penalty_factor=1.0,
               max_new_tokens=4, reward_norm=NormConfig(mean_level="batch", std_level="batch"))


@pytest.mark.parametrize("rewards,generated,refs,raises", [
    ([1.0, 1.0], [1, 1], (), False),        # agree
    ([1.0, 0.5], [1, 1], (), True),         # rows differ
    ([1.0, 1.0], [1, 4], (), True),         # penalized rewards differ (row 1 penalized)
    ([1.0, 1.5], [1, 3], (), True),         # penalized equal (1.0, 1.0), unpenalized differ
    ([1.0, 0.5], [1, 4], (0.25,), False),   # an explicit reference bypasses the rule
])
def test_split_rollout_rows_must_agree(rewards, generated, refs, raises):
    batch, meta = split_rollout_batch(rewards, generated, refs)
    config = ActorConfig(**PENALTY)
    if raises:
        with pytest.raises(SpecError):
            spec_pipeline_advantages(batch, meta, config)
        with pytest.raises((ValueError, RuntimeError)):
            run_module(config, batch, meta, None)
    else:
        assert check_against_spec_pipeline(config, batch, meta, None) == "ok"
