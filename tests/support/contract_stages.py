"""User stages that break their contract (and a few that keep it), each referenced from
the config by its dotted path (``tests.support.contract_stages.<name>``) exactly as a
user plug-in would be; :data:`VIOLATIONS` says which field each one breaks."""


import dataclasses

import pytest
import torch

from tests.support.batches import rows_batch
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
    spec = {"implementation": f"{__name__}.{name}", "kwargs": kwargs or {}}
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


