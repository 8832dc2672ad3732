"""GiGPO against ROLL's released code (``roll/pipeline/agentic/utils.py`` at a pinned
commit), recorded on random step-wise batches by ``scripts/record_peer_cases.py``; the
same episodes as one row per episode (turns) and as ROLL's one row per step."""

from __future__ import annotations

import pytest
import torch

from lightning_adv import AdvantageModule, RolloutGroup, concat_batch
from lightning_adv.recipes import recipe
from tests.support.peers import recorded_cases

ROLL = ("roll/pipeline/agentic/utils.py",
        "f1ccfefb1b6b920843c2001bd144ac9186b068264a686ff530c9de81fb347a90")
TURN, SPAN = 2, 1   # generated tokens per turn, tool tokens between turns


def roll_cases() -> list[dict]:
    return recorded_cases("peer_cases/gigpo_roll.json", source=ROLL[0], sha256=ROLL[1])["cases"]


def episode_row(episode: dict, width: int) -> dict:
    """One episode as one row: prompt, then each turn (TURN tokens) with SPAN tool tokens
    between turns. The last step's score is the outcome reward; earlier steps' scores are
    turn rewards on their turn's last token."""
    n = len(episode["step_scores"])
    loss, turn_ids, turn_rewards, states = [0], [-1], [0.0], [-1]
    for k in range(n):
        loss += [1] * TURN
        turn_ids += [k] * TURN
        turn_rewards += [0.0] * (TURN - 1) + [episode["step_scores"][k] if k < n - 1 else 0.0]
        states += [episode["states"][k]] * TURN
        if k < n - 1:
            loss += [0] * SPAN
            turn_ids += [-1] * SPAN
            turn_rewards += [0.0] * SPAN
            states += [-1] * SPAN
    pad = width - len(loss)
    return {"loss": loss + [0] * pad, "turn_ids": turn_ids + [-1] * pad,
            "turn_rewards": turn_rewards + [0.0] * pad, "states": states + [-1] * pad,
            "length": len(loss), "reward": episode["step_scores"][-1]}


def prompt_batch(rows: list[dict], width: int, rollout_group=None) -> dict:
    b = len(rows)
    attention = torch.tensor([[i < r["length"] for i in range(width)] for r in rows])
    return {"input_ids": torch.zeros(b, width, dtype=torch.long), "attention_mask": attention,
            "loss_mask": torch.tensor([r["loss"] for r in rows], dtype=torch.int32),
            "logprobs": torch.zeros(b, width), "rewards": torch.tensor([r["reward"] for r in rows]),
            "turn_ids": torch.tensor([r["turn_ids"] for r in rows]),
            "turn_rewards": torch.tensor([r["turn_rewards"] for r in rows]),
            "anchor_state_ids": torch.tensor([r["states"] for r in rows]),
            **({"rollout_group": rollout_group} if rollout_group is not None else {})}


def config(case: dict):
    kwargs = {"episode_weight": case["episode_reward_weight"],
              "step_weight": case["step_reward_weight"], "step_gamma": case["step_reward_gamma"],
              "std_normalize": case["method"] == "mean_std"}
    return recipe("gigpo", advantage={"estimator": {"implementation": "gigpo", "kwargs": kwargs}})


def per_turn(out: dict, groups: list[list[dict]], rows_per_episode: bool) -> list:
    """The advantage of each step, read off the first token of its turn."""
    adv, mask = out["advantages"], out["loss_mask"]
    result, row = [], 0
    for group in groups:
        got_group = []
        for episode in group:
            steps = []
            for k in range(len(episode["step_scores"])):
                r = row + (k if rows_per_episode else 0)
                active = (mask[r] > 0).nonzero().flatten().tolist()
                first = active[0 if rows_per_episode else k * TURN]
                steps.append(float(adv[r, first]))
            row += len(episode["step_scores"]) if rows_per_episode else 1
            got_group.append(steps)
        result.append(got_group)
    return result


def one_row_per_episode(case: dict) -> list:
    width = 1 + max(len(e["step_scores"]) for g in case["groups"] for e in g) * (TURN + SPAN) + 1
    prompts = [prompt_batch([episode_row(e, width) for e in group], width)
               for group in case["groups"]]
    return per_turn(AdvantageModule(config(case))(*concat_batch(prompts)), case["groups"], False)


def one_row_per_step(case: dict) -> list:
    """ROLL's layout: each step a row of its own (prompt + that turn), the rows of an
    episode one logical rollout, each row's reward the step's score."""
    width = 1 + TURN + 1
    prompts = []
    for group in case["groups"]:
        rows = []
        for episode in group:
            for k, (score, state) in enumerate(zip(episode["step_scores"], episode["states"])):
                rows.append({"loss": [0] + [1] * TURN + [0], "turn_ids": [-1] + [0] * TURN + [-1],
                             "turn_rewards": [0.0] * width, "states": [-1] + [state] * TURN + [-1],
                             "length": 1 + TURN, "reward": score})
        counts = tuple(len(e["step_scores"]) for e in group)
        prompts.append(prompt_batch(rows, width, RolloutGroup(counts)))
    return per_turn(AdvantageModule(config(case))(*concat_batch(prompts)), case["groups"], True)


def assert_close(got, want):
    for got_group, want_group in zip(got, want):
        for got_episode, want_episode in zip(got_group, want_group):
            assert got_episode == pytest.approx(want_episode, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("case", range(10))
@pytest.mark.parametrize("layout", [one_row_per_episode, one_row_per_step])
def test_equals_roll(case, layout):
    recorded = roll_cases()[case]
    assert not recorded["states_shared_across_groups"]
    assert_close(layout(recorded), recorded["advantages"])


@pytest.mark.parametrize("case", [10, 11])
def test_anchor_groups_stay_within_their_prompt_group(case):
    # ROLL keys anchor groups by the state id alone, so equal ids of two prompt groups
    # share one group there; here (as in the paper and verl-agent) they do not: the
    # result is ROLL's on the same episodes with each prompt group's ids made distinct.
    recorded = roll_cases()[case]
    assert recorded["states_shared_across_groups"]
    ours = one_row_per_episode(recorded)
    distinct = dict(recorded, groups=[[dict(e, states=[1000 * (g + 1) + s for s in e["states"]])
                                       for e in group] for g, group in enumerate(recorded["groups"])])
    assert_close(one_row_per_episode(distinct), ours)
    flat = lambda x: [v for g in x for e in g for v in e]  # noqa: E731
    assert max(abs(a - b) for a, b in zip(flat(ours), flat(recorded["advantages"]))) > 1e-3


def test_gigpo_without_anchor_state_ids_names_the_key():
    recorded = roll_cases()[0]
    width = 12
    batch = prompt_batch([episode_row(e, width) for e in recorded["groups"][0]], width)
    del batch["anchor_state_ids"]
    with pytest.raises(ValueError, match="estimator 'gigpo': rollout batch has no 'anchor_state_ids'"):
        AdvantageModule(recipe("gigpo"))(*concat_batch([batch]))
