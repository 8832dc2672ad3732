"""The rule for masked tokens, as properties over every recipe and built-in estimator:
inserting a masked span (tool output, environment reply: attended, loss mask 0) inside a
response, or lengthening one, changes neither the advantages and returns of any token
outside it nor where any reward lands, and no loss aggregation sees it.

Inside a response: before a token between the row's first and last generated tokens.
Whatever the span's tokens hold in any per-position key (values, log-probs, rewards,
``sum_pi_squared``, entropies, importance weights) is never read. With ``turn_ids`` a span inside a
turn does not split it; without them a turn is a run of generated tokens, so there the
property is stated for lengthening existing spans.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_adv import AdvantageModule
from lightning_adv.config.recipe_table import RECIPES
from lightning_adv.losses.aggregation import LOSS_AGG_MODES
from lightning_adv.losses.ppo_loss import PPOLoss
from lightning_adv.recipes import recipe
from tests.support.agent_batches import build, insert_masked_span, moved_positions, random_episode

PPO = {"kl_ctl": 0.1, "discount": 0.99, "gae_lambda": 0.95,
       "adv_norm": {"mean_level": "batch", "std_level": "batch"}}
GROUP_NORM = {"mean_level": "group", "std_level": "group"}


def estimator(name: str, **kwargs) -> dict:
    return {"advantage": {"estimator": {"implementation": name, "kwargs": kwargs}}}


#: Every recipe, and the built-in estimators, normalizations and process stages
#: configured the ways the recipes do not cover. (name, ActorConfig fields, critic)
CONFIGS = [(f"recipe {name}", {"recipe": name}, False) for name in RECIPES] + [
    ("token_gae + critic + batch whitening", {**PPO}, True),
    ("turn_gae + critic", {**PPO, **estimator("turn_gae")}, True),
    ("token_gae + critic + group adv_norm", {**PPO, "adv_norm": GROUP_NORM}, True),
    ("reinforce + leave-one-out", {"kl_ctl": 0.05, "discount": 0.9, **estimator("reinforce"),
                                   "reward_norm": {"mean_level": "group", "mean_leave1out": True,
                                                   "std_level": None}}, False),
    ("turn_index_norm", {"kl_ctl": 0.0, **estimator("turn_index_norm")}, False),
    ("turn_index_norm + std", {"kl_ctl": 0.0, **estimator("turn_index_norm", std_normalize=True)},
     False),
    ("gigpo mean_std", {"kl_ctl": 0.0, **estimator("gigpo", std_normalize=True)}, False),
    ("vine", {"kl_ctl": 0.1, "discount": 0.9, **estimator("vine")}, False),
    ("tree_grpo sequential", {"kl_ctl": 0.0, **estimator("tree_grpo", combine="sequential")},
     False),
    ("tree_grpo per_token", {"kl_ctl": 0.05, **estimator("tree_grpo", combine="per_token")},
     False),
    ("treepo average, constant subtrees skipped",
     {"kl_ctl": 0.0, **estimator("treepo", weighting="average", skip_constant_subtrees=True)},
     False),
    ("treerl step, no state value",
     {"kl_ctl": 0.0, **estimator("treerl", overall_norm="step", state_value=False)}, False),
    ("otb without zero tail", {"kl_ctl": 0.0, **estimator("optimal_token_baseline",
                                                          handle_zero_tail=False)}, False),
    ("folded token rewards", {**PPO, "token_rewards_as_adv": False}, True),
    ("additive process shaping", {**PPO, "advantage": {"process_adv_shaping": {
        "implementation": "additive"}}}, True),
    ("gvpo process shaping", {**PPO, "advantage": {"process_adv_shaping": {
        "implementation": "gvpo"}}}, True),
    ("process_weighted", {**PPO, "advantage": {"process_adv_shaping": {
        "implementation": "process_weighted"}}}, True),
    # the entropy stages replace process-reward shaping: the token rewards are folded
    ("gtpo entropy shaping", {**PPO, "token_rewards_as_adv": False, "advantage": {
        "process_adv_shaping": {"implementation": "gtpo", "kwargs": {"entropy_weight": 0.7}}}},
     True),
    ("top_entropy_mask", {"kl_ctl": 0.0, "token_rewards_as_adv": False, "advantage": {
        "process_adv_shaping": {"implementation": "top_entropy_mask",
                                "kwargs": {"quantile": 0.5}}}}, False),
    ("length penalty + truncation masking", {**PPO, "overlong_reward_penalty": True,
                                             "overlong_tokens": 4, "overlong_penalty_factor": 1.0,
                                             "max_new_tokens": 12, "mask_no_eos_with_zero": True},
     True),
]
PROCESS_WEIGHTED = "process_weighted"


def batch_of(seed: int, critic: bool, process_in_unit: bool) -> tuple[dict, object, list]:
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 5, (int(torch.randint(1, 4, (), generator=g)),), generator=g).tolist()
    groups = [[random_episode(g, max_turns=3, max_turn_len=3) for _ in range(n)] for n in sizes]
    for group in groups:
        for ep in group:
            ep.states = [int(torch.randint(0, 2, (), generator=g)) + 10 * k
                         for k in range(len(ep.turns))]
    batch, meta = build(groups, g, turn_rewards=True, states=True)
    bs, width = batch["loss_mask"].shape
    token_rewards = torch.rand(bs, width, generator=g) if process_in_unit else \
        torch.randn(bs, width, generator=g)
    # one process reward per turn (uniform within it), so folding them is allowed too
    rank = batch["turn_ids"].clamp(min=0)
    per_turn = token_rewards.gather(1, torch.zeros_like(rank))[:, :1] * (rank + 1) / 4
    batch["token_rewards"] = torch.where(batch["loss_mask"].bool(), per_turn, 0.0)
    batch["is_truncated"] = torch.rand(bs, generator=g) < 0.3
    batch["reward_baselines"] = torch.rand(bs, generator=g)
    batch["mc_returns"] = mc_returns(episodes_of(groups), g)
    # each row a chain of tree nodes, one per turn (the tree estimators read them)
    first = torch.tensor([i for n in sizes for i in range(n)])[:, None]
    batch["tree_node_ids"] = torch.where(batch["turn_ids"] >= 0, 10 * first + batch["turn_ids"], -1)
    batch["entropies"] = torch.rand(bs, width, generator=g) * 3
    if not critic:
        del batch["values"]
    return batch, meta, episodes_of(groups)


def episodes_of(groups) -> list:
    return [ep for group in groups for ep in group]


def mc_returns(episodes, g: torch.Generator, k: int = 2) -> torch.Tensor:
    """``[B, 3, k]`` random returns from the state before each turn (``vine``), NaN past a
    row's last turn and for some continuations (fewer than k)."""
    returns = torch.randn(len(episodes), 3, k, generator=g)
    missing = torch.rand(returns.shape, generator=g) < 0.3
    missing[:, :, 0] = False
    turns = torch.tensor([len(ep.turns) for ep in episodes])
    past = torch.arange(3)[None, :, None] >= turns[:, None, None]
    return torch.where(missing | past, torch.nan, returns)


def span_sites(episodes, seed: int, lengthen_only: bool) -> tuple[int, int, int]:
    """(row, token position to insert before, length): inside the row's response."""
    g = torch.Generator().manual_seed(seed + 1)
    candidates = []
    for row, ep in enumerate(episodes):
        turns = ep.generated_positions()
        first, last = turns[0][0], turns[-1][-1]
        for pos in range(first + 1, last + 1):
            in_span = not any(pos in t for t in turns)
            after_span = any(pos == t[0] for t in turns[1:])
            if not lengthen_only or in_span or after_span:
                candidates.append((row, pos))
    if not candidates:
        return -1, 0, 0
    row, pos = candidates[int(torch.randint(0, len(candidates), (), generator=g))]
    return row, pos, int(torch.randint(1, 4, (), generator=g))


def compute(config: dict, batch: dict, meta):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # outcome on a masked position, and the like
        return AdvantageModule(recipe(config["recipe"]) if "recipe" in config else
                               _actor(config))(batch, meta)


def _actor(fields: dict):
    from lightning_adv import ActorConfig
    return ActorConfig(**fields)


def outside(x: torch.Tensor, row: int, pos: int, length: int, width: int) -> torch.Tensor:
    """The entries of the grown batch's aligned ``x`` at the old positions."""
    index = torch.arange(width).expand(x.shape[0], width).clone()
    index[row] = moved_positions(width, pos, length)
    return x.gather(1, index)


def check_unchanged(config: dict, batch: dict, meta, row: int, pos: int, length: int) -> None:
    before = compute(config, batch, meta)
    grown = insert_masked_span(batch, row, pos, length)
    after = compute(config, grown, meta)
    width = batch["loss_mask"].shape[1]
    mask = before["loss_mask"]
    torch.testing.assert_close(outside(after["loss_mask"], row, pos, length, width), mask)
    for key in ("advantages", "returns", "tot_rewards"):
        got = outside(after[key], row, pos, length, width)
        torch.testing.assert_close(got * mask, before[key] * mask, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{key}: {m}")
    # rewards land only on generated tokens, and none is dropped: each row's total holds
    torch.testing.assert_close(after["tot_rewards"].sum(1), before["tot_rewards"].sum(1),
                               rtol=1e-5, atol=1e-5)
    check_losses(before, after, row, pos, length, width)


def check_losses(before: dict, after: dict, row: int, pos: int, length: int, width: int) -> None:
    g = torch.Generator().manual_seed(0)
    # (current log-probs below the old ones: log-probs stay <= 0, as PPOLoss requires)
    delta = -(torch.randn(before["logprobs"].shape, generator=g) * 0.1).abs()
    grown_delta = insert_masked_span({"values": delta}, row, pos, length, fill=5.0)["values"]
    for mode in LOSS_AGG_MODES:
        for level in ("token", "sequence"):
            loss = PPOLoss(loss_agg_mode=mode, ratio_level=level, loss_scale_factor=10.0,
                           value_clip_eps=0.2)
            values = {}
            for name, out, d in (("before", before, delta), ("after", after, grown_delta)):
                old = out["logprobs"]
                values[name] = loss(old + d, old, out["advantages"], out["loss_mask"],
                                    values=out["returns"] + d, old_values=out["returns"],
                                    returns=out["returns"])["loss"]
            # atol as for the per-token checks above: the inputs agree to float32 rounding
            # (~1e-7 a token), and a token-sum loss (x10 here) adds up tens of them
            torch.testing.assert_close(values["after"], values["before"], rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"{mode} {level}: {m}")


@pytest.mark.parametrize("name, config, critic", CONFIGS, ids=[c[0] for c in CONFIGS])
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2 ** 16))
def test_a_masked_span_inside_a_response_changes_nothing_outside_it(name, config, critic, seed):
    batch, meta, episodes = batch_of(seed, critic, process_in_unit=PROCESS_WEIGHTED in name)
    row, pos, length = span_sites(episodes, seed, lengthen_only=False)
    if row < 0:
        return
    check_unchanged(config, batch, meta, row, pos, length)


@pytest.mark.parametrize("name, config, critic", CONFIGS, ids=[c[0] for c in CONFIGS])
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2 ** 16))
def test_without_turn_ids_lengthening_a_span_changes_nothing_outside_it(name, config, critic,
                                                                        seed):
    if "turn_gae" in name or "gigpo" in name:
        return   # these read turn_ids (or runs, which a new span would split)
    batch, meta, episodes = batch_of(seed, critic, process_in_unit=PROCESS_WEIGHTED in name)
    del batch["turn_ids"]
    row, pos, length = span_sites(episodes, seed, lengthen_only=True)
    if row < 0:
        return
    check_unchanged(config, batch, meta, row, pos, length)
