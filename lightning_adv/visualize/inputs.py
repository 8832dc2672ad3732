"""What a heatmap shows, taken from a rollout batch and the ``AdvantageModule``'s output.

:func:`~lightning_adv.visualize.advantage_heatmap` reads per-token numbers **token by
token**: entry ``i`` of a row is about token ``i`` (the advantage of the action that
produced it). The module's outputs follow the next-token convention (SPEC §1: position
``t`` scores token ``t + 1``); :func:`token_aligned` moves them back, and
:func:`heatmap_inputs` gathers everything for a few rows of a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_adv._checks import fail
from lightning_adv.losses.rollout_correction import rollout_correction
from lightning_adv.ops.trees import node_means, tree_paths


def token_aligned(x: Tensor) -> Tensor:
    """A next-token-aligned ``[B, T]`` tensor (position ``t`` about token ``t + 1``) as a new
    token-aligned one (position ``i`` about token ``i``): shifted one step right, column 0
    (no action produced the first token) 0. The inverse of the module's alignment on
    every column but the last, which only padding or a prompt's first token reach."""
    if not isinstance(x, Tensor) or x.ndim != 2:
        fail("token_aligned x", "a [B, T] tensor", getattr(x, "shape", type(x).__name__))
    out = torch.zeros_like(x)
    out[:, 1:] = x[:, :-1]
    return out


def heatmap_inputs(batch: Mapping[str, Any], out: Mapping[str, Any],
                   token_text: Callable[[int], str], rows: Optional[Sequence[int]] = None, *,
                   advantages_key: str = "advantages",
                   correction: Optional[Mapping[str, Any]] = None,
                   group_sizes: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """The keyword arguments of :func:`~lightning_adv.visualize.advantage_heatmap` for the
    ``rows`` (default: all) of a SPEC §1 rollout ``batch`` and the ``AdvantageModule``
    output ``out``: each row's token texts (``token_text(id)``, up to its last real token),
    the advantages ``out[advantages_key]`` (``"unnormalized_advantages"`` for the
    estimator's before normalization) and the critic's ``values`` moved to the token
    convention, the generated-token mask, and the batch's ``token_rewards`` (process
    rewards) and ``turn_ids`` when it has them. Strips by name (:func:`off_policy_strips`):
    the batch's ``entropies`` (next-token aligned, as ``logprobs``) when it has them; with
    ``out["rollout_logprobs"]`` (a decoupled off-policy batch) each token's log importance
    weight, and with a ``correction`` (a ``RolloutCorrectionConfig``'s ``kwargs()``) that
    rejects, the tokens its rejection masks out.

    A tree batch (``tree_node_ids``) needs ``group_sizes`` (``meta.traj_group_sizes``):
    its rows get ``tree_node_ids``, ``tree_groups`` and, on each shared token, the mean
    advantage over all the batch's rows through its node, not only the chosen ones'."""
    for key in ("input_ids", "attention_mask", "loss_mask"):
        if not isinstance(batch.get(key), Tensor):
            fail(f"heatmap_inputs batch[{key!r}]", "a [B, T] tensor (the rollout batch)",
                 type(batch.get(key)).__name__ if key in batch else "missing key")
    if not isinstance(out.get(advantages_key), Tensor):
        fail(f"heatmap_inputs out[{advantages_key!r}]", "a [B, T] tensor (the AdvantageModule "
             "output)", type(out.get(advantages_key)).__name__ if advantages_key in out
             else "missing key")
    count = batch["input_ids"].shape[0]
    chosen = list(range(count)) if rows is None else [int(r) for r in rows]
    bad = [r for r in chosen if not 0 <= r < count]
    if bad:
        fail("heatmap_inputs rows", f"row indices in [0, {count})", bad)
    index = torch.tensor(chosen, dtype=torch.long, device=batch["input_ids"].device)

    def pick(x: Tensor) -> Tensor:
        return x.index_select(0, index.to(x.device)).detach().cpu()

    lengths = pick(batch["attention_mask"]).long().sum(1).tolist()
    ids = pick(batch["input_ids"]).tolist()
    advantages = token_aligned(out[advantages_key].detach().float())
    inputs: dict[str, Any] = {
        "tokens": [[token_text(t) for t in row[:n]] for row, n in zip(ids, lengths)],
        "advantages": pick(advantages),
        "loss_mask": pick(batch["loss_mask"]).float(),
    }
    if isinstance(batch.get("tree_node_ids"), Tensor):
        inputs.update({k: pick(x) for k, x in _tree_inputs(batch, advantages, group_sizes).items()})
    if isinstance(batch.get("token_rewards"), Tensor):
        inputs["process_rewards"] = pick(batch["token_rewards"]).float()
    if isinstance(batch.get("values"), Tensor):
        inputs["values"] = token_aligned(pick(batch["values"]).float())
    if isinstance(batch.get("turn_ids"), Tensor):
        inputs["turn_ids"] = pick(batch["turn_ids"]).long()
    strips = off_policy_strips(out, correction)
    if isinstance(batch.get("entropies"), Tensor):
        strips["entropy"] = batch["entropies"]
    if strips:
        inputs["strips"] = {name: token_aligned(pick(x).float()) for name, x in strips.items()}
    return inputs


def _tree_inputs(batch: Mapping[str, Any], advantages: Tensor,
                 group_sizes: Optional[Sequence[int]]) -> dict[str, Tensor]:
    """Every row's ``advantages`` (each shared token's the mean over the rows through its
    node), ``tree_node_ids`` (-1 off generated tokens) and ``tree_groups`` ([B])."""
    generated = batch["loss_mask"] > 0
    node_ids = torch.where(generated, batch["tree_node_ids"].long(), -1)
    row_group = _row_groups(group_sizes, generated.shape[0], generated.device)
    paths = tree_paths(node_ids, batch["loss_mask"], batch["input_ids"], row_group,
                       batch.get("tree_ids"), where="heatmap_inputs")
    advantages = advantages.to(generated.device)
    means = node_means(paths, advantages)
    return {"advantages": torch.where(generated, means, advantages), "tree_node_ids": node_ids,
            "tree_groups": row_group}


def _row_groups(group_sizes: Optional[Sequence[int]], count: int, device: torch.device
                ) -> Tensor:
    """[B] each row's prompt group, from ``group_sizes`` (checked to cover the batch)."""
    if (not isinstance(group_sizes, Sequence) or not group_sizes
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in group_sizes)
            or sum(group_sizes) != count):
        fail("heatmap_inputs group_sizes", f"the rows of each prompt group, positive integers "
             f"summing to the batch's {count} rows (meta.traj_group_sizes; the batch has "
             f"'tree_node_ids')", group_sizes)
    return torch.repeat_interleave(torch.arange(len(group_sizes), device=device),
                                   torch.tensor(list(group_sizes), device=device))


def off_policy_strips(out: Mapping[str, Any], correction: Optional[Mapping[str, Any]]
                      ) -> dict[str, Tensor]:
    """Next-token-aligned ``[B, T]`` strips of a decoupled off-policy ``out`` (one with
    ``rollout_logprobs``; none otherwise): ``"log IS weight"``, ``log pi_old - log
    pi_rollout`` at loss-mask positions (0 elsewhere), before any truncation; and with a
    ``correction`` that rejects (``rollout_rs``), ``"rejected"``: 1 at the loss-mask
    positions :func:`~lightning_adv.losses.rollout_correction.rollout_correction` masks
    out, as the loss will."""
    if not isinstance(out.get("rollout_logprobs"), Tensor):
        return {}
    active = out["loss_mask"] > 0
    strips = {"log IS weight": torch.where(
        active, out["logprobs"].double() - out["rollout_logprobs"].double(), 0.0)}
    if correction is not None and correction.get("rollout_rs") is not None:
        kept = rollout_correction(out["logprobs"], out["rollout_logprobs"], out["loss_mask"],
                                  **correction).loss_mask
        strips["rejected"] = (active & ~(kept > 0)).double()
    return strips
