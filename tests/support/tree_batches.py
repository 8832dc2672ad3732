"""Rollout batches of tree-structured rows (``tree_node_ids``, ``tree_ids``) from the
rows of a recorded tree case: each row one root-to-leaf path, ``{"group", "tree",
"path": [node ids], "lengths": [tokens per node], "reward"}``."""

from __future__ import annotations

import torch

from lightning_adv import concat_batch

PROMPT, SPAN = 2, 1   # prompt tokens of each row; masked tokens between nodes (spans=True)


def node_token(group: int, node: int, k: int) -> int:
    """The k-th token of a node: the same in every row passing it."""
    return 100 + 1000 * group + 8 * node + k


def tree_row(row: dict, spans: bool) -> dict:
    ids, loss, nodes = [5] * PROMPT, [0] * PROMPT, [-1] * PROMPT
    for k, (node, length) in enumerate(zip(row["path"], row["lengths"])):
        if spans and k:
            ids += [3] * SPAN
            loss += [0] * SPAN
            nodes += [-1] * SPAN
        ids += [node_token(row["group"], node, j) for j in range(length)]
        loss += [1] * length
        nodes += [node] * length
    return {"ids": ids, "loss": loss, "nodes": nodes}


def tree_batch(rows: list[dict], *, spans: bool = False, tree_ids: bool = True):
    """``(batch, meta)`` of the rows, in their order (rows of a group contiguous)."""
    built = [tree_row(r, spans) for r in rows]
    width = max(len(b["ids"]) for b in built) + 1
    prompts = []
    for group in sorted({r["group"] for r in rows}):
        members = [i for i, r in enumerate(rows) if r["group"] == group]
        def pad(key: str, i: int, fill: int) -> list:
            return built[i][key] + [fill] * (width - len(built[i][key]))
        prompt = {
            "input_ids": torch.tensor([pad("ids", i, 0) for i in members]),
            "attention_mask": torch.tensor([[j < len(built[i]["ids"]) for j in range(width)]
                                           for i in members]),
            "loss_mask": torch.tensor([pad("loss", i, 0) for i in members], dtype=torch.int32),
            "logprobs": torch.zeros(len(members), width),
            "rewards": torch.tensor([rows[i]["reward"] for i in members]),
            "tree_node_ids": torch.tensor([pad("nodes", i, -1) for i in members]),
        }
        if tree_ids:
            prompt["tree_ids"] = torch.tensor([rows[i]["tree"] for i in members])
        prompts.append(prompt)
    return concat_batch(prompts)


def row_advantages(out: dict) -> list[float]:
    """Each row's advantage, read off its first generated position (all are equal)."""
    adv, mask = out["advantages"], out["loss_mask"]
    firsts = (mask > 0).int().argmax(dim=1)
    return [float(adv[b, firsts[b]]) for b in range(adv.shape[0])]


def token_advantages(out: dict) -> list[list[float]]:
    """Each row's advantages on its generated tokens, in order."""
    adv, mask = out["advantages"], out["loss_mask"]
    return [adv[b][mask[b] > 0].tolist() for b in range(adv.shape[0])]
