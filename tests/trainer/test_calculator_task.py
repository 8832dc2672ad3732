"""The built-in tool task (``calculator``), per-turn rewards from a task, and GiGPO's
anchor states from each turn's context (the shipped agent configs, ``turn_rloo.yaml`` and
``gigpo.yaml``, train in tests/cli/test_cli.py with the other shipped configs)."""

from __future__ import annotations

import pytest
import torch

from lightning_adv.recipes import recipe
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.ppo import PPOModule
from lightning_adv.trainer.rollout.recipe_inputs import anchor_state_ids
from lightning_adv.trainer.rollout.batch import build_batch, turn_end_rewards
from lightning_adv.trainer.tasks.base import Sample, Turn
from lightning_adv.trainer.tasks.runtime import CalculatorTask, TaskConfig, TaskError, TaskRuntime

CALCULATOR = {"name": "calculator", "kwargs": {"max_operand": 9, "max_turns": 3}}
TINY = {"policy": {"d_model": 16, "n_layers": 1, "n_heads": 2, "value_head": False},
        "ppo": {"prompts_per_step": 2, "n_samples": 4, "minibatches": 2, "epochs": 1},
        "task": CALCULATOR, "seed": 3}


def turn(text: str, reply: str = "") -> Turn:
    return Turn(text=text, tokens=tuple(text) + ("<eos>",), eos=True, reply=reply)


def sample(*turns: Turn) -> Sample:
    return Sample(index=0, instance=(12, 34), prompt="12*34", turns=turns, truncated=False,
                  target="408")


def test_a_turn_starting_with_equals_calls_the_calculator():
    task = CalculatorTask()
    assert task.prompt((12, 34)) == "12*34" and task.target((12, 34)) == "408"
    assert task.reply((12, 34), [turn("=")]) == "408"
    assert task.reply((12, 34), [turn("=12*34")]) == "408"   # the rest of a call is ignored
    assert task.reply((12, 34), [turn("408")]) is None        # an answer ends the episode
    assert task.max_new_tokens == 5 and task.max_reply_len == 4 and task.max_prompt_len == 5


def test_reward_is_the_last_answer_and_each_call_costs():
    task = CalculatorTask(call_reward=-0.05)
    done = sample(turn("=", "408"), turn("408"))
    assert task.reward(done) == 1.0
    assert task.turn_rewards(done) == [-0.05, 0.0]
    assert task.reward(sample(turn("418"))) == pytest.approx(2 / 3)   # partial credit
    # the last allowed turn answers, whatever it starts with
    assert task.reward(sample(turn("="), turn("="), turn("=408"))) == 0.0
    assert task.turn_rewards(sample(turn("="), turn("="), turn("="))) == [-0.05, -0.05, 0.0]
    assert CalculatorTask(partial_credit=False).reward(sample(turn("418"))) == 0.0


@pytest.mark.parametrize("kwargs, match", [({"op": "-"}, "op"), ({"max_turns": 1}, "max_turns"),
                                           ({"call_reward": 1.5}, "call_reward")])
def test_bad_kwargs_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TaskRuntime(TaskConfig(name="calculator", kwargs=kwargs))


def test_turn_rewards_of_a_task_are_checked():
    class Wrong(CalculatorTask):
        def turn_rewards(self, sample):
            return [0.0]

    runtime = TaskRuntime(TaskConfig(name="calculator"))
    runtime.task = Wrong()
    with pytest.raises(TaskError, match=r"turn_rewards: expected one value per policy turn \(2\)"):
        runtime.turn_rewards(sample(turn("=", "408"), turn("408")), 0)


def test_rollouts_carry_turn_rewards_at_turn_ends_and_tool_replies_masked():
    model = PPOModule(actor=recipe("turn_rloo"), **TINY)
    groups = model.rollout([0, 1], generator(3, "calc"))
    batch, meta = model.make_batch(groups)
    episodes = [ep for group in groups for ep in group]
    assert "turn_rewards" in batch and "turn_ids" in batch
    for row, ep in enumerate(episodes):
        calls = sum(model.runtime.task.calls(ep.turns))
        assert batch["turn_rewards"][row].sum().item() == pytest.approx(-0.05 * calls)
        # the calculator's replies are attended, not generated (loss mask 0)
        prompt = ep.generated.index(True)
        masked = ep.generated[prompt:].count(False)
        assert masked == sum(len(t.reply) for t in ep.turns)
        assert batch["attention_mask"][row, :len(ep.tokens)].all()
        assert batch["loss_mask"][row, :len(ep.tokens)].tolist() == [int(g) for g in ep.generated]
        assert turn_end_rewards(ep) == batch["turn_rewards"][row, :len(ep.tokens)].tolist()
    out = model.advantage(batch, meta)
    assert torch.isfinite(out["advantages"]).all()
    assert (out["advantages"][out["loss_mask"] == 0] == 0).all()


def test_anchor_states_are_each_turns_context():
    model = PPOModule(actor=recipe("gigpo"), **TINY)
    assert model.rollouts.keys.recipe_inputs == {"anchor_state_ids"}
    groups = model.rollout([0], generator(5, "calc"))
    batch, _ = model.make_batch(groups)
    episodes = groups[0]
    ids = batch["anchor_state_ids"]
    # every episode's first turn is generated from the prompt alone: one anchor state
    first = {int(ids[row][torch.tensor(ep.generated + [False] * (ids.shape[1] - len(ep.tokens)))][0])
             for row, ep in enumerate(episodes)}
    assert len(first) == 1
    again = anchor_state_ids(episodes, ids.shape[1])
    assert torch.equal(again, ids.cpu())
    plain = build_batch(groups, multi_turn=True, process_rewards=False)[0]
    assert "anchor_state_ids" not in plain
