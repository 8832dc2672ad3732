"""Log-probs and entropies of the sampling distribution, from a policy's logits: the plain
path.

Every function here takes ``torch.log_softmax`` of the temperature-scaled logits over the
whole ``[..., V]`` tensor. :class:`~.base.Policy` scores and trains through them by
default; an implementation may compute the same numbers faster (the built-in policy's
written-out log-softmax over its few dozen tokens, a Hugging Face policy's chunked
reduction over a large vocabulary, :mod:`.token_stats`), and its tests compare those with
these functions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def scaled_log_softmax(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)`` over the vocabulary, in float32."""
    scaled = logits.float()
    if temperature != 1.0:  # (dividing by 1 changes nothing but costs a pass and its backward)
        scaled = scaled / temperature
    return torch.log_softmax(scaled, dim=-1)


def entropy_of_logprobs(logp: Tensor, with_grad: bool = True) -> Tensor:
    """``-sum(p * log p)`` over the last dimension of the log-probs ``logp``. With
    ``with_grad`` false it is computed outside the autograd graph: a loss that only
    reports the entropy needs no graph (nor its memory) for it."""
    with torch.set_grad_enabled(with_grad and torch.is_grad_enabled()):
        source = logp if with_grad else logp.detach()
        return -(source.exp() * source).sum(-1)


def next_token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-prob of token ``t+1`` at position ``t`` (next-token convention); last column 0."""
    logp = scaled_log_softmax(logits[:, :-1], temperature)
    picked = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return F.pad(picked, (0, 1))


def logprobs_and_entropy(logits: Tensor, input_ids: Tensor, temperature: float = 1.0,
                         entropy_grad: bool = True) -> tuple[Tensor, Tensor]:
    """:func:`next_token_logprobs` and the entropy at every position ``[B, T]``, from one
    log-softmax; ``entropy_grad=False`` computes the entropy outside the autograd graph."""
    logp = scaled_log_softmax(logits, temperature)
    picked = F.pad(logp[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1), (0, 1))
    return picked, entropy_of_logprobs(logp, entropy_grad)


def next_token_entropy(logits: Tensor, temperature: float) -> Tensor:
    """[B, T]: the entropy of ``softmax(logits_t / temperature)`` (the distribution of token
    t+1; the caller masks positions without a next token), without gradients."""
    return entropy_of_logprobs(scaled_log_softmax(logits, temperature), with_grad=False)


def sum_pi_squared(logits: Tensor, temperature: float) -> Tensor:
    """[B, T]: ``sum_v softmax(logits_t / temperature)_v ** 2`` (position t predicts token
    t+1; the caller masks positions without a next token)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return (probs * probs).sum(dim=-1)
