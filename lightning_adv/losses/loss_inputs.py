"""The checks of :class:`~lightning_adv.PPOLoss`'s settings and inputs: one clear error
naming the argument, what was expected and what was given, before any arithmetic."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

import torch
from torch import Tensor, nn

from lightning_adv._checks import check_bool, check_choice, check_number, fail
from lightning_adv.config.nested import nested_config
from lightning_adv.exceptions import IgnoredSettingWarning
from lightning_adv.losses.aggregation import LOSS_AGG_MODES
from lightning_adv.losses.policy_loss_registry import (
    PolicyLossSpec, policy_loss_names, resolve_policy_loss)
from lightning_adv.losses.rollout_correction import LOGP_TOLERANCE, RolloutCorrectionConfig
from lightning_adv.ops.kl import LOSS_KL_ESTIMATORS

RATIO_LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class ForwardInputs:
    """The tensors of one :meth:`PPOLoss.forward` call, ``[B, T]`` and aligned (None where
    not given): one object from the checks through every loss term, in place of a dozen
    arguments handed from helper to helper."""

    logprobs: Tensor
    old_logprobs: Tensor
    advantages: Tensor
    loss_mask: Tensor
    rollout_logprobs: Optional[Tensor] = None
    rollout_is_weights: Optional[Tensor] = None
    rollout_rs_mask: Optional[Tensor] = None
    ref_logprobs: Optional[Tensor] = None
    values: Optional[Tensor] = None
    old_values: Optional[Tensor] = None
    returns: Optional[Tensor] = None
    entropy: Optional[Tensor] = None

    def named(self) -> dict[str, Optional[Tensor]]:
        """Every input but ``logprobs``, by the name errors give it, in signature order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "logprobs"}

    def cleaned(self, mask: Tensor) -> "ForwardInputs":
        """New inputs: ``mask`` (the loss mask in the arithmetic's dtype) as the loss mask,
        every other quantity in that dtype and 0 outside it, since masked positions may
        hold anything (padding, -inf) and must never reach the arithmetic. An outside
        correction's weights and mask stay as given: ``PPOLoss._correction`` reads them."""
        active = mask > 0
        kept = ("loss_mask", "rollout_is_weights", "rollout_rs_mask")
        return replace(self, loss_mask=mask, **{
            f.name: torch.where(active, getattr(self, f.name).to(mask.dtype), 0.0)
            for f in fields(self) if f.name not in kept and getattr(self, f.name) is not None})


def check_clip_settings(clip_eps: Any, clip_eps_high: Any, dual_clip: Any) -> None:
    check_number("clip_eps", clip_eps, positive=True)
    if clip_eps_high is not None:
        check_number("clip_eps_high", clip_eps_high, positive=True)
    if dual_clip is not None:
        check_number("dual_clip", dual_clip)
        if dual_clip <= 1:
            fail("dual_clip", "a number > 1 (the bound -A * c must exceed the clipped loss) "
                 "or None", dual_clip)


def check_kl_terms(kl_coef: Any, kl_estimator: Any, rollout_kl_coef: Any,
                   rollout_kl_estimator: Any, use_bias_correction_kl: Any) -> None:
    """The settings of the two KL terms (to the reference, to the rollout policy)."""
    if isinstance(kl_coef, nn.Module):
        if not hasattr(kl_coef, "value"):
            fail("kl_coef", "a number >= 0 or a KL controller (with a 'value')", kl_coef)
    else:
        check_number("kl_coef", kl_coef, minimum=0.0)
    check_choice("kl_estimator", kl_estimator, LOSS_KL_ESTIMATORS)
    check_number("rollout_kl_coef", rollout_kl_coef, minimum=0.0)
    check_choice("rollout_kl_estimator", rollout_kl_estimator, LOSS_KL_ESTIMATORS)
    check_bool("use_bias_correction_kl", use_bias_correction_kl)


def check_value_and_entropy_terms(entropy_coef: Any, value_coef: Any,
                                  value_clip_eps: Any) -> None:
    check_number("entropy_coef", entropy_coef, minimum=0.0)
    check_number("value_coef", value_coef, minimum=0.0)
    if value_clip_eps is not None:
        check_number("value_clip_eps", value_clip_eps, positive=True)


def resolve_loss_settings(policy_loss: Any, policy_loss_kwargs: Any, loss_agg_mode: Any,
                          loss_scale_factor: Any, ratio_level: Any, dual_clip: Any,
                          rollout_correction: Any) -> tuple[PolicyLossSpec, str,
                                                            Optional[RolloutCorrectionConfig]]:
    """The policy loss, the aggregation it uses and the rollout correction config;
    combinations that would ignore a setting or apply a correction twice are refused."""
    spec = resolve_policy_loss(policy_loss, policy_loss_kwargs)
    if loss_agg_mode is not None:
        check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    mode = loss_agg_mode or "token-mean"
    if spec.loss_agg_mode is not None:
        if loss_agg_mode is not None and loss_agg_mode != spec.loss_agg_mode:
            warnings.warn(f"loss_agg_mode: {loss_agg_mode!r} is ignored: policy loss "
                          f"{spec.name!r} aggregates its own way (as verl's does)",
                          IgnoredSettingWarning, stacklevel=4)
        mode = spec.loss_agg_mode
    if mode == "seq-mean-token-sum-norm" and loss_scale_factor is None:
        fail("loss_scale_factor", "a positive number with loss_agg_mode "
             "'seq-mean-token-sum-norm' (Dr.GRPO's constant, e.g. the token budget of a "
             "response)", loss_scale_factor)
    if loss_scale_factor is not None:
        check_number("loss_scale_factor", loss_scale_factor, positive=True)
    check_choice("ratio_level", ratio_level, RATIO_LEVELS)
    if ratio_level != "token" and not spec.reads_ratio_level:
        fail("ratio_level", f"'token' with policy_loss {spec.name!r} (the sequence ratio is an "
             f"option of {_listed('reads_ratio_level')}; gspo is verl's sequence-level loss)",
             ratio_level)
    if dual_clip is not None and not spec.reads_dual_clip:
        fail("dual_clip", f"None with policy_loss {spec.name!r}, which does not use it "
             f"({_listed('reads_dual_clip')} do)", dual_clip)
    correction = None
    if rollout_correction is not None:
        correction = nested_config(RolloutCorrectionConfig, "rollout_correction",
                                   rollout_correction)
        if not isinstance(correction, RolloutCorrectionConfig):
            fail("rollout_correction", "None, a RolloutCorrectionConfig or a mapping of its "
                 "keys", rollout_correction)
        if correction.bypass_mode and not spec.ppo_clip:
            fail("policy_loss", f"{_listed('ppo_clip')} with rollout_correction.bypass_mode "
                 f"(bypass mode computes verl's ppo_clip or reinforce loss)", spec.name)
    return spec, mode, correction


def _listed(fact: str) -> str:
    """The losses whose registration declares ``fact``, for error messages."""
    return " or ".join(repr(name) for name in policy_loss_names(fact))


def check_tensor(name: str, tensor: Any, like: Tensor, *, floating: bool = True) -> None:
    if not isinstance(tensor, Tensor):
        fail(f"PPOLoss {name}", "a tensor", type(tensor).__name__)
    if tensor.shape != like.shape:
        fail(f"PPOLoss {name}", f"shape {tuple(like.shape)} (that of logprobs)", tuple(tensor.shape))
    if tensor.device != like.device:
        fail(f"PPOLoss {name}", f"device {like.device} (that of logprobs)", tensor.device)
    if floating and not tensor.is_floating_point():
        fail(f"PPOLoss {name}", "a floating-point tensor", tensor.dtype)


def check_forward_inputs(logprobs: Tensor, named: Mapping[str, Optional[Tensor]],
                         loss_mask: Tensor, needs: list[tuple[str, Optional[Tensor], bool, str]],
                         *, reads_ref: bool = True) -> None:
    """Shapes, dtypes, devices, the 0/1 masks, the inputs each option needs (``needs``:
    name, tensor, needed, reason), and the values at the loss mask's tokens
    (:func:`check_active_values`; ``ref_logprobs`` only where a KL term reads them)."""
    if not isinstance(logprobs, Tensor) or logprobs.ndim != 2 or not logprobs.is_floating_point():
        fail("PPOLoss logprobs", "a floating [B, T] tensor",
             getattr(logprobs, "shape", type(logprobs).__name__))
    for name, tensor in named.items():
        if tensor is not None:
            check_tensor(name, tensor, logprobs, floating=name not in ("loss_mask", "rollout_rs_mask"))
    for name in ("loss_mask", "rollout_rs_mask"):
        mask = named.get(name)
        if mask is not None and mask.dtype != torch.bool and bool(((mask != 0) & (mask != 1)).any()):
            bad = mask[(mask != 0) & (mask != 1)].unique()[:5].tolist()
            fail(f"PPOLoss {name}", "only 0 and 1", f"values {bad}")
    for name, tensor, needed, reason in needs:
        if needed and tensor is None:
            raise ValueError(f"PPOLoss {name}: required with {reason}, got None")
    values = {"logprobs": logprobs, **{k: v for k, v in named.items() if v is not None and k
                                       not in ("loss_mask", "rollout_rs_mask")}}
    if not reads_ref:
        values.pop("ref_logprobs", None)
    check_active_values(values, loss_mask > 0)


#: What each input must hold at the loss mask's tokens (any other input: finite values).
_LOGPROB = ("log-probs (<= 0, finite) at the loss mask's tokens (probabilities or logits "
            "passed?)")
_RULES = {"logprobs": _LOGPROB, "old_logprobs": _LOGPROB, "rollout_logprobs": _LOGPROB,
          "rollout_is_weights": "finite weights >= 0 at the loss mask's tokens"}


def _bad(name: str, tensor: Tensor, active: Tensor) -> Tensor:
    x = tensor.detach()
    ok = torch.isfinite(x)
    if _RULES.get(name) is _LOGPROB:
        ok &= x <= LOGP_TOLERANCE   # float rounding of a sampler's log-softmax may pass 0
    elif name == "rollout_is_weights":
        ok &= x >= 0
    return active & ~ok


def check_active_values(tensors: Mapping[str, Tensor], active: Tensor) -> None:
    """Finite values (log-probs <= 0, weights >= 0) at the ``active`` tokens of every
    tensor: one fused check per tensor and one host sync for all of them; the error names
    the first bad input, what it must hold, and where and what its first bad value is.
    Padding (inactive positions) may hold anything."""
    if not tensors:
        return
    bad = {name: _bad(name, t, active) for name, t in tensors.items()}
    flags = torch.stack([b.any() for b in bad.values()]).tolist()
    for (name, where), flagged in zip(bad.items(), flags):
        if flagged:
            row, col = where.nonzero()[0].tolist()
            value = tensors[name][row, col].item()
            fail(f"PPOLoss {name}", _RULES.get(name, "finite values at the loss mask's tokens"),
                 f"{int(where.sum())} bad tokens (first at ({row}, {col}): {value})")
