"""``python -m lightning_adv.bench_hf`` runs and reports both variants side by side."""

import re

from lightning_adv import bench_hf


def test_bench_reports_cache_and_no_cache_side_by_side(tiny_lm, capsys):
    bench_hf.main(["--model", tiny_lm, "--batch", "2", "--new-tokens", "4", "--threads", "1",
                   "--repeats", "1"])
    out = capsys.readouterr().out
    assert "4 new tokens, 1 thread(s):" in out
    for name in bench_hf.VARIANTS:
        line = next(line for line in out.splitlines() if line.strip().startswith(name))
        cached, plain, speedup = map(float, re.findall(r"([\d.]+)(?: t/s|x)", line))
        assert cached > 0 and plain > 0 and speedup > 0
