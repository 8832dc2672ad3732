"""Critic-free estimators over policy turns (agent steps): every generated token of a
turn gets its turn's advantage.

A step is one policy turn of an episode (a logical rollout); its reward ``r_k`` is
everything that lands in the turn: per-turn rewards (``turn_rewards``, folded process
rewards) and, in the last turn, the outcome score. Turns are told apart by ``turn_ids``
(runs of generated tokens without them); tokens with loss mask 0 (tool outputs) are in
no turn and get advantage 0. The token KL penalty, if any, is added to each token's
advantage after the estimate, undiscounted, as in ``turn_gae``.

- ``turn_rloo``: ``A_k = G_k - mean of G_k over the other episodes of the prompt group
  that reached turn k`` (leave-one-out), ``G_k`` the discounted return from turn k.
  Unbiased whatever number of turns the policy takes (docs/guides/agents.md derives it).
- ``turn_index_norm``: per-turn rewards normalized per turn index within the group, then
  summed from turn k on (MT-GRPO-style). Biased when the policy decides how many turns
  to take; kept for comparison.
- ``gigpo``: GiGPO's episode-level plus anchor-state step-level group advantages, as
  ROLL computes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from lightning_adv.ops.gae import affine_suffix_scan, turn_id_errors, validate_turn_ids
from lightning_adv.ops.turns import TurnSlots, turn_slots
from lightning_adv.stages.types import TemporalInputs, TemporalResult, required_key
from lightning_adv._checks import check_bool, non_negative_number, positive_number, unit_interval
from lightning_adv.stages.registry import register_stage

_GIGPO = {"episode_weight": non_negative_number, "step_weight": non_negative_number,
          "step_gamma": unit_interval, "std_normalize": check_bool, "eps": positive_number}


@dataclass(frozen=True)
class Steps:
    """The steps (policy turns) of a batch, flat in batch order: rows in order, each
    row's turns in order, so the steps of one episode are contiguous and ordered."""

    slots: TurnSlots
    row: Tensor
    """[S] the row of each step"""
    turn: Tensor
    """[S] its turn within the row"""
    episode: Tensor
    """[S] its logical rollout"""
    index: Tensor
    """[S] its step within the episode (0, 1, ...)"""
    group: Tensor
    """[S] its prompt group"""
    reward: Tensor
    """[S] float64: the rewards landing in the turn"""
    n_groups: int
    n_episodes: int

    def per_episode(self, values: Tensor, fill: float = 0.0) -> tuple[Tensor, Tensor]:
        """``[E, K]`` table of per-step ``values`` (K: the most steps of an episode) and
        the mask of the steps present."""
        width = int(self.index.max()) + 1 if self.index.numel() else 1
        table = torch.full((self.n_episodes, width), fill, dtype=values.dtype,
                           device=values.device)
        table[self.episode, self.index] = values
        present = torch.zeros(table.shape, dtype=torch.bool, device=values.device)
        present[self.episode, self.index] = True
        return table, present

    def discounted_returns(self, values: Tensor, discount: float) -> Tensor:
        """``G_k = v_k + discount * G_{k+1}`` along each episode's steps, per step."""
        table, _ = self.per_episode(values.double())
        returns = affine_suffix_scan(torch.full_like(table, float(discount)), table)
        return returns[self.episode, self.index]

    def on_tokens(self, per_step: Tensor) -> Tensor:
        """Per-step values on the tokens of each turn ([B, T] float32, 0 off the turns)."""
        table = torch.zeros(self.slots.rank.shape, dtype=torch.float64,
                            device=per_step.device)
        table[self.row, self.turn] = per_step.double()
        return self.slots.spread(table).float()


def steps_of(inputs: TemporalInputs, where: str, step_ids: Optional[Tensor] = None) -> Steps:
    """The steps of the batch, their rewards, episodes and prompt groups. A step is a
    policy turn, or with ``step_ids`` (aligned like ``turn_ids``, the same rules) the
    generated tokens that share a step id."""
    if inputs.meta is None:
        raise ValueError(f"{where}: needs the prompt groups of meta; build the batch with "
                         f"concat_batch or pass a BatchMeta")
    mask = inputs.loss_mask
    ids, key = (inputs.turn_ids, "turn_ids") if step_ids is None else (step_ids, "step_ids")
    if ids is not None:
        with turn_id_errors(f"{where}: rollout batch '{key}' (shifted one step left)", key):
            validate_turn_ids(mask.bool(), ids)
    slots = turn_slots(mask, ids)
    rewards = inputs.outcome_rewards.double()
    if inputs.process_rewards is not None:
        rewards = rewards + inputs.process_rewards.double()
    per_turn = slots.table(rewards)
    row, turn = slots.present().nonzero(as_tuple=True)
    index = inputs.meta.index(mask.device)
    episode = index.rollout_of_row[row]
    # Turns of earlier rows of the same episode come first (a rollout split over rows).
    before = slots.counts.cumsum(0) - slots.counts
    offset = before - before[index.rollout_starts][index.rollout_of_row]
    return Steps(slots, row, turn, episode, offset[row] + turn, index.traj_of_row[row],
                 per_turn[row, turn], inputs.meta.n_trajs, int(index.rollout_starts.numel()))


def _sums(values: Tensor, keys: Tensor, n: int) -> Tensor:
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, keys, values)


def _cells(*keys: Tensor) -> tuple[Tensor, int]:
    """One index per distinct combination of the keys (e.g. group and step index)."""
    stacked = torch.stack([k.long() for k in keys], dim=1)
    if stacked.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=stacked.device), 0
    unique, inverse = torch.unique(stacked, dim=0, return_inverse=True)
    return inverse, unique.shape[0]


def result_on_tokens(inputs: TemporalInputs, steps: Steps, advantages: Tensor,
                     returns: Tensor) -> TemporalResult:
    """Per-step advantages and returns on the steps' tokens, the token KL penalty added to
    the advantages only (undiscounted, as in ``turn_gae``)."""
    rewards = inputs.outcome_rewards
    if inputs.process_rewards is not None:
        rewards = rewards + inputs.process_rewards
    return TemporalResult(steps.on_tokens(advantages) + inputs.kl_rewards,
                          steps.on_tokens(returns), rewards + inputs.kl_rewards)


def _shrunk(inputs: TemporalInputs, steps: Steps) -> Tensor:
    shrunk = torch.tensor(inputs.meta.shrunk_to_one, dtype=torch.bool,
                          device=steps.group.device)
    return shrunk[steps.group]


@register_stage("estimator", replaces_critic=True, baseline="group", timestep_unit="turn",
                reads_discount=True)
def turn_rloo(inputs: TemporalInputs) -> TemporalResult:
    """``A_k = G_k - b_k``: the discounted return from turn k minus the mean of ``G_k``
    over the *other* episodes of the prompt group that reached turn k (0 when none did).

    The baseline depends only on the turn index and on other, independently sampled
    episodes, never on the episode's own actions, so the policy gradient stays unbiased
    however many turns the policy takes (docs/guides/agents.md). ``discount`` is the
    per-turn gamma. A group that exclusion of unscorable rows shrank to one episode gets
    advantage 0, as every group stage.
    """
    steps = steps_of(inputs, "estimator 'turn_rloo'")
    returns = steps.discounted_returns(steps.reward, inputs.discount)
    cell, n_cells = _cells(steps.group, steps.index)
    total = _sums(returns, cell, n_cells)[cell]
    count = _sums(torch.ones_like(returns), cell, n_cells)[cell]
    baseline = torch.where(count > 1, (total - returns) / (count - 1).clamp(min=1), 0.0)
    baseline = torch.where(_shrunk(inputs, steps), returns, baseline)
    return result_on_tokens(inputs, steps, returns - baseline, returns)


@register_stage("estimator", replaces_critic=True, baseline="group", timestep_unit="turn",
                reads_discount=True, kwarg_checks={"std_normalize": check_bool, "eps": positive_number})
def turn_index_norm(inputs: TemporalInputs, *, std_normalize: bool = False,
                    eps: float = 1e-6) -> TemporalResult:
    """Per-turn-index normalization, the shortcut ``turn_rloo`` replaces:
    ``A_k = sum_{j>=k} gamma^(j-k) (r_j - mean_j) / (std_j + eps)``, with ``mean_j`` and
    ``std_j`` (unbiased; 1 for one episode; only with ``std_normalize``) over the
    episodes of the prompt group that reached turn j.

    The baseline it subtracts, ``sum_{j>=k} gamma^(j-k) mean_j``, has one term per turn
    the episode goes on to take, so it depends on the episode's own later decisions: the
    gradient is biased whenever the policy chooses how many turns to take (each further
    turn is charged the mean reward of that turn index). Kept to measure that bias.
    """
    steps = steps_of(inputs, "estimator 'turn_index_norm'")
    cell, n_cells = _cells(steps.group, steps.index)
    count = _sums(torch.ones_like(steps.reward), cell, n_cells)
    mean = _sums(steps.reward, cell, n_cells) / count
    centred = steps.reward - mean[cell]
    if std_normalize:
        var = _sums(centred * centred, cell, n_cells) / (count - 1).clamp(min=1)
        std = torch.where(count > 1, var.sqrt(), torch.ones_like(var))
        centred = centred / (std[cell] + eps)
    advantages = steps.discounted_returns(centred, inputs.discount)
    returns = steps.discounted_returns(steps.reward, inputs.discount)
    return result_on_tokens(inputs, steps, advantages, returns)


def _roll_normalized(values: Tensor, cell: Tensor, n_cells: int, std_normalize: bool,
                     eps: float) -> Tensor:
    """ROLL's ``agentic_reward_norm`` per cell: ``x - mean``, or with the std
    ``(x - mean) / (std + eps)`` where the cell has two or more members and an unbiased
    std above 1e-6, else 0."""
    count = _sums(torch.ones_like(values), cell, n_cells)
    mean = _sums(values, cell, n_cells) / count
    centred = values - mean[cell]
    if not std_normalize:
        return centred
    std = (_sums(centred * centred, cell, n_cells) / (count - 1).clamp(min=1)).sqrt()
    usable = (count > 1) & (std > 1e-6)
    return torch.where(usable[cell], centred / (std[cell] + eps), 0.0)


def _anchor_states(inputs: TemporalInputs, steps: Steps, where: str) -> Tensor:
    """Each step's anchor state id: ``anchor_state_ids`` on the turn's tokens (one value
    per turn)."""
    ids = required_key(inputs, "anchor_state_ids", where,
                       "[B, T] integers, token-aligned like turn_ids: on the tokens of each "
                       "turn, an id of the state the turn was generated from; equal ids are "
                       "one anchor state",
                       ". The built-in trainer computes them from each turn's context")
    aligned = torch.roll(ids.long(), -1, dims=-1)
    slots = steps.slots
    at_end = slots.table(torch.where(slots.last, aligned, 0))
    uneven = (slots.rank >= 0) & (aligned != slots.spread(at_end).long())
    if bool(uneven.any()):
        raise ValueError(f"{where}: rollout batch 'anchor_state_ids' must hold one id per turn "
                         f"(the same on every generated token of the turn); rows "
                         f"{uneven.any(dim=1).nonzero().flatten().tolist()[:10]} change inside a "
                         f"turn")
    return at_end[steps.row, steps.turn].long()


@register_stage("estimator", requires=("anchor_state_ids",), replaces_critic=True, baseline="group",
                timestep_unit="turn", kwarg_checks=_GIGPO)
def gigpo(inputs: TemporalInputs, *, episode_weight: float = 1.0, step_weight: float = 1.0,
          step_gamma: float = 0.95, std_normalize: bool = False,
          eps: float = 1e-6) -> TemporalResult:
    """GiGPO (Feng et al., 2025, arXiv:2505.10978), as ROLL's ``adv_estimator: gigpo``:
    ``A_k = episode_weight * A_episode + step_weight * A_step`` for every step.

    ``A_episode`` normalizes the episode's total reward (the sum of its step rewards)
    within the prompt group, with statistics over the group's *steps* (an episode of
    three steps counts three times, as ROLL and verl-agent do). ``A_step`` normalizes the
    step's discounted return ``G_k = r_k + step_gamma * G_{k+1}`` within its anchor-state
    group: the steps of the prompt group whose ``anchor_state_ids`` are equal.
    Normalization is ROLL's: ``x - mean`` (``std_normalize: false``, ROLL's
    ``method: mean``), or ``(x - mean) / (std + eps)`` (``mean_std``) and 0 for a group of
    one or of equal values. Anchor groups never cross prompt groups (the paper's rule;
    ROLL keys them by state id alone). The per-token KL penalty is added after.
    """
    where = "estimator 'gigpo'"
    steps = steps_of(inputs, where)
    states = _anchor_states(inputs, steps, where)
    totals = _sums(steps.reward, steps.episode, steps.n_episodes)[steps.episode]
    episode_adv = _roll_normalized(totals, steps.group, steps.n_groups, std_normalize, eps)
    returns = steps.discounted_returns(steps.reward, step_gamma)
    cell, n_cells = _cells(steps.group, states)
    step_adv = _roll_normalized(returns, cell, n_cells, std_normalize, eps)
    advantages = episode_weight * episode_adv + step_weight * step_adv
    return result_on_tokens(inputs, steps, advantages, returns)
