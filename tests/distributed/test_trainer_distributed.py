"""The trainer under real DDP (two gloo processes launched by Lightning), and exact resume."""

import pytest
import torch

from tests.support.cli_runs import CONFIGS, SMALL, fit, scalars
from tests.support.trainer_helpers import ddp_fit

RECORDER = "--model.advantage_module=tests.support.trainer_helpers.RecordingAdvantageModule"


def test_ddp_fit_syncs_metrics_over_ranks(tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    proc = ddp_fit(CONFIGS / "ppo.yaml", tmp_path, record, *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = scalars(tmp_path / "ppo" / "version_0")
    for step in (0, 1):
        ranks = [torch.load(record / f"rank{r}_call{step}.pt", weights_only=True) for r in (0, 1)]
        # Each rank holds its own prompt groups: 2 of the step's 4 prompts, 4 samples each.
        assert [r["rewards"].shape[0] for r in ranks] == [8, 8]
        rewards = torch.cat([r["rewards"] for r in ranks]).double()
        assert logged["train/task_reward"][step] == pytest.approx(rewards.mean().item(), rel=1e-5)
        # Token metrics are global token means, not means of per-rank means.
        total = sum((r["tot_rewards"].double() * r["loss_mask"]).sum() for r in ranks)
        tokens = sum(r["loss_mask"].double().sum() for r in ranks)
        assert logged["train/total_rewards"][step] == pytest.approx((total / tokens).item(), rel=1e-5)
        adv = torch.cat([r["advantages"][r["loss_mask"] > 0] for r in ranks]).double()
        assert logged["train/advantages_mean"][step] == pytest.approx(adv.mean().item(), abs=1e-6)


def test_resume_reproduces_the_next_steps_advantages_exactly(tmp_path, monkeypatch):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    full.mkdir(), resumed.mkdir()
    common = ["--trainer.limit_train_batches=4", "--trainer.callbacks.every_n_train_steps=2",
              RECORDER]
    monkeypatch.setenv("LIGHTNING_ADV_RECORD", str(full))
    fit("ppo", tmp_path, *common)
    first = scalars(tmp_path / "ppo" / "version_0")
    ckpt = tmp_path / "ppo" / "version_0" / "checkpoints" / "epoch=0-step=2.ckpt"
    monkeypatch.setenv("LIGHTNING_ADV_RECORD", str(resumed))
    fit("ppo", tmp_path, *common, f"--ckpt_path={ckpt}")
    # The resumed run's first call is the full run's third training step.
    for resumed_call, full_call in ((0, 2), (1, 3)):
        a = torch.load(full / f"rank0_call{full_call}.pt", weights_only=True)
        b = torch.load(resumed / f"rank0_call{resumed_call}.pt", weights_only=True)
        for key in a:
            assert torch.equal(a[key], b[key]), (key, full_call)
    # Steps 2 and 3 of the first run exist: the resumed run writes its own version_1
    # (the first is left as it was), and logs the first run's steps 2 and 3 again.
    assert scalars(tmp_path / "ppo" / "version_0") == first
    after = scalars(tmp_path / "ppo" / "version_1")
    for tag in ("train/policy_loss", "train/value_loss"):
        assert after[tag] == {s: first[tag][s] for s in (2, 3)}, tag


def test_the_cli_destroys_the_process_group_it_leaves_open(tmp_path):
    """A DDP run's open gloo group at interpreter exit could abort a finished run
    (SIGABRT): the CLI closes it on every way out, here a parse that exits early."""
    import subprocess
    import sys

    code = (
        "import torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0, "
        "world_size=1)\n"
        "from lightning_adv.cli import main\n"
        "try:\n"
        "    main(['fit', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('OPEN' if dist.is_initialized() else 'CLOSED')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "CLOSED"


def test_ddp_trains_trees_whose_ranks_hold_different_numbers_of_rows(tmp_path):
    # Paths that end early leave their rank fewer rows than the other: the update's
    # collectives (gradient all-reduce, the loss's global counts) must still pair up.
    record = tmp_path / "record"
    record.mkdir()
    proc = ddp_fit(CONFIGS / "tree_grpo.yaml", tmp_path, record, *SMALL,
                   "--trainer.limit_train_batches=4", "--model.ppo.n_samples=8",
                   "--model.ppo.tree={segment_tokens: 1, branches: 2, depth: 3}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [[torch.load(record / f"rank{r}_call{step}.pt", weights_only=True)["rewards"].shape[0]
             for r in (0, 1)] for step in range(4)]
    assert any(a != b for a, b in rows), rows   # the case this test is about happened
    logged = scalars(tmp_path / "tree_grpo" / "version_0")
    assert sorted(logged["train/policy_loss"]) == [0, 1, 2, 3]
    totals = logged["train/sampled_tokens_total"]
    assert totals[3] == pytest.approx(sum(logged["train/sampled_tokens"].values()))
