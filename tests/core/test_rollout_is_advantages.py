"""Advantages under off-policy data: a stage declares the rollout IS weights it reads
(register_stage(reads=...)); the optimal token baseline with rollout_is_weights equals verl
0.9.1's (its released code), each group member weighted by its own ratio, so a group whose
members come from different policy versions keeps the right baseline."""

import math
import warnings

import numpy as np
import pytest
import torch

from lightning_adv import AdvantageModule, concat_batch, register_stage
from lightning_adv.recipes import recipe
from lightning_adv.stages.registry import unregister_stage
from tests.support.batches import rows_batch
from tests.support.peers import VERL_CORE_ALGOS, peer_module


def run(config, batch, meta=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AdvantageModule(config)(batch, meta)


def otb_groups(seed: int, groups=((3, 5, 2), (4, 4), (1, 6, 3, 2))):
    """Per group, one rows_batch (1-token prompt, n generated tokens) and verl's response
    tensors: rewards at the last token, old log-probs, sum_pi_squared, IS weights."""
    g = torch.Generator().manual_seed(seed)
    width = 2 + max(max(group) for group in groups)
    batches, verl_rows = [], []
    for group in groups:
        rows, logprobs, spq, weights, rewards = [], [], [], [], []
        for n in group:
            pi = torch.rand(n, generator=g, dtype=torch.float64) * 0.9 + 0.05
            square = pi ** 2 + (1 - pi) ** 2 * torch.rand(n, generator=g, dtype=torch.float64)
            w = torch.rand(n, generator=g, dtype=torch.float64) * 1.5 + 0.2
            reward = float(torch.randint(0, 2, (1,), generator=g))
            pad = width - 1 - n
            rows.append("p" + "g" * n + "." * pad)
            logprobs.append([0.0] + pi.log().tolist() + [0.0] * pad)
            spq.append(square.tolist() + [0.0] * (pad + 1))   # next-token convention
            weights.append(w.tolist() + [0.0] * (pad + 1))
            rewards.append(reward)
            verl_rows.append((n, reward, pi.log(), square, w, len(batches)))
        batches.append(rows_batch(rows, rewards, logprobs=logprobs, sum_pi_squared=spq,
                                  rollout_is_weights=weights))
    return batches, verl_rows, width


def verl_inputs(verl_rows, length):
    b = len(verl_rows)
    rewards, mask, old, spq, w = (torch.zeros(b, length, dtype=torch.float64) for _ in range(5))
    for i, (n, reward, logp, square, weights, _) in enumerate(verl_rows):
        mask[i, :n] = 1
        rewards[i, n - 1] = reward
        old[i, :n], spq[i, :n], w[i, :n] = logp, square, weights
    index = np.array([group for *_, group in verl_rows])
    return rewards, mask, index, old, spq, w


@pytest.mark.peers
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_optimal_token_baseline_with_is_weights_equals_verls(seed, weighted):
    core = peer_module(*VERL_CORE_ALGOS)
    batches, verl_rows, width = otb_groups(seed)
    if not weighted:
        for b in batches:
            del b["rollout_is_weights"]
    out = run(recipe("optimal_token_baseline"), *concat_batch(batches))
    rewards, mask, index, old, spq, w = verl_inputs(verl_rows, width - 1)
    advantages, _ = core.compute_optimal_token_baseline_advantage(
        rewards, mask, index, old, spq, rollout_is_weights=w if weighted else None,
        handle_zero_tail=True)  # verl's default and ours
    for i, (n, *_) in enumerate(verl_rows):
        torch.testing.assert_close(out["advantages"][i, :n].double(), advantages[i, :n],
                                   rtol=1e-5, atol=1e-6)


def test_members_sampled_by_different_versions_are_weighted_by_their_own_ratio():
    """A group of two one-token responses, rewards 1 and 0, equal W: with IS weights 2 and
    1 (the first sampled by an older version, its ratio larger) the baseline is
    (1 * 4) / (4 + 1) = .8, not the unweighted .5."""
    half = math.log(0.5)
    batch = rows_batch(["pg.", "pg."], [1.0, 0.0], logprobs=[[0, half, 0], [0, half, 0]],
                       sum_pi_squared=[[0.5, 0, 0], [0.5, 0, 0]])
    plain = run(recipe("optimal_token_baseline"), *concat_batch([batch]))
    batch["rollout_is_weights"] = torch.tensor([[2.0, 0, 0], [1.0, 0, 0]])
    weighted = run(recipe("optimal_token_baseline"), *concat_batch([batch]))
    assert plain["advantages"][:, 0].tolist() == pytest.approx([0.5, -0.5], abs=1e-6)
    assert weighted["advantages"][:, 0].tolist() == pytest.approx([0.2, -0.8], abs=1e-6)


def test_group_statistics_do_not_depend_on_which_version_sampled_a_member():
    """GRPO's group statistics are of the rewards: the same numbers whatever policy
    version each member carries (the batch key the trainer adds is read by no stage)."""
    rows = ["pgg.", "pg..", "pggg", "pg.."]
    base = rows_batch(rows, [1.0, 0.0, 1.0, 0.5])
    tagged = rows_batch(rows, [1.0, 0.0, 1.0, 0.5], policy_version=[3, 7, 7, 5])
    a = run(recipe("grpo"), *concat_batch([base]))
    b = run(recipe("grpo"), *concat_batch([tagged]))
    torch.testing.assert_close(a["advantages"], b["advantages"])


def test_bad_weights_name_the_key():
    half = math.log(0.5)
    batch = rows_batch(["pg.", "pg."], [1.0, 0.0], logprobs=[[0, half, 0], [0, half, 0]],
                       sum_pi_squared=[[0.5, 0, 0], [0.5, 0, 0]],
                       rollout_is_weights=[[-1.0, 0, 0], [1.0, 0, 0]])
    with pytest.raises(ValueError, match=r"'optimal_token_baseline': rollout batch "
                                         r"'rollout_is_weights': expected finite weights >= 0"):
        run(recipe("optimal_token_baseline"), *concat_batch([batch]))
    joined, meta = concat_batch([batch])
    joined["rollout_is_weights"] = torch.ones(2, 2)
    with pytest.raises(ValueError, match=r"'rollout_is_weights': expected a tensor of shape \[2, 3\]"):
        run(recipe("optimal_token_baseline"), joined, meta)


def test_a_stage_declares_the_keys_it_reads():
    assert AdvantageModule(recipe("optimal_token_baseline")).optional_batch_keys == {"rollout_is_weights"}
    assert AdvantageModule(recipe("grpo")).optional_batch_keys == frozenset()

    @register_stage("estimator", "weighted_reinforce_test", reads=("rollout_is_weights",))
    def weighted_reinforce_test(inputs):
        raise AssertionError("not called")

    try:
        config = recipe("grpo")
        from dataclasses import replace
        from lightning_adv import AdvantageConfig, StageSpec

        config = replace(config, advantage=AdvantageConfig(
            estimator=StageSpec("weighted_reinforce_test")))
        assert AdvantageModule(config).optional_batch_keys == {"rollout_is_weights"}
    finally:
        unregister_stage("estimator", "weighted_reinforce_test")
