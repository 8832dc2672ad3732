"""Group stages when ``actor.unscorable_rewards: exclude`` shrinks a prompt group.

A group that exclusion leaves with one scored member gives that member advantage 0: its
group baseline is itself (there is no scored peer to compare it with), never NaN, an
error or the singleton-group warning meant for one-sample configs. A group whose members
are all unscorable drops out: advantage 0 for its rows, and nothing in the other
groups' numbers. Expected values are computed by hand in the comments.

The batch: prompt A [1, 0, 0.5, 0] (all scored), prompt B [NaN, 2, NaN] (one scored
member left), prompt C [NaN, NaN] (none scored). A's mean 0.375, deviations
[.625, -.375, .125, -.375], unbiased std sqrt(.6875 / 3).
"""

import math
import warnings

import pytest
import torch

from tests.support.batches import rows_batch
from lightning_adv import AdvantageModule, BatchMeta, concat_batch
from lightning_adv.exceptions import SingletonGroupWarning
from lightning_adv.recipes import recipe

NAN = math.nan
ROWS_A = ["pgggg.", "pgg...", "pggg..", "pg...."]
ROWS_B = ["pgg...", "pgggg.", "pg...."]
ROWS_C = ["pgg...", "pggg.."]
STD_A = math.sqrt(0.6875 / 3)
CENTRED_A = [0.625, -0.375, 0.125, -0.375]


def shrunk_batch(name):
    batch, meta = concat_batch([rows_batch(ROWS_A, [1.0, 0.0, 0.5, 0.0]),
                                rows_batch(ROWS_B, [NAN, 2.0, NAN]),
                                rows_batch(ROWS_C, [NAN, NAN])])
    if name == "optimal_token_baseline":
        batch["sum_pi_squared"] = torch.full(batch["input_ids"].shape, 0.5)
    if name == "rloo_kl":
        batch["ref_logp"] = torch.zeros(batch["input_ids"].shape)
    return batch, meta


def run(name, batch, meta, **overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SingletonGroupWarning)  # must not be given
        return AdvantageModule(recipe(name, unscorable_rewards="exclude", **overrides))(batch, meta)


def per_row(out):
    """The advantage every active token of a row shares (checked to be shared)."""
    values = []
    for adv, mask in zip(out["advantages"], out["loss_mask"]):
        active = adv[mask > 0]
        assert torch.allclose(active, active[0].expand_as(active), atol=1e-6), active
        values.append(active[0].item())
    return values


# opo: the length-weighted baseline of A, lengths [4, 2, 3, 1]: (4 + 1.5) / 10 = 0.55.
# gpg: alpha = B / (B - M) over the kept responses: B = 5 (A's 4 and B's one), M = 1 (the
# lone member's group has no spread), so alpha = 5/4.
# grpo_batch_std: A's group mean over the batch std of the five scored rewards
# [1, 0, .5, 0, 2]: mean .7, unbiased variance 2.8 / 4, eps 1e-4 (the lone scored member
# takes part in batch statistics: it is scored).
EXPECTED_A = {
    "grpo": [c / (STD_A + 1e-5) for c in CENTRED_A],
    "dr_grpo": CENTRED_A,
    "rloo": [1 - 0.5 / 3, 0 - 1.5 / 3, 0.5 - 1.0 / 3, 0 - 1.5 / 3],
    "rloo_kl": [1 - 0.5 / 3, 0 - 1.5 / 3, 0.5 - 1.0 / 3, 0 - 1.5 / 3],  # ref_logp = logprobs
    "grpo_passk": [0.5 / (STD_A + 1e-6), 0.0, 0.0, 0.0],
    "opo": [0.45, -0.55, -0.05, -0.55],
    "gpg": [1.25 * c for c in CENTRED_A],
    "grpo_batch_std": [c / (math.sqrt(0.7) + 1e-4) for c in CENTRED_A],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_A))
def test_a_group_shrunk_to_one_member_gives_it_advantage_zero(name):
    out = run(name, *shrunk_batch(name))
    got = per_row(out)
    for g, want in zip(got[:4], EXPECTED_A[name]):
        assert math.isclose(g, want, rel_tol=1e-5, abs_tol=1e-6), (name, got[:4])
    assert got[4:] == [0.0] * 5  # B's lone member, B's and C's unscorable rows
    assert torch.isfinite(out["advantages"]).all()
    assert out["unscorable"].tolist() == [False] * 4 + [True, False, True, True, True]


def test_optimal_token_baseline_lone_member_gets_zero_and_the_others_are_unaffected():
    batch, meta = shrunk_batch("optimal_token_baseline")
    out = run("optimal_token_baseline", batch, meta)
    assert float(out["advantages"][4:].abs().sum()) == 0.0
    alone = {k: v[:4] for k, v in batch.items()}
    clean = run("optimal_token_baseline", alone, BatchMeta(n_trajs=1, traj_group_sizes=[4]))
    assert torch.allclose(out["advantages"][:4], clean["advantages"], atol=1e-6)
    # A prompt sampled once keeps verl's rule: no baseline, A = G (here the reward 2).
    one, one_meta = concat_batch([rows_batch(ROWS_A, [1.0, 0.0, 0.5, 0.0]),
                                  rows_batch(["pgg..."], [2.0])])
    one["sum_pi_squared"] = torch.full(one["input_ids"].shape, 0.5)
    lone = run("optimal_token_baseline", one, one_meta)
    assert lone["advantages"][4][lone["loss_mask"][4] > 0].tolist() == pytest.approx([2.0, 2.0])


def test_every_group_shrunk_to_one_neither_warns_nor_raises():
    # Two responses per prompt, one of each unscorable: every group has one member left,
    # which with one-sample batches would be a config mistake (SingletonGroupWarning).
    batch, meta = concat_batch([rows_batch(["pgg.", "pg.."], [1.0, NAN]),
                                rows_batch(["pgg.", "pg.."], [NAN, 0.0])])
    for name in ("grpo", "rloo", "dr_grpo", "grpo_passk"):
        out = run(name, batch, meta, singleton_groups="raise")
        assert float(out["advantages"].abs().sum()) == 0.0, name


def test_a_batch_sampled_once_per_prompt_is_still_a_singleton_config():
    batch, meta = concat_batch([rows_batch(["pgg."], [1.0]), rows_batch(["pgg."], [0.0]),
                                rows_batch(["pgg."], [NAN])])
    with pytest.warns(SingletonGroupWarning, match="every group has one member"):
        AdvantageModule(recipe("grpo", unscorable_rewards="exclude"))(batch, meta)
    with pytest.raises(ValueError, match=r"'passk_baseline': pass@k needs at least two "
                                         r"responses per prompt group; groups \[0, 1\] have one"):
        run("grpo_passk", batch, meta)
    # A natural one-response group next to a shrunk one: only the natural one is refused.
    mixed, mixed_meta = concat_batch([rows_batch(["pgg.", "pg.."], [1.0, NAN]),
                                      rows_batch(["pgg."], [0.0])])
    with pytest.raises(ValueError, match=r"groups \[1\] have one"):
        run("grpo_passk", mixed, mixed_meta)


def test_the_kept_meta_counts_what_each_prompt_lost():
    from lightning_adv.advantage.unscorable_rows import select_meta

    _, meta = shrunk_batch("grpo")
    kept = select_meta(meta, torch.tensor([True] * 4 + [False, True, False, False, False]))
    assert kept.traj_group_sizes == [4, 1]  # C has no kept row: gone
    assert kept.unscorable_members == [0, 2]
    assert kept.shrunk_to_one == [False, True]
    with pytest.raises(ValueError, match=r"BatchMeta.unscorable_members: expected 2 "
                                         r"non-negative integers"):
        BatchMeta(n_trajs=2, traj_group_sizes=[1, 1], unscorable_members=[0, -1])
