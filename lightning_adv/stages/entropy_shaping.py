"""Entropy-aware token credit: process-advantage shaping stages that read the policy's
per-token entropies (batch key ``entropies``).

GRPO gives every token of a response the same advantage. These stages redistribute it by
how uncertain the policy was at each token; both read ``entropies`` ([B, T], next-token
convention like ``sum_pi_squared``: position t holds the entropy of the distribution that
produced token t+1, the same position as the aligned loss mask), which the built-in
trainer computes in its scoring pass when one of them is selected.

- ``top_entropy_mask``: TRL's ``top_entropy_quantile``: the advantage is kept on the
  tokens whose entropy reaches the ``1 - quantile`` quantile of the batch's generated
  tokens and set to 0 elsewhere (the policy-gradient term of those tokens is then 0, as
  TRL's masked per-token loss; KL terms and token counts are untouched).
- ``gtpo``: each token's advantage scaled by its entropy relative to its response's mean
  entropy, the response's mean advantage kept (GTPO's entropy weighting, arXiv:2508.04349,
  as advantage shaping: docs/guides/step-credit.md gives the formula).

Both run instead of the process-reward stages, so they refuse a batch with direct
``token_rewards`` (fold those into the rewards with ``actor.token_rewards_as_adv: false``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_adv._checks import check_number, unit_interval
from lightning_adv.stages.registry import register_stage
from lightning_adv.stages.types import ProcessAdvantageInputs, required_key

#: ``torch.quantile`` takes at most 2**24 elements.
MAX_QUANTILE_TOKENS = 1 << 24


def open_unit_interval_upper(key: str, value: Any) -> None:
    """A number in (0, 1]: a share of the tokens that is not empty."""
    check_number(key, value, minimum=0.0, maximum=1.0)
    if value == 0:
        raise ValueError(f"{key}: expected a number in (0, 1] (the share of tokens kept), got 0")


def _entropies(inputs: ProcessAdvantageInputs, where: str) -> Tensor:
    """The batch's ``entropies`` (checked by the batch validation: [B, T], finite, not
    negative beyond float rounding), clamped at 0; an error without them or beside direct
    token rewards, which these stages would drop."""
    if inputs.token_rewards is not None:
        raise ValueError(f"{where}: the rollout batch has direct 'token_rewards', which this "
                         f"stage does not read (it replaces the process-reward shaping); set "
                         f"actor.token_rewards_as_adv: false to fold them into the rewards")
    value = required_key(inputs, "entropies", where,
                         "[B, T] float, next-token convention: the policy's entropy at each "
                         "position predicting a generated token",
                         ". The built-in trainer computes them in its scoring pass when this "
                         "stage is selected")
    return value.clamp(min=0.0)


@register_stage("process_adv_shaping", requires=("entropies",),
                kwarg_checks={"quantile": open_unit_interval_upper})
def top_entropy_mask(inputs: ProcessAdvantageInputs, *, quantile: float = 0.2) -> Tensor:
    """Keep the advantage on the top ``quantile`` of generated tokens by entropy: tokens
    whose entropy is at least ``torch.quantile`` (linear interpolation) of the active
    tokens' entropies at ``1 - quantile``; 0 on the other active tokens. Inactive tokens
    are unchanged. ``quantile: 1`` keeps every token (TRL's default)."""
    where = "process_adv_shaping 'top_entropy_mask'"
    entropies = _entropies(inputs, where)
    active = inputs.loss_mask > 0
    values = entropies[active].float()
    if values.numel() == 0:
        return inputs.advantages
    if values.numel() > MAX_QUANTILE_TOKENS:
        raise ValueError(f"{where}: at most {MAX_QUANTILE_TOKENS} generated tokens per batch "
                         f"(torch.quantile's limit), got {values.numel()}")
    threshold = torch.quantile(values, 1.0 - quantile)
    keep = (entropies.float() >= threshold) | ~active
    return torch.where(keep, inputs.advantages, torch.zeros_like(inputs.advantages))


@register_stage("process_adv_shaping", requires=("entropies",),
                kwarg_checks={"entropy_weight": unit_interval})
def gtpo(inputs: ProcessAdvantageInputs, *, entropy_weight: float = 1.0) -> Tensor:
    """``A'_t = A_t + entropy_weight * mean(A) * (H_t / mean(H) - 1)`` on each row's active
    tokens, the means over them: a token's share of the row's mean advantage follows its
    entropy, and the row's mean advantage is unchanged (the added terms sum to 0). With
    one advantage per response (GRPO) that is ``A * ((1 - w) + w * H_t / mean(H))``. A row
    whose active tokens all have entropy 0, and inactive tokens, are unchanged."""
    where = "process_adv_shaping 'gtpo'"
    entropies = _entropies(inputs, where).double()
    active = (inputs.loss_mask > 0).double()
    adv = inputs.advantages.double()
    counts = active.sum(1, keepdim=True)
    mean_adv = (adv * active).sum(1, keepdim=True) / counts.clamp(min=1)
    mean_h = (entropies * active).sum(1, keepdim=True) / counts.clamp(min=1)
    relative = torch.where(mean_h > 0, entropies / torch.where(mean_h > 0, mean_h, 1.0), 1.0)
    shaped = adv + entropy_weight * mean_adv * (relative - 1.0) * active
    return shaped.to(inputs.advantages.dtype)
