"""The rollout of one training step: sampling and scoring episodes, and the SPEC §1 batch.

- :func:`generate_episodes` samples with either policy (the built-in sampler or the
  Hugging Face one) at the run's sampling settings, or greedily;
- :func:`rollout` samples and scores ``ppo.n_samples`` episodes per prompt;
  :func:`sample_until_signal` keeps sampling prompts under ``ppo.dynamic_sampling``;
- :func:`greedy_baselines` is the task reward of one greedy response per prompt
  (``ppo.greedy_baseline``, ReMax's baseline);
- :func:`make_batch` turns the scored episodes into the advantage module's batch, with
  the scoring passes of the policy and the reference (values, ``ref_logp``, ...).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv.batch.grouping import BatchMeta
from lightning_adv.trainer.config import PPOConfig
from lightning_adv.trainer.rollout.dynamic_sampling import DynamicSamplingResult, sample_with_signal
from lightning_adv.trainer.tasks.episode import Episode
from lightning_adv.trainer.rollout.recipe_inputs import anchor_state_ids, baseline_rewards, greedy_rewards
from lightning_adv.trainer.rollout.batch import Scorer, build_batch, score
from lightning_adv.trainer.policies.base import finite_or_raise
from lightning_adv.trainer.policies.tiny_sampling import generate
from lightning_adv.trainer.rollout.scoring import scoring_passes
from lightning_adv.trainer.tasks.runtime import TaskRuntime

Groups = list[list[Episode]]
"""episodes, one list per prompt (its group)"""


@torch.no_grad()
def generate_episodes(policy: torch.nn.Module, runtime: TaskRuntime, indices: Sequence[int],
                      n: int, max_new_tokens: int, ppo: PPOConfig, gen: torch.Generator, *,
                      hf: bool, greedy: bool = False, last_values: bool = True) -> Groups:
    """``n`` episodes per prompt index with the policy (``hf``: a Hugging Face one), at
    ``ppo``'s sampling settings; ``greedy``: the most likely token instead. ``last_values``:
    the built-in sampler reads the last sampled tokens for their values."""
    if not hf:
        return generate(policy, runtime, indices, n, max_new_tokens, ppo.temperature, gen,
                        kv_cache=ppo.kv_cache, greedy=greedy, last_values=last_values)
    from lightning_adv.trainer.policies.hf.sampling import SamplingParams, hf_generate
    from lightning_adv.trainer.policies.sharding import gathered_weights

    # top-k 1 leaves the most likely token alone: the draw is the argmax
    params = (SamplingParams(top_k=1) if greedy else
              SamplingParams(ppo.temperature, ppo.top_k, ppo.top_p))
    # (a sharded policy's weights are gathered once: each rank samples a different number
    # of tokens, so no collective may run per token)
    with gathered_weights(policy):
        return hf_generate(policy, runtime, indices, n, max_new_tokens, params, gen,
                           kv_cache=ppo.kv_cache)


@torch.no_grad()
def rollout(policy: torch.nn.Module, runtime: TaskRuntime, indices: Sequence[int],
            ppo: PPOConfig, max_new_tokens: int, gen: torch.Generator, *, hf: bool,
            scorers: Sequence[Scorer] = (),
            sampler: Optional[torch.nn.Module] = None) -> Groups:
    """Sample and score ``ppo.n_samples`` episodes for each prompt index (the policy in
    eval mode while sampling); ``sampler``: the module that samples instead of ``policy``
    (``ppo.rollout_dtype``'s copy)."""
    policy.eval()
    # The value after an episode's last token is read only when it is used (make_batch
    # sets it to 0 unless ppo.bootstrap_truncated)
    groups = generate_episodes(policy if sampler is None else sampler, runtime, indices,
                               ppo.n_samples, max_new_tokens, ppo, gen, hf=hf,
                               last_values=ppo.bootstrap_truncated and not ppo.off_policy)
    policy.train()
    score(groups, runtime, scorers)
    return groups


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


@torch.no_grad()
def greedy_baselines(policy: torch.nn.Module, runtime: TaskRuntime, indices: Sequence[int],
                     ppo: PPOConfig, max_new_tokens: int, *, hf: bool) -> list[float]:
    """The task reward of one greedy response per prompt (``ppo.greedy_baseline``)."""
    if not hf:
        return greedy_rewards(policy, runtime, indices, max_new_tokens, ppo.kv_cache)
    policy.eval()
    groups = generate_episodes(policy, runtime, indices, 1, max_new_tokens, ppo,
                               torch.Generator(), hf=True, greedy=True)
    policy.train()
    score(groups, runtime)
    return baseline_rewards(groups)


@torch.no_grad()
def make_batch(groups: Groups, policy: torch.nn.Module, ref_policy: Optional[torch.nn.Module],
               ppo: PPOConfig, *, multi_turn: bool, process_rewards: bool, critic: bool,
               recompute_logprob: bool, recipe_inputs: frozenset[str], device: torch.device,
               reward_baselines: Optional[list[float]] = None
               ) -> tuple[dict[str, Any], BatchMeta]:
    """The SPEC §1 batch: episodes, then values / ref_logp / prox_logp from model passes
    (over ``ppo.forward_batch_size`` rows at a time), and the optional keys the
    advantage stages read (``recipe_inputs``). Off-policy (``ppo.off_policy``) the batch
    also holds the sampler's ``rollout_logprobs``, and the critic's values come from the
    trained policy, not from the sampler's pass (an older or cast copy)."""
    batch, meta = build_batch(groups, multi_turn=multi_turn, process_rewards=process_rewards,
                              rollout_logprobs=ppo.off_policy)
    batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
    ids, attention = batch["input_ids"], batch["attention_mask"].float()
    next_real = torch.nn.functional.pad(attention[:, 1:], (0, 1))  # token t+1 exists
    sampled_values = batch.pop("values", None)
    # The sampler's cached pass already read every token: its values serve unless the
    # log-probs are recomputed anyway.
    fresh_values = critic and (recompute_logprob or sampled_values is None or ppo.off_policy)
    # A prompt's samples share its tokens (the reference reads them once)
    generated = batch["loss_mask"] > 0
    sizes = set(meta.traj_group_sizes)
    prompts = ((generated.int().argmax(1), sizes.pop())
               if len(sizes) == 1 and bool(generated.any(1).all()) else None)
    passes = scoring_passes(policy, ref_policy, ids, attention.sum(1).long(), ppo.temperature,
                            values=fresh_values, logprobs=recompute_logprob,
                            pi_squared="sum_pi_squared" in recipe_inputs,
                            rows=ppo.forward_batch_size, prompts=prompts)
    if critic:
        values = passes["values"] if fresh_values else sampled_values
        batch["values"] = critic_values(values, attention, ppo.bootstrap_truncated)
    for key in ("prox_logp", "ref_logp", "sum_pi_squared"):
        if key in passes:
            batch[key] = passes[key] * next_real
    if "anchor_state_ids" in recipe_inputs:
        episodes = [ep for group in groups for ep in group]
        batch["anchor_state_ids"] = anchor_state_ids(episodes, ids.shape[1]).to(device)
    if reward_baselines is not None:
        sizes = torch.tensor(meta.traj_group_sizes, device=device)
        batch["reward_baselines"] = torch.repeat_interleave(
            torch.tensor(reward_baselines, dtype=torch.float32, device=device), sizes)
    return batch, meta


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


@torch.no_grad()
def evaluation_episodes(policy: torch.nn.Module, runtime: TaskRuntime, indices: Sequence[int],
                        ppo: PPOConfig, max_new_tokens: int, n_samples: int,
                        gen: torch.Generator, *, hf: bool) -> tuple[Groups, Groups]:
    """One greedy and ``n_samples`` sampled episodes per prompt, scored (held-out
    evaluation)."""
    greedy = generate_episodes(policy, runtime, indices, 1, max_new_tokens, ppo, gen, hf=hf,
                               greedy=True)
    sampled = generate_episodes(policy, runtime, indices, n_samples, max_new_tokens, ppo, gen,
                                hf=hf)
    score(greedy, runtime)
    score(sampled, runtime)
    return greedy, sampled
