"""What the trainer asks of a policy: :class:`Policy`.

The trainer calls a policy in four places, and only through this interface:

- **sampling** (:meth:`Policy.generate`): episodes for prompt indices, each sampled token
  with the sampler's log-prob;
- **scoring** (:meth:`Policy.token_scores`): per-token values, next-token log-probs,
  ``sum_pi_squared`` and entropies of a right-padded batch, without gradients;
- **the update** (:meth:`Policy.train_forward`): next-token log-probs, values and entropies
  with gradients;
- **the run around it**: the frozen reference (:meth:`Policy.reference`), export
  (:meth:`Policy.export`), device checks and sharding.

The base class computes scores and the update's forward the plain way, from
``forward(input_ids) -> (logits, values)`` and :mod:`.logprobs`; an implementation
overrides them with its shortcuts (a KV cache, a selected-position forward, prompt
sharing, a chunked log-softmax), each tested equal to this plain path.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor, nn

from lightning_adv.trainer.policies.logprobs import (
    logprobs_and_entropy, next_token_entropy, next_token_logprobs, sum_pi_squared)

if TYPE_CHECKING:
    from lightning_adv.trainer.tasks.episode import Episode
    from lightning_adv.trainer.tasks.runtime import TaskRuntime

SCORES = frozenset({"values", "logprobs", "sum_pi_squared", "entropies"})
"""what :meth:`Policy.token_scores` can compute"""


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is drawn."""

    temperature: float = 1.0
    top_k: int = 0
    """keep the k most likely tokens (0: all)"""
    top_p: float = 1.0
    """keep the smallest set of tokens whose probability reaches top_p (1.0: all)"""
    greedy: bool = False
    """take the most likely token (no draw)"""
    kv_cache: bool = True
    """read only the tokens a row has not read yet (false: re-read every prefix; the same
    samples, slower: the benchmarks' baseline)"""


@dataclass(frozen=True)
class GenerationRequest:
    """Which episodes :meth:`Policy.generate` samples, and how."""

    indices: Sequence[int]
    """prompt indices of the task"""
    n_samples: int
    """episodes per prompt (one prompt group)"""
    max_new_tokens: int
    """token limit of one policy turn"""
    sampling: SamplingParams = SamplingParams()
    last_values: bool = True
    """a policy whose sampler reads values reads the tokens sampled last for theirs too
    (false: the value after an episode's last token stays 0)"""
    prefixes: Optional[Sequence[Sequence[int]]] = None
    """per prompt index, tokens its first policy turn already holds (``ppo.vine``'s step
    boundaries): each of its episodes starts from the prompt and these tokens (generated,
    log-prob 0: not sampled by this call) and samples on from there; the turn's token
    limit and stop strings count them. None: every episode starts from its prompt"""


@dataclass(frozen=True)
class PromptGroups:
    """Consecutive rows of a batch in groups of ``size`` that share their prompt (a prompt's
    samples), and each row's prompt length: a policy may read each prompt once."""

    prompt_lengths: Tensor
    size: int


@dataclass(frozen=True)
class ScoreRequest:
    """What :meth:`Policy.token_scores` computes."""

    want: frozenset[str]
    """some of :data:`SCORES`"""
    temperature: float = 1.0
    prompts: Optional[PromptGroups] = None


class Policy(nn.Module):
    """A policy the trainer can sample from, score and train (see the module's text)."""

    value_head: Optional[nn.Module]
    """the critic's head (None: no critic)"""
    export_name: Optional[str] = None
    """the folder of the run directory :meth:`export` writes (None: no export)"""

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """``[B, T]`` right-padded token ids -> (logits ``[B, T, V]``, values ``[B, T]`` or
        None); position ``t`` has read tokens ``0..t``."""
        raise NotImplementedError

    def generate(self, runtime: "TaskRuntime", request: GenerationRequest,
                 gen: torch.Generator) -> list[list["Episode"]]:
        """``request.n_samples`` episodes for each prompt index, one list per prompt; every
        generated token with its log-prob under the temperature-scaled distribution."""
        raise NotImplementedError

    def token_scores(self, ids: Tensor, lengths: Tensor, request: ScoreRequest
                     ) -> dict[str, Tensor]:
        """The ``request.want`` scores of the right-padded rows ``ids`` (real lengths
        ``lengths``), each ``[B, T]`` float32: ``values`` at the real tokens,
        ``logprobs`` (of token t+1 at position t), ``sum_pi_squared`` and ``entropies`` (of
        the distribution of token t+1) at the tokens that have a next one, 0 elsewhere."""
        logits, values = self(ids)
        return plain_scores(logits, values, ids, lengths, request)

    def train_forward(self, ids: Tensor, active: Tensor, temperature: float,
                      entropy_grad: bool, prompts: Optional[PromptGroups] = None
                      ) -> tuple[Tensor, Optional[Tensor], Tensor]:
        """Next-token log-probs, values (None without a critic) and entropies ``[B, T]``
        with gradients, at least at the positions ``active`` (the loss mask's) the loss
        reads; ``prompts``: each row's prompt length and the rollout's group size (rows
        with the same prompt may read it once). ``entropy_grad`` false: the entropy is only
        reported (no graph)."""
        logits, values = self(ids)
        logprobs, entropy = logprobs_and_entropy(logits, ids, temperature, entropy_grad)
        return logprobs, values, entropy

    def reference(self) -> "Policy":
        """A frozen copy of this policy as it is now (call before training): the reference
        of the KL terms, without a value head."""
        reference = copy.deepcopy(self)
        reference.value_head = None
        reference.requires_grad_(False)
        return reference.eval()

    def export(self, directory: str, trainer: Any) -> Optional[str]:
        """Write the trained policy for inference (on rank 0 of ``trainer``'s run; every
        rank calls it); the directory written, or None for a policy with no export."""
        return None

    def check_device(self, device: torch.device) -> None:
        """Refuse a device the policy's settings cannot run on (before training)."""

    def shard(self, strategy: Any, reference: Any) -> None:
        """Shard this policy and its ``reference`` over ``strategy``'s data-parallel mesh
        (FSDP2, Lightning's ``ModelParallelStrategy``); a policy that cannot be sharded
        refuses before asking the strategy for its mesh."""
        raise ValueError(f"trainer.strategy: FSDP2 shards Hugging Face policies "
                         f"(model.policy.pretrained), not a {type(self).__name__}; use "
                         f"--trainer.strategy=ddp")


@dataclass(frozen=True)
class LogitReductions:
    """How :func:`plain_scores` reduces a pass's ``[B, T, V]`` logits to ``[B, T]`` scores
    (an implementation may pass its own, e.g. chunked over a large vocabulary)."""

    logprobs: Callable[..., Tensor] = next_token_logprobs
    """``logprobs(logits, ids, temperature)``"""
    pi_squared: Callable[..., Tensor] = sum_pi_squared
    """``pi_squared(logits, temperature)``"""
    entropy: Callable[..., Tensor] = next_token_entropy
    """``entropy(logits, temperature)``"""


def plain_scores(logits: Tensor, values: Optional[Tensor], ids: Tensor, lengths: Tensor,
                 request: ScoreRequest, reductions: LogitReductions = LogitReductions()
                 ) -> dict[str, Tensor]:
    """:meth:`Policy.token_scores` from a full pass's ``logits`` and ``values``, the logits
    reduced by ``reductions``."""
    columns = torch.arange(ids.shape[1], device=ids.device)
    has_next = (columns[None] < (lengths - 1)[:, None]).float()
    out = {}
    if "values" in request.want:
        assert values is not None, "values requested of a policy without a value head"
        out["values"] = values.float() * (columns[None] < lengths[:, None])
    if "logprobs" in request.want:
        out["logprobs"] = reductions.logprobs(logits, ids, request.temperature).float() * has_next
    if "sum_pi_squared" in request.want:
        out["sum_pi_squared"] = (reductions.pi_squared(logits, request.temperature).float()
                                 * has_next)
    if "entropies" in request.want:
        out["entropies"] = reductions.entropy(logits, request.temperature).float() * has_next
    return out


def finite_or_raise(x: Tensor, what: str) -> Tensor:
    # -1e9 logits of banned tokens give finite log-probs; NaN or inf means divergence.
    if not bool(torch.isfinite(x).all()):
        raise FloatingPointError(f"{what}: the policy produced non-finite values (diverged "
                                 f"training? lower ppo.lr or raise ppo.max_grad_norm clipping)")
    return x
