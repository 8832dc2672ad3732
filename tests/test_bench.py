"""The benchmark entry point runs end to end (speed itself is never asserted)."""

import os
import subprocess
import sys

from typing import Optional

import pytest

from lightning_adv import bench
from lightning_adv.openmp import MARKER


def test_bench_prints_times_ratios_threads_and_memory(capsys, monkeypatch):
    monkeypatch.setattr(bench, "SCALING_WIDTHS", (16, 32))
    bench.main(["--sizes", "8x32,3x16", "--repeats", "1", "--device", "cpu", "--threads", "1", "2"])
    out = capsys.readouterr().out
    assert "Kernel time against T" in out and "| 32 |" in out
    assert "| 8×32 |" in out and "| 3×16 |" in out
    assert "token loop ÷ fast" in out and "÷ bare kernel" in out and "torch module" in out and "bytes/position" in out
    assert "### cpu, 1 thread" in out and "### cpu, 2 threads" in out
    assert "time with more threads ÷ time with 1" in out
    for name in ("default", "ppo.yaml", "GRPO"):
        assert f"| {name} |" in out
    assert "load average" in out and "OMP_WAIT_POLICY" in out


def test_bench_rejects_bad_sizes():
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "64by2048"])


def _openmp_spin_count(*command: str, wait_policy: Optional[str] = None) -> str:
    """GNU OpenMP's spin count as it read it when torch loaded it (OMP_DISPLAY_ENV prints
    its settings at load): 0 under OMP_WAIT_POLICY=PASSIVE."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", MARKER)}
    env.update(OMP_DISPLAY_ENV="VERBOSE", OMP_NUM_THREADS="2")
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    run = subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    if not lines:
        pytest.skip("torch does not use GNU OpenMP here")
    return lines[0].split("=")[1].strip().strip("'")


@pytest.mark.parametrize("program", [["-m", "lightning_adv.bench", "--sizes", "2x8", "--repeats",
                                      "1", "--device", "cpu", "--threads", "2"],
                                     ["-m", "lightning_adv.bench_trainer", "--help"],
                                     ["-m", "lightning_adv", "--help"]])
def test_programs_make_openmp_threads_sleep_while_they_wait(program):
    assert _openmp_spin_count(*program) == "0"


def test_own_wait_policy_is_kept_and_plain_imports_change_nothing():
    assert _openmp_spin_count("-m", "lightning_adv.bench", "--help", wait_policy="ACTIVE") != "0"
    code = "import lightning_adv, torch; torch.ones(64, 64).sum()"
    assert _openmp_spin_count("-c", code) != "0"  # GNU's default: spin a while, then sleep
