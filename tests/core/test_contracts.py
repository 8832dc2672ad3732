"""User stages that break their contract get a stage-named AdvantageContractError (SPEC §4).

Each violating function below is referenced from the config by its dotted path
(``tests.support.contract_stages.<name>``), exactly as a user plug-in would be.
"""

import dataclasses
import pytest
import torch
from tests.support.batches import rows_batch
from lightning_adv import (
    ActorConfig, AdvantageContractError, AdvantageModule, AdvantageResult, NormConfig,
    OutcomeResult, RolloutGroup, TemporalResult, concat_batch)
from tests.support.contract_stages import *  # noqa: F401,F403
from tests.support.contract_stages import VIOLATIONS, batch, module


@pytest.mark.parametrize("stage, name, field, expected", VIOLATIONS, ids=[v[1] for v in VIOLATIONS])
def test_contract_violation_names_stage_implementation_and_field(stage, name, field, expected):
    b = batch()
    if name == "compute_int_rewards_changed":
        b["rewards"] = torch.tensor([1, 2])
    with pytest.raises(AdvantageContractError) as err:
        module(stage, name)(b)
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert f"advantage.{stage} 'tests.support.contract_stages.{name}'" in message, message
    assert field in message and expected in message, message


def test_integer_rewards_equal_to_the_task_rewards_pass():
    b = batch()
    b["rewards"] = torch.tensor([1, 2])
    out = module("outcome_reward_shaping", "outcome_integer_passthrough", kl_ctl=0.0)(b)
    assert out["rewards"].dtype == torch.int64
    assert out["advantages"][:, 0].tolist() == [1.0, 2.0]


def test_valid_user_stages_run():
    out = module("outcome_reward_shaping", "outcome_scaled", {"factor": 3.0}, kl_ctl=0.0)(batch())
    assert out["advantages"][:, 0].tolist() == [3.0, 6.0]
    out = module("estimator", "estimator_ok", kl_ctl=0.0)(batch())
    assert out["advantages"].tolist() == [[1, 1, 0, 0], [2, 2, 2, 0]]
    out = module("compute", "compute_with_kwargs", {"scale": 2.0})(batch())
    assert out["advantages"][:, 0].tolist() == [2.0, 4.0]
    assert out["is_truncated"].tolist() == [False, False]


def test_mopd_requires_behaviour_logprobs_from_a_replacement():
    b = batch(mopd_teacher_logp_sum=torch.zeros(2, 4))
    with pytest.raises(AdvantageContractError, match="mopd_behavior_logprobs"):
        module("compute", "compute_without_mopd")(b)
    out = module("compute", "compute_with_mopd")(b)
    assert "mopd_behavior_logprobs" in out
    module("compute", "compute_without_mopd")(batch())  # no MOPD, nothing required


# ---------------------------------------------------------------- normalization references

NORM = NormConfig(mean_level="group", std_level=None)


def grouped(rewards, group):
    return concat_batch([rows_batch(["pg.", "pg.", "pg."], rewards, rollout_group=group)])


def test_custom_outcome_with_explicit_references_must_return_them():
    b, meta = grouped([1.0, 5.0, 3.0], RolloutGroup((2, 1), (1.0, 3.0)))
    with pytest.raises(ValueError, match="must return OutcomeResult.normalization_rewards"):
        module("outcome_reward_shaping", "outcome_scaled", reward_norm=NORM)(b, meta)
    out = module("outcome_reward_shaping", "outcome_scaled_with_references",
                 reward_norm=NORM, kl_ctl=0.0)(b, meta)
    # references 2, 6 -> mean 4; rows 2, 10, 6 -> -2, 6, 2
    assert out["advantages"][:, 0].tolist() == [-2.0, 6.0, 2.0]


def test_references_are_derived_from_shaped_rows_when_they_agree():
    b, meta = grouped([1.0, 1.0, 3.0], RolloutGroup((2, 1)))
    out = module("outcome_reward_shaping", "outcome_scaled", reward_norm=NORM, kl_ctl=0.0)(b, meta)
    assert out["advantages"][:, 0].tolist() == [-2.0, -2.0, 2.0]  # refs 2, 6 -> mean 4


def test_shaped_rows_that_differ_need_references():
    b, meta = grouped([1.0, 1.0, 3.0], RolloutGroup((2, 1)))
    with pytest.raises(ValueError, match=r"rows \[1\] of a split rollout"):
        module("outcome_reward_shaping", "outcome_row_noise", reward_norm=NORM)(b, meta)


def test_normalization_rewards_need_complete_meta_and_the_right_length():
    b, meta = grouped([1.0, 1.0, 3.0], RolloutGroup((2, 1), (1.0, 3.0)))
    with pytest.raises(AdvantageContractError, match=r"normalization_rewards.*shape \[2\]"):
        module("outcome_reward_shaping", "outcome_norm_wrong_length", reward_norm=NORM)(b, meta)
    with pytest.raises(AdvantageContractError, match="complete metadata"):
        module("outcome_reward_shaping", "outcome_norm_wrong_length", reward_norm=NORM)(b)
