"""advantage_heatmap of tree rollouts (``tree_node_ids``): each shared prefix drawn once,
a branch starting at the column after the prefix it shares, a shared token coloured by
the mean advantage of the rows through its node, segment marks, a line between prompt
groups, node ids compared within a group only; heatmap_inputs' batch-wide means; bad
inputs. Cells are read from the returned records and the image's pixels."""

import re

import numpy as np
import pytest
import torch
from matplotlib import colormaps

from lightning_adv.visualize import advantage_heatmap, heatmap_inputs
from tests.visualize.test_heatmap import cell_colour

SEGMENT = np.array([0.0, 0.62, 0.23]) * 255   # the segment marks' colour
SEPARATOR = 140                               # the line between groups ("0.55" grey)

# Two prompts, each a binary tree of depth 2: the root's children 0 and 1, node 0's
# children 2 and 3, node 1's children 4 and 5; one row per leaf, in path order.
# Prompt A ("<p>"): 0 = a b, 2 = c, 3 = d e, 1 = f, 4 = g, 5 = h.
# Prompt B ("<q> <r>"): the same node ids and node 0's same texts (ids are scoped by
# prompt group: nothing is shared with A): 0 = a b, 2 = x, 3 = y, 1 = z, 4 = w, 5 = v.
TOKENS = [["<p>", "a", "b", "c"], ["<p>", "a", "b", "d", "e"], ["<p>", "f", "g"],
          ["<p>", "f", "h"],
          ["<q>", "<r>", "a", "b", "x"], ["<q>", "<r>", "a", "b", "y"], ["<q>", "<r>", "z", "w"],
          ["<q>", "<r>", "z", "v"]]
NODES = [[-1, 0, 0, 2], [-1, 0, 0, 3, 3], [-1, 1, 4], [-1, 1, 5],
         [-1, -1, 0, 0, 2], [-1, -1, 0, 0, 3], [-1, -1, 1, 4], [-1, -1, 1, 5]]
MASK = [[0 if n < 0 else 1 for n in row] for row in NODES]
# token-aligned advantages; the prompt's entries are never read
ADVANTAGES = [[9.0, 1.0, 0.5, 1.0], [9.0, -0.5, -1.5, -0.5, -0.5], [9.0, 0.25, 0.25],
              [9.0, -1.0, -1.0],
              [9.0, 9.0, 2.0, 2.0, 2.0], [9.0, 9.0, 0.0, 0.0, 0.0], [9.0, 9.0, -2.0, -2.0],
              [9.0, 9.0, 1.0, 1.0]]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]
# hand-computed: each shared token the mean of the rows through its node, place by place
# A node 0: a (1 - 0.5) / 2 = 0.25, b (0.5 - 1.5) / 2 = -0.5;  A node 1: (0.25 - 1) / 2
# B node 0: (2 + 0) / 2 = 1 on both;  B node 1: (-2 + 1) / 2 = -0.5
SHARED = {(0, 1): 0.25, (0, 2): -0.5, (2, 1): -0.375, (4, 2): 1.0, (4, 3): 1.0, (6, 2): -0.5}
OWN = {(0, 3): 1.0, (1, 3): -0.5, (1, 4): -0.5, (2, 2): 0.25, (3, 2): -1.0, (4, 4): 2.0,
       (5, 4): 0.0, (6, 3): -2.0, (7, 3): 1.0}


def tree_heatmap(**kwargs):
    arguments = dict(tree_node_ids=NODES, tree_groups=GROUPS, limit=2.0)
    arguments.update(kwargs)
    return advantage_heatmap(TOKENS, ADVANTAGES, MASK, **arguments)


def cells(heatmap):
    return {(c.row, c.position): c for c in heatmap.cells}


def test_each_shared_prefix_is_drawn_once_and_each_branch_starts_after_it():
    drawn = cells(tree_heatmap())
    # exactly the shared nodes' first rows and every row's own tokens: no cell twice
    assert sorted(drawn) == sorted([*SHARED, *OWN])
    assert len(drawn) == len(tree_heatmap().cells) == 15 < sum(map(sum, MASK)) == 21
    for row, first, above in ((1, 3, 0), (3, 2, 2), (5, 4, 4), (7, 3, 6)):
        # the branching row's first cell: the column of the row above's first own cell,
        # right after the shared prefix's last cell, one response lower
        mine, theirs = drawn[(row, first)].box, drawn[(above, first)].box
        assert mine[0] == theirs[0] and mine[2] == theirs[2], (row, mine, theirs)
        assert abs(mine[0] - drawn[(above, first - 1)].box[2]) <= 1
        assert mine[1] > theirs[3]
    # prompt B starts its own tree at the first column, though its node 0 has A's id and texts
    assert drawn[(4, 2)].box[0] == drawn[(0, 1)].box[0] == drawn[(2, 1)].box[0]


def test_a_shared_token_is_coloured_by_the_mean_advantage_of_the_rows_through_it():
    heatmap = tree_heatmap()
    drawn = cells(heatmap)
    for key, expected in {**SHARED, **OWN}.items():
        assert drawn[key].advantage == pytest.approx(expected), key
        # on the image: RdBu at the value on [-2, 2] (limit 2)
        colour = np.array(colormaps["RdBu"]((expected + 2.0) / 4.0)[:3]) * 255
        assert np.abs(cell_colour(heatmap, *key) - colour).max() <= 2, key
    # without the tree every row draws its own numbers again
    flat = cells(advantage_heatmap(TOKENS, ADVANTAGES, MASK, limit=2.0))
    assert len(flat) == 21 and flat[(1, 1)].advantage == -0.5 and flat[(0, 1)].advantage == 1.0


def green_pixels(image, box):
    x0, y0, x1, y1 = box
    around = image[y0:y1, max(x0 - 3, 0):x0 + 3].reshape(-1, 3).astype(float)
    return int((np.abs(around - SEGMENT).max(axis=1) <= 40).sum())


def test_a_mark_starts_each_segment_after_the_row_s_first_token_and_a_line_parts_the_groups():
    heatmap = tree_heatmap()
    drawn = cells(heatmap)
    starts = {key for key, c in drawn.items() if c.segment_start}
    assert starts == {(0, 3), (1, 3), (2, 2), (3, 2), (4, 4), (5, 4), (6, 3), (7, 3)}
    for key, cell in drawn.items():
        assert (green_pixels(heatmap.image, cell.box) > 10) == (key in starts), key
    # one grey line between prompt A's last row and prompt B's first, none inside a group
    grey = (np.abs(heatmap.image.astype(int) - SEPARATOR).max(axis=2) <= 12).sum(axis=1)
    lines = [y for y in range(len(grey)) if grey[y] > 100]
    assert lines and drawn[(3, 2)].box[3] < min(lines) <= max(lines) < drawn[(4, 2)].box[1]
    # a heatmap without a tree has no mark
    plain = advantage_heatmap(TOKENS, ADVANTAGES, MASK, limit=2.0)
    assert all(green_pixels(plain.image, c.box) == 0 for c in plain.cells)


def test_rows_out_of_path_order_leave_empty_what_any_earlier_row_drew():
    order = [0, 2, 1]   # node 0's second leaf after node 1's first
    heatmap = advantage_heatmap([TOKENS[b] for b in order], [ADVANTAGES[b] for b in order],
                                [MASK[b] for b in order], tree_node_ids=[NODES[b] for b in order],
                                tree_groups=[0, 0, 0], limit=2.0)
    drawn = cells(heatmap)
    assert sorted(drawn) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (2, 3), (2, 4)]
    assert drawn[(2, 3)].box[0] == drawn[(0, 3)].box[0] and drawn[(2, 3)].segment_start
    # node 1 has one row here: its own advantage
    assert drawn[(1, 1)].advantage == 0.25 and drawn[(0, 1)].advantage == 0.25


def shifted(token_aligned_rows, width):
    """The module's next-token alignment of token-aligned rows: position t holds token t + 1."""
    out = torch.zeros(len(token_aligned_rows), width)
    for b, row in enumerate(token_aligned_rows):
        out[b, : len(row) - 1] = torch.tensor(row[1:])
    return out


def tree_batch():
    width = max(map(len, TOKENS))
    vocabulary = {}
    ids = [[vocabulary.setdefault(t, len(vocabulary) + 1) for t in row] for row in TOKENS]

    def pad(rows, fill):
        return torch.tensor([list(row) + [fill] * (width - len(row)) for row in rows])

    batch = {"input_ids": pad(ids, 0), "attention_mask": pad([[1] * len(r) for r in TOKENS], 0),
             "loss_mask": pad(MASK, 0),
             "tree_node_ids": pad([[n if n >= 0 else 7 for n in row] for row in NODES], 7)}
    text = {i: t for t, i in vocabulary.items()}
    return batch, {"advantages": shifted(ADVANTAGES, width)}, text.__getitem__


def test_heatmap_inputs_colour_a_few_rows_shared_tokens_by_the_whole_batch_s_mean():
    batch, out, token_text = tree_batch()
    # the batch's ids off generated tokens are never read (7 there): -1 in the inputs
    inputs = heatmap_inputs(batch, out, token_text, [0, 4, 6], group_sizes=[4, 4])
    assert inputs["tree_groups"].tolist() == [0, 1, 1]
    assert inputs["tree_node_ids"][0].tolist() == [-1, 0, 0, 2, -1]
    drawn = cells(advantage_heatmap(**inputs, limit=2.0))
    # row 0 alone is drawn from prompt A: its node 0 still shows the mean with row 1's
    assert drawn[(0, 1)].advantage == pytest.approx(0.25)
    assert drawn[(0, 2)].advantage == pytest.approx(-0.5)
    assert drawn[(1, 2)].advantage == pytest.approx(1.0)    # B's node 0 (rows 4 and 5)
    assert drawn[(2, 2)].advantage == pytest.approx(-0.5)   # B's node 1 (rows 6 and 7)
    assert drawn[(0, 3)].advantage == 1.0                   # a leaf: its own
    assert (2, 2) in drawn and (2, 3) in drawn   # row 6 shares nothing with row 4
    with pytest.raises(ValueError, match=re.escape(
            "heatmap_inputs group_sizes: expected the rows of each prompt group, positive "
            "integers summing to the batch's 8 rows (meta.traj_group_sizes; the batch has "
            "'tree_node_ids'), got None")):
        heatmap_inputs(batch, out, token_text, [0])
    with pytest.raises(ValueError, match=re.escape("got [4, 3]")):
        heatmap_inputs(batch, out, token_text, [0], group_sizes=[4, 3])
    # the batch contract's checks, named as the estimators name them
    broken = dict(batch, input_ids=batch["input_ids"].clone())
    broken["input_ids"][1, 2] = broken["input_ids"][1, 3]
    with pytest.raises(ValueError, match=re.escape(
            "heatmap_inputs: rollout batch 'tree_node_ids': expected rows passing node 0 of "
            "prompt group 0 to hold the same tokens there")):
        heatmap_inputs(broken, out, token_text, [0], group_sizes=[4, 4])


def with_row(name, b, row):
    given = {"tree_node_ids": NODES, "tokens": TOKENS}
    rows = [list(r) for r in given[name]]
    rows[b] = row
    return rows


@pytest.mark.parametrize("kwargs, message", [
    (dict(tree_node_ids=with_row("tree_node_ids", 0, [0, 0, 0, 2])),
     "advantage_heatmap tree_node_ids[0]: expected an integer node id on every generated "
     "token and -1 on every other token, got '0.0 at position 0'"),
    (dict(tree_node_ids=with_row("tree_node_ids", 2, [-1, 1, 1.5])),
     "advantage_heatmap tree_node_ids[2]: expected an integer node id on every generated "
     "token and -1 on every other token, got '1.5 at position 2'"),
    (dict(tree_node_ids=with_row("tree_node_ids", 1, [-1, 0, 3, 0, 3])),
     "advantage_heatmap: tree_node_ids: expected each node's generated tokens to be one "
     "contiguous run of the row's generated tokens, got rows [1]"),
    (dict(tree_node_ids=with_row("tree_node_ids", 1, [-1, 0, 0, -2, -2])),
     "advantage_heatmap: tree_node_ids: expected an id >= 0 on every generated token, got "
     "negative ids in rows [1]"),
    (dict(tree_node_ids=with_row("tree_node_ids", 3, [-1, 0, 5])),
     "advantage_heatmap: tree_node_ids: expected rows passing node 0 of prompt group 0 to "
     "hold the same tokens there"),
    (dict(tree_node_ids=with_row("tree_node_ids", 1, [-1, 0, 0, 2, 2])),
     "advantage_heatmap: tree_node_ids: expected each row to end at its own leaf, got rows "
     "[0, 1] all ending at node 2 of prompt group 0"),
    (dict(tree_node_ids=NODES[:7]),
     "advantage_heatmap tree_node_ids: expected one row per row of tokens (8), got '7 rows'"),
    (dict(tree_groups=None),
     "advantage_heatmap tree_groups: expected one group (an int or str) per row (8), given "
     "with tree_node_ids, got None"),
    (dict(tree_groups=[0, 0, 1, 1, 0, 0, 1, 1]),
     "advantage_heatmap tree_groups: expected the rows of each group consecutive, got "
     "'group 0 again at row 4'"),
    (dict(tree_groups=[0, 0, 0, 0, 1.0, 1, 1, 1]),
     "advantage_heatmap tree_groups: expected an int or str per row, got 1.0"),
    (dict(tree_node_ids=None),
     "advantage_heatmap tree_groups: expected None without tree_node_ids, got 'per-row "
     "groups'"),
])
def test_bad_tree_inputs_are_named(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tree_heatmap(**kwargs)


def test_two_prompts_given_one_group_are_one_tree_whose_nodes_collide():
    # node ids are scoped by group: prompt B's rows in prompt A's group end at A's leaves
    with pytest.raises(ValueError, match=re.escape(
            "advantage_heatmap: tree_node_ids: expected each row to end at its own leaf, got "
            "rows [0, 4] all ending at node 2 of prompt group 0")):
        tree_heatmap(tree_groups=[0] * 8)
