"""``python -m lightning_adv.bench_memory`` measures the scoring pass in fresh processes and
reports one line per phase (scoring, update), version, dtype and rows per pass."""

import re

from lightning_adv import bench_memory


def test_bench_reports_one_line_per_phase_and_size(capsys):
    bench_memory.main(["--vocab", "600", "--hidden", "16", "--batch", "4", "--seq", "24",
                       "--dtypes", "float32", "--sizes", "1", "--phases", "scoring", "update",
                       "--baseline", ""])
    out = capsys.readouterr().out
    assert "one float32 copy of the logits is 0 MiB" in out
    rows = re.findall(r"^\s+(scoring|update)\s+now\s+float32\s+(whole batch|\d+)\s+(-?\d+)"
                      r"\s+([\d.]+)$", out, re.M)
    assert [r[:2] for r in rows] == [("scoring", "1"), ("update", "1")]
    assert all(float(seconds) > 0 for *_, seconds in rows)


def test_sizes_argument():
    parser = bench_memory.build_parser()
    assert parser.parse_args(["--sizes", "none", "8"]).sizes == [None, 8]


def test_peak_is_the_call_own_not_an_earlier_peak():
    """An earlier, larger peak of the process (here 300 MiB held and freed; in the bench
    the parent's, which a child started by fork and exec inherits in ``ru_maxrss``) does
    not count: a call holding nothing reads near 0, one holding 200 MiB near 200."""
    held = b"\x01" * (300 * 2**20)  # written, so resident
    del held
    assert bench_memory.peak_mib(lambda: None)[1] < 40
    size, peak = bench_memory.peak_mib(lambda: len(b"\x01" * (200 * 2**20)))
    assert size == 200 * 2**20 and 190 <= peak <= 240
