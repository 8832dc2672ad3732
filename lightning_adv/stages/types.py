"""What each stage receives and returns (SPEC §4): frozen dataclasses, and the read-only
view of the batch a stage is given.

A stage is a plain function ``fn(inputs, **kwargs) -> result``. The checks run on the
results of user stages live in :mod:`lightning_adv.stages.contract_checks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from torch import Tensor

from lightning_adv.exceptions import AdvantageContractError

if TYPE_CHECKING:
    from lightning_adv.batch.grouping import BatchMeta
    from lightning_adv.config import ActorConfig, PRMAdvantageShapingConfig


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
    data: Optional[Mapping[str, Any]] = None
    """read-only view of the rollout batch, for optional keys a stage reads
    (``entropies``, next-token convention like the tensors above)"""


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
    kl_coef: Optional[float] = None
    """the KL penalty's coefficient for this call (``config.kl_ctl`` unless the caller,
    e.g. a trainer's KL controller, passed another)"""


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


def required_key(inputs: Any, key: str, where: str, what: str, hint: str = "") -> Any:
    """The batch key ``key`` a stage reads from ``inputs.data`` (its ``requires``), or one
    error naming the stage (``where``), the key, what it holds (``what``) and ``hint``."""
    value = inputs.data.get(key) if inputs.data is not None else None
    if value is None:
        raise ValueError(f"{where}: rollout batch has no {key!r} ({what}){hint}")
    return value
