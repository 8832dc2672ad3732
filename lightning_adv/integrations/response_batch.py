"""Response-only tensors (verl's and TRL's ``[B, R]`` completions) in and out of an
:class:`~lightning_adv.AdvantageModule`.

verl and TRL hand an advantage estimator the *response* part of each row: rewards per
response token, a mask of the tokens the policy generated, and a group id per row (verl's
``index``, TRL's ``num_generations`` consecutive rows). The pipeline reads whole rows in
its own conventions (SPEC §1), so :func:`response_advantages` builds one:

- one prompt column in front of the ``R`` response columns (``T = R + 1``): the aligned
  output column ``j`` (which scores token ``j + 1``) is then response position ``j``, and
  the module's ``[B, T]`` outputs cut to ``[:, :R]`` are the peers' ``[B, R]`` tensors;
- attention up to each row's last generated token (tokens after it are padding to the
  pipeline; tokens before it with mask 0, tool outputs, stay attended, not generated);
- the rows sorted (stably) by group, so each prompt's rows are contiguous as
  :class:`~lightning_adv.BatchMeta` needs, and put back in the caller's order after;
- ``is_truncated`` False: neither peer bootstraps a truncated row's value.

Rewards: ``outcome`` is one reward per row (the peers' sum over the response). With
``per_token_rewards`` the rest of each row's token rewards (what is not at its last
generated token: verl's in-reward KL penalty, a process reward) goes in as folded
``token_rewards``, each generated token its own turn, so every token keeps its reward
where the peer put it; a reward on a token the policy did not generate is refused (the
peers' recursions skip those positions and would drop it silently).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.advantage.module import AdvantageModule
from lightning_adv.batch.grouping import BatchMeta

#: Response-aligned ``[B, R]`` inputs the pipeline reads in the next-token convention
#: (position t scores token t + 1): they take one padding column at the end.
NEXT_TOKEN_KEYS = ("values", "sum_pi_squared", "rollout_is_weights", "ref_logp")


def group_order(group_ids: Sequence[Hashable]) -> tuple[list[int], list[int]]:
    """The rows sorted by group, first appearance first (a stable permutation), and the
    size of each group in that order."""
    first: dict[Hashable, int] = {}
    for i, g in enumerate(group_ids):
        key = g.item() if hasattr(g, "item") else g
        first.setdefault(key, len(first))
    keys = [first[g.item() if hasattr(g, "item") else g] for g in group_ids]
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    sizes = [0] * len(first)
    for k in keys:
        sizes[k] += 1
    return order, sizes


def _check_response_tensor(where: str, key: str, x: Any, shape: tuple[int, ...]) -> Tensor:
    if not isinstance(x, Tensor) or tuple(x.shape) != shape:
        got = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{where}: '{key}': expected a tensor of shape {list(shape)}, got {got}")
    return x


def last_generated(response_mask: Tensor) -> Tensor:
    """[B] index of each row's last generated token (-1 for a row without any)."""
    positions = torch.arange(response_mask.shape[1], device=response_mask.device)
    return torch.where(response_mask > 0, positions, -1).max(dim=1).values


def split_token_rewards(where: str, token_rewards: Tensor, response_mask: Tensor,
                        per_token: bool) -> tuple[Tensor, Optional[Tensor]]:
    """One outcome per row (the row's sum, as the peers' outcome estimators take it) and,
    with ``per_token``, the rewards that are not at the row's last generated token (None
    when there are none)."""
    outcome = token_rewards.sum(dim=1)
    if not per_token:
        return outcome, None
    last = last_generated(response_mask)
    at_last = torch.zeros_like(token_rewards)
    rows = torch.arange(token_rewards.shape[0], device=token_rewards.device)
    placed = last >= 0
    at_last[rows[placed], last[placed]] = outcome[placed]
    rest = token_rewards - at_last
    outside = (rest != 0) & (response_mask <= 0)
    if bool(outside.any()):
        row, col = (int(v) for v in outside.nonzero()[0])
        raise ValueError(f"{where}: 'token_level_rewards' has {int(outside.sum())} non-zero "
                         f"rewards on tokens the policy did not generate (response_mask 0), "
                         f"first at row {row}, position {col}; the estimators skip those "
                         f"positions, so the reward would be lost: put it on a generated token")
    return outcome, (rest if bool((rest != 0).any()) else None)


def build_batch(response_mask: Tensor, outcome: Tensor, *, rest: Optional[Tensor] = None,
                old_log_probs: Optional[Tensor] = None, turn_ids: Optional[Tensor] = None,
                extra: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The pipeline's batch of the response rows (module docstring)."""
    b, r = response_mask.shape
    device = response_mask.device
    mask = (response_mask > 0).to(torch.int32)
    first = torch.zeros(b, 1, dtype=torch.int32, device=device)
    last = last_generated(response_mask)
    attended = torch.arange(r, device=device)[None, :] <= last[:, None]
    logprobs = torch.zeros(b, r, device=device) if old_log_probs is None else old_log_probs
    batch: dict[str, Any] = {
        "input_ids": torch.zeros(b, r + 1, dtype=torch.long, device=device),
        "attention_mask": torch.cat([first + 1, attended.to(torch.int32)], dim=1),
        "loss_mask": torch.cat([first, mask], dim=1),
        "logprobs": torch.cat([torch.zeros(b, 1, dtype=logprobs.dtype, device=device),
                               torch.where(mask > 0, logprobs, 0.0)], dim=1),
        "rewards": outcome.float(),
        "is_truncated": torch.zeros(b, dtype=torch.bool, device=device),
    }
    if rest is not None:
        batch["token_rewards"] = torch.cat([torch.zeros(b, 1, dtype=rest.dtype, device=device),
                                            rest], dim=1)
    if turn_ids is not None:
        batch["turn_ids"] = torch.cat([torch.full((b, 1), -1, dtype=torch.long, device=device),
                                       turn_ids.long()], dim=1)
    for key, value in (extra or {}).items():
        if key in NEXT_TOKEN_KEYS:
            value = torch.cat([value, torch.zeros(b, 1, dtype=value.dtype, device=device)], dim=1)
        batch[key] = value
    return batch


def token_turn_ids(response_mask: Tensor) -> Tensor:
    """Each generated token its own turn (ids increasing along the row), -1 elsewhere."""
    positions = torch.arange(response_mask.shape[1], device=response_mask.device)
    return torch.where(response_mask > 0, positions[None, :].expand_as(response_mask), -1)


def run_turn_ids(response_mask: Tensor) -> Tensor:
    """Each contiguous run of generated tokens one turn (0, 1, ... along the row; the
    tokens between runs, tool outputs, are -1)."""
    generated = response_mask > 0
    starts = generated & ~torch.nn.functional.pad(generated, (1, 0))[:, :-1]
    ids = starts.long().cumsum(dim=1) - 1
    return torch.where(generated, ids, -1)


def _check_inputs(where: str, token_rewards: Tensor, response_mask: Tensor,
                  group_ids: Sequence[Hashable], old_log_probs: Optional[Tensor],
                  extra: Optional[Mapping[str, Any]]) -> None:
    b, r = response_mask.shape
    _check_response_tensor(where, "token_level_rewards", token_rewards, (b, r))
    if len(group_ids) != b:
        raise ValueError(f"{where}: 'index': expected one group id per row ({b}), "
                         f"got {len(group_ids)}")
    for key, value in (extra or {}).items():
        shape = (b, r) if key in NEXT_TOKEN_KEYS else (b,)
        _check_response_tensor(where, key, value, shape)
    if old_log_probs is not None:
        _check_response_tensor(where, "old_log_probs", old_log_probs, (b, r))
    empty = response_mask.sum(dim=1) <= 0
    if bool(empty.any()):
        raise ValueError(f"{where}: 'response_mask': rows {empty.nonzero().flatten().tolist()[:10]} "
                         f"have no generated token")


def response_advantages(module: AdvantageModule, where: str, token_rewards: Tensor,
                        response_mask: Tensor, group_ids: Sequence[Hashable], *,
                        per_token_rewards: bool, turns: Optional[str] = None,
                        old_log_probs: Optional[Tensor] = None,
                        extra: Optional[Mapping[str, Any]] = None,
                        reward_columns: Optional[Tensor] = None,
                        process_rewards: Optional[Tensor] = None,
                        rollout_groups: Optional[Sequence[Any]] = None) -> tuple[Tensor, Tensor]:
    """``module``'s advantages and returns of response rows, ``[B, R]`` each (0 off
    ``response_mask``), in the caller's row order.

    ``where`` names the caller in errors. ``turns``: None, ``"tokens"`` (each generated
    token a turn: how per-token rewards are folded) or ``"runs"`` (each run of generated
    tokens a turn, for turn GAE). ``extra`` holds further ``[B, R]`` response tensors
    (``values``, ``sum_pi_squared``, ``rollout_is_weights``) or ``[B]`` ones
    (``reward_baselines``); ``reward_columns`` a ``[B]`` or ``[B, K]`` outcome (one column
    per reward function), in place of the summed ``token_rewards``; ``process_rewards``
    ``[B, R]`` per-token process rewards (the batch's ``token_rewards``, shaped by the
    config's process stage); ``rollout_groups`` one
    :class:`~lightning_adv.RolloutGroup` (or None) per group, in first-appearance order.
    """
    b, r = response_mask.shape
    _check_inputs(where, token_rewards, response_mask, group_ids, old_log_probs, extra)
    outcome, rest = split_token_rewards(where, token_rewards, response_mask, per_token_rewards)
    if reward_columns is not None:
        outcome = reward_columns
    turn_ids = {"tokens": token_turn_ids, "runs": run_turn_ids}[turns](response_mask) \
        if turns is not None else (token_turn_ids(response_mask) if rest is not None else None)
    if process_rewards is not None:
        if rest is not None:
            raise ValueError(f"{where}: per-token rewards to fold and process rewards to shape "
                             f"in one call")
        rest = _check_response_tensor(where, "process_rewards", process_rewards, (b, r))
    batch = build_batch(response_mask, outcome, rest=rest, old_log_probs=old_log_probs,
                        turn_ids=turn_ids, extra=extra)
    order, sizes = group_order(group_ids)
    index = torch.tensor(order, device=response_mask.device)
    sorted_batch = {k: v.index_select(0, index) for k, v in batch.items()}
    groups = [None] * len(sizes) if rollout_groups is None else list(rollout_groups)
    meta = BatchMeta(n_trajs=len(sizes), traj_group_sizes=sizes, rollout_groups=groups)
    out = module(sorted_batch, meta)
    inverse = torch.empty_like(index)
    inverse[index] = torch.arange(b, device=index.device)
    active = response_mask > 0
    advantages = out["advantages"].index_select(0, inverse)[:, :r]
    returns = out["returns"].index_select(0, inverse)[:, :r]
    dtype = token_rewards.dtype if token_rewards.is_floating_point() else torch.float32
    return (torch.where(active, advantages, 0.0).to(dtype),
            torch.where(active, returns, 0.0).to(dtype))
