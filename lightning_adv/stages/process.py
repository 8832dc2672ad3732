"""Process advantage shaping: direct process (PRM) rewards applied to normalized advantages.

Built-in modes return the advantages unchanged when the batch has no direct token
rewards. Returns are never touched.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_adv.contracts import ProcessAdvantageInputs
from lightning_adv.stages.registry import register_stage
from lightning_adv.validators import check_gvpo_kwargs, non_negative_number


@register_stage("process_adv_shaping")
def additive(inputs: ProcessAdvantageInputs) -> Tensor:
    """``A + r`` (r is 0 off the loss mask)."""
    if inputs.token_rewards is None:
        return inputs.advantages
    return inputs.advantages + inputs.token_rewards


@register_stage("process_adv_shaping", kwarg_checks={
    "negative_scale": non_negative_number, "zero_penalty": non_negative_number,
    "zero_eps": non_negative_number})
def gvpo(inputs: ProcessAdvantageInputs, *, negative_scale: float = 0.2,
         zero_penalty: float = 0.4, zero_eps: float = 1e-6) -> Tensor:
    """Reshape failed tokens (active, process reward < 0): a negative advantage is scaled
    by ``1 + negative_scale``, an advantage within ``zero_eps`` of 0 becomes
    ``-zero_penalty``, a positive one becomes 0. Other tokens are unchanged."""
    if inputs.token_rewards is None:
        return inputs.advantages
    check_gvpo_kwargs("process_adv_shaping 'gvpo'", {
        "negative_scale": negative_scale, "zero_penalty": zero_penalty, "zero_eps": zero_eps})
    adv = inputs.advantages
    failed = (inputs.loss_mask > 0) & (inputs.token_rewards < 0)
    shaped = torch.where(adv < -zero_eps, adv * (1.0 + negative_scale),
                         torch.where(adv > zero_eps, torch.zeros_like(adv),
                                     torch.full_like(adv, -zero_penalty)))
    return torch.where(failed, shaped, adv)


@register_stage("process_adv_shaping")
def process_weighted(inputs: ProcessAdvantageInputs) -> Tensor:
    """Weight by process rewards p in [0, 1] on active tokens: ``A >= 0 -> A * p``;
    ``A < 0 -> p`` if ``p > 0`` else ``A``."""
    if inputs.token_rewards is None:
        return inputs.advantages
    adv, p = inputs.advantages, inputs.token_rewards
    active = inputs.loss_mask > 0
    out_of_range = active & ((p < 0) | (p > 1))
    if bool(out_of_range.any()):
        rows = out_of_range.any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"process_adv_shaping 'process_weighted': process rewards must lie in "
                         f"[0, 1] on active tokens; rows {rows[:10]} have values outside")
    shaped = torch.where(adv >= 0, adv * p, torch.where(p > 0, p, adv))
    return torch.where(active, shaped, adv)

