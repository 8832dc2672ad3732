"""Log-probs and entropies of the sampling distribution, from a policy's logits.

The sampler, the scoring passes and the update all go through these functions, so the
same logits give the same numbers everywhere. Over a vocabulary of at most
:data:`SMALL_VOCAB` tokens the log-softmax is written out; over a larger one (a Hugging
Face model's) the logits are reduced in chunks of rows
(:mod:`~lightning_adv.trainer.policies.token_stats`), with no full-size float32 copy.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_adv.trainer.policies.token_stats import token_stats

#: Up to this vocabulary size the log-softmax is written out (see below).
SMALL_VOCAB = 256


def scaled_log_softmax(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)`` over the vocabulary; the built-in sampler and
    the trainer use this one function, so the same logits give the same log-probs (the
    trainer's passes over a large vocabulary reduce the logits in chunks instead, with the
    same arithmetic: :mod:`~lightning_adv.trainer.policies.token_stats`).

    Over a vocabulary of a few dozen tokens torch's fused kernel is two to three times
    slower on CPU (forward and backward) than four written-out operations, which take
    the max as a constant shift (it cancels in the value and in the gradient); over a
    large vocabulary (a Hugging Face model's) the fused kernel is faster and needs no
    full-size temporaries, so it is used there."""
    scaled = logits.float()
    if temperature != 1.0:  # (dividing by 1 changes nothing but costs a pass and its backward)
        scaled = scaled / temperature
    if scaled.shape[-1] > SMALL_VOCAB:
        return torch.log_softmax(scaled, dim=-1)
    shifted = scaled - scaled.detach().amax(dim=-1, keepdim=True)
    return shifted - shifted.exp().sum(dim=-1, keepdim=True).log()


def entropy_of_logprobs(logp: Tensor, with_grad: bool = True) -> Tensor:
    """``-sum(p * log p)`` over the last dimension of the log-probs ``logp``. With
    ``with_grad`` false it is computed outside the autograd graph: a loss that only
    reports the entropy needs no graph (nor its memory) for it."""
    with torch.set_grad_enabled(with_grad and torch.is_grad_enabled()):
        source = logp if with_grad else logp.detach()
        return -(source.exp() * source).sum(-1)


def _large_vocab_stats(logits: Tensor, input_ids: Tensor, temperature: float,
                       with_entropy: bool) -> tuple[Tensor, Optional[Tensor]]:
    """:func:`~lightning_adv.trainer.policies.token_stats.token_stats` over ``[B, T, V]`` logits in
    the next-token convention: no full-size float32 copy of the logits is made."""
    b, t, v = logits.shape
    targets = F.pad(input_ids[:, 1:], (0, 1))  # the last column's target is dropped below
    picked, ent = token_stats(logits.reshape(b * t, v), targets.reshape(-1), temperature,
                              with_entropy)
    picked = F.pad(picked.view(b, t)[:, :-1], (0, 1))
    return picked, None if ent is None else ent.view(b, t)


def next_token_logprobs(logits: Tensor, input_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-prob of token ``t+1`` at position ``t`` (next-token convention); last column 0."""
    if logits.shape[-1] > SMALL_VOCAB:
        return _large_vocab_stats(logits, input_ids, temperature, with_entropy=False)[0]
    logp = scaled_log_softmax(logits[:, :-1], temperature)
    picked = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return F.pad(picked, (0, 1))


def entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of the sampling distribution at every position, ``[B, T]``."""
    if logits.shape[-1] > SMALL_VOCAB:
        b, t, v = logits.shape
        targets = torch.zeros(b * t, dtype=torch.long, device=logits.device)
        ent = token_stats(logits.reshape(b * t, v), targets, temperature)[1]
        assert ent is not None
        return ent.view(b, t)
    return entropy_of_logprobs(scaled_log_softmax(logits, temperature))


def picked_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """Over ``[N, V]`` logits: the log-prob of ``targets`` ``[N]``, with
    :func:`next_token_logprobs`' arithmetic (one position per row)."""
    if logits.shape[-1] > SMALL_VOCAB:
        return token_stats(logits, targets, temperature, with_entropy=False)[0]
    return scaled_log_softmax(logits, temperature).gather(-1, targets[:, None]).squeeze(-1)


def picked_logprobs_and_entropy(logits: Tensor, targets: Tensor, temperature: float = 1.0,
                                entropy_grad: bool = True) -> tuple[Tensor, Tensor]:
    """Over ``[N, V]`` logits: the log-prob of ``targets`` ``[N]`` and the entropy, each
    ``[N]``, with :func:`logprobs_and_entropy`'s arithmetic (one position per row)."""
    if logits.shape[-1] > SMALL_VOCAB:
        picked, ent = token_stats(logits, targets, temperature, with_entropy=True)
        assert ent is not None
        return picked, ent if entropy_grad else ent.detach()
    logp = scaled_log_softmax(logits, temperature)
    picked = logp.gather(-1, targets[:, None]).squeeze(-1)
    return picked, entropy_of_logprobs(logp, entropy_grad)


def logprobs_and_entropy(logits: Tensor, input_ids: Tensor, temperature: float = 1.0,
                         entropy_grad: bool = True) -> tuple[Tensor, Tensor]:
    """:func:`next_token_logprobs` and :func:`entropy` from one log-softmax (the same
    numbers); ``entropy_grad=False`` computes the entropy outside the autograd graph (for
    a loss that only reports it). Over a large vocabulary both come from one chunked pass
    (:mod:`~lightning_adv.trainer.policies.token_stats`)."""
    if logits.shape[-1] > SMALL_VOCAB:
        picked, ent = _large_vocab_stats(logits, input_ids, temperature, with_entropy=True)
        assert ent is not None
        return picked, ent if entropy_grad else ent.detach()
    logp = scaled_log_softmax(logits, temperature)
    picked = F.pad(logp[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1), (0, 1))
    return picked, entropy_of_logprobs(logp, entropy_grad)

