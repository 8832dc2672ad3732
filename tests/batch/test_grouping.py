"""Batch metadata and per-prompt assembly (SPEC §1)."""

import math

import pytest
import torch

from lightning_adv import BatchMeta, RolloutGroup, concat_batch, split_batch


def prompt(rows, width, seed=0, **extra):
    g = torch.Generator().manual_seed(seed)
    attention = torch.ones(rows, width, dtype=torch.bool)
    attention[:, width - 1] = False
    loss = torch.zeros(rows, width, dtype=torch.int32)
    loss[:, 1: width - 1] = 1
    d = {"input_ids": torch.randint(1, 9, (rows, width), generator=g, dtype=torch.int32),
         "attention_mask": attention, "loss_mask": loss,
         "logprobs": -torch.rand(rows, width, generator=g),
         "rewards": torch.rand(rows, generator=g)}
    d.update(extra)
    return d


def test_rollout_group_validates():
    g = RolloutGroup((2, 1))
    assert g.rewards == (None, None) and g.n_rollouts == 2 and g.n_rows == 3
    g.validate_rows(3)
    with pytest.raises(ValueError, match="cover 3 rows"):
        g.validate_rows(4)
    for bad in [(), (0, 1), (1.5,), (True,), (-1,)]:
        with pytest.raises(ValueError, match="row_counts"):
            RolloutGroup(bad)
    with pytest.raises(ValueError, match=r"one entry per logical rollout \(2\), got 1"):
        RolloutGroup((1, 1), (0.5,))
    for bad in [math.nan, math.inf, "1.0", True]:
        with pytest.raises(ValueError, match=r"rewards\[0\]"):
            RolloutGroup((1,), (bad,))
    assert RolloutGroup((1, 2), (None, 3)).rewards == (None, 3)


def test_batch_meta_validates_and_counts():
    meta = BatchMeta(3, [2, 3, 1], [5, 6, 4], [None, RolloutGroup((1, 2), (1.0, None)), None])
    assert meta.batch_size == 6
    assert meta.logical_group_sizes == [2, 2, 1]
    assert meta.rollout_row_counts == [1, 1, 1, 2, 1]
    assert meta.explicit_reference_rewards == [None, None, 1.0, None, None]
    assert BatchMeta(2, [2, 2]).logical_group_sizes == [2, 2]
    with pytest.raises(ValueError, match="traj_group_sizes"):
        BatchMeta(2, [2])
    with pytest.raises(ValueError, match="traj_group_sizes"):
        BatchMeta(1, [0])
    with pytest.raises(ValueError, match=r"rollout_groups\[0\].*cover 2 rows.*has 3"):
        BatchMeta(1, [3], rollout_groups=[RolloutGroup((1, 1))])
    with pytest.raises(ValueError, match="one entry"):
        BatchMeta(2, [1, 1], rollout_groups=[None])
    with pytest.raises(ValueError, match="traj_seqlens"):
        BatchMeta(2, [1, 1], traj_seqlens=[3])


def test_concat_pads_concatenates_and_builds_complete_meta():
    a = prompt(2, 5, seed=1, values=torch.randn(2, 5), is_truncated=torch.tensor([True, False]))
    b = prompt(3, 7, seed=2, values=torch.randn(3, 7), is_truncated=torch.tensor([False, False, True]),
               rollout_group=RolloutGroup((2, 1), (0.5, None)))
    batch, meta = concat_batch([a, b])
    assert batch["input_ids"].shape == (5, 7) and batch["rewards"].shape == (5,)
    assert torch.equal(batch["values"][:2, :5], a["values"])
    assert torch.equal(batch["values"][:2, 5:], torch.zeros(2, 2))  # right-padded with 0
    assert torch.equal(batch["attention_mask"][:2, 5:], torch.zeros(2, 2, dtype=torch.bool))
    assert torch.equal(batch["is_truncated"], torch.tensor([True, False, False, False, True]))
    assert batch["input_ids"].dtype == torch.int32 and batch["loss_mask"].dtype == torch.int32
    assert meta.n_trajs == 2 and meta.traj_group_sizes == [2, 3] and meta.traj_seqlens == [5, 7]
    assert meta.rollout_groups == [None, RolloutGroup((2, 1), (0.5, None))]
    assert meta.logical_group_sizes == [2, 2]
    assert "rollout_group" not in batch


def test_concat_meta_is_complete_without_any_group():
    _, meta = concat_batch([prompt(2, 4), prompt(1, 4)])
    assert meta.rollout_groups == [None, None]


def test_concat_of_a_single_prompt_does_not_alias():
    a = prompt(2, 5)
    batch, _ = concat_batch([a])
    for key, value in a.items():
        assert torch.equal(batch[key], value)
        assert batch[key].data_ptr() != value.data_ptr(), key
    batch["rewards"] += 1
    assert not torch.equal(batch["rewards"], a["rewards"])


def test_concat_keeps_lists_and_other_values():
    a = prompt(1, 4, tags=["x"], prox_logp=None)
    b = prompt(2, 4, tags=["y", "z"], prox_logp=None)
    batch, _ = concat_batch([a, b])
    assert batch["tags"] == ["x", "y", "z"] and batch["prox_logp"] is None


@pytest.mark.parametrize("trajs, fragment", [
    ([], "non-empty list"),
    ([{"attention_mask": torch.ones(2)}], "2-D 'attention_mask'"),
    ([prompt(2, 4), {k: v for k, v in prompt(2, 4).items() if k != "logprobs"}], "same keys"),
    ([prompt(2, 4, rollout_group=RolloutGroup((1,)))], "cover 1 rows"),
    ([prompt(2, 4, rollout_group=(1, 1))], "must be a RolloutGroup"),
    ([prompt(2, 4, values=torch.zeros(3, 4))], "'values' of prompt 0 has 3 rows"),
])
def test_concat_rejects_inconsistent_prompts(trajs, fragment):
    with pytest.raises(ValueError, match=fragment):
        concat_batch(trajs)


def test_split_inverts_concat():
    a = prompt(2, 5, seed=1, values=torch.randn(2, 5), tags=["p", "q"])
    b = prompt(3, 7, seed=2, values=torch.randn(3, 7), tags=["r", "s", "t"],
               rollout_group=RolloutGroup((1, 2)))
    batch, meta = concat_batch([a, b])
    back = split_batch(batch, meta)
    assert len(back) == 2
    for original, restored in zip([a, b], back):
        assert set(restored) == set(original)
        for key, value in original.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(restored[key], value), key
            else:
                assert restored[key] == value, key
