"""The checks run around a user stage: its result against its contract (SPEC §4) and
its inputs, which it must leave unchanged (tensor version counters, no key added or
removed). Any violation raises :class:`~lightning_adv.exceptions.AdvantageContractError`
naming the stage, the implementation and the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.exceptions import AdvantageContractError
from lightning_adv.stages.types import (
    ALLOWED_EXTRAS, AdvantageResult, OutcomeResult, ReadOnlyData, TemporalResult)


class StageContractCheck:
    """The checks around one call of a user stage: inputs before and after, and its result."""

    def __init__(self, where: str, inputs: Any, task_rewards: Optional[Tensor],
                 batch_size: int, width: int, device: torch.device):
        self.where = where
        self.inputs = inputs
        self.task_rewards = task_rewards
        self.batch_size = batch_size
        self.width = width
        self.device = device
        self._tensors = dict(_input_tensors(inputs))
        self._versions = {name: t._version for name, t in self._tensors.items()}
        data = getattr(inputs, "data", None)
        if isinstance(data, ReadOnlyData):
            data.owner = where

    def fail(self, field_name: str, expected: str, got: Any) -> None:
        raise AdvantageContractError(f"{self.where}: {field_name}: expected {expected}, got {got}")

    def check_inputs_untouched(self) -> None:
        for name, tensor in self._tensors.items():
            if tensor._version != self._versions[name]:
                raise AdvantageContractError(
                    f"{self.where}: input {name} was modified in place; stage functions must "
                    f"return new tensors and leave their inputs unchanged")

    def tensor(self, field_name: str, value: Any, shape: tuple[int, ...], *,
               allow_task_integers: bool = False, binary: bool = False) -> Tensor:
        if not isinstance(value, Tensor):
            self.fail(field_name, f"a tensor of shape {list(shape)}", type(value).__name__)
        if tuple(value.shape) != shape:
            self.fail(field_name, f"shape {list(shape)} (rows and order unchanged)", list(value.shape))
        if value.device != self.device:
            self.fail(field_name, f"a tensor on the batch's device {self.device}", value.device)
        if not value.is_floating_point():
            legacy_int = (allow_task_integers and self.task_rewards is not None
                          and not value.dtype.is_complex and value.dtype != torch.bool
                          and value.dtype == self.task_rewards.dtype
                          and torch.equal(value, self.task_rewards))
            if not legacy_int:
                hint = (" (an integer tensor is accepted only when equal to the input task rewards)"
                        if allow_task_integers else "")
                self.fail(field_name, f"a floating-point tensor{hint}", value.dtype)
            return value
        bad = ~torch.isfinite(value)
        if bool(bad.any()):
            self.fail(field_name, "finite values", f"{int(bad.sum())} non-finite entries "
                      f"(first at index {tuple(bad.nonzero()[0].tolist())})")
        if binary and not bool(((value == 0) | (value == 1)).all()):
            self.fail(field_name, "only 0 and 1", "other values")
        return value


def _input_tensors(inputs: Any):
    if dataclasses.is_dataclass(inputs):
        for f in dataclasses.fields(inputs):
            value = getattr(inputs, f.name)
            if isinstance(value, Tensor):
                yield f.name, value
            elif isinstance(value, Mapping):
                for key, item in value.items():
                    if isinstance(item, Tensor):
                        yield f"{f.name}[{key!r}]", item
    elif isinstance(inputs, Tensor):
        yield "tensor", inputs


def check_outcome_result(call: StageContractCheck, result: Any, n_logical: Optional[int]) -> OutcomeResult:
    if not isinstance(result, OutcomeResult):
        call.fail("result", "an OutcomeResult", type(result).__name__)
    call.tensor("rewards", result.rewards, (call.batch_size,), allow_task_integers=True)
    if result.normalization_rewards is not None:
        if n_logical is None:
            call.fail("normalization_rewards", "None unless the batch carries complete metadata "
                      "(meta.rollout_groups from concat_batch)", "a tensor")
        call.tensor("normalization_rewards", result.normalization_rewards, (n_logical,))
    return result


def check_temporal_result(call: StageContractCheck, result: Any) -> TemporalResult:
    if not isinstance(result, TemporalResult):
        call.fail("result", "a TemporalResult", type(result).__name__)
    shape = (call.batch_size, call.width)
    for name in ("advantages", "returns", "total_rewards"):
        call.tensor(name, getattr(result, name), shape)
    return result


def check_process_result(call: StageContractCheck, result: Any) -> Tensor:
    return call.tensor("result", result, (call.batch_size, call.width))


def check_advantage_result(call: StageContractCheck, result: Any, mopd: bool) -> AdvantageResult:
    if not isinstance(result, AdvantageResult):
        call.fail("result", "an AdvantageResult", type(result).__name__)
    shape = (call.batch_size, call.width)
    for name in ("advantages", "returns", "logprobs", "total_rewards", "kl_rewards"):
        call.tensor(name, getattr(result, name), shape)
    call.tensor("loss_mask", result.loss_mask, shape, binary=True)
    call.tensor("rewards", result.rewards, (call.batch_size,), allow_task_integers=True)
    extras = result.extras
    if not isinstance(extras, Mapping):
        call.fail("extras", "a mapping", type(extras).__name__)
    unknown = sorted(set(extras) - ALLOWED_EXTRAS)
    if unknown:
        call.fail("extras", f"only keys {sorted(ALLOWED_EXTRAS)} (extras may not overwrite rollout "
                  f"fields)", unknown)
    for key, value in extras.items():
        if key == "is_truncated":
            if not isinstance(value, Tensor) or tuple(value.shape) != (call.batch_size,) \
                    or value.device != call.device:
                call.fail("extras['is_truncated']", f"a [{call.batch_size}] tensor on {call.device}",
                          getattr(value, "shape", type(value).__name__))
        elif key == "input_token_loss_mask":
            call.tensor(f"extras[{key!r}]", value.float() if isinstance(value, Tensor)
                        and not value.is_floating_point() else value, shape, binary=True)
        else:
            call.tensor(f"extras[{key!r}]", value, shape)
    if mopd and "mopd_behavior_logprobs" not in extras:
        call.fail("extras", "'mopd_behavior_logprobs' (the batch carries mopd_teacher_logp_sum, so "
                  "a full replacement must return the immutable behaviour log-probs)", sorted(extras))
    return result

