"""advantage_heatmap: the colour of each token's cell read back from the image's pixels,
the grey of environment tokens, turn bars, strips, wrapping; the inputs taken from a real
AdvantageModule output; bad inputs; the package without matplotlib."""

import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from matplotlib import colormaps

import lightning_adv
from lightning_adv import ActorConfig, AdvantageModule, NormConfig, concat_batch
from lightning_adv.visualize import advantage_heatmap, heatmap_inputs, token_aligned
from tests.support.without_package import run_without

# RdBu: red below 0, white at 0, blue above
RED_END, MIDDLE, BLUE_END = (np.array(colormaps["RdBu"](x)[:3]) * 255 for x in (0.0, 0.5, 1.0))
GREY = np.array([0.82, 0.82, 0.82]) * 255


def cell_colour(heatmap, row, position):
    """The most common colour inside a token's cell (its fill: the glyph covers less)."""
    cell = next(c for c in heatmap.cells if (c.row, c.position) == (row, position))
    x0, y0, x1, y1 = cell.box
    assert x1 - x0 >= 8 and y1 - y0 >= 12, cell  # a cell, not a sliver
    pixels = heatmap.image[y0:y1, x0:x1].reshape(-1, 3)
    colour, _ = Counter(map(tuple, pixels)).most_common(1)[0]
    return np.array(colour, dtype=float)


def three_tokens(**kwargs):
    # <bos> is the prompt; "a", "b", "c" generated with advantages +1, -1, 0.
    return advantage_heatmap([["<bos>", "a", "b", "c"]], [[0.0, 1.0, -1.0, 0.0]],
                             [[0, 1, 1, 1]], labels=["prompt 0 · reward 1"], **kwargs)


def test_positive_negative_and_zero_advantages_have_their_colours_on_the_image():
    heatmap = three_tokens()
    assert heatmap.limit == 1.0  # the largest |advantage| shown
    positive, negative, zero = (cell_colour(heatmap, 0, i) for i in (1, 2, 3))
    r, g, b = positive
    assert b > r + 60 and b > g + 30, positive        # blue
    r, g, b = negative
    assert r > b + 60 and r > g + 60, negative        # red
    assert zero.min() > 235 and np.ptp(zero) < 6, zero  # white
    # exactly the colour map's ends and middle (one scale: ±limit)
    assert np.abs(positive - BLUE_END).max() <= 2
    assert np.abs(negative - RED_END).max() <= 2
    assert np.abs(zero - MIDDLE).max() <= 2
    assert heatmap.image.dtype == np.uint8 and heatmap.image.shape[2] == 3
    assert [c.position for c in heatmap.cells] == [1, 2, 3]  # the prompt is not drawn


def test_one_scale_per_image_darker_for_larger_advantages_and_saturating_at_the_limit():
    heatmap = advantage_heatmap([["p", "a", "b", "c", "d"]], [[0, 0.25, 0.5, 2.0, -0.5]],
                                [[0, 1, 1, 1, 1]], limit=1.0)
    quarter, half, beyond, minus_half = (cell_colour(heatmap, 0, i) for i in (1, 2, 3, 4))
    assert quarter.sum() > half.sum() > beyond.sum()   # darker blue with the advantage
    assert np.abs(beyond - BLUE_END).max() <= 2        # beyond the limit: the end colour
    expected = np.array(colormaps["RdBu"](0.25)[:3]) * 255  # -0.5 on [-1, 1]
    assert np.abs(minus_half - expected).max() <= 2
    # the default scale is the largest |advantage|: the same row, scaled to 2
    assert advantage_heatmap([["p", "a", "b", "c", "d"]], [[0, 0.25, 0.5, 2.0, -0.5]],
                             [[0, 1, 1, 1, 1]]).limit == 2.0


def test_environment_tokens_are_grey_and_a_bar_marks_each_later_turn():
    # prompt | turn 0: a b | reply: x y | turn 1: c d
    tokens = [["<bos>", "a", "b", "x", "y", "c", "d"]]
    mask = [[0, 1, 1, 0, 0, 1, 1]]
    advantages = [[0, 0.5, 0.5, 9.0, 9.0, -0.5, -0.5]]  # the reply's numbers are not shown
    heatmap = advantage_heatmap(tokens, advantages, mask, turn_ids=[[-1, 0, 0, -1, -1, 1, 1]])
    assert heatmap.limit == 0.5
    for position in (3, 4):
        assert np.abs(cell_colour(heatmap, 0, position) - GREY).max() <= 2
    r, g, b = cell_colour(heatmap, 0, 5)
    assert r > b  # turn 1 keeps its own colour
    start = next(c for c in heatmap.cells if c.position == 5).box
    column = heatmap.image[start[1]:start[3], start[0] - 1:start[0] + 2]
    assert (column.max(axis=2) < 60).mean() > 0.5  # a black bar at turn 1's first token
    second = next(c for c in heatmap.cells if c.position == 2).box
    column = heatmap.image[second[1]:second[3], second[0] - 1:second[0] + 2]
    assert (column.max(axis=2) < 60).mean() < 0.1  # none inside a turn


def test_strips_show_process_rewards_and_values_under_each_token():
    tokens = [["<bos>", "a", "b"]]
    heatmap = advantage_heatmap(tokens, [[0, 1.0, -1.0]], [[0, 1, 1]],
                                process_rewards=[[0, 2.0, -2.0]], values=[[0, -0.3, 0.3]])
    first = next(c for c in heatmap.cells if c.position == 1).box
    x = (first[0] + first[2]) // 2
    below = heatmap.image[first[3] + 2: first[3] + 30, x]
    green_end = np.array(colormaps["PiYG"](1.0)[:3]) * 255   # process reward +2 of ±2
    brown_end = np.array(colormaps["BrBG"](0.0)[:3]) * 255   # value -0.3 of ±0.3
    assert any(np.abs(p - green_end).max() <= 3 for p in below)
    assert any(np.abs(p - brown_end).max() <= 3 for p in below)
    without = advantage_heatmap(tokens, [[0, 1.0, -1.0]], [[0, 1, 1]])
    assert heatmap.image.shape[1] > without.image.shape[1]  # two more colour bars


def strip_pixels_below(heatmap, position, height=60):
    cell = next(c for c in heatmap.cells if c.position == position).box
    return heatmap.image[cell[3] + 2: cell[3] + height, (cell[0] + cell[2]) // 2]


def holds(pixels, rgb):
    return any(np.abs(p - np.array(rgb)).max() <= 3 for p in pixels)


def ends(name):
    return [np.array(colormaps[name](x)[:3]) * 255 for x in (0.0, 1.0)]


def test_named_strips_show_entropy_importance_weight_and_rejection_on_their_scales():
    tokens = [["<bos>", "a", "b"]]
    heatmap = advantage_heatmap(
        tokens, [[0, 1.0, -1.0]], [[0, 1, 1]],
        strips={"entropy": [[0, 0.0, 2.5]], "log IS weight": [[0, 0.4, -0.4]],
                "rejected": [[0, 0.0, 1.0]]})
    low_entropy, high_entropy = ends("viridis")    # entropy on [0, 2.5]
    below_old, above_old = ends("PuOr")           # log w on [-0.4, 0.4]
    kept, rejected = ends("Greys")                # the flag on [0, 1]
    first, second = strip_pixels_below(heatmap, 1), strip_pixels_below(heatmap, 2)
    assert holds(first, low_entropy) and holds(second, high_entropy)
    assert holds(first, above_old) and holds(second, below_old)
    assert holds(first, kept) and holds(second, rejected)
    assert not holds(first, rejected) and not holds(second, low_entropy)
    # the strips are drawn in one order whatever the mapping's: entropy, log w, rejected
    rows = [y for y, p in enumerate(first) if np.abs(p - low_entropy).max() <= 3]
    rows_w = [y for y, p in enumerate(first) if np.abs(p - above_old).max() <= 3]
    rows_r = [y for y, p in enumerate(first) if np.abs(p - kept).max() <= 3]
    assert max(rows) < min(rows_w) and max(rows_w) < min(rows_r)
    without = advantage_heatmap(tokens, [[0, 1.0, -1.0]], [[0, 1, 1]])
    assert heatmap.image.shape[1] > without.image.shape[1]  # three more colour bars


@pytest.mark.parametrize("strips, message", [
    ({"entropies": [[0, 1.0]]}, r"advantage_heatmap strips: expected names among "
                                r"\['entropy', 'log IS weight', 'rejected'\], got \['entropies'\]"),
    ([[0, 1.0]], r"advantage_heatmap strips: expected a mapping of strip names"),
    ({"entropy": [[0, float("inf")]]}, r"advantage_heatmap strips\['entropy'\]\[0\]: expected "
                                       r"finite numbers at generated tokens"),
    ({"rejected": [[0]]}, r"advantage_heatmap strips\['rejected'\]\[0\]: expected at least one "
                          r"entry per token \(2\)"),
])
def test_bad_named_strips_get_one_clear_error(strips, message):
    with pytest.raises(ValueError, match=message):
        advantage_heatmap([["a", "b"]], [[0.0, 1.0]], [[0, 1]], strips=strips)


def test_off_policy_strips_are_the_log_weights_and_the_rejections_the_loss_will_apply():
    from lightning_adv.losses.rollout_correction import rollout_correction
    from lightning_adv.visualize.inputs import off_policy_strips

    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.float32)
    old = -torch.rand(2, 5, generator=g)
    rollout = (old - 0.3 * torch.randn(2, 5, generator=g)).clamp(max=0.0)
    out = {"loss_mask": mask, "logprobs": old, "rollout_logprobs": rollout}
    assert off_policy_strips({"loss_mask": mask, "logprobs": old}, None) == {}  # on-policy
    strips = off_policy_strips(out, None)
    assert list(strips) == ["log IS weight"]
    expected = torch.where(mask > 0, old.double() - rollout.double(), 0.0)
    assert torch.equal(strips["log IS weight"], expected)
    correction = {"rollout_rs": "token_k2", "rollout_rs_threshold": 0.02}
    strips = off_policy_strips(out, correction)
    kept = rollout_correction(old, rollout, mask, **correction).loss_mask
    rejected = strips["rejected"]
    assert 0 < rejected.sum() < mask.sum()  # some tokens rejected, not all
    assert torch.equal(rejected, ((mask > 0) & (kept == 0)).double())
    # by hand: token_k2 rejects where (log w)^2 / 2 > 0.02, i.e. |log w| > 0.2
    assert torch.equal(rejected > 0, (mask > 0) & (expected.abs() > 0.2))
    assert torch.equal(out["logprobs"], old) and torch.equal(out["loss_mask"], mask)


def test_the_batch_entropies_become_a_token_aligned_strip():
    ids = torch.tensor([[1, 5, 6, 7]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "loss_mask": torch.tensor([[0, 0, 1, 1]]),
             "entropies": torch.tensor([[0.0, 1.5, 0.5, 0.0]])}  # next-token aligned
    out = {"advantages": torch.zeros(1, 4)}
    inputs = heatmap_inputs(batch, out, str)
    assert torch.equal(inputs["strips"]["entropy"], torch.tensor([[0.0, 0.0, 1.5, 0.5]]))
    assert "strips" not in heatmap_inputs({k: v for k, v in batch.items() if k != "entropies"},
                                          out, str)


def test_long_responses_wrap_onto_lines_of_cells_that_do_not_overlap():
    text = list("the quick brown fox jumps over the lazy dog") * 2
    heatmap = advantage_heatmap([["<bos>"] + text], [[0.0] + [0.1 * (i % 5 - 2) for i in range(len(text))]],
                                [[0] + [1] * len(text)], width=20)
    lines = sorted({c.box[1] for c in heatmap.cells})
    assert len(lines) >= len(text) * 2 // 20  # 2 characters per one-character token
    height, width = heatmap.image.shape[:2]
    boxes = [c.box for c in heatmap.cells]
    assert all(0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height for x0, y0, x1, y1 in boxes)
    for a, b in zip(boxes, boxes[1:]):
        assert a[2] <= b[0] or a[3] <= b[1]  # the next cell is right of it, or below
    shown = advantage_heatmap([["<bos>"] + text], [[0.0] * (len(text) + 1)],
                              [[0] + [1] * len(text)], max_tokens=10)
    assert len(shown.cells) == 10


def test_the_inputs_come_token_aligned_from_a_real_advantage_module_output():
    # Two prompts, two responses each; GRPO-style group normalization gives every generated
    # token of a row the row's advantage, and the prompt none.
    def prompt(rewards, lengths):
        ids = torch.tensor([[1, 5, 6] + [7] * n + [0] * (4 - n) for n in lengths])
        mask = torch.tensor([[0, 0, 0] + [1] * n + [0] * (4 - n) for n in lengths])
        return {"input_ids": ids, "attention_mask": (ids > 0).long(), "loss_mask": mask,
                "logprobs": -0.5 * mask.float(), "rewards": torch.tensor(rewards)}

    batch, meta = concat_batch([prompt([1.0, 0.0], [2, 4]), prompt([0.0, 0.5], [3, 1])])
    module = AdvantageModule(ActorConfig(reward_norm=NormConfig(mean_level="group",
                                                                std_level="group"),
                                         adv_norm=NormConfig(), kl_ctl=0.0))
    out = module(batch, meta)
    batch = {**batch, "values": torch.arange(7.0).repeat(4, 1)}  # a critic's, for the strip
    inputs = heatmap_inputs(batch, out, lambda t: f"t{t}", rows=[1, 2])
    assert inputs["tokens"] == [["t1", "t5", "t6", "t7", "t7", "t7", "t7"],
                                ["t1", "t5", "t6", "t7", "t7", "t7"]]
    for k, b in enumerate([1, 2]):
        generated = batch["loss_mask"][b].bool()
        advantages = inputs["advantages"][k]
        assert torch.all(advantages[generated] == out["advantages"][b, 2])  # the row's advantage
        assert torch.all(advantages[~generated] == 0)
        assert torch.equal(advantages[1:], out["advantages"][b, :-1])
        assert torch.equal(inputs["values"][k, 1:], batch["values"][b, :-1])  # V before token i
    raw = heatmap_inputs(batch, out, str, advantages_key="unnormalized_advantages")
    assert torch.equal(raw["advantages"], token_aligned(out["unnormalized_advantages"]))
    heatmap = advantage_heatmap(**inputs, labels=["one", "two"])
    assert len(heatmap.cells) == 4 + 3


@pytest.mark.parametrize("call, message", [
    (lambda: advantage_heatmap([["a", "b"]], [[0.0]], [[0, 1]]),
     r"advantage_heatmap advantages\[0\]: expected at least one entry per token \(2\)"),
    (lambda: advantage_heatmap([["a", "b"]], [[0.0, 1.0]], [[0, 1], [0, 1]]),
     r"advantage_heatmap loss_mask: expected one row per row of tokens \(1\)"),
    (lambda: advantage_heatmap([["a", "b"]], [[0.0, float("nan")]], [[0, 1]]),
     r"advantage_heatmap advantages\[0\]: expected finite numbers at generated tokens, got "
     r"'nan at position 1'"),
    (lambda: advantage_heatmap([["a", "b"]], [[0.0, 1.0]], [[0, 1]], labels=["x", "y"]),
     r"advantage_heatmap labels: expected one string per row \(1\)"),
    (lambda: advantage_heatmap([["a", 3]], [[0.0, 1.0]], [[0, 1]]),
     r"advantage_heatmap tokens\[0\]: expected token texts"),
    (lambda: advantage_heatmap([["a", "b"]], torch.zeros(2), [[0, 1]]),
     r"advantage_heatmap advantages: expected a \[B, T\] array"),
    (lambda: advantage_heatmap([["a", "b"]], [[0.0, 1.0]], [[0, 1]], limit=0.0),
     r"advantage_heatmap limit"),
])
def test_bad_inputs_get_one_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_nan_off_the_generated_tokens_is_not_an_error():
    heatmap = advantage_heatmap([["a", "b"]], [[float("nan"), 1.0]], [[0, 1]])
    assert heatmap.limit == 1.0


def test_the_public_names():
    assert lightning_adv.advantage_heatmap is advantage_heatmap
    assert lightning_adv.heatmap_inputs is heatmap_inputs


def test_without_matplotlib_the_package_imports_and_drawing_names_the_extra(tmp_path):
    result = run_without(("matplotlib", "mpl_toolkits", "pylab"), (
        "import sys\n"
        "import lightning_adv.visualize as v\n"
        "try:\n"
        "    v.advantage_heatmap([['a', 'b']], [[0.0, 1.0]], [[0, 1]])\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ImportError: advantage_heatmap needs matplotlib (pip install "
                                    "'lightning_adv[plot]'): No module named 'matplotlib'")


def test_importing_the_package_does_not_import_matplotlib():
    loaded = subprocess.run([sys.executable, "-c", "import sys, lightning_adv.visualize\n"
                             "print('matplotlib' in sys.modules)"], capture_output=True, text=True,
                            timeout=300)
    assert loaded.stdout.split() == ["False"], loaded.stderr
