"""A synthetic multi-turn problem with known values, where the policy decides how many
turns to take: at turn k (0, 1, ..., K-1) it calls a tool ("continue", probability
``p[k]``; forced to stop at the last turn) or answers ("stop"). A tool call earns the
turn reward ``cost`` (a tool's price, placed at the turn's end); an answer at turn k
ends the episode with outcome 1 with probability ``q[k]`` (more calls, better answers),
else 0. The state at turn k is k alone, so the values are exact:

    V_{K-1} = q[K-1];  Q_k(stop) = q[k];  Q_k(continue) = cost + gamma V_{k+1}
    V_k = p[k] Q_k(continue) + (1 - p[k]) Q_k(stop);  A_k(a) = Q_k(a) - V_k.

With a policy of one logit per turn (``p[k] = sigmoid(theta_k)``), the exact policy
gradient is ``dJ/dtheta_k = P(reach k) p[k] (1 - p[k]) (Q_k(continue) - Q_k(stop))``.
:func:`sample` draws prompt groups of episodes and lays them out as a rollout batch (one
token per turn, one tool token after each call).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_adv import BatchMeta


@dataclass(frozen=True)
class TurnProblem:
    p: tuple[float, ...] = (0.7, 0.6, 0.0)
    q: tuple[float, ...] = (0.3, 0.5, 0.8)
    cost: float = -0.1
    gamma: float = 1.0

    def values(self) -> tuple[list[float], list[dict[str, float]]]:
        """``V_k`` and ``Q_k(a)`` for a in {continue, stop}."""
        turns = len(self.q)
        v = [0.0] * turns
        q = [dict() for _ in range(turns)]
        v[-1] = self.q[-1]
        q[-1] = {"stop": self.q[-1], "continue": float("nan")}
        for k in reversed(range(turns - 1)):
            q[k] = {"stop": self.q[k], "continue": self.cost + self.gamma * v[k + 1]}
            v[k] = self.p[k] * q[k]["continue"] + (1 - self.p[k]) * q[k]["stop"]
        return v, q

    def advantages(self) -> dict[tuple[int, str], float]:
        v, q = self.values()
        return {(k, a): q[k][a] - v[k] for k in range(len(self.q)) for a in ("continue", "stop")
                if not (a == "continue" and k == len(self.q) - 1)}

    def return_variances(self) -> list[float]:
        """``Var(G_k)``: the variance of the discounted return from the state at turn k,
        from the second moments ``M_k = p[k] E[(cost + gamma G_{k+1})^2] + (1 - p[k]) q[k]``
        (an outcome is 0 or 1, so its square is itself)."""
        v, _ = self.values()
        m = [0.0] * len(self.q)
        m[-1] = self.q[-1]
        for k in reversed(range(len(self.q) - 1)):
            call = self.cost ** 2 + 2 * self.cost * self.gamma * v[k + 1] + self.gamma ** 2 * m[k + 1]
            m[k] = self.p[k] * call + (1 - self.p[k]) * self.q[k]
        return [mk - vk * vk for mk, vk in zip(m, v)]

    def reach(self) -> list[float]:
        out, prob = [], 1.0
        for k in range(len(self.q)):
            out.append(prob)
            prob *= self.p[k]
        return out

    def gradient(self) -> list[float]:
        """Exact ``dJ/dtheta_k`` for the turns with a choice."""
        _, q = self.values()
        return [r * p * (1 - p) * (qk["continue"] - qk["stop"])
                for r, p, qk in zip(self.reach()[:-1], self.p[:-1], q[:-1])]


def sample(problem: TurnProblem, groups: int, size: int, seed: int) -> tuple[dict, BatchMeta, dict]:
    """``groups`` prompt groups of ``size`` episodes as one batch, and per episode its
    number of turns (``turns``: [N], the last one an answer)."""
    g = torch.Generator().manual_seed(seed)
    n = groups * size
    turns = torch.ones(n, dtype=torch.long)
    going = torch.ones(n, dtype=torch.bool)
    for k, p in enumerate(problem.p[:-1]):
        going &= torch.rand(n, generator=g) < p
        turns += going.long()
    q = torch.tensor(problem.q)
    outcome = (torch.rand(n, generator=g) < q[turns - 1]).float()
    max_turns = len(problem.q)
    width = 1 + 2 * max_turns + 1   # prompt, (turn, tool)*, spare column
    cols = torch.arange(width)
    # turn k's token at column 1 + 2k, the tool reply after a call at 2 + 2k
    length = 2 * turns                         # prompt + turns + calls (turns - 1)
    attention = cols[None] < length[:, None]
    turn_cols = (cols[None] >= 1) & ((cols[None] - 1) % 2 == 0) & attention
    turn_ids = torch.where(turn_cols, (cols[None] - 1) // 2, -1)
    turn_rewards = torch.where(turn_cols & (turn_ids < (turns - 1)[:, None]), problem.cost, 0.0)
    batch = {"input_ids": torch.zeros(n, width, dtype=torch.long), "attention_mask": attention,
             "loss_mask": turn_cols.int(), "logprobs": torch.zeros(n, width), "rewards": outcome,
             "turn_ids": turn_ids, "turn_rewards": turn_rewards}
    meta = BatchMeta(n_trajs=groups, traj_group_sizes=[size] * groups,
                     rollout_groups=[None] * groups)
    return batch, meta, {"turns": turns}


def continuation_returns(problem: TurnProblem, start: torch.Tensor, k: int,
                         generator: torch.Generator) -> torch.Tensor:
    """``[N, k]`` float64: the discounted returns of ``k`` fresh continuations of the policy
    from the state at turn ``start[n]`` (VinePPO's Monte Carlo rollouts from a step
    boundary)."""
    n = start.shape[0]
    first = start[:, None].expand(n, k)
    total = torch.zeros(n, k, dtype=torch.float64)
    scale = torch.ones(n, k, dtype=torch.float64)
    going = torch.ones(n, k, dtype=torch.bool)
    for turn, (p, q) in enumerate(zip(problem.p, problem.q)):
        calls = torch.rand(n, k, generator=generator) < p
        outcome = (torch.rand(n, k, generator=generator) < q).double()
        here = going & (first <= turn)
        total += torch.where(here, scale * torch.where(calls, problem.cost, outcome), 0.0)
        scale = torch.where(here, scale * problem.gamma, scale)
        going &= ~(here & ~calls)
    return total


def per_turn_advantages(out: dict, turns: torch.Tensor) -> torch.Tensor:
    """[N, K] the advantage of each episode's turn k (NaN past its last turn): read at the
    aligned position predicting turn k's token (column 2k)."""
    k = torch.arange(int(turns.max()))
    adv = out["advantages"][:, 2 * k]
    return torch.where(k[None] < turns[:, None], adv, torch.nan)


def clustered(x: torch.Tensor, group: torch.Tensor, groups: int) -> tuple[float, float]:
    """Mean of ``x`` and its standard error with prompt groups as clusters (the episodes
    of a group share baselines, so they are not independent)."""
    sums = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, x.double())
    counts = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, torch.ones_like(x).double())
    mean = sums.sum() / counts.sum()
    return float(mean), float(((sums - counts * mean) ** 2).sum().sqrt() / counts.sum())


def advantage_errors(problem: TurnProblem, out: dict, turns: torch.Tensor,
                     size: int) -> dict[tuple[int, str], tuple[float, float]]:
    """Per (turn, action): the estimated mean advantage minus the exact one, and its
    standard error (prompt groups of ``size`` episodes as clusters)."""
    adv = per_turn_advantages(out, turns)
    group = torch.arange(len(turns)) // size
    errors = {}
    for (k, action), truth in problem.advantages().items():
        took = (turns > k + 1) if action == "continue" else (turns == k + 1)
        errors[(k, action)] = clustered(adv[took, k] - truth, group[took], len(turns) // size)
    return errors


def gradient_estimates(problem: TurnProblem, out: dict, turns: torch.Tensor,
                       size: int) -> list[tuple[float, float]]:
    """Per turn with a choice: the estimated dJ/dtheta_k of the policy of one logit per
    turn, and its standard error over the prompt groups of ``size`` episodes."""
    adv = per_turn_advantages(out, turns)
    groups = len(turns) // size
    estimates = []
    for k in range(len(problem.gradient())):
        score = (turns > k + 1).float() - problem.p[k]   # d log pi(a_k) / d theta_k
        per_episode = torch.where(turns > k, score * adv[:, k].nan_to_num(), 0.0)
        per_group = per_episode.view(groups, size).sum(1) / size
        estimates.append((float(per_group.mean()), float(per_group.std() / groups ** 0.5)))
    return estimates
