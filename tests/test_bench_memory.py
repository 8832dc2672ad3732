"""``python -m lightning_adv.bench_memory`` measures the scoring pass in fresh processes and
reports one line per version, dtype and ``ppo.forward_batch_size``."""

import re

from lightning_adv import bench_memory


def test_bench_reports_one_line_per_forward_batch_size(capsys):
    bench_memory.main(["--vocab", "600", "--hidden", "16", "--batch", "4", "--seq", "24",
                       "--dtypes", "float32", "--forward-batch-size", "none", "1",
                       "--baseline", ""])
    out = capsys.readouterr().out
    assert "one float32 copy of the logits is 0 MiB" in out
    rows = re.findall(r"^\s+now\s+float32\s+(whole batch|\d+)\s+(-?\d+)\s+([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["whole batch", "1"]
    assert all(float(seconds) > 0 for _, _, seconds in rows)


def test_forward_batch_size_argument():
    parser = bench_memory.build_parser()
    assert parser.parse_args(["--forward-batch-size", "none", "8"]).forward_batch_size == [None, 8]
