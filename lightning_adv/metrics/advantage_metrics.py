"""``AdvantageMetrics``: what PPO/GRPO users watch about a batch of advantages, as one
torchmetrics ``Metric``.

Updated from the dict an ``AdvantageModule`` returns (and, optionally, ``PPOLoss``
results), it reports:

- ``total_rewards``, ``kl_rewards``: token means of ``tot_rewards`` / ``kl_rewards``;
- ``advantages_{mean,std,min,max}``, ``returns_{mean,std,min,max}`` over active tokens
  (population std); ``advantages`` are the final ones, what the loss uses;
- ``unnormalized_advantages_{mean,std,min,max}``: the estimator's advantages before
  ``adv_norm`` (the module returns them when ``adv_norm`` is set), on the same tokens;
- ``zero_adv_group_frac``: the fraction of prompt groups (``meta.traj_group_sizes``)
  whose advantages are all zero (within ``zero_atol``) on their active tokens, i.e. that
  give no learning signal; a group without active tokens counts as zero. Needs ``meta``;
- ``process_reward``: token mean of the batch's ``token_rewards`` over the generated
  tokens (``input_token_loss_mask``), when present;
- ``unscorable_fraction``: the fraction of rows whose reward was NaN and that were left
  out (``actor.unscorable_rewards: exclude``, the module's ``unscorable`` output);
- the ``PPOLoss`` diagnostics (``policy_loss``, ``approx_kl``, ``clipfrac`` and its
  ``clipfrac_high``/``clipfrac_low`` split, ``rollout_kl``, ``rollout_rejected_frac``, ...),
  each weighted by the minibatch's ``num_tokens``.

Every mean is a global token mean: the states are sums (of ``x * mask`` and of the mask)
reduced with ``sum`` across ranks, minima and maxima with ``min``/``max``, so under DDP
``compute`` equals a single process holding the union of the ranks' batches, not a mean
of per-rank means. A key is reported only when some rank contributed to it, so every rank
logs the same keys. ``dist_sync_on_step`` defaults to True, so the value ``forward``
returns (``self.log_dict(self.adv_metrics(out, meta), ...)``) is already global.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_adv._checks import check_number, fail
from lightning_adv.batch.grouping import BatchMeta

TOKEN_MEANS = {"total_rewards": "tot_rewards", "kl_rewards": "kl_rewards"}
MOMENTS = ("advantages", "returns", "unnormalized_advantages")
LOSS_DIAGNOSTICS = ("policy_loss", "value_loss", "kl_loss", "entropy", "approx_kl", "clipfrac",
                    "clipfrac_high", "clipfrac_low", "dual_clipfrac", "rollout_kl",
                    "rollout_rejected_frac", "rl_loss", "ce_loss", "teacher_kl")
#: Diagnostics that are means over other tokens than the loss mask's, and their count.
LOSS_DIAGNOSTIC_WEIGHTS = {"ce_loss": "ce_tokens"}


class AdvantageMetrics(Metric):
    """Masked token statistics of advantage results and PPO losses, synced across ranks.

    Args:
        prefix: prepended to every key (``train/total_rewards``).
        zero_atol: an advantage with ``|A| <= zero_atol`` counts as zero for
            ``zero_adv_group_frac`` (exact zeros are rare after normalization's float math).
        **kwargs: passed to ``torchmetrics.Metric``.
    """

    full_state_update = False
    higher_is_better = None
    is_differentiable = False

    def __init__(self, prefix: str = "train/", zero_atol: float = 1e-6, **kwargs: Any):
        kwargs.setdefault("dist_sync_on_step", True)
        super().__init__(**kwargs)
        if not isinstance(prefix, str):
            fail("AdvantageMetrics prefix", "a string", prefix)
        check_number("AdvantageMetrics zero_atol", zero_atol, minimum=0.0)
        self.prefix = prefix
        self.zero_atol = float(zero_atol)

        def zero() -> Tensor:
            return torch.tensor(0.0, dtype=torch.float64)

        self.add_state("tokens", zero(), dist_reduce_fx="sum")
        for name in TOKEN_MEANS:
            self.add_state(f"{name}_sum", zero(), dist_reduce_fx="sum")
        for name in MOMENTS:
            self.add_state(f"{name}_sum", zero(), dist_reduce_fx="sum")
            self.add_state(f"{name}_squares", zero(), dist_reduce_fx="sum")
            self.add_state(f"{name}_min", torch.tensor(float("inf"), dtype=torch.float64),
                           dist_reduce_fx="min")
            self.add_state(f"{name}_max", torch.tensor(float("-inf"), dtype=torch.float64),
                           dist_reduce_fx="max")
        for name in ("zero_groups", "groups", "process_sum", "process_tokens",
                     "unnormalized_advantages_tokens", "unscorable_rows", "scored_rows"):
            self.add_state(name, zero(), dist_reduce_fx="sum")
        for name in LOSS_DIAGNOSTICS:
            self.add_state(f"loss_{name}_sum", zero(), dist_reduce_fx="sum")
            self.add_state(f"loss_{name}_tokens", zero(), dist_reduce_fx="sum")

    def update(self, out: Optional[Mapping[str, Any]] = None, meta: Optional[BatchMeta] = None,
               loss: Optional[Mapping[str, Tensor]] = None) -> None:
        """Add an ``AdvantageModule`` result (with its ``meta`` for the group statistic)
        and/or one ``PPOLoss`` result; either may be omitted, e.g. one advantage update
        per step and one loss update per minibatch."""
        if out is None and meta is not None:
            raise ValueError("AdvantageMetrics.update: meta was given without the "
                             "AdvantageModule result (out) it describes")
        if out is None and loss is None:
            raise ValueError("AdvantageMetrics.update: expected an AdvantageModule result "
                             "(out) or a PPOLoss result (loss), got neither")
        if out is not None:
            self._update_advantages(out, meta)
        if loss is not None:
            self._update_loss(loss)

    def _update_advantages(self, out: Mapping[str, Any], meta: Optional[BatchMeta]) -> None:
        for key in ("loss_mask", "advantages", "returns", "tot_rewards", "kl_rewards"):
            if not isinstance(out.get(key), Tensor):
                fail(f"AdvantageMetrics out[{key!r}]", "a tensor (the AdvantageModule result)",
                     type(out.get(key)).__name__ if key in out else "missing key")
        mask = out["loss_mask"].detach().double()
        optional = tuple(k for k in ("unnormalized_advantages",) if isinstance(out.get(k), Tensor))
        for key in ("advantages", "returns", "tot_rewards", "kl_rewards", *optional):
            if out[key].shape != mask.shape:
                fail(f"AdvantageMetrics out[{key!r}]", f"shape {tuple(mask.shape)} (that of "
                     f"loss_mask)", tuple(out[key].shape))
        if bool(((mask != 0) & (mask != 1)).any()):
            fail("AdvantageMetrics out['loss_mask']", "only 0 and 1", "other values")
        active = mask > 0
        self.tokens += mask.sum()
        for name, key in TOKEN_MEANS.items():
            total = getattr(self, f"{name}_sum")
            total += (out[key].detach().double() * mask).sum()
        if isinstance(out.get("unnormalized_advantages"), Tensor):
            self.unnormalized_advantages_tokens += mask.sum()
        for name in MOMENTS:
            if name not in out:
                continue
            x = out[name].detach().double()
            getattr(self, f"{name}_sum").add_((x * mask).sum())
            getattr(self, f"{name}_squares").add_((x * x * mask).sum())
            if bool(active.any()):
                chosen = x[active]
                setattr(self, f"{name}_min", torch.minimum(getattr(self, f"{name}_min"), chosen.min()))
                setattr(self, f"{name}_max", torch.maximum(getattr(self, f"{name}_max"), chosen.max()))
        if isinstance(out.get("unscorable"), Tensor):
            self.unscorable_rows += out["unscorable"].detach().double().sum()
            self.scored_rows += out["unscorable"].numel()
        if meta is not None:
            self._update_groups(out["advantages"].detach(), active, meta)
        if "token_rewards" in out:
            self._update_process(out)

    def _update_groups(self, advantages: Tensor, active: Tensor, meta: BatchMeta) -> None:
        sizes = getattr(meta, "traj_group_sizes", None)
        if sizes is None:
            fail("AdvantageMetrics meta", "a BatchMeta (with traj_group_sizes)", type(meta).__name__)
        if sum(sizes) != advantages.shape[0]:
            fail("AdvantageMetrics meta.traj_group_sizes", f"sizes summing to the batch's "
                 f"{advantages.shape[0]} rows", sizes)
        signal = ((advantages.abs() > self.zero_atol) & active).any(1)
        group_ids = torch.repeat_interleave(torch.arange(len(sizes), device=signal.device),
                                            torch.tensor(sizes, device=signal.device))
        signal_rows = torch.zeros(len(sizes), dtype=torch.float64, device=signal.device)
        signal_rows.index_add_(0, group_ids, signal.double())
        self.groups += len(sizes)
        self.zero_groups += (signal_rows == 0).sum().double()

    def _update_process(self, out: Mapping[str, Any]) -> None:
        rewards, generated = out["token_rewards"], out.get("input_token_loss_mask")
        if not isinstance(generated, Tensor) or generated.shape != rewards.shape:
            fail("AdvantageMetrics out['input_token_loss_mask']", "the unshifted loss mask of "
                 "the AdvantageModule result, shaped like token_rewards",
                 getattr(generated, "shape", generated))
        weight = generated.detach().double()
        self.process_sum += (rewards.detach().double() * weight).sum()
        self.process_tokens += weight.sum()

    def _update_loss(self, loss: Mapping[str, Tensor]) -> None:
        if "num_tokens" not in loss:
            fail("AdvantageMetrics loss", "a PPOLoss result (with 'num_tokens')", sorted(loss))
        tokens = torch.as_tensor(loss["num_tokens"]).detach().double()
        for name in LOSS_DIAGNOSTICS:
            if name in loss:
                value = torch.as_tensor(loss[name]).detach().double()
                weight = tokens
                if name in LOSS_DIAGNOSTIC_WEIGHTS:
                    weight = torch.as_tensor(loss[LOSS_DIAGNOSTIC_WEIGHTS[name]]).detach().double()
                getattr(self, f"loss_{name}_sum").add_(value * weight)
                getattr(self, f"loss_{name}_tokens").add_(weight)

    def compute(self) -> dict[str, Tensor]:
        """The metrics of every update since the last ``reset()``, keyed ``<prefix><name>``,
        global across ranks; a key appears only when some update contributed to it."""
        out: dict[str, Tensor] = {}
        p = self.prefix
        if self.tokens > 0:
            for name in TOKEN_MEANS:
                out[p + name] = getattr(self, f"{name}_sum") / self.tokens
            for name in MOMENTS:
                tokens = (self.unnormalized_advantages_tokens
                          if name == "unnormalized_advantages" else self.tokens)
                if tokens == 0:
                    continue
                mean = getattr(self, f"{name}_sum") / tokens
                var = (getattr(self, f"{name}_squares") / tokens - mean * mean).clamp(min=0)
                out[f"{p}{name}_mean"], out[f"{p}{name}_std"] = mean, var.sqrt()
                out[f"{p}{name}_min"] = getattr(self, f"{name}_min").clone()
                out[f"{p}{name}_max"] = getattr(self, f"{name}_max").clone()
        if self.groups > 0:
            out[p + "zero_adv_group_frac"] = self.zero_groups / self.groups
        if self.process_tokens > 0:
            out[p + "process_reward"] = self.process_sum / self.process_tokens
        if self.scored_rows > 0:
            out[p + "unscorable_fraction"] = self.unscorable_rows / self.scored_rows
        for name in LOSS_DIAGNOSTICS:
            tokens = getattr(self, f"loss_{name}_tokens")
            if tokens > 0:
                out[p + name] = getattr(self, f"loss_{name}_sum") / tokens
        return {k: v.float() for k, v in out.items()}
