"""Per-token KL estimators (Schulman, "Approximating KL divergence"), the one
implementation behind both the reward-side KL penalty of the advantage pipeline and the
KL term of :class:`~lightning_adv.PPOLoss`.

With ``d = logprobs - ref_logprobs`` (log-probabilities of tokens sampled from the
policy), the estimators of KL(policy || reference) are:

- ``k1``: ``d``;
- ``abs``: ``|d|``;
- ``k2``: ``d² / 2``;
- ``k3`` (alias ``low_var_kl``, verl's name): ``exp(-d) - 1 + d``.

One clamping rule for every estimator and both uses: the estimate is clamped to
``[-KL_BOUND, KL_BOUND]`` (AReaL's bound of the reward penalty, verl's of ``low_var_kl``),
and ``k3`` exponentiates ``-d`` clamped to ±:data:`LOG_RATIO_BOUND` first. That inner
clamp changes no result (at ``|d| = 20`` k3 already exceeds the bound) but keeps
``exp`` finite, so an infinite ``d`` gives the bound instead of NaN. A clamped token
contributes no gradient to a loss term, as in verl's ``low_var_kl``; verl leaves its
``k1``, ``k2`` and ``abs`` loss terms unclamped, which differs only for tokens whose
estimate exceeds 10 (a log-ratio beyond 10 nats, or 4.5 for ``k2``).
"""

from __future__ import annotations

from typing import Literal, get_args

from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3", "low_var_kl", "abs"]
#: The estimator names, for both the reward penalty (``actor.kl_estimator``) and the loss
#: term (``PPOLoss(kl_estimator=...)``, ``ppo.kl_loss_estimator``).
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
#: Every estimate is clamped to [-KL_BOUND, KL_BOUND].
KL_BOUND = 10.0
#: ``k3`` exponentiates a log-ratio clamped to this range, so ``exp`` stays finite.
LOG_RATIO_BOUND = 20.0


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(policy || reference), clamped to ±:data:`KL_BOUND`, as a
    new tensor of the inputs' promoted dtype (differentiable in ``logprobs``)."""
    diff = logprobs - ref_logprobs
    if estimator == "k1":
        estimate = diff
    elif estimator == "abs":
        estimate = diff.abs()
    elif estimator == "k2":
        estimate = 0.5 * diff.square()
    elif estimator in ("k3", "low_var_kl"):
        log_ratio = (-diff).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)   # log(ref / policy)
        estimate = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(f"kl_estimator: expected one of {', '.join(KL_ESTIMATORS)}, "
                         f"got {estimator!r}")
    return estimate.clamp(-KL_BOUND, KL_BOUND)
