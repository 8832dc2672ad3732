"""``python -m lightning_adv.bench_trainer`` runs and reports every phase (one step each)."""

import subprocess

import pytest

from lightning_adv import bench_trainer
from lightning_adv.bench_trainer import PHASES, ROOT, median_timings, report, run_config


def test_trainer_benchmark_times_every_phase():
    timings = run_config("turn_gae", steps=1, warmup=1)
    assert set(PHASES) <= set(timings)
    assert sum(timings[p] for p in PHASES) <= timings["step"] * 1.01
    text = report("turn_gae", 1, timings, median_timings([timings, timings]), "abc1234", 2)
    assert "steps/s" in text and "abc1234" in text and all(p in text for p in PHASES)


def test_baseline_runs_from_its_own_commit(tmp_path, capsys):
    """The comparison extracts the package at a commit and runs it in its own process."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    source = bench_trainer.extract(head, tmp_path)
    assert (source / "lightning_adv" / "trainer" / "ppo.py").exists()
    timings = bench_trainer.run_in_process(source, "ppo", 1, 1)
    assert set(PHASES) <= set(timings) and timings["step"] > 0


def test_report_gives_the_run_by_run_speed_ups():
    old, new = {"step": 0.3}, {"step": 0.2}
    text = report("ppo", 1, old, new, "abc1234", 3, [1.4, 1.5, 1.7])
    assert "(1.50x), medians of 3 run(s); run by run 1.40-1.70x, median 1.50x" in text
    assert "run by run" not in report("ppo", 1, old, new, "abc1234", 1, [1.5])
