"""Slow loop references for the estimators of ``lightning_adv.recipes``, written from the
formulas (one Python loop per group, row and step), independent of the vectorized stages.

Rows are described as in ``batches.rows_batch``; every function takes per-row Python
lists and returns per-row lists of token advantages over the row's generated tokens.
"""

from __future__ import annotations

import math


def unbiased_std(xs: list[float]) -> float:
    if len(xs) < 2:
        return 1.0
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def passk(groups: list[list[float]], eps: float = 1e-6, std_normalize: bool = True) -> list[float]:
    out = []
    for rewards in groups:
        best = max(range(len(rewards)), key=lambda i: (rewards[i], -i))
        second = max(r for i, r in enumerate(rewards) if i != best)
        gap = rewards[best] - second
        if std_normalize:
            gap /= unbiased_std(rewards) + eps
        out += [gap if i == best else 0.0 for i in range(len(rewards))]
    return out


def group_mean_batch_std(groups: list[list[float]], eps: float = 1e-4) -> list[float]:
    flat = [r for g in groups for r in g]
    std = unbiased_std(flat)
    return [(r - sum(g) / len(g)) / (std + eps) for g in groups for r in g]


def gdpo(groups: list[list[list[float]]], weights: list[float], eps: float = 1e-4) -> list[float]:
    """groups[g][i][k]: reward k of response i of prompt g."""
    summed = []
    for g in groups:
        per_response = [0.0] * len(g)
        for k, w in enumerate(weights):
            column = [row[k] for row in g]
            mean = sum(column) / len(column)
            std = unbiased_std(column)
            for i, x in enumerate(column):
                per_response[i] += w * (x - mean) / (std + eps)
        summed += per_response
    mean = sum(summed) / len(summed)
    scale = unbiased_std(summed) + eps
    if scale <= 2 * eps:
        scale = 1.0  # the legacy rule of rollout-aware normalization (SPEC §3 step 3)
    return [(x - mean) / scale for x in summed]


def optimal_token_baseline(groups: list[list[dict]], eps: float = 1e-8,
                           handle_zero_tail: bool = True) -> list[list[float]]:
    """Each response: {"rewards": per-step rewards, "pi": per-step sampled-token
    probability, "sum_pi_squared": per-step sum of squared probabilities} over its
    generated steps (undiscounted). With ``handle_zero_tail``, a group's unique longest
    response has baseline 0 from the second longest length on."""
    out = []
    for g in groups:
        returns, weights = [], []
        for resp in g:
            n = len(resp["rewards"])
            returns.append([sum(resp["rewards"][t:]) for t in range(n)])
            w, total = [], 0.0
            for t in range(n):
                total += 1 - 2 * resp["pi"][t] + resp["sum_pi_squared"][t]
                w.append(total)
            weights.append(w)
        lengths = [len(resp["rewards"]) for resp in g]
        longest = max(lengths)
        second = max([n for n in lengths if n != longest] + [0]) if lengths.count(longest) == 1 \
            else longest
        for i, resp in enumerate(g):
            row = []
            for t in range(len(resp["rewards"])):
                if len(g) == 1:
                    row.append(returns[i][t])
                    continue
                if handle_zero_tail and lengths[i] == longest and t >= second:
                    row.append(returns[i][t])
                    continue
                num = sum(returns[j][t] * weights[j][t] for j in range(len(g)) if t < len(returns[j]))
                den = sum(weights[j][t] for j in range(len(g)) if t < len(returns[j]))
                row.append(returns[i][t] - num / (den + eps))
            out.append(row)
    return out
