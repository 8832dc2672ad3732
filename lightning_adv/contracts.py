"""Stage contracts: what each stage receives and returns (SPEC §4), and the checks run
on the results of user stages. (Scalar config validators live in
:mod:`lightning_adv.validators`; checks of the rollout batch in
:mod:`lightning_adv.batch_checks`.)

A stage is a plain function ``fn(inputs, **kwargs) -> result``. Inputs are frozen
dataclasses; the batch mapping handed to a stage is read-only. After a user stage
returns, :class:`StageContractCheck` checks its result against the contract and verifies that
no input tensor was modified in place (tensor version counters) and no key was added
or removed. Any violation raises :class:`AdvantageContractError` naming the stage, the
implementation and the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

if TYPE_CHECKING:
    from lightning_adv.config import ActorConfig, PRMAdvantageShapingConfig
    from lightning_adv.meta import BatchMeta


class AdvantageContractError(ValueError):
    """A stage function returned something that breaks its contract, or changed its inputs."""


#: Keys a full replacement may add through ``AdvantageResult.extras``.
ALLOWED_EXTRAS = frozenset(
    {"input_token_loss_mask", "is_truncated", "mopd_behavior_logprobs", "prox_logp", "ref_logp"})


@dataclass(frozen=True)
class OutcomeRewardInputs:
    """Input of the outcome-shaping stage."""

    data: Mapping[str, Any]
    """read-only view of the rollout batch after the length penalty (``rewards`` penalized)"""
    config: "ActorConfig"
    """the actor configuration"""
    meta: Optional["BatchMeta"]
    """prompt and logical-rollout grouping, or None"""


@dataclass(frozen=True)
class OutcomeResult:
    """Result of the outcome-shaping stage."""

    rewards: Tensor
    """one floating-point reward per tensor row, same order and device"""
    normalization_rewards: Optional[Tensor] = None
    """one reference per logical rollout (batch order), before bias/scaling/clip; see SPEC §4"""


@dataclass(frozen=True)
class TemporalInputs:
    """Input of the temporal estimator; every [B, T] tensor is next-token aligned."""

    outcome_rewards: Tensor
    """[B, T] outcome score at each row's outcome position, 0 elsewhere"""
    kl_rewards: Tensor
    """[B, T] KL penalty rewards (zero at each row's last valid position)"""
    process_rewards: Optional[Tensor]
    """[B, T] folded process rewards at each turn's last position, or None"""
    values: Tensor
    """[B, T] critic values (zeros without a critic)"""
    loss_mask: Tensor
    """[B, T] float 0/1: positions whose next token was generated"""
    turn_ids: Optional[Tensor]
    """[B, T] aligned turn ids (-1 off generated tokens), or None"""
    bootstrap_values: Tensor
    """[B] raw value at each row's last valid token (not yet masked by truncation)"""
    is_truncated: Tensor
    """[B] bool: rows that stopped without EOS"""
    discount: float
    """gamma"""
    timestep_unit: str
    """the configured ``gae_timestep_unit``"""
    config: "ActorConfig"
    """the actor configuration"""
    meta: Optional["BatchMeta"]
    """grouping metadata, or None"""
    old_logprobs: Optional[Tensor] = None
    """[B, T] aligned old (behaviour or recomputed) log-probs, 0 off the mask"""
    data: Optional[Mapping[str, Any]] = None
    """read-only view of the rollout batch, for optional keys an estimator reads
    (``sum_pi_squared``); the tensors above are already aligned"""


@dataclass(frozen=True)
class TemporalResult:
    """Result of the temporal estimator."""

    advantages: Tensor
    """[B, T] advantages before normalization"""
    returns: Tensor
    """[B, T] critic targets"""
    total_rewards: Tensor
    """[B, T] token-aligned rewards used, for monitoring"""


@dataclass(frozen=True)
class ProcessAdvantageInputs:
    """Input of the process-advantage shaping stage."""

    advantages: Tensor
    """[B, T] normalized advantages"""
    token_rewards: Optional[Tensor]
    """[B, T] aligned direct process rewards (0 off the mask), or None"""
    loss_mask: Tensor
    """[B, T] float 0/1 aligned loss mask"""
    config: "ActorConfig"
    """the actor configuration"""
    meta: Optional["BatchMeta"]
    """grouping metadata, or None"""


@dataclass(frozen=True)
class AdvantageInputs:
    """Input of a full replacement of the computation."""

    data: Mapping[str, Any]
    """read-only view of the raw rollout batch"""
    config: "ActorConfig"
    """the actor configuration"""
    meta: Optional["BatchMeta"]
    """grouping metadata, or None"""
    prm: Optional["PRMAdvantageShapingConfig"]
    """the call-time PRM selection, or None"""


@dataclass(frozen=True)
class AdvantageResult:
    """Result of a full replacement; the module merges it into the returned batch."""

    advantages: Tensor
    """[B, T] final advantages"""
    returns: Tensor
    """[B, T] critic targets"""
    loss_mask: Tensor
    """[B, T] aligned 0/1 loss mask"""
    logprobs: Tensor
    """[B, T] aligned old log-probs"""
    rewards: Tensor
    """[B] outcome rewards"""
    total_rewards: Tensor
    """[B, T] total token rewards"""
    kl_rewards: Tensor
    """[B, T] KL rewards"""
    extras: dict[str, Tensor] = field(default_factory=dict)
    """optional extra outputs; only the keys in ALLOWED_EXTRAS"""


class ReadOnlyData(Mapping):
    """The batch as a stage sees it: readable like a dict, never writable.

    Adding, replacing or deleting a key raises :class:`AdvantageContractError` naming the
    stage (``owner``, set by the module before the stage runs).
    """

    def __init__(self, data: Mapping[str, Any]):
        self._data = dict(data)
        self.owner = "a stage"

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ReadOnlyData({self._data!r})"

    def _refuse(self, key: Any, *_: Any) -> None:
        raise AdvantageContractError(
            f"{self.owner}: input data is read-only (tried to set or delete {key!r}); build a new "
            f"dict or return new tensors instead")

    __setitem__ = __delitem__ = _refuse


def read_only(data: Mapping[str, Any]) -> ReadOnlyData:
    return data if isinstance(data, ReadOnlyData) else ReadOnlyData(data)


# ---------------------------------------------------------------------------------------
# Checks


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
