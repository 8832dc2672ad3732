"""ECHO in the built-in trainer (``ppo.echo_ce_coef``): the environment's replies of the
tool task become the loss's cross-entropy mask, out of the RL mask; two training steps
run end to end and log the part; a one-turn task refuses the option."""

import torch

from lightning_adv.recipes import recipe
from lightning_adv.trainer.data import generator
from lightning_adv.trainer.ppo import PPOModule
from lightning_adv.trainer.update import environment_reply_mask
from tests.support.cli_runs import failed_fit, fit, scalars

CALCULATOR = {"name": "calculator", "kwargs": {"max_operand": 9, "max_turns": 3,
                                               "call_reward": 0.5}}
TINY = {"policy": {"d_model": 16, "n_layers": 1, "n_heads": 2, "value_head": False},
        "ppo": {"prompts_per_step": 2, "n_samples": 4, "minibatches": 2, "epochs": 1,
                "micro_batch_size": 2, "echo_ce_coef": 0.1},
        "task": CALCULATOR, "seed": 3}


def test_the_reply_mask_by_hand():
    # prompt p p, generated g g, reply r r, generated g, padding
    batch = {"loss_mask": torch.tensor([[0, 0, 1, 1, 0, 0, 1, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])}
    # aligned: positions 3 and 4 predict the reply tokens 4 and 5
    assert environment_reply_mask(batch).tolist() == [[0, 0, 0, 1, 1, 0, 0, 0]]


def test_the_loss_reads_the_calculators_replies_as_its_cross_entropy_tokens():
    model = PPOModule(actor=recipe("grpo"), **TINY)
    assert model.loss_fn.parts.ce_coef == 0.1
    with torch.no_grad():  # a policy that often starts a turn with "=" (a calculator call)
        model.policy.lm_head.bias[model.runtime.vocab.encode("=", "test")[0]] += 3.0
    groups = model.rollout([0, 1], generator(3, "calc"))
    batch, meta = model.make_batch(groups)
    ce = environment_reply_mask(batch)
    episodes = [ep for group in groups for ep in group]
    for row, ep in enumerate(episodes):  # every reply token, and nothing else
        assert int(ce[row].sum()) == sum(len(t.reply) for t in ep.turns)
    assert int(ce.sum()) > 0, "no calculator call in the sampled episodes"
    out = model.advantage(batch, meta)
    assert not bool(((ce > 0) & (out["loss_mask"] > 0)).any())  # out of the RL mask
    rows = torch.arange(batch["input_ids"].shape[0])
    counts = model.loss_fn.counts(out["loss_mask"], ce)
    result = model.updater.micro_batch_loss(batch, out, rows, counts)
    assert result["ce_tokens"] == ce.sum() and result["ce_loss"] > 0
    torch.testing.assert_close(result["loss"].detach(),
                               result["rl_loss"] + 0.1 * result["ce_loss"])


def test_echo_trains_two_steps_on_the_tool_task(tmp_path):
    fit("turn_rloo", tmp_path, "--model.ppo.echo_ce_coef=0.1", "--model.ppo.prompts_per_step=8",
        "--model.ppo.micro_batch_size=4")  # micro-batches: the minibatch counts both masks
    logged = scalars(tmp_path / "turn_rloo" / "version_0")
    assert len(logged["train/rl_loss"]) == 2 and len(logged["train/task_reward"]) == 2
    # a step whose episodes made calculator calls logs the replies' cross-entropy
    assert logged["train/ce_loss"] and all(v > 0 for v in logged["train/ce_loss"].values())


def test_a_one_turn_task_refuses_echo(tmp_path, capsys):
    code, err = failed_fit("grpo", tmp_path, "--model.ppo.echo_ce_coef=0.1", capsys)
    assert code == 2 and "ppo.echo_ce_coef: the cross-entropy term trains on the " \
                          "environment's replies" in err
