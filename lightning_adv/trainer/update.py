"""The PPO update of one training step, and the trainer's loss.

:meth:`Updater.step` runs ``ppo.epochs`` x ``ppo.minibatches`` optimizer steps (manual
optimization) on :class:`~lightning_adv.PPOLoss`; each minibatch runs as micro-batches of
at most ``ppo.micro_batch_size`` rows whose gradients accumulate into its one optimizer
step, under DDP with one gradient all-reduce per minibatch (``no_sync`` before its last
micro-batch). The minibatch order comes from the generator passed in. With
``ppo.echo_ce_coef`` the loss also gets the environment's replies as its cross-entropy
mask (:func:`environment_reply_mask`), counted per minibatch like the loss mask.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.distributed import any_rank
from lightning_adv.exceptions import NonFiniteTrainingError
from lightning_adv.losses.ppo_loss import PPOLoss
from lightning_adv.trainer.config import PPOConfig
from lightning_adv.trainer.policies.base import Policy, PromptGroups


class Updater:
    """The PPO update of a run: its policy, loss and settings, built once."""

    def __init__(self, policy: Policy, loss_fn: PPOLoss, ppo: PPOConfig, critic: bool):
        self.policy, self.loss_fn, self.ppo, self.critic = policy, loss_fn, ppo, critic

    def step(self, batch: dict[str, Any], out: dict[str, Any], gen: torch.Generator,
             module: Any) -> None:
        """PPO epochs x minibatches of optimizer steps on the loss over the rollout
        ``batch`` and the advantage module's output ``out``, through ``module``'s manual
        optimization (its optimizer, ``manual_backward`` and ``clip_gradients``: a
        subclass's overrides apply); each minibatch runs as micro-batches of at most
        ``ppo.micro_batch_size`` rows whose gradients accumulate, each cut to its longest
        row and normalized by the minibatch's token counts."""
        ppo, opt = self.ppo, module.optimizers()
        step = int(getattr(module, "rollout_step", 0))
        strategy = module._trainer.strategy if module._trainer is not None else None
        rows = batch["input_ids"].shape[0]
        for epoch in range(ppo.epochs):
            order = torch.randperm(rows, generator=gen).to(batch["input_ids"].device)
            for minibatch, chunk in enumerate(order.tensor_split(ppo.minibatches)):
                micro = [chunk] if ppo.micro_batch_size is None else list(
                    chunk.split(ppo.micro_batch_size))
                counts = None
                if len(micro) > 1:  # one collective per minibatch, before any backward
                    ce = self.ce_mask(batch)
                    counts = self.loss_fn.counts(out["loss_mask"][chunk],
                                                 None if ce is None else ce[chunk])
                opt.zero_grad()
                results = []
                for i, part in enumerate(micro):
                    # DDP averages gradients at the last micro-batch's backward only
                    with gradient_sync(strategy, last=i == len(micro) - 1):
                        result = self.micro_batch_loss(batch, out, part, counts, module)
                        module.manual_backward(result["loss"])
                    module.adv_metrics.update(loss=result)
                    results.append(result)
                # Before the optimizer step: a NaN never reaches the weights or a checkpoint.
                check_loss(results, f"training step {step} (PPO epoch {epoch}, minibatch "
                                    f"{minibatch})", module)
                if ppo.max_grad_norm is not None:
                    module.clip_gradients(opt, gradient_clip_val=ppo.max_grad_norm,
                                          gradient_clip_algorithm="norm")
                opt.step()

    def ce_mask(self, batch: dict[str, Any]) -> Optional[Tensor]:
        """The loss's cross-entropy mask: the environment's replies with
        ``ppo.echo_ce_coef > 0``, else None."""
        return environment_reply_mask(batch) if self.ppo.echo_ce_coef > 0 else None

    def micro_batch_loss(self, batch: dict[str, Any], out: dict[str, Any], rows: Tensor,
                         counts: Any, module: Any = None) -> dict[str, Tensor]:
        """The loss (:class:`~lightning_adv.PPOLoss`) on ``rows``, cut to their longest
        row; off-policy, the rollout's log-probs (aligned by the advantage module) go with
        them, and the loss corrects its policy term."""
        ppo, loss_fn = self.ppo, self.loss_fn
        width = int(batch["attention_mask"][rows].sum(1).max())
        ids = batch["input_ids"][rows, :width]

        def cut(x: Optional[Tensor]) -> Optional[Tensor]:
            return None if x is None else x[rows, :width]

        mask = cut(out["loss_mask"])
        generated = batch["loss_mask"][rows, :width] > 0
        prompts = PromptGroups(generated.int().argmax(1), ppo.n_samples)
        ce_mask = cut(self.ce_mask(batch))
        read = mask > 0 if ce_mask is None else (mask > 0) | (ce_mask > 0)
        # With entropy_coef 0 the entropy is only reported: no graph for it.
        logprobs, values, ent = self.policy.train_forward(
            ids, read, ppo.temperature, ppo.entropy_coef > 0, prompts)
        extra: dict[str, Any] = {} if ce_mask is None else {"ce_mask": ce_mask}
        if self.critic:
            extra.update(values=values, old_values=cut(batch["values"]),
                         returns=cut(out["returns"]))
        if loss_fn.bypass_mode:  # the old log-probs are the rollout's: nothing more to pass
            if module is not None:
                module.offpolicy_metrics.update(logprobs.detach(), cut(out["logprobs"]), mask,
                                                ppo.rollout_correction)
        elif "rollout_logprobs" in out:  # decoupled mode: the loss weighs π_old/π_rollout
            extra["rollout_logprobs"] = cut(out["rollout_logprobs"])
        ref_logp = out.get("ref_logp") if ppo.kl_loss_coef > 0 else None
        return loss_fn(logprobs, cut(out["logprobs"]), cut(out["advantages"]), mask,
                       ref_logprobs=cut(ref_logp), entropy=ent, counts=counts, **extra)


def environment_reply_mask(batch: dict[str, Any]) -> Tensor:
    """``[B, T]`` float, aligned (position t predicts token t+1): 1 where token t+1 is an
    environment reply: attended, not generated, after the row's first generated token."""
    generated = batch["loss_mask"] > 0
    reply = (batch["attention_mask"] > 0) & ~generated & (generated.cumsum(1) > 0)
    return torch.nn.functional.pad(reply[:, 1:], (0, 1)).float()


def last_checkpoint(module: Any) -> str:
    """Which checkpoint a failed run can resume from (for its error message)."""
    trainer = getattr(module, "_trainer", None)
    callback = getattr(trainer, "checkpoint_callback", None)
    path = getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "")
    return (f"the last checkpoint, {path}, holds the last good step" if path
            else "no checkpoint had been written yet")


def check_loss(results: list[dict[str, Tensor]], where: str, module: Any = None) -> None:
    """Stop the run at a minibatch whose loss is not finite on any rank (every rank
    stops: one flag collective per minibatch under DDP, one host sync otherwise), naming
    the loss result's terms that are not finite (policy_loss, value_loss, kl_loss,
    entropy, ...)."""
    finite = torch.stack([torch.isfinite(r["loss"].detach()).all() for r in results])
    bad = next((r for r, ok in zip(results, finite.tolist()) if not ok), None)
    device = results[0]["loss"].device
    if not any_rank(bad is not None, device):
        return
    after = (f"The update was not applied and no checkpoint of this step was written; "
             f"{last_checkpoint(module)}")
    if bad is None:
        raise NonFiniteTrainingError(f"{where}: another data-parallel rank's loss is not finite "
                                     f"(its error names the terms). {after}")
    terms = {k: float(v.detach().float().mean()) for k, v in bad.items()
             if k not in ("loss", "num_tokens") and isinstance(v, Tensor) and v.numel() == 1}
    nonfinite = [f"{k}={v}" for k, v in terms.items() if not math.isfinite(v)]
    good = [f"{k}={v:.4g}" for k, v in terms.items() if math.isfinite(v)]
    raise NonFiniteTrainingError(
        f"{where}: the loss is {float(bad['loss'].detach())}, expected a finite value; "
        f"not finite: {', '.join(nonfinite) or 'no single term (their weighted sum overflows)'}"
        f"{'; finite: ' + ', '.join(good) if good else ''}. {after}")


def check_advantages(out: dict[str, Any], advantage: Any, step: int, module: Any = None) -> None:
    """The advantage module's ``advantages`` (and ``returns``) must be finite at the loss
    mask's tokens: checked here, before the update and the logging (whose histogram
    would fail on NaNs with a message naming neither), so the error names the step and
    the module. Every rank stops (one flag collective per step under DDP)."""
    active = out["loss_mask"] > 0
    name = f"{type(advantage).__module__}.{type(advantage).__qualname__}"
    after = f"Nothing of this step was applied; {last_checkpoint(module)}"
    found = None
    for key in ("advantages", "returns"):
        values = out.get(key)
        if isinstance(values, Tensor) and found is None:
            bad = active & ~torch.isfinite(values.detach())
            if bool(bad.any()):
                row, col = bad.nonzero()[0].tolist()
                found = (f"returned {key} that are not finite at {int(bad.sum())} of the loss "
                         f"mask's {int(active.sum())} tokens (first at ({row}, {col}): "
                         f"{float(values[row, col])}); expected finite values wherever "
                         f"loss_mask > 0")
    if not any_rank(found is not None, active.device):
        return
    raise NonFiniteTrainingError(
        f"training step {step}: advantage_module {name!r} "
        f"{found or 'returned non-finite values on another data-parallel rank (its error says where)'}. "
        f"{after}")


def gradient_sync(strategy: Any, last: bool) -> Any:
    """No gradient all-reduce before a minibatch's last micro-batch (DDP's no_sync); a
    no-op outside DDP."""
    if last or not hasattr(strategy, "block_backward_sync"):
        return contextlib.nullcontext()
    return strategy.block_backward_sync()


#: PPOLoss arguments whose ppo config key has another name
_LOSS_KEYS = {"kl_coef": "kl_loss_coef", "kl_estimator": "kl_loss_estimator",
              "ce_coef": "echo_ce_coef"}


def build_loss(ppo: PPOConfig, episode_budget: int) -> PPOLoss:
    """The trainer's loss; Dr.GRPO's constant defaults to the episode's token budget. The
    rollout correction is the loss's in both modes: bypass mode weighs π_θ against
    π_rollout, decoupled mode π_old against π_rollout, at every call.
    Errors name the ``ppo`` key."""
    scale = ppo.loss_scale_factor
    if scale is None and ppo.loss_agg_mode == "seq-mean-token-sum-norm":
        scale = float(episode_budget)
    correction = ppo.rollout_correction
    try:
        return PPOLoss(
            clip_eps=ppo.clip_eps, clip_eps_high=ppo.clip_eps_high, dual_clip=ppo.dual_clip,
            loss_agg_mode=ppo.loss_agg_mode, kl_coef=ppo.kl_loss_coef,
            kl_estimator=ppo.kl_loss_estimator, entropy_coef=ppo.entropy_coef,
            value_coef=ppo.value_coef, value_clip_eps=ppo.value_clip_eps,
            ratio_level=ppo.ratio_level, loss_scale_factor=scale, policy_loss=ppo.policy_loss,
            policy_loss_kwargs=ppo.policy_loss_kwargs,
            rollout_correction=correction,
            rollout_kl_coef=ppo.rollout_kl_coef, rollout_kl_estimator=ppo.rollout_kl_estimator,
            use_bias_correction_kl=ppo.use_bias_correction_kl, ce_coef=ppo.echo_ce_coef)
    except ValueError as exc:
        name, sep, rest = str(exc).partition(":")
        head, dot, tail = name.partition(".")
        if not sep or " " in name:
            raise
        raise ValueError(f"ppo.{_LOSS_KEYS.get(head, head)}{dot}{tail}:{rest}") from None
