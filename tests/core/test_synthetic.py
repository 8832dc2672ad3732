"""``lightning_adv.testing.synthetic``: the rollout batches and configs that tests and
benchmarks share are valid inputs, the same for the same seed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from lightning_adv import ActorConfig, AdvantageModule
from lightning_adv.testing.synthetic import (
    ROWS_PER_PROMPT, module_configs, realistic_inputs, with_stage_inputs)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("bs, width", [(20, 96), (3, 16)])
def test_batch_is_a_valid_rollout_and_the_kernel_inputs_are_its_alignment(bs, width):
    x = realistic_inputs(bs, width, torch.device("cpu"))
    attention, loss_mask = x.batch["attention_mask"], x.batch["loss_mask"]
    assert attention.shape == loss_mask.shape == x.rewards.shape == (bs, width)
    assert x.meta.traj_group_sizes == [min(ROWS_PER_PROMPT, bs - s)
                                       for s in range(0, bs, ROWS_PER_PROMPT)]
    assert bool((loss_mask <= attention).all()) and bool(loss_mask.any(dim=1).all())
    # right padding: each row's attention is one run from the first position
    seqlens = attention.sum(dim=1)
    assert torch.equal(attention, (torch.arange(width) < seqlens[:, None]).long())
    assert torch.equal(x.batch["turn_ids"] == -1, loss_mask == 0)
    # next-token alignment: position t holds what the token at t + 1 had
    assert torch.equal(x.loss_mask[:, :-1], loss_mask[:, 1:].float())
    assert torch.equal(x.turn_ids[:, :-1], x.batch["turn_ids"][:, 1:])
    assert bool((x.turn_ids[:, -1] == -1).all())
    # truncated rows (attention to the last position) bootstrap from their last value
    full = seqlens == width
    assert torch.equal(x.bootstrap[full], x.values[full, -1])
    assert bool((x.bootstrap[~full] == 0).all())
    assert x.row_lambda.shape == (bs,) and bool(((x.row_lambda >= 0) & (x.row_lambda <= 1)).all())


def test_same_seed_same_batch_other_seed_another():
    a, b, c = (realistic_inputs(16, 64, torch.device("cpu"), seed=s) for s in (0, 0, 1))
    assert all(torch.equal(a.batch[k], b.batch[k]) for k in a.batch)
    assert torch.equal(a.rewards, b.rewards) and not torch.equal(a.rewards, c.rewards)


def test_module_configs_are_the_defaults_and_each_shipped_actor_section():
    assert set(module_configs()) == {"default", "GRPO"}
    configs = module_configs(CONFIGS)
    loaded = {p.name: yaml.safe_load(p.read_text())["model"] for p in CONFIGS.glob("*.yaml")}
    # (an overlay config, given after another, may leave the actor section to it)
    shipped = {name: model["actor"] for name, model in loaded.items() if "actor" in model}
    assert set(configs) == {"default", "GRPO", *shipped}
    assert set(loaded) - set(shipped) == {"smollm2_grpo_lora.yaml"}
    for name, actor in shipped.items():
        assert configs[name] == ActorConfig(**actor)
    assert configs["ppo.yaml"].gae_lambda == 0.95


def test_every_config_runs_on_the_synthetic_batch():
    x = realistic_inputs(16, 48, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    for name, config in module_configs(CONFIGS).items():
        module = AdvantageModule(config)
        batch = with_stage_inputs(x.batch, module.required_batch_keys, gen)
        out = module(batch, x.meta)
        assert bool(torch.isfinite(out["advantages"]).all()), name
