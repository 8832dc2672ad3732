"""The trainer's advantage heatmaps of tree rollouts (``ppo.tree``): the training image of
a real tree batch draws each shared token once, coloured by the mean advantage over all
the batch's rows through its node (the chosen leaves' and the others'), with segment
marks; a short tree_grpo fit logs it, and its validation image (independent responses)
shares nothing."""

from collections import defaultdict

import numpy as np
import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_adv.trainer.data import generator
from lightning_adv.trainer.logs.heatmap_log import chosen_groups
from tests.support.cli_runs import fit
from tests.trainer.test_heatmap_logging import images
from tests.trainer.test_tree_trainer import module

TREE_GRPO = {"kl_ctl": 0.0, "advantage": {"estimator": {"implementation": "tree_grpo",
                                                         "kwargs": {"combine": "sum"}}}}
SEGMENT = np.array([0.0, 0.62, 0.23]) * 255   # the segment marks' colour


def green_pixels(image):
    return int((np.abs(image.astype(float) - SEGMENT).max(axis=2) <= 40).sum())


def node_places(ep):
    """Each generated token's (node, place in the node) by position, None elsewhere."""
    out, count = [], defaultdict(int)
    for node, generated in zip(ep.tree_node_ids, ep.generated):
        out.append((node, count[node]) if generated else None)
        count[node] += generated
    return out


def test_the_training_heatmap_of_a_tree_batch_draws_each_shared_token_once_at_its_mean(tmp_path):
    # prompts_per_step 2, binary trees of depth 3 (8 leaves); sample_log's defaults: 2
    # groups, the first 4 leaves of each (half a tree: its first root's subtree)
    model = module(actor=TREE_GRPO)
    model.trainer = Trainer(logger=TensorBoardLogger(tmp_path, name="tree"), accelerator="cpu",
                            devices=1, enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False)
    groups = model.rollout([0, 1], generator(5, "rollout"))
    batch, meta = model.make_batch(groups)
    out = model.advantage(batch, meta)
    heatmaps = model.heatmap_log.training(model, batch, out, groups)
    heatmap = heatmaps["train/advantage_heatmap"]
    # the rows HeatmapLog chose: each chosen group's first 4 leaves
    offsets = np.cumsum([0] + [len(g) for g in groups])
    rows = [(g, s) for g in chosen_groups(groups, 2) for s in range(min(4, len(groups[g])))]
    # each row's token-aligned advantages (the module's are next-token aligned)
    aligned = out["advantages"].double().roll(1, dims=1)
    means = defaultdict(list)   # (group, node, place) -> the advantages all rows give it
    for g, group in enumerate(groups):
        for s, ep in enumerate(group):
            for i, key in enumerate(node_places(ep)):
                if key is not None:
                    means[(g, *key)].append(float(aligned[offsets[g] + s, i]))
    shown = {}          # (group, node, place) -> first (image row, position) showing it
    own_differs = False
    for r, (g, s) in enumerate(rows):
        for i, key in enumerate(node_places(groups[g][s])):
            if key is not None:
                shown.setdefault((g, *key), (r, i))
                own_differs |= float(aligned[offsets[g] + s, i]) != pytest.approx(
                    np.mean(means[(g, *key)]))
    cells = {(c.row, c.position): c for c in heatmap.cells}
    generated = sum(sum(groups[g][s].generated) for g, s in rows)
    # every token of the chosen rows' nodes exactly once, at the first row through it: fewer
    # cells than the rows' tokens
    assert sorted(cells) == sorted(shown.values())
    assert len(cells) < generated, (len(cells), generated)
    for (g, node, place), (r, i) in shown.items():
        assert cells[(r, i)].advantage == pytest.approx(np.mean(means[(g, node, place)]))
    # the means are over all the group's rows: some chosen row's own advantage differs
    assert own_differs
    assert any(c.segment_start for c in heatmap.cells) and green_pixels(heatmap.image) > 20
    # the image logged is the one drawn
    logged, _ = images(tmp_path / "tree" / "version_0")
    [(step, image)] = logged["train/advantage_heatmap"]
    assert step == 0 and np.array_equal(image, heatmap.image.astype(int))


def test_a_tree_grpo_fit_logs_the_tree_in_training_and_independent_responses_in_validation(
        tmp_path):
    fit("tree_grpo", tmp_path, "--trainer.limit_train_batches=1",
        "--model.sample_log.every_n_steps=1")
    logged, _ = images(tmp_path / "tree_grpo" / "version_0")
    assert sorted(logged) == ["train/advantage_heatmap", "val/advantage_heatmap"]
    [(_, train)], [(_, val)] = logged["train/advantage_heatmap"], logged["val/advantage_heatmap"]
    assert green_pixels(train) > 20      # segment marks
    assert green_pixels(val) == 0        # each response its own one-node tree: no mark
    assert val.std() > 20
