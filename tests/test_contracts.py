"""User stages that break their contract get a stage-named AdvantageContractError (SPEC §4).

Each violating function below is referenced from the config by its dotted path
(``test_contracts.<name>``), exactly as a user plug-in would be.
"""

import dataclasses

import pytest
import torch

from batches import rows_batch
from lightning_adv import (
    ActorConfig, AdvantageContractError, AdvantageModule, AdvantageResult, NormConfig,
    OutcomeResult, RolloutGroup, TemporalResult, concat_batch)

# ---------------------------------------------------------------- outcome stage functions


def outcome_not_a_result(inputs):
    return inputs.data["rewards"]


def outcome_extra_row(inputs):
    return OutcomeResult(torch.zeros(inputs.data["rewards"].shape[0] + 1))


def outcome_other_device(inputs):
    return OutcomeResult(torch.zeros(inputs.data["rewards"].shape, device="meta"))


def outcome_integer(inputs):
    return OutcomeResult(inputs.data["rewards"].round().long() + 1)


def outcome_integer_passthrough(inputs):
    return OutcomeResult(inputs.data["rewards"])


def outcome_nan(inputs):
    return OutcomeResult(inputs.data["rewards"] * float("nan"))


def outcome_in_place(inputs):
    rewards = inputs.data["rewards"]
    rewards.mul_(2)
    return OutcomeResult(rewards)


def outcome_adds_key(inputs):
    inputs.data["shaped"] = inputs.data["rewards"]
    return OutcomeResult(inputs.data["rewards"])


def outcome_deletes_key(inputs):
    del inputs.data["values"]
    return OutcomeResult(inputs.data["rewards"])


def outcome_norm_wrong_length(inputs):
    return OutcomeResult(inputs.data["rewards"].float(), torch.zeros(5))


def outcome_scaled(inputs, *, factor: float = 2.0):
    return OutcomeResult(inputs.data["rewards"] * factor)


def outcome_scaled_with_references(inputs, *, factor: float = 2.0):
    refs = [r * factor for g in inputs.meta.rollout_groups for r in g.rewards]
    return OutcomeResult(inputs.data["rewards"] * factor, torch.tensor(refs))


def outcome_row_noise(inputs):
    return OutcomeResult(inputs.data["rewards"] + torch.arange(inputs.data["rewards"].shape[0]))


# ---------------------------------------------------------------- estimator functions

def _gae_like(inputs):
    adv = inputs.outcome_rewards.flip(1).cumsum(1).flip(1) * inputs.loss_mask
    return adv, adv + inputs.values


def estimator_not_a_result(inputs):
    return _gae_like(inputs)


def estimator_short_returns(inputs):
    adv, ret = _gae_like(inputs)
    return TemporalResult(adv, ret[:, :-1], inputs.outcome_rewards)


def estimator_inf(inputs):
    adv, ret = _gae_like(inputs)
    return TemporalResult(adv, ret + float("inf"), inputs.outcome_rewards)


def estimator_integer_total(inputs):
    adv, ret = _gae_like(inputs)
    return TemporalResult(adv, ret, inputs.outcome_rewards.long())


def estimator_in_place_values(inputs):
    adv, ret = _gae_like(inputs)
    inputs.values.zero_()
    return TemporalResult(adv, ret, inputs.outcome_rewards)


def estimator_in_place_mask(inputs):
    adv, ret = _gae_like(inputs)
    inputs.loss_mask[:, 0] = 1
    return TemporalResult(adv, ret, inputs.outcome_rewards)


def estimator_ok(inputs):
    adv, ret = _gae_like(inputs)
    return TemporalResult(adv, ret, inputs.outcome_rewards)


# ---------------------------------------------------------------- process functions

def process_returns_result(inputs):
    return TemporalResult(inputs.advantages, inputs.advantages, inputs.advantages)


def process_transposed(inputs):
    return inputs.advantages.t()


def process_nan(inputs):
    return inputs.advantages / 0 * 0


def process_in_place(inputs):
    return inputs.advantages.add_(1)


# ---------------------------------------------------------------- full replacements

def _result(inputs, **changes):
    data = inputs.data
    mask = torch.roll(data["loss_mask"].float(), -1, dims=-1)
    adv = data["rewards"].float()[:, None] * mask
    fields = dict(advantages=adv, returns=adv.clone(), loss_mask=mask,
                  logprobs=torch.roll(data["logprobs"], -1, dims=-1) * mask,
                  rewards=data["rewards"], total_rewards=adv.clone(), kl_rewards=torch.zeros_like(adv),
                  extras={"is_truncated": torch.zeros(mask.shape[0], dtype=torch.bool),
                          "input_token_loss_mask": data["loss_mask"]})
    fields.update(changes)
    return AdvantageResult(**fields)


def compute_ok(inputs):
    return _result(inputs)


def compute_not_a_result(inputs):
    return dataclasses.asdict(_result(inputs))


def compute_soft_mask(inputs):
    r = _result(inputs)
    return dataclasses.replace(r, loss_mask=r.loss_mask * 0.5)


def compute_extras_values(inputs):
    return _result(inputs, extras={"values": torch.zeros_like(inputs.data["logprobs"])})


def compute_extras_input_ids(inputs):
    return _result(inputs, extras={"input_ids": inputs.data["input_ids"] + 1})


def compute_extras_rewards(inputs):
    return _result(inputs, extras={"rewards": inputs.data["rewards"] * 2})


def compute_without_mopd(inputs):
    return _result(inputs)


def compute_with_mopd(inputs):
    r = _result(inputs)
    mopd = torch.roll(inputs.data["logprobs"], -1, dims=-1) * r.loss_mask
    return dataclasses.replace(r, extras={**r.extras, "mopd_behavior_logprobs": mopd})


def compute_int_rewards_changed(inputs):
    return _result(inputs, rewards=torch.ones(inputs.data["rewards"].shape, dtype=torch.long))


def compute_wide_logprobs(inputs):
    return _result(inputs, logprobs=torch.zeros(inputs.data["logprobs"].shape[0], 99))


def compute_in_place(inputs):
    inputs.data["logprobs"].zero_()
    return _result(inputs)


def compute_with_kwargs(inputs, *, scale: float):
    r = _result(inputs)
    return dataclasses.replace(r, advantages=r.advantages * scale)


# ---------------------------------------------------------------- the checks


def batch(**extra):
    return rows_batch(["pgg.", "pggg"], [1.0, 2.0], values=torch.zeros(2, 4), **extra)


def module(stage, name, kwargs=None, **config):
    spec = {"implementation": f"test_contracts.{name}", "kwargs": kwargs or {}}
    return AdvantageModule(ActorConfig(advantage={stage: spec}, **config))


VIOLATIONS = [
    ("outcome_reward_shaping", "outcome_not_a_result", "result", "an OutcomeResult"),
    ("outcome_reward_shaping", "outcome_extra_row", "rewards", "shape [2]"),
    ("outcome_reward_shaping", "outcome_other_device", "rewards", "device"),
    ("outcome_reward_shaping", "outcome_integer", "rewards", "floating-point"),
    ("outcome_reward_shaping", "outcome_nan", "rewards", "finite"),
    ("outcome_reward_shaping", "outcome_in_place", "data['rewards']", "modified in place"),
    ("outcome_reward_shaping", "outcome_adds_key", "input data", "read-only"),
    ("outcome_reward_shaping", "outcome_deletes_key", "input data", "read-only"),
    ("estimator", "estimator_not_a_result", "result", "a TemporalResult"),
    ("estimator", "estimator_short_returns", "returns", "shape [2, 4]"),
    ("estimator", "estimator_inf", "returns", "finite"),
    ("estimator", "estimator_integer_total", "total_rewards", "floating-point"),
    ("estimator", "estimator_in_place_values", "input values", "modified in place"),
    ("estimator", "estimator_in_place_mask", "input loss_mask", "modified in place"),
    ("process_adv_shaping", "process_returns_result", "result", "tensor of shape [2, 4]"),
    ("process_adv_shaping", "process_transposed", "result", "shape [2, 4]"),
    ("process_adv_shaping", "process_nan", "result", "finite"),
    ("process_adv_shaping", "process_in_place", "input advantages", "modified in place"),
    ("compute", "compute_not_a_result", "result", "an AdvantageResult"),
    ("compute", "compute_soft_mask", "loss_mask", "only 0 and 1"),
    ("compute", "compute_extras_values", "extras", "'values'"),
    ("compute", "compute_extras_input_ids", "extras", "'input_ids'"),
    ("compute", "compute_extras_rewards", "extras", "'rewards'"),
    ("compute", "compute_int_rewards_changed", "rewards", "equal to the input task rewards"),
    ("compute", "compute_wide_logprobs", "logprobs", "shape [2, 4]"),
    ("compute", "compute_in_place", "data['logprobs']", "modified in place"),
]


@pytest.mark.parametrize("stage, name, field, expected", VIOLATIONS, ids=[v[1] for v in VIOLATIONS])
def test_contract_violation_names_stage_implementation_and_field(stage, name, field, expected):
    b = batch()
    if name == "compute_int_rewards_changed":
        b["rewards"] = torch.tensor([1, 2])
    with pytest.raises(AdvantageContractError) as err:
        module(stage, name)(b)
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert f"advantage.{stage} 'test_contracts.{name}'" in message, message
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
