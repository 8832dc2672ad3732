"""Synthetic rollout batches and the advantage configs that tests and benchmarks run.

:func:`realistic_inputs` builds a batch shaped like an agentic RL rollout (prompt groups,
multi-turn replies with tool-output gaps, right padding, truncated rows) through
:func:`~lightning_adv.concat_batch`, with the aligned tensors the GAE kernels take.
:func:`module_configs` names the ``ActorConfig`` s worth timing or checking on it, and
:func:`with_stage_inputs` adds the keys their stages require beyond a rollout's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from lightning_adv.batch.grouping import BatchMeta, concat_batch
from lightning_adv.config import ActorConfig
from lightning_adv.stages.gae_lambda import GAELambdaContext, vapo_length_adaptive_gae

#: Rows per prompt group of :func:`realistic_inputs`.
ROWS_PER_PROMPT = 8


def module_configs(config_dir: Optional[Path] = None) -> dict[str, ActorConfig]:
    """``default`` (``ActorConfig()``) and ``GRPO`` (the ``grpo`` recipe), plus, with
    ``config_dir``, the ``model.actor`` section of each ``*.yaml`` there (named by file,
    e.g. ``ppo.yaml``; files without one are skipped)."""
    configs = {"default": ActorConfig(), "GRPO": ActorConfig(recipe="grpo")}
    if config_dir is not None:
        import yaml

        for path in sorted(Path(config_dir).glob("*.yaml")):
            actor = (yaml.safe_load(path.read_text()).get("model") or {}).get("actor")
            if actor is not None:
                configs[path.name] = ActorConfig(**actor)
    return configs


def _prompt_rows(rows: int, width: int, gen: torch.Generator) -> dict[str, Tensor]:
    """One prompt's rows: prompt | turn (| tool output | turn)* | padding."""
    prompt = int(torch.randint(max(1, width // 16), max(2, width // 8 + 1), (), generator=gen))
    attention = torch.zeros(rows, width, dtype=torch.long)
    loss_mask = torch.zeros(rows, width, dtype=torch.long)
    turn_ids = torch.full((rows, width), -1, dtype=torch.long)
    room = width - prompt
    for i in range(rows):
        truncated = bool(torch.rand((), generator=gen) < 0.25)
        length = room if truncated else int(torch.randint(max(1, room // 8), room + 1, (),
                                                            generator=gen))
        turns = int(torch.randint(1, 5, (), generator=gen))
        gap = max(1, length // 20)
        # Turn boundaries: equal shares of the generated span, a tool-output gap after each
        # turn but the last.
        edges = torch.linspace(0, length, turns + 1).long().tolist()
        attention[i, :prompt + length] = 1
        for u in range(turns):
            start, stop = prompt + edges[u], prompt + edges[u + 1] - (gap if u < turns - 1 else 0)
            if stop > start:
                loss_mask[i, start:stop] = 1
                turn_ids[i, start:stop] = u
    logprobs = -torch.rand(rows, width, generator=gen) * loss_mask
    return {
        "input_ids": torch.randint(1, 32000, (rows, width), generator=gen) * attention,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        # log-probs are <= 0 (the module warns about a ref_logp above 0 where it is read)
        "ref_logp": (logprobs + 0.05 * torch.randn(rows, width, generator=gen)).clamp(max=0)
        * attention,
        "values": torch.randn(rows, width, generator=gen) * attention,
        "turn_ids": turn_ids,
        # GiGPO's anchor states: here the turn index (every episode of a prompt in the same
        # state at the same turn), drawn from no generator so the other tensors stay as
        # they were
        "anchor_state_ids": turn_ids.clone(),
        # the trained policy's recomputed log-probs (configs with actor.recompute_logprob),
        # close to the sampler's; no generator draw, for the same reason
        "prox_logp": logprobs * 0.98,
        "rewards": (torch.rand(rows, generator=gen) < 0.5).float(),
    }


@dataclass
class Inputs:
    """A rollout batch for ``AdvantageModule`` (``batch``, ``meta``) and the aligned
    ``[B, T]`` kernel inputs derived from it (``bootstrap``: ``[B]``; ``row_lambda``: a
    per-row GAE λ, ``[B]``)."""

    batch: dict[str, Tensor]
    meta: BatchMeta
    rewards: Tensor
    values: Tensor
    loss_mask: Tensor
    turn_ids: Tensor
    bootstrap: Tensor
    row_lambda: Tensor


def realistic_inputs(bs: int, width: int, device: torch.device, seed: int = 0) -> Inputs:
    """A rollout batch of ``bs`` rows of ``width`` tokens in prompt groups of
    :data:`ROWS_PER_PROMPT` (a prompt prefix, 1-4 generated turns with tool-output gaps,
    right padding, a quarter of the rows truncated; int64 masks, float32 log-probs and
    values), from :func:`~lightning_adv.concat_batch`, and the aligned kernel inputs
    derived from it. The same arguments give the same tensors."""
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    left = bs
    while left:
        rows = min(ROWS_PER_PROMPT, left)
        prompts.append(_prompt_rows(rows, width, gen))
        left -= rows
    batch, meta = concat_batch(prompts)
    batch = {k: v.to(device) for k, v in batch.items()}
    # Next-token alignment as the module does it (SPEC §1): shift left, last turn id -1.
    mask = torch.roll(batch["loss_mask"], -1, dims=1).float()
    turn_ids = torch.roll(batch["turn_ids"], -1, dims=1)
    turn_ids[:, -1] = -1
    rows = torch.arange(bs, device=device)
    seqlens = batch["attention_mask"].sum(dim=1)
    values = batch["values"]
    bootstrap = values[rows, seqlens - 1] * (seqlens == width)
    # Per-step rewards: a small KL-like term on generated tokens plus the outcome reward at
    # the position predicting each row's last token.
    rewards = 0.01 * torch.randn(bs, width, generator=gen).to(device) * mask
    rewards[rows, (seqlens - 2).clamp(min=0)] += batch["rewards"]
    lengths = mask.sum(dim=1).long()
    context = GAELambdaContext(lengths, torch.zeros_like(lengths), lengths)
    row_lambda = vapo_length_adaptive_gae(context, alpha=0.05)
    return Inputs(batch, meta, rewards, values, mask, turn_ids, bootstrap, row_lambda)


def with_stage_inputs(batch: dict, keys: frozenset, gen: torch.Generator) -> dict:
    """A new ``batch`` with the keys a config's stages require beyond the rollout's
    (``AdvantageModule.required_batch_keys``), drawn at random from ``gen``: ``entropies``
    (in ``[0, 3)``), ``mc_returns`` (two returns for each of a row's turns, NaN past
    them) and ``tree_node_ids`` (each row its own one-node tree: the rows' tokens are
    drawn independently, so no two share a prefix); the synthetic batch has the others."""
    batch = dict(batch)
    if "entropies" in keys:
        batch["entropies"] = torch.rand(batch["loss_mask"].shape, generator=gen) * 3
    if "mc_returns" in keys:
        turns = [len(set(row[row >= 0].tolist())) for row in batch["turn_ids"]]
        table = torch.full((len(turns), max(turns), 2), float("nan"))
        for b, n in enumerate(turns):
            table[b, :n] = torch.rand(n, 2, generator=gen)
        batch["mc_returns"] = table
    if "tree_node_ids" in keys:
        rows = torch.arange(batch["loss_mask"].shape[0])[:, None]
        batch["tree_node_ids"] = torch.where(batch["loss_mask"] > 0, rows, -1)
    return batch
