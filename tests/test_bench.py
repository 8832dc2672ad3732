"""The benchmark entry point runs end to end (speed itself is never asserted)."""

import pytest

from lightning_adv import bench


def test_bench_prints_times_and_ratios(capsys):
    bench.main(["--sizes", "8x32,3x16", "--repeats", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "| 8×32 |" in out and "| 3×16 |" in out
    assert "token loop ÷ fast" in out and "module default ÷ kernel" in out


def test_bench_rejects_bad_sizes():
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "64by2048"])
