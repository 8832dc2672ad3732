"""Aggregation: every loss_agg_mode's value and gradient equal verl 0.9.1's agg_loss (its
released code) on random batches with fully masked rows, including seq-mean-token-sum-norm
divided by the number of non-empty sequences (Dr.GRPO's 1/G) and token-sum."""

import pytest
import torch

from lightning_adv.losses.aggregation import LOSS_AGG_MODES, ROW_MEAN, TokenCounts, aggregate
from tests.support.peers import VERL_CORE_ALGOS, peer_module


def batch(seed: int, rows: int = 7, width: int = 10):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=g) < 0.5).double()
    mask[2] = 0
    mask[5] = 0
    mask[0, :3] = 1
    values = torch.randn(rows, width, generator=g, dtype=torch.float64)
    return values, mask


@pytest.mark.peers
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_each_mode_and_its_gradient_equal_verls_agg_loss(mode, seed):
    core = peer_module(*VERL_CORE_ALGOS)
    values, mask = batch(seed)
    ours_in = values.clone().requires_grad_(True)
    theirs_in = values.clone().requires_grad_(True)
    factor = 13.0 if mode == "seq-mean-token-sum-norm" else None
    ours = aggregate(ours_in, mask, mode, TokenCounts(mask, sync=False), factor)
    theirs = core.agg_loss(theirs_in, mask, mode, loss_scale_factor=factor)
    # (verl divides seq-mean-token-mean's token sums by count + 1e-8: relative 1e-9)
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-12)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=1e-7, atol=1e-12)


def test_dr_grpo_norm_is_one_over_sequences_times_the_constant():
    values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [7.0, 7.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float64)
    counts = TokenCounts(mask, sync=False)
    assert aggregate(values, mask, "seq-mean-token-sum-norm", counts, 4.0).item() == 6 / 2 / 4
    assert aggregate(values, mask, "token-sum", counts).item() == 6.0
    assert aggregate(values, mask, ROW_MEAN, counts).item() == 6 / 3  # every row, empty too
