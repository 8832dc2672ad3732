"""The rollout of one training step: :class:`Rollout`, built once per run.

- :meth:`Rollout.sample` samples and scores ``ppo.n_samples`` episodes per prompt (as a
  tree under ``ppo.tree``, :mod:`.tree`; under ``ppo.vine`` also the continuations of
  their step values, :mod:`.vine`);
  :func:`sample_until_signal` keeps sampling prompts under ``ppo.dynamic_sampling``;
- :meth:`Rollout.greedy_rewards` is the task reward of one greedy response per prompt
  (``ppo.greedy_baseline``, ReMax's baseline);
- :meth:`Rollout.evaluate` samples and scores held-out prompts (greedy and sampled);
- :meth:`Rollout.batch` turns the scored episodes into the advantage module's batch, with
  the scoring passes of the policy and the reference (values, ``ref_logp``, ...).

Every call goes through the :class:`~lightning_adv.trainer.policies.base.Policy`
interface: the rollout never asks which policy it holds.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.trainer.config import PPOConfig
from lightning_adv.trainer.policies.base import (
    GenerationRequest, Policy, PromptGroups, SamplingParams, ScoreRequest, finite_or_raise)
from lightning_adv.trainer.rollout.batch import Scorer, build_batch, score
from lightning_adv.trainer.rollout.dynamic_sampling import DynamicSamplingResult, sample_with_signal
from lightning_adv.trainer.rollout.recipe_inputs import anchor_state_ids, baseline_rewards
from lightning_adv.trainer.rollout.scoring import scoring_passes
from lightning_adv.trainer.rollout.tree import sample_tree
from lightning_adv.trainer.rollout.vine import StepValueSampling, sample_step_values
from lightning_adv.trainer.tasks.episode import Episode
from lightning_adv.trainer.tasks.runtime import TaskRuntime

Groups = list[list[Episode]]
"""episodes, one list per prompt (its group)"""


@dataclass(frozen=True)
class BatchKeys:
    """Which keys a step's batch carries beyond the rollout's own."""

    critic: bool = False
    """the critic's ``values``"""
    recompute_logprob: bool = False
    """``prox_logp``: the old log-probs recomputed by the trained policy"""
    recipe_inputs: frozenset[str] = frozenset()
    """optional keys the advantage stages read (``sum_pi_squared``, ``anchor_state_ids``)"""


class Rollout:
    """Sampling, scoring and batching with one policy (and its reference) on one task."""

    def __init__(self, policy: Policy, reference: Optional[Any], runtime: TaskRuntime,
                 ppo: PPOConfig, *, scorers: Sequence[Scorer] = (), keys: BatchKeys = BatchKeys(),
                 vine: Optional[StepValueSampling] = None):
        self.policy, self.reference, self.runtime, self.ppo = policy, reference, runtime, ppo
        self.scorers, self.keys, self.vine = tuple(scorers), keys, vine
        self.max_new_tokens = ppo.max_new_tokens or runtime.task.max_new_tokens
        self.sampling = SamplingParams(ppo.temperature, ppo.top_k, ppo.top_p,
                                       kv_cache=ppo.kv_cache)

    def request(self, indices: Sequence[int], n: int, *, greedy: bool = False,
                last_values: bool = True) -> GenerationRequest:
        sampling = replace(self.sampling, greedy=True) if greedy else self.sampling
        return GenerationRequest(list(indices), n, self.max_new_tokens, sampling, last_values)

    @torch.no_grad()
    def sample(self, indices: Sequence[int], gen: torch.Generator,
               sampler: Optional[Policy] = None) -> Groups:
        """Sample and score ``ppo.n_samples`` episodes for each prompt index (the policy in
        eval mode while sampling; under ``ppo.tree`` as a tree, :mod:`.tree`); ``sampler``:
        the module that samples instead of the policy (``ppo.rollout_dtype``'s copy). Under ``ppo.vine`` the same sampler then
        samples each episode's continuations from ``gen`` (:mod:`.vine`)."""
        # The value after an episode's last token is read only when it is used (the batch
        # sets it to 0 unless ppo.bootstrap_truncated)
        request = self.request(indices, self.ppo.n_samples, last_values=(
            self.ppo.bootstrap_truncated and not self.ppo.off_policy))
        self.policy.eval()
        if self.ppo.tree is not None:
            groups = sample_tree(sampler or self.policy, self.runtime, request, self.ppo.tree, gen)
        else:
            groups = (sampler or self.policy).generate(self.runtime, request, gen)
        score(groups, self.runtime, self.scorers)
        self.policy.train()
        if self.vine is not None:
            self.step_values(groups, gen, sampler)
        return groups

    @torch.no_grad()
    def step_values(self, groups: Groups, gen: torch.Generator,
                    sampler: Optional[Policy] = None) -> None:
        """``ppo.vine``: sample and score the continuations from every step boundary of the
        scored ``groups`` (:func:`~.vine.sample_step_values`), the policy in eval mode."""
        assert self.vine is not None, "step_values without ppo.vine"
        was_training = self.policy.training
        self.policy.eval()
        sample_step_values(sampler or self.policy, self.runtime, groups, self.vine,
                           self.request([], 1), gen)
        self.policy.train(was_training)

    @torch.no_grad()
    def greedy_rewards(self, indices: Sequence[int]) -> list[float]:
        """The task reward of one greedy response per prompt (``ppo.greedy_baseline``)."""
        was_training = self.policy.training
        self.policy.eval()
        groups = self.policy.generate(self.runtime, self.request(indices, 1, greedy=True),
                                      torch.Generator())
        self.policy.train(was_training)
        score(groups, self.runtime)
        return baseline_rewards(groups)

    @torch.no_grad()
    def evaluate(self, indices: Sequence[int], n_samples: int, gen: torch.Generator
                 ) -> tuple[Groups, Groups]:
        """One greedy and ``n_samples`` sampled episodes per prompt, scored (held-out
        evaluation)."""
        greedy = self.policy.generate(self.runtime, self.request(indices, 1, greedy=True), gen)
        sampled = self.policy.generate(self.runtime, self.request(indices, n_samples), gen)
        score(greedy, self.runtime)
        score(sampled, self.runtime)
        return greedy, sampled

    @torch.no_grad()
    def batch(self, groups: Groups, device: torch.device,
              reward_baselines: Optional[list[float]] = None) -> tuple[dict[str, Any], BatchMeta]:
        """The SPEC §1 batch: episodes, then values / ref_logp / prox_logp from model passes
        (over ``ppo.forward_batch_size`` rows at a time), and the optional keys the
        advantage stages read. Off-policy (``ppo.off_policy``) the batch also holds the
        sampler's ``rollout_logprobs``, and the critic's values come from the trained
        policy, not from the sampler's pass (an older or cast copy)."""
        ppo, keys = self.ppo, self.keys
        batch, meta = build_batch(groups, multi_turn=self.runtime.task.max_turns > 1,
                                  process_rewards=bool(self.scorers),
                                  rollout_logprobs=ppo.off_policy)
        batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
        ids, attention = batch["input_ids"], batch["attention_mask"].float()
        sampled_values = batch.pop("values", None)
        # The sampler's cached pass already read every token: its values serve unless the
        # log-probs are recomputed anyway.
        fresh_values = keys.critic and (keys.recompute_logprob or sampled_values is None
                                        or ppo.off_policy)
        want = ({"values"} if fresh_values else set()) | (
            {"logprobs"} if keys.recompute_logprob else set()) | (
            {"sum_pi_squared", "entropies"} & keys.recipe_inputs)
        request = ScoreRequest(frozenset(want), ppo.temperature, prompt_groups(batch, meta))
        passes = scoring_passes(self.policy, self.reference, ids, attention.sum(1).long(),
                                request, ppo.forward_batch_size)
        if keys.critic:
            values = passes["values"] if fresh_values else sampled_values
            batch["values"] = critic_values(values, attention, ppo.bootstrap_truncated)
        for key in ("prox_logp", "ref_logp", "sum_pi_squared", "entropies"):
            if key in passes:
                batch[key] = passes[key]
        if "anchor_state_ids" in keys.recipe_inputs:
            episodes = [ep for group in groups for ep in group]
            batch["anchor_state_ids"] = anchor_state_ids(episodes, ids.shape[1]).to(device)
        if reward_baselines is not None:
            sizes = torch.tensor(meta.traj_group_sizes, device=device)
            batch["reward_baselines"] = torch.repeat_interleave(
                torch.tensor(reward_baselines, dtype=torch.float32, device=device), sizes)
        return batch, meta


def prompt_groups(batch: dict[str, Any], meta: BatchMeta) -> Optional[PromptGroups]:
    """Each row's prompt length and the smallest size of the groups of consecutive rows
    that share their prompt (a prompt's samples; a tree's leaves, whose number varies),
    when every row has a generated token; else None."""
    generated = batch["loss_mask"] > 0
    if not meta.traj_group_sizes or not bool(generated.any(1).all()):
        return None
    return PromptGroups(generated.int().argmax(1), min(meta.traj_group_sizes))


def sample_until_signal(rollout_fn: Callable[[list[int]], Groups], indices: list[int],
                        pool: int, prompts: torch.Generator, max_rounds: int,
                        step: int) -> DynamicSamplingResult:
    """DAPO's dynamic sampling: roll out ``indices``, then prompts drawn from the pool of
    ``pool`` with ``prompts``, keeping only groups whose rewards differ, for at most
    ``max_rounds`` rounds; warns when the step stays short of such groups."""

    def draw(n: int) -> list[int]:
        return torch.randint(pool, (n,), generator=prompts).tolist()

    result = sample_with_signal(indices, rollout_fn, draw, max_rounds)
    if result.short:
        warnings.warn(f"ppo.dynamic_sampling: after {result.rounds} rounds (max_rounds) only "
                      f"{len(result.groups) - len(result.topped_up)} of {len(indices)} prompt "
                      f"groups have differing rewards; training step {step} on them and "
                      f"{len(result.topped_up)} groups of equal rewards", UserWarning,
                      stacklevel=3)
    return result


def critic_values(values: Tensor, attention: Tensor, bootstrap_truncated: bool) -> Tensor:
    """The critic's values of the batch, 0 at padding; without ``bootstrap_truncated`` also
    0 after each row's last token."""
    values = finite_or_raise(values.float(), "values") * attention
    if not bootstrap_truncated:
        # The core bootstraps truncated rows with the value after their last
        # token; here the token limit is terminal, so that state's value is 0.
        last = attention.sum(1).long() - 1
        values[torch.arange(len(last), device=values.device), last] = 0.0
    return values
