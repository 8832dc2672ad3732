"""TRL 1.16's GRPO loss, run as released: ``GRPOTrainer._compute_loss`` called on a stand-in
for the trainer that holds only what the loss reads (no model, no accelerator), with the
current policy's per-token log-probs given instead of a forward pass.

    loss = trl_grpo_loss(logps, old, advantages, mask, loss_type="cispo", epsilon_high=5.0)
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any, Optional

import torch
from torch import Tensor

from tests.support.peers import TRL_GRPO_TRAINER, peer_module


class _Accelerator:
    num_processes = 1

    @staticmethod
    def gather(x: Tensor) -> Tensor:
        return x

    gather_for_metrics = gather

    @staticmethod
    def reduce(x: Tensor, reduction: str = "sum") -> Tensor:
        return x


def trl_grpo_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor, *,
                  loss_type: str, epsilon: float = 0.2, epsilon_high: Optional[float] = None,
                  importance_sampling_level: str = "token", beta: float = 0.0,
                  ref_logps: Optional[Tensor] = None, use_bias_correction_kl: bool = False,
                  importance_sampling_ratio: Optional[Tensor] = None,
                  max_completion_length: Optional[int] = None, **args: Any) -> Tensor:
    """TRL's loss of one micro-batch (gradient accumulation 1, one process) for the
    completion log-probs ``logps`` ``[B, T]`` (differentiable), the old ones, per-token or
    per-row advantages and the completion mask. ``args`` are GRPOConfig fields the loss
    reads (``sapo_temperature_pos``, ``vespo_k_pos``, ``delta``, ...)."""
    grpo = peer_module(*TRL_GRPO_TRAINER)
    b, t = logps.shape
    defaults = dict(delta=None, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                    vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0,
                    steps_per_generation=1)  # GRPOConfig's defaults
    trl_args = SimpleNamespace(use_bias_correction_kl=use_bias_correction_kl,
                               **{**defaults, **args})
    vllm = importance_sampling_ratio is not None
    stub = SimpleNamespace(
        model=SimpleNamespace(training=True), loss_type=loss_type,
        importance_sampling_level=importance_sampling_level, off_policy_mask_threshold=None,
        top_entropy_quantile=1.0, beta=beta, args=trl_args, epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high, use_vllm=vllm,
        vllm_importance_sampling_correction=vllm, current_gradient_accumulation_steps=1,
        accelerator=_Accelerator(), _metrics=defaultdict(lambda: defaultdict(list)),
        _entropy_bonus_enabled=False, aux_loss_enabled=False,
        max_completion_length=max_completion_length or t)
    stub._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps), None)
    stub.get_gamma_weights = grpo.GRPOTrainer.get_gamma_weights  # TRL's own static methods
    stub.get_off_policy_mask = grpo.GRPOTrainer.get_off_policy_mask
    inputs = {
        "prompt_ids": torch.zeros(b, 1, dtype=torch.long),
        "prompt_mask": torch.ones(b, 1, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old_logps,
        "num_items_in_batch": mask.sum(),
    }
    if ref_logps is not None:
        inputs["ref_per_token_logps"] = ref_logps
    if vllm:
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    return grpo.GRPOTrainer._compute_loss(stub, None, inputs)
