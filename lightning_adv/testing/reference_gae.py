"""Loop versions of the GAE kernels: slow and obvious, the definitions that the ops of
:mod:`lightning_adv.ops.gae` are tested and benchmarked against. They reproduce the
recorded legacy numbers and are deliberately written as loops; nothing in the pipeline
calls them. Conventions (next-token aligned
[B, T] tensors, ``bootstrap_values`` already zero for EOS rows, float or [B] tensor
``gae_lambda``) are those of :mod:`lightning_adv.ops.gae`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_adv.ops.gae import Lambda, check_kernel_inputs, validate_turn_ids


def _as_loop_inputs(name: str, rewards: Tensor, values: Tensor, loss_mask: Tensor,
                    bootstrap_values: Tensor, gae_lambda: Lambda):
    """Checked inputs in the loops' working dtype: (bs, width, rewards, values, mask)."""
    bs, width = check_kernel_inputs(name,
                                    {"rewards": rewards, "values": values, "loss_mask": loss_mask},
                                    bootstrap_values, gae_lambda)
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    return bs, width, rewards.to(dtype), values.to(dtype), loss_mask.to(dtype)


def token_gae_loop(rewards: Tensor, values: Tensor, loss_mask: Tensor, *,
                   bootstrap_values: Tensor, discount: float,
                   gae_lambda: Lambda) -> tuple[Tensor, Tensor]:
    """Token GAE as a loop: the legacy loop over token positions, vectorized over rows.

    Same contract as :func:`lightning_adv.ops.gae.compute_token_gae`.
    """
    bs, width, rewards, values, mask = _as_loop_inputs("token_gae_loop", rewards, values,
                                                       loss_mask, bootstrap_values, gae_lambda)
    dtype = rewards.dtype
    coef = discount * gae_lambda
    last = torch.zeros(bs, dtype=dtype, device=rewards.device)
    next_values = bootstrap_values.to(dtype)
    columns = [last]
    for t in reversed(range(width - 1)):
        delta = rewards[:, t] + discount * next_values - values[:, t]
        candidate = delta + coef * last
        m = mask[:, t]
        next_values = next_values * (1 - m) + values[:, t] * m
        last = last * (1 - m) + candidate * m
        columns.append(last)
    advantages = torch.stack(columns[::-1], dim=1)
    return advantages, advantages + values


def turn_gae_loop(rewards: Tensor, values: Tensor, loss_mask: Tensor, turn_ids: Tensor, *,
                  bootstrap_values: Tensor, discount: float,
                  gae_lambda: Lambda) -> tuple[Tensor, Tensor]:
    """Turn GAE as a loop: the legacy loop over turn slots, vectorized over rows.

    Same contract as :func:`lightning_adv.ops.gae.compute_turn_gae`.
    """
    bs, width, rewards, values, mask = _as_loop_inputs("turn_gae_loop", rewards, values,
                                                       loss_mask, bootstrap_values, gae_lambda)
    active = loss_mask.bool()
    validate_turn_ids(active, turn_ids, where="turn_gae_loop")
    dtype = rewards.dtype
    ids = turn_ids.long().clamp(0, width - 1)
    turn_rewards = torch.zeros_like(rewards).scatter_add_(1, ids, rewards * mask)
    positions = torch.arange(width, device=rewards.device).expand(bs, width)
    first = torch.full_like(ids, width).scatter_reduce_(
        1, ids, torch.where(active, positions, torch.full_like(positions, width)), reduce="amin")
    has_turn = first < width
    turn_values = values.gather(1, first.clamp(max=width - 1)) * has_turn

    coef = discount * gae_lambda
    turn_adv = torch.zeros_like(rewards)
    last = torch.zeros(bs, dtype=dtype, device=rewards.device)
    next_values = bootstrap_values.to(dtype)
    n_slots = int(torch.where(active, ids, torch.full_like(ids, -1)).max().item()) + 1 if bs else 0
    for u in reversed(range(n_slots)):
        delta = turn_rewards[:, u] + discount * next_values - turn_values[:, u]
        candidate = delta + coef * last
        present = has_turn[:, u]
        turn_adv[:, u] = torch.where(present, candidate, torch.zeros_like(candidate))
        next_values = torch.where(present, turn_values[:, u], next_values)
        last = torch.where(present, candidate, last)
    advantages = turn_adv.gather(1, ids) * mask
    returns = (turn_adv + turn_values).gather(1, ids) * mask + values * (1 - mask)
    return advantages, returns


def turn_gae_per_row(rewards: Tensor, values: Tensor, loss_mask: Tensor, turn_ids: Tensor, *,
                     bootstrap_values: Tensor, discount: float,
                     gae_lambda: Lambda) -> tuple[Tensor, Tensor]:
    """Reference turn GAE written as the obvious pure-Python loop, one row at a time.

    Accumulates in Python floats (double precision). It is the baseline the benchmark's
    "turn GAE vs a per-row loop" ratio is measured against. Same contract as
    :func:`lightning_adv.ops.gae.compute_turn_gae`.
    """
    bs, width = check_kernel_inputs("turn_gae_per_row",
                                    {"rewards": rewards, "values": values, "loss_mask": loss_mask},
                                    bootstrap_values, gae_lambda)
    validate_turn_ids(loss_mask.bool(), turn_ids, where="turn_gae_per_row")
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    # gamma * lambda is formed exactly as the vectorized kernels form it.
    coef = discount * gae_lambda
    coefs = coef.tolist() if isinstance(coef, Tensor) else [coef] * bs
    r_rows, v_rows = rewards.tolist(), values.tolist()
    m_rows, id_rows = loss_mask.bool().tolist(), turn_ids.tolist()
    boot = bootstrap_values.tolist()
    adv_rows, ret_rows = [], []
    for b in range(bs):
        r, v, m, ids = r_rows[b], v_rows[b], m_rows[b], id_rows[b]
        turn_reward: dict[int, float] = {}
        turn_value: dict[int, float] = {}
        for t in range(width):
            if m[t]:
                turn_reward[ids[t]] = turn_reward.get(ids[t], 0.0) + r[t]
                turn_value.setdefault(ids[t], v[t])
        turn_adv: dict[int, float] = {}
        last, next_value = 0.0, boot[b]
        for u in sorted(turn_reward, reverse=True):
            last = turn_reward[u] + discount * next_value - turn_value[u] + coefs[b] * last
            turn_adv[u] = last
            next_value = turn_value[u]
        adv_rows.append([turn_adv[ids[t]] if m[t] else 0.0 for t in range(width)])
        ret_rows.append([turn_adv[ids[t]] + turn_value[ids[t]] if m[t] else v[t]
                         for t in range(width)])
    device = rewards.device
    return (torch.tensor(adv_rows, dtype=dtype, device=device).reshape(bs, width),
            torch.tensor(ret_rows, dtype=dtype, device=device).reshape(bs, width))
