"""The optimal token baseline against verl 0.9.1's released estimators, run here:
``optimal_token_baseline`` (steps by column) on single-turn batches, where columns and
generated tokens coincide, and ``tir_optimal_token_baseline`` (steps by generated token)
on multi-turn batches with tool spans, both with verl's rollout importance weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_adv import AdvantageModule
from lightning_adv.recipes import recipe
from tests.support.agent_batches import (
    build, from_response_major, insert_masked_span, random_episode, response_major)
from tests.support.peers import peer_module

pytestmark = pytest.mark.peers

CORE_ALGOS_SHA256 = "a54b6d812db4441e8b0989ae69d2c46b0a0a7b584296f73d8316f264462c37cb"


def verl_core():
    return peer_module("verl.trainer.ppo.core_algos", CORE_ALGOS_SHA256)


def episodes(seed: int, max_turns: int, n_groups: int = 4):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 6, (n_groups,), generator=g).tolist()
    groups = [[random_episode(g, max_turns=max_turns, max_turn_len=4) for _ in range(n)]
              for n in sizes]
    return groups, g


def verl_inputs(batch: dict, groups, with_weights: bool) -> dict:
    old, mask = response_major(batch, "logprobs", aligned=False)
    spq, _ = response_major(batch, "sum_pi_squared", aligned=True)
    weights, _ = response_major(batch, "rollout_is_weights", aligned=True)
    rewards = torch.zeros_like(mask)
    last = mask.shape[1] - 1 - mask.flip(1).argmax(dim=1)   # each row's last generated column
    rewards[torch.arange(len(last)), last] = batch["rewards"]
    index = np.array([i for i, group in enumerate(groups) for _ in group])
    return dict(token_level_rewards=rewards, response_mask=mask, index=index, old_log_probs=old,
                sum_pi_squared=spq, rollout_is_weights=weights if with_weights else None)


def ours(batch, meta, name: str, with_weights: bool, **kwargs) -> torch.Tensor:
    batch = {k: v for k, v in batch.items() if k not in ("values", "ref_logp")}
    if not with_weights:
        del batch["rollout_is_weights"]
    spec = {"implementation": name, "kwargs": kwargs}
    return AdvantageModule(recipe("optimal_token_baseline", advantage={"estimator": spec}))(
        batch, meta)["advantages"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_weights", [False, True])
@pytest.mark.parametrize("handle_zero_tail", [True, False])
def test_single_turn_equals_verls_optimal_token_baseline(seed, with_weights, handle_zero_tail):
    core = verl_core()
    groups, g = episodes(seed, max_turns=1)
    batch, meta = build(groups, g)
    want, _ = core.compute_optimal_token_baseline_advantage(
        **verl_inputs(batch, groups, with_weights), handle_zero_tail=handle_zero_tail)
    got = ours(batch, meta, "optimal_token_baseline", with_weights,
               handle_zero_tail=handle_zero_tail)
    torch.testing.assert_close(got, from_response_major(want, batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_weights", [False, True])
@pytest.mark.parametrize("handle_zero_tail", [True, False])
def test_multi_turn_equals_verls_tir_optimal_token_baseline(seed, with_weights, handle_zero_tail):
    core = verl_core()
    groups, g = episodes(100 + seed, max_turns=3)
    batch, meta = build(groups, g)
    want, _ = core.get_adv_estimator_fn("tir_optimal_token_baseline")(
        **verl_inputs(batch, groups, with_weights), handle_zero_tail=handle_zero_tail)
    for name in ("tir_optimal_token_baseline", "optimal_token_baseline"):
        got = ours(batch, meta, name, with_weights, handle_zero_tail=handle_zero_tail)
        torch.testing.assert_close(got, from_response_major(want, batch), rtol=1e-5, atol=1e-5)


def test_verls_column_steps_move_a_group_when_a_tool_span_grows():
    # The bug our step numbering fixes, shown on verl's own optimal_token_baseline: one
    # row's tool output grows by two tokens and the other rows of its group get other
    # advantages; with tir_optimal_token_baseline (and ours) they keep theirs.
    core = verl_core()
    g = torch.Generator().manual_seed(3)
    group = [random_episode(g, max_turns=3, max_turn_len=4) for _ in range(4)]
    group[0].turns, group[0].spans = [2, 3], [2]
    batch, meta = build([group], g)
    position = group[0].prompt + 2   # the first token of row 0's tool span
    longer = insert_masked_span(batch, 0, position, 2)
    for name, fn in (("optimal_token_baseline", core.compute_optimal_token_baseline_advantage),
                     ("tir_optimal_token_baseline",
                      core.get_adv_estimator_fn("tir_optimal_token_baseline"))):
        before = from_response_major(fn(**verl_inputs(batch, [group], False))[0], batch)
        after = from_response_major(fn(**verl_inputs(longer, [group], False))[0], longer)
        moved = (after[1:, :before.shape[1]] - before[1:]).abs().max()
        if name == "optimal_token_baseline":
            assert moved > 1e-3
        else:
            assert moved < 1e-6
    mine = ours(batch, meta, "optimal_token_baseline", False)
    mine_longer = ours(longer, meta, "optimal_token_baseline", False)
    torch.testing.assert_close(mine_longer[1:, :mine.shape[1]], mine[1:])
