"""Off-policy training in the built-in trainer.

- :class:`RolloutQueue` (``ppo.off_policy_steps: k``): each step samples with the current
  policy (version = training steps done) and trains on the rollout sampled ``k`` steps
  ago, so every batch is exactly ``k`` policy versions stale; the first ``k`` steps only
  sample. A checkpoint records the queue's length, not its rollouts: a resumed run says
  so and starts with an empty queue (``k`` more steps of sampling only).
- :class:`RolloutCopy` (``ppo.rollout_dtype``): sampling runs on a copy of the policy in
  another dtype (bfloat16), refreshed from the trained weights every step: the sampler's
  numbers differ from the trainer's as an inference engine's do, a real mismatch on a CPU.
- :func:`correct_rollout` (``ppo.rollout_correction``, decoupled mode): the rollout
  correction of the batch, once per step before the advantages, from the recomputed
  old log-probs (π_old, ``prox_logp``) and the sampler's (π_rollout); its weights reach
  the stages that read ``rollout_is_weights`` and the loss's policy term, its rejection
  the policy term only.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.advantage.alignment import shift_left
from lightning_adv.batch.validation import aligned_loss_mask
from lightning_adv.losses.rollout_correction import RolloutCorrectionConfig, rollout_correction
from lightning_adv.metrics.off_policy_metrics import OffPolicyMetrics

ROLLOUT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class QueuedRollout:
    """One step's scored rollout, waiting to be trained on."""

    groups: list[list[Any]]
    sampled: list[list[Any]]
    """the first sampling round's groups (the reward metrics' unbiased sample)"""
    baselines: Optional[list[float]]
    """ReMax's greedy rewards, from the policy that sampled"""
    version: int
    """the policy version (training steps done) that sampled it"""


class RolloutQueue:
    """A FIFO of ``delay`` rollouts: :meth:`exchange` puts this step's in and returns the
    one sampled ``delay`` steps ago (None while the queue fills)."""

    def __init__(self, delay: int):
        self.delay = delay
        self.entries: deque[QueuedRollout] = deque()

    def __len__(self) -> int:
        return len(self.entries)

    def exchange(self, entry: QueuedRollout) -> Optional[QueuedRollout]:
        self.entries.append(entry)
        return self.entries.popleft() if len(self.entries) > self.delay else None

    def state(self) -> dict[str, Any]:
        return {"delay": self.delay, "queued": len(self.entries),
                "versions": [e.version for e in self.entries]}

    def restore(self, state: Optional[dict[str, Any]]) -> None:
        """Rollouts are not saved in checkpoints: say so when some were queued."""
        self.entries.clear()
        if state and state.get("queued"):
            warnings.warn(f"ppo.off_policy_steps: the checkpoint was saved with "
                          f"{state['queued']} queued rollouts (sampled at steps "
                          f"{state.get('versions')}), which checkpoints do not hold; the "
                          f"resumed run starts with an empty queue and samples "
                          f"{self.delay} steps before it trains again", UserWarning,
                          stacklevel=3)


class RolloutCopy:
    """The sampling policy in ``dtype``: a copy of the trained one, its weights refreshed
    (cast) at every call. Not a submodule: it is neither trained nor checkpointed."""

    def __init__(self, dtype: str):
        self.dtype = ROLLOUT_DTYPES[dtype]
        self.module: Optional[torch.nn.Module] = None

    @torch.no_grad()
    def __call__(self, policy: torch.nn.Module) -> torch.nn.Module:
        if self.module is None:
            self.module = copy.deepcopy(policy).to(self.dtype)
            self.module.requires_grad_(False)
        else:
            self.module.load_state_dict(policy.state_dict())  # copy_ casts to the dtype
        self.module.eval()
        return self.module


def off_policy_parts(ppo: Any) -> tuple[OffPolicyMetrics, RolloutQueue, Optional[RolloutCopy]]:
    """The trainer's off-policy state: its ``offpolicy/`` metrics, the queue of
    ``ppo.off_policy_steps`` and the sampling copy of ``ppo.rollout_dtype`` (None: the
    policy samples itself)."""
    sampler = RolloutCopy(ppo.rollout_dtype) if ppo.rollout_dtype else None
    return OffPolicyMetrics(dist_sync_on_step=False), RolloutQueue(ppo.off_policy_steps), sampler


@dataclass
class CorrectedBatch:
    """The aligned (next-token) tensors the update reads beside the advantage output."""

    rollout_logprobs: Tensor
    rollout_is_weights: Optional[Tensor]
    rollout_rs_mask: Optional[Tensor]

    def loss_inputs(self) -> dict[str, Optional[Tensor]]:
        return {"rollout_logprobs": self.rollout_logprobs,
                "rollout_is_weights": self.rollout_is_weights,
                "rollout_rs_mask": self.rollout_rs_mask}


def aligned(batch: dict[str, Any], key: str, mask: Tensor) -> Tensor:
    """A token-aligned batch key (``logprobs``, ``rollout_logprobs``) moved to the
    next-token convention, 0 off ``mask`` (the advantage module's shift)."""
    return shift_left(batch[key].float()) * mask


def correct_rollout(batch: dict[str, Any], ppo: Any, recompute: bool, metrics: OffPolicyMetrics,
                    version: int, staleness: int, reads_weights: bool) -> CorrectedBatch:
    """The step's rollout correction (decoupled mode; bypass mode's runs in the loss) and
    its metrics. Adds to ``batch`` each row's ``policy_version`` (``version - staleness``),
    ``rollout_is_weights`` when a stage reads them, and in bypass mode replaces its
    ``logprobs`` (the old ones) with the rollout's, as verl's ``apply_bypass_mode``."""
    correction: Optional[RolloutCorrectionConfig] = ppo.rollout_correction
    rows = batch["input_ids"].shape[0]
    batch["policy_version"] = torch.full((rows,), version - staleness, dtype=torch.long,
                                         device=batch["input_ids"].device)
    if correction is not None and correction.bypass_mode:
        batch["logprobs"] = batch["rollout_logprobs"]
    mask = aligned_loss_mask(batch["loss_mask"])
    rollout = aligned(batch, "rollout_logprobs", mask)
    old = batch["prox_logp"].float() * mask if recompute else aligned(batch, "logprobs", mask)
    if correction is not None and correction.bypass_mode:
        # π_old is π_rollout here; the loss records π_θ against it (ppo_update)
        metrics.update_staleness(staleness, mask.shape[0])
        return CorrectedBatch(rollout, None, None)
    metrics.update(old, rollout, mask, correction, staleness)
    if correction is None:
        return CorrectedBatch(rollout, None, None)
    found = rollout_correction(old, rollout, mask, **correction.kwargs())
    if reads_weights and found.weights is not None:
        batch["rollout_is_weights"] = found.weights
    rs_mask = found.loss_mask if correction.rollout_rs is not None else None
    return CorrectedBatch(rollout, found.weights, rs_mask)


def mean_task_reward(groups: list[list[Any]]) -> float:
    """The mean task reward of the scored episodes of ``groups`` (NaN: none scored)."""
    rewards = [float(ep.reward) for group in groups for ep in group
               if ep.reward is not None and not math.isnan(ep.reward)]
    return sum(rewards) / len(rewards) if rewards else math.nan
