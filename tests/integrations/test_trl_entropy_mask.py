"""``top_entropy_mask`` against TRL 1.16's ``top_entropy_quantile``: TRL's released
``GRPOTrainer.get_high_entropy_mask`` (grpo_trainer.py pinned by hash) is run on the same
entropies and mask, in one process (its accelerator's gather of one rank is the identity),
and the tokens it keeps are exactly those our stage leaves with their advantage; the
others get advantage 0."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_adv import ActorConfig, ProcessAdvantageInputs
from lightning_adv.stages.entropy_shaping import top_entropy_mask
from tests.support.peers import TRL_GRPO_TRAINER, peer_module

pytestmark = pytest.mark.peers


def trl_high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor,
                          top_entropy_quantile: float) -> torch.Tensor:
    """TRL's own selection, as its loss calls it: threshold ``1 - top_entropy_quantile``."""
    grpo_trainer = peer_module(*TRL_GRPO_TRAINER)
    one_process = SimpleNamespace(accelerator=SimpleNamespace(
        pad_across_processes=lambda x, dim, pad_index: x, gather=lambda x: x))
    return grpo_trainer.GRPOTrainer.get_high_entropy_mask(
        one_process, entropies, mask, 1 - top_entropy_quantile)


def ours(entropies: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The tokens our stage keeps: where a non-zero advantage stays non-zero."""
    advantages = torch.ones_like(entropies)
    inputs = ProcessAdvantageInputs(advantages, None, mask.float(), ActorConfig(), None,
                                    {"entropies": entropies})
    shaped = top_entropy_mask(inputs, quantile=quantile)
    assert bool(((shaped == 0) | (shaped == advantages)).all())
    return (shaped != 0) & mask.bool()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 16), quantile=st.sampled_from([0.05, 0.2, 0.5, 0.8, 1.0]),
       ties=st.booleans())
def test_the_kept_tokens_are_trls(seed, quantile, ties):
    g = torch.Generator().manual_seed(seed)
    rows, width = int(torch.randint(1, 6, (), generator=g)), int(torch.randint(2, 12, (), generator=g))
    entropies = torch.rand(rows, width, generator=g) * 3
    if ties:  # repeated values: the threshold lands on a tie
        entropies = (entropies * 2).round() / 2
    mask = torch.rand(rows, width, generator=g) < 0.7
    expected = trl_high_entropy_mask(entropies, mask.int(), quantile)
    assert torch.equal(ours(entropies, mask, quantile), expected)


def test_a_hand_computed_case_and_trl_agree():
    """Active entropies 0, 1, 2, 3 (the padded 9 is not a token): quantile 0.5 keeps the
    tokens at or above torch.quantile([0, 1, 2, 3], 0.5) = 1.5: those of entropy 2 and 3."""
    entropies = torch.tensor([[0.0, 3.0, 9.0], [1.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    expected = torch.tensor([[False, True, False], [False, True, False]])
    assert torch.equal(trl_high_entropy_mask(entropies, mask, 0.5), expected)
    assert torch.equal(ours(entropies, mask, 0.5), expected)
