"""Per-token KL estimators (Schulman, "Approximating KL divergence"), the one
implementation behind both the reward-side KL penalty of the advantage pipeline and the
KL term of :class:`~lightning_adv.PPOLoss`.

With ``d = logprobs - ref_logprobs`` (log-probabilities of tokens sampled from the
policy), the estimators of KL(policy || reference) are:

- ``k1``: ``d``;
- ``abs``: ``|d|``;
- ``k2``: ``d² / 2``;
- ``k3`` (alias ``low_var_kl``, verl's name): ``exp(-d) - 1 + d``.

For the loss term only (:data:`LOSS_KL_ESTIMATORS`), verl's straight-through variants:

- ``k1+`` and ``k3+`` (``low_var_kl+``): the value of ``k1`` / ``k3`` with the gradient of
  ``k2`` (``d``, the gradient of KL itself in expectation; the gradients of k1 and k3 are
  biased), ``k2 - sg(k2) + sg(estimate)``, verl's ``kl_penalty(..., "k3+")``; the ``k2``
  of the gradient is not clamped (as verl), the value is.

``log_importance_ratio`` multiplies the estimate by ``exp`` of it (clamped to
±:data:`LOG_RATIO_BOUND`), with its gradient: the importance-corrected estimator of TRL's
``use_bias_correction_kl`` (``ratio = π_θ/π_old``, the tokens having been sampled from
π_old, not from π_θ).

Clamping keeps gradients where a loss needs them: ``k1``, ``abs`` and ``k2`` take the
log-ratio ``d`` clamped to ±:data:`LOG_RATIO_BOUND` (20), so their gradient is non-zero
for every ``|d| < 20`` (clamping the value instead would zero ``k2``'s gradient beyond
``|d| = 4.47``); ``k3`` exponentiates ``-d`` clamped to ±20 (``exp`` stays finite, an
infinite ``d`` gives a finite value, not NaN) and its value is clamped to
``[-KL_BOUND, KL_BOUND]``, as verl's ``low_var_kl`` (beyond that its gradient is 0, as
verl's). verl leaves ``d`` of ``k1``, ``k2`` and ``abs`` unclamped, which differs only
where ``|d| > 20``. The reward-side penalty
(:func:`lightning_adv.advantage.reward_terms.kl_penalty`) then clamps every estimate to
±:data:`KL_BOUND` (AReaL's bound of the reward penalty; rewards carry no gradient).
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3", "low_var_kl", "abs"]
#: The estimator names, for both the reward penalty (``actor.kl_estimator``) and the loss
#: term (``PPOLoss(kl_estimator=...)``, ``ppo.kl_loss_estimator``).
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
#: The loss term's estimators: the above and verl's straight-through ``k1+``, ``k3+``.
LOSS_KL_ESTIMATORS: tuple[str, ...] = KL_ESTIMATORS + ("k1+", "k3+", "low_var_kl+")
#: ``k3``'s value (verl's ``low_var_kl`` clamp) and every reward-side estimate are
#: clamped to [-KL_BOUND, KL_BOUND].
KL_BOUND = 10.0
#: The log-ratio is clamped to this range (k3's before ``exp``, so that it stays finite).
LOG_RATIO_BOUND = 20.0


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str,
                log_importance_ratio: Optional[Tensor] = None) -> Tensor:
    """Per-token estimate of KL(policy || reference) (clamped as the module docstring
    says), as a new tensor of the inputs' promoted dtype (differentiable in ``logprobs``); a ``+``
    estimator has ``k2``'s gradient; ``log_importance_ratio`` (``log π_θ/π_old``) weights
    it by the importance ratio (see the module docstring)."""
    if estimator.endswith("+"):
        if estimator not in LOSS_KL_ESTIMATORS:
            raise ValueError(f"kl_estimator: expected one of {', '.join(LOSS_KL_ESTIMATORS)}, "
                             f"got {estimator!r}")
        value = kl_estimate(logprobs, ref_logprobs, estimator[:-1]).detach()
        k2 = 0.5 * (logprobs - ref_logprobs).square()
        estimate = k2 - k2.detach() + value
    else:
        estimate = _estimate(logprobs, ref_logprobs, estimator)
    if log_importance_ratio is not None:
        estimate = estimate * log_importance_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
    return estimate


def _estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    # the log-ratio, not the value, is clamped: the gradient survives up to |d| = 20
    diff = (logprobs - ref_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    if estimator == "k1":
        return diff
    if estimator == "abs":
        return diff.abs()
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator in ("k3", "low_var_kl"):
        log_ratio = -diff   # log(ref / policy), within ±20: exp stays finite
        return (log_ratio.exp() - 1 - log_ratio).clamp(-KL_BOUND, KL_BOUND)   # verl's clamp
    raise ValueError(f"kl_estimator: expected one of {', '.join(LOSS_KL_ESTIMATORS)}, "
                     f"got {estimator!r}")
