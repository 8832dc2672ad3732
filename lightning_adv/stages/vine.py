"""Monte Carlo step values (VinePPO, Kazemnejad et al., 2024, arXiv:2410.01679): from each
step boundary of an episode, K extra continuations sampled by the policy estimate the
value of the state there, and each step's advantage is the one-step difference

    A_k = r_k + gamma * V(s_{k+1}) - V(s_k),   V(s_k) = mean of the K returns from s_k,

on every generated token of step k. ``s_k`` is the state before step k (``s_0``: the
prompt); the value after the episode's last step is the terminal 0.

The batch carries the returns (the built-in trainer samples them under ``ppo.vine``,
:mod:`lightning_adv.trainer.rollout.vine`; another caller puts them in the batch):

- ``mc_returns`` ``[B, S, K]`` float: ``mc_returns[b, k]`` holds the returns of K
  continuations sampled from the state before row b's k-th step (its steps counted from
  0 in order), each discounted per step by ``actor.discount`` like the episode's own.
  NaN marks a continuation that is not there: a step may have fewer than K (their mean
  is taken), slots past a row's last step must be all NaN. Finite otherwise.
- ``step_ids`` ``[B, T]`` int, optional, token-aligned like ``turn_ids`` (-1 off generated
  tokens, non-decreasing on them): the reasoning step of each generated token. Without
  it the steps are the policy turns (``turn_ids``, or runs of generated tokens).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from lightning_adv._checks import check_bool
from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.ops.gae import affine_suffix_scan
from lightning_adv.stages.registry import register_stage
from lightning_adv.stages.turn_estimators import Steps, result_on_tokens, steps_of
from lightning_adv.stages.types import TemporalInputs, TemporalResult, required_key

_WHERE = "estimator 'vine'"
_LAYOUT = ("[B, S, K] floats: row b's slot k holds the returns of K continuations sampled "
           "from the state before its step k, NaN where none")


def _aligned_step_ids(inputs: TemporalInputs) -> Tensor | None:
    """``step_ids`` moved to the next-token convention as ``turn_ids`` are (SPEC §1)."""
    ids = inputs.data.get("step_ids") if inputs.data is not None else None
    if ids is None:
        return None
    aligned = torch.roll(ids.long(), -1, dims=-1)
    aligned[:, -1] = -1   # the last position predicts nothing
    return aligned


def _returns_table(inputs: TemporalInputs, steps: Steps) -> Tensor:
    """``mc_returns`` checked against the steps: a slot for every step, NaN past them."""
    table = required_key(inputs, "mc_returns", _WHERE, _LAYOUT, "; the built-in trainer "
                         "samples the continuations with ppo.vine set")
    counts = steps.slots.counts
    most = int(counts.max()) if counts.numel() else 0
    if table.shape[1] < most:
        rows = (counts > table.shape[1]).nonzero().flatten().tolist()[:10]
        raise ValueError(f"{_WHERE}: rollout batch 'mc_returns': expected {_LAYOUT}, with at "
                         f"least {most} step slots (rows {rows} have more steps than "
                         f"{table.shape[1]}), got shape {list(table.shape)}")
    slot = torch.arange(table.shape[1], device=table.device)
    past = (slot[None] >= counts[:, None].to(table.device))[:, :, None]
    filled = (past & ~torch.isnan(table)).any(dim=2).any(dim=1)
    if bool(filled.any()):
        raise ValueError(f"{_WHERE}: rollout batch 'mc_returns': expected NaN in the slots past "
                         f"each row's last step, got numbers there in rows "
                         f"{filled.nonzero().flatten().tolist()[:10]} (do the steps of "
                         f"'step_ids'/'turn_ids' match the slots?)")
    return table


def _step_values(table: Tensor, steps: Steps, skip_unestimated: bool) -> tuple[Tensor, Tensor]:
    """Per step: the mean of its finite returns (float64), and whether it has any."""
    block = table[steps.row.to(table.device), steps.turn.to(table.device)].double()
    finite = ~torch.isnan(block)
    n = finite.sum(dim=1)
    mean = torch.where(finite, block, 0.0).sum(dim=1) / n.clamp(min=1)
    estimated = n > 0
    if not skip_unestimated and not bool(estimated.all()):
        rows = steps.row[~estimated].unique().tolist()[:10]
        raise ValueError(f"{_WHERE}: rollout batch 'mc_returns': expected at least one finite "
                         f"return for every step, got all NaN for steps of rows {rows} (set "
                         f"kwargs skip_unestimated: true to give such steps advantage 0)")
    return mean.to(steps.reward.device), estimated.to(steps.reward.device)


@register_stage("estimator", requires=("mc_returns",), reads=("step_ids",), replaces_critic=True,
                baseline="monte_carlo", timestep_unit="turn", reads_discount=True,
                kwarg_checks={"skip_unestimated": check_bool})
def vine(inputs: TemporalInputs, *, skip_unestimated: bool = False) -> TemporalResult:
    """VinePPO's step advantages: ``A_k = r_k + gamma V_{k+1} - V_k`` with ``V_k`` the mean
    of ``mc_returns`` at step k's slot, ``V`` after the last step 0, ``r_k`` the rewards
    landing in the step (the outcome in the last one, turn and folded process rewards),
    ``gamma`` = ``actor.discount`` per step. ``returns`` = ``r_k + gamma V_{k+1}``.

    ``skip_unestimated``: a step whose returns are all NaN (no continuation sampled from
    it, VinePPO's ``max_step_for_value_estimation``) is an error by default; with it, the
    step's value is ``r_k + gamma V_{k+1}``, so its advantage is 0. Each episode stands
    alone (no group statistics): without meta, every row is one episode. The token KL
    penalty is added after, undiscounted, as in ``turn_rloo``.
    """
    if inputs.meta is None:
        rows = inputs.loss_mask.shape[0]
        inputs = dataclasses.replace(inputs, meta=BatchMeta(n_trajs=rows,
                                                            traj_group_sizes=[1] * rows))
    steps = steps_of(inputs, _WHERE, _aligned_step_ids(inputs))
    mean, estimated = _step_values(_returns_table(inputs, steps), steps, skip_unestimated)
    gamma = float(inputs.discount)
    # V_k = mean_k where estimated, else r_k + gamma V_{k+1}: one affine suffix scan.
    coefficient, _ = steps.per_episode(torch.where(estimated, 0.0, gamma).double())
    offset, _ = steps.per_episode(torch.where(estimated, mean, steps.reward))
    values = affine_suffix_scan(coefficient, offset)
    after = torch.nn.functional.pad(values[:, 1:], (0, 1))   # 0 past each episode's end
    returns = steps.reward + gamma * after[steps.episode, steps.index]
    advantages = returns - values[steps.episode, steps.index]
    return result_on_tokens(inputs, steps, advantages, returns)
