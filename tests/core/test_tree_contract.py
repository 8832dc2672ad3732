"""The tree batch contract (``tree_node_ids``, ``tree_ids``): each bad input is one error
naming the stage, the key and what is wrong, before any advantage is computed; and
node_means, the per-node mean the heatmaps of trees colour shared tokens with."""

from __future__ import annotations

import pytest
import torch

from lightning_adv import AdvantageModule, RolloutGroup, concat_batch
from lightning_adv.ops.trees import node_means, tree_paths
from lightning_adv.recipes import recipe
from tests.support.tree_batches import tree_batch

KEY = "rollout batch 'tree_node_ids'"


def row(path, lengths=None, group=0, tree=0, reward=1.0) -> dict:
    return {"group": group, "tree": tree, "path": list(path),
            "lengths": list(lengths or [2] * len(path)), "reward": reward}


def fails(batch_and_meta, match: str, name: str = "tree_grpo") -> None:
    with pytest.raises(ValueError, match=match):
        AdvantageModule(recipe(name))(*batch_and_meta)


GOOD = [row([0, 1], reward=1.0), row([0, 2], reward=0.0), row([3], reward=0.5)]


@pytest.mark.parametrize("name", ["tree_grpo", "treepo", "treerl"])
def test_a_good_tree_passes(name):
    out = AdvantageModule(recipe(name))(*tree_batch(GOOD, spans=True))
    assert torch.isfinite(out["advantages"]).all()


@pytest.mark.parametrize("name", ["tree_grpo", "treepo", "treerl"])
def test_missing_node_ids_name_the_key(name):
    batch, meta = tree_batch(GOOD)
    del batch["tree_node_ids"]
    fails((batch, meta), f"estimator '{name}': rollout batch has no 'tree_node_ids'", name)


def test_without_meta_names_what_is_missing():
    batch, _ = tree_batch(GOOD)
    fails((batch, None), "estimator 'tree_grpo': needs the prompt groups of meta")


def test_a_negative_id_on_a_generated_token():
    batch, meta = tree_batch(GOOD)
    ids = batch["tree_node_ids"].clone()
    first = int(batch["loss_mask"][1].nonzero()[0])
    ids[1, first] = -2
    fails(({**batch, "tree_node_ids": ids}, meta), f"{KEY}: expected an id >= 0 on every "
          r"generated token, got negative ids in rows \[1\]")


def test_ids_off_the_generated_tokens_are_not_read():
    batch, meta = tree_batch(GOOD, spans=True)
    ids = torch.where(batch["loss_mask"].bool(), batch["tree_node_ids"], 77)
    module = AdvantageModule(recipe("tree_grpo"))
    torch.testing.assert_close(module({**batch, "tree_node_ids": ids}, meta)["advantages"],
                               module(batch, meta)["advantages"])


def test_a_row_without_generated_tokens():
    batch, meta = tree_batch(GOOD)
    loss = batch["loss_mask"].clone()
    loss[2] = 0
    with pytest.warns(UserWarning):
        fails(({**batch, "loss_mask": loss}, meta), f"{KEY}: expected every row to pass at "
              r"least one node, got rows \[2\] without a generated token")


def test_a_node_that_is_not_contiguous():
    fails(tree_batch([row([0, 1, 0]), row([2])]), f"{KEY}: expected each node's generated "
          r"tokens to be one contiguous run .* got rows \[0\] that come back to a node")


def test_a_node_with_two_parents():
    fails(tree_batch([row([0, 1]), row([2, 1])]), f"{KEY}: expected each node to have one "
          r"parent, got node 1 of prompt group 0 after different nodes \(or in different "
          r"trees\) in rows \[0, 1\]")


def test_a_node_in_two_trees():
    fails(tree_batch([row([0, 1]), row([0, 2], tree=1)]), f"{KEY}: expected each node to have "
          r"one parent, got node 0 of prompt group 0 .* in rows \[0, 1\]")


def test_ids_are_scoped_by_prompt_group():
    rows = [row([0, 1]), row([0, 2]), row([0, 1], group=1), row([2, 3], group=1)]
    out = AdvantageModule(recipe("treepo"))(*tree_batch(rows))
    assert torch.isfinite(out["advantages"]).all()


def test_rows_sharing_a_node_with_different_token_counts():
    fails(tree_batch([row([0, 1], [2, 1]), row([0, 2], [3, 1])]), f"{KEY}: expected rows "
          r"passing node 0 of prompt group 0 to hold the same tokens there, got rows \[0, 1\] "
          r"with \[2, 3\] generated tokens of it")


def test_rows_sharing_a_node_with_different_tokens():
    batch, meta = tree_batch([row([0, 1]), row([0, 2])])
    ids = batch["input_ids"].clone()
    ids[1, int(batch["loss_mask"][1].nonzero()[1])] += 1
    fails(({**batch, "input_ids": ids}, meta), f"{KEY}: expected rows passing node 0 of prompt "
          r"group 0 to hold the same tokens there, got different input_ids in rows \[0, 1\]")


def test_two_rows_ending_at_the_same_node():
    fails(tree_batch([row([0, 1]), row([0, 1]), row([2])]), f"{KEY}: expected each row to end "
          r"at its own leaf, got rows \[0, 1\] all ending at node 1 of prompt group 0")


def test_a_row_ending_where_another_goes_on():
    fails(tree_batch([row([0]), row([0, 1])]), f"{KEY}: expected each row to end at a leaf, got "
          r"row 0 ending at node 0 of prompt group 0, which rows \[1\] continue past")


@pytest.mark.parametrize("value, match", [
    (torch.tensor([0, 1]), r"expected a tensor of shape \[3\]"),
    (torch.tensor([0.0, 1.0, 0.0]), "expected an integer tensor, got torch.float32"),
    (torch.tensor([0, -1, 0]), r"expected ids >= 0, got negative ids in rows \[1\]"),
])
def test_bad_tree_ids(value, match):
    batch, meta = tree_batch(GOOD)
    fails(({**batch, "tree_ids": value}, meta),
          f"estimator 'tree_grpo': rollout batch 'tree_ids': {match}")


def test_fractional_node_ids_are_caught_with_the_batch():
    batch, meta = tree_batch(GOOD)
    fails(({**batch, "tree_node_ids": batch["tree_node_ids"].float() + 0.5}, meta),
          "rollout batch 'tree_node_ids': expected integer values")


def test_a_rollout_split_over_rows():
    rows = [row([0, 1]), row([0, 2])]
    batch, _ = tree_batch(rows)
    batch = {**batch, "rollout_group": RolloutGroup((2,))}
    fails(concat_batch([batch]), r"estimator 'tree_grpo': each row is one root-to-leaf path, "
          r"and these logical rollouts split over several rows \(prompts \[0\]\)")


def test_treerl_needs_two_rows_per_group():
    fails(tree_batch([row([0, 1]), row([0, 2]), row([0], group=1)]), r"estimator 'treerl': "
          r"TreeRL's leave-one-out leaf rewards need two or more rows per prompt group; groups "
          r"\[1\] have one", "treerl")


def test_node_means_average_each_place_of_a_node_over_the_rows_through_it():
    # token-aligned rows: a prompt token, then nodes. Row 1 has a masked span (9) inside
    # node 0, so its node 0 tokens are at positions 1 and 3; row 2 is prompt group 1's
    # node 0, another node though it has the same id.
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 1, 0, 1, 1, 1], [0, 1, 0, 0, 0, 0]])
    ids = torch.tensor([[-1, 0, 0, 1, -1, -1], [-1, 0, -1, 0, 2, 2], [-1, 0, -1, -1, -1, -1]])
    tokens = torch.tensor([[7, 1, 2, 3, 0, 0], [7, 1, 9, 2, 4, 5], [7, 6, 0, 0, 0, 0]])
    values = torch.tensor([[5.0, 1.0, 2.0, 3.0, 0.0, 0.0], [5.0, 3.0, 9.0, 4.0, 6.0, 7.0],
                           [5.0, 10.0, 0.0, 0.0, 0.0, 0.0]])
    paths = tree_paths(ids, mask, tokens, torch.tensor([0, 0, 1]))
    means = node_means(paths, values)
    # node 0 of group 0: place 0 (1 + 3) / 2, place 1 (2 + 4) / 2; the others their own
    assert means.tolist() == [[0.0, 2.0, 3.0, 3.0, 0.0, 0.0], [0.0, 2.0, 0.0, 3.0, 6.0, 7.0],
                              [0.0, 10.0, 0.0, 0.0, 0.0, 0.0]]
    assert values[1, 2] == 9.0 and means.dtype == values.dtype   # the input is unchanged


def test_tree_paths_errors_name_the_caller_s_key():
    with pytest.raises(ValueError, match="^advantage_heatmap: tree_node_ids: expected an id >= 0"):
        tree_paths(torch.tensor([[-1, -2]]), torch.tensor([[0, 1]]), torch.tensor([[1, 2]]),
                   torch.tensor([0]), where="advantage_heatmap", key="tree_node_ids")
