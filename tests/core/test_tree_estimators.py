"""The tree estimators against their authors' released code (recorded on random trees
by ``scripts/record_tree_cases.py`` at pinned commits), their one-level reductions to
flat estimators computed by our own stages, and their inputs left unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_adv import AdvantageModule
from lightning_adv.recipes import recipe
from tests.support.peers import recorded_cases
from tests.support.tree_batches import row_advantages, token_advantages, tree_batch

TREE_GRPO = ("verl/trainer/ppo/core_algos.py",
             "6d62c3a6c20e3621c9cddef1a5ab7252867489aa44028274304124bc37813363")
TREEPO = ("verl/trainer/ppo/core_algos.py",
          "39310413ef8e188bbeb12f79838b9637aab59a1429cdb13fc82c7f7481f89aa6")
TREERL = ("openrlhf/trainer/ppo_utils/tree_node.py",
          "66d8373785d1fe7b6ef1e0bada25296bcefa4eda6358b704440a2ab5da09f88d")
TREERL_MCTS = ("openrlhf/trainer/ppo_utils/parallel_mcts.py",
               "f1e2c5f286ebe8b9aadd88f059637cf4892dca6b3e207a5db723691276f18f86")
TREE_GRPO_COMMIT = "90b170995d996d772d68117e0c7bd0b8fe00d393"
TREERL_COMMIT = "f0edbea6f2f6392c46d297f83fb4929a9524266e"
TREEPO_COMMIT = "f05552394e734ea2838cf9e3b8191f5093319dcf"
#: The largest difference between the ``treepo`` recipe (whitening ``(x - mean) / (std +
#: 1e-5)``) and TreePO's released output (``(x - mean) / sqrt(var + 1e-8)``) over the
#: recorded cases; docs/guides/trees.md quotes it.
WHITENING_BOUND = 1e-4


def cases(name: str, pin: tuple[str, str], commit: str) -> list[dict]:
    data = recorded_cases(f"peer_cases/{name}.json", source=pin[0], sha256=pin[1])
    assert data["peer"]["commit"] == commit
    return data["cases"]


def tree_grpo(combine: str, **fields):
    return recipe("tree_grpo", **fields, advantage={"estimator": {
        "implementation": "tree_grpo", "kwargs": {"combine": combine}}})


def treepo(case: dict, **fields):
    kwargs = {"weighting": case["adv_weight_strategy"],
              "skip_constant_subtrees": case["remove_no_std_subgroup"]}
    return recipe("treepo", **fields, advantage={"estimator": {
        "implementation": "treepo", "kwargs": kwargs}})


def run(config, rows, **layout) -> dict:
    return AdvantageModule(config)(*tree_batch(rows, **layout))


@pytest.mark.parametrize("spans", [False, True])
@pytest.mark.parametrize("combine", ["sum", "sequential"])
@pytest.mark.parametrize("case", range(10))
def test_tree_grpo_equals_tree_grpo_code(case, combine, spans):
    recorded = cases("tree_grpo", TREE_GRPO, TREE_GRPO_COMMIT)[case]
    got = row_advantages(run(tree_grpo(combine), recorded["rows"], spans=spans))
    assert got == pytest.approx(recorded[combine], rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("spans", [False, True])
@pytest.mark.parametrize("case", range(10))
def test_tree_grpo_per_token_equals_tree_grpo_code(case, spans):
    recorded = cases("tree_grpo", TREE_GRPO, TREE_GRPO_COMMIT)[case]
    got = token_advantages(run(tree_grpo("per_token"), recorded["rows"], spans=spans))
    for got_row, want_row in zip(got, recorded["per_token"], strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("spans", [False, True])
@pytest.mark.parametrize("case", range(12))
def test_treepo_equals_treepo_code_before_its_whitening(case, spans):
    recorded = cases("treepo", TREEPO, TREEPO_COMMIT)[case]
    got = row_advantages(run(treepo(recorded, adv_norm=None), recorded["rows"], spans=spans,
                             tree_ids=False))
    assert got == pytest.approx(recorded["before_whitening"], rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("case", range(12))
def test_treepo_recipe_differs_from_treepo_code_only_by_the_whitening_eps(case):
    recorded = cases("treepo", TREEPO, TREEPO_COMMIT)[case]
    got = row_advantages(run(treepo(recorded), recorded["rows"], tree_ids=False))
    difference = max(abs(a - b) for a, b in zip(got, recorded["advantages"], strict=True))
    assert difference < WHITENING_BOUND


def treerl_cases() -> list[dict]:
    data = recorded_cases("peer_cases/treerl.json", source=TREERL[0], sha256=TREERL[1])
    assert data["peer"]["commit"] == TREERL_COMMIT
    assert (data["peer"]["file_2"], data["peer"]["sha256_2"]) == TREERL_MCTS
    return data["cases"]


def treerl(case: dict):
    kwargs = {"overall_norm": case["overall_norm_style"],
              "state_value": case["use_state_value_reward"]}
    return recipe("treerl", advantage={"estimator": {"implementation": "treerl",
                                                     "kwargs": kwargs}})


@pytest.mark.parametrize("spans", [False, True])
@pytest.mark.parametrize("case", range(8))
def test_treerl_equals_treerl_code(case, spans):
    recorded = treerl_cases()[case]
    got = token_advantages(run(treerl(recorded), recorded["rows"], spans=spans, tree_ids=False))
    for row, got_row, want in zip(recorded["rows"], got, recorded["values"], strict=True):
        per_token = [v for v, n in zip(want, row["lengths"]) for _ in range(n)]
        assert got_row == pytest.approx(per_token, rel=1e-5, abs=1e-5)


def test_the_recorded_cases_branch_and_take_every_option():
    grpo_cases = cases("tree_grpo", TREE_GRPO, TREE_GRPO_COMMIT)
    po_cases = cases("treepo", TREEPO, TREEPO_COMMIT)
    for recorded in grpo_cases + po_cases:
        paths = [(r["group"], *r["path"]) for r in recorded["rows"]]
        assert len(set(paths)) == len(paths)
    shared = lambda c: any(len({r["path"][0] for r in c["rows"] if r["group"] == g})  # noqa: E731
                           < sum(r["group"] == g for r in c["rows"]) for g in {0, 1, 2})
    assert sum(map(shared, grpo_cases)) >= 5 and sum(map(shared, po_cases)) >= 5
    assert any(max(r["tree"] for r in c["rows"]) > 0 for c in grpo_cases)
    assert {(c["adv_weight_strategy"], c["remove_no_std_subgroup"]) for c in po_cases} == {
        ("group_size", False), ("average", False), ("group_size", True), ("average", True)}
    rl_cases = treerl_cases()
    assert sum(map(shared, rl_cases)) >= 4
    assert {(c["overall_norm_style"], c["use_state_value_reward"]) for c in rl_cases} == {
        ("token", True), ("step", True), ("token", False), ("none", True)}


# ---------------------------------------------------------------- one-level trees

def flat_rows(seed: int, trees_per_group: int = 1, length: int = 0) -> list[dict]:
    """Groups of rows without branching: each row one node of its own, in one tree per
    group (or, ``trees_per_group`` > 1, spread over trees of one row each); ``length``
    tokens each, or 1 to 3 at random."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for group in range(3):
        for i in range(int(torch.randint(2, 6, (), generator=g))):
            rows.append({"group": group, "tree": i if trees_per_group > 1 else 0, "path": [i],
                         "lengths": [length or int(torch.randint(1, 4, (), generator=g))],
                         "reward": float(torch.rand((), generator=g))})
    return rows


def close(got: dict, want: dict, scale: float = 1.0) -> None:
    mask = want["loss_mask"]
    torch.testing.assert_close(got["advantages"] * mask, scale * want["advantages"] * mask,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_one_level_tree_grpo_sequential_is_grpo(seed):
    rows = flat_rows(seed)
    # both normalize within the group; Tree-GRPO's second pass over the same group leaves
    # (x - m) / (s + eps * (s + eps)), grpo's eps 1e-6 here is that to first order
    grpo = recipe("grpo", reward_norm={"mean_level": "group", "std_level": "group", "eps": 1e-6})
    close(run(tree_grpo("sequential"), rows), run(grpo, rows))


@pytest.mark.parametrize("seed", range(5))
def test_one_level_tree_grpo_sum_is_twice_grpo(seed):
    rows = flat_rows(seed)
    grpo = recipe("grpo", reward_norm={"mean_level": "group", "std_level": "group", "eps": 1e-6})
    close(run(tree_grpo("sum"), rows), run(grpo, rows), scale=2.0)


@pytest.mark.parametrize("seed", range(5))
def test_chains_in_trees_of_their_own_add_the_raw_reward(seed):
    # Tree-GRPO's intra-tree term of a tree of one row is its reward / (1 + eps): with one
    # chain per tree, combine: sum is grpo plus the raw reward, sequential is grpo / (1 + eps)
    rows = flat_rows(seed, trees_per_group=9)
    grpo = recipe("grpo", reward_norm={"mean_level": "group", "std_level": "group", "eps": 1e-6})
    raw = recipe("tree_grpo", advantage={"estimator": {"implementation": "reinforce"}})
    summed, flat, rewards = (run(c, rows) for c in (tree_grpo("sum"), grpo, raw))
    mask = flat["loss_mask"]
    torch.testing.assert_close(summed["advantages"] * mask,
                               (flat["advantages"] + rewards["advantages"] / (1 + 1e-6)) * mask,
                               rtol=1e-5, atol=1e-5)
    close(run(tree_grpo("sequential"), rows), flat, scale=1 / (1 + 1e-6))


@pytest.mark.parametrize("weighting", ["group_size", "average"])
@pytest.mark.parametrize("seed", range(5))
def test_one_level_treepo_is_reinforce_pp_baseline_without_kl(seed, weighting):
    rows = flat_rows(seed)
    config = treepo({"adv_weight_strategy": weighting, "remove_no_std_subgroup": False})
    close(run(config, rows), run(recipe("reinforce_pp_baseline", kl_ctl=0.0), rows))


def treerl_with(overall_norm: str, state_value: bool = True):
    return treerl({"overall_norm_style": overall_norm, "use_state_value_reward": state_value})


@pytest.mark.parametrize("seed", range(5))
def test_one_level_treerl_is_twice_rloo(seed):
    # credit V(n) - V(root) = r' (the leave-one-out reward: they sum to 0), plus V(n) = r' - m
    rloo = recipe("rloo")
    rows = flat_rows(seed)
    close(run(treerl_with("none"), rows), run(rloo, rows), scale=2.0)
    close(run(treerl_with("token", state_value=False), rows), run(rloo, rows))
    equal = flat_rows(seed, length=2)   # the token mean m of r' is 0 when rows are as long
    close(run(treerl_with("token"), equal), run(rloo, equal), scale=2.0)


def test_one_level_treerl_with_unequal_lengths_is_twice_rloo_less_its_token_mean():
    rows = [{"group": 0, "tree": 0, "path": [i], "lengths": [n], "reward": r}
            for i, (n, r) in enumerate([(1, 1.0), (3, 0.0), (2, 0.0)])]
    # r' = 1, -1/2, -1/2; token mean m = (1 - 3/2 - 1) / 6 = -1/4; 2 r' - m
    got = row_advantages(run(treerl_with("token"), rows))
    assert got == pytest.approx([2.25, -0.75, -0.75], abs=1e-6)


def test_inputs_are_not_modified():
    recorded = cases("tree_grpo", TREE_GRPO, TREE_GRPO_COMMIT)[3]
    batch, meta = tree_batch(recorded["rows"], spans=True)
    before = copy.deepcopy(batch)
    versions = {k: v._version for k, v in batch.items() if isinstance(v, torch.Tensor)}
    for config in (tree_grpo("sum"), tree_grpo("per_token"), treerl_with("step"),
                   treepo({"adv_weight_strategy": "average", "remove_no_std_subgroup": True})):
        AdvantageModule(config)(batch, meta)
    assert set(batch) == set(before)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, before[key]) and value._version == versions[key], key
