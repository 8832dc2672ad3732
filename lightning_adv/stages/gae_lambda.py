"""Per-row GAE lambda: the context a lambda function sees, and the built-in functions.

A lambda function is called as ``fn(context, **gae_lambda_kwargs)`` and returns a float
tensor [B] on the batch's device, every value in [0, 1] (checked; errors name the
function). ``context`` is a :class:`GAELambdaContext`; it also answers
``context["timestep_lengths"]`` so lambda functions written for the legacy dict context
keep working.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Union

import torch
from torch import Tensor

from lightning_adv.dotted_path import resolve_callable
from lightning_adv.ops.gae import turn_id_errors, validate_turn_ids
from lightning_adv.exceptions import TurnIdError

if TYPE_CHECKING:
    from lightning_adv.stages.types import TemporalInputs


@dataclass(frozen=True, eq=False)
class GAELambdaContext(Mapping):
    """Trajectory lengths available to a lambda function (all [B] integer tensors)."""

    effective_token_lengths: Tensor
    """active (loss-mask) positions per row"""
    turn_counts: Tensor
    """distinct turn ids among active positions per row (0 without turn_ids)"""
    timestep_lengths: Tensor
    """the one of the two that matches the estimator's timestep unit"""

    def __getitem__(self, key: str) -> Tensor:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


GAELambdaInputs = GAELambdaContext


def constant_gae_lambda(context: GAELambdaContext, *, value: float) -> Tensor:
    """The same lambda for every row."""
    return torch.full(context.timestep_lengths.shape, float(value), dtype=torch.float32,
                      device=context.timestep_lengths.device)


def vapo_length_adaptive_gae(context: GAELambdaContext, *, alpha: float) -> Tensor:
    """VAPO's length-adaptive lambda ``max(0, 1 - 1 / (alpha * L))``; 0 for an empty row.

    ``L`` is the row's timestep length in the estimator's unit (Yuan et al., 2025, VAPO).
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0 \
            or not math.isfinite(alpha):
        raise ValueError(f"vapo_length_adaptive_gae: alpha must be a positive finite number, "
                         f"got {alpha!r}")
    lengths = context.timestep_lengths
    lam = (1.0 - 1.0 / (float(alpha) * lengths.float().clamp_min(1.0))).clamp_min(0.0)
    return torch.where(lengths > 0, lam, torch.zeros_like(lam))


def relative_position_gae_lambda(context: GAELambdaContext, *, q: float) -> Tensor:
    """``q ** (1 / (L - 1))``: a terminal reward keeps fraction ``q`` at the first step of
    every row, whatever its length. 1 for ``L = 1`` (nothing to decay), 0 for ``L = 0``."""
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q) \
            or not 0 < q <= 1:
        raise ValueError(f"relative_position_gae_lambda: q must be a finite number in (0, 1], "
                         f"got {q!r}")
    lengths = context.timestep_lengths
    steps = (lengths - 1).clamp_min(1).float()
    lam = torch.exp(math.log(float(q)) / steps)
    return torch.where(lengths > 1, lam, (lengths == 1).float())


def build_lambda_context(loss_mask: Tensor, turn_ids: Tensor | None,
                         unit: str) -> GAELambdaContext:
    """Lengths from the aligned loss mask and turn ids; turn ids are validated if present."""

    active = loss_mask.bool()
    token_lengths = active.sum(dim=1)
    if turn_ids is not None:
        validate_turn_ids(active, turn_ids)
        width = loss_mask.shape[1]
        ids = turn_ids.long().clamp(0, width - 1)
        per_turn = torch.zeros(ids.shape, dtype=torch.long, device=ids.device)
        per_turn.scatter_add_(1, ids, active.long())
        turn_counts = (per_turn > 0).sum(dim=1)
    else:
        if unit == "turn":
            raise TurnIdError("gae_lambda", "turn timesteps need 'turn_ids' in the rollout batch")
        turn_counts = torch.zeros_like(token_lengths)
    timestep = token_lengths if unit == "token" else turn_counts
    return GAELambdaContext(token_lengths, turn_counts, timestep)


def resolve_lambda_fn(path: str, kwargs: Mapping[str, Any], key: str) -> Callable[..., Any]:
    """Import a lambda function once per (path, kwargs) and check its kwargs by calling it.

    The probe call (lengths 0, 1, 2, 7) runs when the module is built, so bad kwargs
    (``alpha: -1``) fail before training instead of at the first batch.
    """
    return _resolve_lambda(path, json.dumps(dict(kwargs), sort_keys=True), key)


@functools.lru_cache(maxsize=64)
def _resolve_lambda(path: str, kwargs_json: str, key: str) -> Callable[..., Any]:
    kwargs = json.loads(kwargs_json)
    fn = resolve_callable(path, kwargs, key, positional=1)
    lengths = torch.tensor([0, 1, 2, 7])
    try:
        lam = fn(GAELambdaContext(lengths, lengths, lengths), **kwargs)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{key}: {path!r} rejects kwargs {kwargs}: {exc}") from None
    check_lambda(lam, 4, lengths.device, f"{key} {path!r} (probe call with lengths 0, 1, 2, 7)")
    return fn


def compute_gae_lambda(inputs: "TemporalInputs", unit: str) -> Union[float, Tensor]:
    """Resolve ``config.gae_lambda`` for an estimator whose timestep unit is ``unit``.

    A number is returned as a float. A lambda function is called with the lengths in
    ``unit`` (so ``turn_gae`` under ``gae_timestep_unit: token`` still gets turn counts)
    and must return a float tensor [B] on the batch's device with values in [0, 1].
    """
    if unit not in ("token", "turn"):
        raise ValueError(f"compute_gae_lambda: unit must be 'token' or 'turn', got {unit!r}")
    config = inputs.config
    if not isinstance(config.gae_lambda, str):
        return float(config.gae_lambda)
    key = "actor.gae_lambda"
    fn = resolve_lambda_fn(config.gae_lambda, config.gae_lambda_kwargs, key)
    where = f"{key} {config.gae_lambda!r}: rollout batch 'turn_ids' (shifted one step left)"
    with turn_id_errors(where):
        context = build_lambda_context(inputs.loss_mask, inputs.turn_ids, unit)
    lam = fn(context, **config.gae_lambda_kwargs)
    return check_lambda(lam, inputs.loss_mask.shape[0], inputs.loss_mask.device,
                        f"{key} {config.gae_lambda!r}")


def check_lambda(lam: Any, batch_size: int, device: torch.device, where: str) -> Tensor:
    if not isinstance(lam, Tensor):
        raise ValueError(f"{where}: expected the lambda function to return a float tensor "
                         f"[{batch_size}], got {type(lam).__name__}")
    if tuple(lam.shape) != (batch_size,):
        raise ValueError(f"{where}: expected a lambda tensor of shape [{batch_size}], "
                         f"got {list(lam.shape)}")
    if not lam.is_floating_point():
        raise ValueError(f"{where}: expected a floating-point lambda tensor, got {lam.dtype}")
    if lam.device != device:
        raise ValueError(f"{where}: expected the lambda tensor on {device}, got {lam.device}")
    # One comparison clears both rules: NaN fails it, and so do infinities.
    outside = ~((lam >= 0) & (lam <= 1))
    if bool(outside.any()):
        rows = outside.nonzero().flatten().tolist()
        finite = bool(torch.isfinite(lam).all())
        problem = "a value outside [0, 1]" if finite else "a non-finite value"
        raise ValueError(f"{where}: the lambda function returned {problem} (rows {rows[:10]}: "
                         f"{lam[rows[:4]].tolist()}); a per-row GAE lambda must be finite and lie "
                         f"in [0, 1]")
    return lam
