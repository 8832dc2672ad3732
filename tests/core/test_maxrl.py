"""MaxRL against the peers' code, recorded on random groups by
``scripts/record_peer_cases.py`` (prime-rl's ``MaxRLAlgorithm.score_group`` at a pinned
commit; SkyRL's ``compute_maxrl_advantage`` from the skyrl 0.3.0 wheel, which does not
import on Python 3.11), plus its rules by hand."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_adv import AdvantageModule, RolloutGroup, concat_batch
from lightning_adv.recipes import recipe
from tests.support.batches import rows_batch
from tests.support.peers import recorded_cases

PRIME_RL = ("src/prime_rl/orchestrator/algo/max_rl.py",
            "d128d53f51ccfdeca0bd41b7aa1a1af4764f11c338f461c6fe06f258ec751a87")
SKYRL = ("skyrl/backends/skyrl_train/utils/ppo_utils.py",
         "0d7ae59af59b16cc3d0b6593251bd3ab5dbfd421d9e3ae1bfde00783ba6323d7")


def advantages(groups: list[list[float]], **kwargs) -> list[list[float]]:
    """Our maxrl recipe's advantage of each response (one row each, two generated tokens)."""
    prompts = [rows_batch(["pgg."] * len(g), g) for g in groups]
    config = recipe("maxrl", advantage={"outcome_reward_shaping": {
        "implementation": "maxrl", "kwargs": kwargs}}) if kwargs else recipe("maxrl")
    out = AdvantageModule(config)(*concat_batch(prompts))["advantages"]
    flat = out[:, 0].tolist()
    assert torch.equal(out[:, 0], out[:, 1])   # every generated token gets it
    result, start = [], 0
    for g in groups:
        result.append(flat[start:start + len(g)])
        start += len(g)
    return result


@pytest.mark.parametrize("case", range(8))
def test_equals_prime_rl(case):
    data = recorded_cases("peer_cases/maxrl_prime_rl.json", source=PRIME_RL[0], sha256=PRIME_RL[1])
    recorded = data["cases"][case]
    got = advantages(recorded["groups"])
    for ours, theirs in zip(got, recorded["advantages"]):
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("case", range(8))
def test_equals_skyrl_with_its_eps_except_for_a_lone_response(case):
    data = recorded_cases("peer_cases/maxrl_skyrl.json", source=SKYRL[0], sha256=SKYRL[1])
    recorded = data["cases"][case]
    got = advantages(recorded["groups"], eps=1e-6)
    for group, ours, theirs in zip(recorded["groups"], got, recorded["advantages"]):
        if len(group) == 1:
            # SkyRL gives a group of one its raw reward (mean 0); here the group mean of
            # one response is itself, so it gets 0, as in prime-rl.
            assert ours == [0.0] and theirs == pytest.approx(group)
        else:
            assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6)


def test_by_hand():
    # mean 1/4: (1 - .25) / .25 = 3, (0 - .25) / .25 = -1; a group of zeros and one of a
    # negative mean get 0
    got = advantages([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0], [-1.0, 0.5]])
    assert got == [pytest.approx([3.0, -1.0, -1.0, -1.0]), [0.0, 0.0], [0.0, 0.0]]


def test_a_split_rollout_counts_once_in_the_group_mean():
    # rollouts [1 (two rows), 0]: mean over rollouts 1/2, so rows get 1, 1, -1
    batch = rows_batch(["pgg.", "pgg.", "pgg."], [1.0, 1.0, 0.0],
                       rollout_group=RolloutGroup((2, 1)))
    out = AdvantageModule(recipe("maxrl"))(*concat_batch([batch]))["advantages"]
    assert out[:, 0].tolist() == pytest.approx([1.0, 1.0, -1.0])


def test_config_refuses_a_negative_eps():
    with pytest.raises(ValueError, match=r"outcome_reward_shaping.kwargs.eps"):
        recipe("maxrl", advantage={"outcome_reward_shaping": {"implementation": "maxrl",
                                                               "kwargs": {"eps": -1.0}}})
    assert math.isinf(recipe("maxrl").reward_clip)
