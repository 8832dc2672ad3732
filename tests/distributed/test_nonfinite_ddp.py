"""A non-finite step on one data-parallel rank stops every rank (no rank waits in a
collective its peer never joins), each with one error naming the step."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_runs import CONFIGS, SMALL
from tests.support.nonfinite import BAD_FROM

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module, says", [
    ("RankOneNaNAdvantageModule", "returned advantages that are not finite"),
    ("RankOneOverflowAdvantageModule", "the loss is inf, expected a finite value"),
])
def test_a_non_finite_step_on_one_rank_stops_both(module, says, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "lightning_adv", "fit", "--config", str(CONFIGS / "ppo.yaml"),
           "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu",
           f"--trainer.logger.init_args.save_dir={tmp_path}", *SMALL,
           "--trainer.limit_train_batches=4", "--model.evaluation.num_prompts=0",
           f"--model.advantage_module=tests.support.nonfinite.{module}"]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert run.returncode == 1, run.stderr[-3000:]
    assert all(f"training step {BAD_FROM}" in line for line in errors) and len(errors) == 2, errors
    assert any(says in line for line in errors), errors
    assert any("another data-parallel rank" in line for line in errors), errors
