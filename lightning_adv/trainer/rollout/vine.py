"""VinePPO's Monte Carlo step values sampled by the built-in trainer (``ppo.vine``): the
batch keys ``mc_returns`` and ``step_ids`` that estimator ``vine`` reads.

After a rollout is sampled and scored, each response is cut into steps
(:func:`step_starts`: every n generated tokens, after each newline, or at each token
sampled with a low probability). From the state before each step (step 0: the prompt),
``ppo.vine.k`` continuations are sampled with the rollout's sampling settings, as ``k``
samples of one prompt whose first turn already holds the response's tokens up to the
boundary (:attr:`~lightning_adv.trainer.policies.base.GenerationRequest.prefixes`: each
policy reads that prefix once for its ``k`` samples), and scored by the task's reward
exactly as a response is (:func:`~lightning_adv.trainer.rollout.batch.score`). The
continuations never enter the batch: each episode keeps its step ids, the returns per
step and the number of tokens the continuations sampled (``train/vine_tokens``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from lightning_adv.advantage.reward_terms import scale_rewards
from lightning_adv.config import ActorConfig
from lightning_adv.stages.outcome import identity
from lightning_adv.stages.registry import selected_stage
from lightning_adv.trainer.config import PPOConfig, PRMConfig, VineConfig
from lightning_adv.trainer.policies.base import GenerationRequest, Policy
from lightning_adv.trainer.rollout.batch import score
from lightning_adv.trainer.rollout.recipe_inputs import check_sampled_key, check_single_turn
from lightning_adv.trainer.tasks.episode import Episode
from lightning_adv.trainer.tasks.runtime import TaskRuntime


@dataclass(frozen=True)
class StepValueSampling:
    """What :func:`sample_step_values` needs beyond the rollout: ``ppo.vine`` and the actor
    (its per-step discount, and the scaling and clipping it applies to outcome rewards)."""

    config: VineConfig
    actor: ActorConfig


def response_of(ep: Episode) -> tuple[list[int], list[float]]:
    """The generated tokens of a (single-turn) episode and their behaviour log-probs."""
    pairs = [(t, lp) for t, lp, g in zip(ep.tokens, ep.logprobs, ep.generated) if g]
    return [t for t, _ in pairs], [lp for _, lp in pairs]


def step_starts(ep: Episode, config: VineConfig, vocab: Any) -> list[int]:
    """Where the episode's steps begin, as offsets into its generated tokens: 0, then
    every ``every_n_tokens`` tokens, or after each token whose text holds a newline, or
    at each token whose probability (its behaviour log-prob's exponential, the
    temperature-scaled full distribution) is below ``low_prob``."""
    tokens, logprobs = response_of(ep)
    n = len(tokens)
    if n == 0:
        return []
    if config.boundaries == "every_n_tokens":
        return list(range(0, n, config.every_n_tokens))
    if config.boundaries == "newline":
        return [0] + [i + 1 for i in range(n - 1) if "\n" in vocab.decode([tokens[i]])]
    return [0] + [i for i in range(1, n) if math.exp(logprobs[i]) < config.low_prob]


def token_step_ids(ep: Episode, starts: Sequence[int]) -> list[int]:
    """Token-aligned: on each generated token the index of its step, -1 elsewhere."""
    out, offset = [], 0
    for generated in ep.generated:
        if not generated:
            out.append(-1)
            continue
        out.append(bisect.bisect_right(starts, offset) - 1)
        offset += 1
    return out


def continuation_return(cont: Episode, start: int, settings: StepValueSampling,
                        vocab: Any) -> float:
    """The return of a scored continuation from the state before offset ``start``: its
    outcome reward scaled and clipped as the actor does the episodes' (``reward_bias``,
    ``reward_scaling``, ``reward_clip``) plus its turn rewards, all landing in its last
    step, discounted by ``actor.discount`` per step after the first (steps cut by the
    same rule). NaN for an unscorable continuation."""
    after = sum(1 for s in step_starts(cont, settings.config, vocab) if s > start)
    outcome = scale_rewards(torch.tensor([cont.reward], dtype=torch.float64), settings.actor)
    landing = float(outcome[0]) + sum(cont.turn_rewards or ())
    return float(settings.actor.discount) ** after * landing


def _check_continues(cont: Episode, ep: Episode, start: int, policy: Policy) -> None:
    prompt = ep.generated.index(True) if True in ep.generated else len(ep.tokens)
    if cont.tokens[:prompt + start] != ep.tokens[:prompt + start]:
        raise RuntimeError(f"ppo.vine: {type(policy).__name__}.generate did not continue from "
                           f"GenerationRequest.prefixes (a continuation of prompt {ep.index} "
                           f"does not start with the response's first {start} tokens); "
                           f"a policy must honour prefixes for ppo.vine")


@torch.no_grad()
def sample_step_values(policy: Policy, runtime: TaskRuntime, groups: Sequence[Sequence[Episode]],
                       settings: StepValueSampling, request: GenerationRequest,
                       gen: torch.Generator) -> None:
    """Give every scored episode of ``groups`` its ``step_ids``, ``mc_returns`` (one list of
    ``k`` returns per step) and ``continuation_tokens``, sampling the continuations with
    ``policy`` under ``request``'s token limit and sampling settings, drawing from ``gen``."""
    config, vocab = settings.config, runtime.vocab
    episodes = [ep for group in groups for ep in group]
    starts = [step_starts(ep, config, vocab) for ep in episodes]
    for ep, ep_starts in zip(episodes, starts):
        ep.step_ids = token_step_ids(ep, ep_starts)
        ep.mc_returns = [[math.nan] * config.k for _ in ep_starts]
        ep.continuation_tokens = 0
    # One call for every boundary of the step: each rank makes the same number of calls,
    # as a sharded policy's generate (which gathers its weights) needs.
    boundaries = [(j, slot, start) for j, ep_starts in enumerate(starts)
                  for slot, start in enumerate(ep_starts)]
    continued = policy.generate(runtime, replace(
        request, indices=[episodes[j].index for j, _, _ in boundaries], n_samples=config.k,
        last_values=False,
        prefixes=[response_of(episodes[j])[0][:start] for j, _, start in boundaries]), gen)
    score(continued, runtime)
    for (j, slot, start), group in zip(boundaries, continued):
        ep = episodes[j]
        for i, cont in enumerate(group):
            _check_continues(cont, ep, start, policy)
            ep.mc_returns[slot][i] = continuation_return(cont, start, settings, vocab)
            ep.continuation_tokens += sum(cont.generated) - start


def check_vine_options(needs: frozenset[str], actor: ActorConfig, ppo: PPOConfig,
                       prm: PRMConfig, runtime: TaskRuntime) -> None:
    """``ppo.vine`` is set exactly when a stage reads ``mc_returns`` (estimator ``vine``),
    and only where the continuations' returns are what the pipeline makes of the
    episodes' rewards: a single-turn task, outcome rewards only scaled and clipped."""
    check_sampled_key(needs, "mc_returns", "ppo.vine", ppo.vine is not None,
                      readers="actor.advantage.estimator: vine, Monte Carlo step values",
                      example="{k: 4, boundaries: every_n_tokens, every_n_tokens: 4}",
                      unread="set actor.advantage.estimator: vine or ppo.vine: null")
    if ppo.vine is None:
        return
    check_single_turn("ppo.vine", runtime, "continuations are sampled")
    outcome = selected_stage(actor, "outcome_reward_shaping")
    changed = [key for key, on in (
        ("actor.reward_norm", actor.reward_norm is not None),
        ("actor.truncated_reward", actor.truncated_reward is not None),
        ("actor.overlong_reward_penalty", actor.overlong_reward_penalty),
        ("actor.mask_no_eos_with_zero", actor.mask_no_eos_with_zero),
        ("actor.advantage.outcome_reward_shaping", outcome is None or outcome.fn is not identity),
        ("prm.enabled", prm.enabled)) if on]
    if changed:
        raise ValueError(f"ppo.vine: a continuation's return is its task reward, scaled and "
                         f"clipped as the episodes' rewards are (actor.reward_bias, "
                         f"reward_scaling, reward_clip); {', '.join(changed)} would change the "
                         f"episodes' rewards and not the continuations'. Turn them off with "
                         f"ppo.vine (or set ppo.vine: null)")
