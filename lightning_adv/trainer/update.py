"""The PPO update of one training step, and the trainer's loss.

:func:`ppo_update` runs ``ppo.epochs`` x ``ppo.minibatches`` optimizer steps (manual
optimization) on :class:`~lightning_adv.PPOLoss`; each minibatch runs as micro-batches of
at most ``ppo.micro_batch_size`` rows whose gradients accumulate into its one optimizer
step, under DDP with one gradient all-reduce per minibatch (``no_sync`` before its last
micro-batch). The minibatch order comes from the generator passed in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.losses.ppo_loss import PPOLoss
from lightning_adv.trainer.config import PPOConfig
from lightning_adv.trainer.policies.logprobs import logprobs_and_entropy, picked_logprobs_and_entropy
from lightning_adv.trainer.policies.tiny_network import CausalTransformer
from lightning_adv.trainer.policies.hf.prompt_sharing import SharedPrompts, forward_rows, reads_shared_prompts


@dataclass(frozen=True)
class UpdateHooks:
    """What the update asks of Lightning's manual optimization: the module's own methods,
    so that a subclass's overrides (a recording optimizer, a plain backward) apply."""

    optimizer: Any
    """the optimizer of ``LightningModule.optimizers()``"""
    backward: Callable[[Tensor], None]
    """``LightningModule.manual_backward``"""
    clip_gradients: Callable[[Any, float], None]
    """clips the gradients by global norm: ``(optimizer, max_norm)``"""
    record_loss: Callable[[dict[str, Tensor]], None]
    """receives each micro-batch's loss outputs (for the step's loss metrics)"""
    record_offpolicy: Optional[Callable[[Tensor, Tensor, Tensor], None]] = None
    """bypass mode: receives each micro-batch's (current log-probs, rollout log-probs,
    loss mask), the mismatch the loss corrects"""
    strategy: Any = None
    """the trainer's strategy (None without a trainer): DDP's gradient sync is blocked
    through it"""


def ppo_update(policy: torch.nn.Module, loss_fn: PPOLoss, ppo: PPOConfig, critic: bool,
               batch: dict[str, Any], out: dict[str, Any], gen: torch.Generator,
               device: torch.device, hooks: UpdateHooks) -> None:
    """PPO epochs x minibatches of optimizer steps on ``loss_fn`` over the rollout ``batch``
    and the advantage module's output ``out``; each minibatch runs as micro-batches of at
    most ``ppo.micro_batch_size`` rows whose gradients accumulate, each cut to its longest
    row and normalized by the minibatch's token counts."""
    opt = hooks.optimizer
    rows = batch["input_ids"].shape[0]
    lengths = batch["attention_mask"].sum(1)
    for _ in range(ppo.epochs):
        order = torch.randperm(rows, generator=gen).to(device)
        for chunk in order.tensor_split(ppo.minibatches):
            micro = [chunk] if ppo.micro_batch_size is None else list(
                chunk.split(ppo.micro_batch_size))
            counts = None
            if len(micro) > 1:  # one collective per minibatch, before any backward
                counts = loss_fn.counts(out["loss_mask"][chunk])
            opt.zero_grad()
            for i, part in enumerate(micro):
                # DDP averages gradients at the last micro-batch's backward only
                with gradient_sync(hooks.strategy, last=i == len(micro) - 1):
                    result = micro_batch_loss(policy, loss_fn, ppo, critic, batch, out, part,
                                              lengths, counts, hooks.record_offpolicy)
                    hooks.backward(result["loss"])
                hooks.record_loss(result)
            if ppo.max_grad_norm is not None:
                hooks.clip_gradients(opt, ppo.max_grad_norm)
            opt.step()


def gradient_sync(strategy: Any, last: bool) -> Any:
    """No gradient all-reduce before a minibatch's last micro-batch (DDP's no_sync); a
    no-op outside DDP."""
    if last or not hasattr(strategy, "block_backward_sync"):
        return contextlib.nullcontext()
    return strategy.block_backward_sync()


def micro_batch_loss(policy: torch.nn.Module, loss_fn: PPOLoss, ppo: PPOConfig, critic: bool,
                     batch: dict[str, Any], out: dict[str, Any], rows: Tensor, lengths: Tensor,
                     counts: Any, record_offpolicy: Optional[Callable[..., None]] = None
                     ) -> dict[str, Tensor]:
    """``loss_fn`` (:class:`~lightning_adv.PPOLoss`) on ``rows``, cut to their longest row;
    the off-policy tensors of ``out`` (``rollout_logprobs``, ``rollout_is_weights``,
    ``rollout_rs_mask``, aligned) go with them."""
    width = int(lengths[rows].max())
    ids = batch["input_ids"][rows, :width]

    def cut(x: Optional[Tensor]) -> Optional[Tensor]:
        return None if x is None else x[rows, :width]

    mask = cut(out["loss_mask"])
    # With entropy_coef 0 the entropy is only reported: no graph for it.
    entropy_grad = ppo.entropy_coef > 0
    if isinstance(policy, CausalTransformer):
        logprobs, values, ent = loss_positions_pass(policy, ids, mask > 0, ppo.temperature,
                                                    entropy_grad)
    else:  # (a Hugging Face policy reads each prompt of the rows once)
        shared = (SharedPrompts.of_rollout(ids, batch["loss_mask"][rows, :width])
                  if ppo.n_samples > 1 and reads_shared_prompts(policy) else None)
        logits, values = forward_rows(policy, ids, shared)
        logprobs, ent = logprobs_and_entropy(logits, ids, ppo.temperature,
                                             entropy_grad=entropy_grad)
    extra = {}
    if critic:
        extra = dict(values=values, old_values=cut(batch["values"]), returns=cut(out["returns"]))
    if loss_fn.bypass_mode:  # the old log-probs are the rollout's: nothing more to pass
        if record_offpolicy is not None:
            record_offpolicy(logprobs.detach(), cut(out["logprobs"]), mask)
    else:
        extra.update({key: cut(out.get(key)) for key in
                      ("rollout_logprobs", "rollout_is_weights", "rollout_rs_mask")})
    ref_logp = out.get("ref_logp") if ppo.kl_loss_coef > 0 else None
    return loss_fn(logprobs, cut(out["logprobs"]), cut(out["advantages"]), mask,
                   ref_logprobs=cut(ref_logp), entropy=ent, counts=counts, **extra)


def loss_positions_pass(policy: CausalTransformer, ids: Tensor, active: Tensor, temperature: float,
                        entropy_grad: bool) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """The policy's next-token log-probs, values and entropies over the ``[B, T]`` rows
    ``ids``, computed at the loss mask's positions ``active`` only
    (:meth:`~lightning_adv.trainer.policies.tiny_network.CausalTransformer.forward_selected`) and 0
    elsewhere: :class:`~lightning_adv.PPOLoss` never reads the other positions, so the loss
    and its gradient are those of a full forward pass, to float rounding."""
    logits, values = policy.forward_selected(ids, active)
    targets = torch.nn.functional.pad(ids[:, 1:], (0, 1))[active]  # token t+1 at position t
    logprobs, ent = picked_logprobs_and_entropy(logits, targets, temperature, entropy_grad)

    def spread(x: Tensor) -> Tensor:
        return x.new_zeros(active.shape).masked_scatter(active, x)

    return spread(logprobs), None if values is None else spread(values), spread(ent)


#: PPOLoss arguments whose ppo config key has another name
_LOSS_KEYS = {"kl_coef": "kl_loss_coef", "kl_estimator": "kl_loss_estimator"}


def build_loss(ppo: PPOConfig, episode_budget: int) -> PPOLoss:
    """The trainer's loss; Dr.GRPO's constant defaults to the episode's token budget. The
    rollout correction goes to the loss in bypass mode (π_θ against π_rollout at every
    call); in decoupled mode the trainer computes it once per step and passes it in.
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
            rollout_correction=correction if correction is not None and correction.bypass_mode else None,
            rollout_kl_coef=ppo.rollout_kl_coef, rollout_kl_estimator=ppo.rollout_kl_estimator,
            use_bias_correction_kl=ppo.use_bias_correction_kl)
    except ValueError as exc:
        name, sep, rest = str(exc).partition(":")
        head, dot, tail = name.partition(".")
        if not sep or " " in name:
            raise
        raise ValueError(f"ppo.{_LOSS_KEYS.get(head, head)}{dot}{tail}:{rest}") from None
