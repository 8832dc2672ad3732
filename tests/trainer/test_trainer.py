"""The trainer's parts: tasks, rollouts in the SPEC §1 format, sampler, metrics, PPOModule."""

import subprocess
import sys
import warnings

import pytest
import torch

from lightning_adv import ActorConfig, NormConfig
from lightning_adv.trainer import PPOConfig, PPOModule, PRMConfig, PolicyConfig, TaskConfig
from lightning_adv.trainer.data import PromptDataset, PromptLoader, PromptSampler, generator
from lightning_adv.trainer.policies.base import GenerationRequest
from lightning_adv.trainer.policies.logprobs import next_token_logprobs
from lightning_adv.trainer.rollout.batch import build_batch, score
from lightning_adv.trainer.tasks.runtime import AdditionTask, GuessTask, ReverseTask, Sample, TaskRuntime, Turn, guess_consistency, position_match
from lightning_adv.exceptions import TaskError

SMALL_PPO = PPOConfig(prompts_per_step=4, n_samples=4, minibatches=2, epochs=1)


def make_module(task="reverse", **overrides):
    kwargs = {"task": TaskConfig(name=task), "ppo": SMALL_PPO, "seed": 0}
    kwargs.update(overrides)
    torch.manual_seed(0)
    return PPOModule(**kwargs)


def sample(text, target="cba", eos=True, turns=None):
    turns = turns or (Turn(text, tuple(text) + (("<eos>",) if eos else ()), eos),)
    return Sample(index=0, instance=None, prompt="abc=", turns=tuple(turns), truncated=not eos,
                  target=target)


# ---------------------------------------------------------------------- tasks

def test_reverse_partial_credit_counts_positions_and_length():
    task = ReverseTask()
    assert task.prompt("abc") == "abc=" and task.target("abc") == "cba"
    assert task.reward(sample("cba")) == 1.0
    assert task.reward(sample("cbx")) == pytest.approx(2 / 3)
    assert task.reward(sample("cbaa")) == pytest.approx(3 / 4)
    assert task.reward(sample("")) == 0.0
    assert ReverseTask(partial_credit=False).reward(sample("cbx")) == 0.0


def test_addition_is_exact_match():
    task = AdditionTask(max_operand=9)
    assert task.prompt((3, 5)) == "3+5=" and task.target((3, 5)) == "8"
    assert task.reward(sample("8", target="8")) == 1.0
    assert task.reward(sample("80", target="8")) == 0.0


def test_guess_environment_and_reward():
    task = GuessTask(n=8, max_turns=4, turn_penalty=0.1)
    turn = lambda text: Turn(text, tuple(text), False)  # noqa: E731
    assert task.reply(5, [turn("3")]) == ">"
    assert task.reply(5, [turn("7")]) == "<"
    assert task.reply(5, [turn("x")]) == "?"
    assert task.reply(5, [turn("5")]) is None  # solved: the episode ends on the policy's turn
    solved = Sample(0, 5, "G", (turn("3"), turn("5")), False)
    assert task.reward(solved) == pytest.approx(0.9)
    assert task.reward(Sample(0, 5, "G", (turn("3"),) * 4, False)) == 0.0


def test_scorers_per_token_and_per_turn():
    assert position_match(sample("cxa")) == [0.0, -1.0, 0.0, 0.0]  # c x a <eos>
    assert position_match(sample("cb", eos=False), penalty=2.0) == [0.0, 0.0]
    turns = (Turn("4", ("4",), False, "<"), Turn("6", ("6",), False, "<"),
             Turn("x", ("x",), False, "?"), Turn("2", ("2",), False))
    assert guess_consistency(Sample(0, 2, "G", turns, False)) == [0.0, -1.0, -1.0, 0.0]


def test_task_config_and_runtime_errors_name_the_field():
    with pytest.raises(ValueError, match="task.name"):
        TaskConfig(name="nope")
    with pytest.raises(ValueError, match="task.kwargs"):
        TaskRuntime(TaskConfig(name="reverse", kwargs={"min_len": 5, "max_len": 2}))
    with pytest.raises(ValueError, match="task.reward_kwargs"):
        TaskConfig(reward_kwargs={"x": 1})
    module = make_module("tests.support.trainer_helpers.EmptyReplyTask")
    with pytest.raises(TaskError, match="environment reply after turn 0 .*non-empty string"):
        module.rollout([0], generator(0))


@pytest.mark.parametrize("fn, message", [
    ("nan_reward", "must be finite"), ("string_reward", "must be a float, got str"),
    ("bool_reward", "convert booleans"),
])
def test_bad_rewards_are_caught_naming_the_function(fn, message):
    runtime = TaskRuntime(TaskConfig(reward=f"tests.support.trainer_helpers.{fn}"))
    with pytest.raises(TaskError, match=rf"task.reward 'tests.support.trainer_helpers.{fn}': reward for "
                                        rf"prompt 0, sample 0 .*{message}"):
        runtime.reward(Sample(0, "abc", "abc=", (), False, "cba"), 0)
    assert TaskRuntime(TaskConfig(reward="tests.support.trainer_helpers.tensor_reward")).reward(
        Sample(0, "abc", "abc=", (), False, "cba"), 0) == 0.5


# ---------------------------------------------------------------------- rollout batch

@pytest.fixture(scope="module")
def guess_rollout():
    module = make_module("guess", prm=PRMConfig(enabled=True, scorers=[
        {"path": "lightning_adv.trainer.tasks.guess_consistency", "weight": 0.5}]))
    groups = module.rollout([3, 1, 4, 1], generator(0, "test"))
    batch, meta = module.make_batch(groups)
    return module, groups, batch, meta


def test_rollout_batch_follows_spec_section_1(guess_rollout):
    module, groups, batch, meta = guess_rollout
    eos = module.runtime.vocab.eos_id
    assert meta.traj_group_sizes == [4, 4, 4, 4] and len(meta.rollout_groups) == 4
    attention, gen = batch["attention_mask"].bool(), batch["loss_mask"].bool()
    lengths = attention.sum(1)
    b, t = attention.shape
    assert not gen[:, :2].any(), "<bos> and the prompt are not generated"
    assert (batch["logprobs"][~gen] == 0).all() and (batch["logprobs"][gen] < 0).all()
    # turn ids: -1 off generated tokens, non-decreasing on them; environment tokens sit
    # between turns, are real tokens and are not generated.
    turn_ids = batch["turn_ids"]
    assert (turn_ids[~gen] == -1).all()
    env = attention & ~gen
    env[:, :2] = False
    assert env.any(), "the environment answered at least once"
    for row in range(b):
        ids = turn_ids[row][gen[row]]
        assert (ids[1:] >= ids[:-1]).all()
        last = int(lengths[row]) - 1
        assert gen[row, last], "episodes end on a policy token"
        truncated = int(batch["input_ids"][row, last]) != eos
        assert bool(batch["is_truncated"][row]) == truncated
    # next-token tensors: values after reading tokens 0..t; ref_logp scores token t+1.
    assert (batch["values"][~attention] == 0).all()
    next_real = torch.nn.functional.pad(attention[:, 1:], (0, 1))
    assert (batch["ref_logp"][~next_real] == 0).all()
    assert batch["rewards"].shape == (b,) and batch["rewards"].dtype == torch.float32
    # per-turn process rewards broadcast over each turn's tokens, weighted.
    assert set(batch["token_rewards"][gen].unique().tolist()) <= {0.0, -0.5}
    assert (batch["token_rewards"][~gen] == 0).all()


def test_behaviour_logprobs_match_a_forward_pass(guess_rollout):
    """Token i's behaviour log-prob equals the policy's next-token log-prob at i - 1."""
    module, _, batch, _ = guess_rollout
    logits, _ = module.policy(batch["input_ids"])
    recomputed = next_token_logprobs(logits, batch["input_ids"])
    gen = batch["loss_mask"].bool()
    shifted = torch.roll(batch["logprobs"], -1, dims=1)
    aligned = torch.roll(gen, -1, dims=1)
    torch.testing.assert_close(recomputed[aligned], shifted[aligned], rtol=1e-4, atol=1e-4)


def test_rollout_is_a_function_of_the_generator(guess_rollout):
    module, groups, _, _ = guess_rollout
    again = module.rollout([3, 1, 4, 1], generator(0, "test"))
    assert [[e.tokens for e in g] for g in again] == [[e.tokens for e in g] for g in groups]
    other = module.rollout([3, 1, 4, 1], generator(1, "test"))
    assert [[e.tokens for e in g] for g in other] != [[e.tokens for e in g] for g in groups]


def test_scorer_output_is_checked():
    module = make_module()
    groups = module.policy.generate(module.runtime, GenerationRequest([0], 2, 5), generator(0))
    from tests.support.trainer_helpers import wrong_length_scorer
    with pytest.raises(TaskError, match=r"prm.scorers\[0\] 'x': expected \d+ values"):
        score(groups, module.runtime, [("prm.scorers[0] 'x'", wrong_length_scorer, 1.0, {})])


def test_build_batch_single_turn_has_no_turn_ids():
    module = make_module()
    groups = module.rollout([0, 1], generator(0))
    batch, _ = build_batch(groups, multi_turn=False, process_rewards=False)
    assert "turn_ids" not in batch and "token_rewards" not in batch


# ---------------------------------------------------------------------- data

def test_sampler_shards_whole_prompts_and_resumes():
    dataset = PromptDataset(40)
    ranks = [list(PromptSampler(dataset, 8, num_replicas=2, rank=r, seed=3)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 20
    for step in range(5):
        a, b = ranks[0][step * 4:(step + 1) * 4], ranks[1][step * 4:(step + 1) * 4]
        assert not set(a) & set(b)
    assert sorted(ranks[0] + ranks[1]) == list(range(40))
    single = PromptSampler(dataset, 8, seed=3)
    epoch0 = list(single)
    single.set_epoch(1)
    assert list(single) != epoch0
    single.set_epoch(0)
    single.resume_at(0, 3)
    assert list(single) == epoch0[24:]
    assert list(single) == epoch0, "the skip applies to one pass only"
    with pytest.raises(ValueError, match="prompts_per_step"):
        PromptSampler(dataset, 7, num_replicas=2)


def test_loader_position_counts_trained_steps():
    sampler = PromptSampler(PromptDataset(16), 4, seed=0)
    epoch0 = list(sampler)
    loader = PromptLoader(PromptDataset(16), sampler)
    loader.step_done(0)
    loader.step_done(0)
    assert loader.state_dict() == {"epoch": 0, "steps_done": 2}
    loader.step_done(1)
    assert loader.state_dict() == {"epoch": 1, "steps_done": 1}
    loader.load_state_dict({"epoch": 0, "steps_done": 3})
    assert [b.tolist() for b in loader] == [epoch0[12:16]]


# ---------------------------------------------------------------------- metrics, module

def test_reference_policy_only_with_kl_and_critic_only_with_value_head():
    with_kl = make_module(actor=ActorConfig(kl_ctl=0.1))
    assert with_kl.ref_policy is not None
    assert not any(p.requires_grad for p in with_kl.ref_policy.parameters())
    critic_free = make_module(actor=ActorConfig(kl_ctl=0.0), policy=PolicyConfig(value_head=False))
    assert critic_free.ref_policy is None and critic_free.policy.value_head is None


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="ppo.temperature"):
        PPOConfig(temperature=0.0)
    with pytest.raises(ValueError, match="policy.n_heads"):
        PolicyConfig(d_model=64, n_heads=5)
    with pytest.raises(ValueError, match=r"prm.scorers\[0\].path"):
        PRMConfig(scorers=[{"path": "not a path"}])
    with pytest.raises(ValueError, match="prm.advantage_shaping"):
        PRMConfig(enabled=True, advantage_shaping={"mode": "gvpo", "negative_scale": -1.0},
                  scorers=[{"path": "lightning_adv.trainer.tasks.position_match"}])
    with pytest.raises(ValueError, match="actor.use_decoupled_loss"):
        make_module(actor=ActorConfig(use_decoupled_loss=True))


def test_hparams_are_plain_and_rebuild_the_module():
    module = make_module("guess", actor=ActorConfig(adv_norm=NormConfig()))
    hparams = dict(module.hparams)
    rebuilt = PPOModule(**hparams)
    assert rebuilt.actor_config == module.actor_config
    assert rebuilt.task_config == module.task_config


def test_a_subclass_whose_forward_takes_no_kl_coef_is_refused_naming_the_fix():
    from lightning_adv.trainer.setup import build_advantage_module

    with pytest.raises(ValueError, match=r"advantage_module: 'tests\.support\.trainer_helpers\.OldForward"
                                         r"AdvantageModule' overrides forward without .*kl_coef"):
        build_advantage_module("tests.support.trainer_helpers.OldForwardAdvantageModule", ActorConfig())


def test_custom_advantage_module_class_path(tmp_path):
    import lightning.pytorch as pl
    from tests.support.trainer_helpers import ScaledAdvantageModule

    module = make_module(advantage_module="tests.support.trainer_helpers.ScaledAdvantageModule")
    assert type(module.advantage) is ScaledAdvantageModule
    ScaledAdvantageModule.calls = 0
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    assert ScaledAdvantageModule.calls == 2 and module.rollout_step == 2


def test_importing_lightning_adv_stays_light():
    code = ("import sys, lightning_adv; assert 'lightning' not in sys.modules; "
            "import lightning_adv.trainer; "
            "assert lightning_adv.trainer.PPOModule.__name__ == 'PPOModule'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
