"""Named recipes of other frameworks: each formula checked on a small batch."""

import dataclasses
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from tests.support.batches import rows_batch
from lightning_adv import ActorConfig, AdvantageModule, concat_batch
from lightning_adv.recipes import RECIPES, recipe, recipe_fields
from lightning_adv.exceptions import RecipeOverrideWarning

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "advantage"

# Prompt A: four rows of different lengths; prompt B: three rows with equal rewards.
ROWS_A = ["pgggg.", "pgg...", "pggg..", "pg...."]
REWARDS_A = [1.0, 0.0, 0.0, 1.0]
ROWS_B = ["pgg...", "pgggg.", "pg...."]
REWARDS_B = [0.0, 0.0, 0.0]
LENGTHS = [4, 2, 3, 1, 2, 4, 1]


def batch_and_meta():
    return concat_batch([rows_batch(ROWS_A, REWARDS_A), rows_batch(ROWS_B, REWARDS_B)])


def token_advantages(name, **overrides):
    batch, meta = batch_and_meta()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = AdvantageModule(recipe(name, **overrides))(batch, meta)
    return out["advantages"], out["loss_mask"]


def per_row(name, **overrides):
    """The advantage every active token of a row shares (checked to be shared)."""
    adv, mask = token_advantages(name, **overrides)
    values = []
    for row in range(adv.shape[0]):
        active = adv[row][mask[row] > 0]
        assert torch.allclose(active, active[0].expand_as(active), atol=1e-6), (name, row, active)
        values.append(active[0].item())
    return values


def close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert math.isclose(g, w, rel_tol=1e-5, abs_tol=1e-5), (got, want)


def test_yaml_files_match_the_recipes():
    names = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    assert names == sorted(RECIPES)
    every_field = {f.name for f in dataclasses.fields(ActorConfig)} - {"recipe"}
    for name in names:
        loaded = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
        # Complete: a file under model.actor replaces the whole section, nothing merges in.
        assert set(loaded) == every_field, name
        assert loaded == recipe_fields(name), name
        assert ActorConfig(**loaded) == recipe(name), name
        for key, value in RECIPES[name].items():
            if not isinstance(value, dict):
                assert loaded[key] == value, (name, key)


def test_recipe_by_name_takes_the_fields_left_at_their_defaults():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ActorConfig(recipe="rloo") == dataclasses.replace(recipe("rloo"), recipe="rloo")
    with pytest.warns(RecipeOverrideWarning, match=r"actor.recipe 'reinforce_pp': the config "
                      r"overrides the recipe's kl_ctl=0\.2 \(recipe: 0\.01\)"):
        config = ActorConfig(recipe="reinforce_pp", kl_ctl=0.2, gae_lambda=1.0)
    assert config.kl_ctl == 0.2 and config.adv_norm == recipe("reinforce_pp").adv_norm
    # The stage tree counts stage by stage.
    with pytest.warns(RecipeOverrideWarning, match="process_adv_shaping"):
        config = ActorConfig(recipe="grpo", advantage={"process_adv_shaping": "gvpo"})
    assert config.advantage.estimator.implementation == "token_gae"
    assert config.advantage.process_adv_shaping.implementation == "gvpo"
    # Idempotent: a resolved config (a checkpoint's hyper-parameters) rebuilds itself.
    again = ActorConfig(**dataclasses.asdict(config))
    assert again == config


def test_recipe_by_name_with_a_full_replacement_drops_the_recipes_stages():
    with pytest.warns(RecipeOverrideWarning, match="compute"):
        config = ActorConfig(recipe="opo", advantage={"compute": "examples.full_replacement.grpo_advantages"})
    assert config.advantage.outcome_reward_shaping is None
    assert config.advantage.estimator is None


def test_unknown_recipe_name_names_the_key():
    with pytest.raises(ValueError, match="actor.recipe: expected one of 'grpo'"):
        ActorConfig(recipe="grpo2")


def test_yaml_files_are_generated_from_the_recipes(tmp_path):
    # One source of truth: the shipped files are exactly what the generator writes.
    from lightning_adv.recipes import recipe_yaml
    for name in RECIPES:
        assert (CONFIGS / f"{name}.yaml").read_text() == recipe_yaml(name), (
            f"configs/advantage/{name}.yaml is out of step; run "
            f"python scripts/write_recipe_configs.py")
    script = Path(__file__).resolve().parents[2] / "scripts" / "write_recipe_configs.py"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, timeout=120)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.yaml" for n in RECIPES)
    assert yaml.safe_load((tmp_path / "opo.yaml").read_text())["reward_clip"] == math.inf


def test_grpo():
    # Group A: mean .5, unbiased std sqrt(1/3); group B: equal references -> scale 1.
    s = math.sqrt(1 / 3) + 1e-5
    close(per_row("grpo"), [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0])


def test_dr_grpo():
    close(per_row("dr_grpo"), [0.5, -0.5, -0.5, 0.5, 0, 0, 0])


def test_rloo():
    # r_i - mean of the other three: 1 - 1/3, 0 - 2/3, 0 - 2/3, 1 - 1/3.
    close(per_row("rloo"), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0])


def test_opo():
    # Group A: sum(l r) / sum(l) = (4*1 + 1*1) / (4+2+3+1) = 0.5 -> r - 0.5.
    close(per_row("opo"), [0.5, -0.5, -0.5, 0.5, 0, 0, 0])
    batch = rows_batch(["pgggg.", "pg...."], [1.0, 0.0])  # b = 4/5
    out = AdvantageModule(recipe("opo"))(*concat_batch([batch]))
    close([out["advantages"][0, 0].item(), out["advantages"][1, 0].item()], [0.2, -0.8])


def test_gpg():
    # B = 7 rows, M = 3 (group B is all equal) -> alpha = 7/4.
    close(per_row("gpg"), [7 / 8, -7 / 8, -7 / 8, 7 / 8, 0, 0, 0])
    s = math.sqrt(1 / 3) + 1e-5
    config = dict(RECIPES["gpg"])
    config["advantage"] = {"outcome_reward_shaping": {"implementation": "gpg",
                                                      "kwargs": {"std_normalize": True}}}
    batch, meta = batch_and_meta()
    out = AdvantageModule(ActorConfig(**config))(batch, meta)
    close([out["advantages"][i, 0].item() for i in range(7)],
          [7 / 4 * 0.5 / s, -7 / 4 * 0.5 / s, -7 / 4 * 0.5 / s, 7 / 4 * 0.5 / s, 0, 0, 0])


def returns_to_go(rows, rewards, gamma):
    """Token returns G_t per active aligned position, as lists per row."""
    out = []
    for row, r in zip(rows, rewards):
        n = row.count("g")
        out.append([gamma ** (n - 1 - k) * r for k in range(n)])
    return out


def whiten(values):
    flat = torch.tensor([v for row in values for v in row], dtype=torch.float64)
    mean, std = flat.mean(), flat.std(unbiased=True)
    return [[(v - mean.item()) / (std.item() + 1e-5) for v in row] for row in values]


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_reinforce_pp(gamma):
    adv, mask = token_advantages("reinforce_pp", discount=gamma)
    want = whiten(returns_to_go(ROWS_A + ROWS_B, REWARDS_A + REWARDS_B, gamma))
    for row, expected in enumerate(want):
        close(adv[row][mask[row] > 0].tolist(), expected)


def test_reinforce_pp_baseline():
    adv, mask = token_advantages("reinforce_pp_baseline", discount=0.5)
    shaped = [r - 0.5 for r in REWARDS_A] + REWARDS_B
    want = whiten(returns_to_go(ROWS_A + ROWS_B, shaped, 0.5))
    for row, expected in enumerate(want):
        close(adv[row][mask[row] > 0].tolist(), expected)


def test_reinforce_keeps_the_kl_penalty_in_the_token_rewards():
    # One row, ref 0, old log-probs -1 on every generated token: k1 KL reward = +kl_ctl each.
    batch = rows_batch(["pggg."], [1.0], logprobs=[[0.0, -1.0, -1.0, -1.0, 0.0]])
    out = AdvantageModule(recipe("reinforce_pp", kl_ctl=0.1, adv_norm=None, discount=0.5))(batch)
    # rewards per step [.1, .1, 1.1]: G = [.1 + .5*.1 + .25*1.1, .1 + .5*1.1, 1.1]
    close(out["advantages"][0, :3].tolist(), [0.425, 0.65, 1.1])
    close(out["returns"][0, :3].tolist(), [0.425, 0.65, 1.1])


def test_group_recipes_need_meta():
    with pytest.raises(ValueError, match="outcome_reward_shaping 'gpg': needs the prompt groups"):
        AdvantageModule(recipe("gpg"))(rows_batch(ROWS_A, REWARDS_A))


def test_unknown_recipe():
    with pytest.raises(ValueError, match="recipe: expected one of 'grpo'"):
        recipe("ppo2")


def test_builtin_kwargs_are_checked():
    with pytest.raises(ValueError, match=r"outcome_reward_shaping\.kwargs\.std_normalize"):
        ActorConfig(advantage={"outcome_reward_shaping": {"implementation": "gpg",
                                                          "kwargs": {"std_normalize": 1}}})
    with pytest.raises(ValueError, match="takes no kwargs"):
        ActorConfig(advantage={"estimator": {"implementation": "reinforce", "kwargs": {"g": 1}}})
