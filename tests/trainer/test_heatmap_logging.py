"""The trainer's advantage heatmaps: the image tags a short fit writes to TensorBoard, what
the images hold, the rows chosen, and a run without matplotlib."""

import io
import math

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib import image as mpimg
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_adv.trainer.tasks.episode import Episode
from lightning_adv.trainer.logs.heatmap_log import chosen_groups
from tests.support.cli_runs import CONFIGS, SMALL, fit
from tests.support.trainer_helpers import ddp_fit
from tests.support.without_package import run_without

MATPLOTLIB = ("matplotlib", "mpl_toolkits", "pylab")

GREY = (209, 209, 209)  # environment tokens


def images(log_dir):
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0, "tensors": 0})
    events.Reload()
    out = {tag: [(e.step, decode(e.encoded_image_string)) for e in events.Images(tag)]
           for tag in events.Tags()["images"]}
    return out, events.Tags()["tensors"]


def decode(png):
    return (mpimg.imread(io.BytesIO(png), format="png")[..., :3] * 255).round().astype(int)


def has_colour(image, rgb, tolerance=3):
    return bool(pixels_of(image, rgb, tolerance))


def pixels_of(image, rgb, tolerance=3):
    return int((np.abs(image - np.array(rgb)).max(axis=2) <= tolerance).sum())


def map_end(name, x):
    return tuple(round(c * 255) for c in colormaps[name](x)[:3])


def test_a_short_multi_turn_critic_fit_logs_the_heatmaps_of_training_and_validation(tmp_path):
    # turn_gae: multi-turn (environment replies), a critic (values), actor.adv_norm (raw)
    fit("turn_gae", tmp_path, "--trainer.limit_train_batches=3",
        "--model.sample_log.every_n_steps=2")
    logged, text_tags = images(tmp_path / "turn_gae" / "version_0")
    assert sorted(logged) == ["train/advantage_heatmap", "train/advantage_heatmap_raw",
                              "val/advantage_heatmap", "val/advantage_heatmap_raw"]
    assert [step for step, _ in logged["train/advantage_heatmap"]] == [0, 2]
    assert [step for step, _ in logged["train/advantage_heatmap_raw"]] == [0, 2]
    # at the step of the validation's scalars (the last training step's): a run resumed
    # after it has no TensorBoard event past its checkpoint's step
    assert [step for step, _ in logged["val/advantage_heatmap"]] == [2]
    for tag, entries in logged.items():
        for step, image in entries:
            assert image.shape[0] > 200 and image.shape[1] > 300, (tag, step, image.shape)
            assert image.std() > 20, (tag, step)               # not blank
            assert pixels_of(image, GREY) > 500, (tag, step)   # the environment's replies
            assert has_colour(image, map_end("RdBu", 1.0)), (tag, step)   # advantage bar
            assert has_colour(image, map_end("BrBG", 0.0)), (tag, step)   # value bar
    assert "train/samples/text_summary" in text_tags  # the text table is still there


def test_process_rewards_get_their_strip_and_a_config_without_adv_norm_no_raw_image(tmp_path):
    # gvpo_prm: process scorers, reward (not advantage) normalization, no critic
    fit("gvpo_prm", tmp_path, "--trainer.limit_train_batches=1",
        "--model.sample_log.heatmap_groups=1", "--model.sample_log.heatmap_responses=2")
    logged, _ = images(tmp_path / "gvpo_prm" / "version_0")
    assert sorted(logged) == ["train/advantage_heatmap", "val/advantage_heatmap"]
    for tag, [(step, image)] in logged.items():
        assert has_colour(image, map_end("PiYG", 0.0)), tag      # the process reward bar
        assert not has_colour(image, map_end("BrBG", 0.0)), tag  # no value bar
        assert pixels_of(image, GREY) < 300, tag   # single turn: no replies (a grey cell: ~300)
        # one group of two responses: two labelled rows, each a label line and a token line
        assert image.shape[0] < 260, image.shape


def test_a_decoupled_off_policy_fit_draws_the_importance_weights_and_the_rejections(tmp_path):
    # async_grpo: sampled by a bf16 copy 4 steps behind, pi_old recomputed (decoupled);
    # token_k2 rejection at a threshold low enough that some tokens are rejected
    fit("async_grpo", tmp_path, "--trainer.limit_train_batches=6",
        "--model.sample_log.every_n_steps=5", "--model.sample_log.heatmap_groups=2",
        "--model.ppo.rollout_correction.rollout_rs=token_k2",
        "--model.ppo.rollout_correction.rollout_rs_threshold=0.0001")
    logged, _ = images(tmp_path / "async_grpo" / "version_0")
    (step, image), = [(s, i) for s, i in logged["train/advantage_heatmap"] if s == 5]
    assert has_colour(image, map_end("PuOr", 0.0)), "log IS weight bar"
    assert has_colour(image, map_end("Greys", 1.0)), "rejection bar"
    assert not has_colour(image, map_end("viridis", 0.0)), "no entropy in this batch"


def episode(reward):
    return Episode(index=0, instance=None, tokens=[], generated=[], logprobs=[], turn_ids=[],
                   turns=[], reward=reward)


def test_groups_whose_rewards_differ_are_drawn_first_in_their_order():
    groups = [[episode(1.0), episode(1.0)],            # equal rewards: no signal
              [episode(0.0), episode(1.0)],
              [episode(math.nan), episode(0.5)],       # one scored reward: nothing to compare
              [episode(0.5), episode(0.0), episode(math.nan)]]
    assert chosen_groups(groups, 2) == [1, 3]
    assert chosen_groups(groups, 3) == [0, 1, 3]
    assert chosen_groups(groups[:1], 2) == [0]


def test_without_matplotlib_training_logs_one_line_and_no_image(tmp_path):
    code = ("import pathlib\n"
            "from tests.support.cli_runs import fit\n"
            f"fit('ppo', pathlib.Path({str(tmp_path / 'runs')!r}), "
            "'--trainer.limit_train_batches=3', '--model.sample_log.every_n_steps=1')\n")
    result = run_without(MATPLOTLIB, code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    output = (result.stdout + result.stderr).replace(str(tmp_path), "<tmp>")
    lines = [line for line in output.splitlines() if "matplotlib" in line or "heatmap" in line]
    assert lines == ["advantage heatmaps are skipped: matplotlib is not installed (pip install "
                     "'lightning_adv[plot]'; No module named 'matplotlib')"]
    logged, text_tags = images(tmp_path / "runs" / "ppo" / "version_0")
    assert logged == {}
    assert "train/samples/text_summary" in text_tags and "val/samples/text_summary" in text_tags
    assert "fit: 3 training steps" in result.stdout


def test_under_ddp_every_rank_scores_the_validation_heatmap_and_rank_0_draws(tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    proc = ddp_fit(CONFIGS / "turn_gae.yaml", tmp_path, record, *SMALL,
                   "--model.sample_log.every_n_steps=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged, _ = images(tmp_path / "turn_gae" / "version_0")
    assert {tag: [s for s, _ in entries] for tag, entries in logged.items()} == {
        "train/advantage_heatmap": [0, 1], "train/advantage_heatmap_raw": [0, 1],
        "val/advantage_heatmap": [1], "val/advantage_heatmap_raw": [1]}  # the val scalars' step
    # Both ranks ran the validation's advantage call (a collective under DDP): two training
    # steps, then two prompt groups of the greedy response and 4 samples.
    for rank in (0, 1):
        calls = sorted(record.glob(f"rank{rank}_call*.pt"))
        assert len(calls) == 3, calls
        validation = torch.load(record / f"rank{rank}_call2.pt", weights_only=True)
        assert validation["rewards"].shape == (2 * (1 + 4),)
