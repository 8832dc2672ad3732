"""One setup plan: ``PPOModule(...)`` and the CLI's pre-flight check
(``validate_model_config``) run the same checks through ``TrainerPlan.build``, and the
pre-flight check builds no network."""

import warnings

import pytest

from lightning_adv import ActorConfig
from lightning_adv.trainer import PPOModule
from lightning_adv.trainer import setup as trainer_setup
from lightning_adv.trainer.tasks.builtin import ReverseTask
from lightning_adv.trainer.setup import TrainerPlan, validate_model_config
from lightning_adv.exceptions import TaskError

SMALL = {"ppo": {"prompts_per_step": 4, "n_samples": 4, "minibatches": 2, "epochs": 1},
         "policy": {"d_model": 16, "n_layers": 1, "n_heads": 2}, "seed": 0}


class EmptyPromptTask(ReverseTask):
    """A task whose every prompt is empty (a bad task function)."""

    def prompt(self, instance):
        return ""


@pytest.mark.parametrize("values, error, match", [
    # a scorer path is resolved even while prm is off
    ({"prm": {"scorers": [{"path": "no_such_package.scorer"}]}}, ValueError,
     r"prm.scorers\[0\].path"),
    # the first prompts are built (and checked) before training
    ({"task": {"name": "tests.trainer.test_trainer_setup.EmptyPromptTask"}}, TaskError,
     "prompt of instance 0: expected a non-empty string"),
    ({"ppo": {**SMALL["ppo"], "minibatches": 17}}, ValueError, "ppo.minibatches"),
    ({"actor": {"use_decoupled_loss": True}}, ValueError, "actor.use_decoupled_loss"),
    ({"ppo": {**SMALL["ppo"], "top_k": 5}}, ValueError, "ppo.top_k: supported with a Hugging"),
])
def test_the_module_and_the_pre_flight_check_refuse_the_same_configs(values, error, match):
    config = {**SMALL, **values}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (prm.scorers without prm.enabled)
        with pytest.raises(error, match=match) as pre_flight:
            validate_model_config(config)
        with pytest.raises(error, match=match) as module:
            PPOModule(**config)
    assert str(module.value) == str(pre_flight.value)


def test_both_warn_about_a_critic_next_to_a_critic_free_recipe():
    config = {**SMALL, "actor": ActorConfig(recipe="grpo")}
    for build in (validate_model_config, lambda values: PPOModule(**values)):
        with pytest.warns(UserWarning, match="policy.value_head: true, but actor.reward_norm"):
            build(config)


def test_the_pre_flight_check_builds_no_network_and_gives_the_module_hparams(monkeypatch):
    module = PPOModule(**SMALL)

    def no_network(*args, **kwargs):
        raise AssertionError("the pre-flight check built a policy")

    monkeypatch.setattr(trainer_setup, "build_policy", no_network)
    monkeypatch.setattr(TrainerPlan, "build_policies", no_network)
    assert validate_model_config(SMALL) == dict(module.hparams)
    assert validate_model_config(SMALL, {"devices": 2}) == dict(module.hparams)
    with pytest.raises(ValueError, match=r"ppo.minibatches: .* 0 rows per rank .* 8 rank\(s\)"):
        validate_model_config(SMALL, {"devices": 4, "num_nodes": 2})  # 4 prompts over 8 ranks


def test_a_cli_run_builds_its_plan_once(tmp_path, monkeypatch):
    """The CLI's pre-flight plan is the one the module uses: the dataset scan, tokenizer
    and stage resolution run once per run, and the module checks the same config."""
    from tests.support.cli_runs import fit

    builds = []
    real = TrainerPlan.build.__func__

    def counted(cls, values, world_size=1):
        builds.append(world_size)
        return real(cls, values, world_size)

    monkeypatch.setattr(TrainerPlan, "build", classmethod(counted))
    fit("grpo", tmp_path, "--trainer.limit_train_batches=1", "--trainer.max_epochs=1")
    assert builds == [1]
    # a module built outside the CLI builds its own plan
    PPOModule(**SMALL)
    assert builds == [1, 1]
