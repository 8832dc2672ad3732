"""Per-position statistics of a large vocabulary's logits, a few rows at a time.

A Hugging Face policy's logits are ``[B, T, V]`` with V of 32k-150k tokens: at B=16,
T=256, V=32000 one float32 copy is 524 MB. ``log_softmax`` of the whole tensor holds
such a copy (and, under autograd, keeps it for the backward pass), a bf16 model's
``logits.float()`` another, a temperature division a third. Here every statistic is
reduced over the vocabulary in chunks of about :data:`CHUNK_ELEMENTS` logits, the
float32 temporaries are chunk-sized, and only ``[N]`` results (and the logsumexp) are
kept:

- :func:`token_stats`: the chosen token's log-prob and the entropy, differentiable
  through a custom backward that recomputes the softmax chunk by chunk from the logits
  (saved for it in their own dtype: the one logits-sized tensor kept for the backward,
  where ``log_softmax`` keeps its float32 output) and the saved ``[N]`` logsumexp; the
  gradient comes back in the logits' dtype, as autograd's of ``logits.float()`` would;
- :func:`sum_pi_squared_chunked`: ``sum_v p_v ** 2`` (no gradient; a recipe input);
- :func:`entropy_rows`: the entropy at every position (no gradient; a recipe input).

The numbers are those of the full-tensor formulas (``log_softmax``, ``softmax``) up to
float rounding: the same shifted exponentials, summed over the same vocabulary. TRL and
verl reduce logits row by row for the same reason (verl's
``logprobs_from_logits`` / ``entropy_from_logits_with_chunking``); the fused
lm-head-plus-loss kernels (Liger) that never hold the logits at all are out of scope.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

#: Logits reduced at once: ~4M elements, 16 MiB per float32 temporary, whatever the batch.
CHUNK_ELEMENTS = 1 << 22


def chunk_rows(vocab: int) -> int:
    """Rows of a ``[N, vocab]`` matrix per chunk."""
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


def _scaled(chunk: Tensor, temperature: float) -> Tensor:
    """``chunk / temperature`` in float32: a new tensor, or ``chunk`` itself when it is
    float32 and the temperature 1 (never modified in place)."""
    x = chunk.float()
    return x / temperature if temperature != 1.0 else x


def _forward(logits: Tensor, targets: Tensor, temperature: float, with_entropy: bool
             ) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """(chosen log-prob, max, log of the shifted exponentials' sum, entropy or None), each
    ``[N]`` float32, of the ``[N, V]`` ``logits`` at ``temperature``. The logsumexp is
    kept as its two terms: ``(x - max) - log_total`` is exact to float32 where
    ``x - (max + log_total)`` would carry the rounding of a large sum (up to 4e-6 at
    logits of 40)."""
    n = logits.shape[0]
    picked = torch.empty(n, dtype=torch.float32, device=logits.device)
    shifts, log_totals = torch.empty_like(picked), torch.empty_like(picked)
    ent = torch.empty_like(picked) if with_entropy else None
    step = chunk_rows(logits.shape[1])
    for start in range(0, n, step):
        rows = slice(start, start + step)
        x = _scaled(logits[rows], temperature)
        # log_softmax's own arithmetic: z = x - max, log p = z - log(sum(exp(z)))
        shift = x.amax(-1, keepdim=True)
        chosen = x.gather(-1, targets[rows, None]) - shift  # = z at the targets, bitwise
        if ent is None:  # one chunk-sized temporary
            log_total = (x - shift).exp_().sum(-1).log()
        else:
            z = x - shift
            e = z.exp()
            total = e.sum(-1)
            log_total = total.log()
            # H = -sum p log p = log(sum e) - sum(e z) / sum e
            ent[rows] = log_total - (e * z).sum(-1) / total
        picked[rows] = chosen.squeeze(-1) - log_total
        shifts[rows], log_totals[rows] = shift.squeeze(-1), log_total
    return picked, shifts, log_totals, ent


class _TokenStats(torch.autograd.Function):
    """Chosen log-prob and entropy with a chunked backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float,  # type: ignore[override]
                with_entropy: bool) -> tuple[Tensor, Tensor]:
        picked, shifts, log_totals, ent = _forward(logits, targets, temperature, with_entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        if ent is None:
            ent = torch.zeros_like(picked)
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(logits, targets, shifts, log_totals, ent if with_entropy else None)
        return picked, ent

    @staticmethod
    def backward(ctx, g_picked: Optional[Tensor], g_ent: Optional[Tensor]  # type: ignore[override]
                 ) -> tuple[Optional[Tensor], None, None, None]:
        logits, targets, shifts, log_totals, ent = ctx.saved_tensors
        if g_picked is None and (g_ent is None or ent is None):
            return None, None, None, None
        grad = torch.empty_like(logits)
        step = chunk_rows(logits.shape[1])
        for start in range(0, logits.shape[0], step):
            rows = slice(start, start + step)
            logp = (_scaled(logits[rows], ctx.temperature) - shifts[rows, None]).sub_(
                log_totals[rows, None])
            p = logp.exp()
            g = torch.zeros_like(p)
            if g_picked is not None:  # d log p_c / dx = onehot(c) - p
                gp = g_picked[rows, None]
                g.sub_(p * gp).scatter_add_(-1, targets[rows, None], gp)
            if g_ent is not None and ent is not None:  # dH / dx = -p (log p + H)
                g.sub_(p * (logp + ent[rows, None]) * g_ent[rows, None])
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            grad[rows] = g
        return grad, None, None, None


def token_stats(logits: Tensor, targets: Tensor, temperature: float = 1.0,
                with_entropy: bool = True) -> tuple[Tensor, Optional[Tensor]]:
    """The log-prob of ``targets`` ``[N]`` and (``with_entropy``) the entropy under
    ``softmax(logits / temperature)``, for ``[N, V]`` logits of any floating dtype;
    float32 ``[N]`` results, differentiable in ``logits``."""
    if torch.is_grad_enabled() and logits.requires_grad:
        picked, ent = _TokenStats.apply(logits, targets, float(temperature), with_entropy)
        return picked, ent if with_entropy else None
    picked, _, _, ent = _forward(logits, targets, float(temperature), with_entropy)
    return picked, ent


@torch.no_grad()
def sum_pi_squared_chunked(logits: Tensor, temperature: float) -> Tensor:
    """``[N]``: ``sum_v softmax(logits / temperature)_v ** 2`` of ``[N, V]`` logits."""
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    step = chunk_rows(logits.shape[1])
    for start in range(0, logits.shape[0], step):
        x = _scaled(logits[start:start + step], temperature)
        e = (x - x.amax(-1, keepdim=True)).exp_()
        probs = e.div_(e.sum(-1, keepdim=True))  # softmax's arithmetic, in place
        out[start:start + step] = probs.square_().sum(-1)
    return out


def next_token_stats(logits: Tensor, input_ids: Tensor, temperature: float = 1.0,
                     with_entropy: bool = True, entropy_grad: bool = True
                     ) -> tuple[Tensor, Optional[Tensor]]:
    """:func:`token_stats` over ``[B, T, V]`` logits in the next-token convention: the
    log-prob of token ``t+1`` at position ``t`` (last column 0) and the entropy at every
    position, each ``[B, T]``; ``entropy_grad`` false detaches the entropy (reported only)."""
    b, t, v = logits.shape
    targets = torch.nn.functional.pad(input_ids[:, 1:], (0, 1))  # the last column's is dropped
    picked, ent = token_stats(logits.reshape(b * t, v), targets.reshape(-1), temperature,
                              with_entropy)
    picked = torch.nn.functional.pad(picked.view(b, t)[:, :-1], (0, 1))
    if ent is not None:
        ent = ent.view(b, t) if entropy_grad else ent.view(b, t).detach()
    return picked, ent


@torch.no_grad()
def entropy_rows(logits: Tensor, temperature: float) -> Tensor:
    """The entropy of ``softmax(logits / temperature)`` at every position of ``[B, T, V]``
    logits, ``[B, T]`` float32 (:func:`token_stats`'s chunked reduction)."""
    b, t, v = logits.shape
    targets = torch.zeros(b * t, dtype=torch.long, device=logits.device)  # (log-prob unused)
    _, ent = token_stats(logits.reshape(b * t, v), targets, temperature, with_entropy=True)
    assert ent is not None
    return ent.view(b, t)


def sum_pi_squared_rows(logits: Tensor, temperature: float) -> Tensor:
    """:func:`sum_pi_squared_chunked` of ``[B, T, V]`` logits, ``[B, T]``."""
    b, t, v = logits.shape
    return sum_pi_squared_chunked(logits.reshape(b * t, v), temperature).view(b, t)
