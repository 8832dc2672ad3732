"""The la_ estimators as verl's trainer reaches them: ray_trainer.compute_advantage (the
function verl 0.9.1's PPO loop calls each step) on a DataProto, dispatching by name through
its registry with the arguments it really passes; and the adapter's refusals, each naming
the field or key."""

import numpy as np
import pytest
import torch

from lightning_adv.integrations.verl import VERL_ESTIMATORS, register
from tests.integrations.test_verl_estimators import responses
from tests.support.peers import VERL_CORE_ALGOS, peer_module

pytestmark = pytest.mark.peers


@pytest.fixture(scope="module")
def verl():
    core = peer_module(*VERL_CORE_ALGOS)
    register()
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    return core, DataProto, AlgoConfig, compute_advantage


def data_proto(verl, data, with_baselines=False):
    _, DataProto, _, _ = verl
    tensors = {"token_level_rewards": data["token_level_rewards"],
               "response_mask": data["response_mask"], "values": data["values"]}
    if with_baselines:
        tensors["reward_baselines"] = data["reward_baselines"]
    return DataProto.from_dict(tensors=tensors,
                               non_tensors={"uid": np.array(data["index"], dtype=object)})


#: verl estimators whose trainer path gives the la_ name what it needs (gae and the
#: optimal token baseline are refused below; the whitened and gpg/gdpo differences are
#: measured in test_verl_estimators.py)
SAME = ("grpo", "rloo", "opo", "grpo_passk", "remax")


@pytest.mark.parametrize("name", SAME)
def test_compute_advantage_dispatches_la_names_like_verls_own(verl, name):
    *_, AlgoConfig, compute_advantage = verl
    data = responses(3, dense=False)
    out = {}
    for estimator in (name, "la_" + VERL_ESTIMATORS[name]):
        proto = data_proto(verl, data, with_baselines=name == "remax")
        out[estimator] = compute_advantage(proto, adv_estimator=estimator,
                                           config=AlgoConfig(adv_estimator=estimator)).batch["advantages"]
    mask = data["response_mask"] > 0
    ours, theirs = out["la_" + VERL_ESTIMATORS[name]], out[name]
    torch.testing.assert_close(ours[mask], theirs[mask].float(), rtol=1e-5, atol=1e-6)


def test_la_gae_needs_values_that_verls_trainer_passes_only_to_its_own_gae(verl):
    *_, AlgoConfig, compute_advantage = verl
    proto = data_proto(verl, responses(0, dense=False))
    with pytest.raises(ValueError, match=r"'la_gae': needs 'values'.*only to its built-in 'gae'"):
        compute_advantage(proto, adv_estimator="la_gae", config=AlgoConfig(adv_estimator="la_gae"))


def call_registered(core, name, **extra):
    """verl's registered estimator ``name`` on a sparse-reward batch, as verl calls it."""
    data = responses(0, dense=False)
    return core.get_adv_estimator_fn(name)(
        token_level_rewards=data["token_level_rewards"], response_mask=data["response_mask"],
        index=data["index"], **extra)


def test_the_optimal_token_baseline_names_its_missing_inputs(verl):
    with pytest.raises(ValueError, match=r"needs 'sum_pi_squared' and 'old_log_probs'"):
        call_registered(verl[0], "la_optimal_token_baseline")


@pytest.mark.parametrize("name", ["la_tree_grpo", "la_treepo", "la_treerl"])
def test_the_tree_recipes_name_the_key_verl_cannot_pass(verl, name):
    with pytest.raises(ValueError, match=r"rollout batch has no 'tree_node_ids'"):
        call_registered(verl[0], name)


@pytest.mark.parametrize("field, value, message", [
    ("use_pf_ppo", True, r"algorithm.use_pf_ppo: True cannot be mapped"),
    ("norm_adv_by_std_in_grpo", False, r"algorithm.norm_adv_by_std_in_grpo: False cannot be mapped"),
])
def test_algorithm_fields_that_cannot_be_mapped_are_named(verl, field, value, message):
    core, _, AlgoConfig, _ = verl
    with pytest.raises(ValueError, match=message):
        call_registered(core, "la_gdpo", config=AlgoConfig(**{field: value}))


def test_an_unknown_algorithm_key_is_named(verl):
    with pytest.raises(ValueError, match=r"algorithm.my_knob: not a field"):
        call_registered(verl[0], "la_grpo", config={"gamma": 1.0, "my_knob": 3})


def test_norm_adv_by_std_false_maps_grpo_onto_its_mean_only_form(verl):
    core, _, AlgoConfig, _ = verl
    data = responses(1, dense=False)
    kw = {"token_level_rewards": data["token_level_rewards"], "response_mask": data["response_mask"],
          "index": data["index"], "config": AlgoConfig(norm_adv_by_std_in_grpo=False)}
    theirs = core.compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False,
                                                 **{**kw, "token_level_rewards": kw["token_level_rewards"].clone()})
    ours = core.get_adv_estimator_fn("la_grpo")(**kw)
    mask = data["response_mask"] > 0
    torch.testing.assert_close(ours[0][mask], theirs[0][mask], rtol=1e-5, atol=1e-6)


def test_a_reward_on_a_masked_token_is_refused_not_dropped(verl):
    core = verl[0]
    data = responses(0, dense=False)
    rewards = data["token_level_rewards"].clone()
    rewards[0, 1] = 0.3  # row 0's tool span (mask 0)
    with pytest.raises(ValueError, match=r"non-zero rewards on tokens the policy did not generate"
                                         r".*row 0, position 1"):
        core.get_adv_estimator_fn("la_reinforce_pp")(
            token_level_rewards=rewards, response_mask=data["response_mask"], index=data["index"],
            config=None)


def test_turn_gae_takes_each_run_of_generated_tokens_as_a_turn(verl):
    """One row, two turns (a tool span between): gamma 0.5, lambda 1, no values: the
    first turn's tokens get 0.5 * R (one turn later), the second turn's R."""
    core, _, AlgoConfig, _ = verl
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
    rewards = torch.zeros(1, 6)
    rewards[0, 5] = 2.0
    adv, _ = core.get_adv_estimator_fn("la_turn_gae")(
        token_level_rewards=rewards, response_mask=mask, index=np.array(["a"]),
        config=AlgoConfig(gamma=0.5, lam=1.0), values=torch.zeros(1, 6))
    torch.testing.assert_close(adv, torch.tensor([[1.0, 1.0, 0.0, 0.0, 2.0, 2.0]]))
