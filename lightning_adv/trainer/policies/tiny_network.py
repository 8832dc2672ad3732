"""A tiny causal transformer policy in plain torch, with an optional value head.

The policy reads a right-padded ``[B, T]`` token batch and returns next-token logits and,
when it has a value head, one value per position: both in the next-token convention of
SPEC §1 (position ``t`` has read tokens ``0..t``). Right padding needs no attention mask:
causal attention never lets a real token look at the padding after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_adv.trainer.policies.config import PolicyConfig


def small_log_softmax(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)`` in float32, written out: over a vocabulary of a
    few dozen tokens torch's fused kernel is two to three times slower on CPU (forward and
    backward) than these four operations, which take the max as a constant shift (it
    cancels in the value and in the gradient). The built-in policy's sampler, scoring and
    update all use it, so the same logits give the same log-probs everywhere."""
    scaled = logits.float()
    if temperature != 1.0:  # (dividing by 1 changes nothing but costs a pass and its backward)
        scaled = scaled / temperature
    shifted = scaled - scaled.detach().amax(dim=-1, keepdim=True)
    return shifted - shifted.exp().sum(dim=-1, keepdim=True).log()


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))

    def forward_cached(self, x: Tensor, cache: tuple[Tensor, Tensor], slots: "_CacheSlots"
                       ) -> Tensor:
        """The block over the ``[N, d]`` hidden states of the new tokens ``slots`` places:
        their keys and values are written into ``cache`` (the layer's keys
        ``[B, H, dh, W+1]`` and values ``[B, H, W+1, dh]``: the layouts the two matrix
        products read, so no step copies the cache; writes go through permuted views) and
        their queries attend to the cached keys, on the ``[R, n]`` layout of the rows
        read (zeros at the padding, whose results are dropped)."""
        d = x.shape[1]
        h, dh = self.n_heads, d // self.n_heads
        q, k, v = self.qkv(self.ln1(x)).view(-1, 3, h, dh).unbind(1)
        keys, values = cache
        # (under autocast the new keys and values may be narrower than the cache)
        keys.permute(0, 3, 1, 2)[slots.cache_rows, slots.positions] = k.to(keys.dtype)
        values.permute(0, 2, 1, 3)[slots.cache_rows, slots.positions] = v.to(values.dtype)
        if len(slots.rows) < len(keys):  # a subset: gather its rows (a copy)
            keys, values = keys[slots.rows], values[slots.rows]
        r, n = slots.shape
        queries = q.new_zeros(r * n, h, dh).index_copy_(0, slots.flat, q).view(r, n, h, dh)
        # Written out: with a mask, SDPA's CPU path is several times slower here, and so
        # is torch.softmax over a short last dimension (the same formula, by hand).
        scores = (queries.transpose(1, 2) @ keys).mul_(1 / math.sqrt(dh))
        scores.masked_fill_(~slots.allowed, float("-inf"))
        weights = scores.sub_(scores.amax(-1, keepdim=True)).exp_()
        attn = weights.div_(weights.sum(-1, keepdim=True)) @ values
        x = x + self.proj(attn.transpose(1, 2).reshape(r * n, d).index_select(0, slots.flat))
        return x + self.mlp(self.ln2(x))

    def forward_packed(self, x: Tensor, keep: Tensor, shape: tuple[int, int],
                       pick: Optional[Tensor] = None) -> Tensor:
        """The block over the ``[N, d]`` hidden states of the positions ``keep`` (flat,
        ascending indices into a ``[B, T]`` layout, a prefix of every row): the linear
        layers, the norms and the MLP read those rows only; attention runs on the ``[B, T]``
        layout with zeros at the other positions, which no kept query attends to (causal
        attention, kept positions a prefix of their row). ``pick``: the indices into
        ``keep`` whose outputs are wanted; the other rows stop before the projection (a
        last block: their keys and values were all a later block would read). Each kept
        row's output is :meth:`forward`'s at that position, to float rounding."""
        qkv = self.qkv(self.ln1(x))
        read = keep
        if pick is not None:
            x, read = x.index_select(0, pick), keep.index_select(0, pick)
        x = x + self.proj(_PackedCausalAttention.apply(qkv, keep, read, shape, self.n_heads))
        return x + self.mlp(self.ln2(x))


class _PackedCausalAttention(torch.autograd.Function):
    """Causal self-attention of the packed ``[N, 3d]`` queries, keys and values of the
    positions ``keep`` (flat indices into a right-padded ``[B, T]`` layout; zeros at the
    other positions), returning the ``[len(read), d]`` outputs at the positions ``read``:
    one autograd node, written out (scores, softmax, weighted values, by batched matrix
    products over the ``B x heads`` attention matrices), with the softmax's backward by
    hand. Over the dozen-token rows of the built-in tasks this is a third faster, forward
    and backward, than ``scaled_dot_product_attention``'s CPU kernel (which runs several
    small matrix products per row and head); the numbers agree to float rounding."""

    @staticmethod
    def forward(ctx, qkv: Tensor, keep: Tensor, read: Tensor,  # type: ignore[override]
                shape: tuple[int, int], heads: int) -> Tensor:
        (b, t), d = shape, qkv.shape[1] // 3
        dh = d // heads
        padded = qkv.new_zeros(b * t, 3 * d).index_copy_(0, keep, qkv)
        # [3, B * heads, T, dh]: queries, keys, values of each (row, head)
        q, k, v = padded.view(b, t, 3, heads, dh).permute(2, 0, 3, 1, 4).reshape(
            3, b * heads, t, dh).unbind(0)
        scale = 1 / math.sqrt(dh)
        future = torch.ones(t, t, dtype=torch.bool, device=qkv.device).triu_(1)
        bias = torch.zeros(t, t, dtype=qkv.dtype, device=qkv.device).masked_fill_(
            future, float("-inf"))
        weights = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)
        weights = weights.sub_(weights.amax(-1, keepdim=True)).exp_()
        weights.div_(weights.sum(-1, keepdim=True))
        out = torch.bmm(weights, v).view(b, heads, t, dh).transpose(1, 2).reshape(b * t, d)
        ctx.save_for_backward(q, k, v, weights, keep, read)
        ctx.shape, ctx.scale = (b, t, heads, dh), scale
        return out.index_select(0, read)

    @staticmethod
    def backward(ctx, grad: Tensor  # type: ignore[override]
                 ) -> tuple[Tensor, None, None, None, None]:
        q, k, v, weights, keep, read = ctx.saved_tensors
        b, t, heads, dh = ctx.shape
        d = heads * dh
        g = grad.new_zeros(b * t, d).index_copy_(0, read, grad)
        g = g.view(b, t, heads, dh).transpose(1, 2).reshape(b * heads, t, dh)
        dqkv = grad.new_empty(3, b * heads, t, dh)
        torch.bmm(weights.transpose(1, 2), g, out=dqkv[2])  # d values
        dw = torch.bmm(g, v.transpose(1, 2))
        # softmax: d scores = w * (d w - sum(d w * w)), masked entries (w = 0) get 0
        ds = dw.sub_((dw * weights).sum(-1, keepdim=True)).mul_(weights)
        torch.bmm(ds, k, out=dqkv[0]).mul_(ctx.scale)  # d queries
        torch.bmm(ds.transpose(1, 2), q, out=dqkv[1]).mul_(ctx.scale)  # d keys
        dqkv = dqkv.view(3, b, heads, t, dh).permute(1, 3, 0, 2, 4).reshape(b * t, 3 * d)
        return dqkv.index_select(0, keep), None, None, None, None


@dataclass
class _CacheSlots:
    """Where :meth:`CausalTransformer.forward_cached`'s new tokens go: ``rows`` read (of
    the cache), each new token's cache row and position, its index ``flat`` in the
    ``[R, n]`` (rows x most new tokens) layout of the queries, that ``shape``, and which
    cached keys each query may attend to (``allowed``, ``[R, 1, n, W+1]``)."""

    rows: Tensor
    cache_rows: Tensor
    positions: Tensor
    flat: Tensor
    shape: tuple[int, int]
    allowed: Tensor


class KVCache:
    """Keys and values of every position read so far, per layer, for a fixed set of rows.

    Rows advance at their own pace (prompts differ in length; an environment reply adds
    several tokens at once): each call feeds every active row the tokens it has not read
    yet. Only those tokens are written; the queries are laid out right-padded to the
    longest such run, and a padded query sits at a spare last slot (never written), which
    no real query attends to.
    """

    def __init__(self, policy: "CausalTransformer", batch_size: int, width: int):
        block = policy.blocks[0]
        heads, head_dim = block.n_heads, policy.config.d_model // block.n_heads
        device, dtype = policy.tok.weight.device, policy.tok.weight.dtype  # (a bf16 sampler's)
        # keys transposed for ``q @ keys``, values as ``weights @ values`` reads them
        self.layers = [(torch.zeros(batch_size, heads, head_dim, width + 1, device=device, dtype=dtype),
                        torch.zeros(batch_size, heads, width + 1, head_dim, device=device, dtype=dtype))
                       for _ in policy.blocks]
        self.width = width
        self.filled = torch.zeros(batch_size, dtype=torch.long, device=device)


class CausalTransformer(nn.Module):
    """Token and position embeddings, ``n_layers`` blocks, an LM head and an optional value head.

    The LM head starts at zero, so the untrained policy samples uniformly over the
    vocabulary (maximal exploration); the value head starts at zero too. Tokens in
    ``banned_tokens`` (padding, ``<bos>``) get a -1e9 logit: they are never sampled, and
    log-probs and entropies are computed over the same distribution the sampler uses.
    """

    def __init__(self, config: PolicyConfig, vocab_size: int, max_seq_len: int,
                 banned_tokens: Sequence[int] = ()):
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        d = config.d_model
        self.tok = nn.Embedding(vocab_size, d)
        self.pos = nn.Embedding(max_seq_len, d)
        self.blocks = nn.ModuleList(
            Block(d, config.n_heads, config.d_ff or 4 * d) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab_size)
        self.value_head = nn.Linear(d, 1) if config.value_head else None
        bias = torch.zeros(vocab_size)
        bias[list(banned_tokens)] = -1e9
        self.register_buffer("logit_bias", bias, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        for block in self.blocks:  # GPT-2 style: keep the residual stream's scale at init
            nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * len(self.blocks)))
        for head in (self.lm_head, self.value_head):
            if head is not None:
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    def forward(self, input_ids: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """``[B, T]`` token ids -> (logits ``[B, T, V]``, values ``[B, T]`` or None)."""
        t = input_ids.shape[1]
        if t > self.max_seq_len:
            raise ValueError(f"policy: sequence of {t} tokens exceeds policy.max_seq_len "
                             f"({self.max_seq_len})")
        x = self.tok(input_ids) + self.pos(torch.arange(t, device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        return self._heads(x)

    def forward_selected(self, input_ids: Tensor, selected: Tensor
                         ) -> tuple[Tensor, Optional[Tensor]]:
        """Logits ``[N, V]`` and values ``[N]`` (or None) at the ``N`` positions ``selected``
        marks (a ``[B, T]`` bool mask over the right-padded ``input_ids``; row-major order):
        those :meth:`forward` gives there, to float rounding, computing only what they
        depend on. Each row is cut after its last selected position (the later ones, the
        padding among them, are read by no selected position); the blocks' linear layers
        run on the remaining positions only, and the last block's projection, MLP and the
        heads on the selected ones only. The trainer's update selects the loss mask's
        positions: about a third of a padded minibatch's on the shipped configs."""
        b, t = input_ids.shape
        if t > self.max_seq_len:
            raise ValueError(f"policy: sequence of {t} tokens exceeds policy.max_seq_len "
                             f"({self.max_seq_len})")
        columns = torch.arange(t, device=input_ids.device)
        last = torch.where(selected, columns, -1).amax(1)  # -1: nothing selected in the row
        width = max(int(last.max()), 0) + 1
        keep = (columns[:width] <= last[:, None]).reshape(-1).nonzero().squeeze(1)
        pick = selected[:, :width].reshape(-1).index_select(0, keep).nonzero().squeeze(1)
        ids = input_ids[:, :width].reshape(-1).index_select(0, keep)
        x = self.tok(ids) + self.pos(keep % width)
        for i, block in enumerate(self.blocks):
            x = block.forward_packed(x, keep, (b, width),
                                     pick if i == len(self.blocks) - 1 else None)
        return self._heads(x)

    def forward_cached(self, buffer: Tensor, rows: Tensor, lengths: Tensor,
                       cache: KVCache) -> tuple[Tensor, Optional[Tensor], Tensor]:
        """Incremental decoding: read, for each of ``rows``, the tokens of ``buffer`` (the
        ``[B, W]`` token rows) from the cache's fill mark up to ``lengths`` (exclusive).

        Returns (logits ``[R, n, V]``, values ``[R, n]`` or None, positions ``[R, n]``)
        for the ``n`` newly read positions (``n`` = the most any row read; a row's entries
        past its own new tokens are padding, at position ``cache.width``); logits and
        values at real positions equal those of :meth:`forward` over the whole prefix.
        """
        start = cache.filled[rows]
        count = lengths - start
        n = max(int(count.max()), 1)
        offsets = torch.arange(n, device=buffer.device)
        real = offsets[None, :] < count[:, None]
        positions = torch.where(real, start[:, None] + offsets, cache.width)
        # The linear layers read the new tokens only (not the padding of rows that read
        # fewer, nor rows that read none); attention runs on the [R, n] layout.
        flat = real.reshape(-1).nonzero().squeeze(1)
        at = positions.reshape(-1).index_select(0, flat)
        cache_rows = rows.index_select(0, flat // n)
        key_slots = torch.arange(cache.width + 1, device=buffer.device)
        # A query sees the cached keys up to its own position; padded queries see
        # everything, and are discarded.
        allowed = (key_slots[None, None, :] <= positions[:, :, None])[:, None]
        slots = _CacheSlots(rows, cache_rows, at, flat, (len(rows), n), allowed)
        x = self.tok(buffer[cache_rows, at]) + self.pos(at)
        for block, layer in zip(self.blocks, cache.layers):
            x = block.forward_cached(x, layer, slots)
        cache.filled[rows] = lengths
        new_logits, new_values = self._heads(x)

        def padded(x: Tensor) -> Tensor:
            out = x.new_zeros(len(rows) * n, *x.shape[1:]).index_copy_(0, flat, x)
            return out.view(len(rows), n, *x.shape[1:])

        return (padded(new_logits), None if new_values is None else padded(new_values),
                positions)

    def _heads(self, x: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        x = self.ln_f(x)
        values = self.value_head(x).squeeze(-1) if self.value_head is not None else None
        return self.lm_head(x) + self.logit_bias, values
