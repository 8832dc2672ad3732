"""The registry of policy losses: verl's built-ins by name, a user's own by dotted path or
:func:`register_policy_loss`, each called through the same contract checks.

A policy loss is ``fn(inputs: PolicyLossInputs, **kwargs) -> (per_token_loss, diagnostics)``:
``per_token_loss`` is ``[B, T]`` (``PPOLoss`` aggregates it with the configured
``loss_agg_mode``, or the mode the loss was registered with), differentiable in
``inputs.logprobs``; ``diagnostics`` maps names to detached scalars (token means of this
rank's active tokens: :meth:`PolicyLossInputs.mean`). The rollout IS weights, when given,
are the loss's to apply (verl's losses multiply the per-token loss by them; ``geo_mean``
takes their geometric mean per sequence; ``vespo`` folds them into its sequence weight).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv._checks import check_number, fail
from lightning_adv.dotted_path import check_signature, import_object, is_dotted_path
from lightning_adv.exceptions import PolicyLossContractError
from lightning_adv.losses.aggregation import LOSS_AGG_MODES, ROW_MEAN, TokenCounts
from lightning_adv.registry import (
    Entry, KwargCheck, Registry, check_kwarg_checks, check_name, decorator, is_builtin)


@dataclass(frozen=True)
class PolicyLossInputs:
    """What a policy loss reads. Every tensor is ``[B, T]`` in the loss's float dtype, 0
    at positions outside ``loss_mask`` (whatever the caller passed there)."""

    logprobs: Tensor
    """the current policy's log-probs (with gradient)"""
    old_logprobs: Tensor
    """the log-probs the ratio is taken against (π_old; π_rollout in bypass mode)"""
    advantages: Tensor
    loss_mask: Tensor
    """1 at the tokens the loss trains on"""
    rollout_is_weights: Optional[Tensor]
    """detached importance weights π_old/π_rollout (None: no rollout correction)"""
    clip_eps: float
    """``1 - clip_eps`` bounds the ratio below (verl's clip_ratio_low)"""
    clip_eps_high: float
    """``1 + clip_eps_high`` bounds it above (verl's clip_ratio_high)"""
    dual_clip: Optional[float]
    """verl's clip_ratio_c (None: off)"""
    ratio_level: str
    """``token`` or ``sequence`` (TRL's importance_sampling_level; ``vanilla`` only)"""
    counts: TokenCounts

    def mean(self, values: Tensor) -> Tensor:
        """Detached token mean over this rank's active tokens (0 without any)."""
        masked = torch.where(self.loss_mask > 0, values, 0.0)
        return (masked.sum() / self.counts.local_tokens.clamp(min=1.0)).detach()


@dataclass(frozen=True)
class PolicyLossSpec(Entry):
    """One registered policy loss."""

    loss_agg_mode: Optional[str] = None
    """the aggregation the loss always uses (verl's sapo, geo_mean); None: the configured"""
    reads_dual_clip: bool = False
    """the loss reads ``dual_clip`` (verl's clip_ratio_c); others refuse it"""
    reads_ratio_level: bool = False
    """the loss reads ``ratio_level`` (a sequence-level ratio); others refuse ``sequence``"""
    ppo_clip: bool = False
    """verl's ppo_clip loss: the one ``rollout_correction.bypass_mode`` computes"""

    @property
    def function(self) -> Callable[..., Any]:
        return self.fn


def positive(key: str, value: Any) -> None:
    check_number(key, value, positive=True)


def non_negative(key: str, value: Any) -> None:
    check_number(key, value, minimum=0.0)


#: The policy losses; the built-ins (verl 0.9.1's and TRL's vespo) register in this module.
POLICY_LOSSES: Registry[PolicyLossSpec] = Registry(
    "policy loss", ("lightning_adv.losses.policy_losses",))


def register_policy_loss(name: Any = None, *,
                         kwarg_checks: Optional[Mapping[str, KwargCheck]] = None,
                         loss_agg_mode: Optional[str] = None, reads_dual_clip: bool = False,
                         reads_ratio_level: bool = False, ppo_clip: bool = False):
    """Decorator: register ``fn(inputs, **kwargs) -> (per_token_loss, diagnostics)`` as the
    policy loss ``name`` (default ``fn.__name__``; a bare ``@register_policy_loss`` too),
    selectable as ``PPOLoss(policy_loss=name)`` or ``ppo.policy_loss: name``.
    ``kwarg_checks`` maps a keyword to ``check(key, value)``; ``loss_agg_mode`` fixes the
    aggregation (None: the configured one); ``reads_dual_clip``: the loss reads
    ``dual_clip`` (others refuse it)."""
    modes = (*LOSS_AGG_MODES, ROW_MEAN)  # row-mean: geo_mean's own (a mean per row)
    if loss_agg_mode is not None and loss_agg_mode not in modes:
        fail("register_policy_loss loss_agg_mode", f"None or one of {', '.join(modes)}",
             loss_agg_mode)

    def register(fn: Callable[..., Any], loss_name: str) -> None:
        caller = "register_policy_loss"
        checks = check_kwarg_checks(caller, f"policy loss {loss_name!r}", fn, kwarg_checks)
        check_name(caller, loss_name)
        check_signature(fn, dict.fromkeys(checks), caller, f"{fn.__module__}.{fn.__qualname__}")
        POLICY_LOSSES.add(PolicyLossSpec(loss_name, fn, checks, is_builtin(fn, POLICY_LOSSES),
                                         loss_agg_mode, reads_dual_clip, reads_ratio_level,
                                         ppo_clip), caller)
    return decorator("register_policy_loss", name, register)


def unregister_policy_loss(name: str) -> None:
    """Remove a loss registered with :func:`register_policy_loss` (built-ins stay)."""
    POLICY_LOSSES.remove(name, "unregister_policy_loss")


def policy_loss_names(fact: Optional[str] = None) -> tuple[str, ...]:
    """The registered losses' names (with ``fact``, those whose entry has it true)."""
    return tuple(e.name for e in POLICY_LOSSES.entries() if fact is None or getattr(e, fact))


def __getattr__(name: str) -> Any:
    if name == "BUILTIN_POLICY_LOSSES":  # the table this registry replaced
        warnings.warn("lightning_adv.losses.policy_loss_registry.BUILTIN_POLICY_LOSSES is "
                      "deprecated: the losses register with @register_policy_loss; use "
                      "POLICY_LOSSES", DeprecationWarning, stacklevel=2)
        return {e.name: e for e in POLICY_LOSSES.entries() if e.builtin}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_policy_loss(name: Any, kwargs: Any, key: str = "policy_loss") -> PolicyLossSpec:
    """The loss ``name`` (registered name or dotted path) with ``kwargs`` checked: names
    it takes, values its checks accept. Errors name ``key``."""
    if not isinstance(name, str):
        fail(key, f"one of {', '.join(policy_loss_names())} or a dotted function path", name)
    if kwargs is not None and not isinstance(kwargs, Mapping):
        fail(f"{key}_kwargs", "a mapping of keyword arguments or None", kwargs)
    kwargs = dict(kwargs or {})
    spec = POLICY_LOSSES.get(name)
    if spec is None:
        if not is_dotted_path(name):
            fail(key, f"one of {', '.join(policy_loss_names())} or a dotted function path "
                 f"(my_pkg.losses.fn)", name)
        fn = import_object(name, key)
        if not callable(fn):
            fail(key, "a callable fn(inputs, **kwargs)", f"{name!r}, a {type(fn).__name__}")
        spec = PolicyLossSpec(name.rsplit(".", 1)[-1], fn)
    if spec.builtin:
        unknown = sorted(set(kwargs) - set(spec.kwarg_checks))
        if unknown:
            takes = (f"it takes only {sorted(spec.kwarg_checks)}" if spec.kwarg_checks
                     else "it takes none")
            fail(f"{key}_kwargs", f"settings of policy loss {name!r} ({takes})", unknown)
    # a required setting missing (dro's dro_beta) or one the function cannot take
    check_signature(spec.fn, kwargs, f"{key}_kwargs", spec.path, label=f"policy loss {name!r}")
    for kwarg, value in kwargs.items():
        check = spec.kwarg_checks.get(kwarg)
        if check is not None:
            check(f"{key}_kwargs.{kwarg}", value)
    return spec


def call_policy_loss(spec: PolicyLossSpec, inputs: PolicyLossInputs,
                     kwargs: Mapping[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
    """Call the loss; a user's loss goes through the contract checks (a ``[B, T]``
    floating result, finite where active, with a gradient; diagnostics scalars; no input
    modified in place)."""
    if spec.builtin:
        return spec.fn(inputs, **kwargs)
    tensors = {k: v for k, v in vars(inputs).items() if isinstance(v, Tensor)}
    versions = {k: v._version for k, v in tensors.items()}
    result = spec.fn(inputs, **kwargs)
    where = f"policy loss {spec.name!r} ({spec.path})"
    changed = sorted(k for k, v in tensors.items() if v._version != versions[k])
    if changed:
        raise PolicyLossContractError(f"{where}: modified its inputs in place: {changed}")
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Mapping)):
        raise PolicyLossContractError(f"{where}: expected (per_token_loss, diagnostics dict), "
                                      f"got {type(result).__name__}")
    per_token, diagnostics = result
    shape = tuple(inputs.logprobs.shape)
    if not isinstance(per_token, Tensor) or tuple(per_token.shape) != shape \
            or not per_token.is_floating_point():
        raise PolicyLossContractError(
            f"{where}: expected a floating per-token loss of shape {list(shape)}, got "
            f"{getattr(per_token, 'dtype', type(per_token).__name__)} "
            f"{list(getattr(per_token, 'shape', []))}")
    active = inputs.loss_mask > 0
    if not bool(torch.isfinite(per_token[active]).all()):
        raise PolicyLossContractError(f"{where}: returned non-finite losses at active positions")
    if inputs.logprobs.requires_grad and bool(active.any()) and not per_token.requires_grad:
        raise PolicyLossContractError(f"{where}: the per-token loss has no gradient with "
                                      f"respect to inputs.logprobs (was it detached?)")
    bad = sorted(k for k, v in diagnostics.items()
                 if not (isinstance(v, (int, float)) or isinstance(v, Tensor) and v.numel() == 1))
    if bad:
        raise PolicyLossContractError(f"{where}: diagnostics must be scalars, got {bad}")
    return per_token, {k: torch.as_tensor(v, dtype=per_token.dtype, device=per_token.device).detach().reshape(())
                       for k, v in diagnostics.items()}
