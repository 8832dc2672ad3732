"""The built-in policy losses: verl 0.9.1's registered ``compute_policy_loss_*`` functions
(same names, settings and numbers; the tests run verl's code) and TRL 1.16's ``vespo``.

Each takes :class:`~lightning_adv.losses.policy_loss_registry.PolicyLossInputs` and returns
the per-token loss ``[B, T]`` and its diagnostics; ``PPOLoss`` aggregates. With
``r = π_θ/π_old`` per token, ``A`` the advantage and ``w`` the rollout IS weight
(``π_old/π_rollout``, detached; 1 without rollout correction):

- ``vanilla``: ``max(-A r, -A clip(r, 1-ε_lo, 1+ε_hi))``, dual-clipped at ``-A c`` for
  ``A < 0`` when ``dual_clip = c``; times ``w``. ``ratio_level="sequence"`` takes TRL's
  sequence ratio ``exp(mean_t log r_t)`` instead of ``r``.
- ``gspo``: verl's GSPO-token: the sequence ratio ``s = exp(mean_t log r_t)`` (log clamped
  at 10) with the gradient of each token's own log-prob, clipped like ``vanilla``; × ``w``.
- ``cispo``: ``-sg(clip(r, 1-ε_lo, 1+ε_hi)) A log π_θ`` × ``w`` (MiniMax-M1).
- ``sapo``: ``-A f(r)``, ``f(r) = (4/τ) σ(τ (r - 1))`` with ``τ = tau_pos`` for ``A > 0``
  else ``tau_neg`` (soft gate instead of a clip); × ``w``; always ``seq-mean-token-mean``.
- ``geo_mean`` (GMPO): per sequence, ``-Ā exp(mean_t clip_sgn(A)(log r_t))`` with ``Ā``
  the sequence's mean advantage and the log-ratio clipped to ``[-ε_lo, ε_hi]`` on the
  side that limits the update; times the weights' geometric mean; mean over all rows.
- ``dppo_tv`` / ``dppo_kl``: ``-A sg(min(r, c)) log π_θ`` on tokens inside the
  divergence trust region (``|π_θ - π_old|``, or the binary KL, within ``ε``), 0 outside;
  ``c = dual_clip`` (verl's clip_ratio_c), 20 when unset (verl's fallback); × ``w``.
- ``clip_cov``: ``vanilla`` without dual clip, except that a random ``clip_cov_ratio``
  share of the tokens whose ``(A - Ā)(log π_θ - mean log π_θ)`` lies in
  ``(clip_cov_lb, clip_cov_ub)`` gets no gradient (verl's draw: ``torch.randperm`` on the
  global generator); × ``w``.
- ``kl_cov``: ``-A r``, plus ``ppo_kl_coef |log r|`` on the ``kl_cov_ratio`` share of
  tokens with the largest such covariance; × ``w``.
- ``dro``: ``-(A log π_θ - ½ dro_beta (log r)²)`` × ``w``.
- ``gpg``: ``-A log π_θ`` × ``w`` (also bypass mode's REINFORCE loss).
- ``vespo`` (TRL): ``-φ(W) A log π_θ`` with ``W = ∏_t r_t`` (times the rollout weights,
  folded in as TRL folds its vLLM IS ratio) and ``φ(W) = e^λ W^k e^(-λW)``, detached;
  ``k, λ = k_pos, lambda_pos`` for ``A >= 0`` else ``k_neg, lambda_neg``.

Positions outside the mask hold 0 in every input (the loss never reads them), and the
covariance selections of ``clip_cov`` and ``kl_cov`` are over this call's tokens (one
micro-batch on one rank), as in verl.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_adv._checks import check_number
from lightning_adv.losses.aggregation import ROW_MEAN
from lightning_adv.losses.policy_loss_registry import (
    PolicyLossInputs, non_negative, positive, register_policy_loss)

Diagnostics = dict[str, Tensor]
#: Log-ratios are clamped to ±LOG_RATIO_BOUND before ``exp`` (verl's bound).
LOG_RATIO_BOUND = 20.0


def _weighted(per_token: Tensor, inputs: PolicyLossInputs) -> Tensor:
    w = inputs.rollout_is_weights
    return per_token if w is None else per_token * w


def _clip_fractions(inputs: PolicyLossInputs, ratio: Tensor) -> Diagnostics:
    """``clipfrac``: ratio outside ``[1-ε_lo, 1+ε_hi]``; ``clipfrac_high``/``_low``: the
    clip binds (``A > 0`` above the band, ``A < 0`` below it: TRL's split)."""
    with torch.no_grad():
        adv = inputs.advantages
        high = ratio > 1 + inputs.clip_eps_high
        low = ratio < 1 - inputs.clip_eps
        dtype = ratio.dtype
        return {"clipfrac": inputs.mean((high | low).to(dtype)),
                "clipfrac_high": inputs.mean((high & (adv > 0)).to(dtype)),
                "clipfrac_low": inputs.mean((low & (adv < 0)).to(dtype))}


def _clipped_surrogate(inputs: PolicyLossInputs, ratio: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    adv = inputs.advantages
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - inputs.clip_eps, 1 + inputs.clip_eps_high)
    return torch.maximum(unclipped, clipped), unclipped, clipped


@register_policy_loss(reads_dual_clip=True, reads_ratio_level=True, ppo_clip=True)
def vanilla(inputs: PolicyLossInputs) -> tuple[Tensor, Diagnostics]:
    log_ratio = inputs.logprobs - inputs.old_logprobs
    if inputs.ratio_level == "sequence":
        tokens = inputs.loss_mask.sum(1, keepdim=True).clamp(min=1.0)
        log_ratio = (log_ratio.sum(1, keepdim=True) / tokens).expand_as(log_ratio)
    ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
    policy, _, _ = _clipped_surrogate(inputs, ratio)
    diagnostics = _clip_fractions(inputs, ratio)
    if inputs.dual_clip is not None:
        adv = inputs.advantages
        bound = -adv * inputs.dual_clip
        diagnostics["dual_clipfrac"] = inputs.mean(((adv < 0) & (policy > bound)).to(ratio.dtype))
        policy = torch.where(adv < 0, torch.minimum(policy, bound), policy)
    return _weighted(policy, inputs), diagnostics


@register_policy_loss()
def gspo(inputs: PolicyLossInputs) -> tuple[Tensor, Diagnostics]:
    lp = inputs.logprobs
    tokens = inputs.loss_mask.sum(1, keepdim=True).clamp(min=1.0)
    sequence = ((lp - inputs.old_logprobs) * inputs.loss_mask).sum(1, keepdim=True) / tokens
    log_ratio = (lp - lp.detach() + sequence.detach()).clamp(max=10.0)  # verl's GSPO bound
    ratio = log_ratio.exp()
    policy, _, _ = _clipped_surrogate(inputs, ratio)
    return _weighted(policy, inputs), _clip_fractions(inputs, ratio)


@register_policy_loss()
def cispo(inputs: PolicyLossInputs) -> tuple[Tensor, Diagnostics]:
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - inputs.clip_eps, 1 + inputs.clip_eps_high).detach()
    policy = -clipped * inputs.advantages * inputs.logprobs
    return _weighted(policy, inputs), _clip_fractions(inputs, ratio)


@register_policy_loss(kwarg_checks={"tau_pos": positive, "tau_neg": positive},
                      loss_agg_mode="seq-mean-token-mean")
def sapo(inputs: PolicyLossInputs, *, tau_pos: float = 1.0,
         tau_neg: float = 1.05) -> tuple[Tensor, Diagnostics]:
    adv = inputs.advantages
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = log_ratio.exp()
    taus = torch.where(adv > 0, torch.as_tensor(tau_pos, dtype=adv.dtype, device=adv.device),
                       torch.as_tensor(tau_neg, dtype=adv.dtype, device=adv.device))
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    return _weighted(-gates * adv, inputs), {}


@register_policy_loss(loss_agg_mode=ROW_MEAN)
def geo_mean(inputs: PolicyLossInputs) -> tuple[Tensor, Diagnostics]:
    adv, mask = inputs.advantages, inputs.loss_mask
    log_ratio = inputs.logprobs - inputs.old_logprobs
    sign = torch.sign(adv)
    bounded = log_ratio.clamp(-inputs.clip_eps, inputs.clip_eps_high)
    limited = sign * torch.minimum(sign * log_ratio, sign * bounded)
    tokens = mask.sum(-1)
    ratio = torch.exp((limited * mask).sum(-1) / (tokens + 1e-8))
    sequence_adv = (adv * mask).sum(-1) / (tokens + 1e-8)
    sequence_loss = -sequence_adv * ratio
    if inputs.rollout_is_weights is not None:  # their geometric mean per sequence
        log_w = torch.log(inputs.rollout_is_weights + 1e-10)
        sequence_loss = sequence_loss * torch.exp((log_w * mask).sum(-1) / (tokens + 1e-8))
    # spread over the row's tokens: the row-mean aggregation sums them back per row
    per_token = sequence_loss[:, None] * mask / tokens.clamp(min=1.0)[:, None]
    with torch.no_grad():
        moved = (log_ratio != bounded).to(adv.dtype)
        diagnostics = {"clipfrac": inputs.mean(moved),
                       "clipfrac_high": inputs.mean(moved * (adv > 0)),
                       "clipfrac_low": inputs.mean(moved * (adv < 0))}
    return per_token, diagnostics


def _dppo(inputs: PolicyLossInputs, valid: Tensor) -> tuple[Tensor, Diagnostics]:
    """The DPPO loss on the tokens ``valid`` (detached bool) keeps."""
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    cap = 20.0 if inputs.dual_clip is None else inputs.dual_clip
    truncated = log_ratio.exp().clamp(max=cap).detach()
    keep = valid.detach().to(log_ratio.dtype)
    policy = -inputs.advantages * truncated * inputs.logprobs * keep
    return _weighted(policy, inputs), {"clipfrac": inputs.mean(1.0 - keep)}


@register_policy_loss(reads_dual_clip=True)
def dppo_tv(inputs: PolicyLossInputs) -> tuple[Tensor, Diagnostics]:
    change = inputs.logprobs.exp() - inputs.old_logprobs.exp()
    valid = torch.where(inputs.advantages > 0, change <= inputs.clip_eps_high,
                        change >= -inputs.clip_eps)
    return _dppo(inputs, valid)


@register_policy_loss(reads_dual_clip=True)
def dppo_kl(inputs: PolicyLossInputs) -> tuple[Tensor, Diagnostics]:
    lp, old = inputs.logprobs, inputs.old_logprobs
    prob, old_prob = lp.exp(), old.exp()
    binary_kl = old_prob * (old - lp) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
    valid = torch.where(inputs.advantages > 0,
                        (binary_kl <= inputs.clip_eps_high) | (prob <= old_prob),
                        (binary_kl <= inputs.clip_eps) | (prob >= old_prob))
    return _dppo(inputs, valid)


def _verl_masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """verl's masked mean (``+ 1e-8`` in the count): the covariance selections compare
    with it, so the same tokens are picked."""
    return (torch.where(mask > 0, values, 0.0) * mask).sum() / (mask.sum() + 1e-8)


@register_policy_loss(kwarg_checks={"clip_cov_ratio": positive, "clip_cov_lb": check_number,
                                    "clip_cov_ub": check_number})
def clip_cov(inputs: PolicyLossInputs, *, clip_cov_ratio: float = 0.0002,
             clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0) -> tuple[Tensor, Diagnostics]:
    adv, mask, lp = inputs.advantages, inputs.loss_mask, inputs.logprobs
    ratio = (lp - inputs.old_logprobs).exp()
    policy, unclipped, clipped = _clipped_surrogate(inputs, ratio)
    active = mask > 0
    with torch.no_grad():
        cov = (adv - _verl_masked_mean(adv, mask)) * (lp - _verl_masked_mean(lp.detach(), mask))
        cov = cov.masked_fill(~active | ((clipped > unclipped) & active), float("-inf"))
        count = max(int(clip_cov_ratio * mask.sum().item()), 1)
        candidates = torch.nonzero((cov < clip_cov_ub) & (cov > clip_cov_lb) & active)
        if len(candidates):
            candidates = candidates[torch.randperm(len(candidates))[:min(count, len(candidates))]]
        keep = torch.ones_like(adv)
        keep[candidates[:, 0], candidates[:, 1]] = 0
    diagnostics = {"clipfrac": inputs.mean((keep == 0).to(adv.dtype))}
    return _weighted(policy * keep, inputs), diagnostics


@register_policy_loss(kwarg_checks={"kl_cov_ratio": positive, "ppo_kl_coef": non_negative})
def kl_cov(inputs: PolicyLossInputs, *, kl_cov_ratio: float = 0.0002,
           ppo_kl_coef: float = 0.1) -> tuple[Tensor, Diagnostics]:
    adv, lp = inputs.advantages, inputs.logprobs
    log_ratio = lp - inputs.old_logprobs
    ratio = log_ratio.exp()
    plain = -adv * ratio
    penalized = plain + ppo_kl_coef * log_ratio.abs()
    active = (inputs.loss_mask > 0).reshape(-1)
    selected = torch.zeros_like(active)
    with torch.no_grad():
        positions = torch.nonzero(active, as_tuple=True)[0]
        valid_adv = adv.detach().reshape(-1)[active].cpu()
        valid_lp = lp.detach().reshape(-1)[active].cpu()
        if len(valid_adv):
            cov = (valid_adv - valid_adv.mean()) * (valid_lp - valid_lp.mean())
            top = torch.topk(cov, max(1, int(len(cov) * kl_cov_ratio)), largest=True).indices
            selected[positions[top.to(positions.device)]] = True
    policy = torch.where(selected.view_as(plain), penalized, plain)
    return _weighted(policy, inputs), {"kl_cov_frac": inputs.mean(selected.view_as(plain).to(
        adv.dtype))}


@register_policy_loss(kwarg_checks={"dro_beta": positive})
def dro(inputs: PolicyLossInputs, *, dro_beta: float) -> tuple[Tensor, Diagnostics]:
    log_ratio = inputs.logprobs - inputs.old_logprobs
    policy = -(inputs.logprobs * inputs.advantages - 0.5 * dro_beta * log_ratio.square())
    return _weighted(policy, inputs), {}


@register_policy_loss()
def gpg(inputs: PolicyLossInputs) -> tuple[Tensor, Diagnostics]:
    return _weighted(-inputs.logprobs * inputs.advantages, inputs), {}


@register_policy_loss(kwarg_checks={"k_pos": non_negative, "lambda_pos": positive,
                                    "k_neg": non_negative, "lambda_neg": positive})
def vespo(inputs: PolicyLossInputs, *, k_pos: float = 2.0, lambda_pos: float = 3.0,
          k_neg: float = 3.0, lambda_neg: float = 2.0) -> tuple[Tensor, Diagnostics]:
    adv, mask = inputs.advantages, inputs.loss_mask
    floor = math.log(1e-8)  # TRL's lower clamp of the log-weights
    with torch.no_grad():
        log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-20.0, 20.0)
        log_w = (log_ratio * mask).sum(-1, keepdim=True)
        if inputs.rollout_is_weights is not None:  # log(π_θ/π_old) + log(π_old/π_rollout)
            log_is = torch.log(inputs.rollout_is_weights).clamp(floor, 20.0)
            log_w = log_w + (log_is * mask).sum(-1, keepdim=True)
        log_w = log_w.clamp(floor, 20.0)
        nonneg = adv >= 0
        k = torch.where(nonneg, k_pos, k_neg).to(adv.dtype)
        lam = torch.where(nonneg, lambda_pos, lambda_neg).to(adv.dtype).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(nan=0.0, posinf=0.0,
                                                                          neginf=0.0)
    policy = -phi * adv * inputs.logprobs
    return policy, {"vespo_phi_mean": inputs.mean(phi)}
