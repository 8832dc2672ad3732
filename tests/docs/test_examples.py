"""Every example runs, and does what its docstring says."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from examples.quickstart import small_batch
from lightning_adv import ActorConfig, AdvantageModule
from lightning_adv.recipes import recipe
from tests.support.doc_blocks import scratch_directory
from tests.support.peers import require_extras_of

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, tmp_path):
    # an example of an optional extra (verl, trl) skips without it, or fails in CI
    require_extras_of((REPO / "examples" / f"{name}.py").read_text())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # In a scratch directory (links to configs/, data/, ...): what an example writes
    # (own_trainer's runs/own_trainer) never lands in the checkout.
    proc = subprocess.run([sys.executable, "-m", f"examples.{name}"], cwd=scratch_directory(tmp_path), env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def run(config, module_class=AdvantageModule, batch_meta=None):
    batch, meta = batch_meta or small_batch()
    return module_class(config)(batch, meta)


def test_scale_outcome_scales_the_task_rewards():
    out = run(ActorConfig(kl_ctl=0.0, advantage={"outcome_reward_shaping": {
        "implementation": "examples.scale_outcome.scale_outcome", "kwargs": {"factor": 0.5}}}))
    batch, _ = small_batch()
    assert torch.equal(out["rewards"], batch["rewards"] * 0.5)
    plain = run(ActorConfig(kl_ctl=0.0, reward_scaling=0.5))
    assert torch.allclose(out["advantages"], plain["advantages"])


def test_custom_estimator_is_token_gae_clipped_with_the_configured_lambda():
    lam = dict(gae_lambda="lightning_adv.vapo_length_adaptive_gae", gae_lambda_kwargs={"alpha": 0.5})
    out = run(ActorConfig(**lam, advantage={"estimator": {
        "implementation": "examples.custom_estimator.clipped_token_gae", "kwargs": {"clip": 0.5}}}))
    plain = run(ActorConfig(**lam))
    assert torch.allclose(out["advantages"], plain["advantages"].clamp(-0.5, 0.5))
    assert (plain["advantages"].abs() > 0.5).any()  # the clip actually bites
    assert torch.allclose(out["returns"], plain["returns"])


def test_custom_process_adds_bounded_weighted_rewards():
    batch, meta = small_batch()
    batch["token_rewards"] = torch.linspace(-3, 3, batch["loss_mask"].numel()).reshape(
        batch["loss_mask"].shape) * batch["loss_mask"]
    out = run(ActorConfig(advantage={"process_adv_shaping": {
        "implementation": "examples.custom_process.bounded_additive",
        "kwargs": {"weight": 0.5, "bound": 1.0}}}), batch_meta=(batch, meta))
    plain = run(ActorConfig(), batch_meta=(batch, meta))
    direct = torch.roll(batch["token_rewards"], -1, dims=-1) * plain["loss_mask"]
    assert torch.allclose(out["advantages"], plain["advantages"] - direct + 0.5 * direct.clamp(-1, 1))


def test_full_replacement_matches_the_grpo_recipe():
    batch, meta = small_batch()
    del batch["values"]  # GRPO is critic-free
    out = run(ActorConfig(advantage={"compute": {
        "implementation": "examples.full_replacement.grpo_advantages"}}), batch_meta=(batch, meta))
    grpo = run(recipe("grpo"), batch_meta=(batch, meta))
    assert torch.allclose(out["advantages"], grpo["advantages"] * grpo["loss_mask"], atol=1e-4)
    assert torch.equal(out["loss_mask"], grpo["loss_mask"])


def test_subclass_clips_the_configured_estimator():
    from examples.subclass import ClippedAdvantageModule
    out = run(ActorConfig(gae_lambda=0.95), ClippedAdvantageModule)
    plain = run(ActorConfig(gae_lambda=0.95))
    assert (plain["advantages"].abs() > 1).any()
    assert torch.allclose(out["advantages"], plain["advantages"].clamp(-1, 1))
