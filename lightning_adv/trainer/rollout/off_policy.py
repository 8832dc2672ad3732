"""Off-policy training in the built-in trainer.

- :class:`RolloutQueue` (``ppo.off_policy_steps: k``): each step samples with the current
  policy (version = training steps done) and trains on the rollout sampled ``k`` steps
  ago, so every batch is exactly ``k`` policy versions stale; the first ``k`` steps only
  sample. A checkpoint records the queue's length, not its rollouts: a resumed run says
  so and starts with an empty queue (``k`` more steps of sampling only).
- :class:`RolloutCopy` (``ppo.rollout_dtype``): sampling runs on a copy of the policy in
  another dtype (bfloat16), refreshed from the trained weights every step: the sampler's
  numbers differ from the trainer's as an inference engine's do, a real mismatch on a CPU.
- :func:`off_policy_batch`: the batch the advantage module reads (``policy_version``;
  bypass mode's old log-probs; decoupled mode's IS weights for the stages that read
  ``rollout_is_weights``). The module aligns ``rollout_logprobs`` like every other
  token-aligned key, and :class:`~lightning_adv.PPOLoss` corrects its policy term in both
  modes (``ppo.rollout_correction``) from the three log-prob streams.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

import torch

from lightning_adv.advantage.alignment import next_token_aligned
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


def off_policy_batch(batch: dict[str, Any], ppo: Any, version: int, staleness: int,
                     reads_weights: bool) -> dict[str, Any]:
    """The step's batch for the advantage module, a new dict (``batch`` is not changed):
    each row's ``policy_version`` (``version - staleness``); in bypass mode the rollout's
    log-probs as the old ones (verl's ``apply_bypass_mode``); in decoupled mode, when a
    stage reads them (``reads_weights``), the IS weights π_old/π_rollout of
    :func:`~lightning_adv.rollout_correction`, the function the loss corrects its policy
    term with in both modes."""
    correction: Optional[RolloutCorrectionConfig] = ppo.rollout_correction
    out = dict(batch)
    rows = batch["input_ids"].shape[0]
    out["policy_version"] = torch.full((rows,), version - staleness, dtype=torch.long,
                                       device=batch["input_ids"].device)
    if correction is not None and correction.bypass_mode:
        out["logprobs"] = batch["rollout_logprobs"]
    elif correction is not None and reads_weights:
        mask = aligned_loss_mask(batch["loss_mask"])  # (decoupled mode recomputes prox_logp)
        found = rollout_correction(batch["prox_logp"].float() * mask,
                                   next_token_aligned(batch, "rollout_logprobs"), mask,
                                   **correction.kwargs())
        if found.weights is not None:
            out["rollout_is_weights"] = found.weights
    return out


def record_off_policy(metrics: OffPolicyMetrics, out: dict[str, Any], ppo: Any,
                      staleness: int) -> None:
    """The step's ``offpolicy/`` metrics from the advantage module's aligned output: the
    staleness, and (decoupled mode) π_old against π_rollout; in bypass mode the update
    records π_θ against π_rollout at every micro-batch."""
    correction: Optional[RolloutCorrectionConfig] = ppo.rollout_correction
    if correction is not None and correction.bypass_mode:
        metrics.update_staleness(staleness, out["loss_mask"].shape[0])
    else:
        metrics.update(out["logprobs"], out["rollout_logprobs"], out["loss_mask"], correction,
                       staleness)


def mean_task_reward(groups: list[list[Any]]) -> float:
    """The mean task reward of the scored episodes of ``groups`` (NaN: none scored)."""
    rewards = [float(ep.reward) for group in groups for ep in group
               if ep.reward is not None and not math.isnan(ep.reward)]
    return sum(rewards) / len(rewards) if rewards else math.nan
